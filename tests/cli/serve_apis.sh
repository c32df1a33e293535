# tests/cli/serve_apis.sh: the Responses API (POST /v1/responses) and
# Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) of
# llm-serve (common/serve/apis.h): the wire shapes with curl (bodies, the
# events of a stream in order, sequence numbers, a forced tool call, a stop
# string, the error shapes, x-api-key beside Authorization: Bearer), then the
# official clients (tests/js/responses.mjs with openai, tests/js/messages.mjs
# with @anthropic-ai/sdk) when node and tests/js/node_modules are there.
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then skip "the Responses and Messages APIs on stories260K" "no stories260K in \$LLM_TEST_MODELS"; tap_done; fi
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
llm-serve -m "$(stories)" --port 0 --port-file "$T/port" -t 1 --api-key k3y \
	--chat-template tests/data/chat-template-tools.jinja 2>"$T/server.log" & SP=$!
U=$(serve_url "$T/port")
# post NAME PATH BODY [HEADER]: the answer in $T/NAME.out, the status printed
post() { curl -s -m 120 -o "$T/$1.out" -w '%{http_code}' "$U$2" -H 'Content-Type: application/json' \
	-H "${4:-Authorization: Bearer k3y}" -d "$3"; }
RT='[{"type": "function", "name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}]'
MT='[{"name": "weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}]'

code=$(post r1 /v1/responses '{"input": "Once upon a time", "max_output_tokens": 12, "temperature": 0}')
check "responses: a string input, 200, a message item, incomplete at max_output_tokens, usage" $PY - "$T/r1.out" "$code" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert sys.argv[2] == "200" and r["object"] == "response" and r["id"].startswith("resp_"), r
assert r["status"] == "incomplete" and r["incomplete_details"] == {"reason": "max_output_tokens"}, r
m, = r["output"]
assert m["type"] == "message" and m["role"] == "assistant" and m["content"][0]["type"] == "output_text", m
assert m["content"][0]["text"] and r["usage"]["output_tokens"] == 12 and r["usage"]["input_tokens"] > 0, r
PY
curl -sN -m 120 "$U/v1/responses" -H 'Authorization: Bearer k3y' \
	-d "{\"input\": \"Weather?\", \"tools\": $RT, \"tool_choice\": \"required\", \"max_output_tokens\": 120, \"temperature\": 0, \"stream\": true}" >"$T/r2.sse"
post r2 /v1/responses "{\"input\": \"Weather?\", \"tools\": $RT, \"tool_choice\": \"required\", \"max_output_tokens\": 120, \"temperature\": 0}" >/dev/null
check "responses, tool_choice required, streamed: created, in_progress, the function_call item's events, completed; sequence_number 0.. in order; the call of the unstreamed answer" $PY - "$T" <<'PY'
import json, sys
t = sys.argv[1]
lines = open(t + "/r2.sse").read().split("\n\n")
ev = [(b.split("\n")[0][7:], json.loads(b.split("\n")[1][6:])) for b in lines if b.startswith("event: ")]
names = [n for n, _ in ev]
assert all(n == e["type"] for n, e in ev) and [e["sequence_number"] for _, e in ev] == list(range(len(ev))), names
assert names == ["response.created", "response.in_progress", "response.output_item.added",
                 "response.function_call_arguments.delta", "response.function_call_arguments.done",
                 "response.output_item.done", "response.completed"], names
ref = json.load(open(t + "/r2.out"))
call, = [o for o in ref["output"] if o["type"] == "function_call"]
assert ref["status"] == "completed" and call["name"] == "weather" and isinstance(json.loads(call["arguments"])["city"], str), ref
fin = ev[-1][1]["response"]["output"]
assert ev[3][1]["delta"] == call["arguments"] and [(o["name"], o["arguments"]) for o in fin] == [(call["name"], call["arguments"])], (fin, ref)
PY
code=$(post r3 /v1/responses '{"input": "hi", "previous_response_id": "resp_1"}')
check "responses: previous_response_id is a 400 naming it (no stored responses)" \
	sh -c "[ $code = 400 ] && grep -q '\"param\":\"previous_response_id\"' '$T/r3.out'"
code=$(post r4 /v1/responses '{"input": "hi", "max_output_tokens": 0}')
check "responses: a bad max_output_tokens is a 400 naming max_output_tokens" \
	sh -c "[ $code = 400 ] && grep -q '\"param\":\"max_output_tokens\"' '$T/r4.out'"

code=$(post m1 /v1/messages '{"model": "stories260K", "messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 30, "temperature": 0}' 'x-api-key: k3y')
word=$($PY -c "import json; print(json.load(open('$T/m1.out'))['content'][0]['text'].split()[1])")
code2=$(post m2 /v1/messages "{\"messages\": [{\"role\": \"user\", \"content\": \"Once upon a time\"}], \"max_tokens\": 30, \"temperature\": 0, \"stop_sequences\": [\"$word\"]}" 'x-api-key: k3y')
check "messages: x-api-key taken; a text block; a stop string is stop_reason stop_sequence naming it" $PY - "$T" "$code$code2" "$word" <<'PY'
import json, sys
t, codes, word = sys.argv[1:]
m1, m2 = (json.load(open(t + f"/m{i}.out")) for i in (1, 2))
assert codes == "200200" and m1["type"] == "message" and m1["id"].startswith("msg_") and m1["role"] == "assistant", m1
assert m1["stop_reason"] == "max_tokens" and m1["usage"]["output_tokens"] == 30 and m1["content"][0]["type"] == "text", m1
assert m2["stop_reason"] == "stop_sequence" and m2["stop_sequence"] == word, m2
assert m1["content"][0]["text"].startswith(m2["content"][0]["text"]) and word not in m2["content"][0]["text"], (m1, m2)
PY
curl -sN -m 120 "$U/v1/messages" -H 'x-api-key: k3y' -H 'anthropic-version: 2023-06-01' \
	-d "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], \"tools\": $MT, \"tool_choice\": {\"type\": \"any\"}, \"max_tokens\": 120, \"temperature\": 0, \"stream\": true}" >"$T/m3.sse"
post m3 /v1/messages "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}], \"tools\": $MT, \"tool_choice\": {\"type\": \"any\"}, \"max_tokens\": 120, \"temperature\": 0}" 'x-api-key: k3y' >/dev/null
check "messages, tool_choice any, streamed: message_start, ping, the tool_use block (input_json_delta), message_delta tool_use, message_stop; the unstreamed answer's call" $PY - "$T" <<'PY'
import json, sys
t = sys.argv[1]
ev = [(b.split("\n")[0][7:], json.loads(b.split("\n")[1][6:])) for b in open(t + "/m3.sse").read().split("\n\n") if b.startswith("event: ")]
names = [n for n, _ in ev]
assert all(n == e["type"] for n, e in ev), names
assert names == ["message_start", "ping", "content_block_start", "content_block_delta", "content_block_stop",
                 "message_delta", "message_stop"], names
ref = json.load(open(t + "/m3.out"))
use, = ref["content"]
assert ref["stop_reason"] == "tool_use" and use["type"] == "tool_use" and isinstance(use["input"]["city"], str), ref
assert ev[2][1]["content_block"]["name"] == "weather" and json.loads(ev[3][1]["delta"]["partial_json"]) == use["input"], ev
assert ev[5][1]["delta"]["stop_reason"] == "tool_use" and ev[5][1]["usage"]["output_tokens"] == ref["usage"]["output_tokens"], ev
PY
code=$(post m4 /v1/messages/count_tokens '{"messages": [{"role": "user", "content": "Once upon a time"}]}' 'x-api-key: k3y')
check "count_tokens: input_tokens, the count create reports" $PY -c "
import json
n = json.load(open('$T/m4.out'))['input_tokens']
assert '$code' == '200' and n == json.load(open('$T/m1.out'))['usage']['input_tokens'] and n > 0, n"
code=$(post m5 /v1/messages '{"messages": [{"role": "user", "content": "hi"}]}' 'x-api-key: k3y')
check "messages: no max_tokens is a 400 in Anthropic's shape (invalid_request_error)" $PY -c "
import json
assert '$code' == '400' and json.load(open('$T/m5.out')) == {'type': 'error', 'error': {'type': 'invalid_request_error', 'message': 'max_tokens: required'}}"
code=$(post m6 /v1/messages '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}' 'x-api-key: nope')
check "messages: a wrong x-api-key is a 401 in Anthropic's shape (authentication_error)" $PY -c "
import json
e = json.load(open('$T/m6.out'))
assert '$code' == '401' and e['type'] == 'error' and e['error']['type'] == 'authentication_error', e"

if command -v node >/dev/null && [ -d tests/js/node_modules/openai ] && [ -d tests/js/node_modules/@anthropic-ai/sdk ]; then
	LLM_SERVE_URL=$U/v1 LLM_SERVE_KEY=k3y timeout 300 node tests/js/responses.mjs || tap_fail=1
	LLM_SERVE_ROOT=$U LLM_SERVE_KEY=k3y timeout 300 node tests/js/messages.mjs || tap_fail=1
else
	skip "the openai and @anthropic-ai/sdk clients" "no node or tests/js/node_modules (npm ci --prefix tests/js)"
fi
kill -TERM $SP; wait $SP
check "the server exits 0" [ $? = 0 ]
tap_done
