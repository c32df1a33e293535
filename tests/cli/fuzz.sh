# tests/cli/fuzz.sh: the kept fuzzing corpora, replayed through their
# harnesses (tests/fuzz/*.c linked with tests/lib/fuzz_replay.c, built by
# make): every input must pass the harness's checks. make fuzz builds the
# same harnesses with libFuzzer to search for more.
. tests/lib/tap.sh
FB=${LLM_TESTBIN:-build/cpu/tests}/fuzz
TOK=$LLM_TEST_REF/tokenizers

# replay NAME DESC INPUTS...: NAME's harness over INPUTS, environment already set
replay() {
	local name=$1 desc=$2; shift 2
	if "$FB/$name" "$@" >"$TMPD/$name.out" 2>"$TMPD/$name.err"; then
		ok "$name: $desc: $(cat "$TMPD/$name.out")"
	else
		notok "$name: $desc (exit $?)"
		tail -5 "$TMPD/$name.err" | sed 's/^/#   /'
	fi
}

replay fuzz_safetensors "the malformed files and the kept corpus" tests/data/malformed tests/data/fuzz

if [ -f "$TOK/llama3/tokenizer_config.json" ] && [ -f "$TOK/qwen3/tokenizer_config.json" ]; then
	LLM_FUZZ_TOKENIZERS=$TOK replay fuzz_chat "kept corpus: requests under the llama3 and qwen3 templates, and templates" \
		tests/data/fuzz-chat
else
	skip "fuzz_chat corpus" "no reference tokenizers in $TOK"
fi

n=0
for t in llama3 qwen3 mistral7b stories260K; do
	[ -f "$TOK/$t/tokenizer.json" ] || continue
	LLM_FUZZ_TOKENIZER=$TOK/$t replay fuzz_tokenizer "kept corpus through the $t tokenizer" tests/data/fuzz-tokenizer
	n=$((n + 1))
done
[ $n -gt 0 ] || skip "fuzz_tokenizer corpus" "no reference tokenizers in $TOK"

replay fuzz_tokenizer_json "hand-written tokenizer.json files: byte-level, byte-fallback and Metaspace BPE, refused ones" tests/data/fuzz-tokenizer-json

if have_stories; then
	LLM_FUZZ_MODEL=$(stories) replay fuzz_request "kept corpus: completion, chat, TGI, JSONL, Responses, Messages and count_tokens bodies through the request parser" \
		tests/data/fuzz-request
else
	skip "fuzz_request corpus" "no stories260K in \$LLM_TEST_MODELS"
fi

replay fuzz_reasoning "kept corpus: chat answers split into reasoning and content, whole and as streamed" \
	tests/data/fuzz-reasoning

replay fuzz_grammar "kept corpus: grammars, JSON Schemas, regular expressions and choices through the compilers" \
	tests/data/fuzz-grammar

# the replay itself: an unreadable input is an error, not a silent pass
check_fails "a missing input is reported" 1 "$FB/fuzz_safetensors" "$TMPD/no-such-file"
tap_done
