# tests/cli/serve_locust.sh: the standing load test: locust runs
# tests/locust/generate.py (TGI /generate requests, greedy and sampled,
# with float seeds as TGI clients send them) headless against llm-serve on
# stories260K for 20 s with 20 users. Every request must succeed (200 with
# a generated_text) and there must be some; the request rate and latency
# percentiles are printed as comments, not asserted (the machine is shared).
# Skips when locust is absent (Debian: apt-get install python3-locust).
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then skip "the locust load" "no stories260K in \$LLM_TEST_MODELS"; tap_done; fi
if ! command -v locust >/dev/null 2>&1; then skip "the locust load" "locust not found (apt-get install python3-locust)"; tap_done; fi
LOCUSTFILE=$PWD/tests/locust/generate.py
llm-serve -m "$(stories)" --port 0 --port-file "$T/port" -t 1 2>"$T/server.log" & SP=$!
URL=$(serve_url "$T/port")
# locust writes its CSV files where it is told; it runs in $T so that
# nothing else lands in the tree
(cd "$T" && timeout 300 locust -f "$LOCUSTFILE" --headless -u 20 -r 20 -t 20s --host "$URL" \
	--csv "$T/locust" --only-summary >"$T/locust.out" 2>&1); rc=$?
check "locust exits 0 (status $rc)" [ "$rc" = 0 ]
[ "$rc" = 0 ] || sed 's/^/#   /' "$T/locust.out" | tail -20
python3 - "$T/locust_stats.csv" >"$T/verdict" <<'PY'
import csv, sys
rows = {r['Name']: r for r in csv.DictReader(open(sys.argv[1]))}
a = rows['Aggregated']
n, f = int(a['Request Count']), int(a['Failure Count'])
print(f'# {n} requests, {f} failures, {float(a["Requests/s"]):.2f} req/s, '
      f'p50 {a["50%"]} ms, p95 {a["95%"]} ms, p99 {a["99%"]} ms')
for name, r in rows.items():
    if name != 'Aggregated':
        print(f'#   {name}: {r["Request Count"]} requests, {r["Failure Count"]} failures, p50 {r["50%"]} ms')
print('PASS' if f == 0 and n >= 20 else 'FAIL')
PY
grep '^#' "$T/verdict"
check "every /generate request with a float seed succeeds, and there are at least 20" grep -qx PASS "$T/verdict"
[ -s "$T/locust_failures.csv" ] && sed -n '2,4s/^/#   failure: /p' "$T/locust_failures.csv"
kill $SP; wait $SP
check "the server exits 0" [ $? = 0 ]
tap_done
