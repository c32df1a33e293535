# tests/cli/serve_tools.sh: tool calls (common/text/toolcall.c, request.c's
# tool_choice): llm-serve and llm-generate parse answers into OpenAI
# tool_calls in the format the chat template teaches (hermes <tool_call>
# blocks, Llama 3 JSON), tool_choice "required" or a named function forces
# one call whose arguments validate against the function's schema
# (python3-jsonschema), streamed as tool-call deltas; and on the Qwen3
# reference tokenizer and template (a random-weight model), the prompts of
# the reference tool conversations tokenize to Hugging Face's ids through
# the server.
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then skip "tool calls on stories260K" "no stories260K in \$LLM_TEST_MODELS"; tap_done; fi
M=$(stories)
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
if ! $PY -c 'import jsonschema' 2>/dev/null; then skip "tool calls" "no python3-jsonschema (make deps)"; tap_done; fi
TOOLS='[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}, "days": {"type": "integer", "minimum": 1, "maximum": 7}}, "required": ["city"]}}}, {"type": "function", "function": {"name": "find", "parameters": {"type": "object", "properties": {"q": {"type": "string", "maxLength": 6}}, "required": ["q"], "additionalProperties": false}}}]'
echo "$TOOLS" >"$T/tools.json"
llm-serve -m "$M" --port 0 --port-file "$T/port" -t 1 --chat-template tests/data/chat-template-tools.jinja 2>"$T/server.log" & SP=$!
U=$(serve_url "$T/port")
post() { curl -s -m 120 -o "$T/$1.out" -w '%{http_code}' "$U/v1/chat/completions" -H 'Content-Type: application/json' -d "$2"; }
req() { echo "{\"messages\": [{\"role\": \"user\", \"content\": \"$1\"}], \"tools\": $TOOLS, \"max_tokens\": 120, $2}"; }

valid_calls() {   # FILE [NAME]: every call names a tool and its arguments validate
	$PY - "$1" "$T/tools.json" "${2:-}" <<'PY'
import json, sys, jsonschema
r = json.load(open(sys.argv[1]))
tools = {t["function"]["name"]: t["function"]["parameters"] for t in json.load(open(sys.argv[2]))}
for c in r["choices"]:
    m = c["message"]
    assert c["finish_reason"] == "tool_calls" and m["tool_calls"], c
    for call in m["tool_calls"]:
        assert call["type"] == "function" and call["id"].startswith("call_"), call
        f = call["function"]
        assert f["name"] in tools and (not sys.argv[3] or f["name"] == sys.argv[3]), f
        jsonschema.validate(json.loads(f["arguments"]), tools[f["name"]])
PY
}
ok_n=0
for seed in 1 2 3 4 5 6; do
	code=$(post req$seed "$(req "Weather in Oslo?" "\"tool_choice\": \"required\", \"temperature\": 1.0, \"seed\": $seed")")
	[ "$code" = 200 ] && valid_calls "$T/req$seed.out" && ok_n=$((ok_n + 1))
done
check "tool_choice required, 6 sampled answers: each one call to a tool, arguments valid for its schema ($ok_n of 6)" [ $ok_n = 6 ]
code=$(post named "$(req "Find cats" "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"find\"}}, \"temperature\": 0")")
check "a named function: 200" [ "$code" = 200 ]
valid_calls "$T/named.out" find && ok "  ... find, validated" || notok "  ... find, validated"
code=$(post auto "$(req "Once upon a time" "\"temperature\": 0")")
post plain '{"messages": [{"role": "user", "content": "Once upon a time"}], "max_tokens": 200, "temperature": 0}' >/dev/null
check "auto, an answer that is not a call: content as text, finish as usual, no tool_calls" $PY -c "
import json
c = json.load(open('$T/auto.out'))['choices'][0]
assert '$code' == '200' and 'tool_calls' not in c['message'] and c['finish_reason'] in ('stop', 'length'), c
assert isinstance(c['message']['content'], str) and c['message']['content'], c"
curl -sN -m 120 "$U/v1/chat/completions" -d "$(req "Weather in Oslo?" "\"tool_choice\": \"required\", \"temperature\": 0, \"stream\": true")" >"$T/stream.sse"
post nostream "$(req "Weather in Oslo?" "\"tool_choice\": \"required\", \"temperature\": 0")" >/dev/null
check "streamed: no content leaks from the call; one tool_calls delta equal to the unstreamed call; finish tool_calls" $PY - "$T" <<'PY'
import json, sys
t = sys.argv[1]
ev = [json.loads(l[6:]) for l in open(t + "/stream.sse") if l.startswith("data: {")]
content = "".join(e["choices"][0]["delta"].get("content") or "" for e in ev)
deltas = [tc for e in ev for tc in e["choices"][0]["delta"].get("tool_calls", [])]
ref = json.load(open(t + "/nostream.out"))["choices"][0]["message"]["tool_calls"]
assert "<tool_call>" not in content and content.strip() == "", content
assert len(deltas) == 1 and deltas[0]["index"] == 0 and deltas[0]["function"] == ref[0]["function"], (deltas, ref)
assert ev[-1]["choices"][0]["finish_reason"] == "tool_calls", ev[-1]
PY
code=$(post bad1 "$(req "x" "\"tool_choice\": {\"type\": \"function\", \"function\": {\"name\": \"rm\"}}")")
check "a named function not among the tools: 400 naming tool_choice" sh -c "[ $code = 400 ] && grep -q '\"param\":\"tool_choice\"' '$T/bad1.out'"
code=$(post bad2 '{"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}')
check "a tool without a function: 400 naming tools" sh -c "[ $code = 400 ] && grep -q '\"param\":\"tools\"' '$T/bad2.out'"
# a conversation that went through a call: the assistant's tool_calls and the tool's answer render
code=$(post hist "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", \"content\": null, \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"sunny\"}], \"tools\": $TOOLS, \"max_tokens\": 8, \"temperature\": 0}")
check "a history with tool_calls and a tool message is taken (200)" [ "$code" = 200 ]
if command -v node >/dev/null && [ -d tests/js/node_modules/openai ]; then
	LLM_SERVE_URL=$U/v1 timeout 300 node tests/js/tools.mjs || tap_fail=1
else
	skip "the openai client with tools" "no node or tests/js/node_modules (npm ci --prefix tests/js)"
fi
kill -TERM $SP; wait $SP

# Llama 3 JSON: the template teaches {"name", "parameters"}
llm-serve -m "$M" --port 0 --port-file "$T/port3" -t 1 --chat-template tests/data/chat-template-llama3-tools.jinja 2>"$T/server3.log" & SP=$!
U=$(serve_url "$T/port3")
code=$(post l3 "$(req "Weather in Oslo?" "\"tool_choice\": \"required\", \"temperature\": 0")")
check "llama3 format: the answer is {\"name\", \"parameters\"} JSON, parsed into a valid call" sh -c "[ $code = 200 ]"
valid_calls "$T/l3.out" && ok "  ... validated" || notok "  ... validated"
check "  ... the raw text was Llama 3 JSON (parameters), not a <tool_call> block" $PY -c "
import json
c = json.load(open('$T/l3.out'))['choices'][0]
args = c['message']['tool_calls'][0]['function']['arguments']
assert json.loads(args) is not None and c['message']['content'] is None, c"
kill -TERM $SP; wait $SP

# llm-generate JSONL: the same fields, tool_calls in its JSON
echo "$(req "Weather in Oslo?" "\"tool_choice\": \"required\", \"temperature\": 0")" |
	llm-generate -m "$M" --chat-template tests/data/chat-template-tools.jinja --json >"$T/gen.out"
check "llm-generate JSONL with tools: tool_calls parsed, finish tool_calls, arguments valid" $PY - "$T/gen.out" "$T/tools.json" <<'PY'
import json, sys, jsonschema
r = json.loads(open(sys.argv[1]).readline())
tools = {t["function"]["name"]: t["function"]["parameters"] for t in json.load(open(sys.argv[2]))}
assert r["finish_reason"] == "tool_calls" and len(r["tool_calls"]) == 1, r
f = r["tool_calls"][0]["function"]
jsonschema.validate(json.loads(f["arguments"]), tools[f["name"]])
PY

# Qwen3's reference tokenizer and template on a random-weight model: the
# reference tool conversations tokenize (through the server) to the ids
# Hugging Face gives, and a forced call parses
Q=$LLM_TEST_REF/tokenizers/qwen3
if [ ! -f "$Q/chat.jsonl" ]; then skip "Qwen3 tool conversations" "no $Q/chat.jsonl"; tap_done; fi
cat >"$T/qcfg.json" <<'J'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 151936,
 "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-06, "hidden_act": "silu",
 "tie_word_embeddings": true, "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "float32"}
J
llm-quantize -q --random "$T/qcfg.json" --dtype fp8 "$T/qwen" >/dev/null && cp "$Q/tokenizer.json" "$Q/tokenizer_config.json" "$T/qwen/"
llm-serve -m "$T/qwen" --port 0 --port-file "$T/portq" -t 1 2>"$T/serverq.log" & SP=$!
U=$(serve_url "$T/portq" 120)
check "the Qwen3 tool conversations of chat.jsonl tokenize through /tokenize to the reference ids" $PY - "$Q/chat.jsonl" "$U" <<'PY'
import json, sys, urllib.request
n = 0
for line in open(sys.argv[1]):
    c = json.loads(line)
    if not c["tools"] and not any(m.get("tool_calls") or m["role"] == "tool" for m in c["messages"]):
        continue
    body = {"messages": c["messages"], "add_generation_prompt": c["add_generation_prompt"]}
    if c["tools"]:
        body["tools"] = c["tools"]
    if c.get("template_kwargs"):
        body["chat_template_kwargs"] = c["template_kwargs"]
    req = urllib.request.Request(sys.argv[2] + "/tokenize", json.dumps(body).encode(), {"Content-Type": "application/json"})
    got = json.load(urllib.request.urlopen(req))["tokens"]
    assert got == c["ids"], (c["messages"], len(got), len(c["ids"]))
    n += 1
assert n >= 3, n
PY
code=$(curl -s -m 120 -o "$T/q.out" -w '%{http_code}' "$U/v1/chat/completions" -d "$(req "Weather in Oslo?" "\"tool_choice\": \"required\", \"temperature\": 0")")
check "Qwen3 template on random weights: a forced call parses (hermes), arguments valid" sh -c "[ $code = 200 ]"
valid_calls "$T/q.out" && ok "  ... validated" || notok "  ... validated"
kill -TERM $SP; wait $SP
tap_done
