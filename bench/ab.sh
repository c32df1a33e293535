#!/usr/bin/env bash
# bench/ab.sh: two builds of the tools side by side on one machine, in one
# run, alternating, on a random-weight SmolLM2-135M-shape FP8 checkpoint:
#   - llm-bench model pp512 and tg128 (batch 1), one thread and all threads;
#   - llm-serve output tok/s with 1 client and with 16 (bench/serve.sh's
#     section 1: input 16, output 64, 32 requests), and their ratio.
#   bench/ab.sh A_BIN B_BIN [ROUNDS] [OUT]   (default 3 rounds, bench/results/ab.txt)
# A_BIN, B_BIN: directories holding llm-bench, llm-serve and llm-quantize
# (e.g. a build of an older commit, and bin/). Loopback only; every load is
# bounded by request counts. Prints per-round values and the medians.
set -euo pipefail
cd "$(dirname "$0")/.."
A=$1 B=$2 rounds=${3:-3} out=${4:-bench/results/ab.txt}
w=/tmp/llm-bench-ab
mkdir -p "$w" "$(dirname "$out")"
ckpt=$w/smollm2-135m-fp8
tok=${LLM_TOKENIZER:-../shared/reference/tokenizers/mistral7b}   # ids < 49152
[ -d "$ckpt" ] || "$B/llm-quantize" -q --random configs/smollm2-135m.json --dtype fp8 --seed 1 --tokenizer "$tok" "$ckpt"

# model BIN THREADS: "pp512 tg128" tokens/s
model() {
	"$1/llm-bench" model "$ckpt" -p 512 -n 128 -r 2 ${2:+-t $2} --format csv | grep '^auto' | cut -d, -f5 | paste -sd' '
}
# serve BIN: "c1 c16" output tokens/s
serve() {
	rm -f "$w/port"
	"$1/llm-serve" -m "$ckpt" --port 0 --port-file "$w/port" -q --max-running 16 --max-batch-tokens 256 2>"$w/serve.log" &
	local sp=$!
	for i in $(seq 1 300); do
		[ -s "$w/port" ] && curl -sf -m 2 "http://127.0.0.1:$(cat "$w/port")/health" >/dev/null && break
		sleep 0.1
	done
	"$1/llm-bench" serve "http://127.0.0.1:$(cat "$w/port")" --concurrency 1,16 --requests 32 --input-len 16 \
		--output-len 64 | grep -v '^#' | awk '$1 == 0 && $2 == 1 {c1 = $8} $1 == 0 && $2 == 16 {print c1, $8}'
	kill -TERM "$sp"
	wait "$sp" || true
}
{
echo "# bench/ab.sh: A=$A B=$B, $rounds rounds alternating; $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "# round build pp512_t1 tg128_t1 pp512_all tg128_all serve_c1 serve_c16 ratio"
for r in $(seq 1 "$rounds"); do
	for side in A B; do
		bin=$A; [ $side = B ] && bin=$B
		m1=$(model "$bin" 1) ma=$(model "$bin" "") s=$(serve "$bin")
		echo "$r $side $m1 $ma $s" | awk '{printf "%s %s %s %s %s %s %s %s %.2f\n", $1, $2, $3, $4, $5, $6, $7, $8, $8 / $7}'
	done
done
} | tee "$w/rounds.txt"
{
cat "$w/rounds.txt"
for side in A B; do
	awk -v s=$side '$2 == s' "$w/rounds.txt" | awk -v s=$side '
		{ for (c = 3; c <= 9; c++) v[c, NR] = $c; n = NR }
		END { printf "# median %s:", s
		      split("pp512_t1 tg128_t1 pp512_all tg128_all serve_c1 serve_c16 ratio", name, " ")
		      for (c = 3; c <= 9; c++) { m = 0; for (i = 1; i <= n; i++) a[i] = v[c, i]
		          for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
		          printf " %s %s", name[c - 2], a[int((n + 1) / 2)] }
		      printf "\n" }'
done
} >"$out"
tail -n 2 "$out"
