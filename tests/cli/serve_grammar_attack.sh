# tests/cli/serve_grammar_attack.sh: structured output against a client
# that sends what would crash or stall the grammar engine (issue 45):
# nested bounded repetitions through every entry point (guided_regex,
# guided_grammar, a JSON Schema pattern, TGI's grammar, a tool's parameters
# with tool_choice "required") and groups nested 5000 deep get 400 naming
# the limit, and the server goes on serving; compiles past a budget get 400
# naming it; four big schemas compiling at once leave another client's
# request served (no timing asserted: llm-serve(1) LIMITS states the
# budgets); $ref "#" looping before any text is refused naming the $ref,
# the same in response_format and in a tool's parameters; tools with an
# empty or repeated name, or parameters that are not an object schema, get
# 400 naming the tool.
. tests/lib/tap.sh
T=$TMPD
S=llm-serve
if ! have_stories; then
	skip "structured output under attack" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
M=$(stories)
rm -f "$T/port"
$S -m "$M" --port 0 --port-file "$T/port" -t 1 --chat-template tests/data/chat-template-tools.jinja 2>"$T/server.log" & SP=$!
URL=$(serve_url "$T/port")
# post PATH BODY-FILE: the HTTP status; the body in $T/body
post() { curl -s -m 120 -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' "$URL$1" --data-binary "@$2"; }
# is400 CODE PARAM TEXT: 400 naming field PARAM, the message holding TEXT
is400() { [ "$1" = 400 ] && grep -q "\"param\":\"$2\"" "$T/body" && grep -qF -- "$3" "$T/body"; }
alive() { [ "$(curl -s -m 60 -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ]; }
probe() {   # a 4-token completion from another client: 200
	[ "$(curl -s -m 120 -o "$T/probe" -w '%{http_code}' -H 'Content-Type: application/json' "$URL/v1/completions" \
		-d '{"prompt": "Once", "max_tokens": 4}')" = 200 ]
}
TOOL='{"type": "function", "function": {"name": "f", "parameters": PARAMS}}'
tools() {   # tools PARAMS: a chat body with one tool of those parameters, tool_choice required
	echo "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 8, \"tool_choice\": \"required\", \"tools\": [$(echo "$TOOL" | sed "s|PARAMS|$1|")]}"
}

# ---- item 1: ((a{0,10000}){0,10000}){0,10000} through every entry point
R='((a{0,10000}){0,10000}){0,10000}'
echo "{\"prompt\": \"Hi\", \"max_tokens\": 16, \"guided_regex\": \"$R\"}" >"$T/b1"
echo "{\"prompt\": \"Hi\", \"max_tokens\": 16, \"guided_grammar\": \"root ::= ((\\\"a\\\"{0,10000}){0,10000}){0,10000}\"}" >"$T/b2"
echo "{\"prompt\": \"Hi\", \"max_tokens\": 16, \"guided_json\": {\"type\": \"string\", \"pattern\": \"$R\"}}" >"$T/b3"
echo "{\"inputs\": \"Hi\", \"parameters\": {\"max_new_tokens\": 16, \"grammar\": {\"type\": \"regex\", \"value\": \"$R\"}}}" >"$T/b4"
tools "{\"type\": \"object\", \"properties\": {\"x\": {\"type\": \"string\", \"pattern\": \"$R\"}}, \"required\": [\"x\"]}" >"$T/b5"
c=$(post /v1/completions "$T/b1"); check "guided_regex nested repetitions: 400 naming the field and the limit (was a crash)" is400 "$c" guided_regex "too ambiguous"
c=$(post /v1/completions "$T/b2"); check "guided_grammar nested repetitions: 400" is400 "$c" guided_grammar "too ambiguous"
c=$(post /v1/completions "$T/b3"); check "a JSON Schema pattern of nested repetitions: 400" is400 "$c" guided_json "too ambiguous"
c=$(post /generate "$T/b4"); check "TGI grammar regex of nested repetitions: 400 (validation) naming the limit" \
	sh -c "[ $c = 400 ] && grep -q validation '$T/body' && grep -q 'too ambiguous' '$T/body'"
c=$(post /v1/chat/completions "$T/b5"); check "a tool's parameters with nested repetitions, tool_choice required: 400 naming the tool" \
	is400 "$c" tools "too ambiguous"
check "... and the server serves on" sh -c "$(declare -f alive probe); URL=$URL T=$T; alive && probe"

# ---- item 2: groups nested 5000 deep in grammar text
deep() { python3 -c "import json, sys; n = int(sys.argv[1]); print(json.dumps({'prompt': 'Hi', 'max_tokens': 4, 'guided_grammar': 'root ::= ' + '(' * n + '\"a\"' + ')' * n}))" "$1"; }
deep 5000 >"$T/d5000"; deep 1000 >"$T/d1000"
c=$(post /v1/completions "$T/d5000"); check "guided_grammar with 5000 nested groups: 400 naming the limit (was a crash)" \
	is400 "$c" guided_grammar "groups nested more than 1000 deep"
c=$(post /v1/completions "$T/d1000"); check "1000 nested groups: 200, the text 'a'" sh -c "[ $c = 200 ] && grep -q '\"text\":\"a\"' '$T/body'"

# ---- item 3: budgets, and other clients served while big grammars compile
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
for k in range(4):   # four different 2000-property schemas
    props = {"p%d_%d" % (k, i): {"type": "integer"} for i in range(2000)}
    json.dump({"prompt": "Hi", "max_tokens": 2, "guided_json": {"type": "object", "properties": props, "required": list(props)}},
              open("%s/big%d" % (t, k), "w"))
json.dump({"prompt": "Hi", "max_tokens": 2, "guided_json": {"enum": ["v%d" % i for i in range(100000)]}}, open(t + "/enum", "w"),
          separators=(",", ":"))   # 0.9 MB, within --max-body
PY
BIG=
for k in 0 1 2 3; do
	curl -s -m 120 -o /dev/null -w '%{http_code}\n' -H 'Content-Type: application/json' "$URL/v1/completions" \
		--data-binary "@$T/big$k" >"$T/big$k.code" & BIG="$BIG $!"
done
probe; r=$?
wait $BIG
check "a probe request while four 2000-property schemas compile: 200" [ $r = 0 ]
check "... and each of the four: 200" sh -c "cat '$T'/big?.code | grep -c '^200$' | grep -qx 4"
c=$(post /v1/completions "$T/enum"); check "a 100000-value enum: 200, the start of one of its values" \
	sh -c "[ $c = 200 ] && grep -q '\"text\":\"\\\\\"v' '$T/body'"
curl -s -m 0.3 -o /dev/null -H 'Content-Type: application/json' "$URL/v1/completions" --data-binary "@$T/big0" 2>/dev/null
check "a client that leaves while its grammar compiles: the server serves on" sh -c "$(declare -f alive probe); URL=$URL T=$T; alive && probe"

# ---- $ref "#" before any text: the same answer in response_format and in a tool
echo '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}}' >"$T/r1"
tools '{"$ref": "#"}' >"$T/r2"
c=$(post /v1/chat/completions "$T/r1"); check "response_format {\$ref: #}: 400 naming the \$ref (was: rule 's0' is left-recursive)" \
	is400 "$c" response_format "\$ref '#' comes back to its own schema before any text (left recursion)"
c=$(post /v1/chat/completions "$T/r2"); check "a tool's parameters {\$ref: #}, tool_choice required: the same 400, naming the tool (was compiled against the call's wrapper)" \
	is400 "$c" tools "tools[0] ('f') parameters.#: \$ref '#' comes back to its own schema before any text (left recursion)"

# ---- tools: names and parameters
chat_tools() { echo "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 4, \"tools\": $1}" >"$T/t"; post /v1/chat/completions "$T/t"; }
F() { echo "{\"type\": \"function\", \"function\": {\"name\": \"$1\"${2:-}}}"; }
c=$(chat_tools "[$(F get), $(F get)]"); check "two tools named 'get': 400 naming the second" is400 "$c" tools "tools[1] ('get'): the name is tools[0]'s too"
c=$(chat_tools "[$(F '')]"); check "a tool with an empty name: 400 naming it" is400 "$c" tools "tools[0]: the function's name is empty"
c=$(chat_tools "[$(F s ', "parameters": {"type": "string"}')]"); check "a tool whose parameters are not an object schema: 400 naming it" \
	is400 "$c" tools "tools[0] ('s'): parameters: expected an object schema"
c=$(chat_tools "[$(F get ', "parameters": {"type": "object", "properties": {"q": {"type": "string"}}}'), $(F find)]")
check "two tools, distinct names, object parameters: 200" [ "$c" = 200 ]

kill -TERM $SP 2>/dev/null; wait $SP; RC=$?
check "the server exits 0" [ "$RC" = 0 ]
tap_done
