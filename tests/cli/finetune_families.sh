# tests/cli/finetune_families.sh: llm-finetune on a tiny random model of each
# dense family of common/checkpoint/family.c (qwen2, qwen3, mistral with a
# window of 16 under rows of 64, gemma2 with its window of 8 and softcaps),
# made by llm-quantize --random from ../shared/tools/configs/tiny-*.json with
# stories260K's tokenizer (512 ids, its BOS and EOS; F32 weights, so the
# merge adds in f32; gemma2's softcaps at Gemma 2's own 50 and 30, since the
# tiny config's final cap of 1 bounds every log-prob near uniform): the loss falls, the adapter has PEFT's names (q_proj ...
# down_proj, the same for the four families), and it loads in llm-generate:
# --lora gives --sample's greedy text (the trainer's own forward) and the
# ids and log-probs of its merge (--merge) within 1e-5, not the base's.
# Under mpirun (when present) the gemma2 model trains on 2 ranks with
# --shard-base (each layer all-gathered, with its biases, norms and sandwich
# norms read from the model) bit for bit as on 2 ranks without it. The
# mixtures of experts train in tests/cli/moe_lora.sh.
. tests/lib/tap.sh
T=$TMPD
TOOLS=${LLM_TEST_TOOLS:-../shared/tools}
D=tests/data/finetune
FAMS="tiny-qwen2 tiny-qwen3 tiny-mistral-sw tiny-gemma2"
why=
[ -d "$TOOLS/configs" ] || why="no $TOOLS/configs"
[ -n "$why" ] || have_stories || why="no stories260K in \$LLM_TEST_MODELS (its tokenizer)"
if [ -n "$why" ]; then
	for f in $FAMS; do
		skip "$f: llm-finetune trains, the loss falls" "$why"
		skip "$f: the adapter has PEFT's layout and names" "$why"
		skip "$f: llm-generate --lora equals --sample (the trainer's greedy)" "$why"
		skip "$f: --lora equals the merged weights, not the base" "$why"
	done
	skip "tiny-gemma2: 2 ranks --shard-base bit for bit as 2 ranks" "$why"
	tap_done
fi
S=$(stories)
TR="--data $D/train.jsonl --seq-len 64 --micro-batch 2 --lr 2e-2 --seed 3 -q"
P='Tell me a story about a cat.
'
GF="llm-generate --kv-dtype f32"
printf '%s\n' '{"prompt": "Tell me a story about a cat.\n", "max_tokens": 16, "temperature": 0, "logprobs": 1, "ignore_eos": true}' \
	'{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "logprobs": 1, "ignore_eos": true}' >"$T/lp.jsonl"
for f in $FAMS; do
	python3 -c "
import json, sys
c = json.load(open(sys.argv[1])); c['vocab_size'] = 512
if c['model_type'] == 'gemma2': c.update(attn_logit_softcapping=50.0, final_logit_softcapping=30.0, bos_token_id=1, eos_token_id=2)
if c['model_type'] == 'mistral': c['sliding_window'] = 16
json.dump(c, open(sys.argv[2], 'w'))" "$TOOLS/configs/$f.json" "$T/$f.json"
	M=$T/$f
	if ! llm-quantize -q --random "$T/$f.json" --dtype f32 --seed 1 --tokenizer "$S" "$M" 2>"$T/err" ||
		! llm-finetune -m "$M" $TR --steps 30 -o "$M-a" --log "$M.csv" 2>"$T/err"; then
		notok "$f: llm-finetune trains, the loss falls"; sed 's/^/#   /' "$T/err" | head -3
		continue
	fi
	# a random model of std 0.02 learns slowly: measured, the mean of the last
	# 5 of 30 steps is 0.45 to 0.75 nats under the first step's 6.2-6.3
	check "$f: llm-finetune trains, the loss falls (last 5 steps' mean 0.3 nats under the first)" python3 -c "
import csv
l = [float(r['loss']) for r in csv.DictReader(open('$M.csv'))]
print('# %s: %.4f -> %.4f' % ('$f', l[0], sum(l[-5:]) / 5))
assert len(l) == 30 and sum(l[-5:]) / 5 < l[0] - 0.3, l
"
	check "$f: the adapter has PEFT's layout and names" python3 -c "
import json, struct, re
c = json.load(open('$M-a/adapter_config.json'))
assert c['peft_type'] == 'LORA' and sorted(c['target_modules']) == sorted(['q_proj','k_proj','v_proj','o_proj','gate_proj','up_proj','down_proj']), c
f = open('$M-a/adapter_model.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
h.pop('__metadata__')
pat = re.compile(r'base_model\.model\.model\.layers\.[01]\.(self_attn\.[qkvo]|mlp\.(gate|up|down))_proj\.lora_[AB]\.weight$')
assert len(h) == 2 * 7 * 2 and all(pat.match(k) for k in h), sorted(h)
"
	tuned=$(llm-finetune -m "$M" --adapter "$M-a" --sample "$P" --sample-tokens 8)
	gl=$($GF -m "$M" --lora "$M-a" -p "$P" -n 8 --temp 0 2>"$T/err")
	diag "$f: --sample '$tuned', llm-generate --lora '$gl'"
	check "$f: llm-generate --lora equals --sample (the trainer's greedy)" sh -c '[ -n "$1" ] && [ "$1" = "$2" ]' - "$gl" "$tuned"
	llm-finetune -q -m "$M" --merge "$M-a" -o "$M-merged" 2>"$T/err"
	$GF -m "$M" --lora "$M-a" --json <"$T/lp.jsonl" >"$M.lora.json" 2>"$T/err"
	$GF -m "$M-merged" --json <"$T/lp.jsonl" >"$M.merged.json" 2>>"$T/err"
	$GF -m "$M" --json <"$T/lp.jsonl" >"$M.base.json" 2>>"$T/err"
	check "$f: --lora equals the merged weights (greedy ids, log-probs within 1e-5), not the base" python3 -c "
import json
l, m, b = ([json.loads(x) for x in open('$M.%s.json' % n)] for n in ('lora', 'merged', 'base'))
assert len(l) == len(m) == len(b) == 2
for x, y in zip(l, m):
    assert len(x['ids']) == 16 and x['ids'] == y['ids'], (x['ids'], y['ids'])
    assert max(abs(p - q) for p, q in zip(x['logprobs'], y['logprobs'])) < 1e-5
assert any(x['ids'] != z['ids'] for x, z in zip(l, b)), 'the adapter changed nothing'
"
done

# sharded frozen weights on 2 ranks: each layer is gathered into the working
# buffer, its family vectors (gemma2: the (1 + w) norms, the sandwich norms)
# come with it; the bytes are the checkpoint's, so the run repeats bit for bit
G=$T/tiny-gemma2
if ! have_mpirun; then
	skip "tiny-gemma2: 2 ranks --shard-base bit for bit as 2 ranks" "mpirun not found"
elif [ ! -d "$G" ]; then
	notok "tiny-gemma2: 2 ranks --shard-base bit for bit as 2 ranks (no model)"
else
	CMP="--data $D/train.jsonl --seq-len 64 --micro-batch 2 --lr 3e-3 --seed 3 -q --steps 6"
	timeout 300 $MPIRUN -np 2 "$(command -v llm-finetune)" -m "$G" $CMP -o "$T/r2" --log "$T/r2.csv" 2>"$T/r2.err"; r2=$?
	timeout 300 $MPIRUN -np 2 "$(command -v llm-finetune)" -m "$G" $CMP -o "$T/r2s" --log "$T/r2s.csv" \
		--shard-base --checkpoint-activations 2>"$T/r2s.err"; r2s=$?
	if [ $r2 != 0 ] && grep -q "built without MPI" "$T/r2.err"; then
		skip "tiny-gemma2: 2 ranks --shard-base bit for bit as 2 ranks" "this build has no MPI"
	else
		cut -d, -f1-4 "$T/r2.csv" >"$T/r2.cut" 2>/dev/null; cut -d, -f1-4 "$T/r2s.csv" >"$T/r2s.cut" 2>/dev/null
		check "tiny-gemma2: 2 ranks --shard-base bit for bit as 2 ranks (exit $r2, $r2s)" sh -c \
			"[ $r2 = 0 ] && [ $r2s = 0 ] && [ \$(wc -l <'$T/r2.cut') = 7 ] && cmp -s '$T/r2.cut' '$T/r2s.cut' &&
			 cmp -s '$T/r2/adapter_model.safetensors' '$T/r2s/adapter_model.safetensors'"
		sed 's/^/#   /' "$T/r2s.err" | grep -v '^#   step ' | head -3
	fi
fi

tap_done
