# tests/cli/quantize.sh: llm-quantize from the shell: exit codes, one-line
# errors, malformed inputs, pipes, kill safety, determinism, shards.
. tests/lib/tap.sh
Q=llm-quantize
T=$TMPD

check "--help exits 0 and prints the usage line" sh -c "$Q --help | grep -q '^usage: llm-quantize '"
check_fails "unknown option is a usage error" 2 $Q --frobnicate a b
check_fails "missing OUT is a usage error" 2 $Q only-in
check_fails "bad --block is a usage error" 2 $Q --block 12y7 a b
check_fails "--dtype without --dequantize is a usage error" 2 $Q --dtype f16 a b
check_fails "a missing input is a runtime error naming it" 1 $Q "$T/nope" "$T/nope.out"
grep -q "$T/nope" "$T/err" && ok "the error names the missing input" || notok "the error names the missing input"

# every malformed file: exit 1, one line naming the file, no output
bad=0
for f in tests/data/malformed/*.safetensors; do
	$Q "$f" "$T/m.out" >/dev/null 2>"$T/err"; rc=$?
	if [ $rc != 1 ] || [ "$(wc -l <"$T/err")" != 1 ] || ! grep -qF "$f" "$T/err" || ls "$T" | grep -q '^m\.out'; then
		bad=$((bad+1)); diag "$f: exit $rc: $(head -c 200 "$T/err")"
	fi
done
[ $bad = 0 ] && ok "malformed files: exit 1, one line naming the file, no output" || notok "malformed files: $bad misbehaved"

# random checkpoints: deterministic by seed
cfg=tests/data/kill-test.json
tiny=configs/tiny-check.json
$Q -q --random $tiny --seed 7 "$T/r1.safetensors" && $Q -q --random $tiny --seed 7 "$T/r2.safetensors" &&
	$Q -q --random $tiny --seed 8 "$T/r3.safetensors"
check "--random with the same seed writes the same bytes" cmp -s "$T/r1.safetensors" "$T/r2.safetensors"
check "--random with another seed writes other weights" sh -c "! cmp -s '$T/r1.safetensors' '$T/r3.safetensors'"
$Q -q --random $tiny --dtype fp8 --seed 7 "$T/r8"
check "--random --dtype fp8 writes an FP8 checkpoint" sh -c "grep -q F8_E4M3 '$T/r8/model.safetensors' && grep -q weight_block_size '$T/r8/config.json'"
check_fails "quantizing an FP8 checkpoint says so and exits 1" 1 $Q "$T/r8" "$T/r8b"
grep -q "already quantized" "$T/err" && ok "the message says it is already quantized" || notok "the message says it is already quantized"
check_fails "an existing OUT is not overwritten without --force" 1 $Q --random $tiny "$T/r1.safetensors"
check "--force replaces an existing OUT" $Q -q --force --random $tiny --seed 8 "$T/r1.safetensors"
check "the replaced OUT has the new content" cmp -s "$T/r1.safetensors" "$T/r3.safetensors"

# pipes: '-' gives the same bytes as a .safetensors file, and round-trips
$Q -q $tiny >/dev/null 2>&1
$Q -q "$T/r3.safetensors" - >"$T/p.safetensors"
$Q -q "$T/r3.safetensors" "$T/f.safetensors"
check "output to - equals output to a .safetensors file, byte for byte" cmp -s "$T/p.safetensors" "$T/f.safetensors"
$Q -q "$T/r3.safetensors" - | $Q -q --dequantize - "$T/pd.safetensors"
$Q -q --dequantize "$T/f.safetensors" "$T/fd.safetensors"
check "quantize | dequantize through a pipe equals the two steps through files" cmp -s "$T/pd.safetensors" "$T/fd.safetensors"
$Q -q --dequantize "$T/r8" - | $Q -q - "$T/rq.safetensors" && $Q -q --dequantize "$T/r8" "$T/rd" && $Q -q "$T/rd" "$T/rq2.safetensors"
check "a directory read back through a pipe gives the same tensors" cmp -s "$T/rq.safetensors" "$T/rq2.safetensors"

# stats as JSONL: one object per quantized tensor
$Q -q --stats --json "$T/r3.safetensors" "$T/s.safetensors" >"$T/stats.jsonl"
n=$(grep -c '"rel_rms_error"' "$T/stats.jsonl")
check "--stats --json writes one JSON line per quantized tensor: the 14 decoder linears ($n)" [ "$n" = 14 ]
check "--stats --json: the decoder linears in 128x128 blocks; the embedding and lm_head left plain" sh -c "
	[ \$(grep -c '\"block\":\[128,128\]' '$T/stats.jsonl') = 14 ] && ! grep -q 'embed_tokens\|lm_head' '$T/stats.jsonl'"
$Q -q --stats --json --fp8-vocab "$T/r3.safetensors" "$T/sv.safetensors" >"$T/statsv.jsonl"
check "--fp8-vocab: the embedding and lm_head quantized too, one scale per row" sh -c "
	[ \$(grep -c '\"rel_rms_error\"' '$T/statsv.jsonl') = 16 ] && [ \$(grep -c '\"block\":\[128,128\]' '$T/statsv.jsonl') = 14 ] &&
	grep -q '\"tensor\":\"model.embed_tokens.weight\",\"shape\":\[\([0-9]*\),\([0-9]*\)\],\"block\":\[1,\2\]' '$T/statsv.jsonl' &&
	grep -q '\"tensor\":\"lm_head.weight\",\"shape\":\[\([0-9]*\),\([0-9]*\)\],\"block\":\[1,\2\]' '$T/statsv.jsonl'"
check "the stats lines are valid JSON with sane errors" python3 -c "
import json,sys
for l in open('$T/stats.jsonl'):
    o=json.loads(l); assert 0 < o['rel_rms_error'] < 0.05, o
"

# shards
$Q -q --max-shard-size 100KB "$T/r3.safetensors" "$T/sharded"
check "--max-shard-size splits into shards with an index" sh -c "ls '$T/sharded' | grep -q 'model-00001-of-' && test -f '$T/sharded/model.safetensors.index.json'"
$Q -q --dequantize "$T/sharded" "$T/sd.safetensors"
check "a sharded checkpoint reads back as the same tensors" cmp -s "$T/sd.safetensors" "$T/fd.safetensors"

# kill safety: SIGKILL mid-write leaves nothing that looks complete (killed
# as soon as the temporary output exists; the wait is bounded at 60 s)
writing() { ls -d "$out".tmp.* >/dev/null 2>&1; }
for out in "$T/killed" "$T/killed.safetensors"; do
	$Q -q --random $cfg --seed 1 "$out" & pid=$!
	wait_until 60 writing
	kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
	if [ -e "$out" ]; then notok "SIGKILL during a write leaves no $(basename "$out")"
	else ok "SIGKILL during a write leaves no $(basename "$out") (only $(ls -d "$out".tmp.* 2>/dev/null | wc -l) temporary)"; fi
	# the next run to OUT removes the killed one's temporary (its process is
	# gone), saying so in one line, and keeps a live process's (this shell's)
	left=$(ls -d "$out".tmp.* 2>/dev/null | head -1)
	mkdir "$out.tmp.$$"
	$Q --random $tiny --seed 1 "$out" 2>"$T/sweep.err"
	check "the next run removes the killed run's $(basename "$left") and says so in one line" sh -c \
		"[ -n '$left' ] && [ ! -e '$left' ] && [ \$(grep -c 'stale temporar' '$T/sweep.err') = 1 ] && grep -qF 'removed 1 stale temporary of killed runs ($left)' '$T/sweep.err'"
	check "... and keeps $(basename "$out").tmp.<a live pid>" test -d "$out.tmp.$$"
	rm -rf "$out".tmp.* "$out"
done

if have_stories; then
	$Q -q "$(stories)" "$T/st8" && $Q -q --dequantize --dtype f32 "$T/st8" "$T/st32"
	check "stories260K: quantize then dequantize keeps config and tokenizer files" \
		sh -c "cmp -s '$(stories)/tokenizer.json' '$T/st32/tokenizer.json' && grep -q '\"hidden_size\": 64' '$T/st32/config.json' && ! grep -q quantization_config '$T/st32/config.json'"
else
	skip "stories260K round trip through the CLI" "no stories260K in \$LLM_TEST_MODELS"
fi

# the first mistakes (issue 22): another format named as such; OUT/
printf 'GGUF\003\000\000\000\000\000\000\000\000\000\000\000' >"$T/model.gguf"
check_fails "a GGUF input is refused" 1 $Q "$T/model.gguf" "$T/g.out"
check "... as a GGUF file (not as a header length)" grep -q "model.gguf: a GGUF file; llm-tools read safetensors" "$T/err"
echo '{"hidden_size": 64}' >"$T/config.json"
check_fails "a JSON input is refused" 1 $Q "$T/config.json" "$T/j.out"
check "... as not a safetensors file" grep -q "config.json: not a safetensors file (it starts with '{'): give the model directory" "$T/err"
$Q -q --random $tiny --dtype fp8 --seed 7 - | $Q -q --dequantize - "$T/slash/" 2>"$T/err"
check "--dequantize - OUT/ (a trailing slash) writes the directory OUT" sh -c "test -f '$T/slash/model.safetensors' -a -f '$T/slash/config.json' && ! ls -d '$T'/slash*.tmp.* 2>/dev/null"
# progress and the closing summary (issue 22): on stderr, the counts those of
# the files; plain lines when stderr is not a terminal (LLM_PROGRESS_INTERVAL
# forces them: 0 a line at every write, 1000 none); -q and --quiet: nothing
PC="python3 tests/lib/progress_check.py"
LLM_PROGRESS_INTERVAL=1000 $Q "$T/r3.safetensors" "$T/sum.safetensors" >"$T/sum.out" 2>"$T/sum.err"
check "quantize: one summary line on stderr with the tensors and sizes of IN and OUT" $PC write "$T/sum.err" llm-quantize "$T/r3.safetensors" "$T/sum.safetensors"
check "... and nothing on stdout" test ! -s "$T/sum.out"
LLM_PROGRESS_INTERVAL=0 $Q --max-shard-size 100KB "$T/r3.safetensors" "$T/sumdir" 2>"$T/sum.err"
check "quantize into shards: progress lines, then the summary counting the shard files" $PC write "$T/sum.err" llm-quantize "$T/r3.safetensors" "$T/sumdir" --progress
LLM_PROGRESS_INTERVAL=0 $Q --dequantize "$T/r8" "$T/sumdq" 2>"$T/sum.err"
check "--dequantize: progress lines and the summary" $PC write "$T/sum.err" llm-quantize "$T/r8" "$T/sumdq" --progress
LLM_PROGRESS_INTERVAL=0 $Q --random $tiny --seed 3 "$T/sumr.safetensors" 2>"$T/sum.err"
check "--random: progress lines and the summary (nothing read)" $PC write "$T/sum.err" llm-quantize "" "$T/sumr.safetensors" --progress
for q in -q --quiet; do
	LLM_PROGRESS_INTERVAL=0 $Q $q "$T/r3.safetensors" "$T/q$q.safetensors" 2>"$T/q.err"
	check "$q: empty stderr on success" test ! -s "$T/q.err"
done
LLM_PROGRESS_INTERVAL=0 $Q "$T/r3.safetensors" - >"$T/v.st" 2>"$T/v.err"
$Q --quiet "$T/r3.safetensors" - >"$T/q.st"
check "OUT -: stdout is byte-identical with and without --quiet" cmp -s "$T/v.st" "$T/q.st"
check "OUT -: the summary says standard output" grep -q "^llm-quantize: read .* to standard output in " "$T/v.err"
$Q --stats --json "$T/r3.safetensors" "$T/sj1.safetensors" >"$T/v.jsonl" 2>"$T/v.err"
$Q -q --stats --json "$T/r3.safetensors" "$T/sj2.safetensors" >"$T/q.jsonl"
check "--stats --json: stdout is byte-identical with and without -q" cmp -s "$T/v.jsonl" "$T/q.jsonl"
check_fails "a bad LLM_PROGRESS_INTERVAL is a usage error naming it" 2 env LLM_PROGRESS_INTERVAL=soon $Q "$T/r3.safetensors" "$T/bad.safetensors"
grep -q "LLM_PROGRESS_INTERVAL: 'soon'" "$T/err" && ok "... the message names the variable and value" || notok "... the message names the variable and value"
if command -v script >/dev/null; then
	script -qc "LLM_PROGRESS_INTERVAL=0 $Q '$T/r3.safetensors' '$T/tty.safetensors'" /dev/null >"$T/tty.out" 2>&1
	check "on a terminal: a bar redrawn in place, then the summary on its own line" python3 -c "
import re
s = open('$T/tty.out', 'rb').read().decode()
assert re.search(r'\rllm-quantize: \[[#.]{20}\] +\d+%  \d+/\d+ tensors', s), s[:300]
assert re.search(r'\r +\rllm-quantize: read .* tensors, 1 file\) to .*tty.safetensors in ', s), s[-400:]"
else
	skip "progress on a terminal" "no script(1)"
fi
tap_done
