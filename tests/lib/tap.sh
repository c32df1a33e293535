# tests/lib/tap.sh: the shell side of the test harness (sourced by tests/cli/*.sh).
# Prints unnumbered TAP lines; tests/run numbers and counts them.
# Environment from tests/run: LLM_BIN (tools), LLM_TESTBIN (C test programs),
# LLM_TEST_MODELS, LLM_TEST_REF, TMPD (a scratch directory for this script).
set -u
: "${LLM_BIN:=$PWD/bin}"
: "${LLM_TEST_MODELS:=../shared/models}"
: "${LLM_TEST_REF:=../shared/reference}"
if [ -z "${TMPD:-}" ]; then mkdir -p tests/tmp; TMPD=$(mktemp -d tests/tmp/sh.XXXXXX); fi
PATH="$LLM_BIN:$PATH"
tap_fail=0
ok()    { echo "ok - $*"; }
notok() { echo "not ok - $*"; tap_fail=1; }
skip()  { echo "ok - $1 # SKIP $2"; }
diag()  { echo "# $*" ; }
# check DESC CMD...: ok when CMD succeeds
check() { local d=$1; shift; if "$@"; then ok "$d"; else notok "$d"; fi; }
# check_fails DESC STATUS CMD...: ok when CMD exits with STATUS and prints one
# stderr line (a usage error, status 2, adds the "try 'TOOL --help'" line)
check_fails() {
	local d=$1 want=$2; shift 2
	"$@" >"$TMPD/.stdout" 2>"$TMPD/err"; local rc=$?
	local lines; lines=$(wc -l <"$TMPD/err")
	local max=1; [ "$want" = 2 ] && max=2
	if [ "$rc" = "$want" ] && [ "$lines" -ge 1 ] && [ "$lines" -le $max ]; then ok "$d"; else
		notok "$d (exit $rc, want $want; $lines stderr lines)"; sed 's/^/#   /' "$TMPD/err" | head -5; fi
}
stories() { echo "$LLM_TEST_MODELS/stories260K"; }
have_stories() { [ -f "$(stories)/model.safetensors" ]; }
tap_done() { exit $tap_fail; }
# have_mpirun: status 1 (MPIRUN empty) without mpirun; else set MPIRUN
# (ranks oversubscribed: CI has 2 cores; root needs --allow-run-as-root)
# and turn LeakSanitizer off (make asan would report OpenMPI's own
# allocations at exit; single-process runs keep leak checks).
have_mpirun() {
	MPIRUN=
	command -v mpirun >/dev/null 2>&1 || return 1
	MPIRUN="mpirun --oversubscribe"
	[ "$(id -u)" = 0 ] && MPIRUN="$MPIRUN --allow-run-as-root"
	export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
}
# need_mpirun WHAT: have_mpirun, or skip WHAT and end the script
need_mpirun() {
	have_mpirun && return 0
	skip "$1" "mpirun not found (apt-get install openmpi-bin libopenmpi-dev)"
	tap_done
}
# wait_until SECS CMD...: run CMD every 0.05 s until it succeeds (status 0)
# or SECS seconds have passed (status 1). SECS is a safety bound for a loaded
# machine (tens of seconds), never what a test asserts: a test waits for an
# event, then checks it.
wait_until() {
	local end=$((SECONDS + $1)); shift
	until "$@"; do
		[ $SECONDS -ge "$end" ] && return 1
		sleep 0.05
	done
}
# serve_url PORTFILE [SECS]: wait (SECS, default 60, at most) until the
# llm-serve that writes PORTFILE answers /health 200; print its URL
serve_up() { [ -s "$1" ] && curl -sf -m 5 "http://127.0.0.1:$(cat "$1")/health" >/dev/null; }
serve_url() { wait_until "${2:-60}" serve_up "$1"; echo "http://127.0.0.1:$(cat "$1" 2>/dev/null)"; }
# sent FILE...: each FILE (a curl -v trace) shows the request body sent
sent() { local f; for f in "$@"; do grep -q '^} \[' "$f" 2>/dev/null || return 1; done; }
