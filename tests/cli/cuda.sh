# tests/cli/cuda.sh: the CUDA backend through the tools, and the GPU test
# program under compute-sanitizer. Without a device (or without CUDA
# support) the device checks are skipped with the reason, and what needs no
# device still runs: --backend cuda is a clear error, never a fallback.
# LLM_TEST_CUDA_SANITIZER=0 skips the memcheck (bench/gpu.sh runs it apart).
. tests/lib/tap.sh
T=$TMPD
TC=${LLM_TESTBIN:-build/cpu/tests}/test_cuda
reason=""
if [ ! -x "$TC" ]; then
	reason="no $TC"
elif "$TC" argmax | grep -q "# SKIP built without CUDA"; then
	reason="built without CUDA support"
elif "$TC" argmax | grep -q "# SKIP no CUDA device"; then
	reason="no CUDA device"
fi
M=$(stories)
REF=$LLM_TEST_REF/stories260K/greedy.jsonl

# The CUDA backend is libllm_cuda.so, loaded only when asked for
# (common/engine/backend.c): the CPU backend of a CUDA build maps no CUDA library,
# and without the library --backend cuda is an error naming it.
LIB=$LLM_BIN/../lib/libllm_cuda.so
dl_checks="a CUDA build's llm-generate needs no CUDA library at start (readelf)
llm-generate --backend cpu of a CUDA build loads no CUDA library (LD_DEBUG=files)
llm-generate --backend cuda loads libllm_cuda.so and its CUDA libraries
without libllm_cuda.so, --backend cuda is a one-line error naming it, and auto runs on the CPU
libllm_cuda.so takes from the program only the functions of kernels/imports.list"
if [ ! -f "$LIB" ]; then
	echo "$dl_checks" | while read -r c; do skip "$c" "not a CUDA build (no $LIB)"; done
elif ! have_stories; then
	echo "$dl_checks" | while read -r c; do skip "$c" "no stories260K in \$LLM_TEST_MODELS"; done
else
	check "a CUDA build's llm-generate needs no CUDA library at start (readelf)" \
		sh -c "readelf -d '$LLM_BIN/llm-generate' >'$T/dyn' && grep -q NEEDED '$T/dyn' && ! grep -qE 'lib(cudart|cublas|nccl|llm_cuda)' '$T/dyn'"
	LD_DEBUG=files llm-generate -m "$M" --backend cpu -p "Once" -n 2 --temp 0 >/dev/null 2>"$T/ld.cpu"; rc=$?
	check "llm-generate --backend cpu of a CUDA build loads no CUDA library (LD_DEBUG=files; exit $rc)" \
		sh -c "[ $rc = 0 ] && grep -q 'file=' '$T/ld.cpu' && ! grep -qE 'file=[^ ]*lib(cudart|cublas|llm_cuda)' '$T/ld.cpu'"
	LD_DEBUG=files llm-generate -m "$M" --backend cuda -p "Once" -n 2 --temp 0 >/dev/null 2>"$T/ld.cuda"
	check "llm-generate --backend cuda loads libllm_cuda.so and its CUDA libraries" \
		sh -c "grep -q 'file=[^ ]*/lib/libllm_cuda.so' '$T/ld.cuda' && grep -q 'file=libcublas' '$T/ld.cuda'"
	mkdir -p "$T/alone/bin"
	cp "$LLM_BIN/llm-generate" "$T/alone/bin/"
	"$T/alone/bin/llm-generate" -m "$M" --backend cuda -p "Once" -n 2 --temp 0 >/dev/null 2>"$T/alone.err"; rc=$?
	"$T/alone/bin/llm-generate" -m "$M" --backend auto -p "Once" -n 2 --temp 0 >"$T/alone.out" 2>/dev/null; rc2=$?
	check "without libllm_cuda.so, --backend cuda is a one-line error naming it, and auto runs on the CPU (exit $rc: $(head -n 1 "$T/alone.err"); auto exit $rc2)" \
		sh -c "[ $rc = 1 ] && [ \$(wc -l <'$T/alone.err') = 1 ] && grep -q 'libllm_cuda.so not found' '$T/alone.err' && [ $rc2 = 0 ] && [ -s '$T/alone.out' ]"
	nm -D --undefined-only "$LIB" | awk '$NF ~ /^llm_/ { print $NF }' | sort -u >"$T/imports"
	sed -n 's/^[[:space:]]*\(llm_[a-z0-9_]*\);.*/\1/p' kernels/imports.list | sort -u >"$T/listed"
	extra=$(comm -23 "$T/imports" "$T/listed" | tr '\n' ' ')
	check "libllm_cuda.so takes from the program only the functions of kernels/imports.list (${extra:-none beyond: $(tr '\n' ' ' <"$T/listed")})" \
		sh -c "[ -s '$T/imports' ] && [ -z '$extra' ]"
fi

if [ -n "$reason" ]; then
	if have_stories; then
		llm-generate -m "$M" --backend cuda -p "Once" -n 4 --temp 0 >"$T/out" 2>"$T/err"; rc=$?
		check "llm-generate --backend cuda without a device is an error, not a fallback (exit $rc: $(head -c 120 "$T/err"))" \
			[ "$rc" = 1 ] && grep -q -e "no CUDA device" -e "built without CUDA support" "$T/err"
	else
		skip "llm-generate --backend cuda without a device is an error" "no stories260K in \$LLM_TEST_MODELS"
	fi
	skip "compute-sanitizer memcheck clean on test_cuda" "$reason"
	skip "llm-generate --backend cuda: greedy tokens on stories260K equal the reference" "$reason"
	skip "llm-generate --backend cuda and --backend cpu give the same greedy tokens" "$reason"
	skip "mpirun -np 1 llm-generate --backend cuda on a tp1 checkpoint: greedy ids equal --backend cpu's" "$reason"
	tap_done
fi

if [ "${LLM_TEST_CUDA_SANITIZER:-1}" = 0 ]; then
	skip "compute-sanitizer memcheck clean on test_cuda" "LLM_TEST_CUDA_SANITIZER=0 (bench/gpu.sh runs it as its own step)"
elif command -v compute-sanitizer >/dev/null 2>&1; then
	compute-sanitizer --tool memcheck --error-exitcode 1 --leak-check full "$TC" >"$T/san" 2>&1; rc=$?
	check "compute-sanitizer memcheck clean on test_cuda (exit $rc)" [ "$rc" = 0 ]
	[ "$rc" = 0 ] || grep -E "ERROR SUMMARY|Invalid|not ok" "$T/san" | head -10 | sed 's/^/#   /'
else
	skip "compute-sanitizer memcheck clean on test_cuda" "compute-sanitizer not in PATH"
fi

if ! have_stories || [ ! -f "$REF" ]; then
	skip "llm-generate --backend cuda: greedy tokens on stories260K equal the reference" "no stories260K model or reference"
	skip "llm-generate --backend cuda and --backend cpu give the same greedy tokens" "no stories260K model"
	skip "mpirun -np 1 llm-generate --backend cuda on a tp1 checkpoint: greedy ids equal --backend cpu's" "no stories260K model"
	tap_done
fi
python3 - "$REF" "$T" <<'PY'
import json, sys
ref, t = sys.argv[1], sys.argv[2]
with open(t + "/ids.jsonl", "w") as a:
    for l in open(ref):
        r = json.loads(l)
        a.write(json.dumps({"prompt_ids": r["prompt_ids"], "max_tokens": r["n"], "temperature": 0}) + "\n")
PY
llm-generate -m "$M" --backend cuda --kv-dtype f32 --json --parallel 8 <"$T/ids.jsonl" >"$T/cuda.jsonl" 2>"$T/err"
check "llm-generate --backend cuda runs the reference prompts (exit 0)" [ $? = 0 ]
llm-generate -m "$M" --backend cpu --kv-dtype f32 --json --parallel 8 <"$T/ids.jsonl" >"$T/cpu.jsonl" 2>/dev/null
python3 - "$REF" "$T/cuda.jsonl" <<'PY' >"$T/cmp"
import json, sys
refs = [json.loads(l) for l in open(sys.argv[1])]
outs = [json.loads(l) for l in open(sys.argv[2])]
bad = 0
for r, o in zip(refs, outs):   # ids equal up to the first margin < 1e-3 (the reference rule)
    n = next((i for i, m in enumerate(r["margins"]) if m < 1e-3), r["n"])
    if o["ids"][:n] != r["ids"][:n]:
        bad += 1; print("# %s: ids differ before position %d" % (r["id"], n))
print("bad %d of %d" % (bad, len(refs)) if len(outs) == len(refs) else "bad: %d outputs" % len(outs))
PY
grep "^#" "$T/cmp"
check "llm-generate --backend cuda: greedy tokens on stories260K equal the reference ($(tail -n 1 "$T/cmp"))" \
	grep -q "^bad 0 of" "$T/cmp"
check "llm-generate --backend cuda and --backend cpu give the same greedy tokens" \
	python3 -c 'import json,sys; a=[json.loads(l)["ids"] for l in open(sys.argv[1])]; b=[json.loads(l)["ids"] for l in open(sys.argv[2])]; sys.exit(a!=b)' "$T/cuda.jsonl" "$T/cpu.jsonl"

# --backend cuda under mpirun (no longer refused): one rank on the tp1 x
# pp1 repartition of stories260K (a plain checkpoint), through the
# distributed engine (LLM_DIST=always: NCCL communicators, the TP
# all-reduces on device buffers), its greedy ids against the CPU's
d="mpirun -np 1 llm-generate --backend cuda on a tp1 checkpoint: greedy ids equal --backend cpu's"
if ! command -v mpirun >/dev/null 2>&1; then
	skip "$d" "mpirun not found"
elif ! llm-repartition -q "$M" "$T/tp1" --tp 1 --pp 1 2>"$T/rp.err"; then
	notok "$d: llm-repartition --tp 1 --pp 1: $(head -n 1 "$T/rp.err")"
else
	MPIRUN="mpirun --oversubscribe"
	[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
	LLM_DIST=always timeout 300 $MPIRUN -np 1 -x LLM_DIST llm-generate -m "$T/tp1" --backend cuda --kv-dtype f32 --json --parallel 8 <"$T/ids.jsonl" \
		>"$T/mpi.jsonl" 2>"$T/mpi.err"; rc=$?
	check "$d (exit $rc$([ $rc = 0 ] || echo ": $(head -n 1 "$T/mpi.err")"))" sh -c "[ $rc = 0 ] && python3 -c 'import json,sys; a=[json.loads(l)[\"ids\"] for l in open(sys.argv[1])]; b=[json.loads(l)[\"ids\"] for l in open(sys.argv[2])]; sys.exit(not a or a!=b)' '$T/mpi.jsonl' '$T/cpu.jsonl'"
fi
tap_done
