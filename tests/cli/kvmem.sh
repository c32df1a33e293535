# tests/cli/kvmem.sh: the KV cache sized from the memory there is. llm-serve
# --plan with --assume-memory (the free memory pretended, so no cgroup and no
# real shortage): how many contexts fit, how many sequences of -c tokens,
# and when not one fits, by how many bytes; the refusal at start; the flags
# that size the cache instead. llm-generate sizes its cache from the
# prompts: a prompt over 4096 tokens runs to the end (random tiny model with
# a long context), and a --max-kv-tokens too small for it is one line
# naming the flag and the need. A model windowed on every layer (Mistral's)
# counts a sequence at what it holds at once (the window, a step, two
# blocks): --plan fits more and longer sequences than without the window,
# and a server whose cache is too small for the whole contexts of 4
# concurrent long requests, but not for their windows, serves them with
# llm-generate's ids.
. tests/lib/tap.sh
T=$TMPD
# the sizes below are those of an f32 KV cache (4 bytes an element)
S="llm-serve --kv-dtype f32"
G="llm-generate --kv-dtype f32"

# llm-generate: a random model of dim 64, 2 layers, 16384 positions; a
# prompt of 5001 ids (no tokenizer needed)
python3 -c "
import json; c = json.load(open('configs/tiny-check.json'))
c.update(hidden_size=64, intermediate_size=128, max_position_embeddings=16384); json.dump(c, open('$T/long.json', 'w'))
import random; random.seed(1)
print(json.dumps({'prompt_ids': [1] + [random.randrange(3, 512) for _ in range(5000)]}))" >"$T/long.jsonl"
llm-quantize -q --random "$T/long.json" --seed 1 "$T/long" 2>"$T/err"
$G -m "$T/long" -n 4 --temp 0 --ignore-eos --json -t 1 <"$T/long.jsonl" >"$T/g1.json" 2>"$T/err"; rc=$?
check "llm-generate: a prompt of 5001 tokens (over 4096) runs to the end" python3 -c "
import json; r = json.loads(open('$T/g1.json').readline())
assert $rc == 0 and len(r['prompt_ids']) == 5001 and len(r['ids']) == 4 and r['finish_reason'] == 'length', r"
check_fails "... --max-kv-tokens too small for it: exit 1, one line" 1 $G -m "$T/long" -n 4 --temp 0 --max-kv-tokens 4096 -t 1 <"$T/long.jsonl"
check "... naming the flag and the need (prompt 5001 + 4)" grep -q -- \
	"--max-kv-tokens 4096 holds 4096 tokens, less than the longest prompt with its output of 5005: need --max-kv-tokens 5005" "$T/err"
$G -m "$T/long" -n 4 --temp 0 --ignore-eos --json -t 1 --max-kv-tokens 5005 <"$T/long.jsonl" >"$T/g2.json" 2>"$T/err"
check "... and the size it names runs, with the same tokens" python3 -c "
import json; a = json.loads(open('$T/g1.json').readline()); b = json.loads(open('$T/g2.json').readline())
assert a['ids'] == b['ids'], (a['ids'], b['ids'])"
check_fails "--kv-memory too small for it: exit 1, the size needed" 1 $G -m "$T/long" -n 4 --kv-memory 2MiB -t 1 <"$T/long.jsonl"
check "... (5005 positions of 512 bytes in blocks of 16: 2504KiB)" grep -q -- "--kv-memory 2048KiB holds 4096 tokens, .*need --kv-memory 2504KiB" "$T/err"
check_fails "llm-generate: --kv-memory and --max-kv-tokens together are a usage error" 2 $G -m "$T/long" --kv-memory 1MiB --max-kv-tokens 64
check "... the same line as llm-serve's" grep -q -- "--kv-memory and --max-kv-tokens are two ways to say one thing" "$T/err"
check_fails "--assume-memory with a bad size is a usage error" 2 $S -m x --assume-memory 12XB
check_fails "--kv-memory and --max-kv-tokens together are a usage error" 2 $S -m x --kv-memory 1MiB --max-kv-tokens 64
check "... naming both" grep -q -- "--kv-memory and --max-kv-tokens are two ways to say one thing" "$T/err"
# A sliding window on every layer (Mistral's): a sequence holds at most the
# window, a step's tokens and two blocks at once (64 + 16 + 2 x 16 = 112
# positions: 7 blocks), whatever its length; the same model without the
# window needs its whole context (1024). 1024 bytes of f32 KV a position.
tok=
have_stories && tok=$(stories)     # its tokenizer (512 ids), for the server below
for w in 64 null; do
	python3 -c "
import json; c = json.load(open('configs/tiny-check.json'))
c.update(model_type='mistral', architectures=['MistralForCausalLM'], max_position_embeddings=1024,
         sliding_window=None if '$w' == 'null' else int('$w'))
json.dump(c, open('$T/w$w.json', 'w'))"
	llm-quantize -q --random "$T/w$w.json" --seed 1 ${tok:+--tokenizer "$tok"} "$T/w$w" 2>"$T/err"
	$S -m "$T/w$w" --plan --max-kv-tokens 448 --max-batch-tokens 16 >"$T/w$w.p1" 2>"$T/w$w.e1"
	$S -m "$T/w$w" --plan --assume-memory 1GiB --max-running 4 --max-batch-tokens 16 >"$T/w$w.p2" 2>"$T/err"
done
check "--plan, window 64: --max-kv-tokens 448 holds 4 sequences of any length (112 positions each at once)" python3 -c "
import json; p = json.load(open('$T/w64.p1'))
assert p['fits'] and p['sliding_window'] == 64 and p['seq_kv_tokens'] == 112, p
assert p['seqs_that_fit'] == 4 and p['max_context_that_fits'] == 1024 and p['short_bytes'] == 0, p"
check "... without the window the same cache holds no context (448 of 1024), and says so" python3 -c "
import json; p = json.load(open('$T/wnull.p1'))
assert not p['fits'] and p['sliding_window'] == 0 and p['seq_kv_tokens'] == 1024, p
assert p['seqs_that_fit'] == 0 and p['max_context_that_fits'] == 448, p"
check "... the window's refusal names the window's need when it is too small" sh -c "
$S -m '$T/w64' --plan --max-kv-tokens 96 --max-batch-tokens 16 >/dev/null 2>'$T/err'; [ \$? = 1 ] &&
grep -q -- '--max-kv-tokens 96 holds 96 tokens, less than one context of 1024 (112 at once under its sliding window of 64): need --max-kv-tokens 112' '$T/err'"
check "--plan from memory, 4 running: the window's pool is 4 x 112 positions, 4 x 1024 without; the budget holds more windowed sequences" python3 -c "
import json; a, b = (json.load(open('$T/w%s.p2' % w)) for w in ('64', 'null'))
assert a['kv_tokens'] == 4 * 112 and b['kv_tokens'] == 4 * 1024 and a['fits'] and b['fits'], (a, b)
assert a['seqs_memory_holds'] > 9 * b['seqs_memory_holds'] > 0, (a, b)"

# a server on that 448-position cache: 4 requests of 150 prompt ids and 200
# generated at once (1400 positions in all, 350 each) run to the end with
# llm-generate's greedy ids
if [ -z "$tok" ]; then
	skip "llm-serve, window 64, 448 KV positions: 4 requests of 350 positions at once get llm-generate's ids" "no stories260K in \$LLM_TEST_MODELS (its tokenizer)"
else
	python3 -c "
import json, random; r = random.Random(3)
for i in range(4): print(json.dumps({'prompt_ids': [1] + [r.randrange(3, 512) for _ in range(149)]}))" >"$T/wp.jsonl"
	llm-generate -m "$T/w64" -n 200 --ignore-eos --temp 0 --json -t 1 --kv-dtype f32 <"$T/wp.jsonl" >"$T/wg.jsonl" 2>"$T/err"
	rm -f "$T/port"
	$S -m "$T/w64" --port 0 --port-file "$T/port" -t 1 --kv-dtype f32 --max-kv-tokens 448 --max-running 4 \
		--max-batch-tokens 16 2>"$T/wserve.log" & SP=$!
	URL=$(serve_url "$T/port")
	i=0 pids=
	while read -r line; do
		ids=$(echo "$line" | python3 -c "import json, sys; print(json.dumps(json.load(sys.stdin)['prompt_ids']))")
		curl -s -m 120 -H 'Content-Type: application/json' "$URL/v1/completions" \
			-d "{\"prompt\": $ids, \"max_tokens\": 200, \"temperature\": 0, \"ignore_eos\": true}" \
			>"$T/ws$i.json" & pids="$pids $!"
		i=$((i + 1))
	done <"$T/wp.jsonl"
	wait $pids
	kill -TERM $SP 2>/dev/null; wait $SP
	check "llm-serve, window 64, 448 KV positions: 4 requests of 350 positions at once get llm-generate's ids" python3 -c "
import json
g = sorted((json.loads(l) for l in open('$T/wg.jsonl')), key=lambda o: o['index'])
for i in range(4):
    r = json.load(open('$T/ws%d.json' % i))
    c = r['choices'][0]
    assert len(g[i]['ids']) == 200 and c['token_ids'] == g[i]['ids'], (i, r)"
	sed 's/^/#   /' "$T/wserve.log" | tail -2
fi

if ! have_stories; then
	skip "llm-serve --plan against stories260K" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
M=$(stories)

# the measured default: MemAvailable, and never more than --max-running contexts
$S -m "$M" --plan --max-running 2 >"$T/p0.json" 2>"$T/err"
check "the default plan reads MemAvailable and caps the cache at --max-running contexts" python3 -c "
import json; p = json.load(open('$T/p0.json'))
assert p['memory_source'] == 'MemAvailable' and p['memory_available'] > 0 and p['kv_memory_fraction'] == 0.9, p
assert p['kv_tokens'] == 2 * 512 and p['seqs_that_fit'] == 2 and p['fits'] and p['short_bytes'] == 0, p
assert p['seqs_memory_holds'] >= 2, p"

# stories260K: 1280 bytes of KV a position (f32), blocks of 16: 20480 bytes a
# block, 655360 a context of 512. OTHER is what the engine holds besides the
# KV cache (weights, activations, logits: these with the default
# --max-running); memory M gives the cache floor(0.9 x (M - OTHER)) bytes.
$S -m "$M" --plan >"$T/pd.json" 2>"$T/err"
other=$(python3 -c "
import json; p = json.load(open('$T/pd.json'))
print(p['weight_bytes'] + p['activation_bytes'] + p['logits_bytes'])")
# mem BLOCKS: the least memory whose budget holds BLOCKS blocks
mem() { python3 -c "
import math; b = $1 * 20480; m = $other + math.ceil(b / 0.9)
while int(0.9 * (m - $other)) < b: m += 1
print(m)"; }

m3=$(mem 100)    # 100 blocks: 3 contexts of 32 blocks (and 4 short)
$S -m "$M" --plan --assume-memory "$m3" >"$T/p1.json" 2>"$T/err"; rc=$?
check "--assume-memory: three contexts fit (exit 0, no warning)" sh -c "[ $rc = 0 ] && [ ! -s '$T/err' ]"
check "... the plan in tokens and sequences" python3 -c "
import json; p = json.load(open('$T/p1.json'))
assert p['memory_source'] == '--assume-memory' and p['memory_available'] == $m3, p
assert p['kv_blocks'] == 100 and p['kv_tokens'] == 1600 and p['max_context_that_fits'] == 512, p
assert p['seqs_that_fit'] == 3 and p['seqs_memory_holds'] == 3 and p['fits'] and p['short_bytes'] == 0, p
assert p['kv_budget_bytes'] >= 100 * 20480 and p['kv_budget_bytes'] < 101 * 20480, p"
$S -m "$M" --plan --assume-memory "$m3" -c 128 >"$T/p2.json" 2>"$T/err"
check "-c 128: the same memory holds 12 sequences of 128 tokens" python3 -c "
import json; p = json.load(open('$T/p2.json'))
assert p['n_ctx'] == 128 and p['seqs_that_fit'] == 12 and p['seqs_memory_holds'] == 12 and p['kv_tokens'] == 1600, p"

m20=$(mem 20)    # 20 blocks: 320 tokens, 12 blocks (245760 bytes) short of a context
$S -m "$M" --plan --assume-memory "$m20" >"$T/p3.json" 2>"$T/err"; rc=$?
check "not one context fits: --plan exits 1 after the plan" [ $rc = 1 ]
check "... the plan says what fits and by how many bytes it falls short (not a padded cache)" python3 -c "
import json; p = json.load(open('$T/p3.json'))
assert not p['fits'] and p['kv_blocks'] == 20 and p['kv_tokens'] == 320 and p['max_context_that_fits'] == 320, p
assert p['seqs_that_fit'] == 0 and p['short_bytes'] == 12 * 20480, p"
check "... and one warning line with the memory, the bytes short and the -c that fits" sh -c "
[ \$(wc -l <'$T/err') = 1 ] && grep -q -- '--assume-memory .* 320 tokens, less than one context of 512: 240KiB short' '$T/err' &&
grep -q -- '--ctx-size 320' '$T/err'"

$S -m "$M" --plan --assume-memory 1000 >"$T/p4.json" 2>"$T/err"
check "memory below the weights: no KV at all, a whole context short" python3 -c "
import json; p = json.load(open('$T/p4.json'))
assert not p['fits'] and p['kv_blocks'] == 0 and p['kv_tokens'] == 0 and p['kv_bytes'] == 0, p
assert p['kv_budget_bytes'] == 0 and p['short_bytes'] == 32 * 20480 and p['max_context_that_fits'] == 0, p"

check_fails "the server does not start when the memory holds no context" 1 timeout 60 $S -m "$M" --port 0 --assume-memory "$m20"
check "... saying so before it listens" sh -c "grep -q '240KiB short' '$T/err' && ! grep -q listening '$T/err'"

$S -m "$M" --plan --assume-memory 1000 --max-kv-tokens 1024 >"$T/p5.json" 2>"$T/err"
check "--max-kv-tokens sizes the cache instead: no memory read" python3 -c "
import json; p = json.load(open('$T/p5.json'))
assert p['fits'] and p['kv_tokens'] == 1024 and p['seqs_that_fit'] == 2 and p['memory_available'] is None, p"
$S -m "$M" --plan --kv-memory 400KiB >"$T/p6.json" 2>"$T/err"
check "--kv-memory too small: the bytes short in the plan" python3 -c "
import json; p = json.load(open('$T/p6.json'))
assert not p['fits'] and p['kv_blocks'] == 20 and p['short_bytes'] == 12 * 20480, p"
check "... and the size needed in the warning" grep -q -- "--kv-memory 400KiB holds 320 tokens, less than one context of 512: need --kv-memory 640KiB" "$T/err"
tap_done
