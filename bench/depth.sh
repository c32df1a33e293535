#!/usr/bin/env bash
# bench/depth.sh: long-context output of llm-generate against llama.cpp on
# the same weights: at chosen positions of one token sequence, the argmax
# and the top-10 log-probs of the next-token distribution of both, with an
# F32 KV cache on both sides.
#
#   bench/depth.sh [WORKDIR]
#
# Environment (defaults in brackets):
#   POSITIONS [100 4096 32769 49152 65535]   0-based positions compared
#   THREADS [1]      CPU threads of each engine (run one after the other)
#   TOL [2e-3]       largest |log-prob difference| allowed over the top 10
#   MODEL            tiny-qwen2, tiny-qwen3, tiny-gemma2, tiny-mistral-sw,
#                    tiny-check, tiny-mixtral or tiny-qwen3moe: that config of
#                    ../shared/tools/configs through
#                    mkrandom.py (seed 1, F32 safetensors and GGUF); or
#                    random (default: a tiny Llama-3.2-1B-shape model with
#                    llama3 RoPE scaling and 131072 positions, from
#                    ../shared/tools/mkrandom.py, seed 1, F32 safetensors and
#                    F32 GGUF of the same numbers) or stories260K (the real
#                    model in STORIES, its F32 GGUF; positions < 511)
#   STORIES [../shared/models/stories260K]
#   OUT              also write the table to this file
#   LLAMA_LIB        the prebuilt llama.cpp folder (libllama, libggml*; unset:
#                    node-llama-cpp's bins/linux-x64 under NPM_DIR)
#   NPM_DIR [/tmp/llm-bench-engine/npm]   where bench/engine.sh keeps npm's
#                    node-llama-cpp 3.22.1 and the llama.cpp source bundle it
#                    ships (for include/ and ggml/include/); made the same
#                    way when missing, if npm is there
#   LLM_BIN [bin]    our tools
#
# The sequence: BOS then ids drawn by Python's random.Random(1) in
# [3, n_vocab - 1], as long as the last position + 1.
# llama.cpp: bench/depth_logits.c decodes it once (512-token llama_decode
# calls, F32 K and V, flash attention off: plain F32 attention), with logits
# kept at the positions only.
# Ours: llm-generate -n 1 --temp 0 --logprobs 10 --kv-dtype f32 --json on one
# prompt per position, ids[0..P] (--parallel 1: one after another; the
# prefix cache shares the longer prompts' leading blocks with the shorter
# ones'); its first top_logprobs entry is the distribution at P.
# Per position: whether the argmax agrees, whether the top-10 id sets agree,
# and the largest |log-prob difference| over the ids of llama.cpp's top 10
# (an id missing from our top 10 counts as a failure unless its log-prob is
# within TOL of our 10th: a near tie at the edge).
# Exit status: 0 all within TOL, 3 a position is not, 1 a run failed;
# 0 with a line "skip: ..." when llama.cpp cannot be had (no npm, or no
# node-llama-cpp and no network) or python3-numpy is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-/tmp/llm-depth}
POSITIONS=${POSITIONS:-100 4096 32769 49152 65535}
THREADS=${THREADS:-1}
TOL=${TOL:-2e-3}
MODEL=${MODEL:-random}
B=${LLM_BIN:-bin}
NPM_DIR=${NPM_DIR:-/tmp/llm-bench-engine/npm}
PY=/usr/bin/python3            # Debian's, where python3-numpy lives
mkdir -p "$W"
skip() { echo "skip: $*"; exit 0; }

# llama.cpp: the prebuilt library and headers, as bench/engine.sh gets them
L=${LLAMA_LIB:-$NPM_DIR/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64}
if [ ! -f "$L/libggml-base.so" ]; then
	[ -z "${LLAMA_LIB:-}" ] || skip "LLAMA_LIB=$LLAMA_LIB has no libggml-base.so"
	command -v npm >/dev/null || skip "no llama.cpp: $L is missing and npm is not installed"
	mkdir -p "$NPM_DIR"
	(cd "$NPM_DIR" && npm install --ignore-scripts --no-audit --no-fund node-llama-cpp@3.22.1 >npm.log 2>&1) ||
		skip "no llama.cpp: npm install node-llama-cpp@3.22.1 failed (see $NPM_DIR/npm.log)"
fi
S=$NPM_DIR/llsrc
if [ ! -f "$S/include/llama.h" ]; then
	BUNDLE=$NPM_DIR/node_modules/node-llama-cpp/llama/gitRelease.bundle
	[ -f "$BUNDLE" ] || skip "no llama.cpp headers: $BUNDLE is missing"
	git clone -q "$BUNDLE" "$S" 2>/dev/null || skip "no llama.cpp headers: git clone of $BUNDLE failed"
fi
mkdir -p "$W/lib"
ln -sf "$L/libllama.v0.5.0.so" "$W/lib/libllama.so"
ln -sf "$L/libggml.v0.5.0.so" "$W/lib/libggml.so"
ln -sf "$L/libggml-base.so" "$W/lib/libggml-base.so"
cc -O2 -Wall -Wextra -std=c11 -D_POSIX_C_SOURCE=200809L -I"$S/include" -I"$S/ggml/include" \
	-o "$W/depth_logits" bench/depth_logits.c -L"$W/lib" -Wl,-rpath,"$L" -lllama -lggml -lggml-base -lm

# the weights: ours (a model directory) and theirs (a GGUF) of the same numbers
case $MODEL in
random)
	$PY -c 'import numpy' 2>/dev/null || skip "python3-numpy is missing (mkrandom.py needs it)"
	if [ ! -f "$W/random/model-f32.gguf" ]; then
		$PY ../shared/tools/mkrandom.py --config configs/tiny-llama3-128k.json --out "$W/random" \
			--formats st-f32,gguf-f32 --seed 1 >"$W/mkrandom.log" 2>&1
	fi
	OURS=$W/random/hf-f32 GGUF=$W/random/model-f32.gguf NV=2048 ;;
stories260K)
	OURS=${STORIES:-../shared/models/stories260K} GGUF=$OURS/stories260K-f32.gguf NV=512 ;;
tiny-qwen2|tiny-qwen3|tiny-gemma2|tiny-mistral-sw|tiny-check|tiny-mixtral|tiny-qwen3moe)
	# a family's tiny config of ../shared/tools (seed 1, F32): llama.cpp has
	# no sliding window for mistral (compare positions below 64 only) and
	# computes gemma2's GELU through an fp16 table (about 3e-4)
	$PY -c 'import numpy' 2>/dev/null || skip "python3-numpy is missing (mkrandom.py needs it)"
	if [ ! -f "$W/$MODEL/model-f32.gguf" ]; then
		$PY ../shared/tools/mkrandom.py --config "../shared/tools/configs/$MODEL.json" --out "$W/$MODEL" \
			--formats st-f32,gguf-f32 --seed 1 >"$W/mkrandom.log" 2>&1
	fi
	OURS=$W/$MODEL/hf-f32 GGUF=$W/$MODEL/model-f32.gguf
	NV=$($PY -c 'import json, sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$OURS/config.json") ;;
*)
	echo "depth.sh: MODEL '$MODEL': expected random, stories260K or a tiny family config" >&2; exit 2 ;;
esac

# the sequence and our prompts, one per position
MAXP=$(printf '%s\n' $POSITIONS | sort -n | tail -1)
IDS=$W/ids-$MODEL-$MAXP.json
$PY -c 'import json, random, sys
r = random.Random(1); n, nv = int(sys.argv[1]), int(sys.argv[2])
print(json.dumps([1] + [r.randint(3, nv - 1) for _ in range(n - 1)]))' $((MAXP + 1)) "$NV" >"$IDS"
$PY -c 'import json, sys
ids = json.load(open(sys.argv[1]))
for p in sorted(int(x) for x in sys.argv[2:]):
    print(json.dumps({"prompt_ids": ids[:p + 1]}))' "$IDS" $POSITIONS >"$W/prompts.jsonl"

t0=$(date +%s.%N)
"$W/depth_logits" "$L" "$GGUF" "$IDS" "$(printf '%s\n' $POSITIONS | sort -n | paste -sd,)" "$THREADS" 0 \
	>"$W/theirs.jsonl" 2>"$W/theirs.log" || { echo "depth.sh: depth_logits failed:" >&2; tail -3 "$W/theirs.log" >&2; exit 1; }
t1=$(date +%s.%N)
"$B/llm-generate" -m "$OURS" -n 1 --temp 0 --logprobs 10 --kv-dtype f32 --json -t "$THREADS" --parallel 1 \
	<"$W/prompts.jsonl" >"$W/ours.jsonl" 2>"$W/ours.log" || { echo "depth.sh: llm-generate failed:" >&2; tail -3 "$W/ours.log" >&2; exit 1; }
t2=$(date +%s.%N)

$PY - "$W/theirs.jsonl" "$W/ours.jsonl" "$TOL" "$MODEL" "$THREADS" "$t0" "$t1" "$t2" "${OUT:-}" <<'EOF'
import json, sys
theirs_f, ours_f, tol, model, threads, t0, t1, t2, out = sys.argv[1:]
tol = float(tol)
theirs = [json.loads(l) for l in open(theirs_f)]
ours = [json.loads(l) for l in open(ours_f)]
ours.sort(key=lambda o: len(o["prompt_ids"]))
lines = ["# model %s, %s thread(s); llama.cpp %.1f s, llm-generate %.1f s (wall)" % (
    model, threads, float(t1) - float(t0), float(t2) - float(t1)),
    "position  argmax_theirs  argmax_ours  argmax  top10_set  max_abs_diff  within_%g" % tol]
bad = 0
for th, o in zip(theirs, ours):
    assert th["pos"] == len(o["prompt_ids"]) - 1, "positions out of order"
    mine = {e["id"]: e["logprob"] for e in o["top_logprobs"][0]}
    tenth = min(mine.values())
    worst, ok = 0.0, True
    for tid, tlp in th["top"]:
        if tid in mine:
            worst = max(worst, abs(mine[tid] - tlp))
        elif tlp > tenth + tol:
            ok = False
    agree = th["top"][0][0] == o["top_logprobs"][0][0]["id"]
    same = set(mine) == {t[0] for t in th["top"]}
    ok = ok and agree and worst <= tol
    bad += not ok
    lines.append("%8d  %13d  %11d  %6s  %9s  %12.2e  %s" % (th["pos"], th["top"][0][0],
        o["top_logprobs"][0][0]["id"], "same" if agree else "DIFF", "same" if same else "diff",
        worst, "yes" if ok else "NO"))
text = "\n".join(lines)
print(text)
if out:
    with open(out, "a") as f:
        f.write(text + "\n")
sys.exit(3 if bad else 0)
EOF
