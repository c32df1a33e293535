#!/usr/bin/env bash
# bench/eval.sh: the evaluation job (llm-generate --eval) the naive way and
# with each step of the HellaSwag system added, timed from process start to
# the last result (the summary's total_s: loading, tokenising, scheduling
# and scoring), on synthetic multiple-choice items: 4 endings, contexts of
# 20-150 tokens and endings of 10-60 (uniform; words of a story vocabulary,
# lengths measured by the model's tokenizer and printed).
#
#   bench/eval.sh [N_ITEMS (2000)] [N_ITEMS_SMOLLM2 (48)] [WORKDIR]
#
# Models: stories260K (../shared/models) and a random SmolLM2-135M FP8
# checkpoint (llm-quantize --random configs/smollm2-135m.json) given
# stories260K's tokenizer (its 512 ids fit the 49152 vocabulary), so the
# same text items run. Variants:
#   (a) naive: every context + ending its own item, one sequence at a time
#       (--parallel 1): no sharing, no batching
#   (b) sharing: each context once, its 4 endings forked, one item at a
#       time (--parallel 5: its 5 sequences)
#   (c) sharing + batching + the DP schedule (--parallel 64, theta default)
#   (d) (c) under mpirun -np 2 on a checkpoint split in 2 pipeline stages
# Every variant runs with -c 256 (an item is at most 211 tokens).
# Results: bench/results/eval-DATE.txt (and stdout).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-2000}
NS=${2:-48}
W=${3:-/tmp/llm-bench-eval}
G=bin/llm-generate
S=../shared/models/stories260K
OUT=bench/results/eval-$(date +%F).txt
mkdir -p "$W" bench/results
MPIRUN="mpirun --oversubscribe"
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"

# the items: words until each part reaches its drawn token count
python3 - "$W" "$N" "$G" "$S" <<'PY'
import json, random, subprocess, sys
w, n, g, s = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
words = ("the a little girl boy cat dog sun tree park ball house mom dad friend happy sad big small ran saw "
         "played went jumped looked found said was were had with and to in on of she he they it day time one "
         "very fun toy red blue green bird fish water sky cake car book box garden flower smile laugh").split()
def tok(text):
    return len(json.loads(subprocess.run([g, "-m", s, "--tokenize", "--no-special"], input=text.encode(),
                                         capture_output=True, check=True).stdout))
probe = " ".join(random.Random(0).choice(words) for _ in range(3000))
per_word = tok(probe) / 3000          # tokens per word, measured once
rng = random.Random(1)
def text(tokens):
    return " ".join(rng.choice(words) for _ in range(max(1, round(tokens / per_word))))
with open(w + "/items.jsonl", "w") as a, open(w + "/naive.jsonl", "w") as b:
    for i in range(n):
        ctx = text(rng.randint(20, 150)).capitalize()
        ends = [" " + text(rng.randint(10, 60)) + "." for _ in range(4)]
        a.write(json.dumps({"context": ctx, "endings": ends, "label": rng.randrange(4)}) + "\n")
        for e in ends:
            b.write(json.dumps({"context": "", "endings": [ctx + e]}) + "\n")
PY

# the random SmolLM2 with stories260K's tokenizer, and its 2-stage split
R=$W/smollm2-fp8
if [ ! -f "$R/model.safetensors" ] && [ ! -f "$R/config.json" ]; then
	bin/llm-quantize --random configs/smollm2-135m.json --dtype fp8 "$R" >/dev/null
	cp "$S/tokenizer.json" "$S/tokenizer_config.json" "$R/"
fi
for m in "$S:stories" "$R:smollm2"; do
	d=$W/${m##*:}-pp2
	[ -d "$d" ] || { bin/llm-repartition -q "${m%%:*}" "$d" --pp 2 && cp "$S/tokenizer.json" "$S/tokenizer_config.json" "$d/"; }
done

total() { python3 -c 'import json,sys; print(json.loads(sys.stdin.readlines()[-1])["total_s"])'; }
run() {   # model items n variant... -> total seconds
	local m=$1 f=$2 n=$3; shift 3
	head -n "$n" "$f" | "$@" -m "$m" -c 256 --eval --json 2>/dev/null | total
}
{
echo "# machine: $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), shared), commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ)"
head -n "$N" "$W/items.jsonl" | $G -m "$S" -c 256 --eval --json 2>/dev/null | python3 -c '
import json, sys
r = [json.loads(l) for l in sys.stdin][:-1]
c = [x["context_tokens"] - 1 for x in r]; e = [t for x in r for t in x["tokens"]]
print("# items: %d, context tokens %d-%d (mean %.0f), ending tokens %d-%d (mean %.0f)" % (len(r), min(c), max(c), sum(c) / len(c), min(e), max(e), sum(e) / len(e)))'
printf '%-10s %6s %-34s %9s %8s %8s\n' model items variant "total s" items/s speedup
for m in stories:$S:$N smollm2:$R:$NS; do
	name=${m%%:*}; rest=${m#*:}; dir=${rest%:*}; n=${rest##*:}
	a=$(run "$dir" "$W/naive.jsonl" $((4 * n)) $G --parallel 1 --eval-batch-tokens 1)
	b=$(run "$dir" "$W/items.jsonl" "$n" $G --parallel 5 --eval-batch-tokens 1)
	c=$(run "$dir" "$W/items.jsonl" "$n" $G --parallel 64)
	d=$(run "$W/$name-pp2" "$W/items.jsonl" "$n" $MPIRUN -np 2 $G --parallel 64 || echo nan)
	for v in "(a) naive, one sequence at a time:$a" "(b) sharing, one item at a time:$b" \
	         "(c) sharing + batching + DP:$c" "(d) (c), mpirun -np 2, pp2:$d"; do
		t=${v##*:}
		printf '%-10s %6d %-34s %9.2f %8.2f %7.2fx\n' "$name" "$n" "${v%:*}" "$t" \
			"$(python3 -c "print($n / $t if $t == $t else float('nan'))")" "$(python3 -c "print($a / $t)")"
	done
done
} | tee "$OUT"
