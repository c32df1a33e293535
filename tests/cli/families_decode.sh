# tests/cli/families_decode.sh: speculative decoding and structured output
# on every family's tiny model (../shared/tools/configs: tiny-qwen2,
# tiny-qwen3, tiny-mistral-sw with its window of 64, tiny-gemma2 with its
# window of 8 and softcaps, tiny-mixtral, tiny-qwen3moe), made by
# llm-quantize --random with 512 ids and stories260K's tokenizer. Four
# prompts of 100 ids (a 12-id phrase repeated in them, so prompt lookup
# finds drafts) and 48 greedy tokens each, past both windows:
#   - --speculate ngram, --speculate draft with the model itself as its
#     draft (nearly every draft accepted) and with another random model of
#     the family (drafts rejected: the roll-back path, checked to run) each give
#     the ids and log-probs of plain greedy decoding, digit for digit
#     (spec.h: at temperature 0 the verified token is the model's own);
#   - --json-schema: every output that ends "stop" or "eos" parses as JSON
#     and has the schema's keys and types (checked here in Python, apart from
#     the engine), most outputs finish, and the draft speculation gives the
#     same ids under the grammar as without it.
# Skipped without ../shared/tools/configs or stories260K (its tokenizer).
. tests/lib/tap.sh
T=$TMPD
TOOLS=${LLM_TEST_TOOLS:-../shared/tools}
G="llm-generate --kv-dtype f32 -t 2 --parallel 4"
FAMS="tiny-qwen2 tiny-qwen3 tiny-mistral-sw tiny-gemma2 tiny-mixtral tiny-qwen3moe"
SPECS="ngram:--speculate ngram --spec-tokens 4
self:--speculate draft --draft SELF --spec-tokens 4
other:--speculate draft --draft OTHER --spec-tokens 3"
why=
[ -d "$TOOLS/configs" ] || why="no configs in $TOOLS"
[ -n "$why" ] || have_stories || why="no stories260K in \$LLM_TEST_MODELS (its tokenizer)"
if [ -n "$why" ]; then
	for f in $FAMS; do
		for s in ngram self other; do
			skip "$f: --speculate ($s) gives plain greedy's ids and log-probs" "$why"
		done
		skip "$f: ... some of another model's drafts rejected" "$why"
		skip "$f: --json-schema outputs parse and match the schema" "$why"
		skip "$f: --json-schema with --speculate draft: the same ids" "$why"
	done
	tap_done
fi
TOK=$(stories)
python3 -c "
import json, random
r = random.Random(5)
phrase = [r.randrange(3, 512) for _ in range(12)]
for i in range(4):
    ids = [1]
    while len(ids) < 100:
        ids += phrase if r.random() < 0.4 else [r.randrange(3, 512) for _ in range(8)]
    print(json.dumps({'prompt_ids': ids[:100]}))" >"$T/prompts.jsonl"
cat >"$T/schema.json" <<'JSON'
{"type": "object", "additionalProperties": false, "required": ["name", "ok", "tags"],
 "properties": {"name": {"type": "string", "maxLength": 6}, "ok": {"type": "boolean"},
                "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3}}}
JSON
for p in "Once upon a time" "The cat" "Lily and Ben" "A big red ball" "One day" "Tom"; do
	printf '{"prompt": "%s", "max_tokens": 80}\n' "$p"
done >"$T/glines.jsonl"
# same A B: the ids and top log-probs of two answer files, in prompt order
same() { python3 - "$1" "$2" <<'PY'
import json, sys
a, b = ([(o["ids"], o.get("logprobs")) for o in sorted(map(json.loads, open(f)), key=lambda o: o["index"])]
        for f in sys.argv[1:3])
assert len(a) == len(b) > 0 and all(x[0] for x in a), (len(a), len(b))
assert a == b, [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
PY
}
for f in $FAMS; do
	# 512 ids; tiny-qwen2 untied (random tied embeddings make it repeat
	# its last token, whatever model drafts, so no draft would be rejected)
	python3 -c "
import json, sys; c = json.load(open(sys.argv[1])); c['vocab_size'] = 512
if sys.argv[3] == 'tiny-qwen2': c['tie_word_embeddings'] = False
json.dump(c, open(sys.argv[2], 'w'))" "$TOOLS/configs/$f.json" "$T/$f.json" "$f"
	if ! llm-quantize -q --random "$T/$f.json" --seed 1 --tokenizer "$TOK" "$T/$f" 2>"$T/err" ||
		! llm-quantize -q --random "$T/$f.json" --seed 2 --tokenizer "$TOK" "$T/$f-other" 2>"$T/err"; then
		notok "$f: llm-quantize --random writes the model and its other: $(cat "$T/err")"
		continue
	fi
	$G -m "$T/$f" -n 48 --ignore-eos --temp 0 --json --logprobs 1 <"$T/prompts.jsonl" >"$T/$f.plain" 2>"$T/err" ||
		sed 's/^/#   /' "$T/err" | tail -2
	while IFS=: read -r s flags; do
		flags=$(echo "$flags" | sed "s|SELF|$T/$f|; s|OTHER|$T/$f-other|")
		$G -m "$T/$f" -n 48 --ignore-eos --temp 0 --json --logprobs 1 $flags -v <"$T/prompts.jsonl" \
			>"$T/$f.$s" 2>"$T/$f.$s.err" || sed 's/^/#   /' "$T/$f.$s.err" | tail -2
		acc=$(grep -o '[0-9]* of [0-9]* drafted tokens accepted[^;]*' "$T/$f.$s.err" | head -1)
		check "$f: --speculate ($s) gives plain greedy's ids and log-probs (${acc:-no acceptance line})" \
			same "$T/$f.plain" "$T/$f.$s"
		# another model's drafts: some are rejected, so the roll-back ran
		[ "$s" != other ] || check "$f: ... some of another model's drafts rejected" \
			python3 -c "import sys; a, _, b = sys.argv[1:4]; sys.exit(not int(a) < int(b))" $acc
	done <<EOF
$SPECS
EOF
	$G -m "$T/$f" --temp 0 --json --json-schema "$T/schema.json" <"$T/glines.jsonl" >"$T/$f.g" 2>"$T/err" ||
		sed 's/^/#   /' "$T/err" | tail -2
	check "$f: --json-schema outputs parse and match the schema" python3 - "$T/$f.g" <<'PY'
import json, sys
outs = [json.loads(l) for l in open(sys.argv[1])]
assert len(outs) == 6, len(outs)
done = 0
for o in outs:
    if o["finish_reason"] == "length":
        continue
    assert o["finish_reason"] in ("stop", "eos"), o
    v = json.loads(o["text"])
    assert isinstance(v, dict) and set(v) == {"name", "ok", "tags"}, v
    assert isinstance(v["name"], str) and len(v["name"]) <= 6 and isinstance(v["ok"], bool), v
    assert isinstance(v["tags"], list) and len(v["tags"]) <= 3 and set(v["tags"]) <= {"red", "green", "blue"}, v
    done += 1
assert done >= 4, "%d of 6 finished" % done
PY
	$G -m "$T/$f" --temp 0 --json --json-schema "$T/schema.json" --speculate draft --draft "$T/$f" <"$T/glines.jsonl" \
		>"$T/$f.gs" 2>"$T/err" || sed 's/^/#   /' "$T/err" | tail -2
	check "$f: --json-schema with --speculate draft: the same ids" same "$T/$f.g" "$T/$f.gs"
done
tap_done
