#!/usr/bin/env bash
# bench/engine.sh: prompt processing (pp512) and generation (tg128) tokens/s
# of llm-generate's engine against llama.cpp on the same random weights, at
# context depths, in the same run, alternating the engines; a memory
# bandwidth probe and the decode roofline; a contention round; start to
# first token against cat of the file.
#
#   bench/engine.sh [WORKDIR] [CONFIG...]
#
# Environment (defaults in brackets):
#   DEPTHS [0 1024 4096]   context each pp/tg starts after (untimed prefill);
#                          a depth + 512 past a model's context is skipped
#   THREADS [1 2]          CPU threads of both engines
#   ROUNDS [3]             rounds; each runs every row once, the engines
#                          alternating; the table shows the median round
#   ENGINES [all five]     subset of: ours-bf16 theirs-bf16 ours-fp8
#                          ours-fp8-dec theirs-q8_0
#   KV [the tools' default] ours: --kv-dtype (bf16 by default, f32, fp8)
#   CONTENTION [1]         0: skip the round with a CPU burner
#   STARTUP [1]            0: skip start to first token against cat
#   TAG                    added to the output names (engine-MACHINE-TAG-DATE)
#   REPORT_ONLY [0]        1: measure nothing, write the JSON and table of the
#                          rows WORKDIR/rows.jsonl holds (a cut-short run)
#   LBENCH, LBENCH_LIB     a built lbench and the prebuilt llama.cpp folder;
#                          unset: both are made in WORKDIR (npm install of
#                          node-llama-cpp 3.22.1 with scripts disabled, the
#                          headers from the llama.cpp bundle it ships)
#
# The weights come from ../shared/tools/mkrandom.py (one seeded random model
# as Hugging Face BF16 safetensors and GGUF BF16/Q8_0; needs python3-numpy),
# our FP8 checkpoints from llm-quantize of the same BF16 weights: "fp8"
# (--fp8-vocab: decoder projections, embedding and lm_head in FP8, the
# tensors llama.cpp's Q8_0 quantizes; llm-quantize's default from 2026-11-25
# to 2026-11-28) and "fp8-dec" (the default: the decoder projections only,
# embedding and lm_head BF16 as the peers load them; llm-bench's --lm-head
# auto quantizes the head to FP8 at load, the embedding stays BF16).
# llama.cpp is timed by ../shared/tools/lbench.c (llama-bench's method:
# warm-up, persistent thread pool, flash attention on, f16 KV), compiled
# with bench/lbench_depth.h for the depth; ours by llm-bench model (one
# warm-up, pp = one 512-token step, tg = 128 single-token steps).
# bench/cpu_bandwidth.c measures the read bandwidth; the roofline of a
# decode step is (weight bytes read + KV bytes read) / bandwidth, with
# weight bytes = every tensor but the embedding table (one row of it is
# read; a tied lm_head reads all of it; of a mixture of experts' experts,
# num_experts_per_tok of every num_experts) and KV bytes = 2 * n_layer *
# n_kv_head * d_head * depth * bytes per element.
# Writes bench/results/engine-<machine>-<date>.json and .txt (the table).
set -euo pipefail
cd "$(dirname "$0")/.."
W=${1:-/tmp/llm-bench-engine}
shift || true
CONFIGS=(${@:-../shared/tools/configs/smollm2-135m.json ../shared/tools/configs/tinyllama-1.1b.json})
DEPTHS=${DEPTHS:-0 1024 4096}
THREADS=${THREADS:-1 2}
ROUNDS=${ROUNDS:-3}
ENGINES=${ENGINES:-ours-bf16 theirs-bf16 ours-fp8 ours-fp8-dec theirs-q8_0}
KV=${KV:-}
CONTENTION=${CONTENTION:-1}
PY=/usr/bin/python3            # Debian's, where python3-numpy lives
B=bin
MACHINE=${MACHINE:-cpu-$(hostname -s | tr -c 'a-zA-Z0-9\n' - | cut -c1-20)}
DATE=$(date +%F)
OUTJ=bench/results/engine-$MACHINE${TAG:+-$TAG}-$DATE.json
OUTT=bench/results/engine-$MACHINE${TAG:+-$TAG}-$DATE.txt
mkdir -p "$W" bench/results
ROWS=$W/rows.jsonl
[ "${REPORT_ONLY:-0}" = 1 ] || : >"$ROWS"

if [ "${REPORT_ONLY:-0}" != 1 ]; then
# llama.cpp: the prebuilt library and lbench with the depth wrapper
if [ -z "${LBENCH:-}" ]; then
	N=$W/npm
	LBENCH_LIB=$N/node_modules/@node-llama-cpp/linux-x64/bins/linux-x64
	if [ ! -f "$LBENCH_LIB/libggml-base.so" ]; then
		mkdir -p "$N"
		(cd "$N" && npm install --ignore-scripts --no-audit --no-fund node-llama-cpp@3.22.1 >/dev/null)
	fi
	[ -d "$N/llsrc" ] || git clone -q "$N/node_modules/node-llama-cpp/llama/gitRelease.bundle" "$N/llsrc" 2>/dev/null
	mkdir -p "$N/lib"
	ln -sf "$LBENCH_LIB/libllama.v0.5.0.so" "$N/lib/libllama.so"
	ln -sf "$LBENCH_LIB/libggml.v0.5.0.so" "$N/lib/libggml.so"
	ln -sf "$LBENCH_LIB/libggml-base.so" "$N/lib/libggml-base.so"
	LBENCH=$W/lbench
	cc -O2 -include bench/lbench_depth.h -I"$N/llsrc/include" -I"$N/llsrc/ggml/include" \
		-o "$LBENCH" ../shared/tools/lbench.c -L"$N/lib" -Wl,-rpath,"$LBENCH_LIB" \
		-lllama -lggml -lggml-base
fi
cc -O2 -march=native -pthread -o "$W/cpu_bandwidth" bench/cpu_bandwidth.c

# the weights
for cfg in "${CONFIGS[@]}"; do
	name=$(basename "$cfg" .json)
	d=$W/$name
	if [ ! -f "$d/model-q8_0.gguf" ]; then
		$PY ../shared/tools/mkrandom.py --config "$cfg" --out "$d" --formats st-bf16,gguf-bf16,gguf-q8_0 --seed 1 >/dev/null
	fi
	# an "fp8" of the older default (embedding in BF16) is made again
	if [ -d "$d/fp8" ] && ! $PY -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]
sys.exit("model.embed_tokens.weight_scale_inv" not in json.loads(f.read(n)))' "$d/fp8/model.safetensors"; then
		rm -rf "$d/fp8"
	fi
	[ -d "$d/fp8" ] || $B/llm-quantize -q --fp8-vocab "$d/hf-bf16" "$d/fp8"
	[ -d "$d/fp8-dec" ] || $B/llm-quantize -q "$d/hf-bf16" "$d/fp8-dec"
done
LLAMA_BACKEND=$(LB_DEBUG=1 "$LBENCH" "$LBENCH_LIB" "$W/$(basename "${CONFIGS[0]}" .json)/model-q8_0.gguf" 1 0 1 1 1 1 2>&1 |
	sed -n 's/.*loaded CPU backend from .*\/\(libggml-cpu-[a-z0-9]*\)\.so.*/\1/p' | head -1)
echo "$LLAMA_BACKEND" >"$W/llama_backend.txt"

bandwidth() { # round
	for t in $THREADS; do
		"$W/cpu_bandwidth" "$t" 1024 7 | $PY -c 'import json,sys; o=json.load(sys.stdin); o["what"]="bandwidth"; o["round"]=int(sys.argv[1]); print(json.dumps(o))' "$1" >>"$ROWS"
	done
}
# one measurement: round contention model engine threads depth -> a row in $ROWS
measure() {
	local round=$1 cont=$2 name=$3 eng=$4 t=$5 depth=$6 d=$W/$3 out pp tg
	case $eng in
	ours-*)
		m=${eng#ours-}; [ "$m" = bf16 ] && m=hf-bf16
		out=$($B/llm-bench model "$d/$m" -t "$t" -r 1 -d "$depth" ${KV:+--kv-dtype $KV} --format jsonl 2>/dev/null | grep '^{') || out=
		read -r pp tg < <(printf '%s\n' "$out" | $PY -c 'import json,sys
r=[json.loads(l) for l in sys.stdin if l.strip()]
print(r[0]["tok_s"] if r else "null", r[1]["tok_s"] if len(r) > 1 else "null")') ;;
	theirs-*)
		out=$(LB_DEPTH=$depth "$LBENCH" "$LBENCH_LIB" "$d/model-${eng#theirs-}.gguf" "$t" 512 128 1 1 1 2>/dev/null | tail -1) || out=
		read -r pp tg < <(printf '%s\n' "$out" | $PY -c 'import json,sys
try: o=json.load(sys.stdin); print(o["pp_tps"][0], o["tg_tps"][0])
except Exception: print("null null")') ;;
	esac
	printf '{"what": "speed", "round": %d, "contention": %d, "model": "%s", "engine": "%s", "threads": %d, "depth": %d, "pp512_tok_s": %s, "tg128_tok_s": %s}\n' \
		"$round" "$cont" "$name" "$eng" "$t" "$depth" "$pp" "$tg" | tee -a "$ROWS" >&2
}

echo "# $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//'), commit $(git rev-parse --short HEAD), llama.cpp backend $LLAMA_BACKEND" >&2
for round in $(seq "$ROUNDS"); do
	bandwidth "$round"
	for cfg in "${CONFIGS[@]}"; do
		name=$(basename "$cfg" .json)
		# the model's context: depths that leave no room for pp512 are skipped
		ctx=$($PY -c 'import json,sys; print(json.load(open(sys.argv[1])).get("max_position_embeddings", 1 << 30))' "$cfg")
		for t in $THREADS; do
			for depth in $DEPTHS; do
				if [ $((depth + 512)) -gt "$ctx" ]; then
					[ "$round" = 1 ] && [ "$t" = "${THREADS%% *}" ] && echo "# $name: depth $depth skipped (context $ctx)" >&2
					continue
				fi
				# alternate: each round starts with the other engine
				order=$ENGINES
				[ $((round % 2)) = 0 ] && order=$(printf '%s\n' $ENGINES | tac | tr '\n' ' ')
				for eng in $order; do measure "$round" 0 "$name" "$eng" "$t" "$depth"; done
			done
		done
	done
done

# contention: a CPU burner on one core, both threads asked for, depth 0
if [ "$CONTENTION" = 1 ]; then
	sha256sum /dev/zero & burner=$!
	trap 'kill $burner 2>/dev/null || true' EXIT
	for cfg in "${CONFIGS[@]}"; do
		name=$(basename "$cfg" .json)
		for eng in ours-fp8 theirs-q8_0; do measure 1 1 "$name" "$eng" 2 0; done
	done
	kill $burner; wait $burner 2>/dev/null || true
	trap - EXIT
fi

# start to first token of the FP8 checkpoint against cat of the file, cold
# (the file dropped from the page cache with posix_fadvise) and warm
evict() { $PY -c 'import os,sys
for p in sys.argv[1:]:
	fd=os.open(p,os.O_RDONLY); os.posix_fadvise(fd,0,0,os.POSIX_FADV_DONTNEED); os.close(fd)' "$@"; }
echo '{"prompt_ids": [1], "max_tokens": 1, "temperature": 0}' >"$W/p1.jsonl"
[ "${STARTUP:-1}" = 1 ] && for cfg in "${CONFIGS[@]}"; do
	name=$(basename "$cfg" .json)
	f=$W/$name/fp8/model.safetensors
	for cache in cold warm; do
		for pages in auto map huge; do
			[ $cache = cold ] && evict "$f"
			[ $cache = warm ] && cat "$f" >/dev/null
			t_cat=$( { /usr/bin/time -f %e cat "$f" >/dev/null; } 2>&1 )
			[ $cache = cold ] && evict "$f"
			out=$( { /usr/bin/time -f '%e %M' $B/llm-generate -m "$W/$name/fp8" --weight-pages $pages --json <"$W/p1.jsonl" >/dev/null; } 2>&1 | tail -1)
			printf '{"what": "startup", "model": "%s", "cache": "%s", "weight_pages": "%s", "first_token_s": %s, "cat_s": %s, "peak_rss_mb": %d, "file_mb": %d}\n' \
				"$name" $cache $pages "${out% *}" "$t_cat" $(( ${out#* } / 1024 )) $(( $(stat -c %s "$f") / 1000000 )) | tee -a "$ROWS" >&2
		done
	done
done

fi
LLAMA_BACKEND=$(cat "$W/llama_backend.txt" 2>/dev/null || echo unknown)

# the JSON and the table
$PY - "$ROWS" "$OUTJ" "$OUTT" "$W" "$(git rev-parse --short HEAD)" "$MACHINE" "$DATE" "$LLAMA_BACKEND" "${KV:-default}" "$ROUNDS" <<'EOF'
import json, os, statistics, struct, sys
rows_p, outj, outt, W, commit, machine, date, backend, kv, rounds = sys.argv[1:]
rows = [json.loads(l) for l in open(rows_p)]
def med(v):
	v = [x for x in v if x is not None]
	return round(statistics.median(v), 2) if v else None
bw = {}
for r in rows:
	if r["what"] == "bandwidth":
		bw.setdefault(r["threads"], []).append(r["best_gb_s"])
bw = {t: med(v) for t, v in bw.items()}
def st_bytes(dirp):
	"""weight bytes a decode step reads, and the model's shape (a mixture of
	experts: a token reads num_experts_per_tok of each layer's experts)"""
	tot = emb = 0; lm_head = False
	cfg = json.load(open(os.path.join(dirp, "config.json")))
	ne = cfg.get("num_local_experts") or cfg.get("num_experts") or 0
	for fn in sorted(os.listdir(dirp)):
		if not fn.endswith(".safetensors"): continue
		with open(os.path.join(dirp, fn), "rb") as f:
			n = struct.unpack("<Q", f.read(8))[0]; h = json.loads(f.read(n))
		for k, v in h.items():
			if k == "__metadata__": continue
			b = v["data_offsets"][1] - v["data_offsets"][0]
			if ne and ".experts." in k: b = b * cfg["num_experts_per_tok"] / ne
			tot += b
			if "embed_tokens" in k: emb += b
			if "lm_head" in k: lm_head = True
	return tot - emb + (0 if lm_head else emb), emb, cfg
speed = {}
for r in rows:
	if r["what"] == "speed":
		k = (r["model"], r["engine"], r["threads"], r["depth"], r["contention"])
		speed.setdefault(k, []).append(r)
table, out_rows = [], []
hdr = "%-15s %-14s %3s %6s %10s %10s %9s %8s" % ("model", "engine", "thr", "depth", "pp512 t/s", "tg128 t/s", "roof t/s", "tg/roof")
for k, rs in speed.items():
	model, eng, t, depth, cont = k
	pp = med([x["pp512_tok_s"] for x in rs]); tg = med([x["tg128_tok_s"] for x in rs])
	row = dict(model=model, engine=eng, threads=t, depth=depth, contention=bool(cont),
		pp512_tok_s=pp, tg128_tok_s=tg,
		pp512_rounds=[x["pp512_tok_s"] for x in rs], tg128_rounds=[x["tg128_tok_s"] for x in rs])
	if eng.startswith("ours-"):
		m = eng[5:]; m = "hf-bf16" if m == "bf16" else m
		wb, eb, cfg = st_bytes(os.path.join(W, model, m))
		dh = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
		kvel = {"fp8": 1, "bf16": 2, "default": 2}.get(kv, 4)  # the default: bf16; fp8: plus a 4-byte scale per token and head
		kvel += 4 / dh if kv == "fp8" else 0
		# the mean context over the 128 generated tokens
		kvb = 2 * cfg["num_hidden_layers"] * cfg["num_key_value_heads"] * dh * (depth + 64) * kvel
		if str(t) in bw or t in bw:
			g = bw.get(t, bw.get(str(t)))
			row["roofline_tok_s"] = round(g * 1e9 / (wb + kvb), 2)
			row["weight_bytes"] = wb; row["kv_bytes"] = kvb
			if tg: row["tg_of_roofline"] = round(tg / row["roofline_tok_s"], 3)
	out_rows.append(row)
	f = lambda x: "%10.1f" % x if x is not None else "%10s" % "-"
	table.append("%-15s %-14s %3s %6s %s %s %9s %8s%s" % (model, eng, t, depth, f(pp), f(tg),
		"%.1f" % row["roofline_tok_s"] if "roofline_tok_s" in row else "",
		"%.0f%%" % (100 * row["tg_of_roofline"]) if "tg_of_roofline" in row else "",
		"  (CPU burner on)" if cont else ""))
startup = [r for r in rows if r["what"] == "startup"]
doc = dict(what="engine: pp512/tg128 tokens/s of llm-generate's engine (llm-bench model) against llama.cpp (lbench with bench/lbench_depth.h, node-llama-cpp 3.22.1 prebuilt, flash attention on, f16 KV) on the same random weights, at context depths",
	device="CPU: %s, %d cores" % (open("/proc/cpuinfo").read().split("model name")[1].split(":")[1].split("\n")[0].strip(), os.cpu_count()),
	machine=machine, date=date, commit=commit, llama_cpp_backend=backend, kv_dtype=kv,
	config="bench/engine.sh: mkrandom.py --seed 1; %s rounds, engines alternating, one repetition each after a warm-up; medians of the rounds; roofline = bandwidth / (weight bytes + KV bytes at depth+64)" % rounds,
	bandwidth_gb_s=bw, rows=out_rows, startup=startup)
json.dump(doc, open(outj, "w"), indent=1)
with open(outt, "w") as o:
	o.write("# %s, commit %s, llama.cpp backend %s, KV %s, bandwidth GB/s %s\n" % (doc["device"], commit, backend, kv, bw))
	o.write(hdr + "\n" + "\n".join(table) + "\n")
	for s in startup:
		o.write("# %s start to first token (%s cache, --weight-pages %s): %s s, cat %s s (%.2fx), peak RSS %d MB, file %d MB\n" % (
			s["model"], s["cache"], s["weight_pages"], s["first_token_s"], s["cat_s"],
			float(s["first_token_s"]) / max(float(s["cat_s"]), 1e-3), s["peak_rss_mb"], s["file_mb"]))
print(open(outt).read(), end="")
EOF
