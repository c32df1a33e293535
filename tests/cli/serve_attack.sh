# tests/cli/serve_attack.sh: llm-serve's connection manners under slow
# clients (tests/lib/slow_clients.py holds connections open with a request
# cut in its headers, or a TLS ClientHello's first bytes):
#   1. 1,100 such connections from 127.0.0.1: the server keeps
#      --max-conn-per-client of them and closes the rest at once, and a
#      normal request from 127.0.0.2 (loopback is all of 127/8) is answered;
#   2. --timeout 2 closes idle connections of both kinds;
#   3. --timeout does not count the time a request waits for the engine: a
#      request (and a stream queued behind it) that waits longer than the
#      timeout is answered whole. The wait is made by stopping the server
#      (SIGSTOP) past the timeout while the requests are in flight.
# Nothing is timed: every wait is for an event, with a generous bound.
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then skip "the connection tests" "no stories260K in \$LLM_TEST_MODELS"; tap_done; fi
if ! curl -s -o /dev/null --interface 127.0.0.2 -m 5 http://127.0.0.1:1/ 2>/dev/null && [ $? = 45 ]; then
	skip "the connection tests" "cannot send from 127.0.0.2"; tap_done
fi
HELPERS=
cleanup() { for p in $HELPERS; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT
status_is() { [ "$(cat "$1" 2>/dev/null)" = "$2" ]; }

# 1. many slow connections from one address
N=1100 PER=64
llm-serve -m "$(stories)" --port 0 --port-file "$T/port1" -t 1 --max-conn-per-client $PER --timeout 600 \
	2>"$T/server1.log" & SP=$!
URL=$(serve_url "$T/port1")
PORT=$(cat "$T/port1")
python3 tests/lib/slow_clients.py 127.0.0.1 "$PORT" $N http "$T/slow1" & H=$!
HELPERS="$HELPERS $H"
if wait_until 120 status_is "$T/slow1" "connected $N closed $((N - PER))"; then
	ok "$N slow connections from one address: $PER held (--max-conn-per-client $PER), the rest closed at accept"
else
	notok "$N slow connections from one address: $(cat "$T/slow1" 2>/dev/null), want $((N - PER)) closed"
fi
code=$(curl -s -o "$T/health" -w '%{http_code}' --interface 127.0.0.2 -m 60 "$URL/health")
check "while they are held, /health from 127.0.0.2 answers 200 (got $code)" [ "$code" = 200 ]
code=$(curl -s -o "$T/c.json" -w '%{http_code}' --interface 127.0.0.2 -m 60 "$URL/v1/completions" \
	-d '{"prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}')
eight_tokens() { python3 -c 'import json,sys; c=json.load(open(sys.argv[1]))["choices"][0]; sys.exit(len(c["token_ids"]) != 8)' "$1"; }
check "while they are held, a completion from 127.0.0.2 answers 200 (got $code)" eval '[ "$code" = 200 ] && eight_tokens "$T/c.json"'
code=$(curl -s -o /dev/null -w '%{http_code}' -m 60 "$URL/health")
check "one more connection from 127.0.0.1 is refused (got $code)" [ "$code" = 000 ]
kill $H
kill $SP; wait $SP

# 2 and 3. --timeout 2
llm-serve -m "$(stories)" --port 0 --port-file "$T/port2" -t 1 --timeout 2 --max-running 1 \
	2>"$T/server2.log" & SP=$!
URL=$(serve_url "$T/port2")
PORT=$(cat "$T/port2")
python3 tests/lib/slow_clients.py 127.0.0.1 "$PORT" 8 http "$T/slow2" & H2=$!
python3 tests/lib/slow_clients.py 127.0.0.1 "$PORT" 8 tls "$T/slow3" & H3=$!
HELPERS="$HELPERS $H2 $H3"
check "--timeout 2 closes 8 connections that stopped in their headers" wait_until 120 status_is "$T/slow2" "connected 8 closed 8"
check "--timeout 2 closes 8 connections that sent a TLS ClientHello's first bytes" \
	wait_until 120 status_is "$T/slow3" "connected 8 closed 8"
kill $H2 $H3

# one slot: the 16 choices of R1 run one after another, the stream R2 waits
# behind them; both wait for the engine while the server is stopped
curl -s -o "$T/r1.json" -w '%{http_code}' -m 300 "$URL/v1/completions" \
	-d '{"prompt": "Once", "max_tokens": 400, "n": 16, "ignore_eos": true, "temperature": 1, "seed": 1}' >"$T/r1.code" &
R1=$!
in_flight() { curl -s -m 10 "$URL/metrics" | awk -v want="$1" '/^llm_requests_(running|waiting) / {n += $2} END {exit n != want}'; }
wait_until 120 in_flight 16
curl -s -N -o "$T/r2.sse" -w '%{http_code}' -m 300 "$URL/v1/completions" \
	-d '{"prompt": "Once", "max_tokens": 20, "ignore_eos": true, "temperature": 0, "stream": true}' >"$T/r2.code" &
R2=$!
wait_until 120 in_flight 17
kill -STOP $SP
if [ -s "$T/r1.json" ] || grep -q '^data: \[DONE\]' "$T/r2.sse" 2>/dev/null; then
	kill -CONT $SP
	wait $R1 $R2
	skip "a request waiting for the engine past --timeout" "it ended before the server was stopped"
else
	sleep 3                  # the server's clock passes --timeout 2 while stopped
	kill -CONT $SP
	wait $R1 $R2
	check "a request that waited for the engine past --timeout is answered whole (HTTP $(cat "$T/r1.code"))" \
		python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); sys.exit(len(r["choices"]) != 16 or any(len(c["token_ids"]) != 400 for c in r["choices"]))' "$T/r1.json"
	check "a stream queued past --timeout ends with [DONE] (HTTP $(cat "$T/r2.code"))" \
		grep -q '^data: \[DONE\]' "$T/r2.sse"
fi
kill $SP; wait $SP
tap_done
