#!/usr/bin/env bash
# bench/engine.sh: prompt processing (pp512) and generation (tg128) tokens/s
# of llm-generate against llama.cpp on the same random weights, in the same
# run, alternating the engines; plus start-up time and peak memory.
#
#   LBENCH=/path/to/lbench LBENCH_LIB=/path/to/node-llama-cpp/bins/linux-x64 \
#       bench/engine.sh [WORKDIR] [CONFIG...]
#
# The weights come from ../shared/tools/mkrandom.py (one seeded random model
# as Hugging Face BF16 safetensors and GGUF BF16/Q8_0; needs python3-numpy),
# our FP8 checkpoints from llm-quantize of the same BF16 weights: the default
# (decoder projections in FP8, embeddings BF16) and "fp8+emb" (the embedding
# and lm_head in FP8 too: the same tensors as llama.cpp's Q8_0 file).
# llama.cpp is timed by ../shared/tools/lbench.c (llama-bench's method)
# against the prebuilt library of the npm package node-llama-cpp; see
# ../shared/tools/README.md for building it. Ours: llm-bench model (the same
# method: pp = one 512-token forward step, tg = 128 tokens from an empty
# context, one warm-up). Both: mean of 3 repetitions.
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-/tmp/llm-bench-engine}
shift || true
CONFIGS=("${@:-../shared/tools/configs/smollm2-135m.json ../shared/tools/configs/tinyllama-1.1b.json}")
PY=/usr/bin/python3            # Debian's, where python3-numpy lives
G=bin/llm-generate
mkdir -p "$W"
echo "# machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), commit $(git rev-parse --short HEAD)"
printf '%-16s %-22s %3s %10s %10s\n' model engine thr "pp512 t/s" "tg128 t/s"

ours() {   # dir threads -> "pp tg"
	bin/llm-bench model "$1" -t "$2" -r 3 --format jsonl 2>/dev/null | grep '^{' |
		$PY -c 'import json,sys; r=[json.loads(l) for l in sys.stdin]; print(r[0]["tok_s"], r[1]["tok_s"])'
}
theirs() { # gguf threads -> "pp tg"
	"$LBENCH" "$LBENCH_LIB" "$1" "$2" 512 128 3 2>/dev/null | tail -1 |
		$PY -c 'import json,sys; o=json.load(sys.stdin); m=lambda v: sum(v)/len(v); print(m(o["pp_tps"]), m(o["tg_tps"]))'
}
for cfg in ${CONFIGS[@]}; do
	name=$(basename "$cfg" .json)
	d=$W/$name
	if [ ! -f "$d/model-q8_0.gguf" ]; then
		$PY ../shared/tools/mkrandom.py --config "$cfg" --out "$d" --formats st-bf16,gguf-bf16,gguf-q8_0 --seed 1 >/dev/null
	fi
	[ -d "$d/fp8" ] || bin/llm-quantize -q "$d/hf-bf16" "$d/fp8"
	[ -d "$d/fp8+emb" ] || bin/llm-quantize -q --include 'proj\.weight$|embed_tokens|lm_head' "$d/hf-bf16" "$d/fp8+emb"
	for t in 1 2; do
		for run in ours:hf-bf16 theirs:model-bf16.gguf ours:fp8 ours:fp8+emb theirs:model-q8_0.gguf; do
			eng=${run%%:*} m=${run#*:}
			if [ "$eng" = ours ]; then r=$(ours "$d/$m" $t); label="llm-tools ${m/hf-/}"
			else r=$(theirs "$d/$m" $t); label="llama.cpp ${m#model-}"; label=${label%.gguf}; fi
			printf '%-16s %-22s %3s %10.1f %10.1f\n' "$name" "$label" "$t" $r
		done
	done
	# start-up: process start to first token (1-token prompt, 1 token), warm cache,
	# against reading the file once; and peak resident memory against its size
	f=$d/fp8/model.safetensors
	cat "$f" >/dev/null
	echo '{"prompt_ids": [1], "max_tokens": 1, "temperature": 0}' >"$W/p1.jsonl"
	t_cat=$( { /usr/bin/time -f %e cat "$f" >/dev/null; } 2>&1 )
	out=$( { /usr/bin/time -f '%e %M' $G -m "$d/fp8" --json <"$W/p1.jsonl" >/dev/null; } 2>&1 | tail -1)
	size=$(stat -c %s "$f")
	echo "# $name fp8: start to first token $(echo "$out" | cut -d' ' -f1) s, cat of the file $t_cat s; peak RSS $(( $(echo "$out" | cut -d' ' -f2) / 1024 )) MB for a $((size / 1000000)) MB file"
done
