# tests/cli/longprompt.sh: a prompt far longer than the context is refused
# by its byte length before it is tokenized (a 1 MiB prompt cost 1.7 s of
# tokenizing before the context check refused it), by llm-generate (exit 1)
# and llm-serve (400), and a prompt the bound lets through is refused only
# by its token count.
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then
	skip "long prompts" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
M=$(stories)

# stories260K: 512 positions, at most 9 bytes per token (its longest token
# text; no normalizer that shrinks): 511 tokens hold 4599 bytes at most
python3 -c "import sys; sys.stdout.write('Once upon a time ' * 61681)" >"$T/big.txt"   # 1 MiB + 1 byte
python3 -c "import sys; sys.stdout.write('a' * 4599)" >"$T/edge.txt"
python3 -c "import sys; sys.stdout.write('a' * 4600)" >"$T/over.txt"

check_fails "llm-generate -f a 1 MiB prompt: exit 1, one line" 1 llm-generate -m "$M" -f "$T/big.txt" -n 1
check "... refused by its bytes, naming the context" \
	grep -q "prompt: 1048577 bytes exceed the context of 512 tokens (511 tokens hold 4599 bytes at most)" "$T/err"
check_fails "4600 bytes: refused by the byte bound" 1 llm-generate -m "$M" -f "$T/over.txt" -n 1
check "... (4600 bytes)" grep -q "4600 bytes exceed the context" "$T/err"
check_fails "4599 bytes: let through, refused by its token count" 1 llm-generate -m "$M" -f "$T/edge.txt" -n 1
check "... (the scheduler's context rule)" sh -c "grep -q 'tokens' '$T/err' && ! grep -q 'bytes exceed' '$T/err'"
check_fails "a JSONL line's 1 MiB prompt: exit 1" 1 sh -c \
	"python3 -c \"import json; print(json.dumps({'prompt': 'b' * 1048576}))\" | llm-generate -m '$M' -n 1 --json"
check "... naming the line" grep -q "line 1: prompt: 1048576 bytes exceed the context of 512 tokens" "$T/err"
printf 'Once upon a time' >"$T/small.txt"
check "a prompt that fits still generates" sh -c "llm-generate -m '$M' -f '$T/small.txt' -n 4 --temp 0 >/dev/null"

# the server's context (-c 128: 127 x 9 = 1143 bytes); a chat template that
# passes the message through
printf '%s' "{% for m in messages %}{{ m['content'] }}{% endfor %}" >"$T/tpl.jinja"
llm-serve -m "$M" --port 0 --port-file "$T/port" -t 1 -c 128 --max-body 4MiB --chat-template "$T/tpl.jinja" \
	2>>"$T/server.log" & SP=$!
U=$(serve_url "$T/port")
python3 -c "import json; print(json.dumps({'prompt': 'Once upon a time ' * 61681, 'max_tokens': 4}))" >"$T/big.json"
code=$(curl -s -m 120 -o "$T/resp" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$T/big.json" \
	"$U/v1/completions")
check "llm-serve: a 1 MiB prompt is 400" [ "$code" = 400 ]
check "... naming the prompt field and the context" grep -q "prompt: 1048577 bytes exceed the context of 128 tokens" "$T/resp"
python3 -c "import json; print(json.dumps({'messages': [{'role': 'user', 'content': 'x' * 200000}], 'max_tokens': 4}))" >"$T/chat.json"
code=$(curl -s -m 120 -o "$T/resp" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @"$T/chat.json" \
	"$U/v1/chat/completions")
check "llm-serve: a chat message of 200 KB is 400 before tokenizing" [ "$code" = 400 ]
check "... naming messages" grep -q "messages: 200000 bytes exceed the context of 128 tokens" "$T/resp"
code=$(curl -s -m 120 -o "$T/resp" -w '%{http_code}' -H 'Content-Type: application/json' \
	-d "{\"prompt\": \"$(python3 -c "print('a' * 1144)")\", \"max_tokens\": 4}" "$U/v1/completions")
check "llm-serve: 1144 bytes (past 127 x 9) are 400 by the byte bound" sh -c "[ $code = 400 ] && grep -q '1144 bytes exceed' '$T/resp'"
code=$(curl -s -m 120 -o "$T/resp" -w '%{http_code}' -H 'Content-Type: application/json' \
	-d "{\"prompt\": \"$(python3 -c "print('a' * 1143)")\", \"max_tokens\": 4}" "$U/v1/completions")
check "llm-serve: 1143 bytes are let through, then 400 by their token count" \
	sh -c "[ $code = 400 ] && grep -q 'tokens' '$T/resp' && ! grep -q 'bytes exceed' '$T/resp'"
code=$(curl -s -m 120 -o "$T/resp" -w '%{http_code}' -H 'Content-Type: application/json' \
	-d '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}' "$U/v1/completions")
check "llm-serve: a short prompt is still 200" [ "$code" = 200 ]
kill -TERM $SP; wait $SP
tap_done
