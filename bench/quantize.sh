#!/usr/bin/env bash
# bench/quantize.sh: llm-quantize throughput against cp of the same files,
# in the same run, on a random TinyLlama-1.1B-shape BF16 checkpoint.
#   bench/quantize.sh [CONFIG] [WORKDIR]
# Prints MB/s of input for cp, quantize (128x128) and dequantize, and the
# peak resident memory of each (from /usr/bin/time -v). Page cache is warm
# for every run (the input is read once before), so both sides read from
# memory; llm-quantize also fsyncs its output, cp does not (cp + sync shown).
set -euo pipefail
cd "$(dirname "$0")/.."
cfg=${1:-configs/tinyllama-1.1b.json}
w=${2:-/tmp/llm-bench-quantize}
rm -rf "$w"; mkdir -p "$w"
Q=bin/llm-quantize
$Q -q --random "$cfg" --dtype bf16 --seed 1 "$w/bf16"
in_bytes=$(du -sb "$w/bf16/model.safetensors" | cut -f1)
cat "$w/bf16/model.safetensors" >/dev/null
echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//')"
echo "# input: $cfg as BF16, $((in_bytes / 1000000)) MB"
run() {   # name, command...
	local name=$1; shift
	local t0 t1 rss
	t0=$(date +%s.%N)
	/usr/bin/time -v "$@" 2>"$w/time.txt" >/dev/null
	t1=$(date +%s.%N)
	rss=$(awk -F: '/Maximum resident/{print $2+0}' "$w/time.txt")
	awk -v n="$name" -v b="$in_bytes" -v a="$t0" -v z="$t1" -v r="$rss" \
		'BEGIN{s=z-a; printf "%-28s %8.2f s %8.0f MB/s   peak RSS %6.0f MB\n", n, s, b/1e6/s, r/1024}'
}
for rep in 1 2; do
	rm -rf "$w/cp" "$w/fp8" "$w/deq"
	run "cp" cp -r "$w/bf16" "$w/cp"
	rm -rf "$w/cp"
	run "cp + sync" sh -c "cp -r '$w/bf16' '$w/cp' && sync"
	run "llm-quantize 128x128" $Q -q "$w/bf16" "$w/fp8"
	run "llm-quantize --dequantize" $Q -q --dequantize "$w/fp8" "$w/deq"
done
rm -rf "$w"
