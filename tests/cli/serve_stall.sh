# tests/cli/serve_stall.sh: llm-serve when something would hang its engine
# (issue 45):
#   1. runtime LoRA adapters (--allow-runtime-lora) whose files are FIFOs:
#      each load is 400 at once naming the file (the engine thread blocked
#      in open(), every completion hung and /health said 200), and
#      completions go on;
#   2. the engine thread stopped (tests/lib/stop_thread.py: ptrace stops
#      that thread alone) while a request waits for it: /health turns 503
#      "stalled" past --stall-timeout 1 (it stays 200 while the stopped
#      engine has nothing to do), and 200 again once it runs;
#   3. meanwhile five requests for --max-connections 4: exactly one is
#      answered 503 with Retry-After (the fifth refused, or the fourth shed
#      for it if its request was not yet whole; it was closed unanswered),
#      the other four 200 once the engine runs.
# Nothing is timed: every wait is for an event, with a generous bound.
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then
	skip "llm-serve with a stalled engine" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
M=$(stories)
SP= ST=
cleanup() { for p in $ST $SP; do kill "$p" 2>/dev/null; done; }
trap cleanup EXIT

llm-serve -m "$M" --port 0 --port-file "$T/port" -t 1 --allow-runtime-lora --stall-timeout 1 --max-connections 4 \
	2>"$T/server.log" & SP=$!
U=$(serve_url "$T/port")
post() {   # post NAME PATH BODY: the status; the body in $T/NAME.out, headers in $T/NAME.head
	curl -s -m 60 -o "$T/$1.out" -D "$T/$1.head" -w '%{http_code}' -H 'Content-Type: application/json' -d "$3" "$U$2"
}

# 1. FIFOs where an adapter's files should be
python3 tests/cli/lora_make.py "$M/config.json" "$T/fifo1" --rank 2 --seed 1
cp -r "$T/fifo1" "$T/fifo2"
rm "$T/fifo1/adapter_model.safetensors" "$T/fifo2/adapter_config.json"
mkfifo "$T/fifo1/adapter_model.safetensors" "$T/fifo2/adapter_config.json"
for k in 1 2; do
	f=$([ $k = 1 ] && echo adapter_model.safetensors || echo adapter_config.json)
	code=$(post f$k /v1/load_lora_adapter "{\"lora_name\": \"f$k\", \"lora_path\": \"$T/fifo$k\"}")
	check "load_lora_adapter, $f a FIFO: 400 at once naming it (was a hang of the engine) (got $code)" \
		sh -c "[ '$code' = 400 ] && grep -q '$f: not a regular file' '$T/f$k.out' && grep -q '\"param\":\"lora_path\"' '$T/f$k.out'"
done
code=$(post c1 /v1/completions '{"prompt": "Once", "max_tokens": 4, "temperature": 0}')
check "... and completions are answered (got $code)" [ "$code" = 200 ]

# 2. the engine thread stopped
health() { curl -s -m 30 -o "$T/health.out" -w '%{http_code}' "$U/health"; }
stalled() { [ "$(health)" = 503 ] && grep -q '"status":"stalled"' "$T/health.out"; }
ready() { [ "$(health)" = 200 ] && grep -q '"status":"ready"' "$T/health.out"; }
rm -f "$T/hold"
mkfifo "$T/hold"
python3 tests/lib/stop_thread.py "$SP" llm-engine <"$T/hold" >"$T/stop.out" 2>&1 & ST=$!
exec 4>"$T/hold"             # the stopper's standard input: closing it lets the thread go
                             # (so no other process may hold it: 4>&- below)
wait_until 60 grep -q '^stopped\|^ptrace\|^no thread' "$T/stop.out"
if ! grep -q '^stopped' "$T/stop.out"; then
	exec 4>&-
	skip "a stalled engine: /health and the connection limit" "cannot stop the engine thread: $(cat "$T/stop.out")"
	kill -TERM $SP; wait $SP
	tap_done
fi
check "the engine thread stopped with nothing to do: /health still 200 ready" ready
curl -s -m 300 -o "$T/r1.out" -w '%{http_code}' -H 'Content-Type: application/json' \
	-d '{"prompt": "Once", "max_tokens": 4, "temperature": 0}' "$U/v1/completions" >"$T/r1.code" 4>&- &
R1=$!
check "a request waits for it: /health turns 503 stalled (was 200)" wait_until 60 stalled
check "... with the state named" grep -q '"status":"stalled"' "$T/health.out"

# 3. five requests, four connections, all waiting for the stopped engine
RS=$R1
for k in 2 3 4 5; do
	curl -s -m 300 -o "$T/r$k.out" -D "$T/r$k.head" -w '%{http_code}' -H 'Content-Type: application/json' \
		-d '{"prompt": "Once", "max_tokens": 4, "temperature": 0}' "$U/v1/completions" >"$T/r$k.code" 4>&- &
	RS="$RS $!"
done
n503() { grep -l '^503$' "$T"/r[2-5].code 2>/dev/null | wc -l; }
check "five requests for --max-connections 4: one answered 503 at once (was closed unanswered)" \
	wait_until 60 eval '[ "$(n503)" = 1 ]'
r=$(grep -l '^503$' "$T"/r[2-5].code 2>/dev/null | head -1)
check "... with Retry-After and a reason naming the limit" \
	sh -c "tr -d '\\r' <'${r%.code}.head' | grep -qix 'retry-after: 1' && grep -q 'max-connections 4' '${r%.code}.out'"
exec 4>&-                    # the engine runs again
wait_until 60 grep -q '^released' "$T/stop.out"
wait $RS
n200=$(grep -l '^200$' "$T"/r[1-5].code | wc -l)
check "once the engine runs, the other four are answered 200 (got $n200)" [ "$n200" = 4 ]
check "... and /health is 200 ready again" wait_until 60 ready
kill -TERM $SP; wait $SP
check "the server exits 0" [ $? = 0 ]
tap_done
