# tests/cli/generate.sh: llm-generate's generation modes on the real
# stories260K model, against the independent reference outputs
# ($LLM_TEST_REF/stories260K: llama2.c run.c, matched by llama.cpp).
. tests/lib/tap.sh
T=$TMPD
# the reference comparisons run an f32 KV cache; the default (bf16) rounds
# keys and values to 8 mantissa bits and is held to its own bounds below
G="llm-generate --kv-dtype f32"
if ! have_stories || [ ! -f "$LLM_TEST_REF/stories260K/greedy.jsonl" ]; then
	skip "llm-generate on stories260K" "no stories260K model or reference in \$LLM_TEST_MODELS / \$LLM_TEST_REF"
	tap_done
fi
M=$(stories)
REF=$LLM_TEST_REF/stories260K/greedy.jsonl

# the reference's prompts, as ids and as text, greedy, all in one batch
python3 - "$REF" "$T" <<'PY'
import json, sys
ref, t = sys.argv[1], sys.argv[2]
with open(t + "/ids.jsonl", "w") as a, open(t + "/text.jsonl", "w") as b:
    for l in open(ref):
        r = json.loads(l)
        a.write(json.dumps({"prompt_ids": r["prompt_ids"], "max_tokens": r["n"], "temperature": 0}) + "\n")
        b.write(json.dumps({"prompt": r["prompt"], "max_tokens": r["n"], "temperature": 0}) + "\n")
PY
$G -m "$M" --json --logprobs 1 --parallel 8 <"$T/ids.jsonl" >"$T/out-ids.jsonl"
check "30 prompt_ids prompts generated together, one JSON line each" [ "$(wc -l <"$T/out-ids.jsonl")" = 30 ]
compare() {   # the reference rule: ids equal up to the first margin < 1e-3, log-probs within 1e-4
python3 - "$REF" "$1" <<'PY'
import json, sys
refs = [json.loads(l) for l in open(sys.argv[1])]
outs = [json.loads(l) for l in open(sys.argv[2])]
bad = 0; worst = 0.0; full = 0
for r, o in zip(refs, outs):
    n = next((i for i, m in enumerate(r["margins"]) if m < 1e-3), r["n"])
    if o["ids"][:n] != r["ids"][:n]:
        bad += 1; print("# %s: ids differ before position %d" % (r["id"], n)); continue
    full += n == r["n"]
    if "logprobs" in o:
        worst = max([worst] + [abs(a - b) for a, b in zip(o["logprobs"][:n], r["logprobs"][:n])])
    if o["prompt_ids"] != r["prompt_ids"]:
        bad += 1; print("# %s: prompt ids differ" % r["id"])
print("# %d/%d prompts compared in full, max |dlogprob| %.2e" % (full, len(refs), worst))
sys.exit(1 if bad or worst > 1e-4 or len(outs) != len(refs) else 0)
PY
}
check "greedy ids from prompt_ids equal run.c's, log-probs within 1e-4" compare "$T/out-ids.jsonl"
$G -m "$M" --json <"$T/text.jsonl" >"$T/out-text.jsonl"
check "greedy ids from the prompt text equal run.c's (tokenizer included)" compare "$T/out-text.jsonl"
# the text is the continuation's, decode(prompt + ids) - decode(prompt), as
# run.c prints it: a first token's leading space kept (" were" after "Lily and Tom")
check "the text of every prompt generated in full equals run.c's continuation, leading space kept" python3 - "$REF" "$T/out-text.jsonl" <<'PY'
import json, sys
refs = [json.loads(l) for l in open(sys.argv[1])]
outs = [json.loads(l) for l in open(sys.argv[2])]
same = [(r, o) for r, o in zip(refs, outs) if o["ids"] == r["ids"]]
bad = [(r["id"], o["text"][:40], r["text"][:40]) for r, o in same if o["text"] != r["text"]]
spaced = sum(1 for r, o in same if r["prompt"] and o["text"].startswith(" "))
print("# %d prompts in full, %d start with a space" % (len(same), spaced))
assert len(same) >= 20 and spaced >= 10 and not bad, bad
PY
$G -m "$M" --json --parallel 1 <"$T/ids.jsonl" >"$T/out-one.jsonl"
check "batch invariance: one at a time gives the same ids as all together" python3 -c "
import json,sys
a=[json.loads(l)['ids'] for l in open('$T/out-ids.jsonl')]; b=[json.loads(l)['ids'] for l in open('$T/out-one.jsonl')]
sys.exit(a!=b)"
# speculative decoding (prompt lookup): the same ids and log-probs as
# without, digit for digit, in a batch of 8 and one at a time; -v counts
# the drafts; seeded sampling gives the same tokens too (spec.h)
for par in 8 1; do
	$G -m "$M" --json --logprobs 1 --parallel $par --speculate ngram --spec-tokens 4 --spec-ngram 3 -v \
		<"$T/ids.jsonl" >"$T/out-spec$par.jsonl" 2>"$T/spec$par.err"
	check "--speculate ngram, --parallel $par: the reference ids and log-probs, digit for digit" python3 -c "
import json,sys
k=lambda f: [(o['ids'], o['logprobs'], o['top_logprobs']) for o in map(json.loads, open(f))]
sys.exit(k('$T/out-ids.jsonl') != k('$T/out-spec$par.jsonl'))"
	check "--speculate ngram -v, --parallel $par: drafted tokens accepted ($(grep -o '[0-9]* of [0-9]* drafted tokens accepted[^;]*' "$T/spec$par.err" | head -1))" \
		grep -q ' [1-9][0-9]* of [0-9]* drafted tokens accepted' "$T/spec$par.err"
done
a=$($G -m "$M" -p "Once upon a time" -n 60 --temp 0.9 --seed 7 --json)
b=$($G -m "$M" -p "Once upon a time" -n 60 --temp 0.9 --seed 7 --json --speculate ngram --spec-tokens 6)
check "seeded sampling with --speculate ngram gives the same tokens and text as without" python3 -c "
import json, sys; a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert len(a['ids']) == 60 and (a['ids'], a['text']) == (b['ids'], b['text']), (a, b)" "$a" "$b"
check_fails "a bad --speculate is a usage error naming the flag" 2 $G -m "$M" -p hi --speculate eagle
grep -q -- "--speculate: 'eagle'" "$T/err" && ok "the error names --speculate" || notok "the error names --speculate"
# draft-model speculation (spec.h): stories260K's FP8 copy (and the f32
# model itself) drafts; greedy ids and log-probs equal plain decoding's,
# digit for digit, in a batch of 8 and one at a time
llm-quantize -q -b 1x32 "$M" "$T/fp8" 2>/dev/null
for d in fp8 f32; do
	dm=$T/fp8; [ $d = f32 ] && dm=$M
	for par in 8 1; do
		$G -m "$M" --json --logprobs 1 --parallel $par --speculate draft --draft "$dm" --spec-tokens 4 -v \
			<"$T/ids.jsonl" >"$T/out-draft$d$par.jsonl" 2>"$T/draft$d$par.err"
		check "--speculate draft ($d draft), --parallel $par: the reference ids and log-probs, digit for digit" python3 -c "
import json,sys
k=lambda f: [(o['ids'], o['logprobs'], o['top_logprobs']) for o in map(json.loads, open(f))]
sys.exit(k('$T/out-ids.jsonl') != k('$T/out-draft$d$par.jsonl'))"
		acc=$(grep -o '([0-9.]*%)' "$T/draft$d$par.err" | tr -d '()%')
		check "--speculate draft ($d draft), --parallel $par -v: acceptance ${acc}% ($d: over 99% for the model itself, 50% for FP8)" \
			python3 -c "import sys; sys.exit(not float('$acc' or 0) > (99 if '$d' == 'f32' else 50))"
	done
done
b=$($G -m "$M" -p "Once upon a time" -n 60 --temp 0.9 --seed 7 --json --speculate draft --draft "$T/fp8")
check "sampling with --speculate draft: 60 tokens and their text" python3 -c "
import json, sys; b = json.loads(sys.argv[1]); assert len(b['ids']) == 60 and b['text'], b" "$b"
check_fails "--speculate draft without --draft is a usage error" 2 $G -m "$M" -p hi --speculate draft
grep -q -- "--speculate draft needs --draft DIR" "$T/err" && ok "the error says --draft DIR" || notok "the error says --draft DIR"
check_fails "--draft without --speculate draft is a usage error" 2 $G -m "$M" -p hi --draft "$T/fp8"
check_fails "--spec-tokens without --speculate is a usage error, as --draft is" 2 $G -m "$M" -p hi --spec-tokens 2
grep -q -- "--spec-tokens goes with --speculate" "$T/err" && ok "the error names --spec-tokens" || notok "the error names --spec-tokens"
check_fails "--spec-ngram without --speculate is a usage error" 2 $G -m "$M" -p hi --spec-ngram 2
check_fails "--spec-ngram with --speculate draft (nothing to match) is a usage error" 2 $G -m "$M" -p hi --speculate draft --draft "$M" --spec-ngram 2
$G -m "$M" --json --logprobs 1 --kv-dtype bf16 <"$T/ids.jsonl" >"$T/out-bf16.jsonl"
check "--kv-dtype bf16 runs" [ "$(wc -l <"$T/out-bf16.jsonl")" = 30 ]
llm-generate -m "$M" --json --logprobs 1 <"$T/ids.jsonl" >"$T/out-default.jsonl"
check "the default KV cache is bf16: the same ids, log-probs and text as --kv-dtype bf16" python3 -c "
import json,sys
k=lambda f: [(o['ids'], o['logprobs'], o['text']) for o in map(json.loads, open(f))]
sys.exit(k('$T/out-default.jsonl') != k('$T/out-bf16.jsonl'))"
# bf16 keys and values move log-probs by hundredths on this small model
# (d_head 8): greedy answers part from run.c's where its top two are close
check "the default (bf16 KV) against run.c: ids equal up to the first margin < 0.1, log-probs within 0.1 there" python3 - "$REF" "$T/out-default.jsonl" <<'PY'
import json, sys
refs = [json.loads(l) for l in open(sys.argv[1])]
outs = [json.loads(l) for l in open(sys.argv[2])]
assert len(refs) == len(outs) == 30
worst = 0.0; full = 0
for r, o in zip(refs, outs):
    n = next((i for i, m in enumerate(r["margins"]) if m < 0.1), r["n"])
    assert o["ids"][:n] == r["ids"][:n], (r["id"], n)
    full += o["ids"] == r["ids"]
    worst = max([worst] + [abs(a - b) for a, b in zip(o["logprobs"][:n], r["logprobs"][:n])])
print("# %d/30 answers equal run.c's in full, max |dlogprob| %.3f before the first margin < 0.1" % (full, worst))
assert worst <= 0.1 and full >= 10, (worst, full)
PY
$G -m "$M" --json --kv-dtype fp8 <"$T/ids.jsonl" >"$T/out-fp8.jsonl"
$G -m "$M" --json --kv-dtype fp8 --parallel 1 <"$T/ids.jsonl" >"$T/out-fp8-one.jsonl"
check "--kv-dtype fp8: 30 answers, one at a time the same ids as all together" python3 -c "
import json,sys
a=[json.loads(l)['ids'] for l in open('$T/out-fp8.jsonl')]; b=[json.loads(l)['ids'] for l in open('$T/out-fp8-one.jsonl')]
sys.exit(len(a) != 30 or a != b)"
check_fails "--kv-dtype fp4 is a usage error listing f32, bf16 and fp8" 2 $G -m "$M" -p hi --kv-dtype fp4
grep -q -- "--kv-dtype: 'fp4' is not f32, bf16 or fp8" "$T/err" && ok "the error names --kv-dtype and the types" || notok "the error names --kv-dtype and the types"
for wp in map huge; do
	$G -m "$M" --json --logprobs 1 --parallel 8 --weight-pages $wp <"$T/ids.jsonl" >"$T/out-$wp.jsonl"
	check "--weight-pages $wp: the same ids and log-probs as the default, digit for digit" python3 -c "
import json,sys
k=lambda f: [(o['ids'], o['logprobs'], o['top_logprobs']) for o in map(json.loads, open(f))]
sys.exit(k('$T/out-ids.jsonl') != k('$T/out-$wp.jsonl'))"
done
check_fails "a bad --weight-pages is a usage error, naming the flag (as in llm-serve)" 2 $G -m "$M" -p hi --weight-pages big
grep -q -- "--weight-pages: 'big'" "$T/err" && ok "the error names --weight-pages" || notok "the error names --weight-pages"

# one prompt streams to stdout; --json gives the same object
p=$(python3 -c "import json; print(json.loads(open('$REF').readline() if False else open('$REF').readlines()[1])['prompt'])")
want=$(python3 -c "import json; print(json.loads(open('$REF').readlines()[1])['text'])")
got=$($G -m "$M" -p "$p" -n "$(python3 -c "import json; print(json.loads(open('$REF').readlines()[1])['n'])")" --temp 0)
check "-p streams the greedy continuation to stdout" [ "$got" = "$want" ]
got=$($G -m "$M" -p "Once" -n 8 --temp 0)
check "-p Once streams ' upon ...' (\"$got\"), as the reference's whole decode from BOS reads after 'Once'" python3 -c "
import json, sys; t = json.loads(open('$REF').readline())['text']
assert sys.argv[1].startswith(' upon') and t.startswith('Once' + sys.argv[1]), (sys.argv[1], t[:60])" "$got"
stdout=$(python3 -c "import json; print(json.loads(open('$REF').readlines()[1])['stdout'], end='')")
got=$($G -m "$M" -p "$p" -n "$(python3 -c "import json; print(json.loads(open('$REF').readlines()[1])['n'])")" --temp 0 -e)
check "--echo prints the prompt, then the continuation: run.c's stdout" [ "$got" = "$stdout" ]
a=$($G -m "$M" -p Once -n 8 --temp 0 --json)
b=$($G -m "$M" -p Once -n 8 --temp 0 --json -e)
check "-e --json: the text is the prompt's, then the same continuation" python3 -c "
import json, sys; a, b = json.loads(sys.argv[1]), json.loads(sys.argv[2])
assert a['text'].startswith(' upon') and b['text'] == 'Once' + a['text'] and a['ids'] == b['ids'], (a, b)" "$a" "$b"
check "--json with -p writes one object" sh -c "$G -m '$M' -p '$p' -n 5 --temp 0 --json | python3 -c 'import json,sys; o=json.load(sys.stdin); assert len(o[\"ids\"])==5 and o[\"finish_reason\"]==\"length\"'"

# sampling: seeded runs repeat, other seeds differ; stop strings
a=$($G -m "$M" -p "Once upon a time" -n 30 --temp 1 --seed 5)
b=$($G -m "$M" -p "Once upon a time" -n 30 --temp 1 --seed 5)
c=$($G -m "$M" -p "Once upon a time" -n 30 --temp 1 --seed 6)
check "the same seed gives the same sample" [ "$a" = "$b" ]
check "another seed gives another sample" [ "$a" != "$c" ]
out=$($G -m "$M" -p "Once upon a time" -n 60 --temp 0 --json --stop "Lily")
check "--stop ends at the stop string, finish_reason stop" sh -c "echo '$out' | python3 -c 'import json,sys; o=json.load(sys.stdin); assert o[\"finish_reason\"]==\"stop\" and \"Lily\" not in o[\"text\"], o'"
printf '%s\n' '{"prompt": "Once upon a time", "max_tokens": 30, "temperature": 0, "stop": ["Lily"], "min_tokens": 20}' |
	$G -m "$M" --json >"$T/mt.json"
check "a JSONL min_tokens: the stop string in the first 20 tokens does not stop it" python3 -c "
import json; o = json.load(open('$T/mt.json'))
assert o['text'].startswith(', there was a little girl named Lily') and len(o['ids']) >= 20, o"
check_fails "a JSONL min_tokens above max_tokens is a runtime error naming the line" 1 sh -c \
	"printf '%s\\n' '{\"prompt\": \"a\", \"max_tokens\": 3, \"min_tokens\": 4}' | $G -m '$M' --json"
out=$($G -m "$M" -p "Once upon a time" -n 30 --temp 0 --json --stop "Lily" --min-tokens 20)
check "--min-tokens: the stop string in the first 20 tokens does not stop it" sh -c "echo '$out' | python3 -c 'import json,sys; o=json.load(sys.stdin); assert len(o[\"ids\"]) >= 20 and \"Lily\" in o[\"text\"], o'"
# logit biases: greedy's first token is 432 (",")
out=$($G -m "$M" -p "Once upon a time" -n 12 --temp 0 --json --logit-bias 432=-100)
check "--logit-bias ID=-100 bans the token greedy chose" sh -c "echo '$out' | python3 -c 'import json,sys; o=json.load(sys.stdin); assert 432 not in o[\"ids\"] and len(o[\"ids\"]) == 12, o'"
out=$($G -m "$M" -p "Once upon a time" -n 6 --temp 0.8 --seed 3 --json --logit-bias 298=100 --logit-bias 5=-1.5)
check "--logit-bias ID=100 (repeatable) makes the token certain, sampled too" sh -c "echo '$out' | python3 -c 'import json,sys; o=json.load(sys.stdin); assert o[\"ids\"] == [298] * 6, o'"
printf '%s\n' '{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "logit_bias": {"432": -100, "383": -100}}' \
	'{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0}' \
	'{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "stop_token_ids": [376]}' \
	'{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "stop_token_ids": [376], "min_tokens": 6}' |
	$G -m "$M" --json --logit-bias 432=100 >"$T/lb.jsonl"
check "JSONL logit_bias, stop_token_ids: per line, a line's bias replacing the flag's" python3 -c "
import json; o = [json.loads(l) for l in open('$T/lb.jsonl')]
assert 432 not in o[0]['ids'] and 383 not in o[0]['ids'] and len(o[0]['ids']) == 12, o[0]
assert o[1]['ids'] == [432] * 12, o[1]
assert o[2]['ids'] == [432] * 12 and o[2]['finish_reason'] == 'length', o[2]"
printf '%s\n' '{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "stop_token_ids": [376]}' \
	'{"prompt": "Once upon a time", "max_tokens": 12, "temperature": 0, "stop_token_ids": [376], "min_tokens": 6}' |
	$G -m "$M" --json >"$T/si.jsonl"
check "JSONL stop_token_ids ends at the id (finish stop), held back by min_tokens" python3 -c "
import json; o = [json.loads(l) for l in open('$T/si.jsonl')]
assert o[0]['ids'] == [432, 383, 286, 261, 376] and o[0]['finish_reason'] == 'stop' and o[0]['text'] == ', there was a', o[0]
assert 376 not in o[1]['ids'][:6] and len(o[1]['ids']) >= 6, o[1]"
check_fails "--logit-bias without =BIAS is a usage error" 2 $G -m "$M" -p a --logit-bias 5
check_fails "--logit-bias outside [-100, 100] is a usage error" 2 $G -m "$M" -p a --logit-bias 5=101
check_fails "a JSONL logit_bias key that is not a token id is an error" 1 sh -c \
	"printf '%s\\n' '{\"prompt\": \"a\", \"logit_bias\": {\"x\": 1}}' | $G -m '$M'"
check "... naming the line and the field" sh -c \
	"printf '%s\\n' '{\"prompt\": \"a\", \"logit_bias\": {\"x\": 1}}' | $G -m '$M' 2>&1 | grep -q \"line 1: logit_bias: key 'x'\""
check_fails "a JSONL logit_bias on an id past the vocabulary is an error" 1 sh -c \
	"printf '%s\\n' '{\"prompt\": \"a\", \"logit_bias\": {\"512\": 1}}' | $G -m '$M'"
check_fails "a JSONL ignore_eos that is not a boolean is an error" 1 sh -c \
	"printf '%s\\n' '{\"prompt\": \"a\", \"ignore_eos\": 1}' | $G -m '$M'"
echo '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "stop": ["zzz"]}' >"$T/one.jsonl"
check "per-line max_tokens is obeyed" sh -c "$G -m '$M' --json <'$T/one.jsonl' | grep -q '\"finish_reason\":\"length\"'"

# scoring and perplexity
echo '{"context": "Once upon a time, there was a little", "continuations": [" girl", " potato sandwich"]}' >"$T/score.jsonl"
check "--score: the likely continuation scores higher" sh -c "$G -m '$M' --score <'$T/score.jsonl' | python3 -c 'import json,sys; o=json.load(sys.stdin); assert o[\"logprobs\"][0] > o[\"logprobs\"][1] and o[\"greedy\"][0], o'"
# --score runs every item through the scheduler at once: each context is
# computed once (its continuations fork its KV blocks), and the numbers are
# those of each item scored alone, digit for digit
printf '%s\n' '{"context": "Once upon a time", "continuations": [" there was", " the cat", " a dog"]}' '' \
	'{"context": "The little girl", "continuations": [" ran", " saw a big tree"]}' \
	'{"context": "Lily", "continuations": [" and"]}' >"$T/score3.jsonl"
$G -m "$M" --score -v <"$T/score3.jsonl" >"$T/sall.jsonl" 2>"$T/sall.err"
: >"$T/sone.jsonl"
grep . "$T/score3.jsonl" | while IFS= read -r l; do echo "$l" | $G -m "$M" --score >>"$T/sone.jsonl"; done
check "--score: items batched together score exactly as alone, in input order (index = line - 1)" python3 -c "
import json
a = [json.loads(l) for l in open('$T/sall.jsonl')]; b = [json.loads(l) for l in open('$T/sone.jsonl')]
assert [x['index'] for x in a] == [0, 2, 3], a
assert [(x['logprobs'], x['greedy'], x['tokens']) for x in a] == [(x['logprobs'], x['greedy'], x['tokens']) for x in b], (a, b)"
want=0
for c in "Once upon a time:3" "The little girl:2" "Lily:1"; do
	n=$(printf '%s' "${c%:*}" | $G -m "$M" --tokenize | python3 -c 'import json,sys; print(len(json.load(sys.stdin)))')
	want=$((want + (n - 1) * ${c##*:}))
done
got=$(sed -n 's/.* \([0-9]*\) taken from the prefix cache.*/\1/p' "$T/sall.err")
check "--score -v: every continuation forked its context instead of computing it ($got of $want context tokens)" [ "$got" = "$want" ]
python3 -c "import json; print(json.load(open('$LLM_TEST_REF/stories260K/perplexity.json'))['texts'][0].get('text',''), end='')" >"$T/story.txt"
if [ -s "$T/story.txt" ]; then
	$G -m "$M" --perplexity "$T/story.txt" -c 512 --json >"$T/ppl.json"
	check "--perplexity matches the reference NLL of the story within 1e-5 relative" python3 -c "
import json
ref=json.load(open('$LLM_TEST_REF/stories260K/perplexity.json'))['texts'][0]; o=json.load(open('$T/ppl.json'))
print('# nll %.6f ref %.6f tokens %d ref %d' % (o['nll'], ref['total_nll'], o['tokens'], ref['token_count']))
assert o['tokens']==ref['token_count'] and abs(o['nll']-ref['total_nll']) <= 1e-5*ref['total_nll']"
	llm-generate -m "$M" --perplexity "$T/story.txt" -c 512 --json >"$T/ppl-default.json"
	check "--perplexity with the default bf16 KV cache within 0.1% of the reference NLL" python3 -c "
import json
ref=json.load(open('$LLM_TEST_REF/stories260K/perplexity.json'))['texts'][0]; o=json.load(open('$T/ppl-default.json'))
print('# nll %.6f ref %.6f (%+.3f%%)' % (o['nll'], ref['total_nll'], 100 * (o['nll'] / ref['total_nll'] - 1)))
assert o['tokens']==ref['token_count'] and abs(o['nll']-ref['total_nll']) <= 1e-3*ref['total_nll']"
else
	skip "--perplexity against the reference" "perplexity.json has no inline text"
fi

# a model vocabulary padded past its tokenizer's (random 1024-id model, the
# 512-piece stories tokenizer): ids the tokenizer lacks are reported and add
# no text, as Hugging Face's decode drops them; they do not end the request
python3 -c "
import json; c = json.load(open('configs/tiny-check.json')); c.update(vocab_size=1024)
json.dump(c, open('$T/padded.json', 'w'))"
llm-quantize -q --random "$T/padded.json" --seed 3 --tokenizer "$M" "$T/padded" 2>/dev/null
check_fails "--draft with another vocabulary: an error naming both sizes" 1 $G -m "$M" -p hi --speculate draft --draft "$T/padded"
grep -q "n_vocab 1024 differs from the model's 512" "$T/err" && ok "the error names the draft and both n_vocab" || notok "the error names the draft and both n_vocab"
$G -m "$T/padded" --json -n 48 --temp 0 -p "Once upon a time" >"$T/padded.jsonl" 2>"$T/padded.err"
check "padded vocabulary: ids past the tokenizer's add no text (exit 0, all 48 tokens)" python3 - "$T/padded.jsonl" llm-generate "$T/padded" <<'PY'
import json, subprocess, sys
o = json.loads(open(sys.argv[1]).read())
ids = o["ids"]
assert len(ids) == 48 and o["finish_reason"] == "length", o
assert any(i >= 512 for i in ids) and any(i < 512 for i in ids), ids
known = [i for i in ids if i < 512]
dec = lambda x: subprocess.run([sys.argv[2], "-m", sys.argv[3], "--detokenize", "--skip-special"], input=json.dumps(x),
                               capture_output=True, text=True, check=True).stdout
t, p = dec(o["prompt_ids"] + known), dec(o["prompt_ids"])
assert t.startswith(p) and o["text"] == t[len(p):], (o["text"], t, p)
PY

# the prefix cache serves offline batches too: a system prompt shared by
# every line is prefilled once (whole blocks of 16), and the outputs equal
# those computed without it
sys="Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine with her friends."
for q in "One day," "She saw a dog." "Her mom said" "The sun was"; do
	echo "{\"prompt\": \"$sys $q\", \"max_tokens\": 12, \"temperature\": 0}"
done >"$T/shared.jsonl"
$G -m "$M" --json --parallel 1 -v <"$T/shared.jsonl" >"$T/pc.jsonl" 2>"$T/pc.err"
$G -m "$M" --json --parallel 1 --prefix-cache 0 -v <"$T/shared.jsonl" >"$T/nopc.jsonl" 2>"$T/nopc.err"
hit=$(sed -n 's/.* \([0-9]*\) taken from the prefix cache.*/\1/p' "$T/pc.err")
check "--prefix-cache: 3 of 4 lines take the shared system prompt from the cache ($hit tokens)" [ "${hit:-0}" -ge 48 ]
check "--prefix-cache 0: nothing taken from it" grep -q " 0 taken from the prefix cache" "$T/nopc.err"
check "... and the outputs are the same ids" python3 -c "
import json
a = [json.loads(l)['ids'] for l in open('$T/pc.jsonl')]; b = [json.loads(l)['ids'] for l in open('$T/nopc.jsonl')]
assert a == b and len(a) == 4, (a, b)"

# bad input: one line, exit 1
long=$(python3 -c "print('Once upon a time ' * 200)")
check_fails "a prompt longer than the context is refused" 1 $G -m "$M" -p "$long" -c 64
# the scheduler's admission rule (vLLM's), the same in llm-serve (serve.sh):
# a prompt must be shorter than the context, prompt + max_tokens must fit,
# and -n 0 (max_tokens 0) means up to the context
python3 -c "import json; print(json.dumps({'prompt_ids': [1] + [300] * 15}))" >"$T/full.jsonl"
check_fails "a prompt as long as the context (-c 16) is refused" 1 sh -c "$G -m '$M' -c 16 -n 0 <'$T/full.jsonl'"
check "... with the numbers, as llm-serve says them" grep -q "prompt 1: prompt of 16 tokens + max_tokens 0 exceeds the context of 16" "$T/err"
check_fails "prompt + -n over the context is refused" 1 sh -c "echo '{\"prompt_ids\": [1, 300, 301]}' | $G -m '$M' -c 16 -n 14"
check "-n 0: a 12-token prompt in a 16-token context gets 4 tokens, finish length" sh -c "python3 -c \"import json; print(json.dumps({'prompt_ids': [1] + [300] * 11}))\" |
	$G -m '$M' -c 16 -n 0 --temp 0 --ignore-eos --json | python3 -c 'import json,sys; o=json.load(sys.stdin); assert len(o[\"ids\"]) == 4 and o[\"finish_reason\"] == \"length\", o'"
echo '{"prompt_ids": [1, 99999]}' >"$T/badid.jsonl"
check_fails "an unknown token id is refused" 1 sh -c "$G -m '$M' <'$T/badid.jsonl'"
mkdir -p "$T/notok"; cp "$M/model.safetensors" "$M/config.json" "$T/notok/"
check_fails "a missing tokenizer file is refused" 1 $G -m "$T/notok" -p hi
check_fails "a corrupt checkpoint is refused" 1 $G -m tests/data/malformed/overlap.safetensors -p hi
echo 'not json {' >"$T/bad.jsonl"; echo '{"prompt": 5}' >>"$T/bad.jsonl"
check_fails "a JSONL line with a wrong type names the line" 1 sh -c "echo '{\"prompt\": 5}' | $G -m '$M'"
grep -q "line 1" "$T/err" && ok "... the message names the line" || notok "... the message names the line"
# the rules llm-serve's bodies share (request.c, vLLM's): refused, never cut
# or ignored, with the line and the field named
jsonl_fails() {   # DESCRIPTION LINE MESSAGE
	check_fails "$1" 1 sh -c "printf '%s\\n' '{\"prompt\": \"a\"}' '$2' | $G -m '$M' --json"
	grep -qF "$3" "$T/err" && ok "... $3" || { notok "... $3"; sed 's/^/#   /' "$T/err"; }
}
jsonl_fails "a JSONL line with 9 stop strings is refused (was: cut to 8)" \
	'{"prompt": "a", "stop": ["1","2","3","4","5","6","7","8","9"]}' "stdin: line 2: stop: 9 stop strings, at most 8"
jsonl_fails "a JSONL max_tokens 0 is refused (at least 1, as llm-serve)" \
	'{"prompt": "a", "max_tokens": 0}' "stdin: line 2: max_tokens: 0 is out of range [1, 2147483647]"
jsonl_fails "a JSONL echo: true is refused (was: ignored)" '{"prompt": "a", "echo": true}' "stdin: line 2: echo: not a JSONL field (llm-generate --echo)"
jsonl_fails "a JSONL n: 2 is refused: one completion per line (was: ignored)" \
	'{"prompt": "a", "n": 2}' "stdin: line 2: n: 2 is out of range [1, 1]"
jsonl_fails "a JSONL temperature out of range: the server's message" \
	'{"prompt": "a", "temperature": 101}' "stdin: line 2: temperature: 101 is out of range [0, 100]"
jsonl_fails "a JSONL message without a role is refused (as llm-serve)" \
	'{"messages": [{"content": "hi"}]}' "stdin: line 2: messages: message 0: expected"
check_fails "--stop 9 times is a usage error (was: cut to 8)" 2 $G -m "$M" -p a --stop 1 --stop 2 --stop 3 --stop 4 \
	--stop 5 --stop 6 --stop 7 --stop 8 --stop 9
out=$(printf '%s\n' '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, "top_k": -1}' | $G -m "$M" --json)
check "a JSONL top_k -1 means off (was: refused; as llm-serve)" sh -c "echo '$out' | grep -q '\"finish_reason\":\"length\"'"

# the first mistakes (issue 22): each refused with what is wrong, by name
printf 'GGUF\003\000\000\000\000\000\000\000\000\000\000\000' >"$T/model.gguf"
check_fails "-m a GGUF file is refused" 1 $G -m "$T/model.gguf" -p hi
check "... as a GGUF file, with what to do" grep -q "model.gguf: a GGUF file; llm-tools read safetensors (Hugging Face layout): convert it to safetensors" "$T/err"
check_fails "-m config.json is refused" 1 $G -m "$M/config.json" -p hi
check "... as not a safetensors file, pointing to the directory" grep -q "config.json: not a safetensors file (it starts with '{'): give the model directory" "$T/err"
a=$($G -m "$M" -p 'Once upon a time' -n 8 --temp 0)
b=$($G -m "$M/model.safetensors" -p 'Once upon a time' -n 8 --temp 0 2>"$T/err")
check "-m DIR/model.safetensors finds config.json beside it (same output as -m DIR)" [ -n "$a" -a "$a" = "$b" ]
mkdir -p "$T/nocfg"; cp "$M/model.safetensors" "$M/tokenizer.json" "$M/tokenizer_config.json" "$T/nocfg/"
check_fails "a file with no config.json in it or beside it is refused" 1 $G -m "$T/nocfg/model.safetensors" -p hi
check "... saying where it looked" grep -q "no config.json in its __metadata__ nor beside it in $T/nocfg" "$T/err"
check_fails "-m - is a usage error (llm-generate reads a path)" 2 sh -c "$G -m - -p hi <'$M/model.safetensors'"
check "... saying so" grep -q -- "-m -: llm-generate reads a checkpoint from a path, not a stream" "$T/err"
check_fails "-c beyond the model's context is a usage error (was: capped silently)" 2 $G -m "$M" -p hi -c 100000
check "... with the numbers" grep -q "ctx-size 100000 exceeds the model's context of 512 (max_position_embeddings)" "$T/err"
check "-c at the model's context runs" $G -m "$M" -p hi -c 512 -n 2 --temp 0
check_fails "-p '' is a usage error (was: generated from BOS)" 2 $G -m "$M" -p '' -n 2
check "... naming -p" grep -q -- "-p '': an empty prompt" "$T/err"
check "generation from BOS alone, asked for with prompt_ids, runs" sh -c "echo '{\"prompt_ids\": [1]}' | $G -m '$M' -n 2 --temp 0 --json | grep -q '\"ids\"'"
tap_done
