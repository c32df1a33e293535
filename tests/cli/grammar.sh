# tests/cli/grammar.sh: structured output end to end through llm-generate,
# on stories260K and on a random-weight model of its shape (whose
# unconstrained output is noise, so the constraint does all the work):
# 220 generated JSON Schemas (tests/cli/grammar_gen.py), regular
# expressions, choices, a grammar and json_object, greedy and sampled with
# several seeds and sampler settings, each batch in one run; every output
# that ends "stop" or "eos" is checked by an independent validator
# (Debian's python3-jsonschema, Python's re.fullmatch, membership), and one
# cut by max_tokens ends "length". Then batch invariance with grammars, the
# same ids with speculative decoding, --json-schema and --grammar for all
# prompts, and the errors.
. tests/lib/tap.sh
T=$TMPD
G=llm-generate
GEN=tests/cli/grammar_gen.py
if ! have_stories; then
	skip "structured output on stories260K" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
if ! /usr/bin/python3 -c 'import jsonschema' 2>/dev/null; then
	skip "structured output validated by python3-jsonschema" "python3-jsonschema is not installed (apt-get install python3-jsonschema)"
	tap_done
fi
M=$(stories)
llm-quantize -q --random "$M/config.json" --seed 3 --tokenizer "$M" "$T/rnd" 2>"$T/err" ||
	{ notok "a random-weight model of stories260K's shape: $(cat "$T/err")"; tap_done; }

python3 $GEN gen 220 1 "$T/schemas.jsonl" && python3 $GEN fixed "$T/fixed.jsonl" &&
	cat "$T/schemas.jsonl" "$T/fixed.jsonl" >"$T/cases.jsonl" &&
	python3 -c "
import json, sys
for l in open('$T/cases.jsonl'): print(json.dumps(json.loads(l)['line']))" >"$T/lines.jsonl"
check "the generator wrote 220 schemas and the fixed cases" [ "$(wc -l <"$T/schemas.jsonl")" = 220 ]
N=$(wc -l <"$T/lines.jsonl")

# run NAME MODEL FLAGS...: all lines in one batch; every finished output
# valid, and most of them finished (at least 3/4: the schemas keep outputs short)
run() {
	name=$1 model=$2; shift 2
	if ! $G -m "$model" --json --parallel 32 "$@" <"$T/lines.jsonl" >"$T/$name.jsonl" 2>"$T/err"; then
		notok "$name: llm-generate ran: $(cat "$T/err")"
		return
	fi
	if r=$(/usr/bin/python3 $GEN check "$T/cases.jsonl" "$T/$name.jsonl" 2>&1); then
		set -- $r
		check "$name: all $1 finished outputs of $N valid ($2 cut by max_tokens)" [ $(($1 * 4)) -ge $((N * 3)) ]
	else
		notok "$name: an output is not valid: $(echo "$r" | tail -1)"
	fi
}
run stories-greedy "$M" --temp 0
run stories-sampled "$M" --temp 0.9 --seed 11 --top-k 40 --top-p 0.95
run random-greedy "$T/rnd" --temp 0
run random-sampled "$T/rnd" --temp 1 --seed 12 --top-k 0 --top-p 1 --min-p 0
run random-penalties "$T/rnd" --temp 0.7 --seed 13 --repeat-penalty 1.3 --frequency-penalty 0.5 --presence-penalty 0.5 --logit-bias 125=8

# batch invariance: the first 40 lines alone give the ids they gave in the batch
head -40 "$T/lines.jsonl" >"$T/head.jsonl"
$G -m "$T/rnd" --json --parallel 1 --temp 1 --seed 12 --top-k 0 --top-p 1 --min-p 0 <"$T/head.jsonl" >"$T/alone.jsonl"
check "batch invariance: 40 requests with grammars, alone and in a batch of 32, the same ids" python3 -c "
import json
a = [json.loads(l)['ids'] for l in open('$T/alone.jsonl')]
b = [json.loads(l)['ids'] for l in open('$T/random-sampled.jsonl')][:40]
assert len(a) == 40 and a == b"

# speculative decoding with grammars: drafts the mask refuses are rejected,
# and every request's ids are those without speculation, greedy and sampled
for v in "greedy --temp 0" "sampled --temp 0.9 --seed 11 --top-k 40 --top-p 0.95"; do
	set -- $v; name=$1; shift
	$G -m "$M" --json --parallel 32 --speculate ngram --spec-tokens 4 -v "$@" <"$T/lines.jsonl" >"$T/spec-$name.jsonl" 2>"$T/spec.err"
	check "--speculate ngram with grammars, $name: the ids of every request as without ($(grep -o '[0-9]* of [0-9]* drafted[^;]*' "$T/spec.err"))" python3 -c "
import json
a = [(o['ids'], o['finish_reason']) for o in map(json.loads, open('$T/stories-$name.jsonl'))]
b = [(o['ids'], o['finish_reason']) for o in map(json.loads, open('$T/spec-$name.jsonl'))]
assert len(a) == $N and a == b"
done

# max_tokens before the grammar can accept: finish 'length', never 'stop'
printf '%s\n' '{"prompt": "a", "max_tokens": 5, "guided_regex": "a{40}"}' \
	'{"prompt": "a", "max_tokens": 3, "guided_json": {"type": "object", "properties": {"k": {"const": "a long constant value"}}, "required": ["k"]}}' |
	$G -m "$T/rnd" --json --temp 0 >"$T/len.jsonl"
check "a grammar that cannot finish within max_tokens ends 'length'" python3 -c "
import json
o = [json.loads(l) for l in open('$T/len.jsonl')]
assert [x['finish_reason'] for x in o] == ['length', 'length'] and len(o[0]['ids']) == 5, o"

# --json-schema FILE: every prompt (text lines and a JSONL line) follows it
cat >"$T/person.json" <<'EOF'
{"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 10},
 "age": {"type": "integer", "minimum": 0, "maximum": 120}, "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
 "required": ["name", "age"], "additionalProperties": false}
EOF
printf '%s\n' 'Once upon a time' 'The dog' '{"prompt": "Lily", "seed": 4}' >"$T/p.txt"
$G -m "$M" --json --temp 0.8 --seed 2 --json-schema "$T/person.json" <"$T/p.txt" >"$T/person.out"
check "--json-schema FILE: every prompt's output valid for it" /usr/bin/python3 -c "
import json, jsonschema
s = json.load(open('$T/person.json')); o = [json.loads(l) for l in open('$T/person.out')]
assert len(o) == 3
for x in o:
    assert x['finish_reason'] in ('stop', 'eos'), x
    jsonschema.validate(json.loads(x['text']), s)"
$G -m "$M" --temp 0 --json-schema "$T/person.json" -p 'Once upon a time' >"$T/person-p.out"
check "--json-schema with -p: the streamed text is the object" /usr/bin/python3 -c "
import json, jsonschema; jsonschema.validate(json.loads(open('$T/person-p.out').read()), json.load(open('$T/person.json')))"
printf 'root ::= "The " animal " " ("ran" | "sat") "."\nanimal ::= "cat" | "dog" | [a-z]{3,5}\n' >"$T/g.ebnf"
printf '%s\n' 'Once upon a time' 'Lily' '{"prompt": "Ben", "guided_choice": ["own"]}' |
	$G -m "$T/rnd" --json --temp 1 --seed 9 --grammar "$T/g.ebnf" >"$T/g.out"
check "--grammar FILE: every prompt follows it, a line's own field replaces it" python3 -c "
import json, re
o = [json.loads(l)['text'] for l in open('$T/g.out')]
assert all(re.fullmatch(r'The (cat|dog|[a-z]{3,5}) (ran|sat)\.', t) for t in o[:2]) and o[2] == 'own', o"

# errors: named, exit status 1 (usage: 2)
echo '{"type": "string", "format": "email"}' >"$T/bad.json"
check_fails "--json-schema with an unsupported keyword fails" 1 $G -m "$M" --json-schema "$T/bad.json" -p hi
check "... naming the file and the keyword" grep -q "$T/bad.json: schema: unsupported keyword 'format'" "$T/err"
printf 'root ::= x\n' >"$T/bad.ebnf"
check_fails "--grammar with an undefined rule fails" 1 $G -m "$M" --grammar "$T/bad.ebnf" -p hi
check "... naming the file, the line and the rule" grep -q "$T/bad.ebnf: grammar: line 1: rule 'x' is not defined" "$T/err"
check_fails "--json-schema and --grammar together: usage error" 2 $G -m "$M" --json-schema "$T/person.json" --grammar "$T/g.ebnf" -p hi
printf '%s\n' '{"prompt": "a"}' '{"prompt": "a", "guided_json": {"type": "array", "uniqueItems": true}}' >"$T/badl.jsonl"
check_fails "a JSONL line with an unsupported keyword fails" 1 sh -c "$G -m '$M' --json <'$T/badl.jsonl'"
check "... naming the line, the field and the keyword" grep -q "stdin: line 2: guided_json: schema: unsupported keyword 'uniqueItems'" "$T/err"
tap_done
