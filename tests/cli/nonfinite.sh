# tests/cli/nonfinite.sh: checkpoints whose weights hold NaN or Inf, built
# here from a random checkpoint with one value overwritten: --check and
# --check-weights name the tensor and the index, sampling refuses non-finite
# logits (greedy and sampled; llm-generate exits 1, llm-serve answers 500
# and stays up), llm-quantize refuses to compute an FP8 scale from them,
# llm-finetune stops at the first step whose loss or gradient is not finite
# (exit 1, no adapter), and a LoRA adapter holding NaN is refused where it
# is loaded (llm-generate --lora, llm-serve --lora --check-weights, and 400
# at /v1/load_lora_adapter).
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then
	skip "non-finite weights" "no stories260K (its tokenizer) in \$LLM_TEST_MODELS"
	tap_done
fi
M=$(stories)

# a random f32 checkpoint with the stories tokenizer, and copies with one
# value of one tensor replaced
llm-quantize -q --random configs/tiny-check.json --dtype f32 --seed 5 --tokenizer "$M" "$T/good"
poison() {   # poison SRC DST TENSOR INDEX VALUE (nan, inf, -inf) [FILE]
	cp -r "$1" "$2"
	python3 - "$2/${6:-model.safetensors}" "$3" "$4" "$5" <<'PY'
import json, struct, sys
path, name, idx, val = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    t = json.loads(f.read(n))[name]
    assert t["dtype"] == "F32", t
    f.seek(8 + n + t["data_offsets"][0] + 4 * idx)
    f.write(struct.pack("<f", val))
PY
}
poison "$T/good" "$T/nan" model.norm.weight 5 nan
poison "$T/good" "$T/inf" lm_head.weight 1000 inf

check "llm-quantize --check passes a finite checkpoint (exit 0)" llm-quantize --check "$T/good"
check_fails "llm-quantize --check: a NaN weight is exit 1, one line" 1 llm-quantize --check "$T/nan"
check "... naming the file, the tensor and the index" \
	grep -q "$T/nan/model.safetensors: tensor 'model.norm.weight': NaN at index 5 " "$T/err"
check_fails "llm-quantize --check: an Inf weight is exit 1" 1 llm-quantize --check "$T/inf"
check "... naming the tensor and the index" grep -q "tensor 'lm_head.weight': +Inf at index 1000 " "$T/err"
check_fails "--check takes no OUT (usage error)" 2 llm-quantize --check "$T/nan" "$T/out"

# sampling: the logits of the NaN model are all NaN; before the sampler
# refused them, --temp 0.8 crashed (SIGSEGV) and greedy made up token 0
for mode in "--temp 0.8" "--temp 0.8 --top-p 1 --min-p 0" "--temp 0"; do
	check_fails "llm-generate $mode on NaN weights: exit 1, one line" 1 \
		llm-generate -m "$T/nan" $mode -n 4 -p "Once upon a time"
	check "... saying the logits are not finite" grep -q "the model's logits are not finite" "$T/err"
done
check_fails "llm-generate --json: the NaN prompt's error names it (exit 1)" 1 sh -c \
	"printf '%s\n' 'Once' 'upon' | llm-generate -m '$T/nan' --temp 0 -n 2 --json"
check "... prompt 1" grep -q "prompt 1: the model's logits are not finite" "$T/err"
llm-generate -m "$T/good" --temp 0.8 --seed 1 -n 8 -p "Once upon a time" >"$T/good.out" 2>"$T/good.err"
check "the finite checkpoint generates (exit 0)" [ $? = 0 ]
check_fails "llm-generate --check-weights refuses the Inf checkpoint before generating" 1 \
	llm-generate -m "$T/inf" --check-weights -n 4 -p "Once upon a time"
check "... naming the tensor" grep -q "tensor 'lm_head.weight': +Inf at index 1000 " "$T/err"
check "llm-generate --check-weights passes the finite one" \
	llm-generate -m "$T/good" --check-weights --temp 0 -n 4 -p "Once upon a time" -q >/dev/null

# llm-quantize: an Inf weight has no finite FP8 scale (its block was stored
# as zeros before); the error names the tensor, nothing is written
poison "$T/good" "$T/infq" model.layers.1.mlp.up_proj.weight 777 -inf
check_fails "llm-quantize refuses an Inf input weight (exit 1)" 1 llm-quantize "$T/infq" "$T/infq-fp8"
check "... naming the tensor, row and column" \
	grep -q "tensor 'model.layers.1.mlp.up_proj.weight': -Inf at row 6, column 9: no finite FP8 scale" "$T/err"
check "... and writing nothing" sh -c "! ls '$T' | grep -q '^infq-fp8'"

# llm-serve: a request whose logits are NaN gets 500 naming the cause, and
# the server goes on serving
llm-serve -m "$T/nan" --port 0 --port-file "$T/port" -t 1 2>>"$T/server.log" & SP=$!
U=$(serve_url "$T/port")
post() {   # post BODY: prints the status, the body to $T/resp
	curl -s -m 120 -o "$T/resp" -w '%{http_code}' -H 'Content-Type: application/json' -d "$1" "$U/v1/completions"
}
check "llm-serve: a sampled request on NaN weights is 500" [ "$(post '{"prompt": "Once", "max_tokens": 4, "temperature": 0.8}')" = 500 ]
check "... naming the cause" grep -q "logits are not finite" "$T/resp"
check "llm-serve: a greedy one (n 2) is 500 too" [ "$(post '{"prompt": "Once", "max_tokens": 4, "temperature": 0, "n": 2}')" = 500 ]
curl -s -m 120 -N -H 'Content-Type: application/json' -d '{"prompt": "Once", "max_tokens": 4, "stream": true}' \
	"$U/v1/completions" >"$T/stream"
check "llm-serve: a stream ends with an error event naming the cause" \
	sh -c "grep -q 'logits are not finite' '$T/stream' && grep -q '\\[DONE\\]' '$T/stream'"
check "llm-serve stays up (health 200)" curl -sf -m 10 "$U/health" -o /dev/null
kill -TERM $SP; wait $SP
check "llm-serve exits 0 on SIGTERM after those" [ $? = 0 ]
timeout 120 llm-serve -m "$T/nan" --check-weights --port 0 2>"$T/err"
check "llm-serve --check-weights refuses the NaN checkpoint (exit 1)" [ $? = 1 ]
check "... naming the tensor on its last line" sh -c "tail -1 '$T/err' | grep -q \"tensor 'model.norm.weight': NaN at index 5 \""

# llm-finetune: the loss of the NaN model is NaN from the first step; it
# printed "loss nan" at each, exited 0 and wrote a NaN adapter
check_fails "llm-finetune on NaN weights: exit 1 at the first step, one line" 1 \
	llm-finetune -m "$T/nan" --data tests/data/finetune/train.jsonl --seq-len 64 --micro-batch 2 --steps 3 -q -o "$T/nan-ad"
check "... naming the step and the first adapter tensor whose gradient is not finite" \
	grep -q "step 1: the loss is not finite .*tensor 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' at index" "$T/err"
check "... and writing no adapter" test ! -e "$T/nan-ad/adapter_model.safetensors"
check "llm-finetune on the finite checkpoint trains (exit 0)" \
	llm-finetune -m "$T/good" --data tests/data/finetune/train.jsonl --seq-len 64 --micro-batch 2 --steps 2 -q -o "$T/good-ad"

# adapters: one value of one tensor NaN
python3 tests/cli/lora_make.py "$T/good/config.json" "$T/lgood" --rank 2 --seed 1
LT=base_model.model.model.layers.1.mlp.down_proj.lora_B.weight
poison "$T/lgood" "$T/lnan" $LT 3 nan adapter_model.safetensors
check "llm-generate --lora: a finite adapter runs" sh -c "llm-generate -m '$T/good' --lora '$T/lgood' --temp 0 -n 2 -p Once -q >/dev/null"
check_fails "llm-generate --lora: a NaN adapter is exit 1, one line (it loaded and changed the output)" 1 \
	llm-generate -m "$T/good" --lora "$T/lnan" --temp 0 -n 2 -p Once
check "... naming the file, the tensor and the index" grep -q "lnan/adapter_model.safetensors: tensor '$LT': NaN at index 3 " "$T/err"
timeout 120 llm-serve -m "$T/good" --check-weights --lora "$T/lnan" --port 0 2>"$T/err"
check "llm-serve --check-weights --lora: a NaN adapter refuses to start (exit 1)" [ $? = 1 ]
check "... naming the tensor on its last line" sh -c "tail -1 '$T/err' | grep -q \"tensor '$LT': NaN at index 3 \""
llm-serve -m "$T/good" --allow-runtime-lora --port 0 --port-file "$T/port2" -t 1 2>>"$T/server.log" & SP=$!
U=$(serve_url "$T/port2")
load() { curl -s -m 120 -o "$T/resp" -w '%{http_code}' -H 'Content-Type: application/json' \
	-d "{\"lora_name\": \"$1\", \"lora_path\": \"$T/$1\"}" "$U/v1/load_lora_adapter"; }
check "/v1/load_lora_adapter: a NaN adapter is 400 (was 200)" [ "$(load lnan)" = 400 ]
check "... naming the tensor" grep -q "tensor '$LT': NaN at index 3 " "$T/resp"
check "... and a finite one loads (200)" [ "$(load lgood)" = 200 ]
kill -TERM $SP; wait $SP
tap_done
