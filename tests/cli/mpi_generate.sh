# tests/cli/mpi_generate.sh: the distributed forward pass (partition.h,
# generate.h) through llm-generate under mpirun: tp2, pp2 and tp2 x pp2 on
# stories260K (F32; FP8 at tp2 x pp2), tp3, pp2 and tp3 x pp2 on a random SmolLM2-135M-shape
# checkpoint (BF16; 9 heads, 3 kv heads: --tp 3); greedy ids equal the
# single-process run and log-probs agree within LP_TOL; only rank 0 writes
# stdout; -v counts the stage-boundary bytes (fused: half the unfused,
# sliced: 1/T of the unsliced); --perplexity and --score agree; a broken
# rank file, a wrong -np and an unpartitioned checkpoint end the job with a
# message naming the rank, never a hang; speculative decoding's rollbacks
# reach every rank; LLM_DIST=always runs one rank (under mpirun -np 1 and
# alone) through the distributed engine with the same ids.
# Ranks are oversubscribed (CI has 2 cores), one thread each.
. tests/lib/tap.sh
T=$TMPD
need_mpirun "llm-generate under mpirun"
if ! have_stories; then
	skip "llm-generate under mpirun" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
# LeakSanitizer would report OpenMPI's own allocations (as in mpi.sh)
# f32 activations in every matmul (the avx512bf16 level rounds them to BF16
# for BF16 weights, which moves log-probs by ~1e-2 when the all-reduce sums
# in another order); ids are compared exactly either way
if grep -q avx2 /proc/cpuinfo 2>/dev/null; then export LLM_CPU_ISA=avx2; else export LLM_CPU_ISA=scalar; fi
LP_TOL=1e-4      # |log-prob difference|: f32 rounding of reordered sums
# an f32 KV cache: bf16 (the default) would round keys and values that the
# reordered sums moved by an ulp to neighbours 2^-8 apart
gen1() { llm-generate -t 1 --kv-dtype f32 "$@"; }   # the single process
mpigen() { local n=$1; shift; timeout 300 $MPIRUN -np "$n" -x LLM_CPU_ISA llm-generate -t 1 --kv-dtype f32 "$@"; }

# same REF OUT: ids identical, log-probs (chosen and top) within LP_TOL
same() {
	python3 - "$1" "$2" "$LP_TOL" <<'EOF'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
tol = float(sys.argv[3])
assert len(a) == len(b) and a, (len(a), len(b))
worst = 0.0
for x, y in zip(a, b):
    assert x['ids'] == y['ids'], (x['ids'], y['ids'])
    for p, q in zip(x['logprobs'], y['logprobs']):
        worst = max(worst, abs(p - q))
    for tp, tq in zip(x['top_logprobs'], y['top_logprobs']):
        assert [e['id'] for e in tp] == [e['id'] for e in tq]
        for p, q in zip(tp, tq):
            worst = max(worst, abs(p['logprob'] - q['logprob']))
assert worst <= tol, worst
print('%d prompts, %d tokens, max |dlogprob| %.2g' % (len(a), sum(len(x['ids']) for x in a), worst))
EOF
}

# run_cmp DESC NP MODEL REF: generate PROMPTS distributed, compare with REF
run_cmp() {
	local d=$1 n=$2 m=$3 ref=$4 how
	mpigen "$n" -m "$m" --json --temp 0 --logprobs 3 <"$T/prompts" >"$T/out.json" 2>"$T/err"; local rc=$?
	if [ $rc = 0 ] && how=$(same "$ref" "$T/out.json" 2>&1); then ok "$d: greedy ids equal the single process ($how)"
	else notok "$d: exit $rc: $how"; sed 's/^/#   /' "$T/err" | head -5; fi
}

S=$(stories)
# the long prompt makes a first step of > 64 tokens: pipeline micro-batches
long="Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. One day, she saw a big, red ball in the park. She ran to the ball and kicked it very hard. The ball went up high"
printf '%s\n' '{"prompt":"Once upon a time","max_tokens":16}' '{"prompt":"The cat sat","max_tokens":16}' \
	'{"prompt":"Lily and Tom went to the park","max_tokens":16}' "{\"prompt\":\"$long\",\"max_tokens\":16}" >"$T/prompts"
gen1 -m "$S" --json --temp 0 --logprobs 3 <"$T/prompts" >"$T/ref.json"
mpigen 2 -m "$S" -p x -n 1 >/dev/null 2>"$T/err"
if grep -q "built without MPI" "$T/err"; then
	skip "llm-generate under mpirun" "this build has no MPI (no mpicc when it was built)"
	tap_done
fi
for g in "2 1" "1 2" "2 2"; do
	set -- $g
	llm-repartition -q "$S" "$T/s$1$2" --tp "$1" --pp "$2"
	run_cmp "stories260K F32 tp$1 x pp$2 (mpirun -np $(($1 * $2)))" $(($1 * $2)) "$T/s$1$2" "$T/ref.json"
done
check "only rank 0 writes stdout: one JSON line per prompt" [ "$(wc -l <"$T/out.json")" = 4 ]
# LLM_DIST=always: one rank through the distributed engine, as bench/gpu.sh
# step mpi_cuda runs it on a device (a 1 x 1 grid on the plain checkpoint:
# llm-repartition --tp 1 --pp 1 writes plain ones); its one-rank TP group
# runs every all-reduce, so -v counts their bytes
for how in "mpirun -np 1" "one process"; do
	if [ "$how" = "one process" ]; then
		LLM_DIST=always gen1 -m "$S" --json --temp 0 --logprobs 3 -v <"$T/prompts" >"$T/one.json" 2>"$T/one.err"
	else
		LLM_DIST=always mpigen 1 -m "$S" --json --temp 0 --logprobs 3 -v <"$T/prompts" >"$T/one.json" 2>"$T/one.err"
	fi
	rc=$?
	check "LLM_DIST=always, $how: greedy ids equal the plain run (exit $rc: $(same "$T/ref.json" "$T/one.json" 2>&1 | tail -n 1))" \
		same "$T/ref.json" "$T/one.json"
	check "... through the distributed engine: -v counts the one-rank TP group's all-reduce ($(grep -o 'tp all-reduce [0-9]* B' "$T/one.err"))" \
		grep -q 'rank 0 (stage 0, tp 0): .* tp all-reduce [1-9][0-9]* B' "$T/one.err"
done
LLM_DIST=sometimes gen1 -m "$S" -p x -n 1 >/dev/null 2>"$T/err"; rc=$?
check "LLM_DIST=sometimes is an error naming it (exit $rc: $(head -n 1 "$T/err"))" \
	sh -c '[ "$1" != 0 ] && grep -q "LLM_DIST=sometimes: not always" "$2"' _ "$rc" "$T/err"
# FP8 (1xK: d_ff 172 splits at 86) with the embedding and lm_head in FP8,
# split by vocabulary rows with their per-row scales
llm-quantize -q --block 1xK --fp8-vocab "$S" "$T/s8" && llm-repartition -q "$T/s8" "$T/s8-22" --tp 2 --pp 2
gen1 -m "$T/s8" --json --temp 0 --logprobs 3 <"$T/prompts" >"$T/ref8.json"
run_cmp "stories260K FP8 with an FP8 embedding, tp2 x pp2 (mpirun -np 4)" 4 "$T/s8-22" "$T/ref8.json"
# the default FP8 file (the tied head F32): each last-stage rank quantizes
# its vocabulary slice of the head at load (--lm-head auto), as one process
# quantizes the whole head, row by row
llm-quantize -q --block 1xK "$S" "$T/s8d" && llm-repartition -q "$T/s8d" "$T/s8d-22" --tp 2 --pp 2
gen1 -m "$T/s8d" --json --temp 0 --logprobs 3 <"$T/prompts" >"$T/ref8d.json"
run_cmp "stories260K default FP8, the head quantized at load on each rank's slice, tp2 x pp2 (mpirun -np 4)" 4 "$T/s8d-22" "$T/ref8d.json"

# -p streams the same text
gen1 -m "$S" -p "Once upon a time" -n 24 --temp 0 >"$T/p1.txt"
mpigen 4 -m "$T/s22" -p "Once upon a time" -n 24 --temp 0 >"$T/p4.txt" 2>"$T/err"
check "-p under mpirun -np 4 streams the single-process text byte for byte" cmp -s "$T/p1.txt" "$T/p4.txt"
# speculative decoding: rank 0's rollbacks of rejected drafts (a KV
# truncation in the step journal) replayed by every rank, and steps of 16
# sequences x (1 + 4) logit rows (every rank's logit rows sized from the
# flags); the same ids
for i in 1 2 3 4 5; do sed 's/"max_tokens":16/"max_tokens":48/' "$T/prompts"; done >"$T/prompts48"
gen1 -m "$S" --json --temp 0 --logprobs 3 <"$T/prompts48" >"$T/ref48.json"
mpigen 4 -m "$T/s22" --json --temp 0 --logprobs 3 --parallel 16 --prefix-cache 0 --speculate ngram -v <"$T/prompts48" >"$T/spec.json" 2>"$T/spec.err"
check "--speculate ngram, --parallel 16 under mpirun -np 4 (tp2 x pp2): greedy ids equal the single process ($(same "$T/ref48.json" "$T/spec.json" 2>&1 | tail -1); $(grep -o '[0-9]* of [0-9]* drafted tokens accepted' "$T/spec.err"))" \
	same "$T/ref48.json" "$T/spec.json"
check "... and drafts were accepted" grep -q ' [1-9][0-9]* of [0-9]* drafted tokens accepted' "$T/spec.err"

# the stage-boundary bytes of -v: fused (half of residual + hidden state
# sent apart) and sliced (1/T of every TP rank sending all of x)
mpigen 4 -m "$T/s22" --json --temp 0 -v <"$T/prompts" >/dev/null 2>"$T/v.err"
line=$(grep "stage boundary 0->1 per token" "$T/v.err")
if echo "$line" | grep -q "256 B sent.* 512 B unfused (2.0x); 512 B unsliced (2.0x)"; then ok "-v: the boundary carries 256 B/token (d_model 64 f32), 2x less than unfused, 2x (T) less than unsliced"
else notok "-v boundary line: '$line'"; sed 's/^/#   /' "$T/v.err" | head -8; fi
check "-v: every rank's traffic is reported by rank 0" [ "$(grep -c '^llm-generate: rank [0-3] (stage' "$T/v.err")" = 4 ]
# one protocol (the server's): rank 0 plans and leads, the others replay its steps
check "-v: ranks 1-3 followed every step rank 0 led ($(grep -o 'rank 0 led [0-9]* steps' "$T/v.err"))" python3 - "$T/v.err" <<'EOF'
import re, sys
st = {int(r): (int(n), int(k), int(t)) for r, n, k, t in
      re.findall(r"step protocol: rank (\d) (?:led|followed) (\d+) steps of rank 0 \((\d+) KV operations, (\d+) tokens", open(sys.argv[1]).read())}
assert sorted(st) == [0, 1, 2, 3] and st[0][0] > 0 and len(set(st.values())) == 1, st
EOF
check "-v: the long prefill step ran as pipeline micro-batches ($(grep -o '[0-9]* steps ([0-9]* micro-batches)' "$T/v.err" | head -1))" \
	sh -c "grep '^llm-generate: rank 0 ' '$T/v.err' | grep -qE '([0-9]+) steps \(([0-9]+) micro' && [ \$(grep '^llm-generate: rank 0 ' '$T/v.err' | sed -E 's/.* ([0-9]+) steps \(([0-9]+) micro.*/\2 - \1/' | bc) -gt 0 ]"

# perplexity and scoring: the same numbers
head -c 2000 "$S/stories260K.md" >"$T/text.txt" 2>/dev/null || printf 'Once upon a time there was a little girl named Lily. She liked to play in the park with her friends.\n' >"$T/text.txt"
gen1 -m "$S" --perplexity "$T/text.txt" -c 64 --json >"$T/ppl1" 2>&1
mpigen 4 -m "$T/s22" --perplexity "$T/text.txt" -c 64 --json >"$T/ppl4" 2>"$T/err"
check "--perplexity under mpirun -np 4: the same nll within 1e-3" python3 -c "
import json
a, b = json.load(open('$T/ppl1')), json.load(open('$T/ppl4'))
assert a['tokens'] == b['tokens'] and abs(a['nll'] - b['nll']) <= 1e-3 * max(1, abs(a['nll'])), (a, b)"
echo '{"context":"Once upon a time","continuations":[" there was"," the cat"]}' >"$T/score"
gen1 -m "$S" --score <"$T/score" >"$T/sc1"
mpigen 2 -m "$T/s12" --score <"$T/score" >"$T/sc2" 2>"$T/err"
check "--score under mpirun -np 2 (pp2): the same log-likelihoods within 1e-4" python3 -c "
import json
a, b = json.load(open('$T/sc1')), json.load(open('$T/sc2'))
assert a['greedy'] == b['greedy'] and all(abs(x - y) <= 1e-4 for x, y in zip(a['logprobs'], b['logprobs'])), (a, b)"

# failures: the job ends, naming the rank, within the timeout
fails() {
	local d=$1 pat=$2; shift 2
	local start=$SECONDS
	"$@" </dev/null >/dev/null 2>"$T/f.err"; local rc=$?
	if [ $rc != 0 ] && [ $rc != 124 ] && grep -qE -- "$pat" "$T/f.err"; then ok "$d: exit $rc after $((SECONDS - start)) s: $(grep -E -- "$pat" "$T/f.err" | head -1 | cut -c1-140)"
	else notok "$d: exit $rc (want /$pat/)"; sed 's/^/#   /' "$T/f.err" | head -5; fi
}
cp -r "$T/s21" "$T/bad"
truncate -s 1000 "$T/bad/rank-00001-pp0-tp1.safetensors"
fails "a truncated rank file ends the job" "rank 1 of 2: .*rank-00001-pp0-tp1.safetensors" mpigen 2 -m "$T/bad" -p x -n 4
fails "mpirun -np 4 on a tp2 checkpoint is refused" "partitioned for --tp 2 x --pp 1 = 2 ranks, but 4 were launched" \
	mpigen 4 -m "$T/s21" -p x -n 4
fails "an unpartitioned checkpoint under mpirun -np 2 is refused" "needs a checkpoint partitioned by llm-repartition" \
	mpigen 2 -m "$S" -p x -n 4
fails "--backend cuda under mpirun without CUDA support or a device fails at the backend" "distributed runs|CUDA|cuda|NCCL" \
	mpigen 2 -m "$T/s21" -p x -n 4 --backend cuda

# a random SmolLM2-135M-shape checkpoint (BF16): 9 heads, 3 kv heads
llm-quantize -q --random configs/smollm2-135m.json --dtype bf16 --seed 1 "$T/smol" 2>"$T/err" ||
	{ notok "llm-quantize --random smollm2-135m"; sed 's/^/#   /' "$T/err" | head -3; tap_done; }
printf '%s\n' '{"prompt_ids":[1,200,300,400],"max_tokens":8}' '{"prompt_ids":[1,5000,17,42,99,1000],"max_tokens":8}' >"$T/prompts"
gen1 -m "$T/smol" --json --temp 0 --logprobs 3 <"$T/prompts" >"$T/sref.json"
for g in "3 1" "1 2" "3 2"; do
	set -- $g
	llm-repartition -q "$T/smol" "$T/m$1$2" --tp "$1" --pp "$2"
	run_cmp "SmolLM2-135M shape BF16 tp$1 x pp$2 (mpirun -np $(($1 * $2)))" $(($1 * $2)) "$T/m$1$2" "$T/sref.json"
	rm -rf "$T/m$1$2"
done
tap_done
