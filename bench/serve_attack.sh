#!/usr/bin/env bash
# bench/serve_attack.sh: a normal request's latency while one client holds
# many slow connections (tests/lib/slow_clients.py: requests cut in their
# headers) to llm-serve on stories260K. For each setting, R requests from
# 127.0.0.2 (/health, then a 8-token greedy completion), one at a time;
# prints p50 and max of curl's time_total in ms, and what became of the
# slow connections.
#   bench/serve_attack.sh [N_SLOW] [R]     (LLM_BIN: the tools, default bin/)
# Settings: no slow connections; N_SLOW with the defaults (256 per client
# held, each newer one shedding the oldest); N_SLOW all held (--max-conn-per-client 0,
# --max-connections 4096: one thread each).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-1100}
R=${2:-50}
B=${LLM_BIN:-bin}
w=$(mktemp -d /tmp/llm-bench-attack.XXXXXX)
model=${LLM_TEST_MODELS:-../shared/models}/stories260K
echo "# bench/serve_attack.sh: commit $(git rev-parse --short HEAD), $(nproc) cores," \
	"$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $R requests from 127.0.0.2 one at a time; curl time_total in ms"
printf '%-34s %-28s %12s %12s %12s %12s\n' setting slow health_p50 health_max compl_p50 compl_max

run() {
	local name=$1 n=$2; shift 2
	rm -f "$w/port" "$w/slow"
	"$B/llm-serve" -m "$model" --port 0 --port-file "$w/port" -t 1 -q "$@" 2>"$w/server.log" & local sp=$!
	for i in $(seq 1 300); do
		[ -s "$w/port" ] && curl -sf -m 2 "http://127.0.0.1:$(cat "$w/port")/health" >/dev/null && break
		sleep 0.1
	done
	local port url hp=
	port=$(cat "$w/port")
	url=http://127.0.0.1:$port
	if [ "$n" -gt 0 ]; then
		python3 tests/lib/slow_clients.py 127.0.0.1 "$port" "$n" http "$w/slow" & hp=$!
		for i in $(seq 1 1200); do [ -s "$w/slow" ] && break; sleep 0.1; done
		sleep 1              # let the server take (or close) them all
	fi
	for i in $(seq 1 "$R"); do
		curl -s -o /dev/null -w '%{time_total}\n' --interface 127.0.0.2 -m 60 "$url/health"
	done >"$w/h"
	for i in $(seq 1 "$R"); do
		curl -s -o /dev/null -w '%{time_total}\n' --interface 127.0.0.2 -m 60 "$url/v1/completions" \
			-d '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}'
	done >"$w/c"
	local slow="none"
	[ -n "$hp" ] && slow=$(cat "$w/slow" | tr ' ' '_') && kill "$hp"
	python3 - "$name" "$slow" "$w/h" "$w/c" <<'PY'
import sys
name, slow = sys.argv[1], sys.argv[2]
def st(f):
    v = sorted(float(x) * 1000 for x in open(f) if x.strip())
    return v[len(v) // 2], v[-1]
h, c = st(sys.argv[3]), st(sys.argv[4])
print(f'{name:34s} {slow:28s} {h[0]:12.2f} {h[1]:12.2f} {c[0]:12.2f} {c[1]:12.2f}')
PY
	kill "$sp"; wait "$sp" || true
}
run "none" 0
run "defaults (256 per client)" "$N"
run "all held (per-client 0, max 4096)" "$N" --max-conn-per-client 0 --max-connections 4096
rm -rf "$w"
