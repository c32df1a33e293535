# tests/cli/badckpt.sh: checkpoints broken on purpose, built here from a
# random one: a tensor dropped from the header is named as missing (with
# the file), not reported as a gap before some other tensor.
. tests/lib/tap.sh
T=$TMPD

# drop TENSOR from the header of the safetensors file SRC into DST (the
# data stays where it was, so the header leaves a gap)
drop() {
	python3 - "$1" "$2" "$3" <<'PY'
import json, struct, sys
src, dst, name = sys.argv[1:]
b = open(src, "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
del h[name]
j = json.dumps(h, separators=(",", ":")).encode()
j += b" " * (-len(j) % 8)
open(dst, "wb").write(struct.pack("<Q", len(j)) + j + b[8 + n:])
PY
}

llm-quantize -q --random configs/tiny-check.json --seed 2 "$T/dir"
cp -r "$T/dir" "$T/miss"
drop "$T/dir/model.safetensors" "$T/miss/model.safetensors" model.layers.1.mlp.up_proj.weight
check_fails "a tensor missing from a directory's file: exit 1, one line" 1 sh -c \
	"echo '{\"prompt_ids\": [1, 2]}' | llm-generate -m '$T/miss' --temp 0 -n 2 --json"
check "... naming the file and the missing tensor" \
	grep -q "$T/miss/model.safetensors: missing tensor 'model.layers.1.mlp.up_proj.weight' (config.json: 2 layers)" "$T/err"
check "... not a gap before another tensor" sh -c "! grep -q 'gap of' '$T/err'"
check_fails "llm-quantize --check says the same" 1 llm-quantize --check "$T/miss"
check "... naming the missing tensor" grep -q "missing tensor 'model.layers.1.mlp.up_proj.weight'" "$T/err"

# one .safetensors file with its config.json in the metadata
llm-quantize -q --random configs/tiny-check.json --seed 2 "$T/one.safetensors"
drop "$T/one.safetensors" "$T/one-miss.safetensors" lm_head.weight
check_fails "a tensor missing from a single file (config in its metadata): exit 1" 1 \
	llm-quantize "$T/one-miss.safetensors" "$T/out"
check "... naming the file and lm_head.weight" \
	grep -q "$T/one-miss.safetensors: missing tensor 'lm_head.weight'" "$T/err"

# a gap that is no missing tensor (every tensor the config names is there):
# the gap error stands
python3 - "$T/dir/model.safetensors" "$T/gap.safetensors" <<'PY'
import json, struct, sys
b = open(sys.argv[1], "rb").read()
n = struct.unpack("<Q", b[:8])[0]
h = json.loads(b[8:8 + n])
h["extra.weight"] = {"dtype": "BF16", "shape": [8], "data_offsets": [0, 0]}
last = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
h["extra.weight"]["data_offsets"] = [last + 16, last + 32]
j = json.dumps(h, separators=(",", ":")).encode()
j += b" " * (-len(j) % 8)
open(sys.argv[2], "wb").write(struct.pack("<Q", len(j)) + j + b[8 + n:] + bytes(32))
PY
check_fails "a gap with no tensor missing: exit 1" 1 llm-quantize --check "$T/gap.safetensors"
check "... the gap error, naming the tensor after it" grep -q "tensor 'extra.weight': gap of 16 bytes" "$T/err"
tap_done
