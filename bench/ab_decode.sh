#!/usr/bin/env bash
# bench/ab_decode.sh: decode steps of few sequences, two builds side by side
# in one run, alternating: llm-bench model tg (1, 2, 3 and 4 sequences
# decoding together, no context) on the random SmolLM2-135M and
# TinyLlama-1.1B weights bench/engine.sh makes, BF16 and FP8, one thread.
#   bench/ab_decode.sh A_BIN B_BIN [ROUNDS] [OUT] [WORKDIR]
# A_BIN, B_BIN: directories holding llm-bench (e.g. a build of an older
# commit, and bin/); WORKDIR: bench/engine.sh's (default
# /tmp/llm-bench-engine, where its weights must already be). Default 3
# rounds, bench/results/ab-decode.txt. Prints every round and the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1 B=$2 rounds=${3:-3} out=${4:-bench/results/ab-decode.txt} W=${5:-/tmp/llm-bench-engine}
BATCH=${BATCH:-1,2,3,4}
N=${N:-32}
models=()
for m in smollm2-135m/hf-bf16 smollm2-135m/fp8 tinyllama-1.1b/hf-bf16 tinyllama-1.1b/fp8; do
	[ -f "$W/$m/model.safetensors" ] && models+=("$m")
done
[ ${#models[@]} -gt 0 ] || { echo "ab_decode.sh: no weights in $W (run bench/engine.sh first)" >&2; exit 1; }
rows=$(mktemp)
trap 'rm -f "$rows"' EXIT
# one BIN MODEL: "tok/s tok/s ..." for the batch sizes
one() {
	"$1/llm-bench" model "$W/$2" -p 0 -n "$N" -b "$BATCH" -r 2 -t 1 --format csv 2>/dev/null |
		grep '^auto' | cut -d, -f5 | paste -sd' '
}
{
echo "# bench/ab_decode.sh: A=$A B=$B, $rounds rounds alternating; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), commit $(git rev-parse --short HEAD)"
echo "# llm-bench model -p 0 -n $N -b $BATCH -r 2 -t 1: generated tokens/s of all sequences together"
echo "# round model build $(echo "$BATCH" | tr ',' '\n' | sed 's/^/b/' | paste -sd' ')"
for r in $(seq "$rounds"); do
	for m in "${models[@]}"; do
		order="A B"; [ $((r % 2)) = 0 ] && order="B A"
		for x in $order; do
			bin=$A; [ $x = B ] && bin=$B
			echo "$r $m $x $(one "$bin" "$m")" | tee -a "$rows"
		done
	done
done
echo "# medians (A -> B, B/A)"
python3 - "$rows" "$BATCH" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1])]
bs = sys.argv[2].split(",")
for m in dict.fromkeys(r[1] for r in rows):
	med = {}
	for x in "AB":
		v = [[float(t) for t in r[3:]] for r in rows if r[1] == m and r[2] == x]
		med[x] = [statistics.median(c) for c in zip(*v)]
	print("# %-22s %s" % (m, "  ".join("b%s %.1f -> %.1f (%.2fx)" % (b, a, c, c / a)
	                                    for b, a, c in zip(bs, med["A"], med["B"]))))
EOF
} | tee "$out"
