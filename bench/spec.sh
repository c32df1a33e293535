#!/usr/bin/env bash
# bench/spec.sh: speculative decoding by prompt lookup (--speculate ngram)
# and by a draft model (--speculate draft: stories260K's FP8 copy, made by
# llm-quantize -b 1x32), measured on one machine in one run:
#   1. stories260K on a copy-style workload (each of the 30 reference
#      stories, then its first sentence again: the continuation can copy
#      the prompt): generated tokens/s and the accepted share of drafts,
#      without speculation, with ngram and with the draft, --parallel 1
#      and 8, greedy; the ids
#      are checked to be the same (the #wrong column);
#   2. the verify step against plain decode on a random SmolLM2-135M-shape
#      FP8 checkpoint: llm-bench model's time per step of 1 + k tokens of
#      one sequence (pp1, pp5 at depth 256) and of 8 sequences (tg x8
#      against pp40, the same tokens and context per token as 8 x (1 + 4)).
#   bench/spec.sh [OUTDIR] [WORKDIR]     (LLM_BIN: the tools, default bin/;
#   THREADS: CPU threads, default 1; REPS: repetitions, default 3)
# Results: OUTDIR/spec-stories260K.txt and OUTDIR/spec-verify-smollm2.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench/results}
w=${2:-/tmp/llm-bench-spec}
B=${LLM_BIN:-bin}
T=${THREADS:-1}
R=${REPS:-3}
mkdir -p "$out" "$w"
M=${LLM_TEST_MODELS:-../shared/models}/stories260K
D=$w/stories260K-fp8
[ -d "$D" ] || "$B/llm-quantize" -q -b 1x32 "$M" "$D"
REF=${LLM_TEST_REF:-../shared/reference}/stories260K/greedy.jsonl
commit=$(git rev-parse --short HEAD)
machine() { echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"; }

# 1. stories260K, copy-style prompts (128 new tokens each, EOS ignored)
python3 - "$REF" "$w" <<'PY'
import json, sys
ref, w = sys.argv[1], sys.argv[2]
with open(w + "/copy.jsonl", "w") as a, open(w + "/copy1.jsonl", "w") as b:
    for l in open(ref):
        story = json.loads(l)["stdout"][:500]
        p = story + "\n\n" + story.split(".")[0]
        a.write(json.dumps({"prompt": p, "max_tokens": 128, "temperature": 0, "ignore_eos": True}) + "\n")
        b.write(json.dumps({"prompt": p, "max_tokens": 1, "temperature": 0, "ignore_eos": True}) + "\n")
PY
now() { date +%s.%N; }
# run NAME ARGS...: the best of R runs' wall seconds into $w/NAME.s, output and -v line kept
run() {
	local name=$1 best= t0 t1; shift
	for i in $(seq 1 "$R"); do
		t0=$(now)
		"$B/llm-generate" -m "$M" --json -t "$T" -v "$@" <"$w/copy${name#*@}.jsonl" >"$w/$name.out" 2>"$w/$name.err"
		t1=$(now)
		best=$(python3 -c "import sys; a, b = float(sys.argv[1]), sys.argv[2]; print(min(a, float(b)) if b else a)" "$(echo "$t1 - $t0" | bc)" "$best")
	done
	echo "$best" >"$w/$name.s"
}
{
	echo "# bench/spec.sh: llm-generate --speculate ngram and --speculate draft (stories260K's FP8 copy, -b 1x32) on stories260K, copy-style prompts"
	echo "# commit: $commit"
	echo "# device (this machine): $(machine)"
	echo "# config: 30 prompts (a reference story's first 500 bytes, a blank line, its first sentence again), 128 new tokens each (ignore_eos), greedy, -t $T, best of $R runs; --spec-tokens 4 --spec-ngram 3"
	echo "# definitions: gen tok/s = (generated tokens - prompts) / (wall - wall of the same prompts with max_tokens 1); accept = accepted / drafted tokens; #wrong = prompts whose ids differ from the run without speculation"
	printf '%9s %9s %9s %9s %9s %9s %9s\n' parallel spec steps drafted accepted "gen tok/s" "#wrong"
	printf '%9s %9s %9s %9s %9s %9s %9s\n' "" "" "" "" "(%)" "(tok/s)" ""
	for par in 1 8; do
		run "pre$par@1" --parallel $par
		for sp in off ngram draft; do
			dr=(); [ $sp = draft ] && dr=(--draft "$D")
			run "$sp$par@" --parallel $par --speculate $sp --spec-tokens 4 --spec-ngram 3 ${dr[@]+"${dr[@]}"}
			python3 - "$w" "$par" "$sp" <<'PY'
import json, re, sys
w, par, sp = sys.argv[1], sys.argv[2], sys.argv[3]
wall, pre = float(open("%s/%s%s@.s" % (w, sp, par)).read()), float(open("%s/pre%s@1.s" % (w, par)).read())
out = [json.loads(l)["ids"] for l in open("%s/%s%s@.out" % (w, sp, par))]
ref = [json.loads(l)["ids"] for l in open("%s/off%s@.out" % (w, par))]
err = open("%s/%s%s@.err" % (w, sp, par)).read()
steps = re.search(r"(\d+) steps", err).group(1)
m = re.search(r"(\d+) of (\d+) drafted tokens accepted", err)
acc, dr = (int(m.group(1)), int(m.group(2))) if m else (0, 0)
gen = sum(len(x) for x in out) - len(out)
print("%9s %9s %9s %9d %9s %9.4g %9d" % (par, sp, steps, dr, "%.1f" % (100.0 * acc / dr) if dr else "-",
      gen / (wall - pre), sum(a != b for a, b in zip(out, ref))))
PY
		done
	done
	echo "# summary: see the rows; the ids with speculation are those without (#wrong 0)"
	echo "# note: the FP8 draft has the model's shape and costs a forward of its own per drafted position, so its rows show acceptance, not a speed-up: a draft pays when it is several times cheaper than the model"
} | tee "$out/spec-stories260K.txt"

# 2. the verify step on a random SmolLM2-135M-shape FP8 checkpoint
ckpt=$w/smollm2-135m-fp8
[ -d "$ckpt" ] || "$B/llm-quantize" -q --random configs/smollm2-135m.json --dtype fp8 --seed 1 "$ckpt"
{
	echo "# bench/spec.sh: the verify step of speculative decoding against plain decode, llm-bench model"
	echo "# commit: $commit"
	echo "# device (this machine): $(machine)"
	echo "# config: random SmolLM2-135M-shape FP8 (configs/smollm2-135m.json), -t $T, -r $((R + 2)), depth 256; ms/step = tokens of the step / tok/s"
	printf '%22s %9s %9s %9s\n' test tok/s sd "ms/step"
	for a in "-p 1 -n 0" "-p 5 -n 0" "-p 0 -n 32 -b 8" "-p 40 -n 0"; do
		"$B/llm-bench" -q model "$ckpt" $a -d 256 -r $((R + 2)) -t "$T" --format csv | grep -v '^#' | tail -n 1
	done | python3 -c "
import sys, re
for l in sys.stdin:
    f = l.strip().split(',')
    test, tps, sd = f[3], float(f[4]), float(f[5])
    m = re.match(r'(pp|tg)(\d+)(?: x(\d+))?', test)
    tok = int(m.group(2)) if m.group(1) == 'pp' else int(m.group(3) or 1)
    print('%22s %9.4g %9.3g %9.4g' % (test, tps, sd, 1e3 * tok / tps))"
	echo "# summary: a verify step of 1 + 4 tokens costs pp5's ms/step against pp1's (batch 1), pp40's against tg x8's (batch 8)"
} | tee "$out/spec-verify-smollm2.txt"
