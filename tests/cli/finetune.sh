# tests/cli/finetune.sh: llm-finetune from the shell: usage errors, --plan,
# and on stories260K with tests/data/finetune: the loss falls, the adapter
# has PEFT's layout and changes generations as trained, --merge then
# llm-generate equals --sample with the adapter, checkpointing and FP8 give
# the stated loss curves, SIGKILL + --resume gives the same adapter, bad
# data is named by line or skipped.
. tests/lib/tap.sh
FT=llm-finetune
T=$TMPD
D=tests/data/finetune

check "--help exits 0 and prints the usage line" sh -c "$FT --help | grep -q '^usage: llm-finetune '"
check_fails "no -m is a usage error" 2 $FT --data $D/train.jsonl -o "$T/x"
check_fails "an unknown --targets item is a usage error" 2 $FT -m m --targets q,zz --data $D/train.jsonl -o "$T/x"
check_fails "--json without --plan is a usage error" 2 $FT -m m --json
check_fails "--ranks for training is a usage error (mpirun -np sets the ranks)" 2 $FT -m m --ranks 2 --data $D/train.jsonl -o "$T/x"
check_fails "a missing model is a runtime error" 1 $FT -m "$T/nope" --data $D/train.jsonl -o "$T/x"

# --plan on a random checkpoint: needs no data, reads no weights
llm-quantize -q --random configs/tiny-check.json --seed 1 "$T/tiny" 2>/dev/null
$FT -m "$T/tiny" --plan --seq-len 128 --micro-batch 2 >"$T/plan.txt"
check "--plan prints a table with a total" grep -q '^total ' "$T/plan.txt"
$FT -m "$T/tiny" --plan --json --seq-len 128 >"$T/p0.json" &&
	$FT -m "$T/tiny" --plan --json --seq-len 128 --checkpoint-activations >"$T/p1.json" &&
	$FT -m "$T/tiny" --plan --json --seq-len 128 --ranks 2 --shard-base >"$T/p2.json" &&
	$FT -m "$T/tiny" --plan --json --seq-len 128 --offload-base 0.5 >"$T/p3.json"
check "--plan --json: checkpointing shrinks activations, --shard-base halves the decoder weights, --offload-base moves half the layers to host" python3 -c "
import json
j = [json.load(open('$T/p%d.json' % i)) for i in range(4)]
a, b, c, d = (x['bytes_per_rank'] for x in j)
dec, oth, nl = j[0]['decoder_weights'], j[0]['other_weights'], j[0]['n_layer']
assert b['layer_activations'] * 2 == a['layer_activations'], (a, b)
assert b['total'] < a['total']
assert a['frozen_weights'] == dec + oth and a['gather_buffer'] == 0, a
# each rank: the replicated embeddings and norm, half of each layer (64-byte pieces), one whole layer buffer
assert 0 <= c['frozen_weights'] - (oth + dec / 2) <= 64 * 18 * nl and c['gather_buffer'] >= dec / nl, (c, dec, oth)
k = j[3]['offloaded_layers']
assert k == round(nl / 2) and d['frozen_offloaded'] == dec * k // nl and d['frozen_weights'] + d['frozen_offloaded'] == a['frozen_weights'], d
"

if ! have_stories; then
	skip "--plan --data: the input embedding rows the data uses" "no stories260K in \$LLM_TEST_MODELS"
	skip "llm-finetune on stories260K" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
S=$(stories)
# an untied model with the stories tokenizer and a 2 MiB BF16 input embedding
# (rows of 4 KiB): the plan counts the 64 KiB windows of the rows the data uses
python3 -c "
import json; c = json.load(open('configs/tiny-check.json'))
c.update(hidden_size=2048, num_hidden_layers=1, intermediate_size=64, num_attention_heads=16, num_key_value_heads=16)
json.dump(c, open('$T/wide.json', 'w'))"
llm-quantize -q --random "$T/wide.json" --seed 1 --tokenizer "$S" "$T/wide" 2>/dev/null
$FT -m "$T/wide" --plan --json --seq-len 64 >"$T/pw0.json" &&
	$FT -m "$T/wide" --plan --json --seq-len 64 --data $D/train.jsonl >"$T/pw1.json"
check "--plan --data: only the windows of the input embedding rows the data uses are counted" python3 -c "
import json
a, b = (json.load(open('$T/pw%d.json' % i)) for i in (0, 1))
t = a['embedding_table']
assert t == 512 * 2048 * 2 and a['embedding_resident'] == t, a
r = b['embedding_resident']
assert 0 < r < t and r % 65536 == 0, b
assert b['bytes_per_rank']['frozen_weights'] == a['bytes_per_rank']['frozen_weights'] - t + r, (a, b)
"
# ~0.3 s each in a normal build: 24 samples, rows of 64 tokens
TR="--data $D/train.jsonl --seq-len 64 --micro-batch 2 --lr 2e-2 --seed 3 -q"
P='Tell me a story about a cat.
'
$FT -m "$S" $TR --steps 30 -o "$T/a" --log "$T/a.csv"
check "training writes an adapter and a loss log" test -f "$T/a/adapter_model.safetensors" -a -f "$T/a/adapter_config.json" -a -f "$T/a.csv"
check "the loss falls (mean of the last 5 steps under half the first)" python3 -c "
import csv
l = [float(r['loss']) for r in csv.DictReader(open('$T/a.csv'))]
assert len(l) == 30 and sum(l[-5:]) / 5 < l[0] / 2, l
"
check "no training state is left after a finished run" test ! -e "$T/a/training_state.bin"
check "the adapter has PEFT's layout (adapter_config.json fields, tensor names and shapes)" python3 -c "
import json, struct, re
c = json.load(open('$T/a/adapter_config.json'))
assert c['peft_type'] == 'LORA' and c['task_type'] == 'CAUSAL_LM' and c['bias'] == 'none', c
assert c['r'] == 8 and c['lora_alpha'] == 16 and abs(c['lora_dropout'] - 0.05) < 1e-9, c
assert c['fan_in_fan_out'] is False and c['use_dora'] is False and c['use_rslora'] is False, c
assert sorted(c['target_modules']) == sorted(['q_proj','k_proj','v_proj','o_proj','gate_proj','up_proj','down_proj']), c
assert c['base_model_name_or_path'], c
f = open('$T/a/adapter_model.safetensors', 'rb'); n = struct.unpack('<Q', f.read(8))[0]; h = json.loads(f.read(n))
assert h.pop('__metadata__') == {'format': 'pt'}
dims = {'q_proj': (64, 64), 'k_proj': (64, 32), 'v_proj': (64, 32), 'o_proj': (64, 64),
        'gate_proj': (64, 172), 'up_proj': (64, 172), 'down_proj': (172, 64)}   # (in, out)
pat = re.compile(r'base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+_proj)\.lora_([AB])\.weight$')
assert len(h) == 5 * 7 * 2, len(h)
for k, v in h.items():
    m = pat.match(k); assert m, k
    i, o = dims[m.group(3)]
    assert v['dtype'] == 'F32' and v['shape'] == ([8, i] if m.group(4) == 'A' else [o, 8]), (k, v)
    assert (m.group(2) == 'mlp') == (m.group(3) in ('gate_proj', 'up_proj', 'down_proj')), k
"
base=$($FT -m "$S" --sample "$P" --sample-tokens 8)
tuned=$($FT -m "$S" --adapter "$T/a" --sample "$P" --sample-tokens 8)
diag "base: $base | tuned: $tuned"
check "the trained adapter changes generations as trained (Bob the frog, after the space that follows the prompt)" sh -c "case '$tuned' in ' Bob the frog'*) true;; *) false;; esac && case '$base' in ' Bob the frog'*) false;; *) true;; esac"
check_fails "an existing adapter is not overwritten without --force" 1 $FT -m "$S" $TR --steps 1 -o "$T/a"
LLM_PROGRESS_INTERVAL=0 $FT -m "$S" --merge "$T/a" -o "$T/merged" 2>"$T/merge.err"
check "--merge writes a checkpoint" test -f "$T/merged/model.safetensors"
check "--merge: progress lines and the summary, the base's tensors read and written (issue 22)" \
	python3 tests/lib/progress_check.py write "$T/merge.err" llm-finetune "$S" "$T/merged" --progress
LLM_PROGRESS_INTERVAL=0 $FT -q -m "$S" --merge "$T/a" -o "$T/merged.q" 2>"$T/merge.err"
check "--merge -q: empty stderr, the same checkpoint" sh -c "test ! -s '$T/merge.err' && cmp -s '$T/merged/model.safetensors' '$T/merged.q/model.safetensors'"
# generations compared with --sample (f32 throughout) run an f32 KV cache
GF="llm-generate --kv-dtype f32"
gen=$($GF -m "$T/merged" -p "$P" -n 8 --temp 0 2>/dev/null)
diag "llm-generate on the merged checkpoint: $gen"
check "--merge then llm-generate equals --sample with the adapter" sh -c '[ -n "$1" ] && [ "$1" = "$2" ]' - "$gen" "$tuned"

# the adapter applied at run time: llm-generate --lora and llm-serve --lora
printf '%s\n' '{"prompt": "Tell me a story about a cat.\n", "max_tokens": 24, "temperature": 0, "logprobs": 1}' \
	'{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "logprobs": 1}' \
	'{"prompt": "The dog", "max_tokens": 24, "temperature": 0, "logprobs": 1}' >"$T/lp.jsonl"
$GF -m "$S" --lora "$T/a" --json <"$T/lp.jsonl" >"$T/lora.json" 2>"$T/err"
$GF -m "$T/merged" --json <"$T/lp.jsonl" >"$T/merged.json" 2>>"$T/err"
$GF -m "$S" --json <"$T/lp.jsonl" >"$T/base.json" 2>>"$T/err"
# the same weights summed in another order: W x + s B (A x) against (W + s B A) x
# (an f32 KV cache: bf16 would round the keys and values those sums moved)
check "--merge then generate equals generate --lora: same greedy ids, log-probs within 1e-5" python3 -c "
import json
l, m, b = ([json.loads(x) for x in open('$T/%s.json' % n)] for n in ('lora', 'merged', 'base'))
assert len(l) == len(m) == 3
for x, y, z in zip(l, m, b):
    assert len(x['ids']) == 24 and x['ids'] == y['ids'], (x['ids'], y['ids'])
    assert max(abs(p - q) for p, q in zip(x['logprobs'], y['logprobs'])) < 1e-5
assert any(x['ids'] != z['ids'] for x, z in zip(l, b)), 'the adapter changed nothing'
"
gl=$($GF -m "$S" --lora "$T/a" -p "$P" -n 8 --temp 0 2>/dev/null)
check "llm-generate --lora equals --sample with the adapter" sh -c '[ -n "$1" ] && [ "$1" = "$2" ]' - "$gl" "$tuned"
llm-quantize -q "$S" "$T/s8l"
g8=$($GF -m "$T/s8l" --lora "$T/a" -p "$P" -n 8 --temp 0 2>/dev/null)
diag "FP8 base with the adapter: $g8"
check "an FP8 base with --lora generates as trained (Bob the frog, after the space that follows the prompt)" sh -c "case '$g8' in ' Bob the frog'*) true;; *) false;; esac"
check_fails "--lora on a missing directory is a runtime error" 1 llm-generate -m "$S" --lora "$T/nope" -p hi -n 1
grep -q "$T/nope" "$T/err" && ok "the error names the missing adapter" || notok "the error names the missing adapter: $(cat "$T/err")"
llm-quantize -q --random configs/tiny-check.json --seed 1 "$T/other" 2>/dev/null
check_fails "an adapter for another model shape is refused" 1 llm-generate -m "$T/other" --lora "$T/a" -p hi -n 1
rm -f "$T/port"
llm-serve --kv-dtype f32 -m "$S" --lora "$T/a" --port 0 --port-file "$T/port" -t 1 2>"$T/serve.log" & SP=$!
URL=$(serve_url "$T/port")
curl -s -m 60 -H 'Content-Type: application/json' "$URL/v1/completions" \
	-d '{"prompt": "Once upon a time", "max_tokens": 24, "temperature": 0, "model": "a"}' >"$T/sv.json"
kill -TERM $SP 2>/dev/null
wait $SP
check "llm-serve --lora: a greedy completion naming the adapter (model a) equals llm-generate --lora" python3 -c "
import json
want = [json.loads(x) for x in open('$T/lora.json')][1]['text']
got = json.load(open('$T/sv.json'))['choices'][0]['text']
assert got == want, (got, want)
"

# the same training with each optimization on and off (a gentler lr: at
# 2e-2 the trajectories are chaotic and any rounding difference grows)
CMP="--data $D/train.jsonl --seq-len 64 --micro-batch 2 --lr 3e-3 --seed 3 -q"
$FT -m "$S" $CMP --steps 12 -o "$T/c0" --log "$T/c0.csv"
$FT -m "$S" $CMP --steps 12 -o "$T/c1" --log "$T/c1.csv" --checkpoint-activations
check "activation checkpointing: the same loss curve and adapter, bit for bit" sh -c \
	"cut -d, -f1-4 '$T/c0.csv' >'$T/c0.cut' && cut -d, -f1-4 '$T/c1.csv' >'$T/c1.cut' && cmp -s '$T/c0.cut' '$T/c1.cut' && cmp -s '$T/c0/adapter_model.safetensors' '$T/c1/adapter_model.safetensors'"
# one rank: --shard-base (a shard of 1/1) and --offload-base 0.6 run each
# layer from the working buffer instead of the mapping: the same bytes
$FT -m "$S" $CMP --steps 12 -o "$T/c2" --log "$T/c2.csv" --shard-base --offload-base 0.6 -v 2>"$T/c2.err"
check "--shard-base and --offload-base on one rank: the same loss curve and adapter, bit for bit" sh -c \
	"cut -d, -f1-4 '$T/c2.csv' >'$T/c2.cut' && cmp -s '$T/c0.cut' '$T/c2.cut' && cmp -s '$T/c0/adapter_model.safetensors' '$T/c2/adapter_model.safetensors'"
check "--offload-base 0.6 of 5 layers: 3 layers off-loaded, bytes copied in are reported" sh -c \
	"grep -q 'off-loaded (3 layers)' '$T/c2.err' && grep -q 'MiB copied in from host memory' '$T/c2.err'"
llm-quantize -q "$S" "$T/s8"
$FT -m "$T/s8" $CMP --steps 12 -o "$T/c8" --log "$T/c8.csv"
# FP8 E4M3 with 128x128 block scales moves each weight by up to ~6% (3
# mantissa bits); measured on this model and data the per-step loss differs
# by at most 2.2% (1.1% at lr 1e-3). Tolerance: 5% at every step.
check "FP8 base vs F32 base: loss curves agree within 5% at every step" python3 -c "
import csv
a = [float(r['loss']) for r in csv.DictReader(open('$T/c0.csv'))]
b = [float(r['loss']) for r in csv.DictReader(open('$T/c8.csv'))]
d = max(abs(x - y) / x for x, y in zip(a, b))
print('# worst relative difference %.4f' % d)
assert len(a) == len(b) == 12 and d <= 0.05
"

# SIGKILL mid-run, --resume: the same adapter as an uninterrupted run (it is
# stopped as soon as its log has 40 of its 150 steps, however long those
# take on this machine: the wait is bounded at 120 s)
RS="$TR --steps 150 --micro-batch 1 --targets q,v"
$FT -m "$S" $RS -o "$T/u"
$FT -m "$S" $RS -o "$T/k" --save-every 1 --log "$T/k.csv" & pid=$!
logged() { [ -f "$T/k.csv" ] && [ "$(wc -l <"$T/k.csv")" -ge 40 ]; }
wait_until 120 logged
kill -STOP $pid 2>/dev/null; kill -9 $pid 2>/dev/null; wait $pid 2>/dev/null
killed_at=$(($(wc -l <"$T/k.csv") - 1))
if [ -e "$T/k/adapter_model.safetensors" ]; then
	notok "SIGKILL mid-run: the run had already finished (make it longer)"
else
	ok "SIGKILL at step $killed_at of 150 leaves no adapter, a training state ($(test -f "$T/k/training_state.bin" && echo present || echo missing))"
fi
cp -r "$T/k" "$T/k2"
check_fails "--resume with other options is refused" 1 $FT -m "$S" $RS --lr 1e-3 -o "$T/k2" --resume
check "the message says to resume with the same options" grep -q "other options" "$T/err"
check_fails "--resume without a saved state is refused" 1 $FT -m "$S" $RS -o "$T/k4" --resume
# a state temporary of a killed save (its process gone) in the directory:
# the resumed run removes it, the finished adapter directory holds none
sh -c 'exit 0' & dead=$!; wait $dead
echo partial >"$T/k/training_state.bin.tmp.$dead"
$FT -m "$S" $RS -o "$T/k" --save-every 1 --log "$T/k.csv" --resume
check "--resume removes a dead process's training_state.bin.tmp.PID" test ! -e "$T/k/training_state.bin.tmp.$dead"
check "the finished adapter directory holds no temporary" sh -c "! ls '$T/k' | grep -q '\.tmp\.'"
check "--resume ends with the uninterrupted run's adapter, byte for byte" cmp -s "$T/u/adapter_model.safetensors" "$T/k/adapter_model.safetensors"
check "the resumed log has each step once" sh -c "[ \$(cut -d, -f1 '$T/k.csv' | sort -u | wc -l) = 151 ] && [ \$(wc -l <'$T/k.csv') = 151 ]"
# bad data: the line is named, or --skip-bad counts it
printf '%s\n' '{"instruction": "Say hi.", "output": "Hi."}' '{"instruction": "Oops", "output": ' >"$T/bad1.jsonl"
check_fails "malformed JSON: exit 1, one line" 1 $FT -m "$S" --data "$T/bad1.jsonl" -o "$T/b1" -q
check "the error names the file and line 2" grep -q "bad1.jsonl:2: not JSON" "$T/err"
printf '%s\n' '{"instruction": "Say hi.", "output": "Hi."}' '' '{"instruction": "Say nothing.", "output": ""}' >"$T/bad2.jsonl"
check_fails "an empty completion: exit 1" 1 $FT -m "$S" --data "$T/bad2.jsonl" -o "$T/b2" -q
check "the error names line 3 and says empty completion" grep -q "bad2.jsonl:3: empty completion" "$T/err"
check_fails "a sample longer than --seq-len: exit 1" 1 $FT -m "$S" --data $D/train.jsonl --seq-len 8 -o "$T/b3" -q
check "the error names line 1 and the length" grep -q "train.jsonl:1: sample of [0-9]* tokens is longer than --seq-len 8" "$T/err"
cat "$T/bad1.jsonl" "$T/bad2.jsonl" $D/train.jsonl >"$T/bad3.jsonl"
$FT -m "$S" --data "$T/bad3.jsonl" --skip-bad --steps 2 --seq-len 64 -o "$T/b4" 2>"$T/skip.err"
check "--skip-bad trains on the good lines and names each skipped one" sh -c \
	"test -f '$T/b4/adapter_model.safetensors' && grep -q 'bad3.jsonl:2: not JSON' '$T/skip.err' && grep -q 'bad3.jsonl:5: empty completion' '$T/skip.err' && grep -q '2 bad lines skipped' '$T/skip.err'"

# chat format through a chat template
$FT -m "$S" --data $D/chat.jsonl --chat-template $D/chat_template.jinja --steps 3 --seq-len 128 -o "$T/ch" --log "$T/ch.csv" -q
check "chat-format data trains through --chat-template" sh -c "test -f '$T/ch/adapter_model.safetensors' && [ \$(wc -l <'$T/ch.csv') = 4 ]"
check_fails "chat-format data without a chat template: exit 1" 1 $FT -m "$S" --data $D/chat.jsonl --steps 1 -o "$T/ch2" -q
check "the error names line 1 and asks for --chat-template" grep -q "chat.jsonl:1: .*--chat-template" "$T/err"
tap_done
