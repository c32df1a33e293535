# tests/cli/gpu_kit.sh: bench/gpu.sh, the one command of a device session,
# cannot rot: its --dry-run (no device: the CPU half of every comparison,
# the small random checkpoint, every JSON file) runs here on the tools of
# this build, and each step must report in parseable JSON, none failed.
. tests/lib/tap.sh
T=$TMPD
steps="build test_cuda nccl memcheck racecheck cuda_sh greedy mpi_cuda logits_smol batch_invariance logits_8b startup decode gemm_bench gemm_sweep eval"
LLM_BIN=$LLM_BIN bench/gpu.sh "$T/out" --dry-run >"$T/stdout" 2>"$T/stderr"; rc=$?
check "bench/gpu.sh --dry-run exits 0 (exit $rc: $(grep -m1 '^FAIL' "$T/stdout"))" [ "$rc" = 0 ]
sed 's/^/#   /' "$T/stdout"
for s in $steps; do
	check "step $s: one stdout line and $s.json with step, status, seconds" python3 - "$T/out/$s.json" "$s" "$T/stdout" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
assert d["step"] == sys.argv[2] and d["status"] in ("PASS", "SKIP") and d["seconds"] >= 0, d
lines = [l for l in open(sys.argv[3]) if re.match(r"(PASS|FAIL|SKIP) %s[ :]" % re.escape(sys.argv[2]), l)]
assert len(lines) == 1 and lines[0].startswith(d["status"]), lines
PY
done
# the CPU halves ran and compared something (not skipped for want of input)
check "the CPU halves compared: stories260K ids, 24 logit positions, batch runs" python3 - "$T/out" <<'PY'
import json, os, sys
o = lambda s: json.load(open(os.path.join(sys.argv[1], s + ".json")))
g, l, b = o("greedy"), o("logits_smol"), o("batch_invariance")
assert "CPU half" in l["reason"] and l["result"]["positions"] == 24 and l["result"]["argmax_agree"] == 24, l
assert "CPU half" in b["reason"] and b["result"]["differing"] == 0 and b["result"]["prompts"] == 4, b
assert g["result"]["prompts_differing"] == 0 if "result" in g else "no stories260K" in g["reason"], g
PY
check "summary.json: dry run, every step, no device, a commit" python3 - "$T/out/summary.json" "$steps" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["dry_run"] is True and d["device"] == "none" and d["commit"] and d["failed"] == 0, d
assert list(d["steps"]) == sys.argv[2].split(), d["steps"]
PY
check "the last stdout line is the summary" grep -q '^# summary: 0 passed, 0 failed, 16 skipped' "$T/stdout"
check_fails "bench/gpu.sh without OUTDIR is a usage error (exit 2)" 2 bench/gpu.sh --quick
check_fails "bench/gpu.sh with an unknown option is a usage error (exit 2)" 2 bench/gpu.sh "$T/x" --fast
# the comparisons themselves fail when they should
printf '%s\n' '{"ids":[5,6],"top_logprobs":[[{"id":5,"logprob":-1.0},{"id":7,"logprob":-2.0}],[{"id":6,"logprob":-1.0},{"id":8,"logprob":-3.0}]]}' >"$T/a"
printf '%s\n' '{"ids":[7,6],"top_logprobs":[[{"id":7,"logprob":-1.0},{"id":5,"logprob":-1.9}],[{"id":6,"logprob":-1.0},{"id":8,"logprob":-3.0}]]}' >"$T/b"
check "gpu_check.py logits fails on a swapped argmax with a clear margin" sh -c '! python3 bench/gpu_check.py logits "$1" "$2" 0.05 >/dev/null' _ "$T/a" "$T/b"
printf '%s\n' '{"ids":[1,2]}' '{"ids":[3,4]}' >"$T/i1"
printf '%s\n' '{"ids":[1,2]}' '{"ids":[3,5]}' >"$T/i2"
check "gpu_check.py invariance fails when one prompt's ids differ" sh -c '! python3 bench/gpu_check.py invariance "$1" "$2" >/dev/null' _ "$T/i1" "$T/i2"
check "gpu_check.py invariance passes on equal ids" python3 bench/gpu_check.py invariance "$T/i1" "$T/i1"
# the decode roofline's arithmetic on a real (random) checkpoint: the bytes
# of its tensors, less the embedding table unless tied, over the bandwidth
llm-quantize -q --random configs/tiny-check.json --dtype fp8 --seed 1 "$T/tiny" 2>/dev/null
printf '%s\n' '{"test": "tg64 x1", "batch": 1, "tok_s": 100, "wrong": 0}' '{"test": "tg64 x8", "batch": 8, "tok_s": 400, "wrong": 0}' >"$T/rows"
echo '{"copy_gbs": 0.001}' >"$T/bw"
check "gpu_check.py decode: step times, weight + KV bytes over the bandwidth" python3 - "$T/tiny" "$T/rows" "$T/bw" <<'PY'
import json, os, struct, subprocess, sys
ck, rows, bw = sys.argv[1:4]
d = json.loads(subprocess.run(["python3", "bench/gpu_check.py", "decode", ck, rows, bw], check=True,
                              capture_output=True, text=True).stdout)
cfg = json.load(open(os.path.join(ck, "config.json")))
f = open(os.path.join(ck, "model.safetensors"), "rb"); n = struct.unpack("<Q", f.read(8))[0]
data = os.path.getsize(f.name) - 8 - n
tied = cfg.get("tie_word_embeddings", False)
assert d["weight_bytes_per_step"] == (data if tied else data - d["embedding_bytes"]) and d["embedding_bytes"] > 0, d
r1, r8 = d["rows"]
assert abs(r1["step_ms"] - 10) < 1e-9 and abs(r8["step_ms"] - 20) < 1e-9, d
kv = 8 * 65 / 2 * cfg["num_hidden_layers"] * 2 * cfg["num_key_value_heads"] * (cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]) * 4
assert abs(r8["roofline_ms"] - (d["weight_bytes_per_step"] + kv) / 1e6 * 1e3) < 1e-6 * r8["roofline_ms"], (r8, kv)
assert abs(r1["fraction_of_roofline"] - r1["roofline_ms"] / 10) < 1e-12, d
PY
tap_done
