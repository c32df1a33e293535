# tests/cli/gpu_kit.sh: bench/gpu.sh, the one command of a device session,
# cannot rot: its --dry-run (no device: the CPU half of every comparison,
# the small random checkpoint, every JSON file) runs here on the tools of
# this build, every step in order, each reporting in parseable JSON the
# moment it ends, none failed; again from a fresh copy of the tree (what a
# clone has, and what travels to a device machine: nothing built), where
# it builds the tools its steps run; --only, --pack and a run stopped by a
# signal keep their promises; the comparisons and the TAP report of
# test_cuda's failures say what they should.
. tests/lib/tap.sh
T=$TMPD
steps="build test_cuda greedy logits_smol batch_invariance mpi_cuda nccl memcheck racecheck gemm_bench logits_8b decode startup serve eval cuda_sh gemm_sweep"
LLM_BIN=$LLM_BIN bench/gpu.sh "$T/out" --dry-run --pack "$T/pack/gpu.tgz" >"$T/stdout" 2>"$T/stderr"; rc=$?
check "bench/gpu.sh --dry-run exits 0 (exit $rc: $(grep -m1 '^FAIL' "$T/stdout"))" [ "$rc" = 0 ]
sed 's/^/#   /' "$T/stdout"
# step_json DIR STEP STDOUT: DIR/STEP.json and one stdout line agree
step_json() {
	python3 - "$1/$2.json" "$2" "$3" <<'PY'
import json, re, sys
d = json.load(open(sys.argv[1]))
assert d["step"] == sys.argv[2] and d["status"] in ("PASS", "SKIP") and d["seconds"] >= 0, d
lines = [l for l in open(sys.argv[3]) if re.match(r"(PASS|FAIL|SKIP) %s[ :]" % re.escape(sys.argv[2]), l)]
assert len(lines) == 1 and lines[0].startswith(d["status"]), lines
PY
}
for s in $steps; do
	check "step $s: one stdout line and $s.json with step, status, seconds" step_json "$T/out" "$s" "$T/stdout"
done
# the CPU halves ran and compared something (not skipped for want of input)
check "the CPU halves compared: stories260K ids, 24 logit positions, batch runs, the distributed engine, a served load" python3 - "$T/out" <<'PY'
import json, os, sys
o = lambda s: json.load(open(os.path.join(sys.argv[1], s + ".json")))
g, l, b, m, v = o("greedy"), o("logits_smol"), o("batch_invariance"), o("mpi_cuda"), o("serve")
if "result" in v:
    assert [r["concurrency"] for r in v["result"]["rows"]] == [1, 4], v
    assert all(r["completed"] == r["sent"] == 8 and r["wrong"] == 0 for r in v["result"]["rows"]), v
else:
    assert "no stories260K" in v["reason"], v
assert "CPU half" in l["reason"] and l["result"]["positions"] == 24 and l["result"]["argmax_agree"] == 24, l
assert "CPU half" in b["reason"] and b["result"]["differing"] == 0 and b["result"]["prompts"] == 4, b
assert g["result"]["prompts_differing"] == 0 if "result" in g else "no stories260K" in g["reason"], g
if "result" in m:
    assert m["result"]["prompts_differing"] == 0 and m["result"]["tp_allreduce_bytes_per_token"] > 0, m
else:
    assert "no stories260K" in m["reason"] or "mpirun not found" in m["reason"], m
PY
check "summary.json: dry run, complete, every step in order, no device, a commit" python3 - "$T/out/summary.json" "$steps" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
assert d["dry_run"] is True and d["complete"] is True and d["only"] is None, d
assert d["device"] == "none" and d["commit"] and d["failed"] == 0 and d["budget_s"] == 3600, d
assert list(d["steps"]) == sys.argv[2].split(), d["steps"]
PY
check "the last stdout line is the summary" sh -c 'tail -n 1 "$1" | grep -q "^# summary: 0 passed, 0 failed, 17 skipped"' _ "$T/stdout"
mkdir -p "$T/unpacked" && tar -xzf "$T/pack/gpu.tgz" -C "$T/unpacked" 2>/dev/null
check "--pack: the archive holds summary.json and every step's JSON and log" sh -c '
	cmp -s "$1/out/summary.json" "$2/summary.json" || exit 1
	for s in $3; do [ -f "$1/out/$s.json" ] && [ -f "$1/out/$s.log" ] || exit 1; done' _ "$T/unpacked" "$T/out" "$steps"

# stopped by a signal (the device call's limit): the steps that ended are
# on disk, and summary.json says where it stopped
LLM_BIN=$LLM_BIN bench/gpu.sh "$T/kill" --dry-run --only greedy,logits_smol >"$T/kill.out" 2>&1 &
pid=$!
while ! [ -f "$T/kill/greedy.json" -a -f "$T/kill/logits_smol.log" ] && kill -0 $pid 2>/dev/null; do sleep 0.2; done
kill -TERM $pid 2>/dev/null
wait $pid; rc=$?
check "TERM during a step: exit 143, greedy.json kept, summary.json not complete and naming the step (exit $rc)" python3 - "$T/kill" "$rc" <<'PY'
import json, os, sys
d = json.load(open(os.path.join(sys.argv[1], "summary.json")))
g = json.load(open(os.path.join(sys.argv[1], "greedy.json")))
assert sys.argv[2] == "143" and d["complete"] is False and d["stopped"] == "stopped by a signal in step logits_smol", d
assert list(d["steps"]) == ["build", "greedy"] and g["step"] == "greedy", (d, g)
PY

check_fails "bench/gpu.sh without OUTDIR is a usage error (exit 2)" 2 bench/gpu.sh --quick
check_fails "bench/gpu.sh with an unknown option is a usage error (exit 2)" 2 bench/gpu.sh "$T/x" --fast
check_fails "bench/gpu.sh --only with an unknown step is a usage error (exit 2)" 2 bench/gpu.sh "$T/x" --dry-run --only greedy,gemm
check_fails "bench/gpu.sh --budget 5 is a usage error (exit 2)" 2 bench/gpu.sh "$T/x" --dry-run --budget 5

# a fresh copy of the tree (the files a clone or a device call has:
# tracked and untracked-not-ignored, nothing built): the dry run builds
# the tools its steps run (build/cpu of that copy) and runs them
if ! git ls-files >/dev/null 2>&1; then
	skip "bench/gpu.sh --dry-run from a fresh copy of the tree" "not a git checkout"
else
	mkdir -p "$T/tree"
	git ls-files -z --cached --others --exclude-standard | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -xf - -C "$T/tree"
	rm -rf "$T/tree/build" "$T/tree/bin"
	models=$(cd "$LLM_TEST_MODELS" 2>/dev/null && pwd) ref=$(cd "$LLM_TEST_REF" 2>/dev/null && pwd)
	env -u LLM_BIN -u MAKEFLAGS -u MFLAGS -u MAKELEVEL LLM_TEST_MODELS="${models:-/nonexistent}" LLM_TEST_REF="${ref:-/nonexistent}" \
		"$T/tree/bench/gpu.sh" "$T/fresh" --dry-run --only mpi_cuda,greedy >"$T/fresh.out" 2>&1; rc=$?
	sed 's/^/#   /' "$T/fresh.out"
	check "a fresh copy: bench/gpu.sh --dry-run --only mpi_cuda,greedy exits 0 (exit $rc: $(grep -m1 '^FAIL' "$T/fresh.out"))" [ "$rc" = 0 ]
	check "... its build step made every tool the steps run (make CUDA=0 in the copy)" sh -c '
		grep -q "CPU build only" "$1/fresh/build.json" || exit 1
		for t in llm-generate llm-quantize llm-bench llm-repartition llm-serve; do [ -x "$1/tree/build/cpu/bin/$t" ] || exit 1; done' _ "$T"
	for s in build greedy mpi_cuda; do
		check "... step $s: one stdout line and $s.json" step_json "$T/fresh" "$s" "$T/fresh.out"
	done
	# --only: build first, then the named steps in the plan's order
	check "... --only mpi_cuda,greedy: build, greedy, mpi_cuda and nothing else, complete" python3 - "$T/fresh/summary.json" "$T/fresh.out" <<'PY'
import json, os, re, sys
d = json.load(open(sys.argv[1]))
assert list(d["steps"]) == ["build", "greedy", "mpi_cuda"] and d["only"] == "mpi_cuda,greedy" and d["complete"] is True, d
assert not os.path.exists(os.path.join(os.path.dirname(sys.argv[1]), "logits_smol.json")), d
assert re.fullmatch(r"# summary: 0 passed, 0 failed, 3 skipped in \d+ s \(.*summary.json\)", open(sys.argv[2]).read().splitlines()[-1])
PY
fi

# the comparisons themselves fail when they should
printf '%s\n' '{"ids":[5,6],"top_logprobs":[[{"id":5,"logprob":-1.0},{"id":7,"logprob":-2.0}],[{"id":6,"logprob":-1.0},{"id":8,"logprob":-3.0}]]}' >"$T/a"
printf '%s\n' '{"ids":[7,6],"top_logprobs":[[{"id":7,"logprob":-1.0},{"id":5,"logprob":-1.9}],[{"id":6,"logprob":-1.0},{"id":8,"logprob":-3.0}]]}' >"$T/b"
check "gpu_check.py logits fails on a swapped argmax with a clear margin" sh -c '! python3 bench/gpu_check.py logits "$1" "$2" 0.05 >/dev/null' _ "$T/a" "$T/b"
printf '%s\n' '{"ids":[1,2]}' '{"ids":[3,4]}' >"$T/i1"
printf '%s\n' '{"ids":[1,2]}' '{"ids":[3,5]}' >"$T/i2"
check "gpu_check.py invariance fails when one prompt's ids differ" sh -c '! python3 bench/gpu_check.py invariance "$1" "$2" >/dev/null' _ "$T/i1" "$T/i2"
check "gpu_check.py invariance passes on equal ids" python3 bench/gpu_check.py invariance "$T/i1" "$T/i1"
# test_cuda's report in a step's JSON: the first failing lines (carrying
# their first failure) with the diagnostics before them
cat >"$T/tap" <<'TAP'
ok - backend auto opens cuda with 1 CUDA device(s) (cuda)
# matmul E4M3 mma_64x64 N 200 K 256 blocks 128x128 M 17: first bad [token 3, output 41] expected 0.25 got 0.5 (|err| 0.25, bound 0.01)
not ok - cuda: matmul E4M3 every tile configuration against the CPU (bound table) (worst 25.000 of the bound) -- matmul E4M3 mma_64x64 N 200 K 256 blocks 128x128 M 17: 3 of 3400 over the bound, worst 25 of it: first bad [token 3, output 41] expected 0.25 got 0.5 (|err| 0.25, bound 0.01)
ok - cuda: argmax with repetition penalty equals the CPU's choice # SKIP demo
TAP
check "gpu_check.py tap: counts, the failing line with its note and diagnostics, exit 1" python3 - "$T/tap" <<'PY'
import json, subprocess, sys
r = subprocess.run(["python3", "bench/gpu_check.py", "tap", sys.argv[1]], capture_output=True, text=True)
d = json.loads(r.stdout)
assert r.returncode == 1 and (d["ok"], d["not_ok"], d["skip"]) == (2, 1, 1), (r.returncode, d)
f = d["failures"][0]
assert "first bad [token 3, output 41] expected 0.25 got 0.5" in f["line"] and f["line"].startswith("not ok"), f
assert f["diagnostics"] == [open(sys.argv[1]).read().splitlines()[1]], f
PY
check "gpu_check.py tap passes a log without failures" sh -c 'grep -v "^not ok" "$1" >"$1.ok" && python3 bench/gpu_check.py tap "$1.ok" >/dev/null' _ "$T/tap"
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
