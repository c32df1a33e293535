# tests/cli/serve_openai.sh: llm-serve driven by the official openai npm
# client (tests/js/openai.mjs): completions, chat, streaming, stop, seeds,
# logprobs, n, error classes, an aborted stream. Needs node and
# `npm ci --prefix tests/js` (CI runs it); skipped with a reason otherwise.
. tests/lib/tap.sh
T=$TMPD
if ! have_stories; then skip "the openai client against stories260K" "no stories260K in \$LLM_TEST_MODELS"; tap_done; fi
if ! command -v node >/dev/null; then skip "the openai client" "no node"; tap_done; fi
if [ ! -d tests/js/node_modules/openai ]; then skip "the openai client" "tests/js/node_modules lacks openai (npm ci --prefix tests/js)"; tap_done; fi
llm-serve -m "$(stories)" --port 0 --port-file "$T/port" -t 1 --kv-dtype f32 --api-key k3y \
	--chat-template tests/data/chat-template.jinja 2>"$T/server.log" & SP=$!
LLM_SERVE_URL=$(serve_url "$T/port")/v1 LLM_SERVE_KEY=k3y LLM_REF=$LLM_TEST_REF/stories260K/greedy.jsonl \
	timeout 300 node tests/js/openai.mjs || tap_fail=1
kill -TERM $SP; wait $SP
check "the server exits 0 after the client run" [ $? = 0 ]
tap_done
