# tests/cli/tokenizer.sh: llm-generate's tokenizer modes (--tokenize,
# --detokenize, --apply-template) on the reference tokenizers, and the
# one-line errors for malformed tokenizer files and templates.
. tests/lib/tap.sh

REF=$LLM_TEST_REF/tokenizers
G=llm-generate

# Usage errors need nothing.
"$G" --tokenize >/dev/null 2>&1; check "no -m is a usage error (exit 2)" [ $? = 2 ]
"$G" -m . -p hi --tokenize >/dev/null 2>&1; check "-p with a tokenizer mode is a usage error (exit 2)" [ $? = 2 ]
"$G" -m . --tokenize --detokenize >/dev/null 2>&1; check "two modes are a usage error (exit 2)" [ $? = 2 ]
"$G" -m . --detokenize --no-special >/dev/null 2>&1; check "--no-special without --tokenize is a usage error" [ $? = 2 ]

if [ ! -f "$REF/stories260K/tokenizer.json" ]; then
	skip "tokenizer modes" "no reference tokenizers in $REF"
	tap_done
fi
S=$REF/stories260K

out=$(printf 'Hello world' | "$G" -m "$S" --tokenize)
check "--tokenize: stories260K ids with BOS" [ "$out" = "[1, 346, 306, 414, 263, 304, 341]" ]
out=$(printf 'Hello world' | "$G" -m "$S" --tokenize --no-special)
check "--tokenize --no-special: no BOS" [ "$out" = "[346, 306, 414, 263, 304, 341]" ]
out=$(printf '' | "$G" -m "$S" --tokenize --no-special)
check "--tokenize: empty text gives []" [ "$out" = "[]" ]
out=$(echo '[1, 346, 306, 414, 263, 304, 341]' | "$G" -m "$S" --detokenize)
check "--detokenize: text with the special token" [ "$out" = "<s> Hello world" ]
out=$(echo '[1, 346, 306, 414, 263, 304, 341]' | "$G" -m "$S" --detokenize --skip-special)
check "--detokenize --skip-special" [ "$out" = "Hello world" ]
# A byte-fallback round trip of text with a newline and an emoji.
printf 'Tab\there\nnew line \xf0\x9f\x98\x80 end' >"$TMPD/in.txt"
"$G" -m "$S" --tokenize --no-special <"$TMPD/in.txt" >"$TMPD/ids.json" &&
	"$G" -m "$S" --detokenize <"$TMPD/ids.json" >"$TMPD/back.txt"
check "--tokenize then --detokenize gives the text back" cmp -s "$TMPD/in.txt" "$TMPD/back.txt"
printf '<s>Hi' | "$G" -m "$S" --tokenize >"$TMPD/out" 2>"$TMPD/err"
check "--tokenize warns about two BOS tokens" grep -q "two BOS" "$TMPD/err"
check "... and still prints the ids" grep -q '^\[1, 1, ' "$TMPD/out"

check_fails "--detokenize: an id outside the vocabulary" 1 sh -c "echo '[1, 99999]' | $G -m '$S' --detokenize"
check_fails "--detokenize: not a JSON array" 1 sh -c "echo '{\"a\": 1}' | $G -m '$S' --detokenize"
check_fails "--tokenize: invalid UTF-8" 1 sh -c "printf 'a\\377b' | $G -m '$S' --tokenize"

# A full checkpoint works too: its directory, or its .safetensors file.
if have_stories; then
	out=$(printf 'Hello world' | "$G" -m "$(stories)" --tokenize)
	check "-m a checkpoint directory" [ "$out" = "[1, 346, 306, 414, 263, 304, 341]" ]
	out=$(printf 'Hello world' | "$G" -m "$(stories)/model.safetensors" --tokenize)
	check "-m a .safetensors file" [ "$out" = "[1, 346, 306, 414, 263, 304, 341]" ]
else
	skip "-m a checkpoint" "no stories260K in $LLM_TEST_MODELS"
fi

# Chat templates.
printf '%s' '{% for m in messages %}[{{ m.role }}]{{ m.content | trim }}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}' >"$TMPD/t.jinja"
req='{"messages": [{"role": "user", "content": " Hi "}], "add_generation_prompt": true}'
out=$(echo "$req" | "$G" -m "$S" --apply-template --chat-template "$TMPD/t.jinja")
check "--chat-template FILE renders" [ "$out" = "[user]Hi[assistant]" ]
check_fails "--apply-template: a model without chat_template is one error line" 1 sh -c "echo '$req' | $G -m '$S' --apply-template"
printf 'line one\n{%% extends "base" %%}\n' >"$TMPD/bad.jinja"
check_fails "--apply-template: unsupported construct is one error line" 1 \
	sh -c "echo '$req' | $G -m '$S' --apply-template --chat-template '$TMPD/bad.jinja'"
check "... naming the file, the line and the construct" grep -q "bad.jinja: chat template: line 2: unsupported tag 'extends'" "$TMPD/err"
printf '{{ raise_exception("roles must alternate") }}' >"$TMPD/raise.jinja"
check_fails "--apply-template: raise_exception() is one error line" 1 \
	sh -c "echo '$req' | $G -m '$S' --apply-template --chat-template '$TMPD/raise.jinja'"
check "... with the template's message" grep -q "roles must alternate" "$TMPD/err"
printf '{{ bos_token }}{{ bos_token }}x' >"$TMPD/bos.jinja"
echo "$req" | "$G" -m "$S" --apply-template --chat-template "$TMPD/bos.jinja" >"$TMPD/out" 2>"$TMPD/err"
check "--apply-template warns when the prompt starts with two BOS" grep -q "two BOS" "$TMPD/err"

if [ -f "$REF/qwen3/tokenizer.json" ]; then
	# chat.jsonl "system_user_gen", plus enable_thinking=false
	echo '{"messages": [{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": "What is the capital of France?"}],
	       "add_generation_prompt": true, "template_kwargs": {"enable_thinking": false}}' |
		"$G" -m "$REF/qwen3" --apply-template >"$TMPD/out"
	printf '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n' >"$TMPD/want"
	cp "$TMPD/want" "$TMPD/want2"
	printf '<think>\n\n</think>\n\n' >>"$TMPD/want2"
	check "--apply-template: qwen3 with enable_thinking=false" cmp -s "$TMPD/out" "$TMPD/want2"
	out=$("$G" -m "$REF/qwen3" --tokenize <"$TMPD/want")
	check "--tokenize: qwen3 special tokens in the text" [ "$out" = "[151644, 8948, 198, 2610, 525, 264, 10950, 17847, 13, 151645, 198, 151644, 872, 198, 3838, 374, 279, 6722, 315, 9625, 30, 151645, 198, 151644, 77091, 198]" ]
else
	skip "--apply-template: qwen3" "no qwen3 reference tokenizer"
fi

# Malformed tokenizer files: one line naming the file, exit 1.
bad() {   # bad NAME CONTENT...: a tokenizer directory holding CONTENT as tokenizer.json
	mkdir -p "$TMPD/$1"
	shift_name=$1; shift
	printf '%s' "$*" >"$TMPD/$shift_name/tokenizer.json"
	echo "$TMPD/$shift_name"
}
malformed() {   # malformed DESC DIR NEEDLE
	check_fails "malformed tokenizer.json: $1" 1 sh -c "printf hi | $G -m '$2' --tokenize"
	if grep -q "$2/tokenizer.json" "$TMPD/err" && grep -q -- "$3" "$TMPD/err"; then ok "... names the file and says '$3'"
	else notok "... names the file and says '$3'"; sed 's/^/#   /' "$TMPD/err"; fi
}
mkdir -p "$TMPD/trunc"
head -c 5000 "$S/tokenizer.json" >"$TMPD/trunc/tokenizer.json"
malformed "truncated" "$TMPD/trunc" "line"
V='{"a": 0, "b": 1, "ab": 2}'
malformed "vocab is a list" "$(bad types '{"model": {"type": "BPE", "vocab": [], "merges": []}}')" "vocab"
malformed "id is a string" "$(bad types2 '{"model": {"type": "BPE", "vocab": {"a": "0"}, "merges": []}}')" "'a'"
malformed "unknown model type" "$(bad mtype '{"model": {"type": "Frobnicate", "vocab": {}, "merges": []}}')" "unknown type 'Frobnicate'"
malformed "merges naming missing tokens" "$(bad merges "{\"model\": {\"type\": \"BPE\", \"vocab\": $V, \"merges\": [\"a b\", \"b z\"]}}")" "merges\[1\]"
malformed "not JSON at all" "$(bad junk 'this is not json')" "line 1"
mkdir -p "$TMPD/empty"
check_fails "missing tokenizer.json" 1 sh -c "printf hi | $G -m '$TMPD/empty' --tokenize"
cp "$S/tokenizer.json" "$TMPD/cfg/" 2>/dev/null || { mkdir -p "$TMPD/cfg"; cp "$S/tokenizer.json" "$TMPD/cfg/"; }
printf '{"bos_token": ' >"$TMPD/cfg/tokenizer_config.json"
check_fails "truncated tokenizer_config.json" 1 sh -c "printf hi | $G -m '$TMPD/cfg' --tokenize"
check "... names tokenizer_config.json" grep -q "cfg/tokenizer_config.json" "$TMPD/err"

# Ids bounded before any table is sized by them: below config.json's
# vocab_size beside the tokenizer (or in the checkpoint), else below 2^24.
# An id of 1e9 took (1e9 + 1) x 3 table entries (4.8 GB) before.
M=$(stories)
if [ -f "$M/config.json" ]; then
	hugeid() {   # hugeid DIR FIELD ID [CONFIG]: the model's tokenizer files with one id changed
		mkdir -p "$1"
		cp "$M/tokenizer.json" "$M/tokenizer_config.json" "$1/"
		[ -n "${4:-}" ] && cp "$M/config.json" "$1/"
		python3 - "$1/tokenizer.json" "$2" "$3" <<'PY'
import json, sys
path, field, nid = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = json.load(open(path))
if field == "vocab":
    t["model"]["vocab"]["ing"] = nid
else:
    t["added_tokens"][0]["id"] = nid
json.dump(t, open(path, "w"), ensure_ascii=False)
PY
	}
	hugeid "$TMPD/huge" vocab 1000000000 config
	check_fails "a vocab id of 1e9 beside config.json: exit 1, one line" 1 sh -c "printf hi | $G -m '$TMPD/huge' --tokenize"
	check "... naming the file, the field and vocab_size" \
		grep -qF "$TMPD/huge/tokenizer.json: model.vocab[\"ing\"]: id 1000000000 is not below config.json's vocab_size 512" "$TMPD/err"
	hugeid "$TMPD/edge" vocab 512 config
	check_fails "a vocab id equal to vocab_size (512) is refused" 1 sh -c "printf hi | $G -m '$TMPD/edge' --tokenize"
	hugeid "$TMPD/added" added 4000000000 config
	check_fails "an added_tokens id of 4e9 is refused" 1 sh -c "printf hi | $G -m '$TMPD/added' --tokenize"
	hugeid "$TMPD/added2" added 600 config
	check_fails "an added_tokens id above vocab_size (600 >= 512) is refused" 1 sh -c "printf hi | $G -m '$TMPD/added2' --tokenize"
	check "... naming added_tokens[0].id" grep -qF "added_tokens[0].id: id 600 is not below config.json's vocab_size 512" "$TMPD/err"
	hugeid "$TMPD/alone" vocab 1000000000
	check_fails "without config.json, an id past 2^24 is refused" 1 sh -c "printf hi | $G -m '$TMPD/alone' --tokenize"
	check "... naming the bound" grep -qF "model.vocab[\"ing\"]: id 1000000000 is not below the limit for a tokenizer without config.json, 16777216" "$TMPD/err"
	cp -r "$M" "$TMPD/model" && cp "$TMPD/huge/tokenizer.json" "$TMPD/model/"
	check_fails "llm-generate with the model: the same one-line error" 1 llm-generate -m "$TMPD/model" -p hi -n 1
	check "... naming the model's tokenizer.json" grep -qF "$TMPD/model/tokenizer.json: model.vocab[\"ing\"]: id 1000000000" "$TMPD/err"
fi
tap_done
