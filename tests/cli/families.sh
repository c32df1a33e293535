# tests/cli/families.sh: the model families of common/checkpoint/family.c
# (Qwen2's q/k/v biases, Qwen3's q/k norms, Mistral's sliding window,
# Gemma 2) against an independent reference on the same random weights:
# ../shared/tools/mkrandom.py writes each tiny model (seed 1, F32
# safetensors), llm-generate answers 130 prompts, ids[0..P] of one sequence
# (past tiny-mistral-sw's window of 64 and tiny-gemma2's of 8), with its
# top 10 log-probs (F32 KV, --parallel 8, two threads), and
# tests/lib/families_cmp.py holds them to ../shared/tools/hfref.py's float64
# forward: greedy id equal and top-10 log-probs within 2e-3 at every
# position. Against hfref with the family's feature left out (--abl) the same
# comparison must fail, so it bites. --parallel 1 gives the same bits
# (batch invariance), and so does --prefix-cache 0 (the prompts are
# prefixes of each other: with the cache they fork cached prompts, past the
# window too, whose released blocks they must not read). With stories260K's
# tokenizer on a 512-id variant of each config: the BF16 model quantized to FP8 (llm-quantize) generates and
# its perplexity of a short story is within 1% of the BF16 model's, and the
# BF16 model's with an FP8 KV cache within 1% of its f32 cache's.
# tiny-mistral-sw runs 330 positions in a KV cache of 112 (the blocks
# behind the window released) with the ids of an unbounded cache; so does
# tiny-qwen2 and tiny-qwen3 with use_sliding_window true and
# max_window_layers 0 (every layer windowed), whose log-probs match
# hfref.py's with --sw 64; with
# max_window_layers 1 (layer 0 global) nothing is released, and the small
# cache is refused.
# A random PEFT adapter (tests/cli/lora_make.py) gives the same ids at run
# time as merged (llm-finetune --merge). llm-quantize --random of each config writes a checkpoint that generates,
# and refuses a family the engine does not run (phi3) with the engine's own line
# (llm-finetune on these families: tests/cli/finetune_families.sh). Under
# mpirun (when present), llm-repartition --tp 2 --pp 2 of each model runs on
# 4 ranks (q/k/v biases split by head, q/k and Gemma's norms replicated)
# with the single process's greedy ids and log-probs within 1e-5.
# Skipped without ../shared/tools or numpy for /usr/bin/python3.
. tests/lib/tap.sh
T=$TMPD
TOOLS=${LLM_TEST_TOOLS:-../shared/tools}
PY=/usr/bin/python3
N=130
FAMS="tiny-qwen2:bias tiny-qwen3:qknorm tiny-mistral-sw:sw tiny-gemma2:acap"
why=
{ [ -f "$TOOLS/mkrandom.py" ] && [ -f "$TOOLS/hfref.py" ]; } || why="no mkrandom.py and hfref.py in $TOOLS"
[ -n "$why" ] || $PY -c 'import numpy' 2>/dev/null || why="no numpy for $PY (apt-get install python3-numpy)"
[ -n "$why" ] || have_stories || why="no stories260K in \$LLM_TEST_MODELS (its tokenizer)"
if [ -n "$why" ]; then
	for fa in $FAMS; do
		f=${fa%%:*}
		skip "$f: greedy ids and top-10 log-probs match hfref.py at $N positions" "$why"
		skip "$f: the comparison fails against hfref without ${fa#*:}" "$why"
		skip "$f: --parallel 1 and --parallel 8 give the same bits" "$why"
		skip "$f: the prefix cache (forks of cached prompts) changes no bit" "$why"
		skip "$f: FP8 generates and its perplexity is within 1% of BF16's" "$why"
		skip "$f: the FP8 KV cache's perplexity is within 1% of the f32 cache's" "$why"
		skip "$f: a LoRA adapter at run time gives the ids of its merge" "$why"
		skip "$f: llm-quantize --random writes an FP8 checkpoint that generates" "$why"
		skip "$f: --tp 2 --pp 2 under mpirun matches one process" "$why"
	done
	skip "tiny-mistral-sw: a cache of 112 positions runs 330 (blocks out of the window released), the same ids" "$why"
	for q in qwen2 qwen3; do
		skip "$q use_sliding_window, max_window_layers 0: matches hfref.py --sw 64 at $N positions" "$why"
		skip "... and the comparison fails against hfref without the window" "$why"
		skip "... a cache of 112 positions runs 330, the same ids" "$why"
		skip "... max_window_layers 1 (layer 0 global): a cache of 112 for 330 positions is refused" "$why"
	done
	skip "llm-quantize --random refuses a phi3 config with the engine's line" "$why"
	tap_done
fi
have_mpirun
# the greedy ids and top log-probs of two answer files agree within 1e-5
close() { python3 - "$1" "$2" <<'PY'
import json, sys
a, b = ([json.loads(l) for l in open(f)] for f in sys.argv[1:3])
assert len(a) == len(b) == 20, (len(a), len(b))
for x, y in zip(a, b):
    assert x[1] == y[1], (x[1], y[1])
    for e, f in zip(x[2][0], y[2][0]):
        assert e["id"] == f["id"] and abs(e["logprob"] - f["logprob"]) <= 1e-5, (e, f)
PY
}
# the ids and top log-probs of each answer (the first N: all), in prompt order
answers() { python3 -c "
import json, sys
for o in sorted(map(json.loads, open(sys.argv[1])), key=lambda o: o['index'])[:int(sys.argv[2])]:
    print(json.dumps([o['prompt_ids'], o['ids'], o['top_logprobs']]))" "$1" "${2:-1000000}"; }
ppl() { python3 -c "import json, sys; print(json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])['ppl'])" "$1"; }
# within1 LABEL NAME_A A.json NAME_B B.json [differs]: B's perplexity within
# 1% of A's (with "differs": and not equal to it, so B's path was taken)
within1() {
	local a b
	a=$(ppl "$3") b=$(ppl "$5")
	diag "$f: perplexity $2 $a, $4 $b"
	check "$1" python3 -c "import sys; d = abs(float(sys.argv[2]) / float(sys.argv[1]) - 1)
sys.exit(not (d <= 0.01 and (d > 0 or sys.argv[3] != 'differs')))" "$a" "$b" "${6:-}"
}
cat >"$T/story.txt" <<'TXT'
Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her
friends. One day, she saw a big red ball under a tree. She ran to get it, but a dog got there first.
The dog was happy and wagged its tail. Lily laughed and they played together all day long.
TXT
for fa in $FAMS; do
	f=${fa%%:*} abl=${fa#*:}
	M=$T/$f/hf-f32
	if ! $PY "$TOOLS/mkrandom.py" --config "$TOOLS/configs/$f.json" --out "$T/$f" --formats st-f32 --seed 1 \
		>"$T/$f.mk" 2>&1; then
		notok "$f: mkrandom.py writes the model"; sed 's/^/#   /' "$T/$f.mk" | tail -3
		continue
	fi
	$PY tests/lib/families_cmp.py prompts "$M" $N "$T/$f.prompts"
	for run in "8 8" "1 1" "0 1 --prefix-cache 0"; do
		set -- $run
		out=$1; shift
		llm-generate -m "$M" -n 1 --temp 0 --logprobs 10 --kv-dtype f32 --json -t 2 --parallel "$@" \
			<"$T/$f.prompts" >"$T/$f.p$out" 2>"$T/$f.err" || { sed 's/^/#   /' "$T/$f.err" | tail -3; }
	done
	$PY tests/lib/families_cmp.py compare "$TOOLS" "$M" $N "$T/$f.p8" >"$T/$f.cmp" 2>&1; rc=$?
	diag "$f: $(tail -1 "$T/$f.cmp")"
	check "$f: greedy ids and top-10 log-probs match hfref.py at $N positions" [ "$rc" = 0 ]
	$PY tests/lib/families_cmp.py compare "$TOOLS" "$M" $N "$T/$f.p8" --abl="$abl" >"$T/$f.abl" 2>&1; rc=$?
	diag "$f without $abl: $(tail -1 "$T/$f.abl")"
	check "$f: the comparison fails against hfref without $abl" [ "$rc" = 3 ]
	answers "$T/$f.p8" >"$T/$f.a8"; answers "$T/$f.p1" >"$T/$f.a1"; answers "$T/$f.p0" >"$T/$f.a0"
	check "$f: --parallel 1 and --parallel 8 give the same bits" \
		sh -c "[ \$(wc -l <'$T/$f.a8') = $N ] && cmp -s '$T/$f.a8' '$T/$f.a1'"
	check "$f: the prefix cache (forks of cached prompts) changes no bit" cmp -s "$T/$f.a1" "$T/$f.a0"
	# FP8 against BF16 on a 512-id variant with stories260K's tokenizer
	$PY -c "import json, sys; c = json.load(open(sys.argv[1])); c['vocab_size'] = 512; json.dump(c, open(sys.argv[2], 'w'))" \
		"$TOOLS/configs/$f.json" "$T/$f-512.json"
	B=$T/$f-512/hf-bf16 Q=$T/$f-512-fp8
	if $PY "$TOOLS/mkrandom.py" --config "$T/$f-512.json" --out "$T/$f-512" --formats st-bf16 --seed 1 \
		--tokenizer "$(stories)/tokenizer.json" >"$T/$f.mk2" 2>&1 &&
		llm-quantize "$B" "$Q" >"$T/$f.q" 2>&1 &&
		llm-generate -m "$Q" -p "Once upon a time" -n 8 --temp 0 >"$T/$f.gen" 2>"$T/$f.err" &&
		llm-generate -m "$B" --perplexity "$T/story.txt" --json >"$T/$f.pb" 2>"$T/$f.err" &&
		llm-generate -m "$Q" --perplexity "$T/story.txt" --json >"$T/$f.pq" 2>"$T/$f.err"; then
		within1 "$f: FP8 generates and its perplexity is within 1% of BF16's" BF16 "$T/$f.pb" FP8 "$T/$f.pq"
	else
		notok "$f: FP8 generates and its perplexity is within 1% of BF16's"
		cat "$T/$f.mk2" "$T/$f.q" "$T/$f.err" | sed 's/^/#   /' | tail -4
	fi
	# the FP8 KV cache (E4M3, a scale per token and head) through the
	# family's attention (window, softcap, scale) against an f32 one
	if llm-generate -m "$B" --kv-dtype f32 --perplexity "$T/story.txt" --json >"$T/$f.kf" 2>"$T/$f.err" &&
		llm-generate -m "$B" --kv-dtype fp8 --perplexity "$T/story.txt" --json >"$T/$f.k8" 2>"$T/$f.err"; then
		within1 "$f: the FP8 KV cache's perplexity is within 1% of the f32 cache's" "f32 KV" "$T/$f.kf" \
			"FP8 KV" "$T/$f.k8" differs
	else
		notok "$f: the FP8 KV cache's perplexity is within 1% of the f32 cache's"
		sed 's/^/#   /' "$T/$f.err" | tail -3
	fi
	# a PEFT adapter (q_proj ... down_proj, the names every dense family
	# shares) applied at run time, and merged into the weights: the same ids
	ids5() { head -5 "$T/$f.prompts" | llm-generate -m "$1" ${2:+--lora "$2"} -n 3 --temp 0 --json |
		python3 -c "import json, sys; print([json.loads(l)['ids'] for l in sys.stdin])"; }
	if $PY tests/cli/lora_make.py "$M/config.json" "$T/$f-lora" --rank 4 --seed 1 >"$T/$f.lm" 2>&1 &&
		llm-finetune -q -m "$M" --merge "$T/$f-lora" -o "$T/$f-merged" >"$T/$f.mg" 2>&1; then
		a=$(ids5 "$M" "$T/$f-lora") b=$(ids5 "$T/$f-merged") c=$(ids5 "$M")
		check "$f: a LoRA adapter at run time gives the ids of its merge, not the base's ($a)" \
			sh -c "[ -n '$a' ] && [ '$a' = '$b' ] && [ '$a' != '$c' ]"
	else
		notok "$f: a LoRA adapter at run time gives the ids of its merge"
		cat "$T/$f.lm" "$T/$f.mg" | sed 's/^/#   /' | tail -3
	fi
	if [ "$f" = tiny-mistral-sw ]; then
		# the window of 64 releases the blocks behind it: 112 KV positions
		# (the window, a 16-token step, two partly used blocks) carry a
		# 130-token prompt, prefilled in 16-token chunks, and 200 more
		tail -1 "$T/$f.prompts" >"$T/long.jsonl"
		for kv in "all" "small --max-kv-tokens 112"; do
			set -- $kv
			out=$1; shift
			llm-generate -m "$M" -n 200 --ignore-eos --temp 0 --json --batch-tokens 16 "$@" <"$T/long.jsonl" \
				2>"$T/$f.err" | python3 -c "import json, sys; print(json.loads(sys.stdin.readline())['ids'])" \
				>"$T/long.$out"
		done
		check "$f: a cache of 112 positions runs 330 (blocks out of the window released), the same ids" \
			sh -c "[ \$(wc -c <'$T/long.all') -gt 100 ] && cmp -s '$T/long.all' '$T/long.small'"
		sed 's/^/#   /' "$T/$f.err" | tail -2
	fi
	R=$T/$f-random
	check "$f: llm-quantize --random writes an FP8 checkpoint that generates" sh -c \
		"llm-quantize --random '$TOOLS/configs/$f.json' --dtype fp8 --seed 1 '$R' >/dev/null 2>&1 &&
		 echo '{\"prompt_ids\": [1, 5, 9]}' | llm-generate -m '$R' -n 4 --temp 0 --json | grep -q '\"ids\":\\[[0-9]*,[0-9]*,[0-9]*,[0-9]*\\]'"
	if [ -z "$MPIRUN" ]; then
		skip "$f: --tp 2 --pp 2 under mpirun matches one process" "mpirun not found"
		continue
	fi
	head -20 "$T/$f.prompts" >"$T/$f.p20"
	if llm-repartition -q "$M" "$T/$f-tp2pp2" --tp 2 --pp 2 >"$T/$f.rp" 2>&1 &&
		$MPIRUN -np 4 "$LLM_BIN/llm-generate" -m "$T/$f-tp2pp2" -n 1 --temp 0 --logprobs 10 --kv-dtype f32 --json \
			-t 1 <"$T/$f.p20" >"$T/$f.mpi" 2>"$T/$f.err"; then
		answers "$T/$f.mpi" >"$T/$f.am"; answers "$T/$f.p1" 20 >"$T/$f.a20"
		check "$f: --tp 2 --pp 2 under mpirun matches one process" close "$T/$f.a20" "$T/$f.am"
	else
		notok "$f: --tp 2 --pp 2 under mpirun matches one process"
		cat "$T/$f.rp" "$T/$f.err" | sed 's/^/#   /' | tail -4
	fi
done
# Qwen2's and Qwen3's use_sliding_window (config.c config_window: the
# layers from max_window_layers on): hfref.py applies no window to them but
# can force one on every layer (--sw), so max_window_layers 0 (every layer
# windowed) is held to it; the per-layer rule itself is test_model.c's
for q in qwen2 qwen3; do
	f=tiny-$q-sw M=$T/tiny-$q-sw/hf-f32
	$PY -c "import json, sys; c = json.load(open(sys.argv[1])); c.update(use_sliding_window=True, sliding_window=64,
	max_window_layers=0); json.dump(c, open(sys.argv[2], 'w'))" "$TOOLS/configs/tiny-$q.json" "$T/$f.json"
	$PY "$TOOLS/mkrandom.py" --config "$T/$f.json" --out "$T/$f" --formats st-f32 --seed 1 >"$T/$f.mk" 2>&1
	$PY tests/lib/families_cmp.py prompts "$M" $N "$T/$f.prompts"
	llm-generate -m "$M" -n 1 --temp 0 --logprobs 10 --kv-dtype f32 --json -t 2 --parallel 8 <"$T/$f.prompts" \
		>"$T/$f.p8" 2>"$T/$f.err" || sed 's/^/#   /' "$T/$f.err" | tail -3
	$PY tests/lib/families_cmp.py compare "$TOOLS" "$M" $N "$T/$f.p8" --sw=64 >"$T/$f.cmp" 2>&1; rc=$?
	diag "$f: $(tail -1 "$T/$f.cmp")"
	check "$q use_sliding_window, max_window_layers 0: matches hfref.py --sw 64 at $N positions" [ "$rc" = 0 ]
	$PY tests/lib/families_cmp.py compare "$TOOLS" "$M" $N "$T/$f.p8" >"$T/$f.abl" 2>&1; rc=$?
	diag "$f against a global $q: $(tail -1 "$T/$f.abl")"
	check "... and the comparison fails against hfref without the window" [ "$rc" = 3 ]
	tail -1 "$T/$f.prompts" >"$T/long.jsonl"
	for kv in "all" "small --max-kv-tokens 112"; do
		set -- $kv
		out=$1; shift
		llm-generate -m "$M" -n 200 --ignore-eos --temp 0 --json --batch-tokens 16 "$@" <"$T/long.jsonl" \
			2>"$T/$f.err" | python3 -c "import json, sys; print(json.loads(sys.stdin.readline())['ids'])" >"$T/long.$out"
	done
	check "... a cache of 112 positions runs 330, the same ids (every layer windowed: blocks released)" \
		sh -c "[ \$(wc -c <'$T/long.all') -gt 100 ] && cmp -s '$T/long.all' '$T/long.small'"
	sed 's/^/#   /' "$T/$f.err" | tail -2
	# max_window_layers 1 of 2: layer 0 global keeps every key, so no block is
	# released and 112 positions cannot hold 330
	$PY -c "import json, sys; c = json.load(open(sys.argv[1])); c['max_window_layers'] = 1; json.dump(c, open(sys.argv[1], 'w'))" \
		"$M/config.json"
	check_fails "... max_window_layers 1 (layer 0 global): a cache of 112 for 330 positions is refused" 1 \
		llm-generate -m "$M" -n 200 --ignore-eos --temp 0 --json --batch-tokens 16 --max-kv-tokens 112 <"$T/long.jsonl"
	grep -q "less than the longest prompt with its output of 330: need --max-kv-tokens 330" "$T/err" ||
		notok "... naming the whole 330 positions: $(cat "$T/err")"
done
sed 's/"mixtral"/"phi3"/' "$TOOLS/configs/tiny-mixtral.json" >"$T/phi3.json"
check_fails "llm-quantize --random refuses a phi3 config with the engine's line" 1 \
	llm-quantize --random "$T/phi3.json" --seed 1 "$T/phi3"
grep -q "model_type: 'phi3' is not supported" "$TMPD/err" || notok "the line names model_type phi3: $(cat "$TMPD/err")"
tap_done
