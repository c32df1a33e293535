# tests/cli/serve_bench.sh: llm-bench against llm-serve on loopback (rates,
# concurrency, formats, the plot, a trace, the gate) and on a model; usage
# errors. Bounded: a dozen short requests per run. Checks shapes and the
# correctness counts, never speed.
. tests/lib/tap.sh
T=$TMPD
B=llm-bench
check "--help exits 0 and prints the usage line" sh -c "$B --help | grep -q '^usage: llm-bench '"
check_fails "no arguments is a usage error" 2 $B
check_fails "an unknown mode is a usage error" 2 $B frob x
check_fails "a bad --format is a usage error" 2 $B --format xml serve http://127.0.0.1:1
check_fails "--rate with --concurrency is a usage error" 2 $B --rate 1 --concurrency 2 serve http://127.0.0.1:1
check_fails "a bad rate list is a usage error" 2 $B --rate 1,x serve http://127.0.0.1:1
check_fails "a server that is not there is a runtime error" 1 $B serve http://127.0.0.1:1
check_fails "an https URL is refused" 1 $B serve https://127.0.0.1:1
# bench/sampler_bench (built beside the tools): one table row per draw kind,
# the same tokens run to run
SB=$(dirname "$(readlink -f "$(command -v llm-bench)")")/../bench/sampler_bench
"$SB" 1000 >"$T/sb1" && "$SB" 1000 >"$T/sb2"
awk '{print $NF}' "$T/sb1" >"$T/sb1.sum"
awk '{print $NF}' "$T/sb2" >"$T/sb2.sum"
check "sampler_bench 1000: a header and 5 rows, the same token sums twice" sh -c \
	"[ \$(wc -l <'$T/sb1') = 6 ] && head -n 1 '$T/sb1' | grep -q '^draw ' && cmp -s '$T/sb1.sum' '$T/sb2.sum'"
check_fails "sampler_bench: a bad size is a usage error" 2 "$SB" x
if ! have_stories; then skip "llm-bench against stories260K" "no stories260K in \$LLM_TEST_MODELS"; tap_done; fi
llm-serve -m "$(stories)" --port 0 --port-file "$T/port" -t 1 2>"$T/server.log" & SP=$!
URL=$(serve_url "$T/port")
$B serve "$URL" --rate 40,inf --requests 12 --input-len 32 --output-len 16 --format csv --plot "$T/rates.svg" >"$T/csv" 2>"$T/err"
rc=$?
check "serve --rate: exit 0" [ $rc = 0 ]
check "serve --rate: # header lines, names and units rows, 2 rows, # summary" python3 -c "
import csv
lines = open('$T/csv').read().splitlines()
assert lines[0].startswith('# llm-bench serve') and any(l.startswith('# definitions: TTFT') for l in lines)
rows = [l for l in lines if not l.startswith('#')]
assert rows[0].startswith('rate,conc,sent,done,429,#wrong') and rows[1].startswith('(req/s)'), rows[:2]
data = list(csv.reader(rows[2:]))
assert len(data) == 2 and lines[-1].startswith('# summary: 2 runs'), lines
for d in data:
    assert d[2] == '12' and d[3] == '12' and d[5] == '0', d     # sent, done, #wrong
    assert float(d[7]) > 0 and float(d[9]) > 0 and float(d[12]) >= 0, d"
check "--plot draws an SVG and keeps the numbers" sh -c "grep -q '<svg' '$T/rates.svg' && [ \$(grep -vc '^#' '$T/rates.svg.dat') = 2 ]"
# progress (requests done of the run) and the closing summary on stderr
# (issue 22); -q: nothing; stdout the same but for the measured numbers
PC="python3 tests/lib/progress_check.py"
numless() { sed -E 's/[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?/N/g' "$1"; }
LLM_PROGRESS_INTERVAL=0 $B serve "$URL" --concurrency 2 --requests 6 --input-len 16 --output-len 8 --format csv >"$T/pv.csv" 2>"$T/pv.err"
check "serve: progress lines of requests done" $PC lines "$T/pv.err" llm-bench requests
check "serve: the summary counts runs, requests sent and done, wrong" sh -c \
	"tail -n 1 '$T/pv.err' | grep -Eqx 'llm-bench: 1 run, 6 requests sent, 6 done, 0 wrong in [0-9.]+ s, [0-9.]+ req/s'"
LLM_PROGRESS_INTERVAL=0 $B -q serve "$URL" --concurrency 2 --requests 6 --input-len 16 --output-len 8 --format csv >"$T/pq.csv" 2>"$T/pq.err"
check "serve -q: empty stderr" test ! -s "$T/pq.err"
a=$(numless "$T/pv.csv") b=$(numless "$T/pq.csv")
check "serve: stdout the same with and without -q but for the measured numbers" [ -n "$a" -a "$a" = "$b" ]
$B serve "$URL/v1" --concurrency 1,4 --requests 8 --input-len 16 --output-len 8 --format jsonl >"$T/jsonl"
check "serve --concurrency (URL with /v1): JSONL rows with every request right" python3 -c "
import json
rows = [json.loads(l) for l in open('$T/jsonl') if l.startswith('{')]
assert [r['concurrency'] for r in rows] == [1, 4], rows
assert all(r['spec_accept_pct'] is None for r in rows), rows     # no speculation: no drafts
assert all(r['completed'] == 8 and r['wrong'] == 0 and r['ttft_p99_ms'] >= r['ttft_p50_ms'] > 0 for r in rows), rows"
$B serve "$URL" --rate sweep:16 --requests 12 --input-len 16 --output-len 8 --slo-ttft 2000 --slo-itl 250 \
	--format jsonl --plot "$T/sweep.svg" >"$T/sweep.jsonl" 2>/dev/null
check "serve --rate sweep:16: rates doubling from 16 until saturation (or 12 runs), one halfway refinement at most; the real-time line names the highest rate that met the SLO and kept up, the plot marks it" \
	python3 - "$T/sweep.jsonl" "$T/sweep.svg.gp" <<'PY'
import json, math, re, sys
lines = open(sys.argv[1]).read().splitlines()
rows = [json.loads(l) for l in lines if l.startswith('{')]
rates = [r["rate"] for r in rows]
doubling = [r for r in rates if math.log2(r / 16).is_integer()]
assert doubling == [16 * 2 ** k for k in range(len(doubling))] and len(rates) - len(doubling) <= 1, rates
assert rates == sorted(rates) or True
keeps = lambda r: r["rejected"] == 0 and r["completed"] == r["sent"] and r["req_s"] >= 0.8 * r["rate"]
ok = [r for r in rows if keeps(r) and r["wrong"] == 0 and r["ttft_p99_ms"] <= 2000 and r["itl_p99_ms"] <= 250]
rt = [l for l in lines if l.startswith("# real-time")]
assert len(rt) == 1, lines
if ok:
    best = max(r["rate"] for r in ok)
    assert re.search(r"up to %g req/s" % best, rt[0]), (rt, best)
    assert "set arrow from %g," % best in open(sys.argv[2]).read()
else:
    assert "none of the rates" in rt[0], rt
last = max(rows, key=lambda r: r["rate"])
assert len(doubling) == 12 or not keeps(last) or any("saturation" in l for l in lines) or len(ok) < len(rows), lines
PY
check_fails "--rate sweep:x is a usage error" 2 $B --rate sweep:x serve http://127.0.0.1:1
printf '%s\n' '{"prompt": "Once upon a time", "output_len": 5}' '{"prompt": [1, 403, 407], "output_len": 7}' >"$T/trace.jsonl"
check "serve --trace: text and id prompts, all right" sh -c "$B serve '$URL' --trace '$T/trace.jsonl' --requests 4 --format csv | grep -v '^#' | tail -n 1 | cut -d, -f3-6 | grep -qx '4,4,0,0'"
printf 'nope\n' >"$T/bad.jsonl"
check_fails "a malformed trace is a runtime error naming the line" 1 $B serve "$URL" --trace "$T/bad.jsonl"
$B serve "$URL" --requests 2 --input-len 8 --output-len 4 --min-tok-s 1e12 >/dev/null 2>&1
check "--min-tok-s turns the run into a gate: exit 3" [ $? = 3 ]
# errors are counted per request, the run goes on: an HTTP error status, and
# a request cut by --timeout (the whole request, not an idle gap)
wrong_row() { $B serve "$URL" --requests 3 --output-len "$@" --format csv | grep -v '^#' | tail -n 1 | cut -d, -f3-6; }
r=$(wrong_row 4 --input-len 5000)
check "prompts longer than the context (HTTP 400): every request wrong" [ "$r" = 3,0,0,3 ]
r=$(wrong_row 200 --timeout 0.001)
check "--timeout 0.001: every request cut and wrong, open loop" [ "$r" = 3,0,0,3 ]
r=$(wrong_row 200 --timeout 0.001 --concurrency 2)
check "--timeout 0.001: every request cut and wrong, reused clients" [ "$r" = 3,0,0,3 ]
# sampling sent with every request: the server samples, every request right
$B serve "$URL" --concurrency 2 --requests 4 --output-len 6 --temperature 0.8 --top-p 0.95 --format csv >"$T/temp.csv"
check "--temperature 0.8 --top-p 0.95: said on the config line, every request right" sh -c \
	"grep -q '^# config: .*, temperature 0.8, top_p 0.95\$' '$T/temp.csv' && grep -v '^#' '$T/temp.csv' | tail -n 1 | cut -d, -f3-6 | grep -qx '4,4,0,0'"
check "greedy (no --temperature): said on the config line" sh -c "grep -q '^# config: .*, greedy\$' '$T/csv'"
check_fails "--temperature -1 is a usage error" 2 $B serve "$URL" --temperature -1
kill -TERM $SP; wait $SP
llm-serve -m "$(stories)" --port 0 --port-file "$T/port2" -t 1 --api-key sekret 2>"$T/server2.log" & SP=$!
URL=$(serve_url "$T/port2")
check "--api-key: every request right" sh -c "$B serve '$URL' --api-key sekret --concurrency 2 --requests 4 --output-len 4 --format csv | grep -v '^#' | tail -n 1 | cut -d, -f3-6 | grep -qx '4,4,0,0'"
check_fails "no --api-key against a server that wants one is a runtime error" 1 $B serve "$URL"
grep -q "^llm-bench: $URL/v1/models: HTTP 401\$" "$T/err" && ok "the error names the URL and the status" || notok "the error names the URL and the status"
kill -TERM $SP; wait $SP
$B model "$(stories)" -p 32 -n 8 -b 1,2 -r 2 -t 1 --format csv >"$T/model.csv"
check "model: pp and tg rows per batch size, none wrong" python3 -c "
import csv
rows = list(csv.reader(l for l in open('$T/model.csv') if not l.startswith('#')))
assert rows[0] == ['backend', 'threads', 'batch', 'test', 'tok_s', 'sd', 'wrong'], rows
tests = [(r[2], r[3]) for r in rows[1:]]
assert tests == [('1', 'pp32'), ('1', 'tg8 x1'), ('2', 'tg8 x2')], tests
assert all(float(r[4]) > 0 and r[6] == '0' for r in rows[1:])"
$B model "$(stories)" -p 16 -n 4 -d 200 -b 3 -r 1 -t 1 --kv-dtype bf16 --format jsonl >"$T/depth.jsonl"
check "model -d 200 --kv-dtype bf16: tests at depth 200, named so, none wrong" python3 -c "
import json
rows = [json.loads(l) for l in open('$T/depth.jsonl') if not l.startswith('#')]
assert [(r['batch'], r['test']) for r in rows] == [(1, 'pp16 @ d200'), (3, 'tg4 x3 @ d200')], rows
assert all(r['tok_s'] > 0 and r['wrong'] == 0 for r in rows)"
grep -q -- '-d 200 .*--kv-dtype bf16' "$T/depth.jsonl" && ok "model: the config line gives -d and --kv-dtype" || notok "model: the config line gives -d and --kv-dtype"
check_fails "model --kv-dtype f16 is a usage error" 2 $B model "$(stories)" --kv-dtype f16
LLM_PROGRESS_INTERVAL=0 $B model "$(stories)" -p 16 -n 4 -b 1,2 -r 2 -t 1 --format csv >"$T/mv.csv" 2>"$T/mv.err"
check "model: progress lines of runs done" $PC lines "$T/mv.err" llm-bench runs
check "model: the summary counts the tests and repetitions" sh -c \
	"tail -n 1 '$T/mv.err' | grep -Eqx 'llm-bench: 3 tests of 2 repetitions \(and a warm-up each\), 0 wrong in [0-9.]+ s'"
LLM_PROGRESS_INTERVAL=0 $B --quiet model "$(stories)" -p 16 -n 4 -b 1,2 -r 2 -t 1 --format csv >"$T/mq.csv" 2>"$T/mq.err"
check "model --quiet: empty stderr" test ! -s "$T/mq.err"
a=$(numless "$T/mv.csv") b=$(numless "$T/mq.csv")
check "model: stdout the same with and without --quiet but for the measured numbers" [ -n "$a" -a "$a" = "$b" ]
check_fails "model -d past the model's context is refused" 1 $B model "$(stories)" -p 16 -n 4 -d 1000 -r 1
grep -q "the model's context is" "$T/err" && ok "the error gives the positions needed and the context" || notok "the error gives the positions needed and the context"
# model -d past the default pool of 4096 positions a sequence: the pool is
# sized from the depth (was: "the cache has 256 blocks" at -d 4096 -n 16)
python3 -c "
import json; c = json.load(open('configs/tiny-check.json')); c['max_position_embeddings'] = 8192
c['hidden_size'] = 32; c['intermediate_size'] = 64; c['num_hidden_layers'] = 1
json.dump(c, open('$T/deep.json', 'w'))"
llm-quantize -q --random "$T/deep.json" "$T/deep" >/dev/null
check "model -d 4096 -n 16 on one sequence runs (the KV pool sized from the depth)" sh -c \
	"$B model '$T/deep' -p 0 -n 16 -d 4096 -r 1 -t 1 --format csv 2>'$T/deep.err' | grep -q '^auto,1,1,tg16'"
tap_done
