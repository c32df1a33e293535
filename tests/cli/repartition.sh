# tests/cli/repartition.sh: llm-repartition from the shell: round trips
# bit-exact (--tp 1 --pp 1 gives back the original model.safetensors byte for
# byte) on stories260K and a random SmolLM2-135M-shape checkpoint, FP8 and
# BF16; refusals named before anything is written; the record; kill safety;
# other tools reading a partitioned checkpoint as the whole model.
. tests/lib/tap.sh
R=llm-repartition
Q=llm-quantize
T=$TMPD

check "--help exits 0 and prints the usage line" sh -c "$R --help | grep -q '^usage: llm-repartition '"
check_fails "unknown option is a usage error" 2 $R --frobnicate a b
check_fails "missing OUT is a usage error" 2 $R only-in --tp 2
check_fails "--tp 0 is a usage error" 2 $R a b --tp 0
check_fails "--layers with junk is a usage error" 2 $R a b --pp 2 --layers 2,x
check_fails "--layers with the wrong count is a usage error" 2 $R a b --pp 2 --layers 1,2,2
check_fails "a missing input is a runtime error naming it" 1 $R "$T/nope" "$T/out" --tp 2
grep -q "$T/nope" "$T/err" && ok "the error names the missing input" || notok "the error names the missing input"

# roundtrip DESC SRC ARGS...: partition, merge back, compare the files
roundtrip() {
	local d=$1 src=$2; shift 2
	rm -rf "$T/rt" "$T/rt.m"
	if $R -q "$src" "$T/rt" "$@" && $R -q "$T/rt" "$T/rt.m" --tp 1 --pp 1 &&
		cmp -s "$src/model.safetensors" "$T/rt.m/model.safetensors"; then
		ok "$d: $* and back gives model.safetensors byte for byte ($(ls "$T/rt" | grep -c '^rank-') rank files)"
	else
		notok "$d: $* round trip"
	fi
}
# refuse DESC PATTERN SRC ARGS...: exit 1, one line matching PATTERN, no OUT
refuse() {
	local d=$1 pat=$2 src=$3; shift 3
	rm -rf "$T/ref"
	check_fails "$d is refused" 1 $R "$src" "$T/ref" "$@"
	if grep -qE -- "$pat" "$T/err" && ! ls -d "$T"/ref* >/dev/null 2>&1; then ok "$d: the message names it ($(cut -c1-150 "$T/err")), nothing written"
	else notok "$d: message '$(cat "$T/err")' (want /$pat/) or output left"; fi
}

if have_stories; then
	S=$(stories)
	for a in "--tp 2" "--tp 4" "--pp 2" "--pp 5" "--tp 2 --pp 2" "--tp 4 --pp 2"; do
		roundtrip "stories260K F32" "$S" $a
	done
	$Q -q --dequantize --dtype bf16 "$(sh -c "$Q -q '$S' '$T/s8' && echo '$T/s8'")" "$T/s16"
	roundtrip "stories260K BF16" "$T/s16" --tp 2 --pp 2
	roundtrip "stories260K FP8 128x128" "$T/s8" --pp 2
	refuse "stories260K FP8 128x128 --tp 2 (d_ff 172 cut at 86)" \
		"mlp\.(gate|up|down)_proj\.weight.*(row|column) 86.*128-(row|column) FP8 block" "$T/s8" --tp 2
	$Q -q --block 1xK "$S" "$T/s8k"
	roundtrip "stories260K FP8 1xK (per channel)" "$T/s8k" --tp 2 --pp 2
	roundtrip "stories260K FP8 1xK (per channel)" "$T/s8k" --tp 4
	$Q -q --block 1x128 "$S" "$T/s8r"
	refuse "stories260K FP8 1x128 --tp 2 (down_proj columns 172 cut at 86)" \
		"mlp\.down_proj\.weight.*column 86.*128-column FP8 block" "$T/s8r" --tp 2
	refuse "--tp 3 on 8 heads" "q_proj\.weight.*8 attention heads .*--tp 3" "$S" --tp 3
	refuse "--tp 8 with d_ff 172" "intermediate_size 172 does not split evenly over --tp 8" "$S" --tp 8
	refuse "--pp 6 on 5 layers" "--pp 6 needs at least 6 layers; the model has 5" "$S" --pp 6
	refuse "--layers adding up to 4 of 5" "--layers adds up to 4 layers; the model has 5" "$S" --pp 2 --layers 1,3

	# the record
	$R -q "$S" "$T/p22" --tp 2 --pp 2 --layers 2,3
	check "partition.json records tp, pp, --layers stages and one file per rank" python3 -c "
import json
p = json.load(open('$T/p22/partition.json'))
assert p['tp'] == 2 and p['pp'] == 2 and p['stages'] == [[0, 2], [2, 5]], p['stages']
assert [r['file'] for r in p['ranks']] == ['rank-%05d-pp%d-tp%d.safetensors' % (r, r // 2, r % 2) for r in range(4)]
assert p['tensors'][0]['name'] == 'model.embed_tokens.weight' and p['tensors'][0]['split'] == 0
"
	check "each rank file holds its own record and only its stage's layers, sliced" python3 -c "
import json, struct
for r in range(4):
    f = open('$T/p22/rank-%05d-pp%d-tp%d.safetensors' % (r, r // 2, r % 2), 'rb')
    h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
    m = json.loads(h['__metadata__']['llm_partition'])
    assert m['rank'] == r and m['stage'] == r // 2 and m['tp_rank'] == r % 2, m
    layers = {int(k.split('.')[2]) for k in h if k.startswith('model.layers.')}
    assert layers == set(range(*m['layers'])), (r, layers)
    q = h['model.layers.%d.self_attn.q_proj.weight' % m['layers'][0]]
    assert q['shape'] == [32, 64], q
    o = m['slices']['model.layers.%d.self_attn.o_proj.weight' % m['layers'][0]]
    assert o == [1, 32 * (r % 2), 64], o
    assert 'config.json' in h['__metadata__']
"
	check "a partitioned checkpoint repartitions directly (tp2 x pp2 -> tp4 -> merged)" sh -c \
		"$R -q '$T/p22' '$T/p4' --tp 4 && $R -q '$T/p4' '$T/p4.m' && cmp -s '$S/model.safetensors' '$T/p4.m/model.safetensors'"
	$R -q "$T/p22" - >"$T/pipe.safetensors" && $R -q "$T/p22" "$T/file.safetensors"
	check "merging to - equals merging to a .safetensors file" cmp -s "$T/pipe.safetensors" "$T/file.safetensors"
	check "the side files come back unchanged" sh -c "cmp -s '$S/tokenizer.json' '$T/p4.m/tokenizer.json' && cmp -s '$S/config.json' '$T/p4.m/config.json' && test ! -e '$T/p4.m/partition.json'"
	$R -q --dry-run "$S" "$T/dry" --tp 2 --pp 2 >"$T/plan.txt"
	check "--dry-run prints the plan and writes nothing" sh -c "grep -q 'rank-00003-pp1-tp1' '$T/plan.txt' && test ! -e '$T/dry'"
	check_fails "an existing OUT is not replaced without --force" 1 $R "$S" "$T/p22" --tp 2
	check "--force replaces an existing OUT" sh -c "$R -q --force '$S' '$T/p22' --tp 2 && test \$(ls '$T/p22' | grep -c '^rank-') = 2"

	# other tools read a partitioned checkpoint as the whole model
	a=$(llm-generate -m "$S" -p "Once upon a time" -n 24 --temp 0 2>/dev/null)
	b=$(llm-generate -m "$T/p4" -p "Once upon a time" -n 24 --temp 0 2>/dev/null)
	check "llm-generate on a tp4 checkpoint writes the same greedy text as on the original" sh -c "[ -n '$a' ] && [ '$a' = '$b' ]"
	$Q -q --dequantize "$T/rt" "$T/deq" 2>/dev/null   # rt: the last FP8 1xK tp4 partition
	$Q -q --dequantize "$T/s8k" "$T/deq2"
	check "llm-quantize --dequantize reads a partitioned FP8 checkpoint as the whole model" \
		cmp -s "$T/deq/model.safetensors" "$T/deq2/model.safetensors"
else
	skip "stories260K round trips and refusals" "no stories260K in \$LLM_TEST_MODELS"
fi

# a random SmolLM2-135M-shape checkpoint: 9 heads, 3 kv heads, d_ff 1536
cfg=configs/smollm2-135m.json
$Q -q --random $cfg --dtype bf16 --seed 1 "$T/m16"
$Q -q --random $cfg --dtype fp8 --seed 1 "$T/m8"
refuse "SmolLM2 --tp 2 (9 heads)" "q_proj\.weight.*9 attention heads do not split evenly over --tp 2" "$T/m16" --tp 2
roundtrip "SmolLM2 BF16" "$T/m16" --tp 3 --pp 2
refuse "SmolLM2 FP8 128x128 --tp 3 (q_proj rows cut at 192)" "q_proj\.weight.*576x576.*row 192.*128-row FP8 block" "$T/m8" --tp 3
roundtrip "SmolLM2 FP8 128x128" "$T/m8" --pp 3
$Q -q --random $cfg --dtype fp8 --block 1xK --seed 1 "$T/m8k"
roundtrip "SmolLM2 FP8 1xK" "$T/m8k" --tp 3 --pp 2
check "SmolLM2 pp3: stages balanced by bytes (embedding and head counted)" sh -c \
	"$R -q -n '$T/m16' x --pp 3 | awk '/^[0-9]/{print \$6}' | sort -n | awk 'NR==1{lo=\$1} END{exit !(\$1 < 1.2 * lo)}'"

# the embedding and lm_head of an --fp8-vocab checkpoint (one scale per
# row) split at any vocabulary row: 1000 rows over --tp 2 cut at 500 and
# over --tp 4 at 250, inside 128-row blocks, beside 128x128 decoder blocks
sed -e 's/"hidden_size": 128/"hidden_size": 512/' -e 's/"intermediate_size": 352/"intermediate_size": 1024/' \
	-e 's/"vocab_size": 512/"vocab_size": 1000/' configs/tiny-check.json >"$T/v1000.json"
$Q -q --random "$T/v1000.json" --dtype fp8 --fp8-vocab --seed 4 "$T/v8"
roundtrip "vocabulary 1000, FP8 128x128 with the embedding and lm_head per row" "$T/v8" --tp 2 --pp 2
roundtrip "vocabulary 1000, FP8 128x128 with the embedding and lm_head per row" "$T/v8" --tp 4
$R -q "$T/v8" "$T/v8p" --tp 4
check "--tp 4: rank 1's lm_head holds vocabulary rows 250-499 and their 250 scales" python3 -c "
import json, struct
f = open('$T/v8p/rank-00001-pp0-tp1.safetensors', 'rb')
h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
assert h['lm_head.weight']['shape'] == [250, 512] and h['lm_head.weight']['dtype'] == 'F8_E4M3', h['lm_head.weight']
assert h['lm_head.weight_scale_inv']['shape'] == [250, 1], h['lm_head.weight_scale_inv']
assert h['model.embed_tokens.weight']['shape'] == [250, 512]
"

# key-value heads fewer than --tp: replicated (8 heads, 2 kv heads)
sed -e 's/"hidden_size": 128/"hidden_size": 64/' -e 's/"intermediate_size": 352/"intermediate_size": 128/' \
	-e 's/"num_attention_heads": 4/"num_attention_heads": 8/' configs/tiny-check.json >"$T/kv.json"
$Q -q --random "$T/kv.json" --seed 3 "$T/kv"
roundtrip "8 heads, 2 kv heads" "$T/kv" --tp 4
roundtrip "8 heads, 2 kv heads" "$T/kv" --tp 8 --pp 2
$R -q "$T/kv" "$T/kv4" --tp 4
check "--tp 4 on 2 kv heads: ranks 0,1 hold kv head 0 and ranks 2,3 kv head 1" python3 -c "
import json, struct
for r in range(4):
    f = open('$T/kv4/rank-%05d-pp0-tp%d.safetensors' % (r, r), 'rb')
    h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
    m = json.loads(h['__metadata__']['llm_partition'])
    k = m['slices']['model.layers.0.self_attn.k_proj.weight']
    assert k == [0, (r // 2) * 8, 16], (r, k)
    assert h['model.layers.0.self_attn.q_proj.weight']['shape'] == [16, 64]
"
refuse "--tp 3 on 2 kv heads" "q_proj.*8 attention heads" "$T/kv" --tp 3

# progress and the closing summary (issue 22), both directions: counts those
# of the files written (every rank file); -q: nothing; --dry-run: the plan only
PC="python3 tests/lib/progress_check.py"
LLM_PROGRESS_INTERVAL=0 $R "$T/kv" "$T/kvp" --tp 4 --pp 2 >"$T/kvp.out" 2>"$T/kvp.err"
check "--tp 4 --pp 2: progress lines, then the summary (8 rank files, their tensors)" $PC write "$T/kvp.err" llm-repartition "$T/kv" "$T/kvp" --progress
check "... and nothing on stdout" test ! -s "$T/kvp.out"
LLM_PROGRESS_INTERVAL=1000 $R "$T/kvp" "$T/kvm" 2>"$T/kvm.err"
check "merging back: one summary line, the whole tensors read and written" $PC write "$T/kvm.err" llm-repartition "$T/kv" "$T/kvm"
LLM_PROGRESS_INTERVAL=0 $R -q "$T/kv" "$T/kvq" --tp 2 2>"$T/kvq.err"
check "-q: empty stderr on success" test ! -s "$T/kvq.err"
LLM_PROGRESS_INTERVAL=0 $R --quiet "$T/kvp" - 2>"$T/kvq.err" >"$T/kvq.st"
check "--quiet merging to -: empty stderr" test ! -s "$T/kvq.err"
LLM_PROGRESS_INTERVAL=0 $R "$T/kvp" - 2>/dev/null >"$T/kvv.st"
check "merging to -: stdout is byte-identical with and without --quiet" cmp -s "$T/kvq.st" "$T/kvv.st"
LLM_PROGRESS_INTERVAL=0 $R -n "$T/kv" x --tp 4 >"$T/dry1" 2>"$T/dry.err"
$R -q -n "$T/kv" x --tp 4 >"$T/dry2"
check "--dry-run: the same plan on stdout with and without -q, nothing on stderr" sh -c "cmp -s '$T/dry1' '$T/dry2' && test -s '$T/dry1' && test ! -s '$T/dry.err'"

# kill safety: SIGKILL mid-write leaves nothing that looks complete (killed
# as soon as the temporary output exists; the wait is bounded at 60 s)
$R -q "$T/m16" "$T/killed" --tp 3 & pid=$!
writing() { ls -d "$T"/killed.tmp.* >/dev/null 2>&1; }
wait_until 60 writing
kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
check "SIGKILL during a write leaves no OUT" test ! -e "$T/killed"
rm -rf "$T"/killed.tmp.*

# OUT/ with a trailing slash names the directory OUT (issue 22)
if have_stories; then
	check "--tp 2 into OUT/ writes the directory OUT" sh -c "$R -q '$(stories)' '$T/sl/' --tp 2 && test -f '$T/sl/partition.json' && ! ls -d '$T'/sl*.tmp.* 2>/dev/null"
	check "--tp 1 --pp 1 into OUT/ writes the directory OUT" sh -c "$R -q '$T/sl' '$T/sl1/' && cmp -s '$(stories)/model.safetensors' '$T/sl1/model.safetensors'"
	check "- writes and reads a checkpoint stream" sh -c "$R -q '$(stories)' - 2>/dev/null | $R -q - '$T/st' --tp 2 && test -f '$T/st/partition.json'"
else
	skip "OUT/ with a trailing slash" "no stories260K in \$LLM_TEST_MODELS"
fi
tap_done
