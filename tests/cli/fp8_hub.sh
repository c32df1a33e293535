# tests/cli/fp8_hub.sh: FP8 checkpoints as the Hub has them, written by
# tests/cli/fp8_hub_make.py from one set of random weights with their F32
# reference (the same weights dequantized, exact): compressed-tensors per
# tensor and per channel with static input_scale, Meta's fbgemm_fp8 (per-row
# weight_scale, some linears left BF16), and the fp8 block layout with BF16
# and with F32 scales. Each: llm-quantize --dequantize gives exactly the
# reference's values; llm-generate gives the reference's greedy ids (the
# lm_head as stored on both, and quantized at load on both); the layouts
# the peers load pass tests/lib/peer_fp8.py, so the fixtures are what they
# claim to be.
. tests/lib/tap.sh
Q=llm-quantize
T=$TMPD
PY=/usr/bin/python3
MAKE="$PY tests/cli/fp8_hub_make.py"
if ! $PY -c 'import numpy' 2>/dev/null; then
	skip "FP8 layouts of the Hub" "no numpy for /usr/bin/python3 (apt-get install python3-numpy)"
	tap_done
fi
if ! have_stories; then
	skip "FP8 layouts of the Hub" "no stories260K (its tokenizer) in \$LLM_TEST_MODELS"
	tap_done
fi
$Q -q --random configs/tiny-check.json --dtype f32 --seed 6 --tokenizer "$(stories)" "$T/src"
printf 'Once upon a time\nThe little dog\nLily and Ben went\n"Look!" said\n' >"$T/prompts"
# At the avx512bf16 level the FP8 and BF16 matmuls take BF16 activations
# (an F32 weight keeps F32 ones), so greedy ids are held to the F32
# reference at avx512 and below, where an E4M3 weight is code x scale in F32
# beside F32 activations: the same weights, the same arithmetic.
export LLM_CPU_ISA=avx512
ids() { local d=$1; shift; llm-generate -t 1 -m "$d" --json --temp 0 -n 16 --ignore-eos --logprobs 1 "$@" <"$T/prompts" 2>"$T/gerr" |
	python3 -c "import json,sys; [print(json.dumps([o['ids'], o['logprobs']])) for o in map(json.loads, sys.stdin)]"; }
# same A B: four prompts, the same ids, log-probs within 1e-4 (F32)
same() { python3 -c "
import json, sys
a = [json.loads(l) for l in open('$1')]; b = [json.loads(l) for l in open('$2')]
assert len(a) == 4 and [x[0] for x in a] == [x[0] for x in b], (a, b)
d = max(abs(p - q) for x, y in zip(a, b) for p, q in zip(x[1], y[1]))
assert d <= 1e-4, d
"; }
for L in ct-tensor ct-channel fbgemm block-bf16 block-f32; do
	F=$T/$L R=$T/$L-ref
	if ! $MAKE $L "$T/src" "$F" "$R" 2>"$T/err"; then notok "fp8_hub_make.py $L: $(tail -1 "$T/err")"; continue; fi
	case $L in fbgemm) ;; *)
		check "$L: the fixture is what the peers load" sh -c "python3 tests/lib/peer_fp8.py '$F' >/dev/null" ;;
	esac
	$Q -q --dequantize --dtype f32 "$F" "$T/$L-deq"
	check "$L: llm-quantize --dequantize gives the reference's values exactly" $MAKE --compare "$T/$L-deq" "$R"
	ids "$F" --lm-head file >"$T/f.ids"; ids "$R" --lm-head file >"$T/r.ids"
	check "$L: the greedy ids of the reference, log-probs within 1e-4 (the lm_head BF16 on both)" same "$T/f.ids" "$T/r.ids"
	ids "$F" >"$T/f.ids"; ids "$R" --lm-head fp8 >"$T/r.ids"
	check "$L: the greedy ids of the reference, log-probs within 1e-4 (the lm_head FP8 at load on both: auto on the FP8 file)" same "$T/f.ids" "$T/r.ids"
done
# the fixtures differ where they should: a scale read at the wrong place
# would still pass if every scale were equal
check "the fixtures' scales differ from row to row and block to block" $PY -c "
import sys; sys.path.insert(0, 'tests/cli')
import fp8_hub_make as h
t, _ = h.read('$T/block-f32/model.safetensors')
s = h.value(*t['model.layers.0.mlp.down_proj.weight_scale_inv'])
assert s.shape == (1, 3) and len(set(s.ravel())) == 3, s
c, _ = h.read('$T/ct-channel/model.safetensors')
r = h.value(*c['model.layers.0.mlp.up_proj.weight_scale'])
assert r.shape == (352, 1) and len(set(r.ravel())) > 3, r
f, _ = h.read('$T/fbgemm/model.safetensors')
assert f['model.layers.0.self_attn.q_proj.weight'][0] == 'BF16' and f['model.layers.1.self_attn.q_proj.weight'][0] == 'F8_E4M3'
"
tap_done
