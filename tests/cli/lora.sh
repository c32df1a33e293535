# tests/cli/lora.sh: many LoRA adapters at once (issue 25 item 4) on
# stories260K with random PEFT adapters (tests/cli/lora_make.py): a batch
# mixing the base and two adapters gives each request exactly what it gives
# alone (ids and log-probs, bit for bit), the prefix cache never shares one
# adapter's KV with another, llm-serve's "model" / TGI "adapter_id", its
# /v1/models, runtime load and unload (refused without
# --allow-runtime-lora, an unload refused while a request uses the
# adapter), and one-line errors for adapters that do not fit.
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then skip "LoRA adapters on stories260K" "no stories260K in \$LLM_TEST_MODELS"; tap_done; fi
S=$(stories)
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
MK="$PY tests/cli/lora_make.py"
$MK "$S/config.json" "$T/a1" --rank 4 --seed 1 --alpha 0.5
$MK "$S/config.json" "$T/a2" --rank 8 --seed 2 --alpha 1 --targets q_proj,v_proj,down_proj
$MK configs/tiny-check.json "$T/other" --rank 4 --seed 3
$MK "$S/config.json" "$T/badr" --rank 4 --seed 4 --bad-rank

# llm-generate: 6 prompts x (no model: the first --lora; a1; b; the base), one batch
$PY -c "
import json
ps = ['Once upon a time', 'The dog', 'Tom and Sue went', 'A little bird', 'Lily was sad because', 'The sun']
with open('$T/mix.jsonl', 'w') as f:
    for p in ps:
        for m in (None, 'a1', 'b', 'stories260K'):
            d = {'prompt': p, 'max_tokens': 20, 'temperature': 0, 'logprobs': 3}
            if m:
                d['model'] = m
            f.write(json.dumps(d) + '\n')"
G="llm-generate -m $S --lora $T/a1 --lora b=$T/a2 --json"
$G --parallel 24 --prefix-cache 0 <"$T/mix.jsonl" >"$T/mix.json" 2>"$T/err"
: >"$T/alone.json"
while read -r l; do printf '%s\n' "$l" | $G --prefix-cache 0 >>"$T/alone.json" 2>>"$T/err"; done <"$T/mix.jsonl"
llm-generate -m "$S" --json --prefix-cache 0 <"$T/mix.jsonl" >"$T/base.json" 2>>"$T/err"
check "a batch of 24 mixing the base and two adapters: each request's ids and log-probs equal its run alone, bit for bit" $PY -c "
import json
a, b, base = ([json.loads(x) for x in open('$T/%s.json' % n)] for n in ('mix', 'alone', 'base'))
assert len(a) == len(b) == len(base) == 24, (len(a), len(b))
for i, (x, y) in enumerate(zip(a, b)):
    assert (x['ids'], x['logprobs'], x['top_logprobs']) == (y['ids'], y['logprobs'], y['top_logprobs']), i
# no model: the first adapter; 'stories260K': the base (as llm-generate without --lora)
for i in range(0, 24, 4):
    assert a[i]['ids'] == a[i + 1]['ids'] and a[i + 3]['ids'] == base[i + 3]['ids'], i
assert sum(a[i + 1]['ids'] != a[i + 3]['ids'] for i in range(0, 24, 4)) >= 4, 'a1 changed too little'
assert sum(a[i + 2]['logprobs'] != a[i + 3]['logprobs'] for i in range(0, 24, 4)) == 6, 'b changed nothing'
"
# the prefix cache: one long prompt under each adapter in turn, one at a
# time, so each later line finds the earlier lines' blocks cached
$PY -c "
import json
p = 'Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends.'
with open('$T/pc.jsonl', 'w') as f:
    for m in ('stories260K', 'a1', 'b', 'a1', 'stories260K'):
        f.write(json.dumps({'prompt': p, 'max_tokens': 8, 'temperature': 0, 'logprobs': 1, 'model': m}) + '\n')"
$G --parallel 1 --prefix-cache 4 -v <"$T/pc.jsonl" >"$T/pc.json" 2>"$T/pc.err"
$G --parallel 1 --prefix-cache 0 <"$T/pc.jsonl" >"$T/pc0.json" 2>>"$T/err"
check "prefix caching keyed by adapter: the same prompt under the base, a1, b gives what it gives without the cache" $PY -c "
import json, re
a, b = ([json.loads(x) for x in open('$T/%s.json' % n)] for n in ('pc', 'pc0'))
assert [(x['ids'], x['logprobs']) for x in a] == [(x['ids'], x['logprobs']) for x in b]
hit = int(re.search(r'(\d+) taken from the prefix cache', open('$T/pc.err').read()).group(1))
assert hit >= 2 * 16, hit   # the repeated a1 and base lines reuse their own blocks
"
check_fails "llm-generate: a line naming an unknown model is a runtime error naming it" 1 \
	sh -c "echo '{\"prompt\": \"hi\", \"model\": \"zz\"}' | $G"
grep -q "line 1: model: the model 'zz' does not exist" "$T/err" && ok "the error names the line and the model" ||
	notok "the error names the line and the model: $(cat "$T/err")"
check_fails "llm-generate: an adapter for another model shape is refused" 1 llm-generate -m "$S" --lora "$T/other" -p hi -n 1
grep -q "tensor '.*lora_A.weight': shape 4x352 does not fit the model" "$T/err" && ok "the error names the tensor" || notok "the error names the tensor: $(cat "$T/err")"
check_fails "llm-generate: an adapter whose tensors have another rank than its r is refused" 1 llm-generate -m "$S" --lora "$T/badr" -p hi -n 1
grep -q "lora_B.weight': shape 64x5 does not fit the model and rank r 4" "$T/err" && ok "the error names the tensor and the rank" ||
	notok "the error names the tensor and the rank: $(cat "$T/err")"
check_fails "llm-generate: two adapters of one name are refused" 1 llm-generate -m "$S" --lora "x=$T/a1" --lora "x=$T/a2" -p hi -n 1
check_fails "llm-generate: an empty adapter name is refused" 1 llm-generate -m "$S" --lora "=$T/a1" -p hi -n 1

# llm-serve without --allow-runtime-lora: requests without "model" run the base
llm-serve -m "$S" --lora "$T/a1" --port 0 --port-file "$T/port0" -t 1 2>"$T/serve0.log" & SP0=$!
U0=$(serve_url "$T/port0")
post() { curl -s -m 60 -o "$T/$1.out" -w '%{http_code}' "$2" -H 'Content-Type: application/json' -d "$3"; }
c1=$(post l0 "$U0/v1/load_lora_adapter" "{\"lora_name\": \"c\", \"lora_path\": \"$T/a2\"}")
c2=$(post u0 "$U0/v1/unload_lora_adapter" '{"lora_name": "a1"}')
c3=$(post d0 "$U0/v1/completions" '{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0}')
c4=$(post d1 "$U0/v1/completions" '{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0, "model": "a1"}')
kill -TERM $SP0 2>/dev/null
wait $SP0
check "without --allow-runtime-lora: load and unload are 403 saying why" $PY -c "
import json
for c, n in (('$c1', 'l0'), ('$c2', 'u0')):
    e = json.load(open('$T/%s.out' % n))['error']
    assert c == '403' and '--allow-runtime-lora' in e['message'], (c, e)"
check "a request without model runs the base; model a1 the adapter (as llm-generate)" $PY -c "
import json
m = [json.loads(x) for x in open('$T/mix.json')]
d0, d1 = (json.load(open('$T/%s.out' % n)) for n in ('d0', 'd1'))
assert '$c3' == '200' and '$c4' == '200'
assert d0['choices'][0]['token_ids'] == m[3]['ids'] and d0['model'] == 'stories260K', d0
assert d1['choices'][0]['token_ids'] == m[1]['ids'] and d1['model'] == 'a1', d1"

# llm-serve with two adapters and runtime loading
llm-serve -m "$S" --lora "$T/a1" --lora "b=$T/a2" --allow-runtime-lora --port 0 --port-file "$T/port" -t 1 \
	--max-running 24 --max-logprob-entries 200000 2>"$T/serve.log" & SP=$!
U=$(serve_url "$T/port")
code=$(curl -s -m 60 -o "$T/models.out" -w '%{http_code}' "$U/v1/models")
check "/v1/models: the base, then each adapter with parent the base and root its directory" $PY -c "
import json
d = json.load(open('$T/models.out'))['data']
assert '$code' == '200' and [m['id'] for m in d] == ['stories260K', 'a1', 'b'], d
assert d[0]['parent'] is None and all(m['parent'] == 'stories260K' for m in d[1:]), d
assert d[1]['root'] == '$T/a1' and d[2]['root'] == '$T/a2', d"
# the 24 requests at once (OpenAI completions, each its own connection)
i=0 pids=
while read -r l; do
	curl -s -m 120 -o "$T/r$i.out" "$U/v1/completions" -H 'Content-Type: application/json' \
		-d "$(printf '%s' "$l" | $PY -c 'import json,sys; d=json.load(sys.stdin); d.setdefault("model","a1"); print(json.dumps(d))')" &
	pids="$pids $!" i=$((i + 1))
done <"$T/mix.jsonl"
wait $pids
check "llm-serve: 24 concurrent requests over the base and two adapters equal llm-generate's, ids and log-probs" $PY -c "
import json
m = [json.loads(x) for x in open('$T/mix.json')]
for i in range(24):
    r = json.load(open('$T/r%d.out' % i))
    c = r['choices'][0]
    assert c['token_ids'] == m[i]['ids'] and c['logprobs']['token_logprobs'] == m[i]['logprobs'], i
    assert r['model'] == ['a1', 'a1', 'b', 'stories260K'][i % 4], r['model']"
code=$(post zz "$U/v1/completions" '{"prompt": "hi", "max_tokens": 2, "model": "zz"}')
check "an unknown model is 404 naming it and listing the adapters" $PY -c "
import json
e = json.load(open('$T/zz.out'))['error']
assert '$code' == '404' and e['param'] == 'model' and \"'zz'\" in e['message'] and \"'a1', 'b'\" in e['message'], e"
code=$(post tgi "$U/generate" '{"inputs": "Once upon a time", "parameters": {"max_new_tokens": 20, "adapter_id": "b", "decoder_input_details": false}}')
code2=$(post tgi2 "$U/generate" '{"inputs": "hi", "parameters": {"adapter_id": "q"}}')
check "TGI adapter_id picks an adapter; an unknown one is 404" $PY -c "
import json
m = [json.loads(x) for x in open('$T/mix.json')]
assert '$code' == '200' and json.load(open('$T/tgi.out'))['generated_text'] == m[2]['text']
assert '$code2' == '404' and \"'q'\" in json.load(open('$T/tgi2.out'))['error']"
# runtime loading: bad adapters refused in one line, then c loaded, used, unloaded
for x in "other:lora_A.weight': shape 4x352 does not fit the model" "badr:shape 64x5 does not fit the model and rank r 4" "nope:adapter_config.json"; do
	code=$(post bad "$U/v1/load_lora_adapter" "{\"lora_name\": \"c\", \"lora_path\": \"$T/${x%%:*}\"}")
	check "load of $T/${x%%:*}: 400, one line saying what is wrong" $PY -c "
import json, re
e = json.load(open('$T/bad.out'))['error']
assert '$code' == '400' and re.search(r\"\"\"${x#*:}\"\"\", e['message']) and '\n' not in e['message'], e"
done
code=$(post dup "$U/v1/load_lora_adapter" "{\"lora_name\": \"b\", \"lora_path\": \"$T/a1\"}")
check "load under a name in use is 400" test "$code" = 400
code=$(post nopath "$U/v1/load_lora_adapter" '{"lora_name": "c"}')
check "load without lora_path is 400 naming it" sh -c "[ '$code' = 400 ] && grep -q '\"param\":\"lora_path\"' '$T/nopath.out'"
code=$(post load "$U/v1/load_lora_adapter" "{\"lora_name\": \"c\", \"lora_path\": \"$T/a2\"}")
check "load: 200" sh -c "[ '$code' = 200 ] && grep -q \"LoRA adapter 'c' added\" '$T/load.out'"
curl -s -m 60 "$U/v1/models" >"$T/models2.out"
LONG='Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends.'
post cl "$U/v1/completions" "{\"prompt\": \"$LONG\", \"max_tokens\": 8, \"temperature\": 0, \"model\": \"c\"}" >/dev/null
code=$(post c "$U/v1/completions" '{"prompt": "Once upon a time", "max_tokens": 20, "temperature": 0, "logprobs": 1, "model": "c"}')
check "a loaded adapter is listed and runs as the same files at start (b)" $PY -c "
import json
m = [json.loads(x) for x in open('$T/mix.json')]
assert [x['id'] for x in json.load(open('$T/models2.out'))['data']] == ['stories260K', 'a1', 'b', 'c']
c = json.load(open('$T/c.out'))['choices'][0]
assert '$code' == '200' and c['token_ids'] == m[2]['ids'] and c['logprobs']['token_logprobs'] == m[2]['logprobs']"
# an unload while a request uses c: the stream below (16 choices of 480
# tokens with 20 log-probs each, megabytes) cannot end while its client
# reads nothing, so its job holds c (it is more log-prob entries than the
# default --max-logprob-entries: the server above allows 200000)
$PY - "$T/port" >"$T/hold.log" 2>&1 <<'EOF' & HP=$!
import socket, sys, time, json
port = int(open(sys.argv[1]).read())
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
s.connect(('127.0.0.1', port))
b = json.dumps({'prompt': 'Once upon a time', 'max_tokens': 480, 'ignore_eos': True, 'n': 16, 'temperature': 1,
                'logprobs': 20, 'stream': True, 'model': 'c'}).encode()
s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n' % len(b) + b)
print(s.recv(12).decode(), flush=True)   # the status line: the job is queued
sys.stdin = open('/dev/null')
time.sleep(600)                           # killed by the test
EOF
wait_until 60 grep -q 'HTTP/1.1 200' "$T/hold.log"
code=$(post busy "$U/v1/unload_lora_adapter" '{"lora_name": "c"}')
check "unload while a request uses the adapter: 409 saying so" $PY -c "
import json
e = json.load(open('$T/busy.out'))['error']
assert '$code' == '409' and 'in use by 1 request' in e['message'], ('$code', e)"
kill $HP 2>/dev/null
wait $HP 2>/dev/null
unload_ok() { [ "$(post unl "$U/v1/unload_lora_adapter" '{"lora_name": "c"}')" = 200 ]; }
check "once that request is gone, the unload succeeds" wait_until 60 unload_ok
code=$(post gone "$U/v1/completions" '{"prompt": "hi", "max_tokens": 2, "model": "c"}')
code2=$(post unl2 "$U/v1/unload_lora_adapter" '{"lora_name": "c"}')
curl -s -m 60 "$U/v1/models" >"$T/models3.out"
check "after the unload: c is 404 for requests and unloads, and gone from /v1/models" $PY -c "
import json
assert '$code' == '404' and '$code2' == '404', ('$code', '$code2')
assert [x['id'] for x in json.load(open('$T/models3.out'))['data']] == ['stories260K', 'a1', 'b']"
code=$(post reload "$U/v1/load_lora_adapter" "{\"lora_name\": \"c\", \"lora_path\": \"$T/a1\"}")
code2=$(post c2 "$U/v1/completions" "{\"prompt\": \"$LONG\", \"max_tokens\": 8, \"temperature\": 0, \"model\": \"c\"}")
check "a name loaded again with other files runs them, not the old files' cached prefix" $PY -c "
import json
a1, a2 = ([json.loads(x) for x in open('$T/pc0.json')][i]['ids'] for i in (1, 2))
assert '$code' == '200' and '$code2' == '200' and a1 != a2
assert json.load(open('$T/cl.out'))['choices'][0]['token_ids'] == a2
assert json.load(open('$T/c2.out'))['choices'][0]['token_ids'] == a1"
kill -TERM $SP 2>/dev/null
wait $SP
llm-serve -m "$S" --lora "$T/other" --port 0 2>"$T/err"; rc=$?
check "llm-serve: --lora of another model shape fails to start (exit 1) naming the tensor" sh -c \
	"[ $rc = 1 ] && tail -1 '$T/err' | grep -q \"^llm-serve: adapter 'other': .*lora_A.weight': shape 4x352 does not fit\""
tap_done
