# tests/cli/moe.sh: mixtures of experts (Mixtral, Qwen3-MoE) against an
# independent reference. ../shared/tools/mkrandom.py writes a seeded random
# tiny model of each family as Hugging Face safetensors (F32);
# ../shared/tools/hfref.py is a plain float64 numpy forward of the same
# families. llm-generate predicts the next token after every prefix of a
# 128-token sequence (--logprobs 10, f32 KV cache): at every position its
# greedy id must be hfref's argmax and its top-10 log-probs within 2e-3 of
# hfref's log-softmax (and no id of hfref's top 10 missing unless below our
# tenth by more than that). A config that routes otherwise must fail the
# same comparison. Then batch invariance (each prompt alone equals the batch,
# bit for bit), experts no token chooses left uncomputed, --plan's expert
# counts, FP8 (llm-quantize, generation, perplexity within 1% of BF16), the
# FP8 KV cache (perplexity within 1% of an f32 cache's),
# llm-quantize --random of both families, Qwen3-MoE's
# dense layers, llama.cpp on the GGUF of the same numbers (bench/depth.sh,
# when its prebuilt library is on this machine), and the tensor-parallel
# split of the experts (llm-repartition, mpirun).
. tests/lib/tap.sh
T=$TMPD
PY=/usr/bin/python3
TOOLS=${LLM_TEST_TOOLS:-../shared/tools}
why=
[ -f "$TOOLS/mkrandom.py" ] && [ -f "$TOOLS/hfref.py" ] || why="no mkrandom.py and hfref.py in $TOOLS"
[ -n "$why" ] || [ -x $PY ] && $PY -c 'import numpy' 2>/dev/null || why=${why:-"no numpy for $PY (apt-get install python3-numpy)"}
if [ -n "$why" ]; then
	skip "mixtures of experts against hfref.py" "$why"
	tap_done
fi

# the sequence: BOS then 127 seeded ids; one prompt per prefix
$PY -c 'import json, random
r = random.Random(1); ids = [1] + [r.randint(3, 1023) for _ in range(127)]
open("'"$T"'/ids.txt", "w").write(" ".join(map(str, ids)))
with open("'"$T"'/prompts.jsonl", "w") as f:
    for p in range(len(ids)): f.write(json.dumps({"prompt_ids": ids[:p + 1]}) + "\n")'

# cmp_ref HF_DIR OURS.jsonl: the comparison above, at tolerance 2e-3
cmp_ref() {
	$PY - "$TOOLS" "$1" "$T/ids.txt" "$2" 2e-3 >"$T/cmp.out" 2>&1 <<'PY'
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
import hfref
hf, ids_f, ours_f, tol = sys.argv[2], sys.argv[3], sys.argv[4], float(sys.argv[5])
ids = [int(t) for t in open(ids_f).read().split()]
ref = hfref.forward(hf, ids)
lp = ref - ref.max(-1, keepdims=True)
lp -= np.log(np.exp(lp).sum(-1, keepdims=True))
ours = sorted((json.loads(l) for l in open(ours_f)), key=lambda o: len(o["prompt_ids"]))
assert len(ours) == len(ids), (len(ours), len(ids))
worst, bad = 0.0, []
for p, o in enumerate(ours):
    assert o["prompt_ids"] == ids[:p + 1]
    mine = {e["id"]: e["logprob"] for e in o["top_logprobs"][0]}
    tenth = min(mine.values())
    d = max(abs(v - lp[p, i]) for i, v in mine.items())
    worst = max(worst, d)
    miss = [i for i in np.argsort(-lp[p], kind="stable")[:10] if int(i) not in mine and lp[p, i] > tenth + tol]
    if o["ids"][0] != int(np.argmax(ref[p])) or miss or d > tol:
        bad.append(p)
print("%d positions, worst top-10 |logprob - hfref| %.2e, %d failing %s" % (len(ids), worst, len(bad), bad[:8]))
sys.exit(1 if bad else 0)
PY
	local rc=$?
	sed 's/^/#   /' "$T/cmp.out"
	return $rc
}

# gen DIR OUT [ARGS]: next-token top-10 log-probs after every prefix
gen() {
	local d=$1 o=$2; shift 2
	llm-generate -m "$d" -n 1 --temp 0 --logprobs 10 --kv-dtype f32 --json "$@" <"$T/prompts.jsonl" >"$o" 2>"$T/gen.err" ||
		{ sed 's/^/#   /' "$T/gen.err"; return 1; }
}

# mkmodel CONFIG DIR [mkrandom args]: the family's tiny model as F32 safetensors
mkmodel() {
	local c=$1 d=$2; shift 2
	$PY "$TOOLS/mkrandom.py" --config "$c" --out "$d" --formats st-f32 --seed 1 "$@" >"$T/mk.log" 2>&1 ||
		sed 's/^/#   /' "$T/mk.log"
}

# editcfg SRC DST KEY=JSON...: a copy of SRC's files with config.json fields replaced
editcfg() {
	local s=$1 d=$2; shift 2
	mkdir -p "$d" && cp "$s"/* "$d"/ && $PY - "$d/config.json" "$@" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
for kv in sys.argv[2:]:
    k, v = kv.split("=", 1); c[k] = json.loads(v)
json.dump(c, open(sys.argv[1], "w"), indent=2)
PY
}

fails() { ! "$@"; }

# same_out A.jsonl B.jsonl: the same prompts, ids and log-probs, bit for bit
same_out() {
	$PY - "$1" "$2" <<'PY'
import json, sys
def key(f):
    return sorted((o["index"], o["prompt_ids"], o["ids"], o.get("logprobs"), o.get("top_logprobs"))
                  for o in map(json.loads, open(f)))
a, b = key(sys.argv[1]), key(sys.argv[2])
assert len(a) == len(b) and a, (len(a), len(b))
bad = [x[0] for x, y in zip(a, b) if x != y]
print("#   %d outputs, %d differ %s" % (len(a), len(bad), bad[:8]))
sys.exit(1 if bad else 0)
PY
}

# batch NAME DIR: batch invariance, on the 128 prefixes' log-probs (in
# $T/NAME.jsonl) and on 8 greedy continuations of 24 tokens, each prompt
# alone against all together
batch() {
	local f=$1 d=$2
	gen "$d" "$T/$f-alone.jsonl" --parallel 1
	check "$f: each of the 128 prefixes alone gives the batch's top-10 log-probs bit for bit" \
		same_out "$T/$f.jsonl" "$T/$f-alone.jsonl"
	sed -n '5p;17p;30p;41p;64p;77p;100p;128p' "$T/prompts.jsonl" >"$T/cont.jsonl"
	llm-generate -m "$d" -n 24 --temp 0 --logprobs 1 --kv-dtype f32 --json --parallel 1 \
		<"$T/cont.jsonl" >"$T/$f-cont1.jsonl" 2>"$T/gen.err" &&
	llm-generate -m "$d" -n 24 --temp 0 --logprobs 1 --kv-dtype f32 --json --parallel 8 \
		<"$T/cont.jsonl" >"$T/$f-cont8.jsonl" 2>>"$T/gen.err" || sed 's/^/#   /' "$T/gen.err"
	check "$f: 8 greedy continuations of 24 tokens, alone and together: the same ids and log-probs" \
		same_out "$T/$f-cont1.jsonl" "$T/$f-cont8.jsonl"
}

# fp8 FAMILY CONFIG: the family's tiny model with stories260K's 512-token
# vocabulary as BF16, quantized by llm-quantize: the experts in FP8 with
# block scales, the routers kept BF16; it generates, and its perplexity on
# the reference story is within 1% of the BF16 model's
fp8() {
	local f=$1 c=$2
	if ! have_stories; then
		skip "$f: FP8 experts: generation and perplexity within 1% of BF16" "no stories260K in \$LLM_TEST_MODELS"
		skip "$f: the FP8 KV cache's perplexity within 1% of the f32 cache's" "no stories260K in \$LLM_TEST_MODELS"
		return
	fi
	$PY -c 'import json, sys
c = json.load(open(sys.argv[1])); c["vocab_size"] = 512; json.dump(c, open(sys.argv[2], "w"))
t = json.load(open(sys.argv[3]))["texts"][0]["text"]; open(sys.argv[4], "w").write(t)' \
		"$c" "$T/$f-512.json" "$LLM_TEST_REF/stories260K/perplexity.json" "$T/story.txt"
	$PY "$TOOLS/mkrandom.py" --config "$T/$f-512.json" --out "$T/$f-512" --formats st-bf16 --seed 1 \
		--tokenizer "$(stories)/tokenizer.json" >"$T/mk.log" 2>&1 || sed 's/^/#   /' "$T/mk.log"
	local bf=$T/$f-512/hf-bf16 q=$T/$f-fp8
	llm-quantize -q "$bf" "$q" 2>"$T/q.err" || sed 's/^/#   /' "$T/q.err"
	check "$f: llm-quantize writes every expert's gate, up and down in FP8 with block scales, the router in BF16" \
		$PY - "$q/model.safetensors" <<'PY'
import re, sys
sys.path.insert(0, "tests/lib")
from stf32 import header
h = header(sys.argv[1])
ex = [k for k in h if re.search(r"\.experts\.\d+\.(w[123]|(gate|up|down)_proj)\.weight$", k)]
ro = [k for k in h if re.search(r"\.(block_sparse_moe|mlp)\.gate\.weight$", k)]
assert len(ex) == 2 * 4 * 3 and len(ro) == 2, (len(ex), len(ro))
assert all(h[k]["dtype"] == "F8_E4M3" and h[k + "_scale_inv"]["dtype"] == "F32" for k in ex)
assert all(h[k]["dtype"] == "BF16" for k in ro)
PY
	llm-generate -m "$q" -p "Once upon a time" -n 16 --temp 0 --json >"$T/$f-fp8gen.json" 2>"$T/gen.err" ||
		sed 's/^/#   /' "$T/gen.err"
	check "$f: the FP8 checkpoint generates 16 tokens" \
		$PY -c 'import json, sys; o = json.load(open(sys.argv[1])); assert len(o["ids"]) == 16, o' "$T/$f-fp8gen.json"
	llm-generate -m "$bf" --perplexity "$T/story.txt" --json >"$T/$f-ppl-bf16.json" 2>"$T/gen.err" &&
	llm-generate -m "$q" --perplexity "$T/story.txt" --json >"$T/$f-ppl-fp8.json" 2>>"$T/gen.err" ||
		sed 's/^/#   /' "$T/gen.err"
	check "$f: FP8 perplexity within 1% of BF16 on the reference story" $PY -c 'import json, sys
a, b = (json.loads(open(f).read().strip().split("\n")[-1]) for f in sys.argv[1:3])
print("#   ppl bf16 %.4f fp8 %.4f (%+.3f%%)" % (a["ppl"], b["ppl"], 100 * (b["ppl"] / a["ppl"] - 1)))
assert abs(b["ppl"] / a["ppl"] - 1) < 0.01' "$T/$f-ppl-bf16.json" "$T/$f-ppl-fp8.json"
	# the FP8 KV cache (a scale per token and head) against an f32 one
	llm-generate -m "$bf" --kv-dtype f32 --perplexity "$T/story.txt" --json >"$T/$f-ppl-kf.json" 2>"$T/gen.err" &&
	llm-generate -m "$bf" --kv-dtype fp8 --perplexity "$T/story.txt" --json >"$T/$f-ppl-k8.json" 2>>"$T/gen.err" ||
		sed 's/^/#   /' "$T/gen.err"
	check "$f: the FP8 KV cache's perplexity within 1% of the f32 cache's" $PY -c 'import json, sys
a, b = (json.loads(open(f).read().strip().split("\n")[-1]) for f in sys.argv[1:3])
print("#   ppl f32 KV %.4f fp8 KV %.4f (%+.3f%%)" % (a["ppl"], b["ppl"], 100 * (b["ppl"] / a["ppl"] - 1)))
assert 0 < abs(b["ppl"] / a["ppl"] - 1) < 0.01' "$T/$f-ppl-kf.json" "$T/$f-ppl-k8.json"
}

# random FAMILY CONFIG: llm-quantize --random writes the family's routers
# and experts (BF16 and FP8), and both generate
random_ckpt() {
	local f=$1 c=$2 ok=1
	for dt in bf16 fp8; do
		llm-quantize -q --random "$c" --dtype $dt --seed 3 "$T/$f-rnd-$dt" 2>"$T/q.err" &&
		echo '{"prompt_ids": [1, 5, 9]}' | llm-generate -m "$T/$f-rnd-$dt" -n 8 --temp 0 --json \
			>"$T/$f-rnd.json" 2>"$T/gen.err" && grep -q '"ids":\[[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*,[0-9]*\]' "$T/$f-rnd.json" ||
			{ ok=0; sed 's/^/#   /' "$T/q.err" "$T/gen.err"; }
	done
	check "$f: llm-quantize --random (bf16 and fp8) writes a checkpoint that generates" [ $ok = 1 ]
}

# ---- Mixtral -------------------------------------------------------------
mkmodel "$TOOLS/configs/tiny-mixtral.json" "$T/mix"
MIX=$T/mix/hf-f32
gen "$MIX" "$T/mixtral.jsonl"
check "mixtral: 128 positions, greedy ids and top-10 log-probs within 2e-3 of hfref" cmp_ref "$MIX" "$T/mixtral.jsonl"
editcfg "$MIX" "$T/mix-k1" num_experts_per_tok=1
gen "$T/mix-k1" "$T/mix-k1.jsonl"
check "mixtral: the same comparison fails for the model routed to 1 expert instead of 2" \
	fails cmp_ref "$MIX" "$T/mix-k1.jsonl"
# three experts a token, so that the order of a row's sum matters (a + b is b + a)
editcfg "$MIX" "$T/mix-k3" num_experts_per_tok=3
gen "$T/mix-k3" "$T/mixtral-k3.jsonl"
check "mixtral routed to 3 experts: greedy ids and top-10 log-probs within 2e-3 of hfref" \
	cmp_ref "$T/mix-k3" "$T/mixtral-k3.jsonl"
batch mixtral-k3 "$T/mix-k3"
# only the chosen experts are read: a fifth expert of NaN weights whose
# router row is zero, while the four others' rows are v, -v, w, -w (one of
# each pair is above zero for any input), is never among a token's top 2;
# finite log-probs equal to the four-expert model's show its weights were
# never used (computing it with weight 0 would give NaN)
mkdir -p "$T/mix-nan" "$T/mix-4"
cp "$MIX"/* "$T/mix-nan"/
cp "$MIX"/* "$T/mix-4"/
$PY - "$MIX/model.safetensors" "$T/mix-nan/model.safetensors" "$T/mix-nan/config.json" \
	"$T/mix-4/model.safetensors" <<'PY'
import json, sys
import numpy as np
sys.path.insert(0, "tests/lib")
from stf32 import read, write
src, dst, cfg, four = sys.argv[1:5]
t = read(src)
for l in range(2):
    g = "model.layers.%d.block_sparse_moe.gate.weight" % l
    v, w = t[g][0], t[g][1]
    t[g] = np.stack([v, -v, w, -w])
write(four, t)
for l in range(2):
    g = "model.layers.%d.block_sparse_moe.gate.weight" % l
    t[g] = np.concatenate([t[g], np.zeros((1, t[g].shape[1]), "<f4")])
    for p in ("w1", "w2", "w3"):
        e0 = t["model.layers.%d.block_sparse_moe.experts.0.%s.weight" % (l, p)]
        t["model.layers.%d.block_sparse_moe.experts.4.%s.weight" % (l, p)] = np.full(e0.shape, np.nan, "<f4")
write(dst, t)
c = json.load(open(cfg)); c["num_local_experts"] = 5; json.dump(c, open(cfg, "w"))
PY
gen "$T/mix-4" "$T/mix-4.jsonl"
gen "$T/mix-nan" "$T/mix-nan.jsonl"
check "mixtral: an expert no token chooses is never computed (its NaN weights leave the log-probs as without it)" \
	same_out "$T/mix-4.jsonl" "$T/mix-nan.jsonl"

llm-serve -m "$MIX" --plan >"$T/plan.json" 2>"$T/plan.err" || sed 's/^/#   /' "$T/plan.err"
check "mixtral: llm-serve --plan counts the experts, their bytes and the bytes a token reads" $PY -c 'import json, sys
p = json.load(open(sys.argv[1])); e = 2 * 4 * 3 * 128 * 128 * 4    # 2 layers, 4 experts, 3 F32 matrices
assert p["experts"] == 4 and p["experts_per_token"] == 2 and p["expert_bytes"] == e, p
assert p["active_weight_bytes"] == p["weight_bytes"] - e // 2, p' "$T/plan.json"
fp8 mixtral "$TOOLS/configs/tiny-mixtral.json"
random_ckpt mixtral "$TOOLS/configs/tiny-mixtral.json"

# ---- Qwen3-MoE ------------------------------------------------------------
# Qwen3 attention (q/k norm) with the MoE FFN: norm_topk_prob true (the
# config's, what llama.cpp always does) and false (Qwen3MoeConfig's default,
# where hfref.py is the only reference); a model that renormalises when the
# reference does not must fail
mkmodel "$TOOLS/configs/tiny-qwen3moe.json" "$T/q3"
Q3=$T/q3/hf-f32
gen "$Q3" "$T/qwen3moe.jsonl"
check "qwen3_moe (norm_topk_prob true): 128 positions, greedy ids and top-10 log-probs within 2e-3 of hfref" \
	cmp_ref "$Q3" "$T/qwen3moe.jsonl"
editcfg "$Q3" "$T/q3-nonorm" norm_topk_prob=false
gen "$T/q3-nonorm" "$T/qwen3moe-nonorm.jsonl"
check "qwen3_moe (norm_topk_prob false): 128 positions, greedy ids and top-10 log-probs within 2e-3 of hfref" \
	cmp_ref "$T/q3-nonorm" "$T/qwen3moe-nonorm.jsonl"
check "qwen3_moe: the renormalised model fails the comparison with norm_topk_prob false" \
	fails cmp_ref "$T/q3-nonorm" "$T/qwen3moe.jsonl"
batch qwen3moe "$Q3"

# dense layers (mlp_only_layers, decoder_sparse_step): with one expert, a
# layer's MoE FFN is that expert's MLP (weight 1), so a model whose layer 0
# is dense and holds expert 0's weights as its MLP must give the one-expert
# model's log-probs bit for bit; that model matches hfref.py
editcfg "$Q3" "$T/q3-e1" num_experts=1 num_experts_per_tok=1
mkdir -p "$T/q3-dense0"
$PY - "$T/q3-e1/model.safetensors" <<'PY'
import sys
sys.path.insert(0, "tests/lib")
from stf32 import read, write
f = sys.argv[1]
t = read(f)
out = {}
for k, v in t.items():
    if ".mlp.experts." in k and ".experts.0." not in k:
        continue                                  # experts 1..3 dropped
    if k.endswith(".mlp.gate.weight"):
        v = v[:1]                                 # the router of expert 0
    out[k] = v
write(f, out)
dense = dict(out)
for p in ("gate", "up", "down"):
    dense["model.layers.0.mlp.%s_proj.weight" % p] = dense.pop("model.layers.0.mlp.experts.0.%s_proj.weight" % p)
del dense["model.layers.0.mlp.gate.weight"]
write(f.replace("q3-e1", "q3-dense0"), dense)
PY
gen "$T/q3-e1" "$T/qwen3moe-e1.jsonl"
check "qwen3_moe with one expert: greedy ids and top-10 log-probs within 2e-3 of hfref" \
	cmp_ref "$T/q3-e1" "$T/qwen3moe-e1.jsonl"
for how in 'mlp_only_layers=[0]' 'decoder_sparse_step=2'; do
	editcfg "$T/q3-e1" "$T/q3-d" "$how" intermediate_size=64
	cp "$T/q3-dense0/model.safetensors" "$T/q3-d/"
	gen "$T/q3-d" "$T/qwen3moe-d.jsonl"
	check "qwen3_moe with $how: layer 0 dense, the one-expert model's log-probs bit for bit" \
		same_out "$T/qwen3moe-e1.jsonl" "$T/qwen3moe-d.jsonl"
	rm -rf "$T/q3-d"
done
fp8 qwen3moe "$TOOLS/configs/tiny-qwen3moe.json"
random_ckpt qwen3moe "$TOOLS/configs/tiny-qwen3moe.json"
editcfg "$Q3" "$T/q3-cfg" 'mlp_only_layers=[0]' decoder_sparse_step=1
llm-quantize -q --random "$T/q3-cfg/config.json" --seed 3 "$T/q3-rnd-dense0" 2>"$T/q.err" || sed 's/^/#   /' "$T/q.err"
check "llm-quantize --random with mlp_only_layers [0]: layer 0 has the dense MLP, layer 1 the experts" \
	$PY - "$T/q3-rnd-dense0/model.safetensors" <<'PY'
import sys
sys.path.insert(0, "tests/lib")
from stf32 import header
h = header(sys.argv[1])
assert "model.layers.0.mlp.gate_proj.weight" in h and not any(k.startswith("model.layers.0.mlp.experts") for k in h)
assert "model.layers.1.mlp.gate.weight" in h and "model.layers.1.mlp.experts.3.down_proj.weight" in h
assert "model.layers.1.mlp.gate_proj.weight" not in h
PY
check_fails "qwen3_moe: mlp_only_layers naming a layer past the model is refused with one line" 1 \
	sh -c "$PY -c \"import json; c = json.load(open('$Q3/config.json')); c['mlp_only_layers'] = [5]; json.dump(c, open('$T/bad.json', 'w'))\" &&
	llm-quantize -q --random '$T/bad.json' '$T/bad-out'"
grep -q "mlp_only_layers" "$T/err" && ok "the line names mlp_only_layers" || notok "the line names mlp_only_layers: $(cat "$T/err")"

# ---- against llama.cpp ----------------------------------------------------
# bench/depth.sh MODEL=tiny-mixtral and tiny-qwen3moe: llama.cpp (the prebuilt library
# of npm's node-llama-cpp, when bench/engine.sh has put it on this machine;
# nothing is downloaded here) on the GGUF of the same random numbers, F32
# weights and KV cache, at every position 0..127; a tolerance of 1e-9 must fail
NPM_DIR=${LLM_TEST_NPM:-/tmp/llm-bench-engine/npm}
LIB=$NPM_DIR/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
why=
[ -f "$LIB/libggml-base.so" ] || why="no node-llama-cpp in $NPM_DIR (bench/engine.sh installs it)"
[ -f "$NPM_DIR/llsrc/include/llama.h" ] || [ -f "$NPM_DIR/node_modules/node-llama-cpp/llama/gitRelease.bundle" ] ||
	why=${why:-"no llama.cpp headers or source bundle in $NPM_DIR"}
for f in mixtral qwen3moe; do
	if [ -n "$why" ]; then
		skip "$f: llama.cpp and llm-generate agree at positions 0..127 (bench/depth.sh)" "$why"
		continue
	fi
	MODEL=tiny-$f POSITIONS="$(seq 0 127 | tr '\n' ' ')" LLAMA_LIB=$LIB NPM_DIR=$NPM_DIR LLM_BIN=$LLM_BIN \
		bench/depth.sh "$T/depth" >"$T/depth.out" 2>&1; rc=$?
	check "$f: llama.cpp and llm-generate agree at positions 0..127 (bench/depth.sh, exit $rc)" $PY - "$T/depth.out" "$rc" <<'PY'
import sys
rows = [l.split() for l in open(sys.argv[1]) if l[:1] == " " or l[:1].isdigit()]
assert sys.argv[2] == "0", sys.argv[2]
assert [int(r[0]) for r in rows] == list(range(128)), len(rows)
assert all(r[3] == "same" and float(r[5]) <= 2e-3 and r[6] == "yes" for r in rows)
print("#   worst top-10 |logprob - llama.cpp| %.2e" % max(float(r[5]) for r in rows))
PY
done
if [ -z "$why" ]; then
	TOL=1e-9 MODEL=tiny-mixtral POSITIONS="0 64 127" LLAMA_LIB=$LIB NPM_DIR=$NPM_DIR LLM_BIN=$LLM_BIN \
		bench/depth.sh "$T/depth" >"$T/depth.out" 2>&1; rc=$?
	check "mixtral: bench/depth.sh at a tolerance of 1e-9 fails with exit 3 (exit $rc)" [ "$rc" = 3 ]
fi

# ---- tensor parallel: each expert's FFN split like the dense FFN ----------
# llm-repartition splits every expert's gate and up by rows, down by columns,
# and replicates the router; the round trip gives the file back byte for
# byte; under mpirun (tp2, tp2 x pp2) greedy ids equal the single process and
# log-probs agree within 1e-4 (the all-reduce sums in another order)
R=$T/mix-k3
rm -rf "$T/tp2"
llm-repartition -q "$R" "$T/tp2" --tp 2 && llm-repartition -q "$T/tp2" "$T/tp2.m" --tp 1 --pp 1
check "llm-repartition --tp 2 and back gives the Mixtral file byte for byte" \
	cmp -s "$R/model.safetensors" "$T/tp2.m/model.safetensors"
check "llm-repartition --tp 2: each rank holds half of every expert's FFN and the whole router" \
	$PY - "$T/tp2" <<'PY'
import glob, re, sys
sys.path.insert(0, "tests/lib")
from stf32 import header
for f in sorted(glob.glob(sys.argv[1] + "/rank-*.safetensors")):
    h = header(f)
    shp = {k: v["shape"] for k, v in h.items() if k != "__metadata__"}
    for k, v in shp.items():
        if re.search(r"experts\.\d+\.w[13]\.weight$", k): assert v == [64, 128], (k, v)
        if re.search(r"experts\.\d+\.w2\.weight$", k): assert v == [128, 64], (k, v)
        if k.endswith("block_sparse_moe.gate.weight"): assert v == [4, 128], (k, v)
    assert sum(1 for k in shp if "experts" in k) == 2 * 4 * 3, f
PY
if ! have_mpirun; then
	skip "mixtral under mpirun (tp2, tp2 x pp2)" "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
else
	# f32 activations in every matmul, as mpi_generate.sh
	if grep -q avx2 /proc/cpuinfo 2>/dev/null; then export LLM_CPU_ISA=avx2; else export LLM_CPU_ISA=scalar; fi
	llm-repartition -q "$R" "$T/tp2pp2" --tp 2 --pp 2
	llm-generate -t 1 --kv-dtype f32 -m "$R" -n 16 --temp 0 --logprobs 3 --json <"$T/cont.jsonl" >"$T/tp-ref.jsonl" 2>"$T/gen.err"
	for np in 2 4; do
		d=$T/tp2; [ $np = 4 ] && d=$T/tp2pp2
		timeout 300 $MPIRUN -np $np -x LLM_CPU_ISA llm-generate -t 1 --kv-dtype f32 -m "$d" -n 16 --temp 0 \
			--logprobs 3 --json <"$T/cont.jsonl" >"$T/tp-$np.jsonl" 2>"$T/mpi.err" || sed 's/^/#   /' "$T/mpi.err" | head -5
		check "mixtral under mpirun -np $np ($(basename "$d")): greedy ids of the single process, log-probs within 1e-4" \
			$PY - "$T/tp-ref.jsonl" "$T/tp-$np.jsonl" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]; b = [json.loads(l) for l in open(sys.argv[2])]
assert len(a) == len(b) == 8, (len(a), len(b))
worst = 0.0
for x, y in zip(a, b):
    assert x["ids"] == y["ids"], (x["ids"], y["ids"])
    for p, q in zip(x["logprobs"], y["logprobs"]): worst = max(worst, abs(p - q))
print("#   %d tokens, max |dlogprob| %.2g" % (sum(len(x["ids"]) for x in a), worst))
assert worst <= 1e-4, worst
PY
	done
fi

tap_done
