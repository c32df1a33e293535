# tests/cli/serve_api.sh: llm-serve's endpoints beside generation
# (common/serve/server_api.c): /tokenize and /detokenize in vLLM's shapes against
# llm-generate's tokenizer modes, TGI's /info, the refusal of
# /v1/embeddings, and the metrics under vLLM's names: their values against
# the requests sent and the project's own counters, and every metric the
# Grafana dashboard (bench/grafana/llm-serve.json) queries present on a live
# server; then a server with --speculate ngram against the first one.
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then skip "llm-serve's API endpoints on stories260K" "no stories260K in \$LLM_TEST_MODELS"; tap_done; fi
M=$(stories)
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
llm-serve -m "$M" --port 0 --port-file "$T/port" -t 1 --chat-template tests/data/chat-template.jinja \
	--served-model-name 'stories "260K"' 2>"$T/server.log" & SP=$!
U=$(serve_url "$T/port")
post() { curl -s -m 60 -o "$T/$1.out" -w '%{http_code}' "$U$2" -H 'Content-Type: application/json' -d "$3"; }

# /tokenize: a prompt's ids as a completion runs them (BOS added), and the
# pieces; messages rendered by the template then tokenized without BOS
code=$(post tok /tokenize '{"prompt": "Once upon a time", "return_token_strs": true}')
want=$(printf 'Once upon a time' | llm-generate -m "$M" --tokenize | tr -d ' ')
check "/tokenize: the ids of llm-generate --tokenize, the count and the pieces" $PY -c "
import json, sys
r = json.load(open('$T/tok.out'))
assert '$code' == '200', r
assert r['tokens'] == $want and r['count'] == len(r['tokens']) and r['max_model_len'] == 512, r
assert r['token_strs'][0] == '<s>' and len(r['token_strs']) == r['count'], r"
code=$(post tokn /tokenize '{"prompt": "Once upon a time", "add_special_tokens": false}')
check "/tokenize add_special_tokens false: no BOS, token_strs null" $PY -c "
import json
r = json.load(open('$T/tokn.out'))
assert r['tokens'] == $want[1:] and r['token_strs'] is None, r"
chat='{"messages": [{"role": "user", "content": "Hello there"}]}'
code=$(post chat /tokenize "$chat")
tmpl=$(echo '{"messages": [{"role": "user", "content": "Hello there"}], "add_generation_prompt": true}' | llm-generate -m "$M" --apply-template --chat-template tests/data/chat-template.jinja |
	llm-generate -m "$M" --tokenize --no-special | tr -d ' ')
check "/tokenize messages: the chat template's prompt, tokenized without special tokens" $PY -c "
import json
r = json.load(open('$T/chat.out'))
assert '$code' == '200' and r['tokens'] == $tmpl, (r, $tmpl)"
code=$(post chatng /tokenize '{"messages": [{"role": "user", "content": "Hello there"}], "add_generation_prompt": false}')
check "/tokenize add_generation_prompt false: fewer tokens" $PY -c "
import json
r = json.load(open('$T/chatng.out'))
assert '$code' == '200' and len(r['tokens']) < len($tmpl) and r['tokens'] == $tmpl[:len(r['tokens'])], r"
code=$(post bad /tokenize '{"prompt": "x", "truncate_prompt_tokens": 3}')
check "/tokenize: a field not implemented is refused by name (400)" $PY -c "
import json
r = json.load(open('$T/bad.out'))
assert '$code' == '400' and r['error']['param'] == 'truncate_prompt_tokens', r"
code=$(post bad2 /tokenize '{"prompt": 7}')
check "/tokenize: a prompt that is not a string is a 400 naming prompt" $PY -c "
import json
r = json.load(open('$T/bad2.out'))
assert '$code' == '400' and r['error']['param'] == 'prompt', r"

# /detokenize: the inverse, special tokens kept; ids outside the vocabulary named
code=$(post detok /detokenize "{\"tokens\": $want}")
check "/detokenize: the ids of /tokenize give the text back (BOS kept)" $PY -c "
import json
r = json.load(open('$T/detok.out'))
assert '$code' == '200' and r['prompt'].endswith('Once upon a time') and r['prompt'].startswith('<s>'), r"
code=$(post detokb /detokenize '{"tokens": [1, 512]}')
check "/detokenize: an id outside the vocabulary is a 400 naming tokens[1]" $PY -c "
import json
r = json.load(open('$T/detokb.out'))
assert '$code' == '400' and r['error']['message'].startswith('tokens[1]') and r['error']['param'] == 'tokens', r"

# /info (TGI) and /v1/embeddings
code=$(curl -s -m 30 -o "$T/info.out" -w '%{http_code}' "$U/info")
check "/info: TGI's fields from the server's settings" $PY -c "
import json
r = json.load(open('$T/info.out'))
assert '$code' == '200' and r['model_id'] == 'stories \"260K\"' and r['max_total_tokens'] == 512, r
assert r['max_input_tokens'] == 511 and r['max_stop_sequences'] == 8 and r['model_device_type'] == 'cpu', r"
code=$(post emb /v1/embeddings '{"input": "hello", "model": "x"}')
check "/v1/embeddings: refused with the reason (400)" $PY -c "
import json
r = json.load(open('$T/emb.out'))
assert '$code' == '400' and 'no embeddings' in r['error']['message'], r"

# metrics: 3 requests (2 of 4 tokens reaching max_tokens, one of 2 choices
# with a stop on the first token's text is not deterministic: length only)
post c1 /v1/completions '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}' >/dev/null
post c2 /v1/completions '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}' >/dev/null
post c3 /v1/completions '{"prompt": "The cat", "max_tokens": 3, "n": 2, "seed": 1}' >/dev/null
curl -s -m 30 "$U/metrics" >"$T/metrics"
check "metrics under vLLM's names agree with the requests and the project's counters" $PY - "$T/metrics" <<'PY'
import re, sys
v = {}
for line in open(sys.argv[1]):
    if line.startswith("#") or not line.strip():
        continue
    name, val = line.rsplit(" ", 1)
    m = re.match(r'([^{]+)(?:\{(.*)\})?$', name)
    labels = frozenset(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', m.group(2) or ""))
    v[(m.group(1), labels)] = float(val)
    if not labels:
        v[m.group(1)] = float(val)
def g(n, **extra):
    return v[(n, frozenset(list(extra.items()) + [("model_name", 'stories \\"260K\\"')]))]
assert g("vllm:request_success_total", finished_reason="length") == 4, {k: x for k, x in v.items() if isinstance(k, tuple) and k[0].startswith('vllm') and 'bucket' not in k[0]}
assert g("vllm:generation_tokens_total") == v["llm_generation_tokens_total"] == 4 + 4 + 3 + 3, {k: x for k, x in v.items() if isinstance(k, tuple) and k[0].startswith('vllm') and 'bucket' not in k[0]}
assert g("vllm:prompt_tokens_total") == v["llm_prompt_tokens_total"], {k: x for k, x in v.items() if isinstance(k, tuple) and k[0].startswith('vllm') and 'bucket' not in k[0]}
assert g("vllm:time_to_first_token_seconds_count") == 4 and g("vllm:inter_token_latency_seconds_count") == 3 + 3 + 2 + 2, {k: x for k, x in v.items() if isinstance(k, tuple) and k[0].startswith('vllm') and 'bucket' not in k[0]}
assert g("vllm:e2e_request_latency_seconds_count") == 3 and g("vllm:request_prompt_tokens_count") == 3, {k: x for k, x in v.items() if isinstance(k, tuple) and k[0].startswith('vllm') and 'bucket' not in k[0]}
assert g("vllm:request_generation_tokens_count") == 4 and g("vllm:request_generation_tokens_sum") == 14, {k: x for k, x in v.items() if isinstance(k, tuple) and k[0].startswith('vllm') and 'bucket' not in k[0]}
assert g("vllm:request_generation_tokens_bucket", le="5") == 4 and g("vllm:request_generation_tokens_bucket", le="2") == 0, {k: x for k, x in v.items() if isinstance(k, tuple) and k[0].startswith('vllm') and 'bucket' not in k[0]}
assert g("vllm:request_decode_time_seconds_count") == 4 and g("vllm:request_prefill_time_seconds_count") == 4, {k: x for k, x in v.items() if isinstance(k, tuple) and k[0].startswith('vllm') and 'bucket' not in k[0]}
assert g("vllm:prefix_cache_hits_total") == v["llm_prefix_cache_hit_tokens_total"], {k: x for k, x in v.items() if isinstance(k, tuple) and k[0].startswith('vllm') and 'bucket' not in k[0]}
assert 0 <= g("vllm:kv_cache_usage_perc") <= 1 and g("vllm:num_requests_running") == 0, {k: x for k, x in v.items() if isinstance(k, tuple) and k[0].startswith('vllm') and 'bucket' not in k[0]}
PY
check "every metric the Grafana dashboard queries is on the live server" $PY - bench/grafana/llm-serve.json "$T/metrics" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
text = open(sys.argv[2]).read()
have = set(re.findall(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{| )", text, re.M))
words = {"sum", "by", "rate", "increase", "histogram_quantile", "le", "status", "finished_reason", "model_name"}
n = 0
assert d["panels"] and all(p.get("targets") for p in d["panels"]), "panels without queries"
for p in d["panels"]:
    for t in p["targets"]:
        for m in re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", re.sub(r'"[^"]*"|\$\w+|\[[^]]*\]', "", t["expr"])):
            if m in words or m.isdigit():
                continue
            n += 1
            assert m in have, "panel %r queries %s, not on the server" % (p["title"], m)
assert n >= 20, n
PY
# prompt log-probs: echo (completions), vLLM's prompt_logprobs, TGI's
# decoder_input_details; the numbers against llm-generate --score (another
# path through the scheduler: a context, then the continuation scored)
code=$(post echo /v1/completions '{"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0, "echo": true, "logprobs": 2, "prompt_logprobs": 3}')
post plain /v1/completions '{"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0}' >/dev/null
echo '{"context": "Once", "continuations": [" upon a time"]}' | llm-generate -m "$M" --score >"$T/score.out"
check "echo: the prompt's text then the completion's; its tokens in the log-probs, the first null" $PY - "$T" "$code" "$want" <<'PY'
import json, sys
t, code, ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
e = json.load(open(t + "/echo.out"))["choices"][0]
p = json.load(open(t + "/plain.out"))["choices"][0]
assert code == "200" and e["text"] == "Once upon a time" + p["text"], (e["text"], p["text"])
lp = e["logprobs"]
n = len(ids)
assert len(lp["tokens"]) == n + 3 and lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None, lp
assert all(isinstance(x, float) and x <= 0 for x in lp["token_logprobs"][1:]), lp
assert lp["text_offset"] == sorted(lp["text_offset"]) and e["token_ids"] == p["token_ids"], lp
assert all(len(d) == 2 for d in lp["top_logprobs"][1:]), lp
# text_offset indexes the echoed text: where each token's text starts (BOS
# adds none; the first word's leading space is decode's to drop)
assert lp["text_offset"][:2] == [0, 0], lp
assert all(e["text"][o:].startswith(tk) for o, tk in list(zip(lp["text_offset"], lp["tokens"]))[2:]), lp
PY
check "echo and prompt_logprobs: the prompt's log-probs are those llm-generate --score gives; ranks and best tokens agree" \
	$PY - "$T" <<'PY'
import json, sys
t = sys.argv[1]
e = json.load(open(t + "/echo.out"))["choices"][0]
score = json.loads(open(t + "/score.out").read())
lp = e["logprobs"]["token_logprobs"]
got, want = sum(lp[2:5]), score["logprobs"][0]
assert abs(got - want) <= 1e-5 * abs(want), (got, want, score)
pl = e["prompt_logprobs"]
assert pl[0] is None and len(pl) == 5, pl
for i, d in enumerate(pl[1:], 1):
    tok = str(json.load(open(t + "/tok.out"))["tokens"][i])
    assert tok in d and abs(d[tok]["logprob"] - lp[i]) < 1e-6, (i, d)
    best = min(d.values(), key=lambda x: x["rank"])
    assert best["rank"] == 1 and all(x["logprob"] <= best["logprob"] for x in d.values()), d
    assert (d[tok]["rank"] == 1) == (max(e["logprobs"]["top_logprobs"][i].values()) == lp[i]), (d, i)
    assert len([k for k, x in d.items() if x["rank"] <= 3]) == 3, d
PY
curl -sN -m 60 "$U/v1/completions" -d '{"prompt": "Once upon a time", "max_tokens": 3, "temperature": 0, "echo": true, "logprobs": 2, "stream": true}' >"$T/echo.sse"
check "echo, streamed: the prompt's chunk first, the text the same as unstreamed" $PY - "$T" <<'PY'
import json, sys
t = sys.argv[1]
ev = [json.loads(l[6:]) for l in open(t + "/echo.sse") if l.startswith("data: {")]
e = json.load(open(t + "/echo.out"))["choices"][0]
first = ev[0]["choices"][0]
assert first["text"] == "Once upon a time" and first["logprobs"]["token_logprobs"][0] is None, first
assert "".join(x["choices"][0]["text"] for x in ev) == e["text"], ev
assert first["logprobs"]["token_logprobs"] == e["logprobs"]["token_logprobs"][:5], first
PY
code=$(post tgi /generate '{"inputs": "Once upon a time", "parameters": {"max_new_tokens": 2, "details": true, "decoder_input_details": true}}')
check "TGI decoder_input_details: details.prefill holds the prompt's ids and their log-probs, the first null" $PY - "$T" "$code" "$want" <<'PY'
import json, sys
t, code, ids = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
pre = json.load(open(t + "/tgi.out"))["details"]["prefill"]
e = json.load(open(t + "/echo.out"))["choices"][0]["logprobs"]["token_logprobs"]
assert code == "200" and [x["id"] for x in pre] == ids and pre[0]["logprob"] is None, pre
assert all(abs(x["logprob"] - y) < 1e-6 for x, y in zip(pre[1:], e[1:5])), (pre, e)
PY
code=$(curl -s -m 30 -o "$T/tgis.out" -w '%{http_code}' "$U/generate_stream" -d '{"inputs": "Once", "parameters": {"details": true, "decoder_input_details": true}}')
check "TGI decoder_input_details on /generate_stream: 400" sh -c "[ $code = 400 ] && grep -q decoder_input_details '$T/tgis.out'"
code=$(post echoc /v1/chat/completions '{"messages": [{"role": "user", "content": "hi"}], "echo": true}')
check "echo in chat: 400 naming it" sh -c "[ $code = 400 ] && grep -q '\"param\":\"echo\"' '$T/echoc.out'"

# best_of: 4 drawn (the same 4 as n 4 with that seed: choice c draws with
# seed + c), the 2 of highest cumulative log-prob returned, best first
post all4 /v1/completions '{"prompt": "Once upon a time", "max_tokens": 8, "n": 4, "seed": 7, "temperature": 1.5, "logprobs": 0}' >/dev/null
code=$(post best /v1/completions '{"prompt": "Once upon a time", "max_tokens": 8, "n": 2, "best_of": 4, "seed": 7, "temperature": 1.5}')
check "best_of 4, n 2: the 2 of highest cumulative log-prob among the 4, best first" $PY - "$T" "$code" <<'PY'
import json, sys
t, code = sys.argv[1], sys.argv[2]
a = json.load(open(t + "/all4.out"))["choices"]
b = json.load(open(t + "/best.out"))
cum = sorted(a, key=lambda c: -sum(c["logprobs"]["token_logprobs"]))
assert code == "200" and [c["text"] for c in b["choices"]] == [c["text"] for c in cum[:2]], (b, cum)
assert [c["index"] for c in b["choices"]] == [0, 1] and b["choices"][0]["logprobs"] is None, b
assert len({c["text"] for c in a}) > 1, "the 4 draws should differ at temperature 1.5"
assert b["usage"]["completion_tokens"] == sum(len(c["token_ids"]) for c in a), b["usage"]
PY
code=$(post bestbad /v1/completions '{"prompt": "Once", "n": 2, "best_of": 1}')
check "best_of below n: 400 naming best_of" sh -c "[ $code = 400 ] && grep -q '\"param\":\"best_of\"' '$T/bestbad.out'"
code=$(post bests /v1/completions '{"prompt": "Once", "best_of": 2, "stream": true}')
check "best_of > n with stream: 400" sh -c "[ $code = 400 ] && grep -q 'not with stream' '$T/bests.out'"

# speculative decoding: the same requests on a server with --speculate
# ngram give the same tokens (greedy and seeded sampling, 4 at once), and
# the drafts are counted under both names
reqs='{"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0}
{"prompt": "Tom had a red ball. Tom had a red ball. Tom", "max_tokens": 40, "temperature": 0}
{"prompt": "Lily and Tom", "max_tokens": 50, "n": 2, "seed": 3, "temperature": 0.8}
{"prompt": "The cat", "max_tokens": 30, "temperature": 0}'
specs() {   # PREFIX: the 4 requests at once, each to $T/PREFIX<i>.out
	echo "$reqs" | { i=0; while read -r r; do i=$((i + 1)); post "$1$i" /v1/completions "$r" >/dev/null & done; wait; }
}
specs plain
kill -TERM $SP; wait $SP
check "the server exits 0" [ $? = 0 ]
llm-serve -m "$M" --port 0 --port-file "$T/port2" -t 1 --speculate ngram --spec-tokens 4 --spec-ngram 3 \
	--served-model-name 'stories "260K"' 2>"$T/server2.log" & SP=$!
U=$(serve_url "$T/port2")
specs spec
curl -s -m 30 "$U/metrics" >"$T/metrics2"
check "--speculate ngram: the same tokens as without, greedy and seeded; drafts counted, as vLLM and llm_ names" $PY - "$T" <<'PY'
import json, re, sys
t = sys.argv[1]
for i in range(1, 5):
    a = [c["token_ids"] for c in json.load(open("%s/plain%d.out" % (t, i)))["choices"]]
    b = [c["token_ids"] for c in json.load(open("%s/spec%d.out" % (t, i)))["choices"]]
    assert a == b and a[0], (i, a, b)
m = dict(re.findall(r'^([a-z_:]+)(?:\{[^}]*\})? (\S+)$', open(t + "/metrics2").read(), re.M))
d, acc = float(m["vllm:spec_decode_num_draft_tokens_total"]), float(m["vllm:spec_decode_num_accepted_tokens_total"])
assert 0 < acc < d and d == float(m["llm_spec_draft_tokens_total"]) and acc == float(m["llm_spec_accepted_tokens_total"]), m
print("# %d of %d drafted tokens accepted" % (acc, d))
PY
llm-bench -q serve "$U" --requests 4 --concurrency 2 --input-len 16 --output-len 24 --format jsonl >"$T/bench.jsonl"
check "llm-bench serve reports the run's accepted share of drafts from /metrics" $PY -c "
import json
r = [json.loads(l) for l in open('$T/bench.jsonl') if l.startswith('{')]
assert len(r) == 1 and r[0]['wrong'] == 0 and 0 <= r[0]['spec_accept_pct'] <= 100, r"
check_fails "--speculate with an unknown mode is a usage error" 2 llm-serve -m "$M" --speculate lookahead
kill -TERM $SP; wait $SP
check "the speculating server exits 0" [ $? = 0 ]
# a draft model (stories260K's FP8 copy): greedy tokens as without, the
# sampled request its 2 choices in full (the rule keeps the distribution,
# not the seeded sequence), drafts counted
llm-quantize -q -b 1x32 "$M" "$T/fp8" 2>/dev/null
llm-serve -m "$M" --port 0 --port-file "$T/port3" -t 1 --speculate draft --draft "$T/fp8" --spec-tokens 4 \
	2>"$T/server3.log" & SP=$!
U=$(serve_url "$T/port3")
specs draft
curl -s -m 30 "$U/metrics" >"$T/metrics3"
check "--speculate draft: greedy tokens as without, sampled choices in full; drafts counted" $PY - "$T" <<'PY'
import json, re, sys
t = sys.argv[1]
for i in range(1, 5):
    a = [c["token_ids"] for c in json.load(open("%s/plain%d.out" % (t, i)))["choices"]]
    b = [c["token_ids"] for c in json.load(open("%s/draft%d.out" % (t, i)))["choices"]]
    assert (a == b if i != 3 else [len(x) for x in a] == [len(x) for x in b]) and a[0], (i, a, b)
m = dict(re.findall(r'^([a-z_:]+)(?:\{[^}]*\})? (\S+)$', open(t + "/metrics3").read(), re.M))
d, acc = float(m["llm_spec_draft_tokens_total"]), float(m["llm_spec_accepted_tokens_total"])
assert 0 < acc <= d and d == float(m["vllm:spec_decode_num_draft_tokens_total"]), m
print("# %d of %d drafted tokens accepted" % (acc, d))
PY
kill -TERM $SP; wait $SP
check "the draft-speculating server exits 0" [ $? = 0 ]
tap_done
