# tests/cli/moe_lora.sh: LoRA adapters at run time (llm-generate --lora) on
# mixtures of experts. On random F32 tiny-mixtral and tiny-qwen3moe
# checkpoints (llm-quantize --random; Qwen3-MoE also with layer 0 dense by
# mlp_only_layers), an adapter with random A and B on every attention
# projection, every expert's gate, up and down (Mixtral's w1, w3, w2) and
# the dense layers' MLP, written as PEFT names it, gives the log-probs of
# the same model with the adapter merged into its weights (W + scale B A,
# numpy, written as F32): the expert's term changes only the rows routed to
# that expert. Then a batch mixing the base and the adapter gives each
# request what it gives alone, and adapters naming the router, all-linear or
# the other family's module names are refused in one line. Then llm-finetune
# on tiny-mixtral and tiny-qwen3moe (below).
. tests/lib/tap.sh
T=$TMPD
PY=/usr/bin/python3
CFGS=${LLM_TEST_TOOLS:-../shared/tools}/configs
if ! [ -x $PY ] || ! $PY -c 'import numpy' 2>/dev/null; then
	skip "LoRA on mixtures of experts" "no numpy for $PY (apt-get install python3-numpy)"
	tap_done
fi
if ! [ -f "$CFGS/tiny-mixtral.json" ]; then
	skip "LoRA on mixtures of experts" "no tiny-mixtral.json in $CFGS"
	tap_done
fi

# 32 prompts: every prefix of a seeded sequence, next-token top-10 log-probs
$PY -c 'import json, random
r = random.Random(2); ids = [1] + [r.randint(3, 1023) for _ in range(31)]
with open("'"$T"'/prompts.jsonl", "w") as f:
    for p in range(len(ids)): f.write(json.dumps({"prompt_ids": ids[:p + 1]}) + "\n")'

# mkadapter MODEL ADAPTER MERGED TARGETS...: a random PEFT adapter of rank 4
# (alpha 8) on TARGETS for MODEL's config, and MODEL with it merged
mkadapter() {
	$PY - "$@" <<'PY'
import json, os, re, shutil, sys
import numpy as np
sys.path.insert(0, "tests/lib")
from stf32 import read, write
model, ad, merged, targets = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
c = json.load(open(model + "/config.json"))
w = read(model + "/model.safetensors")
rng = np.random.default_rng(5)
r, alpha = 4, 8.0
pat = re.compile(r"model\.layers\.\d+\.(self_attn|mlp|block_sparse_moe)(\.experts\.\d+)?\.(\w+)\.weight$")
lora = {}
for k in sorted(w):
    m = pat.match(k)
    if not m or m.group(3) not in targets:
        continue
    dout, din = w[k].shape
    a = (rng.random((r, din)) - 0.5).astype("<f4")
    b = (rng.random((dout, r)) - 0.5).astype("<f4")
    base = "base_model.model." + k[:-len(".weight")]
    lora[base + ".lora_A.weight"], lora[base + ".lora_B.weight"] = a, b
    w[k] = (w[k].astype(np.float64) + alpha / r * (b.astype(np.float64) @ a.astype(np.float64))).astype("<f4")
os.makedirs(ad, exist_ok=True)
write(ad + "/adapter_model.safetensors", lora)
json.dump({"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": r, "lora_alpha": alpha, "lora_dropout": 0.0,
           "target_modules": targets, "bias": "none", "fan_in_fan_out": False, "use_dora": False,
           "use_rslora": False}, open(ad + "/adapter_config.json", "w"), indent=2)
shutil.copytree(model, merged)
write(merged + "/model.safetensors", w)
print("#   %d LoRA tensors, %d of them on experts" % (len(lora), sum(".experts." in k for k in lora)))
PY
}

gen() {
	local o=$1; shift
	llm-generate -n 1 --temp 0 --logprobs 10 --kv-dtype f32 --json "$@" <"${PROMPTS:-$T/prompts.jsonl}" >"$o" 2>"$T/gen.err" ||
		{ sed 's/^/#   /' "$T/gen.err"; return 1; }
}

# close A.jsonl B.jsonl: the same greedy ids, top-10 log-probs within 1e-4
# (W x + s B (A x) against (W + s B A) x: the same sums in another order)
close() {
	$PY - "$1" "$2" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert len(a) == len(b) == 32, (len(a), len(b))
a.sort(key=lambda o: len(o["prompt_ids"])); b.sort(key=lambda o: len(o["prompt_ids"]))
worst = 0.0
for x, y in zip(a, b):
    assert x["ids"] == y["ids"], (x["prompt_ids"], x["ids"], y["ids"])
    mx = {e["id"]: e["logprob"] for e in x["top_logprobs"][0]}
    my = {e["id"]: e["logprob"] for e in y["top_logprobs"][0]}
    worst = max([worst] + [abs(v - my[i]) for i, v in mx.items() if i in my])
print("#   32 positions, worst top-10 |dlogprob| %.2e" % worst)
assert worst <= 1e-4, worst
PY
}

# differs A.jsonl B.jsonl: the adapter moved the log-probs
differs() {
	$PY -c 'import json, sys
a, b = ([json.loads(l)["top_logprobs"][0][0]["logprob"] for l in open(f)] for f in sys.argv[1:3])
assert sum(abs(x - y) > 1e-3 for x, y in zip(a, b)) >= 16' "$1" "$2"
}

# one FAMILY CONFIG TARGETS...: the merged comparison on a random checkpoint of CONFIG
one() {
	local f=$1 cfg=$2; shift 2
	llm-quantize -q --random "$cfg" --dtype f32 --seed 3 "$T/$f" 2>"$T/q.err" || sed 's/^/#   /' "$T/q.err"
	mkadapter "$T/$f" "$T/$f-ad" "$T/$f-merged" "$@"
	gen "$T/$f-lora.jsonl" -m "$T/$f" --lora "$T/$f-ad"
	gen "$T/$f-merged.jsonl" -m "$T/$f-merged"
	gen "$T/$f-base.jsonl" -m "$T/$f"
	check "$f: --lora on attention and every expert ($*) equals the merged weights: ids, log-probs within 1e-4" \
		close "$T/$f-lora.jsonl" "$T/$f-merged.jsonl"
	check "$f: the adapter changes the log-probs" differs "$T/$f-lora.jsonl" "$T/$f-base.jsonl"
}

one mixtral "$CFGS/tiny-mixtral.json" q_proj k_proj v_proj o_proj w1 w2 w3
one qwen3moe "$CFGS/tiny-qwen3moe.json" q_proj k_proj v_proj o_proj gate_proj up_proj down_proj
# layer 0 dense (mlp_only_layers): gate_proj names its MLP and layer 1's experts
$PY -c 'import json, sys
c = json.load(open(sys.argv[1])); c["mlp_only_layers"] = [0]; json.dump(c, open(sys.argv[2], "w"))' \
	"$CFGS/tiny-qwen3moe.json" "$T/q3dense.json"
one qwen3moe-dense0 "$T/q3dense.json" v_proj gate_proj up_proj down_proj
check "qwen3moe-dense0: the adapter holds layer 0's dense MLP and layer 1's experts" $PY -c 'import sys
sys.path.insert(0, "tests/lib")
from stf32 import header
h = header(sys.argv[1])
assert "base_model.model.model.layers.0.mlp.down_proj.lora_B.weight" in h
assert "base_model.model.model.layers.1.mlp.experts.3.down_proj.lora_A.weight" in h
assert not any("layers.0.mlp.experts" in k or "layers.1.mlp.down_proj" in k for k in h)' \
	"$T/qwen3moe-dense0-ad/adapter_model.safetensors"

# batch invariance: 8 prompts under the adapter and 8 under the base in one
# batch, each as it is alone
$PY -c 'import json
with open("'"$T"'/mix.jsonl", "w") as f:
    for i, l in enumerate(open("'"$T"'/prompts.jsonl")):
        if i % 4 == 3:
            for m in ("ad", "mixtral"):
                d = json.loads(l); d.update(model=m, max_tokens=6, temperature=0, logprobs=2); f.write(json.dumps(d) + "\n")'
G="llm-generate -m $T/mixtral --lora ad=$T/mixtral-ad --kv-dtype f32 --json --prefix-cache 0"
$G --parallel 16 <"$T/mix.jsonl" >"$T/together.jsonl" 2>"$T/err"
: >"$T/alone.jsonl"
while read -r l; do printf '%s\n' "$l" | $G >>"$T/alone.jsonl" 2>>"$T/err"; done <"$T/mix.jsonl"
check "mixtral: a batch mixing the base and the adapter gives each request its ids and log-probs alone, bit for bit" \
	$PY -c 'import json, sys
a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert len(a) == len(b) == 16, (len(a), len(b))
a.sort(key=lambda o: o["index"])
for x, y in zip(a, b):
    assert (x["ids"], x["logprobs"], x["top_logprobs"]) == (y["ids"], y["logprobs"], y["top_logprobs"]), x["index"]
assert any(a[i]["ids"] != a[i + 1]["ids"] for i in range(0, 16, 2))' "$T/together.jsonl" "$T/alone.jsonl"

# refusals, one line each (prompt ids: the random checkpoint has no tokenizer)
refused() { echo '{"prompt_ids": [1, 5]}' | llm-generate -m "$T/mixtral" --lora "$T/$1" -n 1; }
bad() {
	local name=$1 tm=$2
	mkdir -p "$T/$name"
	cp "$T/mixtral-ad/adapter_model.safetensors" "$T/$name/"
	$PY -c 'import json, sys
c = json.load(open(sys.argv[1])); c["target_modules"] = json.loads(sys.argv[3]); json.dump(c, open(sys.argv[2], "w"))' \
		"$T/mixtral-ad/adapter_config.json" "$T/$name/adapter_config.json" "$tm"
}
bad router '["q_proj", "gate"]'
bad alllin '"all-linear"'
bad names '["q_proj", "gate_proj"]'
check_fails "mixtral: an adapter naming the router (gate) is refused" 1 refused router
grep -q "target_modules: 'gate' is the router of the experts, which is not a LoRA target" "$T/err" &&
	ok "the line says the router is not a LoRA target" || notok "the line says the router is not a LoRA target: $(cat "$T/err")"
check_fails "mixtral: target_modules all-linear is refused (it takes the router)" 1 refused alllin
check_fails "mixtral: gate_proj (Qwen3-MoE's name) is refused naming w1, w3, w2" 1 refused names
grep -q "'gate_proj' is not a projection of a mixtral model (q_proj, k_proj, v_proj, o_proj, w1, w3, w2)" "$T/err" &&
	ok "the line names the model's modules" || notok "the line names the model's modules: $(cat "$T/err")"
mkdir -p "$T/rtensor"
cp "$T/mixtral-ad/adapter_config.json" "$T/rtensor/"
$PY -c 'import sys
import numpy as np
sys.path.insert(0, "tests/lib")
from stf32 import read, write
t = read(sys.argv[1]); t["base_model.model.model.layers.0.block_sparse_moe.gate.lora_A.weight"] = np.zeros((4, 128), "<f4")
write(sys.argv[2], t)' "$T/mixtral-ad/adapter_model.safetensors" "$T/rtensor/adapter_model.safetensors"
check_fails "mixtral: a tensor of the router's LoRA is refused" 1 refused rtensor
grep -q "block_sparse_moe.gate.lora_A.weight': the router of the experts is not a LoRA target" "$T/err" &&
	ok "the line names the tensor" || notok "the line names the tensor: $(cat "$T/err")"

# ---- llm-finetune on a mixture of experts ----------------------------------
# tiny-mixtral with stories260K's tokenizer (512 ids) as random F32: the loss
# falls (a random base learns slowly: measured 6.27 to 5.6 in 60 steps, as a
# Llama of the same shape), the adapter holds every expert's w1, w3, w2 as
# PEFT names them, the trainer's greedy continuation (--sample) equals
# llm-generate --lora, and --merge then llm-generate equals --lora
if ! have_stories; then
	skip "llm-finetune on tiny-mixtral" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
S=$(stories)
$PY -c 'import json, sys
for f, o in (("tiny-mixtral", "mix512"), ("tiny-qwen3moe", "q3512")):
    c = json.load(open(sys.argv[1] + "/" + f + ".json")); c["vocab_size"] = 512; json.dump(c, open(sys.argv[2] + "/" + o + ".json", "w"))' \
	"$CFGS" "$T"
llm-quantize -q --random "$T/mix512.json" --dtype f32 --seed 3 --tokenizer "$S" "$T/m5" 2>"$T/q.err" || sed 's/^/#   /' "$T/q.err"
$PY -c 'import json, sys
c = json.load(open(sys.argv[1])); c.update(model_type="llama", architectures=["LlamaForCausalLM"])
for k in ("num_local_experts", "num_experts_per_tok"): c.pop(k)
json.dump(c, open(sys.argv[2], "w"))' "$T/mix512.json" "$T/ll512.json"
llm-quantize -q --random "$T/ll512.json" --dtype f32 --seed 3 "$T/ll5" 2>"$T/q.err" || sed 's/^/#   /' "$T/q.err"
TRAIN="--data tests/data/finetune/train.jsonl --seq-len 64 --micro-batch 2 --lr 2e-2 --seed 3 -q"
FT="llm-finetune -m $T/m5 $TRAIN"
# trains NAME CKPT OUT: 60 steps of llm-finetune on CKPT into OUT; the loss must fall
trains() {
	llm-finetune -m "$2" $TRAIN --steps 60 -o "$3" --log "$3.csv" 2>"$3.err" || sed 's/^/#   /' "$3.err"
	check "$1: llm-finetune trains: the mean loss of the last 5 of 60 steps is under 0.93 of the first" $PY -c 'import csv, sys
l = [float(r["loss"]) for r in csv.DictReader(open(sys.argv[1]))]
print("#   loss %.3f -> %.3f" % (l[0], sum(l[-5:]) / 5))
assert len(l) == 60 and sum(l[-5:]) / 5 < 0.93 * l[0], l' "$3.csv"
}
trains mixtral "$T/m5" "$T/ft"
check "mixtral: the adapter holds attention and every expert's w1, w3, w2 (PEFT's names and target_modules)" $PY -c 'import json, re, sys
sys.path.insert(0, "tests/lib")
from stf32 import header
c = json.load(open(sys.argv[1] + "/adapter_config.json"))
assert sorted(c["target_modules"]) == ["k_proj", "o_proj", "q_proj", "v_proj", "w1", "w2", "w3"], c
h = header(sys.argv[1] + "/adapter_model.safetensors"); h.pop("__metadata__", None)
ex = [k for k in h if re.match(r"base_model\.model\.model\.layers\.[01]\.block_sparse_moe\.experts\.[0-3]\.w[123]\.lora_[AB]\.weight$", k)]
assert len(ex) == 2 * 4 * 3 * 2 and len(h) == len(ex) + 2 * 4 * 2, (len(ex), len(h))
assert h["base_model.model.model.layers.1.block_sparse_moe.experts.2.w2.lora_A.weight"]["shape"] == [8, 128]' "$T/ft"
P='Tell me a story about a frog.
'
tuned=$(llm-finetune -m "$T/m5" --adapter "$T/ft" --sample "$P" --sample-tokens 8 2>"$T/err")
gen=$(llm-generate --kv-dtype f32 -m "$T/m5" --lora "$T/ft" -p "$P" -n 8 --temp 0 2>>"$T/err")
base=$(llm-generate --kv-dtype f32 -m "$T/m5" -p "$P" -n 8 --temp 0 2>>"$T/err")
diag "base: $base | tuned: $tuned | llm-generate --lora: $gen"
check "mixtral: llm-generate --lora continues as the trainer's --sample with the adapter, and not as the base" \
	sh -c '[ -n "$1" ] && [ "$1" = "$2" ] && [ "$1" != "$3" ]' - "$tuned" "$gen" "$base"
llm-finetune -q -m "$T/m5" --merge "$T/ft" -o "$T/ft-merged" 2>"$T/err" || sed 's/^/#   /' "$T/err"
$PY -c 'import json, random
r = random.Random(3); ids = [1] + [r.randint(3, 511) for _ in range(31)]
with open("'"$T"'/prompts512.jsonl", "w") as f:
    for p in range(len(ids)): f.write(json.dumps({"prompt_ids": ids[:p + 1]}) + "\n")'
PROMPTS=$T/prompts512.jsonl gen "$T/ft-lora.jsonl" -m "$T/m5" --lora "$T/ft"
PROMPTS=$T/prompts512.jsonl gen "$T/ft-merged.jsonl" -m "$T/ft-merged"
check "mixtral: llm-finetune --merge (every expert's W + scale B A) then llm-generate equals --lora" \
	close "$T/ft-lora.jsonl" "$T/ft-merged.jsonl"
check_fails "mixtral: --shard-base on a mixture of experts is refused in one line" 1 $FT --steps 1 -o "$T/sh" --shard-base
# data parallel under mpirun: each of 2 ranks takes one row of a step
if have_mpirun; then
	C2="--data tests/data/finetune/train.jsonl --seq-len 64 --micro-batch 2 --lr 3e-3 --seed 3 --steps 6 -q"
	llm-finetune -m "$T/m5" $C2 -o "$T/r1" --log "$T/r1.csv" 2>"$T/err"
	timeout 300 $MPIRUN -np 2 "$(command -v llm-finetune)" -m "$T/m5" $C2 -o "$T/r2" --log "$T/r2.csv" \
		>"$T/r2.out" 2>"$T/r2.err" || sed 's/^/#   /' "$T/r2.err" | head -5
	check "mixtral under mpirun -np 2 (data parallel): the loss curve of one process within 1e-4 relative" \
		$PY -c 'import csv, sys
a, b = ([float(r["loss"]) for r in csv.DictReader(open(f))] for f in sys.argv[1:3])
d = max(abs(x - y) / x for x, y in zip(a, b))
print("#   worst relative difference %.2e" % d)
assert len(a) == len(b) == 6 and d <= 1e-4, (a, b)' "$T/r1.csv" "$T/r2.csv"
else
	skip "mixtral under mpirun -np 2 (data parallel)" "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
fi
check_fails "mixtral: --plan --offload-base is refused in one line too" 1 llm-finetune -m "$T/m5" --plan --offload-base 0.5
llm-finetune -m "$T/m5" --plan --json --seq-len 64 >"$T/plan.json" 2>"$T/err"
llm-finetune -m "$T/ll5" --plan --json --seq-len 64 >"$T/plan-ll.json" 2>>"$T/err"
check "mixtral: --plan counts each layer's routed rows: 2 of 4 experts' gate, up, h and output a token" $PY -c 'import json, sys
a, b = (json.load(open(f))["bytes_per_rank"] for f in sys.argv[1:3])
n, D, E, K, FE, R, FF = 64, 128, 4, 2, 128, 8, 128
# the Llama of the same shape keeps the dense MLP (3 FF) a token; the mixture
# its logits (E) and per routed row 3 FE + D and the experts adapters (3 R)
assert a["layer_activations"] - b["layer_activations"] == 2 * 4 * n * (E + K * (3 * FE + D + 3 * R) - 3 * FF), (a, b)' \
	"$T/plan.json" "$T/plan-ll.json"
llm-quantize -q --random "$T/q3512.json" --dtype f32 --seed 3 --tokenizer "$S" "$T/q5" 2>"$T/q.err" || sed 's/^/#   /' "$T/q.err"
# Qwen3-MoE: its q/k norms and its experts in one training forward
trains qwen3_moe "$T/q5" "$T/q3ft"
check "qwen3_moe: the adapter names every expert's gate_proj, up_proj, down_proj as PEFT does" $PY -c 'import json, re, sys
sys.path.insert(0, "tests/lib")
from stf32 import header
c = json.load(open(sys.argv[1] + "/adapter_config.json"))
assert sorted(c["target_modules"]) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"], c
h = header(sys.argv[1] + "/adapter_model.safetensors"); h.pop("__metadata__", None)
ex = [k for k in h if re.match(r"base_model\.model\.model\.layers\.\d+\.mlp\.experts\.\d+\.(gate|up|down)_proj\.lora_[AB]\.weight$", k)]
assert ex and len(h) == len(ex) + 2 * 4 * 2, (len(ex), len(h))' "$T/q3ft"
tuned=$(llm-finetune -m "$T/q5" --adapter "$T/q3ft" --sample "$P" --sample-tokens 8 2>"$T/err")
gen=$(llm-generate --kv-dtype f32 -m "$T/q5" --lora "$T/q3ft" -p "$P" -n 8 --temp 0 2>>"$T/err")
diag "qwen3_moe tuned: $tuned | llm-generate --lora: $gen"
check "qwen3_moe: llm-generate --lora continues as the trainer's --sample with the adapter" \
	sh -c '[ -n "$1" ] && [ "$1" = "$2" ]' - "$tuned" "$gen"
tap_done
