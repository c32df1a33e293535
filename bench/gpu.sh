#!/usr/bin/env bash
# bench/gpu.sh: the one command of a device session (issues 28 and 48):
# build for the GPU at hand, then check and measure the CUDA backend, step
# by step, the answers that matter most first, so that a call cut short
# still brings them back.
#
#   bench/gpu.sh OUTDIR [--quick] [--dry-run] [--only STEP,...] [--budget S] [--pack FILE]
#
# The device call (15 minutes of device time a session, the machine's
# start included; what is under $OUT comes back even when the call is cut):
#   bench/gpu.sh /tmp/gpu --pack $OUT/gpu.tgz      (timeout_s 480)
# and, for what failed, a second, targeted call at once (the machine stays
# warm 30 s after a call; a fresh one takes minutes of the budget):
#   bench/gpu.sh /tmp/gpu2 --only test_cuda,greedy --budget 200 --pack $OUT/gpu2.tgz
#
# Each step is timed and bounded (timeout) and, the moment it ends, writes
# OUTDIR/<step>.json ({"step", "status": "PASS|FAIL|SKIP", "seconds",
# "reason", "time_limit", "result": {numbers...}}) beside its log
# OUTDIR/<step>.log, rewrites OUTDIR/summary.json (device, driver, commit,
# every step's status so far, "complete": false until the end) and, with
# --pack FILE, packs OUTDIR into FILE (tar.gz, replaced whole), so a killed
# run leaves every finished step behind. It prints one line: "PASS step
# (12.3 s)", "FAIL step: reason" or "SKIP step: reason". A failed step
# does not stop the run; a failing test_cuda's reason and result carry its
# first failing lines (op, shape, first differing element, expected and
# got, max abs/rel error), enough to fix a kernel without another call.
# The whole run fits a budget (420 s, so that a second call fits the
# session; --quick 170 s; --budget S): a step gets at most what is left,
# and one that cannot start in time is skipped with that reason.
#
# Steps, in the order they run:
# build: make CUDA=1 CUDA_SM=<the device's compute capability> of the
#   tools every step runs (TOOLS below), test_cuda and the bench drivers;
# test_cuda: every CUDA op against the CPU backend and the plain reference,
#   the fused ops against the GPU's separate ones, replayed CUDA graphs,
#   the device sampler against common/engine/sampler.c;
# greedy: stories260K --backend cuda against the reference ids (the
#   scheduler samples on the GPU there, only ids return);
# logits_smol: a random FP8 checkpoint of the SmolLM2-135M shape, CPU
#   against CUDA: argmax agreement and top-10 log-prob differences
#   (tolerances in LOGIT_TOL below);
# batch_invariance: a prompt's greedy ids alone and in batches of 2..64;
# mpi_cuda: mpirun -np 1 on the tp1 x pp1 repartition of stories260K (a
#   plain checkpoint) with LLM_DIST=always: the distributed engine of a
#   multi-GPU node (NCCL communicators, every tensor-parallel all-reduce on
#   device buffers, the logits through rank 0), not the one-process path
#   a one-rank world takes otherwise, against the reference ids (the stage
#   boundary's send and receive need two ranks, which one GPU cannot hold);
# nccl: test_cuda's NCCL checks, alone and under mpirun -np 1;
# memcheck, racecheck: compute-sanitizer on "test_cuda sanitize" (every
#   kernel launched, on small cases; the whole test_cuda when --only names
#   the step: a targeted call);
# gemm_bench: the fused FP8 GEMM against cuBLAS BF16 on the Llama 3.1 8B
#   and 70B linear shapes (targets 1.8x at M <= 16, 0.95x at M >= 2048);
# logits_8b: as logits_smol on a random Llama-3.1-8B-shape FP8 checkpoint
#   (about 10 GB, written in the background from the build on);
# decode: llm-bench model at batch 1, 8, 32, 128 of the 8B shape against
#   the roofline of weight + KV bytes over the bandwidth measured in the run;
# startup: start to first token of the 8B checkpoint;
# serve: the serve sweep: llm-serve on the 8B checkpoint, llm-bench serve
#   with 2048-token prompts and 128-token outputs at 1, 16, 64 clients,
#   beside TensorRT-LLM's 3,450 output tok/s (8B FP8, one H100);
# eval: the evaluation job's speed-up (400 synthetic HellaSwag-like items,
#   one sequence each against shared contexts batched; target 4x);
# cuda_sh: tests/cli/cuda.sh (the dlopen'd backend, the tools on CUDA);
# gemm_sweep: the tile sweep, a new kernels/tune_table.h left in OUTDIR.
# --only STEP,...: those steps alone (build always runs first: the others
# need it; make rebuilds nothing already built). --quick: the correctness
# steps before gemm_bench, no 8B checkpoint.
# --dry-run: no device needed: the CPU build of TOOLS, the small random
# checkpoint, the CPU half of each comparison and every JSON file; device
# steps SKIP; budget 3600 s and step limits x10 (a shared CPU is slow, and
# a test must not fail by the clock). tests/cli/gpu_kit.sh runs it in make
# test, on this build's tools and from a fresh copy of the tree. With
# LLM_BIN set (a directory holding TOOLS), the dry run uses those tools
# instead of building.
#
# Models: stories260K and its reference from $LLM_TEST_MODELS and
# $LLM_TEST_REF, else shared/models and shared/reference inside the
# checkout (what travels to a device machine), else ../shared/...
# Missing build libraries: headers and libraries under .gpudeps/include and
# .gpudeps/lib are used when present (bench/results/README).
# Exit status: 0 every step passed or skipped, 3 a step failed, 2 usage,
# 143 stopped by a signal (summary.json says in which step).
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD

# every step, in order; the tools the steps run (built in both builds)
ALL_STEPS="build test_cuda greedy logits_smol batch_invariance mpi_cuda nccl memcheck racecheck gemm_bench logits_8b decode startup serve eval cuda_sh gemm_sweep"
QUICK_STEPS="build test_cuda greedy logits_smol batch_invariance mpi_cuda nccl memcheck racecheck"
TOOLS="llm-generate llm-quantize llm-bench llm-repartition llm-serve"

usage() { echo "usage: bench/gpu.sh OUTDIR [--quick] [--dry-run] [--only STEP,...] [--budget S] [--pack FILE]" >&2; exit 2; }
OUTDIR="" QUICK=0 DRY=0 ONLY="" BUDGET="" PACK=""
while [ $# -gt 0 ]; do
	a=$1
	shift
	case $a in
	--quick) QUICK=1 ;;
	--dry-run) DRY=1 ;;
	--only|--budget|--pack)
		[ $# -gt 0 ] && [ -n "$1" ] || { echo "bench/gpu.sh: $a needs a value" >&2; usage; }
		case $a in --only) ONLY=$1 ;; --budget) BUDGET=$1 ;; --pack) PACK=$1 ;; esac
		shift ;;
	-h|--help) sed -n '2,/^set -u/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
	-*) echo "bench/gpu.sh: unknown option '$a'" >&2; usage ;;
	*) [ -z "$OUTDIR" ] || { echo "bench/gpu.sh: one OUTDIR only" >&2; usage; }; OUTDIR=$a ;;
	esac
done
[ -n "$OUTDIR" ] || usage
if [ -n "$BUDGET" ] && ! [[ $BUDGET =~ ^[0-9]+$ && $BUDGET -ge 30 ]]; then
	echo "bench/gpu.sh: --budget '$BUDGET': seconds, 30 or more" >&2; usage
fi
RUN_STEPS=$ALL_STEPS
[ $QUICK = 1 ] && RUN_STEPS=$QUICK_STEPS
if [ -n "$ONLY" ]; then
	RUN_STEPS=build
	for s in ${ONLY//,/ }; do
		[[ " $ALL_STEPS " == *" $s "* ]] || { echo "bench/gpu.sh: --only: no step '$s' (steps: $ALL_STEPS)" >&2; usage; }
	done
	for s in $ALL_STEPS; do
		[ $s != build ] && [[ ",$ONLY," == *",$s,"* ]] && RUN_STEPS="$RUN_STEPS $s"
	done
fi
mkdir -p "$OUTDIR" || exit 2
OUTDIR=$(cd "$OUTDIR" && pwd)
if [ -n "$PACK" ]; then
	mkdir -p "$(dirname "$PACK")" || exit 2
	PACK=$(cd "$(dirname "$PACK")" && pwd)/$(basename "$PACK")
	case $PACK in "$OUTDIR"/*) echo "bench/gpu.sh: --pack $PACK: outside OUTDIR, please" >&2; usage ;; esac
fi
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpukit.XXXXXX") || exit 2
BG_PID=""

# step limits are scaled by LIMX (the dry run's slow, shared CPU)
LIMX=1
if [ -z "$BUDGET" ]; then
	BUDGET=420
	[ $QUICK = 1 ] && BUDGET=170
	[ $DRY = 1 ] && BUDGET=3600
fi
[ $DRY = 1 ] && LIMX=10
T0=$SECONDS
# Tolerances of the CPU-vs-CUDA logits (nats, on every log-prob both top-10
# lists hold; the argmax must agree where the CPU's margin exceeds twice
# this). The CUDA tensor-core GEMM rounds activations and dequantized
# weights to bf16 (2^-9 relative each) where the CPU keeps f32; over 30 or
# 32 layers of random weights these errors stay uncorrelated and, with
# random models' flat distributions (log-probs near -ln(n_vocab)), move a
# log-prob by far less than the 0.2-nat gaps between neighbours. First-run
# values: the device session records the measured maxima and tightens them.
LOGIT_TOL_SMOL=0.05
LOGIT_TOL_8B=0.08

export LLM_TEST_MODELS=${LLM_TEST_MODELS:-$( [ -d shared/models ] && echo "$ROOT/shared/models" || echo "$ROOT/../shared/models")}
export LLM_TEST_REF=${LLM_TEST_REF:-$( [ -d shared/reference ] && echo "$ROOT/shared/reference" || echo "$ROOT/../shared/reference")}
if [ -d .gpudeps/include ] || [ -d .gpudeps/lib ]; then
	export CPATH="$ROOT/.gpudeps/include${CPATH:+:$CPATH}"
	export LIBRARY_PATH="$ROOT/.gpudeps/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
	export LD_LIBRARY_PATH="$ROOT/.gpudeps/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
PATH="$PATH:$CUDA_HOME/bin:$CUDA_HOME/compute-sanitizer"
PY=$(command -v python3 || true)

# ---- the device --------------------------------------------------------
DEV_NAME="none" DEV_DRIVER="none" DEV_CAP="" DEV_MEM="" NODEV=""
if [ $DRY = 1 ]; then
	NODEV="dry run (no device used)"
elif ! command -v nvidia-smi >/dev/null 2>&1; then
	NODEV="no device: nvidia-smi not found"
else
	q=$(timeout 30 nvidia-smi --query-gpu=name,driver_version,compute_cap,memory.total --format=csv,noheader 2>&1 | head -n 1)
	IFS=, read -r DEV_NAME DEV_DRIVER DEV_CAP DEV_MEM <<<"$q"
	DEV_NAME=$(echo "$DEV_NAME" | sed 's/^ *//; s/ *$//') DEV_DRIVER=${DEV_DRIVER// /} DEV_CAP=${DEV_CAP// /}
	DEV_MEM=$(echo "$DEV_MEM" | sed 's/^ *//')
	[[ $DEV_CAP =~ ^[0-9]+\.[0-9]+$ ]] || { NODEV="no device: nvidia-smi says '$q'"; DEV_NAME="none"; DEV_DRIVER="none"; }
fi
SM=${DEV_CAP//./}
COMMIT=$(git rev-parse HEAD 2>/dev/null || echo unknown)
[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ] && COMMIT="$COMMIT (modified)"

# ---- steps -------------------------------------------------------------
jstr() {   # a JSON string of $1
	local s=${1//\\/\\\\}
	s=${s//\"/\\\"}
	s=$(printf '%s' "$s" | tr '\n\t\r' '   ' | tr -d '\000-\037')
	printf '"%s"' "$s"
}
STEPS=() STATUSES=()
n_pass=0 n_fail=0 n_skip=0
# summary COMPLETE [WHY]: OUTDIR/summary.json (written whole, then renamed),
# then OUTDIR packed into --pack's FILE
summary() {
	local i only=null
	[ -n "$ONLY" ] && only=$(jstr "$ONLY")
	{
		printf '{"device": %s, "driver": %s, "compute_cap": %s, "memory": %s, "commit": %s, "date": "%s", ' \
			"$(jstr "$DEV_NAME")" "$(jstr "$DEV_DRIVER")" "$(jstr "$DEV_CAP")" "$(jstr "$DEV_MEM")" "$(jstr "$COMMIT")" \
			"$(date -u +%Y-%m-%dT%H:%M:%SZ)"
		printf '"quick": %s, "dry_run": %s, "only": %s, "complete": %s, ' \
			"$([ $QUICK = 1 ] && echo true || echo false)" "$([ $DRY = 1 ] && echo true || echo false)" "$only" "$1"
		[ -n "${2:-}" ] && printf '"stopped": %s, ' "$(jstr "$2")"
		printf '"seconds": %d, "budget_s": %d, "passed": %d, "failed": %d, "skipped": %d, "steps": {' \
			$((SECONDS - T0)) "$BUDGET" $n_pass $n_fail $n_skip
		for i in "${!STEPS[@]}"; do
			[ "$i" = 0 ] || printf ', '
			printf '"%s": "%s"' "${STEPS[$i]}" "${STATUSES[$i]}"
		done
		printf '}}\n'
	} >"$OUTDIR/summary.json.tmp" && mv -f "$OUTDIR/summary.json.tmp" "$OUTDIR/summary.json"
	if [ -n "$PACK" ]; then
		tar -czf "$PACK.tmp" -C "$(dirname "$OUTDIR")" "$(basename "$OUTDIR")" 2>/dev/null && mv -f "$PACK.tmp" "$PACK"
	fi
}
# step NAME LIMIT FUNC: run FUNC with a time limit of at most LIMIT (x LIMX)
# seconds, less when the budget is short; FUNC sets STATUS (PASS by
# default), REASON and EXTRA (a JSON object of numbers) and writes its log
# to $LOG. Steps not in RUN_STEPS do not run.
step() {
	local name=$1 limit=$(($2 * LIMX)) fn=$3 left t0 secs
	[[ " $RUN_STEPS " == *" $name "* ]] || return 0
	left=$((BUDGET - (SECONDS - T0) - 15))
	[ "$limit" -gt "$left" ] && limit=$left
	STATUS=PASS REASON="" EXTRA="" LOG=$OUTDIR/$name.log TL=$limit CUR=$name
	: >"$LOG"
	t0=$(date +%s.%N)
	if [ "$limit" -lt 5 ]; then
		STATUS=SKIP REASON="out of the time budget ($BUDGET s)"
	else
		"$fn"
	fi
	secs=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
	{
		printf '{"step": "%s", "status": "%s", "seconds": %s, "reason": %s, "time_limit": %s' \
			"$name" "$STATUS" "$secs" "$(jstr "$REASON")" "$limit"
		if [ -n "$EXTRA" ] && [ "${EXTRA:0:1}" = "{" ] && [ "$EXTRA" != "{}" ]; then
			printf ', "result": %s' "$EXTRA"
		fi
		printf '}\n'
	} >"$OUTDIR/$name.json.tmp" && mv -f "$OUTDIR/$name.json.tmp" "$OUTDIR/$name.json"
	case $STATUS in
	PASS) echo "PASS $name ($secs s)"; n_pass=$((n_pass + 1)) ;;
	FAIL) echo "FAIL $name: $REASON"; n_fail=$((n_fail + 1)) ;;
	*) echo "SKIP $name: $REASON"; n_skip=$((n_skip + 1)) ;;
	esac
	STEPS+=("$name") STATUSES+=("$STATUS")
	CUR=""
	summary false
}
skip() { STATUS=SKIP REASON=$1; }
failed() { STATUS=FAIL REASON=$1; }
# tmo CMD...: CMD under the step's time limit; 124 when it ran out
tmo() { timeout -k 10 "$TL" "$@"; }
timed_out() { [ "$1" = 124 ] || [ "$1" = 137 ]; }
# need_gpu: false (and the step skipped) unless a device and a CUDA build
need_gpu() {
	[ -n "$NODEV" ] && { skip "$NODEV"; return 1; }
	[ "$BUILD_OK" = 1 ] || { skip "no CUDA build (step build failed)"; return 1; }
	return 0
}
need_py() { [ -n "$PY" ] || { failed "python3 not found"; return 1; }; }
# check_py CMD ARG...: a gpu_check.py subcommand, its JSON in EXTRA
check_py() {
	local rc
	EXTRA=$("$PY" bench/gpu_check.py "$@" 2>>"$LOG"); rc=$?
	echo "gpu_check.py $1: $EXTRA (exit $rc)" >>"$LOG"
	return $rc
}
# mpirun's command line (as root in a container: --allow-run-as-root)
MPIRUN="mpirun --oversubscribe"
[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"

BUILD_OK=0 CPU_OK=0
B=build/cuda
# use_tools DIR: the tools the steps run, from DIR
use_tools() { TB=$1 GEN=$1/llm-generate QUANT=$1/llm-quantize BENCH=$1/llm-bench REPART=$1/llm-repartition; }
use_tools "$ROOT/$B/bin"
# make of this tree alone: a make above this one (make test, make asan)
# passes its variables down in MAKEFLAGS, and exports those given on its
# command line (make asan's B, BIN, CFLAGS, LDFLAGS, CUDA) to the
# environment, where this make's ?= would take them
MAKE="env -u MAKEFLAGS -u MFLAGS -u MAKELEVEL -u B -u BIN -u CFLAGS -u LDFLAGS -u CUDA -u CC make"
have_tools() { local t; for t in $TOOLS; do [ -x "$1/$t" ] || return 1; done; }

s_build() {
	local jobs rc libs="jansson pcre2-8 utf8proc microhttpd curl" l miss="" t targets=""
	jobs=$(nproc 2>/dev/null || echo 2)
	if [ $DRY = 1 ] && [ -n "${LLM_BIN:-}" ] && have_tools "$LLM_BIN"; then
		use_tools "$LLM_BIN"
		CPU_OK=1
		skip "dry run: the tools of LLM_BIN ($LLM_BIN), no CUDA build"
		return
	fi
	for l in $libs; do
		echo 'int main(void){return 0;}' | cc -x c - -o "$WORK/l" -l"$l" >/dev/null 2>&1 || miss="$miss lib$l"
	done
	[ -z "$miss" ] || { failed "libraries missing:$miss (put headers and .so files in .gpudeps/include and .gpudeps/lib)"; return; }
	if [ $DRY = 1 ]; then
		B=build/cpu
		use_tools "$ROOT/$B/bin"
		for t in $TOOLS; do targets="$targets $B/bin/$t"; done
		tmo $MAKE -j"$jobs" CUDA=0 $targets >>"$LOG" 2>&1; rc=$?
		if [ $rc = 0 ] && have_tools "$TB"; then CPU_OK=1; skip "dry run: CPU build only (make CUDA=0 $TOOLS)"
		elif timed_out $rc; then failed "make CUDA=0 timed out after $TL s"
		else failed "make CUDA=0 failed (exit $rc): $(grep -m1 -E 'error|Error' "$LOG")"; fi
		return
	fi
	[ -n "$NODEV" ] && { skip "$NODEV"; return; }
	for t in $TOOLS; do targets="$targets $B/bin/$t"; done
	tmo $MAKE -j"$jobs" CUDA=1 CUDA_SM="$SM" $targets "$B/tests/test_cuda" "$B/bench/gemm_sweep" "$B/bench/gpu_bandwidth" \
		>>"$LOG" 2>&1; rc=$?
	if [ $rc = 0 ] && have_tools "$TB"; then BUILD_OK=1 CPU_OK=1; EXTRA="{\"cuda_sm\": \"$SM\", \"jobs\": $jobs}"
	elif timed_out $rc; then failed "make CUDA=1 CUDA_SM=$SM timed out after $TL s"
	else failed "make CUDA=1 CUDA_SM=$SM failed (exit $rc): $(grep -m1 -E 'error|Error' "$LOG")"; fi
}

# tap_counts FILE: {"ok", "not_ok", "skip"} of a TAP log
tap_counts() {
	printf '{"ok": %d, "not_ok": %d, "skip": %d}' "$(grep -c '^ok' "$1")" "$(grep -c '^not ok' "$1")" \
		"$(grep -c '^ok.*# SKIP' "$1")"
}
# tap_fail RC LOG: a failed TAP run's reason (its first failing line, which
# carries the op, shape, first differing element, expected and got) and
# EXTRA with the first failing lines and their diagnostics
tap_fail() {
	local rc=$1 first
	[ -n "$PY" ] && EXTRA=$("$PY" bench/gpu_check.py tap "$2" 2>/dev/null)
	[ "${EXTRA:0:1}" = "{" ] || EXTRA=$(tap_counts "$2")
	first=$(grep -m1 '^not ok' "$2")
	failed "exit $rc, $(grep -c '^not ok' "$2") failing: ${first:-no failing line (see the log)}"
}
s_test_cuda() {
	need_gpu || return
	local rc
	tmo "$B/tests/test_cuda" >>"$LOG" 2>&1; rc=$?
	EXTRA=$(tap_counts "$LOG")
	if timed_out $rc; then failed "timed out after $TL s (last line: $(tail -n 1 "$LOG"))"
	elif grep -q '# SKIP no CUDA device' "$LOG"; then failed "test_cuda sees no CUDA device"
	elif [ $rc != 0 ] || grep -q '^not ok' "$LOG"; then tap_fail $rc "$LOG"; fi
}
# the NCCL communicator: test_cuda's NCCL checks alone (a one-rank
# communicator, its id made in the process), then again as the one rank of
# mpirun -np 1 (the id passed over MPI), each on device buffers against
# the CPU communicator
s_nccl() {
	need_gpu || return
	local rc rc2=skipped
	NCCL_DEBUG=${NCCL_DEBUG:-WARN} tmo "$B/tests/test_cuda" nccl >>"$LOG" 2>&1; rc=$?
	if command -v mpirun >/dev/null 2>&1; then
		echo "# $MPIRUN -np 1 test_cuda nccl" >>"$LOG"
		NCCL_DEBUG=${NCCL_DEBUG:-WARN} tmo $MPIRUN -np 1 "$B/tests/test_cuda" nccl >>"$LOG" 2>&1; rc2=$?
	fi
	EXTRA=$(tap_counts "$LOG" | sed "s/}\$/, \"mpirun_exit\": \"$rc2\"}/")
	if timed_out $rc || timed_out $rc2; then failed "timed out after $TL s"
	elif grep -q '# SKIP built without NCCL' "$LOG"; then failed "the CUDA build has no NCCL (nccl.h not found)"
	elif grep -q '# SKIP no CUDA device' "$LOG"; then failed "test_cuda sees no CUDA device"
	elif [ $rc != 0 ] || { [ "$rc2" != skipped ] && [ "$rc2" != 0 ]; } || grep -q '^not ok' "$LOG"; then
		tap_fail "$rc (mpirun -np 1: $rc2)" "$LOG"
	elif [ "$rc2" = skipped ]; then REASON="mpirun not found: the id over MPI not checked"; fi
}
# sanitizer TOOL [OPTION...]: compute-sanitizer on "test_cuda sanitize"
# (every kernel once, on small cases), or on the whole test_cuda when
# --only names the step (a targeted call)
sanitizer() {
	need_gpu || return
	command -v compute-sanitizer >/dev/null || { failed "compute-sanitizer not found"; return; }
	local rc errs tool=$1 set=sanitize
	shift
	[[ ",$ONLY," == *",$CUR,"* ]] && set=""
	echo "# compute-sanitizer --tool $tool $* test_cuda $set" >>"$LOG"
	tmo compute-sanitizer --tool "$tool" --error-exitcode 99 "$@" "$B/tests/test_cuda" $set >>"$LOG" 2>&1; rc=$?
	errs=$(grep -o 'ERROR SUMMARY: [0-9]*' "$LOG" | tail -n 1 | grep -o '[0-9]*$')
	EXTRA="{\"errors\": ${errs:-null}, \"exit\": $rc, \"set\": \"${set:-whole}\"}"
	if timed_out $rc; then failed "timed out after $TL s on test_cuda ${set:-(whole)}"
	elif [ $rc != 0 ]; then
		failed "exit $rc, ${errs:-no} errors: $(grep -m1 -E '=+ (Invalid|Race|Error)|not ok' "$LOG") $(grep -m1 -E '=+ +at .*(kernel|_f32|_e4m3|bf16)' "$LOG")"
	fi
}
s_memcheck() { sanitizer memcheck --leak-check full; }
s_racecheck() { sanitizer racecheck; }
s_cuda_sh() {
	need_gpu || return
	local rc line
	# the memcheck of cuda.sh is the step memcheck above
	LLM_TEST_CUDA_SANITIZER=0 LLM_BIN=$ROOT/$B/bin LLM_TESTBIN=$ROOT/$B/tests LLM_TEST_JOBS=1 \
		tmo tests/run cuda.sh >>"$LOG" 2>&1; rc=$?
	line=$(grep -E '^[0-9]+ passed, [0-9]+ failed, [0-9]+ skipped' "$LOG" | tail -n 1)
	EXTRA=$(echo "$line" | awk '{ printf "{\"passed\": %d, \"failed\": %d, \"skipped\": %d}", $1, $3, $5 }')
	if timed_out $rc; then failed "timed out after $TL s"
	elif [ $rc != 0 ] || [ -z "$line" ]; then failed "exit $rc: $line $(grep -m1 '^not ok' "$LOG")"; fi
}
s_greedy() {
	local m=$LLM_TEST_MODELS/stories260K ref=$LLM_TEST_REF/stories260K/greedy.jsonl rc
	[ -f "$m/model.safetensors" ] && [ -f "$ref" ] || { skip "no stories260K model or reference under $LLM_TEST_MODELS, $LLM_TEST_REF"; return; }
	need_py || return
	"$PY" -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l); print(json.dumps({"prompt_ids": r["prompt_ids"], "max_tokens": r["n"], "temperature": 0}))' \
		"$ref" >"$WORK/greedy.jsonl"
	local be=cuda
	if [ -n "$NODEV" ] || [ "$BUILD_OK" != 1 ]; then
		[ "$CPU_OK" = 1 ] || { skip "no tools built"; return; }
		be=cpu   # the CPU half: the same comparison against the CPU backend
	fi
	# an f32 KV cache (the default bf16 rounds what the reference keeps)
	tmo "$GEN" -m "$m" --backend $be --kv-dtype f32 --json --temp 0 --parallel 8 <"$WORK/greedy.jsonl" >"$WORK/greedy.$be" 2>>"$LOG"; rc=$?
	if timed_out $rc; then failed "timed out after $TL s"; return; fi
	[ $rc = 0 ] || { failed "llm-generate --backend $be exit $rc: $(tail -n 1 "$LOG")"; return; }
	check_py greedy "$ref" "$WORK/greedy.$be" || { failed "--backend $be: ids differ from the reference: $EXTRA"; return; }
	[ $be = cuda ] || skip "$(need_gpu; echo "$REASON"); the CPU half passed (--backend cpu equals the reference)"
}

# --backend cuda under mpirun -np 1 with LLM_DIST=always: the distributed
# engine of a node of several GPUs on its one rank (a 1 x 1 grid on the
# plain stories260K: llm-repartition --tp 1 --pp 1 writes plain
# checkpoints): NCCL communicators over the TP and PP groups, every
# all-reduce of the one-rank TP group on device buffers, the logits through
# rank 0's gather, the step protocol; greedy ids against the reference,
# and -v's traffic lines show the all-reduce ran. Without LLM_DIST a
# one-rank run is the single-process engine (no communicator at all). Not
# reachable on one GPU: the stage boundary's send and receive (two ranks,
# and NCCL refuses two ranks on one device); test_cuda nccl checks the
# in-stage all-gather on device buffers. The dry run: the CPU half,
# --backend cpu under the same mpirun (its communicators: MPI on the host).
s_mpi_cuda() {
	local m=$LLM_TEST_MODELS/stories260K ref=$LLM_TEST_REF/stories260K/greedy.jsonl rc be=cuda ar
	[ -f "$m/model.safetensors" ] && [ -f "$ref" ] || { skip "no stories260K model or reference"; return; }
	command -v mpirun >/dev/null 2>&1 || { skip "mpirun not found"; return; }
	need_py || return
	if [ -n "$NODEV" ] || [ "$BUILD_OK" != 1 ]; then
		[ "$CPU_OK" = 1 ] || { skip "no tools built"; return; }
		be=cpu
	fi
	"$PY" -c 'import json,sys
for l in open(sys.argv[1]):
    r = json.loads(l); print(json.dumps({"prompt_ids": r["prompt_ids"], "max_tokens": r["n"], "temperature": 0}))' \
		"$ref" >"$WORK/mpi.jsonl"
	rm -rf "$WORK/tp1"
	# the tools' own round trip first: the tp1 x pp1 (plain) repartition
	"$REPART" -q "$m" "$WORK/tp1" --tp 1 --pp 1 >>"$LOG" 2>&1 ||
		{ failed "llm-repartition --tp 1 --pp 1 failed: $(tail -n 1 "$LOG")"; return; }
	# a sanitizer build (make asan) would report OpenMPI's own allocations at exit
	local ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
	export ASAN_OPTIONS
	LLM_DIST=always NCCL_DEBUG=${NCCL_DEBUG:-WARN} tmo $MPIRUN -np 1 -x LLM_DIST "$GEN" -m "$WORK/tp1" --backend $be \
		--kv-dtype f32 --json --temp 0 --parallel 8 -v <"$WORK/mpi.jsonl" >"$WORK/mpi.$be" 2>"$WORK/mpi.err"; rc=$?
	cat "$WORK/mpi.err" >>"$LOG"
	if timed_out $rc; then failed "timed out after $TL s"; return; fi
	[ $rc = 0 ] || { failed "LLM_DIST=always mpirun -np 1 llm-generate --backend $be exit $rc: $(grep -m1 -v '^llm-generate: rank\|^llm-generate: step' "$WORK/mpi.err")"; return; }
	ar=$(grep -o 'tp all-reduce [0-9]* B' "$WORK/mpi.err" | grep -o '[0-9]*' | head -n 1)
	[ "${ar:-0}" -gt 0 ] || { failed "--backend $be: -v shows no TP all-reduce: not the distributed engine"; return; }
	check_py greedy "$ref" "$WORK/mpi.$be" || { failed "--backend $be under mpirun: ids differ from the reference: $EXTRA"; return; }
	EXTRA=$(echo "$EXTRA" | sed "s/}\$/, \"tp_allreduce_bytes_per_token\": $ar}/")
	[ $be = cuda ] || skip "$(need_gpu; echo "$REASON"); the CPU half passed (LLM_DIST=always mpirun -np 1 --backend cpu equals the reference, $ar B of TP all-reduce per token)"
}

# the random checkpoints (made once, reused)
SMOL=$WORK/smol L8B=$WORK/llama8b
make_smol() {
	[ -f "$SMOL/model.safetensors" ] && return 0
	tmo "$QUANT" -q --random configs/smollm2-135m.json --dtype fp8 --seed 1 "$SMOL" >>"$LOG" 2>&1
}
# logits NAME CKPT CONFIG TOL: CPU against CUDA, greedy, top-10 log-probs
logits() {
	local ck=$2 tol=$4 rc vocab
	[ "$CPU_OK" = 1 ] || { skip "no tools built"; return; }
	need_py || return
	vocab=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["vocab_size"])' "$3")
	"$PY" bench/gpu_check.py prompts 4 12 6 "$vocab" 7 >"$WORK/$1.prompts"
	tmo "$GEN" -m "$ck" --backend cpu --kv-dtype f32 --json --temp 0 --logprobs 10 --parallel 4 <"$WORK/$1.prompts" \
		>"$WORK/$1.cpu" 2>>"$LOG"; rc=$?
	if timed_out $rc; then failed "CPU half timed out after $TL s"; return; fi
	[ $rc = 0 ] || { failed "llm-generate --backend cpu exit $rc: $(tail -n 1 "$LOG")"; return; }
	if ! need_gpu; then
		# the CPU half: the comparison of the CPU with itself must hold exactly
		check_py logits "$WORK/$1.cpu" "$WORK/$1.cpu" 0 || { failed "the comparison fails CPU against CPU: $EXTRA"; return; }
		REASON="$REASON; the CPU half ran ($(wc -l <"$WORK/$1.cpu") prompts, --logprobs 10)"
		return
	fi
	tmo "$GEN" -m "$ck" --backend cuda --kv-dtype f32 --json --temp 0 --logprobs 10 --parallel 4 <"$WORK/$1.prompts" \
		>"$WORK/$1.cuda" 2>>"$LOG"; rc=$?
	if timed_out $rc; then failed "CUDA half timed out after $TL s"; return; fi
	[ $rc = 0 ] || { failed "llm-generate --backend cuda exit $rc: $(tail -n 1 "$LOG")"; return; }
	check_py logits "$WORK/$1.cpu" "$WORK/$1.cuda" "$tol" || failed "CPU against CUDA out of tolerance $tol: $EXTRA"
}
s_logits_smol() {
	[ "$CPU_OK" = 1 ] || { skip "no tools built"; return; }
	make_smol || { failed "llm-quantize --random smollm2-135m failed: $(tail -n 1 "$LOG")"; return; }
	logits logits_smol "$SMOL" configs/smollm2-135m.json $LOGIT_TOL_SMOL
}
# the 8B-shape checkpoint (about 10 GB): started in the background after the
# build so that it is written while the GPU tests run
start_8b() {
	local need=0 s
	for s in logits_8b decode startup serve; do [[ " $RUN_STEPS " == *" $s "* ]] && need=1; done
	[ $DRY = 0 ] && [ $need = 1 ] && [ "$BUILD_OK" = 1 ] || return
	( timeout -k 10 300 "$QUANT" -q --random configs/llama-3.1-8b.json --dtype fp8 --seed 1 "$L8B" \
		>"$OUTDIR/make_8b.log" 2>&1; echo $? >"$WORK/8b.rc" ) &
	BG_PID=$!
}
have_8b() {
	[ $QUICK = 1 ] && { skip "--quick: no 8B-shape checkpoint"; return 1; }
	[ $DRY = 1 ] && { skip "dry run: the 8B-shape checkpoint (about 10 GB) is made on the device only"; return 1; }
	need_gpu || return 1
	[ -n "$BG_PID" ] || { failed "the 8B-shape checkpoint was never started"; return 1; }
	local end=$((SECONDS + TL))
	while [ ! -f "$WORK/8b.rc" ] && [ $SECONDS -lt $end ]; do sleep 1; done
	[ -f "$WORK/8b.rc" ] || { failed "the 8B-shape checkpoint was not written in time"; return 1; }
	[ "$(cat "$WORK/8b.rc")" = 0 ] || { failed "llm-quantize --random llama-3.1-8b failed: $(tail -n 1 "$OUTDIR/make_8b.log")"; return 1; }
	return 0
}
s_logits_8b() { have_8b && logits logits_8b "$L8B" configs/llama-3.1-8b.json $LOGIT_TOL_8B; }
s_batch_invariance() {
	local be=cuda n=64 len=12 sizes="2 4 8 16 32 64" rc b outs=()
	[ "$CPU_OK" = 1 ] || { skip "no tools built"; return; }
	need_py || return
	make_smol || { failed "llm-quantize --random smollm2-135m failed"; return; }
	if ! need_gpu; then be=cpu n=4 len=4 sizes="4"; fi   # the CPU half, smaller
	"$PY" bench/gpu_check.py prompts $n 20 $len 49152 11 >"$WORK/inv.prompts"
	tmo "$GEN" -m "$SMOL" --backend $be --json --temp 0 --parallel 1 <"$WORK/inv.prompts" >"$WORK/inv.1" 2>>"$LOG"; rc=$?
	[ $rc = 0 ] || { failed "--parallel 1 exit $rc"; return; }
	for b in $sizes; do
		tmo "$GEN" -m "$SMOL" --backend $be --json --temp 0 --parallel $b <"$WORK/inv.prompts" >"$WORK/inv.$b" 2>>"$LOG"; rc=$?
		[ $rc = 0 ] || { failed "--parallel $b exit $rc"; return; }
		outs+=("$WORK/inv.$b")
	done
	local why=$REASON
	check_py invariance "$WORK/inv.1" "${outs[@]}" || { failed "--backend $be: ids depend on the batch: $EXTRA"; return; }
	[ $be = cuda ] || skip "$why; the CPU half passed (--backend cpu, $n prompts, batch 1 against $sizes)"
}
s_startup() {
	have_8b || return
	local t0 t1 rc
	cat "$L8B"/*.safetensors >/dev/null
	echo '{"prompt_ids": [1], "max_tokens": 1, "temperature": 0}' >"$WORK/one.jsonl"
	t0=$(date +%s.%N)
	tmo "$GEN" -m "$L8B" --backend cuda --json <"$WORK/one.jsonl" >"$WORK/one.out" 2>>"$LOG"; rc=$?
	t1=$(date +%s.%N)
	[ $rc = 0 ] || { failed "llm-generate exit $rc: $(tail -n 1 "$LOG")"; return; }
	EXTRA=$("$PY" -c 'import json,sys
o = json.loads(open(sys.argv[1]).readline()); w = float(sys.argv[3]) - float(sys.argv[2])
print(json.dumps({"start_to_first_token_s": w, "ttft_ms": o["timings"]["ttft_ms"], "target_s": 5.0,
                  "page_cache": "warm (cat of the file first)"}))' "$WORK/one.out" "$t0" "$t1")
}
s_decode() {
	have_8b || return
	local rc
	tmo "$B/bench/gpu_bandwidth" >"$OUTDIR/bandwidth.json" 2>>"$LOG"; rc=$?
	[ $rc = 0 ] || { failed "gpu_bandwidth exit $rc: $(tail -n 1 "$LOG")"; return; }
	tmo "$BENCH" -q model "$L8B" --backend cuda -p 0 -n 64 -b 1,8,32,128 -r 3 --format jsonl \
		>"$WORK/decode.jsonl" 2>>"$LOG"; rc=$?
	cat "$WORK/decode.jsonl" >>"$LOG"
	if timed_out $rc; then failed "llm-bench timed out after $TL s"; return; fi
	[ $rc = 0 ] || { failed "llm-bench model exit $rc: $(tail -n 1 "$LOG")"; return; }
	grep '^{' "$WORK/decode.jsonl" >"$WORK/decode.rows"
	check_py decode "$L8B" "$WORK/decode.rows" "$OUTDIR/bandwidth.json" || failed "wrong rows: $EXTRA"
}
s_gemm_bench() {
	need_gpu || return
	[ $QUICK = 1 ] && { skip "--quick: correctness only"; return; }
	local rc
	tmo "$B/bench/gemm_sweep" --bench --iters 20 >"$OUTDIR/gemm.jsonl" 2>>"$LOG"; rc=$?
	if timed_out $rc; then failed "timed out after $TL s ($(wc -l <"$OUTDIR/gemm.jsonl") rows)"; return; fi
	[ $rc = 0 ] || { failed "exit $rc: $(tail -n 1 "$LOG")"; return; }
	EXTRA=$("$PY" -c 'import json,sys
r = [json.loads(l) for l in open(sys.argv[1])]
lo = [x["speedup"] for x in r if x["m"] <= 16]; hi = [x["speedup"] for x in r if x["m"] >= 2048]
print(json.dumps({"rows": len(r), "wrong": sum(x["wrong"] for x in r), "min_speedup_m_le_16": min(lo, default=None),
                  "target_m_le_16": 1.8, "min_speedup_m_ge_2048": min(hi, default=None), "target_m_ge_2048": 0.95}))' \
		"$OUTDIR/gemm.jsonl")
	echo "$EXTRA" | grep -q '"wrong": 0,' || failed "rows with wrong outputs: $EXTRA"
}
s_gemm_sweep() {
	need_gpu || return
	[ $QUICK = 1 ] && { skip "--quick: correctness only"; return; }
	local rc
	tmo "$B/bench/gemm_sweep" --iters 20 >"$OUTDIR/tune_table.h" 2>>"$LOG"; rc=$?
	if timed_out $rc; then failed "timed out after $TL s"; return; fi
	[ $rc = 0 ] && grep -q LLM_GEMM_TUNE_DEVICE "$OUTDIR/tune_table.h" || { failed "exit $rc: $(tail -n 1 "$LOG")"; return; }
	EXTRA="{\"rows\": $(grep -c '^	{' "$OUTDIR/tune_table.h"), \"table\": \"tune_table.h\"}"
}

# the serve sweep: llm-serve --backend cuda on the 8B-shape checkpoint
# (stories260K's tokenizer beside it: synthetic prompt ids < 500, any id
# out), llm-bench serve with 2048-token prompts and 128-token outputs at
# 1, 16 and 64 concurrent clients, beside TensorRT-LLM's 3,450 output tok/s
# (Llama-3.1-8B FP8, one H100); the step fails on wrong or lost requests
# only. The dry run: the same machinery on stories260K and the CPU, small.
SERVE_PID=""
s_serve() {
	local m=$LLM_TEST_MODELS/stories260K ck be=cuda inlen=2048 outlen=128 conc=1,16,64 nreq=64 rc port="" i why
	[ -f "$m/tokenizer.json" ] || { skip "no stories260K tokenizer under $LLM_TEST_MODELS"; return; }
	need_py || return
	command -v curl >/dev/null 2>&1 || { failed "curl not found (the readiness probe of llm-serve)"; return; }
	if need_gpu; then
		have_8b || return
		ck=$WORK/serve8b
		mkdir -p "$ck" && ln -sf "$L8B"/* "$ck/" && cp "$m/tokenizer.json" "$m/tokenizer_config.json" "$ck/"
	else
		[ "$CPU_OK" = 1 ] || { skip "no tools built"; return; }
		why=$REASON be=cpu ck=$m inlen=64 outlen=8 conc=1,4 nreq=8
	fi
	rm -f "$WORK/port"
	"$TB/llm-serve" -m "$ck" --backend $be --port 0 --port-file "$WORK/port" -q 2>>"$LOG" &
	SERVE_PID=$!
	for ((i = 0; i < TL * 5; i++)); do
		[ -s "$WORK/port" ] && port=$(cat "$WORK/port") && curl -sf -m 2 "http://127.0.0.1:$port/health" >/dev/null && break
		kill -0 $SERVE_PID 2>/dev/null || break
		sleep 0.2
	done
	if ! [ -n "$port" ] || ! curl -sf -m 2 "http://127.0.0.1:$port/health" >/dev/null; then
		kill -TERM $SERVE_PID 2>/dev/null; wait $SERVE_PID 2>/dev/null; SERVE_PID=""
		failed "llm-serve --backend $be did not become ready: $(tail -n 1 "$LOG")"; return
	fi
	tmo "$BENCH" serve "http://127.0.0.1:$port" --input-len $inlen --output-len $outlen --concurrency $conc \
		--requests $nreq --id-range 500 --format jsonl >"$WORK/serve.jsonl" 2>>"$LOG"; rc=$?
	kill -TERM $SERVE_PID 2>/dev/null; wait $SERVE_PID 2>/dev/null; SERVE_PID=""
	cat "$WORK/serve.jsonl" >>"$LOG"
	if timed_out $rc; then failed "llm-bench serve timed out after $TL s"; return; fi
	EXTRA=$("$PY" -c 'import json,sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")]
rows = [{k: x[k] for k in ("concurrency", "completed", "sent", "wrong", "out_tok_s", "ttft_p50_ms", "ttft_p99_ms",
                           "itl_p99_ms")} for x in r]
print(json.dumps({"backend": sys.argv[2], "input_len": int(sys.argv[3]), "output_len": int(sys.argv[4]), "rows": rows,
                  "best_out_tok_s": max((x["out_tok_s"] for x in r), default=None),
                  "beside_trtllm_h100_fp8_out_tok_s": 3450}))' "$WORK/serve.jsonl" $be $inlen $outlen) ||
		{ failed "llm-bench serve exit $rc, unreadable output: $(tail -n 1 "$LOG")"; return; }
	if [ $rc != 0 ] || ! echo "$EXTRA" | "$PY" -c 'import json,sys
d = json.load(sys.stdin); sys.exit(not d["rows"] or any(x["wrong"] or x["completed"] != x["sent"] for x in d["rows"]))'; then
		failed "llm-bench serve exit $rc: wrong or lost requests: $EXTRA"; return
	fi
	[ $be = cuda ] || skip "$why; the CPU half ran (stories260K, $inlen/$outlen tokens, $conc clients)"
}

# the evaluation job (llm-generate --eval, issue 26): N synthetic HellaSwag-like
# items on the random SmolLM2 shape given stories260K's tokenizer, (a) every
# context + ending its own sequence, one at a time, against (c) contexts
# shared, items batched by the DP; the speed-up is the measurement (the
# target is 4x), the step fails only on errors or different scores
s_eval() {
	local be=cuda n=400 rc m=$LLM_TEST_MODELS/stories260K ev=$WORK/smol-tok
	[ $QUICK = 1 ] && { skip "--quick: correctness only"; return; }
	[ "$CPU_OK" = 1 ] || { skip "no tools built"; return; }
	[ -f "$m/tokenizer.json" ] || { skip "no stories260K tokenizer under $LLM_TEST_MODELS"; return; }
	need_py || return
	if need_gpu; then
		make_smol || { failed "llm-quantize --random smollm2-135m failed"; return; }
		mkdir -p "$ev" && ln -sf "$SMOL"/* "$ev/" && cp "$m/tokenizer.json" "$m/tokenizer_config.json" "$ev/"
	else
		be=cpu n=2 ev=$m   # the CPU half: the machinery, on stories260K (fast under sanitizers too)
	fi
	"$PY" - "$WORK" "$n" <<'PY'
import json, random, sys
w, n = sys.argv[1], int(sys.argv[2])
words = "the a little girl boy cat dog sun tree park ball house mom dad friend happy big small ran saw played went".split()
rng = random.Random(1)
text = lambda k: " ".join(rng.choice(words) for _ in range(k))
with open(w + "/eval.jsonl", "w") as a, open(w + "/eval-naive.jsonl", "w") as b:
    for i in range(n):
        ctx = text(rng.randint(15, 110)).capitalize()
        ends = [" " + text(rng.randint(7, 45)) + "." for _ in range(4)]
        a.write(json.dumps({"context": ctx, "endings": ends, "label": rng.randrange(4)}) + "\n")
        for e in ends:
            b.write(json.dumps({"context": "", "endings": [ctx + e]}) + "\n")
PY
	tmo "$GEN" -m "$ev" --backend $be -c 256 --eval --json --parallel 1 --eval-batch-tokens 1 <"$WORK/eval-naive.jsonl" \
		>"$WORK/eval.a" 2>>"$LOG"; rc=$?
	if timed_out $rc; then failed "(a) timed out after $TL s"; return; fi
	[ $rc = 0 ] || { failed "(a) llm-generate --eval exit $rc: $(tail -n 1 "$LOG")"; return; }
	tmo "$GEN" -m "$ev" --backend $be -c 256 --eval --json --parallel 64 <"$WORK/eval.jsonl" >"$WORK/eval.c" 2>>"$LOG"; rc=$?
	if timed_out $rc; then failed "(c) timed out after $TL s"; return; fi
	[ $rc = 0 ] || { failed "(c) llm-generate --eval exit $rc: $(tail -n 1 "$LOG")"; return; }
	EXTRA=$("$PY" -c 'import json,sys
a = [json.loads(l) for l in open(sys.argv[1])]; c = [json.loads(l) for l in open(sys.argv[2])]
sa, sc = a[-1], c[-1]
print(json.dumps({"backend": sys.argv[3], "items": sc["items"], "naive_total_s": sa["total_s"],
                  "batched_total_s": sc["total_s"], "speedup": sa["total_s"] / sc["total_s"], "target": 4.0}))' \
		"$WORK/eval.a" "$WORK/eval.c" $be) || { failed "unreadable --eval output"; return; }
	local why=$REASON
	[ $be = cuda ] || skip "$why; the CPU half ran ($n items, $EXTRA)"
}

on_exit() {
	[ -n "$BG_PID" ] && kill "$BG_PID" 2>/dev/null
	[ -n "$SERVE_PID" ] && kill -TERM "$SERVE_PID" 2>/dev/null
	rm -rf "$WORK"
}
trap on_exit EXIT
# killed (the device call's limit): what ran stays in OUTDIR and the pack
trap 'summary false "stopped by a signal $([ -n "$CUR" ] && echo "in step $CUR" || echo "between steps")"; exit 143' TERM INT HUP
echo "# bench/gpu.sh: device $DEV_NAME (sm $SM, driver $DEV_DRIVER), commit $COMMIT, budget $BUDGET s$([ $QUICK = 1 ] && echo ', --quick')$([ $DRY = 1 ] && echo ', --dry-run')$([ -n "$ONLY" ] && echo ", --only $ONLY")"
echo "# steps: $RUN_STEPS"
CUR=""
summary false
# a step's limit (seconds; x10 in the dry run): what it needs on an H100
# or H200 with room to spare; a sanitizer named by --only runs the whole
# test_cuda and gets more
SAN_LIMIT=75
[ -n "$ONLY" ] && SAN_LIMIT=300
step build 240 s_build
start_8b
step test_cuda 60 s_test_cuda
step greedy 45 s_greedy
step logits_smol 60 s_logits_smol
step batch_invariance 60 s_batch_invariance
step mpi_cuda 45 s_mpi_cuda
step nccl 45 s_nccl
step memcheck $SAN_LIMIT s_memcheck
step racecheck $SAN_LIMIT s_racecheck
step gemm_bench 90 s_gemm_bench
step logits_8b 150 s_logits_8b
step decode 120 s_decode
step startup 60 s_startup
step serve 120 s_serve
step eval 90 s_eval
step cuda_sh 90 s_cuda_sh
step gemm_sweep 150 s_gemm_sweep
CUR=""
summary true
echo "# summary: $n_pass passed, $n_fail failed, $n_skip skipped in $((SECONDS - T0)) s ($OUTDIR/summary.json)"
[ $n_fail = 0 ] || exit 3
exit 0
