#!/usr/bin/env bash
# bench/depth_128k.sh: one prompt that fills the whole 131,072-position
# context of a tiny long-context model, run to the end in llm-generate and
# llm-serve: prefill time, generation speed at that depth, peak RSS.
#
#   bench/depth_128k.sh [WORKDIR] [RUN...]
#
# RUN is any of gen-f32 gen-fp8 serve-f32 serve-fp8 (default: gen-f32
# serve-fp8 serve-f32) and split-N, run one after another, never two at once.
# split-N: the first N ids of the prompt through llm-generate -n 1 (f32 KV)
# under perf record (499 Hz): user CPU seconds and the share of samples in
# attention (the symbols attn_task, softmax_*, scores_*, wsum_*,
# llm_cpu_attn_*) against everything else, as ms per prompt token.
# Environment: LLM_BIN (the tools, default bin), N [131056] prompt tokens,
# NGEN [16] generated tokens (N + NGEN = 131072 by default), THREADS [1].
#
# The model: llm-quantize --random --dtype fp8 --seed 1 of a Llama-3.2-1B
# shape made small (hidden 256, intermediate 1024, 2 layers, 4 heads of 64,
# 1 KV head, vocab 2048, max_position_embeddings 131072, llama3 RoPE
# scaling), with stories260K's tokenizer files (llm-serve needs a
# tokenizer; the prompt is token ids, so its size does not matter).
# The prompt: BOS then N-1 ids drawn by Python's random.Random(1) in
# [3, 2047].
# llm-generate: -n NGEN --temp 0 --ignore-eos --json, its timings (ttft_ms is
# the prefill, gen_tok_s the generation after the first token), user CPU
# seconds and max RSS from /usr/bin/time.
# llm-serve (prefix caching on: --prefix-cache 8, the default): one
# streamed /v1/completions request with the ids, max_tokens NGEN; the
# server's user CPU seconds (/proc/PID/stat) to the first token (the
# prefill) and per token after it (tg), the client's wall times for both,
# the server's peak RSS (VmHWM);
# then the same request again, which the prefix cache serves from the
# first request's blocks (its time to first token is the cached figure).
# One line per run on stdout; logs in WORKDIR.
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-/tmp/llm-depth-128k}
shift || true
RUNS=${*:-gen-f32 serve-fp8 serve-f32}
B=${LLM_BIN:-bin}
N=${N:-131056}
NGEN=${NGEN:-16}
THREADS=${THREADS:-1}
PY=/usr/bin/python3
mkdir -p "$W"
M=$W/tiny-fp8
if [ ! -f "$M/model.safetensors" ]; then
	"$B/llm-quantize" -q -f --random configs/tiny-llama3-128k.json --dtype fp8 --seed 1 \
		--tokenizer ../shared/models/stories260K "$M"
fi
P=$W/prompt-$N.json
[ -f "$P" ] || $PY -c 'import json, random, sys
r = random.Random(1); n = int(sys.argv[1])
print(json.dumps({"prompt_ids": [1] + [r.randint(3, 2047) for _ in range(n - 1)]}))' "$N" >"$P"

gen() { # KV
	local kv=$1 o=$W/gen-$1.json t=$W/gen-$1.time
	/usr/bin/time -f "%U %e %M" -o "$t" nice -n 19 "$B/llm-generate" -m "$M" -n "$NGEN" --temp 0 \
		--ignore-eos --json -t "$THREADS" --kv-dtype "$kv" <"$P" >"$o" 2>"$W/gen-$kv.log"
	read -r u e rss <"$t"
	$PY -c 'import json, sys
o = json.load(open(sys.argv[1])); t = o["timings"]
print("llm-generate kv %s prompt %d gen %d: prefill %.1f s (%.3f ms/token), tg %.2f tok/s (%.1f ms/token), user %s s, wall %s s, maxrss %s KB, ids %s" % (
    sys.argv[2], t["prompt_tokens"], t["tokens"], t["ttft_ms"] / 1e3, t["ttft_ms"] / t["prompt_tokens"],
    t["gen_tok_s"], 1e3 / t["gen_tok_s"] if t["gen_tok_s"] else 0, sys.argv[3], sys.argv[4], sys.argv[5], o["ids"]))' \
		"$o" "$kv" "$u" "$e" "$rss"
}

# stream PORT PID: one streamed request; prints the client's time to the
# first token and mean time between tokens (s), the tokens, and the
# server's user CPU seconds to the first token and from it to the last
stream() {
	$PY - "$1" "$P" "$NGEN" "$2" <<'EOF'
import http.client, json, os, sys, time
port, prompt, ngen = int(sys.argv[1]), json.load(open(sys.argv[2]))["prompt_ids"], int(sys.argv[3])
hz = os.sysconf("SC_CLK_TCK")
def utime():
    with open("/proc/%s/stat" % sys.argv[4]) as f:
        return int(f.read().rsplit(")", 1)[1].split()[11]) / hz
body = json.dumps({"prompt": prompt, "max_tokens": ngen, "temperature": 0, "ignore_eos": True,
                   "stream": True, "logprobs": 1})
c = http.client.HTTPConnection("127.0.0.1", port, timeout=7200)
u0, t0 = utime(), time.monotonic()
c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
r = c.getresponse()
if r.status != 200:
    sys.exit("stream: HTTP %d: %s" % (r.status, r.read()[:200]))
ts, us = [], []
for line in r:
    line = line.strip()
    if not line.startswith(b"data: ") or line == b"data: [DONE]":
        continue
    o = json.loads(line[6:])
    for ch in o.get("choices", []):
        n = len((ch.get("logprobs") or {}).get("tokens") or [])
        if n:
            ts += [time.monotonic()] * n
            us += [utime()] * n
print("%.3f %.5f %d %.2f %.3f" % (ts[0] - t0, (ts[-1] - ts[0]) / max(1, len(ts) - 1), len(ts),
                                 us[0] - u0, us[-1] - us[0]))
EOF
}

serve() { # KV
	local kv=$1 sp port rss a b
	rm -f "$W/port"
	nice -n 19 "$B/llm-serve" -m "$M" --port 0 --port-file "$W/port" -q -t "$THREADS" --kv-dtype "$kv" \
		--max-batch-tokens 512 --max-running 2 -c $((N + NGEN)) --max-kv-tokens $((N + NGEN + 4096)) 2>"$W/serve-$kv.log" & sp=$!
	for _ in $(seq 1 600); do
		[ -s "$W/port" ] && curl -sf -m 2 "http://127.0.0.1:$(cat "$W/port")/health" >/dev/null && break
		sleep 0.2
	done
	port=$(cat "$W/port")
	a=$(stream "$port" "$sp")
	rss=$(awk '/VmHWM/ {print $2}' /proc/$sp/status)
	b=$(stream "$port" "$sp")
	kill -TERM "$sp"; wait "$sp" || true
	awk -v kv="$kv" -v n="$N" -v first="$a" -v again="$b" -v rss="$rss" 'BEGIN {
		split(first, f, " "); split(again, g, " ")
		printf "llm-serve kv %s prompt %d gen %d: prefill user %.1f s (%.3f ms/token), client ttft %.1f s; tg user %.1f ms/token, client %.1f ms/token; VmHWM %d KB; again (prefix cache): user %.2f s to the first token, client ttft %.2f s\n",
			kv, n, f[3], f[4], f[4] * 1e3 / n, f[1], f[5] * 1e3 / (f[3] - 1), f[2] * 1e3, rss, g[4], g[1] }'
}

split() { # N
	local n=$1 t=$W/split-$1.time
	$PY -c 'import json, sys
ids = json.load(open(sys.argv[1]))["prompt_ids"]
print(json.dumps({"prompt_ids": ids[:int(sys.argv[2])]}))' "$P" "$n" >"$W/split-$n.json"
	/usr/bin/time -f "%U" -o "$t" nice -n 19 perf record -q -F 499 -o "$W/split-$n.perf" \
		"$B/llm-generate" -m "$M" -n 1 --temp 0 --json -t "$THREADS" --kv-dtype f32 \
		<"$W/split-$n.json" >"$W/split-$n.out" 2>"$W/split-$n.log"
	perf report -i "$W/split-$n.perf" --no-children --sort symbol --stdio 2>/dev/null |
		$PY -c 'import re, sys
n, user = int(sys.argv[1]), float(open(sys.argv[2]).read().split()[-1])
att = tot = 0.0
for l in sys.stdin:
    m = re.match(r"\s+([0-9.]+)%\s+\[[.k]\]\s+(\S+)", l)
    if not m:
        continue
    pct, sym = float(m.group(1)), m.group(2)
    tot += pct
    if re.match(r"(attn_task|softmax_|scores_|wsum_|llm_cpu_attn_)", sym):
        att += pct
a = user * att / tot
print("split prompt %d (f32 KV): user %.2f s, %.3f ms/token: attention %.1f%% %.3f ms/token, other %.3f ms/token" % (
    n, user, user * 1e3 / n, 100 * att / tot, a * 1e3 / n, (user - a) * 1e3 / n))' "$n" "$t"
}

for run in $RUNS; do
	case $run in
	gen-*) gen "${run#gen-}" ;;
	serve-*) serve "${run#serve-}" ;;
	split-*) split "${run#split-}" ;;
	*) echo "depth_128k.sh: unknown run '$run' (gen-f32, gen-fp8, serve-f32, serve-fp8, split-N)" >&2; exit 2 ;;
	esac
done
