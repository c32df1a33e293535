# tests/cli/eval.sh: llm-generate --eval, the multiple-choice evaluation job
# (common/jobs/eval.c), on stories260K: accuracy on items whose answers are known
# by construction and recomputed here from the per-item numbers, the
# normalised score per code point as Python's len() counts them, each context
# computed once, HellaSwag's fields and lm-eval's preprocessing, bad items,
# and scores that do not depend on the batching.
. tests/lib/tap.sh
T=$TMPD
G=llm-generate
if ! have_stories; then
	skip "llm-generate --eval on stories260K" "no stories260K model in \$LLM_TEST_MODELS"
	tap_done
fi
M=$(stories)

# identical endings score the same, so the first wins (argmax takes the first
# of equals): label 0 is right, any other wrong, for raw and normalised alike
printf '%s\n' \
	'{"context": "Once upon a time", "endings": [" there was", " there was", " there was"], "label": 0}' \
	'{"context": "The little girl", "endings": [" ran", " ran"], "label": 1}' '' \
	'{"ctx": "Lily saw a", "endings": [" big dog", " big dog", " big dog", " big dog"], "label": "3"}' \
	'{"context": "Tom", "continuations": [" and", " and"], "label": 0}' >"$T/known.jsonl"
$G -m "$M" --eval --json <"$T/known.jsonl" >"$T/known.out" 2>"$T/known.err"
check "--eval: 4 items with known answers, acc 0.5 (2 of 4), both ways" python3 - "$T/known.out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
items, s = rows[:-1], rows[-1]
assert s["summary"] and s["items"] == 4 and s["labelled"] == 4, s
assert [r["index"] for r in items] == [0, 1, 3, 4], items
assert [r["correct"] for r in items] == [True, False, False, True], items
assert s["acc"] == 0.5 and s["acc_norm"] == 0.5, s
# the standard error of a mean of 0/1 samples: sample std / sqrt(n)
assert abs(s["acc_stderr"] - (1 / 3) ** 0.5 / 2) < 1e-6, s
PY
check "--eval: a human summary line on stderr" grep -q '^llm-generate: 4 items (0 skipped, 4 labelled): acc 0.5000 +- 0.2887' "$T/known.err"

# real choices: predictions, accuracy and its error recomputed from the
# logprobs; normalised = logprob / Python's len(ending) (code points)
python3 - "$T/items.jsonl" <<'PY'
import json, sys
ctxs = ["Once upon a time, there was a little", "The cat", "Lily and Tom went to the", "One day, a big"]
ends = [[" girl", " café", " naïve ñandú"], [" sat", " ran away", " 日本"], [" park", " moon", " shop"], [" dog", " tree"]]
with open(sys.argv[1], "w") as f:
    for i, (c, e) in enumerate(zip(ctxs, ends)):
        f.write(json.dumps({"context": c, "endings": e, "label": i % len(e)}, ensure_ascii=i % 2 == 0) + "\n")
PY
$G -m "$M" --eval --json -v <"$T/items.jsonl" >"$T/items.out" 2>"$T/items.err"
check "--eval: pred, correct, acc and standard errors agree with the logprobs; normalised per code point" \
	python3 - "$T/items.jsonl" "$T/items.out" <<'PY'
import json, statistics, sys
src = [json.loads(l) for l in open(sys.argv[1])]
rows = [json.loads(l) for l in open(sys.argv[2])]
items, s = rows[:-1], rows[-1]
cor, corn = [], []
for x, r in zip(src, items):
    lp = r["logprobs"]
    norm = [l / len(e) for l, e in zip(lp, x["endings"])]
    assert all(abs(a - b) <= 1e-12 * abs(b) for a, b in zip(r["normalized"], norm)), (r, norm)
    p, pn = lp.index(max(lp)), norm.index(max(norm))
    assert (r["pred"], r["pred_norm"]) == (p, pn), r
    cor.append(float(p == x["label"])); corn.append(float(pn == x["label"]))
    assert (r["correct"], r["correct_norm"]) == (p == x["label"], pn == x["label"]), r
n = len(cor)
for k, v in (("acc", cor), ("acc_norm", corn)):
    assert abs(s[k] - sum(v) / n) < 1e-6, (k, s)
    assert abs(s[k + "_stderr"] - statistics.stdev(v) / n ** 0.5) < 1e-6, (k, s)
PY
want=$(python3 -c "
import json
rows = [json.loads(l) for l in open('$T/items.out')][:-1]
print(sum(r['context_tokens'] - 1 + sum(r['tokens']) for r in rows), sum((r['context_tokens'] - 1) * len(r['tokens']) for r in rows))")
got=$(python3 -c "import json; s = [json.loads(l) for l in open('$T/items.out')][-1]; print(s['computed_tokens'], s['context_prefills'])")
shared=$(sed -n 's/.* \([0-9]*\) taken from the prefix cache.*/\1/p' "$T/items.err")
check "--eval: each context computed once, forked by its endings (computed $got, want ${want% *} 4; forked $shared, want ${want#* })" \
	[ "$got" = "${want% *} 4" ] && [ "$shared" = "${want#* }" ]

# batching does not change a number: the DP's batches of one item (theta 1,
# 4 sequences at most) and all at once (--score) agree digit for digit
$G -m "$M" --eval --eval-batch-tokens 1 --parallel 4 <"$T/items.jsonl" >"$T/one.out" 2>/dev/null
$G -m "$M" --score <"$T/items.jsonl" >"$T/all.out"
check "--eval in batches of one item and --score all at once give the same scores, in input order" python3 -c "
import json
a = [json.loads(l) for l in open('$T/one.out')]; b = [json.loads(l) for l in open('$T/all.out')]; c = [json.loads(l) for l in open('$T/items.out')][:-1]
key = lambda r: (r['index'], r['logprobs'], r['normalized'], r['tokens'])
assert [key(r) for r in a] == [key(r) for r in b] == [key(r) for r in c], (a, b)
assert 'label' not in b[0] and 'correct' in a[0]"

# HellaSwag's release fields with lm-eval's preprocessing equal the plain
# item lm-eval builds from them
python3 - "$T" <<'PY'
import json, re, sys
t = sys.argv[1]
def pre(text):
    text = text.strip().replace(" [title]", ". ")
    text = re.sub("\\[.*?\\]", "", text)
    return text.replace("  ", " ")
doc = {"ind": 4, "activity_label": "Making a cake", "ctx_a": "Lily [header] takes a  bowl.",
       "ctx_b": "she PUTS [title] the eggs", "endings": ["in the bowl [step] and stirs.", "on  the moon.", " away."],
       "label": "2", "split": "val"}
ctx = doc["ctx_a"] + " " + doc["ctx_b"].capitalize()
q = pre(doc["activity_label"] + ": " + ctx)
ch = [pre(e) for e in doc["endings"]]
json.dump(doc, open(t + "/hs.jsonl", "w")); open(t + "/hs.jsonl", "a").write("\n")
open(t + "/plain.jsonl", "w").write(json.dumps({"context": q, "endings": [" " + c for c in ch], "label": 2}) + "\n")
json.dump([len(c) for c in ch], open(t + "/hs.len", "w"))
PY
$G -m "$M" --eval --hellaswag <"$T/hs.jsonl" >"$T/hs.out" 2>/dev/null
$G -m "$M" --eval <"$T/plain.jsonl" >"$T/plain.out" 2>/dev/null
check "--hellaswag: lm-eval's query and choices (a space before each), normalised by the choice's characters" python3 -c "
import json
a = json.load(open('$T/hs.out')); b = json.load(open('$T/plain.out')); n = json.load(open('$T/hs.len'))
assert a['logprobs'] == b['logprobs'] and a['tokens'] == b['tokens'] and a['label'] == 2, (a, b)
assert all(abs(x - l / k) <= 1e-12 * abs(x) for x, l, k in zip(a['normalized'], a['logprobs'], n)), (a, n)"

# bad items: one error naming the line, or skipped and counted
good='{"context": "Once", "endings": [" upon", " a"], "label": 1}'
bad() { printf '%s\n' "$good" "$1" "$good" >"$T/bad.jsonl"; }
bad '{"context": "Once", "label": 0}'
check_fails "--eval: missing endings name the line" 1 sh -c "$G -m '$M' --eval <'$T/bad.jsonl'"
check "  ... as 'stdin: line 2: needs \"endings\"'" grep -q '^llm-generate: stdin: line 2: needs "endings"' "$T/err"
bad '{"context": "Once", "endings": [" upon", " a"], "label": 2}'
check_fails "--eval: a label out of range names the line" 1 sh -c "$G -m '$M' --eval <'$T/bad.jsonl'"
check "  ... as 'stdin: line 2: label: 2 is out of range (2 endings)'" grep -q 'stdin: line 2: label: 2 is out of range (2 endings)' "$T/err"
bad '{"context": "Once", "endings": [" upon", ""], "label": 0}'
check_fails "--eval: an empty ending names the line" 1 sh -c "$G -m '$M' --eval <'$T/bad.jsonl'"
check "  ... as 'stdin: line 2: endings[1] is empty'" grep -q 'stdin: line 2: endings\[1\] is empty' "$T/err"
printf '%s\n' "$good" '{"context": "Once", "label": 0}' '{"context": "Once", "endings": [" upon"], "label": 5}' \
	'{"context": "Once", "endings": [""]}' 'not json' "$good" >"$T/bad.jsonl"
$G -m "$M" --eval --skip-bad --json <"$T/bad.jsonl" >"$T/skip.out" 2>/dev/null
check "--skip-bad: 2 good items scored (lines 1 and 6), 4 bad ones counted" python3 -c "
import json
r = [json.loads(l) for l in open('$T/skip.out')]
assert [x['index'] for x in r[:-1]] == [0, 5] and r[-1]['skipped'] == 4 and r[-1]['items'] == 2, r"
check_fails "--skip-bad without --eval or --score is a usage error" 2 $G -m "$M" --skip-bad -p x

# --perplexity --jsonl: many documents batched as --eval batches items, each
# document's numbers those of --perplexity on its text alone (with BOS:
# [BOS] + window - 1 tokens; without, a window is its own context)
python3 - "$T" <<'PY'
import json, sys
t = sys.argv[1]
docs = ["Once upon a time, there was a little girl named Lily. She liked to play in the park.",
        "The sun was shining. Tom went to the store to buy apples for his mom, and a café.",
        "A bare string document. " * 20, "Hi"]
with open(t + "/docs.jsonl", "w") as f:
    for i, d in enumerate(docs):
        f.write(json.dumps(d if i == 2 else {"text": d}) + "\n")
        open("%s/doc%d.txt" % (t, i), "w").write(d)
PY
nobos=$T/nobos
mkdir -p "$nobos"
for f in "$M"/*; do ln -sf "$(cd "$(dirname "$f")" && pwd)/$(basename "$f")" "$nobos/"; done
rm -f "$nobos/special_tokens_map.json" "$nobos/tokenizer_config.json" "$nobos/generation_config.json"
python3 -c "
import json, sys
c = json.load(open('$M/tokenizer_config.json')); c['bos_token'] = None; c['add_bos_token'] = False
json.dump(c, open('$nobos/tokenizer_config.json', 'w'))"
echo '{"eos_token_id": 2}' >"$nobos/generation_config.json"
check "a copy of stories260K whose tokenizer has no BOS" sh -c "echo hi | $G -m '$nobos' --tokenize | grep -qv '^\[1,'"
for m in "$M:with BOS" "$nobos:without BOS"; do
	for c in 16 64; do
		$G -m "${m%%:*}" --perplexity "$T/docs.jsonl" --jsonl -c $c --json --parallel 3 >"$T/ppl.out" 2>"$T/ppl.err"
		for i in 0 1 2 3; do $G -m "${m%%:*}" --perplexity "$T/doc$i.txt" -c $c --json; done >"$T/ppl1.out"
		check "--perplexity --jsonl ${m#*:}, windows of $c: each document's tokens, nll and ppl those of --perplexity on it alone; the summary over all" \
			python3 - "$T/ppl.out" "$T/ppl1.out" <<'PY'
import json, math, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ref = [json.loads(l) for l in open(sys.argv[2])]
docs, s = rows[:-1], rows[-1]
assert [d["index"] for d in docs] == [0, 1, 2, 3], docs
for d, r in zip(docs, ref):
    assert d["tokens"] == r["tokens"] and abs(d["nll"] - r["nll"]) <= 5e-7, (d, r)
    assert (d["ppl"] is None) == (r["tokens"] == 0), (d, r)
    assert d["ppl"] is None or abs(d["ppl"] - r["ppl"]) <= 1e-6 * r["ppl"], (d, r)
assert docs[2]["windows"] > 1, docs[2]
tok, nll = sum(d["tokens"] for d in docs), sum(d["nll"] for d in docs)
assert s["summary"] and s["documents"] == 4 and s["tokens"] == tok, s
assert abs(s["nll"] - nll) < 1e-5 and abs(s["ppl"] - math.exp(nll / tok)) < 1e-5 * s["ppl"], s
PY
	done
done
$G -m "$M" --perplexity "$T/docs.jsonl" --jsonl -c 16 --json --parallel 1 --eval-batch-tokens 1 >"$T/p1.out" 2>/dev/null
$G -m "$M" --perplexity - --jsonl -c 16 --json --parallel 64 <"$T/docs.jsonl" >"$T/p64.out" 2>"$T/p64.err"
check "--perplexity --jsonl: one window at a time and 64 at once (stdin) give the same numbers" \
	sh -c "head -n 4 '$T/p1.out' >'$T/a' && head -n 4 '$T/p64.out' >'$T/b' && cmp -s '$T/a' '$T/b'"
check "--perplexity --jsonl: a human summary on stderr" grep -q '^llm-generate: 4 documents (0 skipped): [0-9]* tokens in windows of 16: nll .*, perplexity ' "$T/p64.err"
printf '%s\n' '{"text": "Once upon a time"}' '{"txt": "x"}' '{"text": ""}' '[1]' '"Lily ran"' >"$T/badd.jsonl"
check_fails "--perplexity --jsonl: a line without \"text\" is named" 1 $G -m "$M" --perplexity "$T/badd.jsonl" --jsonl
check "  ... as 'FILE: line 2: needs \"text\"'" grep -q "badd.jsonl: line 2: needs \"text\"" "$T/err"
$G -m "$M" --perplexity "$T/badd.jsonl" --jsonl --skip-bad --json >"$T/skipd.out" 2>/dev/null
check "--perplexity --jsonl --skip-bad: lines 1 and 5 scored, 3 bad ones counted" python3 -c "
import json
r = [json.loads(l) for l in open('$T/skipd.out')]
assert [x['index'] for x in r[:-1]] == [0, 4] and r[-1]['skipped'] == 3 and r[-1]['documents'] == 2, r"
check_fails "--jsonl without --perplexity is a usage error" 2 $G -m "$M" --jsonl --eval
tap_done
