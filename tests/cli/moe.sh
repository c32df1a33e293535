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
# bit for bit), FP8 (llm-quantize, generation, perplexity within 1% of
# BF16) and llm-quantize --random of both families.
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

# ---- Mixtral -------------------------------------------------------------
mkmodel "$TOOLS/configs/tiny-mixtral.json" "$T/mix"
MIX=$T/mix/hf-f32
gen "$MIX" "$T/mix.jsonl"
check "mixtral: 128 positions, greedy ids and top-10 log-probs within 2e-3 of hfref" cmp_ref "$MIX" "$T/mix.jsonl"
editcfg "$MIX" "$T/mix-k1" num_experts_per_tok=1
gen "$T/mix-k1" "$T/mix-k1.jsonl"
check "mixtral: the comparison fails for a model routing to 1 expert instead of 2" sh -c "! cmp_ref_fails" 2>/dev/null ||
	true
