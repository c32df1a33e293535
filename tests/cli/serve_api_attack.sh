# tests/cli/serve_api_attack.sh: llm-serve's API surface against a client
# that asks for what it should not get (issue 23): status codes (400 for
# what can never succeed, 429 only for what may succeed later), methods
# (405 with Allow, 404), unimplemented fields refused by name (tools,
# image parts), and the API key: --api-key-file, LLM_API_KEY, the Bearer
# scheme in any case, near-miss keys, and the refusal to listen beyond
# loopback without a key. Servers run on a port the kernel picked; waits
# are bounded and none is what a check asserts.
. tests/lib/tap.sh
T=$TMPD
S=llm-serve
if ! have_stories; then
	skip "llm-serve API surface" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
M=$(stories)

# start ARGS...: sets SP, URL; waits (bounded) for /health 200
start() {
	rm -f "$T/port"
	$S -m "$M" --port 0 --port-file "$T/port" -t 1 "$@" 2>>"$T/server.log" & SP=$!
	URL=$(serve_url "$T/port")
}
stop() { kill -TERM $SP 2>/dev/null; wait $SP; RC=$?; }
# code ARGS...: the HTTP status; body in $T/body, headers in $T/head
code() { curl -s -m 60 -o "$T/body" -D "$T/head" -w '%{http_code}' -H 'Content-Type: application/json' "$@"; }
allow_is() { tr -d '\r' <"$T/head" | grep -qix "allow: $1"; }
param_is() { grep -q "\"param\":\"$1\"" "$T/body"; }
is405() { [ "$1" = 405 ] && allow_is "$2"; }     # is405 CODE ALLOW
is400() { [ "$1" = 400 ] && param_is "$2"; }     # is400 CODE PARAM

# ---- status codes, methods and fields: one running, one waiting at most
start --max-running 1 --max-queue 1 --chat-template tests/data/chat-template.jinja
c=$(code "$URL/v1/completions" -d '{"prompt": "Once", "max_tokens": 2, "n": 3}')
check "n 3 above --max-running 1 + --max-queue 1 on an idle server: 400 naming n and the limit (was 429 forever)" \
	sh -c "[ $c = 400 ] && grep -q '\"param\":\"n\"' '$T/body' && grep -q 'n: 3 choices can never be admitted: --max-running 1 + --max-queue 1 hold 2' '$T/body'"
check "... with no Retry-After" sh -c "! grep -qi '^retry-after' '$T/head'"
c=$(code -N "$URL/v1/completions" -d '{"prompt": "Once", "max_tokens": 2, "n": 3, "stream": true}')
check "... streamed too: 400 before any event" sh -c "[ $c = 400 ] && ! grep -q 'data:' '$T/body'"
c=$(code "$URL/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "n": 3, "best_of": 3}')
check "chat n 3 (best_of 3): 400 naming n" sh -c "[ $c = 400 ] && grep -q '\"param\":\"n\"' '$T/body'"
c=$(code "$URL/v1/completions" -d '{"prompt": "Once", "max_tokens": 2, "n": 1, "best_of": 3}')
check "best_of 3 (n 1) above the same limit: 400 naming best_of, not n" \
	sh -c "[ $c = 400 ] && grep -q '\"param\":\"best_of\"' '$T/body' && grep -q 'best_of: 3 choices can never be admitted' '$T/body'"
c=$(code "$URL/v1/completions" -d '{"prompt": "Once", "max_tokens": 2, "n": 2, "temperature": 0}')
check "n 2 (= --max-running 1 + --max-queue 1) is admitted: 200 with 2 choices" \
	sh -c "[ $c = 200 ] && python3 -c \"import json; assert len(json.load(open('$T/body'))['choices']) == 2\""

c=$(code "$URL/health"); check "GET /health: 200" [ "$c" = 200 ]
c=$(code -I "$URL/health"); check "HEAD /health: 200" [ "$c" = 200 ]
for m in POST PUT DELETE OPTIONS; do
	c=$(code -X $m "$URL/health")
	check "$m /health: 405 with Allow: GET, HEAD (was 200)" is405 "$c" 'GET, HEAD'
done
for u in /v1/models /metrics; do
	c=$(code -I "$URL$u"); check "HEAD $u: 200" [ "$c" = 200 ]
	c=$(code -X POST -d '{}' "$URL$u")
	check "POST $u: 405 with Allow: GET, HEAD" is405 "$c" 'GET, HEAD'
done
for u in /v1/completions /v1/chat/completions /generate /generate_stream; do
	c=$(code -X GET "$URL$u")
	check "GET $u: 405 with Allow: POST" is405 "$c" POST
done
c=$(code -X DELETE "$URL/v1/completions"); check "DELETE /v1/completions: 405" [ "$c" = 405 ]
c=$(code "$URL/v1/nope"); check "an unknown endpoint: 404" [ "$c" = 404 ]
c=$(code -X PUT "$URL/health/x"); check "an unknown endpoint with any method: 404" [ "$c" = 404 ]

# fields that would change the answer: refused by name, not dropped
chat() { code "$URL/v1/chat/completions" -d "{\"messages\": $1, \"max_tokens\": 2$2}"; }
U='[{"role": "user", "content": "What time is it?"}]'
c=$(chat "$U" ', "tools": [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]')
check "chat tools: 400 naming tools (was taken, and no tool call could come back)" is400 "$c" tools
c=$(chat "$U" ', "tool_choice": "required"'); check "chat tool_choice required: 400 naming it" is400 "$c" tool_choice
c=$(chat "$U" ', "functions": [{"name": "f"}]'); check "chat functions: 400 naming it" is400 "$c" functions
c=$(chat "$U" ', "tools": [], "tool_choice": "none", "parallel_tool_calls": false, "user": "u"'); check "chat tools [], tool_choice none: taken" [ "$c" = 200 ]
c=$(chat '[{"role": "user", "content": [{"type": "text", "text": "What is this?"}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]' '')
check "chat image_url part: 400 naming messages and image_url (was dropped)" \
	sh -c "[ $c = 400 ] && grep -q '\"param\":\"messages\"' '$T/body' && grep -q \"type 'image_url' is not supported\" '$T/body'"
c=$(chat '[{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]' ''); check "chat text parts: taken" [ "$c" = 200 ]
c=$(code "$URL/v1/completions" -d '{"prompt": "a", "max_tokens": 2, "guided_json": {"type": "string", "format": "email"}}')
check "completion guided_json with an unsupported keyword: 400 naming it" is400 "$c" guided_json
c=$(code "$URL/generate" -d '{"inputs": "a", "parameters": {"max_new_tokens": 2, "grammar": {"type": "regex", "value": "(a"}}}')
check "/generate grammar, a bad regex: 400 (validation)" sh -c "[ $c = 400 ] && grep -q validation '$T/body'"
stop
check "the server exits 0" [ "$RC" = 0 ]

# ---- the work and bytes one request may ask for: --max-logprob-entries
start --chat-template tests/data/chat-template.jinja
python3 -c "
import json
p = ' '.join(['Once upon a time'] * 100)     # about 400 tokens
big = {'prompt': p, 'max_tokens': 16, 'echo': True, 'logprobs': 20, 'prompt_logprobs': 20, 'n': 16, 'best_of': 16}
json.dump(big, open('$T/big.json', 'w'))
ok = {'prompt': p, 'max_tokens': 16, 'echo': True, 'logprobs': 5, 'prompt_logprobs': 5, 'n': 4, 'temperature': 0}
json.dump(ok, open('$T/ok.json', 'w'))"
c=$(code "$URL/v1/completions" -d @"$T/big.json")
check "echo, logprobs 20, prompt_logprobs 20, n 16, best_of 16, a 400-token prompt: 400 naming the limit (was 12.6 MB)" \
	sh -c "[ $c = 400 ] && grep -q 'over --max-logprob-entries 100000' '$T/body' && grep -q '\"param\":\"prompt_logprobs\"' '$T/body'"
c=$(code "$URL/v1/completions" -d @"$T/ok.json")
check "under the limit (n 4, 5 log-probs, echo and prompt_logprobs): 200, sent as it is formatted (chunked)" \
	sh -c "[ $c = 200 ] && tr -d '\r' <'$T/head' | grep -qix 'transfer-encoding: chunked'"
check "... the body whole: 4 choices, each with the prompt's and the 16 tokens' log-probs" python3 -c "
import json
r = json.load(open('$T/body'))
n = r['usage']['prompt_tokens']
assert len(r['choices']) == 4 and [c['index'] for c in r['choices']] == [0, 1, 2, 3], r['choices']
for c in r['choices']:
    assert len(c['logprobs']['tokens']) == n + 16 and len(c['prompt_logprobs']) == n and len(c['token_ids']) == 16, c
    assert all(len(t) == 5 for t in c['logprobs']['top_logprobs'][1:]), c
assert r['usage']['completion_tokens'] == 64 and r['object'] == 'text_completion', r['usage']"
c=$(code "$URL/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "hi"}], "logprobs": true, "top_logprobs": 20, "n": 16}')
check "chat n 16, top_logprobs 20 to the end of the context: 400 naming top_logprobs" is400 "$c" top_logprobs
stop

# ---- the API key
check_fails "--api-key and --api-key-file together: usage error" 2 timeout 30 $S -m "$M" --port 0 --api-key a --api-key-file "$T/nokey"
check_fails "--api-key-file missing: error naming the file" 1 timeout 30 $S -m "$M" --port 0 --api-key-file "$T/nokey"
check "... naming it" grep -q "$T/nokey" "$T/err"
printf '\n' >"$T/emptykey"
check_fails "--api-key-file with an empty first line: error naming the file" 1 timeout 30 $S -m "$M" --port 0 --api-key-file "$T/emptykey"
check "... naming it" grep -q "$T/emptykey" "$T/err"
check_fails "LLM_API_KEY set but empty: usage error" 2 env LLM_API_KEY= timeout 30 $S -m "$M" --port 0
check_fails "--api-key '': usage error" 2 timeout 30 $S -m "$M" --port 0 --api-key ''
printf '   \n' >"$T/blankkey"
check_fails "--api-key-file whose key is blank (spaces): error naming the file" 1 timeout 30 $S -m "$M" --port 0 --api-key-file "$T/blankkey"
check "... saying it is blank" grep -q "$T/blankkey: the key on the first line is blank" "$T/err"
printf ' s3cret-key\n' >"$T/spacekey"
check_fails "--api-key-file whose key begins with a space: refused at start (no client could send it)" 1 timeout 30 $S -m "$M" --port 0 --api-key-file "$T/spacekey"
check "... naming the file" grep -q "$T/spacekey: the key on the first line has a space or tab at an end" "$T/err"
printf 's3cret-key\t\n' >"$T/tabkey"
check_fails "--api-key-file whose key ends with a tab: refused at start" 1 timeout 30 $S -m "$M" --port 0 --api-key-file "$T/tabkey"
check_fails "--api-key 'k ' (a trailing space): usage error" 2 timeout 30 $S -m "$M" --port 0 --api-key 'k '
check_fails "LLM_API_KEY ' k': usage error" 2 env LLM_API_KEY=' k' timeout 30 $S -m "$M" --port 0
for f in "--spec-tokens 2" "--spec-ngram 2" "--speculate off --spec-tokens 2"; do
	check_fails "$f without --speculate ngram or draft: usage error, as --draft is" 2 timeout 30 $S -m "$M" --port 0 $f
	check "... naming the flag" grep -q -- "--spec-.* goes with --speculate ngram or draft" "$T/err"
done

printf 's3cret-key\r\nsecond line\n' >"$T/key"
LLM_API_KEY=from-env start --api-key-file "$T/key"
models() { code -H "Authorization: $1" "$URL/v1/models"; }
check "--api-key-file: the first line is the key (CRLF dropped)" [ "$(models 'Bearer s3cret-key')" = 200 ]
check "the scheme in any case: bearer" [ "$(models 'bearer s3cret-key')" = 200 ]
check "the scheme in any case: BEARER, two spaces" [ "$(models 'BEARER  s3cret-key')" = 200 ]
check "the key with one more byte: 401" [ "$(models 'Bearer s3cret-keyX')" = 401 ]
check "a prefix of the key: 401" [ "$(models 'Bearer s3cret-ke')" = 401 ]
check "the key in another case: 401" [ "$(models 'Bearer S3CRET-KEY')" = 401 ]
check "the key with the file's second line: 401" [ "$(models 'Bearer second line')" = 401 ]
check "an empty key: 401" [ "$(models 'Bearer ')" = 401 ]
check "another scheme: 401" [ "$(models 'Basic s3cret-key')" = 401 ]
check "--api-key-file over LLM_API_KEY: the environment's key gets 401" [ "$(models 'Bearer from-env')" = 401 ]
check "no header: 401" [ "$(code "$URL/v1/models")" = 401 ]
stop

# beyond loopback: a key or --allow-unauthenticated
check_fails "--host 0.0.0.0 without a key: refused (usage error)" 2 timeout 30 $S -m "$M" --host 0.0.0.0 --port 0
check "... saying how to go on" grep -q -- "--host 0.0.0.0 listens beyond loopback without an API key" "$T/err"
check_fails "--host :: without a key: refused" 2 timeout 30 $S -m "$M" --host :: --port 0
n0=$(grep -c WARNING "$T/server.log")
LLM_API_KEY=from-env start --host 0.0.0.0
check "--host 0.0.0.0 with LLM_API_KEY: listens, the key is needed" sh -c "[ \$(curl -s -m 10 -o /dev/null -w '%{http_code}' -H 'Authorization: Bearer from-env' '$URL/v1/models') = 200 ] && [ \$(curl -s -m 10 -o /dev/null -w '%{http_code}' '$URL/v1/models') = 401 ]"
stop
check "... and no warning" [ "$(grep -c WARNING "$T/server.log")" = "$n0" ]
start --host 0.0.0.0 --allow-unauthenticated
check "--host 0.0.0.0 --allow-unauthenticated: listens" [ "$(code "$URL/v1/models")" = 200 ]
stop
check "... with a one-line warning on stderr" grep -q "WARNING: --host 0.0.0.0: anyone who can reach this address can use the server" "$T/server.log"
# (bound to 127.0.0.2 only: the port file says it listens)
rm -f "$T/port"
$S -m "$M" --host 127.0.0.2 --port 0 --port-file "$T/port" -t 1 2>>"$T/server.log" & SP=$!
wait_until 60 test -s "$T/port"
check "--host 127.0.0.2 (loopback) without a key: listens, no warning" sh -c "[ -s '$T/port' ] && [ \$(grep -c WARNING '$T/server.log') = 1 ]"
stop
tap_done
