#!/usr/bin/env bash
# bench/locust.sh: a longer locust run of tests/locust/generate.py (TGI
# /generate, greedy and sampled, float seeds) against llm-serve on
# stories260K, one engine thread. Records the run under OUTDIR as
# locust-<host>-<date>.txt: a header (commit, machine, settings), locust's
# summary and its per-request CSV.
#   bench/locust.sh [USERS] [TIME] [OUTDIR]   (default 50 users, 120s, bench/results)
#   LLM_BIN: the tools (default bin/); LLM_LOCUST_WAIT="MIN,MAX" each
#   user's pause in seconds (default 1,5)
set -euo pipefail
cd "$(dirname "$0")/.."
U=${1:-50}
D=${2:-120s}
out=${3:-bench/results}
B=${LLM_BIN:-bin}
command -v locust >/dev/null || { echo "bench/locust.sh: locust not found (apt-get install python3-locust)" >&2; exit 1; }
w=$(mktemp -d /tmp/llm-bench-locust.XXXXXX)
model=${LLM_TEST_MODELS:-../shared/models}/stories260K
"$B/llm-serve" -m "$model" --port 0 --port-file "$w/port" -t 1 -q 2>"$w/server.log" & sp=$!
for i in $(seq 1 300); do
	[ -s "$w/port" ] && curl -sf -m 2 "http://127.0.0.1:$(cat "$w/port")/health" >/dev/null && break
	sleep 0.1
done
url=http://127.0.0.1:$(cat "$w/port")
lf=$PWD/tests/locust/generate.py
rc=0
(cd "$w" && locust -f "$lf" --headless -u "$U" -r "$U" -t "$D" --host "$url" --csv "$w/l" --only-summary \
	>"$w/summary" 2>&1) || rc=$?
kill "$sp"; wait "$sp" || true
mkdir -p "$out"
f=$out/locust-$(hostname -s)-$(date +%F).txt
{
	echo "# bench/locust.sh: commit $(git rev-parse --short HEAD), $(date -u +%FT%TZ)"
	echo "# machine: $(hostname -s), $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
	echo "# llm-serve -m stories260K -t 1 (defaults otherwise); locust -u $U -r $U -t $D, wait ${LLM_LOCUST_WAIT:-1,5} s; locust exit $rc"
	grep -v '^\[' "$w/summary"
	echo "# locust CSV (l_stats.csv)"
	cat "$w/l_stats.csv"
} >"$f"
echo "$f"
grep -A1 -m1 'Aggregated' "$w/l_stats.csv" || true
rm -rf "$w"
exit "$rc"
