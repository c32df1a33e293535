#!/usr/bin/env bash
# tools/demo.sh: the toolchain's chain on a small model, each step saying what
# it did and how long it took (make demo runs it after the build):
#   1. llm-quantize: the model's weights to FP8 E4M3 with group-wise scales
#   2. llm-generate: text from the FP8 checkpoint, greedy
#   3. llm-serve on loopback (a port the kernel picks), one OpenAI completion
#      sent with curl, then the server stopped
# The model is ../shared/models/stories260K (LLM_TEST_MODELS overrides the
# folder) when present; otherwise a small random-weight checkpoint made with
# llm-quantize --random, given a byte-level tokenizer.json written here (its
# text is random, of course).
# Outputs go to build/demo/ (DEMO_DIR overrides), replaced on every run.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${LLM_BIN:-$PWD/bin}
D=${DEMO_DIR:-build/demo}
M=${LLM_TEST_MODELS:-../shared/models}/stories260K
rm -rf "$D" && mkdir -p "$D"

now() { date +%s.%N; }
took() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f s", b - a }'; }
step() { printf '\n== %s\n' "$*"; }

if [ -f "$M/config.json" ]; then
	echo "demo: model $M (the small real model beside the project)"
else
	step "no $M: making a small random-weight checkpoint instead (its text is noise)"
	t=$(now)
	"$BIN/llm-quantize" --random configs/tiny-check.json --seed 1 "$D/random-bf16"
	M=$D/random-bf16
	# a byte-level tokenizer: 3 specials, the 256 bytes, the word marker, and
	# filler pieces up to the config's vocab_size (decodable, never produced)
	python3 - "$M" <<'PY'
import json, sys
d = sys.argv[1]
n = json.load(open(d + "/config.json"))["vocab_size"]
special = ["<unk>", "<s>", "</s>"]
vocab = special + ["<0x%02X>" % b for b in range(256)] + ["\u2581"]
vocab += ["\u2581" + chr(97 + i % 26) * (1 + i // 26) for i in range(n - len(vocab))]
json.dump({"version": "1.0",
    "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
                      "normalized": False, "special": True} for i, s in enumerate(special)],
    "normalizer": {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]},
    "pre_tokenizer": None,
    "post_processor": {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
        {"Sequence": {"id": "A", "type_id": 0}}], "pair": [], "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
    "decoder": {"type": "Sequence", "decoders": [{"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
    "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
              "vocab": {s: i for i, s in enumerate(vocab)}, "merges": []}},
    open(d + "/tokenizer.json", "w"), ensure_ascii=False)
PY
	echo "-> $M (and a byte-level tokenizer.json) in $(took "$t")"
fi

step "1. llm-quantize: $M to FP8 E4M3 with group-wise scales"
t=$(now)
"$BIN/llm-quantize" "$M" "$D/fp8"
echo "-> $D/fp8 in $(took "$t") (start-up included)"

step "2. llm-generate: 48 tokens from the FP8 checkpoint, greedy"
t=$(now)
echo "\$ bin/llm-generate -m $D/fp8 -p 'Once upon a time' -n 48 --temp 0 --echo"
"$BIN/llm-generate" -m "$D/fp8" -p 'Once upon a time' -n 48 --temp 0 --echo
echo "-> in $(took "$t") (start-up included)"

step "3. llm-serve on 127.0.0.1, one OpenAI completion with curl, then stop"
t=$(now)
"$BIN/llm-serve" -m "$D/fp8" --host 127.0.0.1 --port 0 --port-file "$D/port" 2>"$D/serve.log" &
sp=$!
trap 'kill $sp 2>/dev/null || true' EXIT
for _ in $(seq 600); do
	[ -s "$D/port" ] && curl -sf "http://127.0.0.1:$(cat "$D/port")/health" >/dev/null && break
	kill -0 $sp 2>/dev/null || { cat "$D/serve.log" >&2; echo "demo: llm-serve exited" >&2; exit 1; }
	sleep 0.1
done
url=http://127.0.0.1:$(cat "$D/port")
echo "llm-serve answering on $url after $(took "$t")"
body='{"prompt": "The little dog", "max_tokens": 32, "temperature": 0}'
echo "\$ curl -s $url/v1/completions -H 'Content-Type: application/json' -d '$body'"
t=$(now)
curl -sf "$url/v1/completions" -H 'Content-Type: application/json' -d "$body"
echo
echo "-> answered in $(took "$t")"
kill -TERM $sp && wait $sp || true
trap - EXIT
echo "llm-serve stopped"
printf '\ndemo: done; the FP8 checkpoint is in %s\n' "$D/fp8"
