# tests/cli/serve_clients.sh: the clients users already have, against
# llm-serve on loopback: whole tool loops (openai runTools, the AI SDK's
# multi-step calls, LangChain's bindTools; tests/js/toolloop.mjs) on the hermes and llama3 formats
# and on Qwen3's own template; Hugging Face's InferenceClient with
# endpointUrl and no model (tests/js/hf.mjs), TGI's chat response_format;
# reasoning split from the answer (tests/js/reasoning.mjs) on Qwen3's
# reference tokenizer and template with random weights, and on a template
# that opens the block in the prompt (DeepSeek-R1's way); and with curl, the
# wire shapes: TGI's POST /, SageMaker's GET /ping and POST /invocations,
# the model-name rule, null and absent content, reasoning_content. The JS
# parts skip without node or tests/js/node_modules (npm ci --prefix tests/js).
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then skip "clients against stories260K" "no stories260K in \$LLM_TEST_MODELS"; tap_done; fi
M=$(stories)
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
JS=1
if ! command -v node >/dev/null; then JS=0; why="no node"; fi
for p in openai ai @ai-sdk/openai-compatible @huggingface/inference @langchain/openai @langchain/core; do
	[ $JS = 1 ] && [ ! -d "tests/js/node_modules/$p" ] && JS=0 why="tests/js/node_modules lacks $p (npm ci --prefix tests/js)"
done
node_run() {   # DESC SCRIPT [VAR=VALUE...]: the script's TAP lines, or a skip
	local d=$1 s=$2; shift 2
	if [ $JS = 1 ]; then env "$@" timeout 300 node "tests/js/$s" || tap_fail=1; else skip "$d" "$why"; fi
}
TOOLS='[{"type": "function", "function": {"name": "weather", "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"]}}}]'

# --- hermes (tests/data/chat-template-tools.jinja): tool loops, Hugging Face's client, the routes
llm-serve -m "$M" --port 0 --port-file "$T/port" -t 1 --chat-template tests/data/chat-template-tools.jinja 2>"$T/server.log" & SP=$!
U=$(serve_url "$T/port")
node_run "tool loops (hermes)" toolloop.mjs LLM_SERVE_URL="$U/v1" LLM_FORMAT=hermes
node_run "Hugging Face's client" hf.mjs LLM_SERVE_URL="$U"
code() { curl -s -m 120 -o "$T/$1" -w '%{http_code}' "${@:2}"; }
tgi='{"inputs": "Once upon a time", "parameters": {"max_new_tokens": 6}}'
c0=$(code gen.out "$U/generate" -d "$tgi")
c1=$(code root.out "$U/" -d "$tgi")
check "TGI's POST /: 200, the /generate answer in a list of one" $PY -c "
import json
assert '$c0' == '$c1' == '200', ('$c0', '$c1')
assert json.load(open('$T/root.out')) == [json.load(open('$T/gen.out'))], open('$T/root.out').read()"
curl -sN -m 120 "$U/" -d "${tgi%\}}, \"stream\": true}" >"$T/root.sse"
check "TGI's POST / with stream true: /generate_stream's events, the last with the same generated_text" $PY -c "
import json
ev = [json.loads(l[5:]) for l in open('$T/root.sse') if l.startswith('data:')]
assert len(ev) == 6 and all('token' in e for e in ev), ev
assert ev[-1]['generated_text'] == json.load(open('$T/gen.out'))['generated_text'], ev[-1]"
check "GET /ping (SageMaker's health check): 200 when ready; HEAD too" sh -c "
[ \"\$(curl -s -m 10 -o /dev/null -w '%{http_code}' '$U/ping')\" = 200 ] &&
[ \"\$(curl -s -m 10 -o /dev/null -w '%{http_code}' -I '$U/ping')\" = 200 ]"
c2=$(code inv1.out "$U/invocations" -d "$tgi")
c3=$(code inv2.out "$U/invocations" -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}')
c4=$(code inv3.out "$U/invocations" -d '{"prompt": "Once", "max_tokens": 3}')
check "POST /invocations: TGI's body as POST /, a chat body with messages as chat, one with prompt as completions" $PY -c "
import json
assert '$c2' == '$c3' == '$c4' == '200', ('$c2', '$c3', '$c4')
assert json.load(open('$T/inv1.out')) == json.load(open('$T/root.out'))
c = json.load(open('$T/inv2.out'))
assert c['object'] == 'chat.completion' and c['usage']['completion_tokens'] == 4, c
assert json.load(open('$T/inv3.out'))['object'] == 'text_completion'"
c5=$(code inv4.out "$U/invocations" -d '{"inputs": 5}')
check "POST /invocations with a bad TGI body: 400 in TGI's error shape naming the field" sh -c "
[ $c5 = 400 ] && grep -q '\"error\":\"inputs: expected a string\"' '$T/inv4.out'"
check "POST / takes POST only: GET is 405 with Allow: POST" sh -c "
curl -s -m 10 -i '$U/' | tr -d '\r' | grep -qx 'Allow: POST'"
c6=$(code url.out "$U/v1/chat/completions" -d '{"model": "http://127.0.0.1:8080", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}')
check "a server without adapters: any model name (here a URL) is its model; the response names the served one" $PY -c "
import json
assert '$c6' == '200' and json.load(open('$T/url.out'))['model'] == 'stories260K', open('$T/url.out').read()"
# null and absent content in a tool loop's history
hist() { echo "{\"messages\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", $1 \"tool_calls\": [{\"id\": \"c1\", \"type\": \"function\", \"function\": {\"name\": \"weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}}]}, {\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"sunny\"}], \"tools\": $TOOLS, $2}"; }
for v in absent null empty; do
	case $v in absent) f="";; null) f='"content": null,';; empty) f='"content": "",';; esac
	code tok_$v.out "$U/tokenize" -d "$(hist "$f" '"add_generation_prompt": true')" >/dev/null
	code chat_$v.out "$U/v1/chat/completions" -d "$(hist "$f" '"max_tokens": 4, "temperature": 0')" >/dev/null
done
check "an assistant turn with tool_calls and content absent, null or \"\": the same prompt, the same answer" $PY -c "
import json
t = [json.load(open('$T/tok_%s.out' % v))['tokens'] for v in ('absent', 'null', 'empty')]
c = [json.load(open('$T/chat_%s.out' % v))['choices'][0]['token_ids'] for v in ('absent', 'null', 'empty')]
assert t[0] == t[1] == t[2] and len(t[0]) > 10 and c[0] == c[1] == c[2], (t, c)"
code nouser.out "$U/v1/chat/completions" -d '{"messages": [{"role": "user"}]}' >/dev/null
check "a user message without content is still 400 naming messages" grep -q '"param":"messages"' "$T/nouser.out"
code plain.out "$U/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}' >/dev/null
check "a template without <think> markers: no reasoning_content field" $PY -c "
import json
m = json.load(open('$T/plain.out'))['choices'][0]['message']
assert 'reasoning_content' not in m and m['content'], m"
kill -TERM $SP; wait $SP

# --- a server that can have adapters keeps refusing a name it does not know
llm-serve -m "$M" --port 0 --port-file "$T/portl" -t 1 --allow-runtime-lora 2>"$T/serverl.log" & SP=$!
U=$(serve_url "$T/portl")
c=$(code lora.out "$U/v1/completions" -d '{"model": "http://127.0.0.1:8080", "prompt": "a", "max_tokens": 1}')
check "--allow-runtime-lora: an unknown model name is 404 naming it" sh -c "[ $c = 404 ] && grep -q '\"param\":\"model\"' '$T/lora.out'"
kill -TERM $SP; wait $SP

# --- a template that opens the <think> block in the prompt (DeepSeek-R1's way):
# the answer starts in the reasoning
llm-serve -m "$M" --port 0 --port-file "$T/portr" -t 1 --chat-template tests/data/chat-template-think-open.jinja 2>"$T/serverr.log" & SP=$!
U=$(serve_url "$T/portr")
q='{"messages": [{"role": "user", "content": "Why?"}], "temperature": 0, "max_tokens": 60, "guided_regex": "[a-z]{2,5} [a-z]{2,5}\\n</think>\\n\\nDone\\."'
code open1.out "$U/v1/chat/completions" -d "$q}" >/dev/null
curl -sN -m 120 "$U/v1/chat/completions" -d "$q, \"stream\": true}" >"$T/open1.sse"
check "a prompt that ends in an open <think>: the answer's text up to </think> is reasoning_content, streamed the same" $PY - "$T" <<'PY'
import json, re, sys
t = sys.argv[1]
m = json.load(open(t + "/open1.out"))["choices"][0]["message"]
assert re.fullmatch(r"[a-z]{2,5} [a-z]{2,5}", m["reasoning_content"]) and m["content"] == "Done.", m
ev = [json.loads(l[6:])["choices"][0]["delta"] for l in open(t + "/open1.sse") if l.startswith("data: {")]
assert "".join(d.get("reasoning_content") or "" for d in ev) == m["reasoning_content"], ev
assert "".join(d.get("content") or "" for d in ev) == "Done.", ev
PY
# the same answer through the Responses and Messages APIs: a reasoning item
# (reasoning_text) before the message, a thinking block before the text
g='"temperature": 0, "guided_regex": "[a-z]{2,5} [a-z]{2,5}\\n</think>\\n\\nDone\\."'
code open2.out "$U/v1/responses" -d "{\"input\": \"Why?\", \"max_output_tokens\": 60, $g}" >/dev/null
curl -sN -m 120 "$U/v1/responses" -d "{\"input\": \"Why?\", \"max_output_tokens\": 60, \"stream\": true, $g}" >"$T/open2.sse"
code open3.out "$U/v1/messages" -d "{\"messages\": [{\"role\": \"user\", \"content\": \"Why?\"}], \"max_tokens\": 60, $g}" >/dev/null
curl -sN -m 120 "$U/v1/messages" -d "{\"messages\": [{\"role\": \"user\", \"content\": \"Why?\"}], \"max_tokens\": 60, \"stream\": true, $g}" >"$T/open3.sse"
check "Responses and Messages: the reasoning as a reasoning item and a thinking block before the answer, streamed the same" $PY - "$T" <<'PY'
import json, re, sys
t = sys.argv[1]
m = json.load(open(t + "/open1.out"))["choices"][0]["message"]
r = json.load(open(t + "/open2.out"))
kinds = [o["type"] for o in r["output"]]
assert kinds == ["reasoning", "message"], r
assert r["output"][0]["content"][0]["text"] == m["reasoning_content"], r
assert r["output"][1]["content"][0]["text"] == "Done.", r
ev = [json.loads(l[6:]) for l in open(t + "/open2.sse") if l.startswith("data: {")]
rd = "".join(e["delta"] for e in ev if e["type"] == "response.reasoning_text.delta")
td = "".join(e["delta"] for e in ev if e["type"] == "response.output_text.delta")
assert rd == m["reasoning_content"] and td == "Done.", (rd, td)
assert ev[-1]["type"] == "response.completed" and [o["type"] for o in ev[-1]["response"]["output"]] == kinds, ev[-1]
a = json.load(open(t + "/open3.out"))
assert [b["type"] for b in a["content"]] == ["thinking", "text"], a
assert a["content"][0]["thinking"] == m["reasoning_content"] and a["content"][1]["text"] == "Done.", a
ev = [json.loads(l[6:]) for l in open(t + "/open3.sse") if l.startswith("data: {")]
th = "".join(e["delta"].get("thinking", "") for e in ev if e["type"] == "content_block_delta")
tx = "".join(e["delta"].get("text", "") for e in ev if e["type"] == "content_block_delta")
assert th == m["reasoning_content"] and tx == "Done.", (th, tx, ev)
PY
kill -TERM $SP; wait $SP

# --- llama3 JSON (tests/data/chat-template-llama3-tools.jinja): tool loops
llm-serve -m "$M" --port 0 --port-file "$T/port3" -t 1 --chat-template tests/data/chat-template-llama3-tools.jinja 2>"$T/server3.log" & SP=$!
U=$(serve_url "$T/port3")
node_run "tool loops (llama3)" toolloop.mjs LLM_SERVE_URL="$U/v1" LLM_FORMAT=llama3
kill -TERM $SP; wait $SP

# --- Qwen3's reference tokenizer and template on random weights: tool
# loops through its own template (content null there failed: 'NoneType' is
# not iterable), and reasoning
Q=$LLM_TEST_REF/tokenizers/qwen3
if [ ! -f "$Q/tokenizer_config.json" ]; then skip "Qwen3's template: tool loops and reasoning" "no $Q"; tap_done; fi
cat >"$T/qcfg.json" <<'J'
{"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32, "intermediate_size": 64,
 "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 151936,
 "max_position_embeddings": 4096, "rope_theta": 10000.0, "rms_norm_eps": 1e-06, "hidden_act": "silu",
 "tie_word_embeddings": true, "bos_token_id": 151643, "eos_token_id": 151645, "torch_dtype": "float32"}
J
llm-quantize -q --random "$T/qcfg.json" --dtype fp8 "$T/qwen" >/dev/null && cp "$Q/tokenizer.json" "$Q/tokenizer_config.json" "$T/qwen/"
llm-serve -m "$T/qwen" --port 0 --port-file "$T/portq" -t 1 2>"$T/serverq.log" & SP=$!
U=$(serve_url "$T/portq" 120)
node_run "tool loops (Qwen3's template)" toolloop.mjs LLM_SERVE_URL="$U/v1" LLM_FORMAT="hermes, Qwen3's template" LLM_MODEL=qwen
node_run "reasoning" reasoning.mjs LLM_SERVE_URL="$U/v1" LLM_MODEL=qwen
code qabsent.out "$U/v1/chat/completions" -d "$(hist "" '"max_tokens": 2')" >/dev/null
check "Qwen3's template: an assistant turn without content renders (200)" $PY -c "
import json
assert json.load(open('$T/qabsent.out'))['choices'][0]['finish_reason'] == 'length', open('$T/qabsent.out').read()"
think='"guided_regex": "<think>\\n[a-z]{2,8}( [a-z]{2,8}){2}\\n</think>\\n\\nAnswer [a-z]{2,8}\\."'
q='{"messages": [{"role": "user", "content": "Why?"}], "temperature": 0'
code r1.out "$U/v1/chat/completions" -d "$q, \"max_tokens\": 80, $think}" >/dev/null
curl -sN -m 120 "$U/v1/chat/completions" -d "$q, \"max_tokens\": 80, \"stream\": true, $think}" >"$T/r1.sse"
code r2.out "$U/v1/chat/completions" -d "$q, \"max_tokens\": 6, $think}" >/dev/null
code r3.out "$U/v1/chat/completions" -d "$q, \"max_tokens\": 3}" >/dev/null
check "reasoning: reasoning_content holds the thinking, trimmed; content the answer after </think>; no marker in either" $PY -c "
import json, re
m = json.load(open('$T/r1.out'))['choices'][0]['message']
assert re.fullmatch(r'[a-z]{2,8}( [a-z]{2,8}){2}', m['reasoning_content']) and re.fullmatch(r'Answer [a-z]{2,8}\.', m['content']), m"
check "reasoning streamed: delta.reasoning_content chunks, then delta.content; they add up to the same two parts, no marker sent" $PY - "$T" <<'PY'
import json, sys
t = sys.argv[1]
ev = [json.loads(l[6:]) for l in open(t + "/r1.sse") if l.startswith("data: {")]
r = c = ""
kinds = []
for e in ev:
    d = e["choices"][0]["delta"]
    for k in ("reasoning_content", "content"):
        if d.get(k):
            kinds.append(k)
    r += d.get("reasoning_content") or ""
    c += d.get("content") or ""
m = json.load(open(t + "/r1.out"))["choices"][0]["message"]
assert r == m["reasoning_content"] and c == m["content"], (r, c, m)
assert kinds.index("content") > max(i for i, k in enumerate(kinds) if k == "reasoning_content"), kinds
assert "think>" not in r + c, (r, c)
PY
check "reasoning cut by max_tokens: content null, the thinking so far in reasoning_content, finish length" $PY -c "
import json
c = json.load(open('$T/r2.out'))['choices'][0]
assert c['finish_reason'] == 'length' and c['message']['content'] is None and c['message']['reasoning_content'], c"
check "a template with the markers and an answer without a block: reasoning_content null, content the text" $PY -c "
import json
m = json.load(open('$T/r3.out'))['choices'][0]['message']
assert 'reasoning_content' in m and m['reasoning_content'] is None and isinstance(m['content'], str), m"
kill -TERM $SP; wait $SP
tap_done
