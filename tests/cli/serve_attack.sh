# tests/cli/serve_attack.sh: llm-serve's connection manners under slow
# clients (tests/lib/slow_clients.py holds connections open with a request
# cut in its headers, or a TLS ClientHello's first bytes):
#   1. 1,100 such connections from 127.0.0.1: the server keeps
#      --max-conn-per-client of them and closes the rest at once, a normal
#      request from 127.0.0.2 (loopback is all of 127/8) is answered, and so
#      is one more from 127.0.0.1 that sends its request whole (an older
#      slow one of that address is shed for it);
#   2. --timeout 2 closes idle connections of both kinds, and
#      --request-timeout closes one that trickles a header line each second
#      (never idle for --timeout) with 408;
#   3. --timeout does not count the time a request waits for the engine: a
#      request (and a stream queued behind it) that waits longer than the
#      timeout is answered whole. The wait is made by stopping the server
#      (SIGSTOP) past the timeout while the requests are in flight;
#   4. 1,100 slow connections spread over 127.0.0.2-6 (220 each) fill
#      --max-connections 1000, with a header trickler besides: 20 requests
#      from 127.0.0.7 are answered 200 (their p99 is printed, not checked).
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
check "one more connection from 127.0.0.1, its request whole, is answered (got $code; was refused unanswered)" \
	[ "$code" = 200 ]
check "... an older slow connection of 127.0.0.1 shed for it" \
	wait_until 60 status_is "$T/slow1" "connected $N closed $((N - PER + 1))"
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
kill $SP; wait $SP

# a client that sends a header line every second is never idle for
# --timeout 2; --request-timeout 4 closes it with 408
llm-serve -m "$(stories)" --port 0 --port-file "$T/port2b" -t 1 --timeout 2 --request-timeout 4 \
	2>"$T/server2b.log" & SP=$!
URL=$(serve_url "$T/port2b")
python3 - "$(cat "$T/port2b")" >"$T/trickle" <<'EOF'
import socket, sys
s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))
s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n')
s.settimeout(1.0)
got, lines = b'', 0
while lines < 120:                     # the bound of the old server, which never closed it
    try:
        s.sendall(b'X-Trickle-%d: 1\r\n' % lines)
        lines += 1
        d = s.recv(4096)
        if not d:
            break
        got += d
    except socket.timeout:
        pass
    except OSError:
        break
print(got.split(b'\r\n')[0].decode(), '|', lines)
EOF
check "--request-timeout 4: a header trickler is closed with 408 ($(cat "$T/trickle") lines sent)" \
	grep -q '^HTTP/1.1 408 Request Timeout |' "$T/trickle"
kill $SP; wait $SP

llm-serve -m "$(stories)" --port 0 --port-file "$T/port3" -t 1 --timeout 2 --max-running 1 \
	2>"$T/server3.log" & SP=$!
URL=$(serve_url "$T/port3")

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

# 4. five addresses, 220 slow connections each (1,100 > --max-connections
# 1000, each address under --max-conn-per-client 256), and a trickler
N5=220
llm-serve -m "$(stories)" --port 0 --port-file "$T/port4" -t 1 --timeout 600 --request-timeout 600 \
	2>"$T/server4.log" & SP=$!
URL=$(serve_url "$T/port4")
PORT=$(cat "$T/port4")
for a in 2 3 4 5 6; do
	python3 tests/lib/slow_clients.py 127.0.0.$a "$PORT" $N5 http "$T/slow4.$a" &
	HELPERS="$HELPERS $!"
done
all_connected() { for a in 2 3 4 5 6; do grep -q "^connected $N5 " "$T/slow4.$a" 2>/dev/null || return 1; done; }
closed_sum() { cat "$T"/slow4.* 2>/dev/null | awk '{n += $4} END {print n + 0}'; }
closed_is() { [ "$(closed_sum)" = "$1" ]; }
wait_until 300 all_connected
wait_until 120 closed_is 100
check "1,100 slow connections from 127.0.0.2-6: the 100 over --max-connections 1000 shed ($(closed_sum) closed)" closed_is 100
python3 - "$PORT" <<'EOF' & HELPERS="$HELPERS $!"
import socket, sys, time
s = socket.create_connection(('127.0.0.1', int(sys.argv[1])))
s.sendall(b'POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n')
for i in range(400):                   # one header line every 1.5 s
    time.sleep(1.5)
    try:
        s.sendall(b'X-Trickle-%d: 1\r\n' % i)
    except OSError:
        break
EOF
check "... and a trickler takes one more slot (another shed)" wait_until 120 closed_is 101
ok200=0 times=
for i in $(seq 20); do
	r=$(curl -s -o "$T/p.json" -w '%{http_code} %{time_total}' --interface 127.0.0.7 -m 60 "$URL/v1/completions" \
		-d '{"prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}')
	[ "${r% *}" = 200 ] && ok200=$((ok200 + 1))
	times="$times ${r#* }"
done
check "while they are held, 20 of 20 completions from 127.0.0.7 answer 200 (got $ok200; was an empty reply)" [ "$ok200" = 20 ]
diag "p99 (the slowest of 20) of those requests: $(printf '%s\n' $times | sort -g | tail -1) s"
curl -s -m 10 "$URL/metrics" | grep '^llm_connections' | sed 's/^/# /'
kill $SP; wait $SP
tap_done
