# tests/cli/serve.sh: llm-serve over loopback, driven by curl: the OpenAI and
# TGI endpoints, streaming, stop strings, greedy outputs against the
# stories260K reference, /health, /metrics, malformed requests, context and
# body limits, the API key, the plan, queue overflow (429), a client that
# goes away mid-stream, and SIGTERM draining. Every server is on 127.0.0.1
# with a port the kernel picked; every wait is bounded (tens of seconds, a
# safety bound), and none is what a check asserts: checks follow events
# (a first streamed token, /health turning 503), and where requests must
# arrive together they are sent while the server is stopped (SIGSTOP).
. tests/lib/tap.sh
T=$TMPD
S=llm-serve
check "--help exits 0 and prints the usage line" sh -c "$S --help | grep -q '^usage: llm-serve '"
check_fails "no -m is a usage error" 2 $S
check_fails "a bad --kv-dtype is a usage error" 2 $S -m x --kv-dtype f16
check_fails "a bad --weight-pages is a usage error" 2 $S -m x --weight-pages big
check_fails "a missing model is a runtime error naming it" 1 $S -m "$T/nope" --port 0
grep -q "$T/nope" "$T/err" && ok "the error names the missing model" || notok "the error names the missing model"
if ! have_stories; then
	skip "llm-serve against stories260K" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
M=$(stories)
REF=$LLM_TEST_REF/stories260K/greedy.jsonl

# the plan, without loading the weights
$S -m "$M" --plan --max-kv-tokens 4096 >"$T/plan.json" 2>"$T/err"
check "--plan prints the memory plan as JSON (the default KV: bf16, 2 bytes an element)" python3 -c "
import json; p = json.load(open('$T/plan.json'))
assert p['kv_tokens'] == 4096 and p['max_context_that_fits'] == 512 and p['fits'], p
assert p['weight_bytes'] > 0 and p['kv_bytes_per_token'] == 5*4*8*2*2 and p['activation_bytes'] > 0, p"
$S -m "$M" --plan --kv-dtype fp8 --kv-memory 1M >"$T/plan-fp8.json" 2>"$T/err"
check "--plan --kv-dtype fp8: a byte per element and a 4-byte scale per (token, head), for K and V" python3 -c "
import json; p = json.load(open('$T/plan-fp8.json'))
assert p['kv_bytes_per_token'] == 5*4*(8+4)*2 and p['kv_bytes'] == p['kv_blocks'] * 16 * 480 <= 1048576, p"
check_fails "--kv-dtype fp4 is a usage error" 2 $S -m "$M" --kv-dtype fp4
grep -q -- "--kv-dtype: 'fp4' is not f32, bf16 or fp8" "$T/err" && ok "the error lists f32, bf16 and fp8" || notok "the error lists f32, bf16 and fp8: $(cat "$T/err")"
check_fails "a KV cache smaller than one context is refused at start" 1 $S -m "$M" --max-kv-tokens 100
grep -q -- "--max-kv-tokens 100 holds 112 tokens, less than one context of 512: need --max-kv-tokens 512" "$T/err" &&
	ok "the refusal names the knob and the number needed" || notok "the refusal names the knob and the number needed: $(cat "$T/err")"

# the first mistakes (issue 22): refused before anything is loaded
check_fails "-c beyond the model's context is a usage error (was: capped silently)" 2 timeout 30 $S -m "$M" -c 100000 --port 0
check "... with the numbers, as llm-generate says them" grep -q "ctx-size 100000 exceeds the model's context of 512 (max_position_embeddings)" "$T/err"
check_fails "-m - is a usage error (llm-serve reads a path)" 2 sh -c "timeout 30 $S -m - --port 0 <'$M/model.safetensors'"
check "... saying so" grep -q -- "-m -: llm-serve reads a checkpoint from a path, not a stream" "$T/err"
$S -m "$M/model.safetensors" --plan >"$T/plan-file.json" 2>"$T/err"
check "-m DIR/model.safetensors finds config.json beside it" grep -q '"n_ctx": 512' "$T/plan-file.json"

# start SERVER ARGS...: sets SP, URL; waits (bounded) for /health 200; an
# f32 KV cache, as the reference's greedy ids are compared exactly
start() {
	rm -f "$T/port"
	$S -m "$M" --port 0 --port-file "$T/port" -t 1 --kv-dtype f32 "$@" 2>>"$T/server.log" & SP=$!
	URL=$(serve_url "$T/port")
}
# stop: SIGTERM, and the exit status of the server in RC
stop() { kill -TERM $SP 2>/dev/null; wait $SP; RC=$?; }
post() { curl -s -m 60 -H 'Content-Type: application/json' "$@"; }
code() { curl -s -m 60 -o "$T/body" -w '%{http_code}' -H 'Content-Type: application/json' "$@"; }
metric() { curl -s -m 5 "$URL/metrics" | awk -v n="$1" '$1 == n {print $2}'; }
# metric_is NAME VALUE: /metrics has NAME at VALUE
metric_is() { [ "$(metric "$1")" = "$2" ]; }
# streaming FILE: a streamed response in FILE has its first event
streaming() { grep -q 'data: {' "$1" 2>/dev/null; }

start --chat-template tests/data/chat-template.jinja --max-body 4096
check "/health says 200 when ready" sh -c "curl -sf -m 5 '$URL/health' | grep -q ready"
check "the server binds 127.0.0.1 by default" grep -q "listening on http://127.0.0.1:" "$T/server.log"
check "/v1/models lists the model" sh -c "curl -s -m 5 '$URL/v1/models' | grep -q '\"id\":\"stories260K\"'"

# greedy completions equal the reference (llama2.c run.c) ids
bad=0
for id in s02 s03 s04 s06 s08 s09; do
	ids=$(python3 -c "import json; [print(json.dumps(o['prompt_ids'])) for o in map(json.loads, open('$REF')) if o['id'] == '$id']")
	post "$URL/v1/completions" -d "{\"prompt\": $ids, \"max_tokens\": 48, \"temperature\": 0}" >"$T/g_$id.json"
	python3 -c "
import json,sys
r = json.load(open('$T/g_$id.json'))
ref = [o for o in map(json.loads, open('$REF')) if o['id'] == '$id'][0]['ids'][:48]
got = r['choices'][0]['token_ids']
sys.exit(0 if got == ref and r['usage']['completion_tokens'] == 48 and r['choices'][0]['finish_reason'] == 'length' else 1)" || bad=$((bad+1))
done
[ $bad = 0 ] && ok "greedy completions equal the reference ids (6 prompts, 48 tokens)" || notok "greedy completions: $bad of 6 differ from the reference"

# a text prompt: non-streamed and streamed give the same text and ids
post "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0}' >"$T/c.json"
post -N "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}' >"$T/c.sse"
check "a streamed completion ends with data: [DONE]" sh -c "tail -n 2 '$T/c.sse' | grep -qx 'data: \[DONE\]'"
check "streamed text, ids and usage equal the non-streamed response" python3 -c "
import json
full = json.load(open('$T/c.json'))
ev = [json.loads(l[6:]) for l in open('$T/c.sse') if l.startswith('data: {')]
text = ''.join(c['text'] for e in ev for c in e['choices'])
ids = [i for e in ev for c in e['choices'] for i in c['token_ids']]
assert text == full['choices'][0]['text'] and ids == full['choices'][0]['token_ids'], (text, full)
assert ev[-1]['usage'] == full['usage'] and ev[-2]['choices'][0]['finish_reason'] == 'length'
assert full['usage'] == {'prompt_tokens': 5, 'completion_tokens': 30, 'total_tokens': 35}"

# stop strings, logprobs, n, seed
post "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 40, "temperature": 0, "stop": ["Lily"]}' >"$T/s.json"
check "a stop string ends the text before it, finish_reason stop" python3 -c "
import json; c = json.load(open('$T/s.json'))['choices'][0]
assert c['finish_reason'] == 'stop' and c['text'] == ', there was a little girl named ', c"
post "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "logprobs": 3}' >"$T/l.json"
check "logprobs: 3 gives the token log-probs and the top 3" python3 -c "
import json; l = json.load(open('$T/l.json'))['choices'][0]['logprobs']
assert len(l['tokens']) == 5 and len(l['token_logprobs']) == 5 and all(len(t) == 3 for t in l['top_logprobs'])
assert all(-20 < x <= 0 for x in l['token_logprobs']) and l['text_offset'][0] == 0"
post "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 1, "seed": 7, "n": 3}' >"$T/n1.json"
post "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 1, "seed": 7, "n": 3}' >"$T/n2.json"
check "n: 3 with a seed: three choices, the same on a second request" python3 -c "
import json; a = json.load(open('$T/n1.json')); b = json.load(open('$T/n2.json'))
assert len(a['choices']) == 3 and a['choices'] == b['choices'], (a, b)
assert len({c['text'] for c in a['choices']}) > 1 and a['usage']['completion_tokens'] == 60"

# logit_bias, stop_token_ids, min_tokens (c.json: the greedy 30 tokens)
post "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "logit_bias": {"400": 100}, "logprobs": 1}' >"$T/lb.json"
check "logit_bias +100 on one id: greedy takes it every time; log-probs stay the model's" python3 -c "
import json; c = json.load(open('$T/lb.json'))['choices'][0]
assert c['token_ids'] == [400] * 5 and c['logprobs']['token_logprobs'][0] < -1, c"
t0=$(python3 -c "import json; print(json.load(open('$T/c.json'))['choices'][0]['token_ids'][0])")
post "$URL/v1/completions" -d "{\"prompt\": \"Once upon a time\", \"max_tokens\": 5, \"temperature\": 0, \"logit_bias\": {\"$t0\": -100}}" >"$T/lb2.json"
check "logit_bias -100 on the greedy first token: another one comes first" python3 -c "
import json; c = json.load(open('$T/lb2.json'))['choices'][0]
assert c['token_ids'][0] != $t0 and len(c['token_ids']) == 5, c"
post "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stop_token_ids": [286]}' >"$T/sid.json"
check "stop_token_ids: ends at the first one, finish_reason stop" python3 -c "
import json; full = json.load(open('$T/c.json'))['choices'][0]['token_ids']; c = json.load(open('$T/sid.json'))['choices'][0]
k = full.index(286)
assert c['finish_reason'] == 'stop' and c['token_ids'] == full[:k + 1], (c, full)"
post "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stop": ["Lily"], "min_tokens": 20}' >"$T/mt.json"
check "min_tokens 20: a stop string within the first 20 tokens does not stop it" python3 -c "
import json; c = json.load(open('$T/mt.json'))['choices'][0]; full = json.load(open('$T/c.json'))['choices'][0]
assert c['text'].startswith(', there was a little girl named Lily') and len(c['token_ids']) >= 20, c
assert c['finish_reason'] == 'length' or 'Lily' in c['text'][len(', there was a little girl named Lily'):], c"
post "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stop_token_ids": [286], "min_tokens": 8}' >"$T/mt2.json"
check "min_tokens 8: a stop id is not sampled before the 9th token" python3 -c "
import json; c = json.load(open('$T/mt2.json'))['choices'][0]
assert 286 not in c['token_ids'][:8] and len(c['token_ids']) >= 9, c"
post "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 5, "temperature": 0, "logprobs": 1}' >"$T/lo.json"
check "logprobs: tokens keep their leading space, text_offset indexes the text" python3 -c "
import json; c = json.load(open('$T/lo.json'))['choices'][0]; l = c['logprobs']
assert ''.join(l['tokens']) == c['text'] and l['tokens'][1] == ' there', l
assert all(c['text'][o:].startswith(t) for o, t in zip(l['text_offset'], l['tokens'])), l"
for bad in '"logit_bias": {"x": 1}|logit_bias' '"logit_bias": {"400": 101}|logit_bias' '"logit_bias": {"512": 1}|logit_bias' \
	'"min_tokens": 9|min_tokens' '"stop_token_ids": [512]|stop_token_ids' '"best_of": 0|best_of' '"suffix": "x"|suffix' \
	'"response_format": {"type": "json_schema", "json_schema": {"schema": {"format": "email"}}}|response_format' \
	'"guided_regex": "a(?=b)"|guided_regex'; do
	f=${bad%|*}; name=${bad#*|}
	c=$(code "$URL/v1/completions" -d "{\"prompt\": \"a\", \"max_tokens\": 8, $f}")
	check "$f: 400 naming $name" sh -c "[ $c = 400 ] && grep -q '\"param\":\"$name\"' '$T/body'"
done

# structured output through HTTP: every answer that ends "stop" is valid
SCHEMA='{"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer", "minimum": 1, "maximum": 99}, "pet": {"enum": ["cat", "dog", null]}}, "required": ["name", "age"], "additionalProperties": false}'
post "$URL/v1/completions" -d "{\"prompt\": \"Once upon a time\", \"max_tokens\": 60, \"temperature\": 0.8, \"seed\": 5, \"n\": 4, \"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"p\", \"schema\": $SCHEMA}}}" >"$T/rf.json"
check "completion response_format json_schema: 4 choices, each valid for the schema (python3-jsonschema)" /usr/bin/python3 -c "
import json, jsonschema; r = json.load(open('$T/rf.json')); s = json.loads('''$SCHEMA''')
assert len(r['choices']) == 4, r
for c in r['choices']:
    assert c['finish_reason'] == 'stop', c
    jsonschema.validate(json.loads(c['text']), s)"
post "$URL/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 80, "temperature": 0, "response_format": {"type": "json_object"}}' >"$T/rfc.json"
check "chat response_format json_object: a JSON object, or finish length" /usr/bin/python3 -c "
import json; c = json.load(open('$T/rfc.json'))['choices'][0]; t = c['message']['content']
assert t.startswith('{'), c
assert c['finish_reason'] == 'length' or isinstance(json.loads(t), dict), c"
post -N "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 1, "seed": 3, "stream": true, "guided_choice": ["a happy day", "the end", "Lily"]}' >"$T/gc.sse"
check "streamed guided_choice: the deltas make one of the choices" /usr/bin/python3 -c "
import json
ev = [json.loads(l[6:]) for l in open('$T/gc.sse') if l.startswith('data: {')]
t = ''.join(e['choices'][0]['text'] for e in ev if e['choices'])
assert t in ('a happy day', 'the end', 'Lily') and ev[-1]['choices'][0]['finish_reason'] == 'stop', (t, ev[-1])"
post "$URL/generate" -d '{"inputs": "Once upon a time", "parameters": {"max_new_tokens": 20, "grammar": {"type": "regex", "value": "[A-Z][a-z]{2,6} (ran|sat)\\."}}}' >"$T/tg.json"
check "/generate grammar regex: the text fullmatches it" /usr/bin/python3 -c "
import json, re; t = json.load(open('$T/tg.json'))['generated_text']
assert re.fullmatch(r'[A-Z][a-z]{2,6} (ran|sat)\\.', t), t"

# chat, with the template of tests/data
post "$URL/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 12, "temperature": 0}' >"$T/chat.json"
check "chat completion: an assistant message and usage" python3 -c "
import json; r = json.load(open('$T/chat.json'))
assert r['object'] == 'chat.completion' and r['choices'][0]['message']['role'] == 'assistant'
assert len(r['choices'][0]['message']['content']) > 0 and r['usage']['completion_tokens'] == 12, r"
post "$URL/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 1, "temperature": 0, "logprobs": true, "logit_bias": {"243": 100}}' >"$T/chatb.json"
check "chat logprobs: a byte-fallback token's bytes are its byte (<0xF0>: [240])" python3 -c "
import json; lp = json.load(open('$T/chatb.json'))['choices'][0]['logprobs']['content']
assert lp[0]['bytes'] == [240] and lp[0]['token'] == '\ufffd', lp"
post -N "$URL/v1/chat/completions" -d '{"messages": [{"role": "user", "content": "Tell me a story"}], "max_tokens": 12, "temperature": 0, "stream": true}' >"$T/chat.sse"
check "streamed chat: a role delta, content deltas, [DONE], the same text" python3 -c "
import json
ev = [json.loads(l[6:]) for l in open('$T/chat.sse') if l.startswith('data: {')]
assert ev[0]['choices'][0]['delta']['role'] == 'assistant'
text = ''.join(e['choices'][0]['delta'].get('content', '') for e in ev)
assert text == json.load(open('$T/chat.json'))['choices'][0]['message']['content']
assert open('$T/chat.sse').read().rstrip().endswith('data: [DONE]')"

# TGI
post "$URL/generate" -d '{"inputs": "Once upon a time", "parameters": {"max_new_tokens": 30, "details": true}}' >"$T/tgi.json"
check "/generate: greedy generated_text equals the completion's, with details" python3 -c "
import json; t = json.load(open('$T/tgi.json')); c = json.load(open('$T/c.json'))
assert t['generated_text'] == c['choices'][0]['text'], t
d = t['details']; assert d['finish_reason'] == 'length' and d['generated_tokens'] == 30 and d['seed'] is None
assert [x['id'] for x in d['tokens']] == c['choices'][0]['token_ids']"
post -N "$URL/generate_stream" -d '{"inputs": "Once upon a time", "parameters": {"max_new_tokens": 30}}' >"$T/tgi.sse"
check "/generate_stream: one event per token, the last with generated_text" python3 -c "
import json
ev = [json.loads(l[5:]) for l in open('$T/tgi.sse') if l.startswith('data:')]
c = json.load(open('$T/c.json'))['choices'][0]
assert [e['token']['id'] for e in ev] == c['token_ids'] and ev[-1]['generated_text'] == c['text']
assert ev[-1]['details']['finish_reason'] == 'length' and all(e['generated_text'] is None for e in ev[:-1])"

post "$URL/generate" -d '{"inputs": "Once upon a time", "parameters": {"max_new_tokens": 6, "details": true, "top_n_tokens": 3}}' >"$T/tgi_top.json"
post -N "$URL/generate_stream" -d '{"inputs": "Once upon a time", "parameters": {"max_new_tokens": 6, "top_n_tokens": 3}}' >"$T/tgi_top.sse"
check "/generate top_n_tokens 3: details.top_tokens per token, the greedy one first; the stream has them too" python3 -c "
import json
d = json.load(open('$T/tgi_top.json'))['details']
assert len(d['top_tokens']) == 6 and all(len(t) == 3 for t in d['top_tokens']), d
assert [t[0]['id'] for t in d['top_tokens']] == [x['id'] for x in d['tokens']], d
ev = [json.loads(l[5:]) for l in open('$T/tgi_top.sse') if l.startswith('data:')]
assert [e['top_tokens'] for e in ev] == d['top_tokens'], ev"
post "$URL/generate" -d '{"inputs": "Once upon a time", "parameters": {"max_new_tokens": 3, "details": true, "do_sample": true, "seed": 5}}' >"$T/sd.json"
check "/generate details.seed: the seed sampled with (null when greedy, above)" python3 -c "
import json; assert json.load(open('$T/sd.json'))['details']['seed'] == 5"
post "$URL/generate" -d '{"inputs": "Once upon a time", "parameters": {"max_new_tokens": 8, "truncate": 2}}' >"$T/tr.json"
post "$URL/v1/completions" -d '{"prompt": [261, 378], "max_tokens": 8, "temperature": 0}' >"$T/tr2.json"
check "/generate truncate 2: the last 2 prompt tokens only" python3 -c "
import json; a = json.load(open('$T/tr.json')); b = json.load(open('$T/tr2.json'))
assert a['generated_text'] == b['choices'][0]['text'], (a, b)"
# the text is the continuation's, decode(prompt + ids) - decode(prompt), as
# vLLM gives it: after "Lily and Tom" the first token's leading space is kept
# (" we|re", run.c's s03), in every endpoint and in each streamed piece
post "$URL/v1/completions" -d '{"prompt": "Lily and Tom", "max_tokens": 12, "temperature": 0, "logprobs": 1}' >"$T/sp.json"
post -N "$URL/v1/completions" -d '{"prompt": "Lily and Tom", "max_tokens": 12, "temperature": 0, "stream": true}' >"$T/sp.sse"
post "$URL/generate" -d '{"inputs": "Lily and Tom", "parameters": {"max_new_tokens": 12, "return_full_text": true}}' >"$T/sp_tgi.json"
post -N "$URL/generate_stream" -d '{"inputs": "Lily and Tom", "parameters": {"max_new_tokens": 12}}' >"$T/sp_tgi.sse"
check "the first token keeps its leading space: /v1/completions (its log-prob tokens join to the text), its SSE chunks, /generate, /generate_stream" python3 -c "
import json
ref = [o for o in map(json.loads, open('$REF')) if o['id'] == 's03'][0]['text']
c = json.load(open('$T/sp.json'))['choices'][0]
ev = [json.loads(l[6:]) for l in open('$T/sp.sse') if l.startswith('data: {')]
chunks = [ch['text'] for e in ev for ch in e['choices']]
tgi = json.load(open('$T/sp_tgi.json'))['generated_text']
tev = [json.loads(l[5:]) for l in open('$T/sp_tgi.sse') if l.startswith('data:')]
assert c['text'].startswith(' we') and ref.startswith(c['text']), (c, ref[:80])
assert ''.join(c['logprobs']['tokens']) == c['text'] and c['logprobs']['text_offset'][0] == 0, c
assert chunks[0].startswith(' ') and c['text'].startswith(chunks[0]) and ''.join(chunks) == c['text'], chunks
assert tgi == 'Lily and Tom' + c['text'], tgi
assert tev[0]['token']['text'] == chunks[0] and tev[-1]['generated_text'] == c['text'], tev"
# chat: the same rule, so the content keeps a leading space where the decode has one
echo '{"messages": [{"role": "user", "content": "Tell me a story"}], "add_generation_prompt": true}' |
	llm-generate -m "$M" --apply-template --chat-template tests/data/chat-template.jinja |
	llm-generate -m "$M" --tokenize --no-special >"$T/chat_prompt.json"
check "chat content is decode(prompt + ids) - decode(prompt) (prompt rendered and tokenized by llm-generate)" python3 - "$T/chat.json" "$T/chat_prompt.json" "$M" <<'PY'
import json, subprocess, sys
r = json.load(open(sys.argv[1])); p = json.load(open(sys.argv[2]))
dec = lambda x: subprocess.run(["llm-generate", "-m", sys.argv[3], "--detokenize", "--skip-special"], input=json.dumps(x),
                               capture_output=True, text=True, check=True).stdout
c = r["choices"][0]
whole, pre = dec(p + c["token_ids"]), dec(p)
assert r["usage"]["prompt_tokens"] == len(p) and whole.startswith(pre), (r, p)
assert c["message"]["content"] == whole[len(pre):], (c["message"]["content"], whole, pre)
PY
for bad in '"typical_p": 0.5' '"watermark": true' '"best_of": 2' '"truncate": 0'; do
	c=$(code "$URL/generate" -d "{\"inputs\": \"a\", \"parameters\": {$bad}}")
	check "/generate $bad: 400" sh -c "[ $c = 400 ] && grep -q validation '$T/body'"
done

# errors
check "malformed JSON: 400" [ "$(code "$URL/v1/completions" -d '{"prompt": ')" = 400 ]
check "a wrong type: 400 naming the field" sh -c "[ \"\$(curl -s -m 10 -o '$T/b' -w '%{http_code}' '$URL/v1/completions' -d '{\"prompt\": \"a\", \"max_tokens\": \"ten\"}')\" = 400 ] && grep -q '\"param\":\"max_tokens\"' '$T/b'"
check "temperature out of range: 400 naming it" sh -c "curl -s -m 10 '$URL/v1/completions' -d '{\"prompt\": \"a\", \"temperature\": 101}' | grep -q 'temperature: 101 is out of range \[0, 100\]'"
# the rules llm-generate's JSONL lines share (request.c): vLLM's
check "temperature 7 is taken (no cap at 2: the sampler's [0, 100], as llm-generate)" sh -c "curl -s -m 10 '$URL/v1/completions' -d '{\"prompt\": \"a\", \"temperature\": 7, \"max_tokens\": 2}' | grep -q text_completion"
c=$(code "$URL/v1/completions" -d '{"prompt": "a", "stop": ["1","2","3","4","5","6","7","8","9"]}')
check "9 stop strings: 400 naming stop, never cut (as llm-generate)" sh -c "[ $c = 400 ] && grep -q '\"param\":\"stop\"' '$T/body' && grep -q 'stop: 9 stop strings, at most 8' '$T/body'"
c=$(code "$URL/generate" -d '{"inputs": "a", "parameters": {"top_p": 0, "max_new_tokens": 2}}')
check "/generate top_p 0: 400 (0 < top_p <= 1 everywhere)" sh -c "[ $c = 400 ] && grep -q 'top_p: 0 is out of range (0, 1\]' '$T/body'"
c=$(code "$URL/generate" -d '{"inputs": "a", "parameters": {"top_k": -1, "seed": -3, "max_new_tokens": 2}}')
check "/generate top_k -1 (off) and a negative seed are taken (as OpenAI bodies)" [ "$c" = 200 ]
c=$(code "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 600}')
check "prompt + max_tokens beyond the context: 400 with the numbers" sh -c "[ $c = 400 ] && grep -q 'prompt of 5 tokens + max_tokens 600 exceeds the context of 512' '$T/body'"
ids512=$(python3 -c "print([1] + [300] * 511)")
c=$(code "$URL/v1/completions" -d "{\"prompt\": $ids512, \"max_tokens\": 1}")
check "a prompt as long as the context: 400 with the numbers, as llm-generate says them" sh -c "[ $c = 400 ] && grep -q 'prompt of 512 tokens + max_tokens 1 exceeds the context of 512' '$T/body'"
head -c 5000 /dev/zero | tr '\0' 'a' >"$T/big"
check "a body over --max-body: 413" [ "$(code "$URL/v1/completions" --data-binary @"$T/big")" = 413 ]
check "an unknown endpoint: 404" [ "$(code "$URL/v1/nope")" = 404 ]
check "GET on a POST endpoint: 405" [ "$(code -X GET "$URL/v1/completions")" = 405 ]
check "another model name on a server without adapters: served by its model, the response names it" sh -c \
	"curl -s -m 30 '$URL/v1/completions' -d '{\"model\": \"gpt-9\", \"prompt\": \"a\", \"max_tokens\": 1}' | grep -q '\"model\":\"stories'"
check "a chat message without a role: 400 naming messages" sh -c "curl -s -m 10 '$URL/v1/chat/completions' -d '{\"messages\": [{\"content\": \"hi\"}]}' | grep -q '\"param\":\"messages\"'"
check "no request can name a file: a prompt that is a path is just text" sh -c "curl -s -m 10 '$URL/v1/completions' -d '{\"prompt\": \"/etc/passwd\", \"max_tokens\": 2}' | grep -q text_completion"

# metrics
m=$(curl -s -m 5 "$URL/metrics")
miss=""
for n in llm_requests_running llm_requests_waiting llm_kv_blocks_used llm_kv_blocks llm_prompt_tokens_total \
	llm_generation_tokens_total llm_time_to_first_token_seconds_bucket llm_inter_token_latency_seconds_count \
	llm_e2e_request_latency_seconds_sum llm_queue_time_seconds_count; do
	printf '%s\n' "$m" | grep -q "^$n" || miss="$miss $n"
done
[ -z "$miss" ] && ok "/metrics has the gauges, counters and histograms" || notok "/metrics lacks:$miss"
check "/metrics: no KV blocks held by requests when idle" [ "$(metric llm_kv_blocks_used)" = 0 ]
# promtool's rule: a name ending in _total is a counter; the pool's gauge is
# llm_kv_blocks, its old name llm_kv_blocks_total kept one release (same value)
check "/metrics: the KV pool's gauge is llm_kv_blocks, the deprecated llm_kv_blocks_total equal to it" \
	sh -c "[ '$(metric llm_kv_blocks)' -gt 0 ] && [ '$(metric llm_kv_blocks)' = '$(metric llm_kv_blocks_total)' ]"
gauges_total=$(printf '%s\n' "$m" | grep '^# TYPE [a-z_:]*_total ' | grep -v ' counter$' | grep -vx '# TYPE llm_kv_blocks_total gauge')
[ -n "$m" ] || gauges_total="(no /metrics)"
check "/metrics: every other name ending in _total is a counter" [ -z "$gauges_total" ]

# a client that goes away mid-stream: its request is cancelled, its blocks
# freed. The client is killed once the first token has come, with the server
# stopped, so the request (n: 16 x 500 tokens, 8000 decode steps' worth)
# cannot have ended in between whatever the machine's speed.
curl -s -N -m 300 "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 500, "n": 16, "ignore_eos": true, "stream": true}' >"$T/cut.sse" 2>/dev/null & cp=$!
wait_until 60 streaming "$T/cut.sse"
kill -STOP $SP; kill $cp; wait $cp 2>/dev/null; kill -CONT $SP
wait_until 30 metric_is 'llm_requests_total{status="cancelled"}' 1
check "a client closing mid-stream cancels its request" metric_is 'llm_requests_total{status="cancelled"}' 1
wait_until 30 metric_is llm_kv_blocks_used 0
check "and its KV blocks are free again" metric_is llm_kv_blocks_used 0
check "the stream it got was cut short" sh -c "! grep -q DONE '$T/cut.sse' && grep -q 'data: {' '$T/cut.sse'"
stop
check "SIGTERM on an idle server: exit 0" [ "$RC" = 0 ]

# the API key
start --api-key sekret
check "--api-key: no key gets 401" [ "$(code "$URL/v1/models")" = 401 ]
check "--api-key: a wrong key gets 401" [ "$(code -H 'Authorization: Bearer nope' "$URL/v1/models")" = 401 ]
check "--api-key: the key gets 200" [ "$(code -H 'Authorization: Bearer sekret' "$URL/v1/models")" = 200 ]
check "--api-key: /health needs no key" [ "$(code "$URL/health")" = 200 ]
stop

# queue overflow: 16 running (one request, n: 16), one waiting at most; the
# rest 429 at once. The 5 clients send while the server is stopped: on
# SIGCONT the first it takes fills every slot for 400 decode steps, and the
# other 4 are answered in the meantime, however slowly curl starts here.
# (--drain-timeout 300: the drain below lets its stream finish on any machine)
start --max-running 16 --max-queue 1 --drain-timeout 300
kill -STOP $SP
for i in 1 2 3 4 5; do
	curl -s -v -m 300 -D "$T/q$i.h" -o "$T/q$i.json" -w '%{http_code}\n' "$URL/v1/completions" \
		-d '{"prompt": "Once upon a time", "max_tokens": 400, "n": 16, "ignore_eos": true, "temperature": 0}' \
		>"$T/q$i.code" 2>"$T/q$i.trace" &
done
wait_until 60 sent "$T"/q[1-5].trace
kill -CONT $SP
wait $(jobs -p | grep -v "^$SP$") 2>/dev/null
n200=$(cat "$T"/q*.code | grep -c 200); n429=$(cat "$T"/q*.code | grep -c 429)
check "queue overflow (16 running, --max-queue 1, n: 16): 1 answered, 4 refused with 429 ($n200 + $n429)" sh -c "[ '$n200' = 1 ] && [ '$n429' = 4 ]"
check "a 429 carries Retry-After" sh -c "grep -il '^retry-after: 1' '$T'/q*.h | grep -q ."
check "the answered ones are complete" sh -c "grep -l '\"completion_tokens\":6400' '$T'/q*.json | wc -l | grep -qx 1"

# SIGTERM with a request running: health 503, new requests 503, the stream
# completes, exit 0. The checks follow the first token; the stream has 7680
# decode steps to go while they run.
curl -s -N -m 300 "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 480, "n": 16, "ignore_eos": true, "stream": true}' >"$T/drain.sse" &
cp=$!
wait_until 60 streaming "$T/drain.sse"
kill -TERM $SP
not_ready() { hc=$(code "$URL/health"); [ "$hc" != 200 ]; }
wait_until 30 not_ready
nc=$(code "$URL/v1/completions" -d '{"prompt": "a"}')
wait $cp
wait $SP; RC=$?
check "draining: /health says 503" [ "$hc" = 503 ]
check "draining: a new request gets 503" [ "$nc" = 503 ]
check "draining: the running stream completes with [DONE]" sh -c "grep -q 'data: \[DONE\]' '$T/drain.sse' && [ \$(grep -c token_ids '$T/drain.sse') = 7680 ]"
check "draining: the server exits 0" [ "$RC" = 0 ]

# a drain timeout cuts a long request and still exits 0. The server is
# stopped (SIGSTOP) for 0.5 s once it is draining: when it goes on, its 0.3 s
# are over and the request (n: 16 x 500 tokens) cannot have ended, however
# fast this machine generates.
start --drain-timeout 0.3
curl -s -N -m 300 "$URL/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 500, "n": 16, "ignore_eos": true, "stream": true}' >"$T/cutd.sse" &
cp=$!
wait_until 60 streaming "$T/cutd.sse"
n0=$(grep -c 'SIGTERM: draining' "$T/server.log")
draining() { [ "$(grep -c 'SIGTERM: draining' "$T/server.log")" -gt "$n0" ]; }
t0=$(date +%s%N)
kill -TERM $SP
wait_until 60 draining
kill -STOP $SP; sleep 0.5; kill -CONT $SP
wait $SP; RC=$?; t1=$(date +%s%N)
wait $cp
diag "SIGTERM to exit with --drain-timeout 0.3 (0.5 s of it stopped): $(( (t1 - t0) / 1000000 )) ms"
got=$(grep -c token_ids "$T/cutd.sse")
check "--drain-timeout: exit 0, the running request cut short ($got of 8000 tokens) and cancelled" \
	sh -c "[ '$RC' = 0 ] && [ '$got' -lt 8000 ] && grep -q 'requests still running after the drain; cancelled' '$T/server.log'"
tap_done
