# tests/cli/fp8_peers.sh: llm-quantize's FP8 output read as the peers'
# loaders read it (tests/lib/peer_fp8.py: transformers' and vLLM's "fp8"
# block method, compressed-tensors): the default and every kind of --block
# (128x128, row groups, odd blocks with partial edges, per channel) from a
# BF16 checkpoint and from --random, tied and untied; --exclude listed as
# left plain; --fp8-vocab (and an --include naming lm_head) marked as ours
# alone and refused by the check, yet loaded by llm-generate. Then the
# engine's --lm-head: fp8 at load gives the bits of a file whose lm_head is
# FP8, auto is fp8 on an FP8 model and file on a plain one.
. tests/lib/tap.sh
Q=llm-quantize
T=$TMPD
P="python3 tests/lib/peer_fp8.py"

untied=configs/tiny-check.json
sed -e 's/"tie_word_embeddings": false/"tie_word_embeddings": true/' $untied >"$T/tied.json"
grep -q '"tie_word_embeddings": true' "$T/tied.json" || notok "the tied config is tied"
$Q -q --random $untied --dtype bf16 --seed 3 "$T/u16" && $Q -q --random "$T/tied.json" --dtype bf16 --seed 3 "$T/t16"

# every kind of block llm-quantize accepts: the default, 128x128, row
# groups, blocks that leave partial edges (352 = 2.75 x 128), a block wider
# than a row, per channel
for b in default 128x128 1x128 64x32 3x5 128x512 1xK; do
	flag="--block $b"; [ $b = default ] && flag=
	for src in u16 t16; do
		$Q -q $flag "$T/$src" "$T/$src-$b" 2>"$T/err" || { notok "llm-quantize $flag $src: $(head -1 "$T/err")"; continue; }
		if $P "$T/$src-$b" >"$T/peer" 2>&1; then ok "$src ${flag:-(default)}: the peers load it ($(cut -d: -f3- "$T/peer"))"
		else notok "$src ${flag:-(default)}: the peers load it"; sed 's/^/#   /' "$T/peer" | head -5; fi
	done
	$Q -q --random "$T/tied.json" --dtype fp8 $flag --seed 3 "$T/r-$b"
	check "--random --dtype fp8 ${flag:-(default)}: the peers load it" sh -c "$P '$T/r-$b' >/dev/null"
	check "--random and quantizing the BF16 checkpoint write the same config.json (${flag:-default})" \
		cmp -s "$T/r-$b/config.json" "$T/t16-$b/config.json"
done
check "the default: fp8, e4m3, dynamic, [128, 128], lm_head left plain" python3 -c "
import json
q = json.load(open('$T/u16-default/config.json'))['quantization_config']
assert q == {'quant_method': 'fp8', 'fmt': 'e4m3', 'activation_scheme': 'dynamic',
             'weight_block_size': [128, 128], 'modules_to_not_convert': ['lm_head']}, q"
check "1xK: compressed-tensors, strategy channel, dynamic per-token activations, (d_out, 1) weight_scale" python3 -c "
import json, struct
q = json.load(open('$T/u16-1xK/config.json'))['quantization_config']
g = q['config_groups']['group_0']
assert q['quant_method'] == 'compressed-tensors' and q['format'] == 'float-quantized' and q['ignore'] == ['lm_head'], q
assert g['weights']['strategy'] == 'channel' and g['input_activations']['dynamic'] is True and g['targets'] == ['Linear'], g
f = open('$T/u16-1xK/model.safetensors', 'rb')
h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
assert h['model.layers.0.mlp.up_proj.weight_scale']['shape'] == [352, 1], h['model.layers.0.mlp.up_proj.weight_scale']
assert not [k for k in h if k.endswith('_scale_inv')]"
check "the embedding, lm_head and norms keep BF16" python3 -c "
import json, struct
f = open('$T/u16-default/model.safetensors', 'rb')
h = json.loads(f.read(struct.unpack('<Q', f.read(8))[0]))
for k in ('model.embed_tokens.weight', 'lm_head.weight', 'model.norm.weight', 'model.layers.1.input_layernorm.weight'):
    assert h[k]['dtype'] == 'BF16', (k, h[k])"

# --exclude: the linears left plain are listed, so the peers keep them plain
$Q -q --exclude 'layers[.]1[.]mlp' "$T/u16" "$T/ex"
check "--exclude: the excluded linears are in modules_to_not_convert, and the peers load it" sh -c "
	$P '$T/ex' >/dev/null && grep -q 'model.layers.1.mlp.down_proj' '$T/ex/config.json'"
$Q -q --block 1xK --exclude 'layers[.]0[.]self_attn[.]q' "$T/t16" "$T/exk"
check "--block 1xK --exclude: the excluded linear is in ignore, and the peers load it" sh -c "
	$P '$T/exk' >/dev/null && grep -q 'model.layers.0.self_attn.q_proj' '$T/exk/config.json'"

# FP8 embedding and lm_head: ours alone, marked, refused by the peer check
for v in "--fp8-vocab" "--include lm_head|proj[.]weight\$"; do
	$Q -q $v "$T/u16" "$T/v"
	$P "$T/v" >"$T/peer"; rc=$?
	check "$v: marked llm_tools_fp8_vocab, and the peer check refuses it naming the FP8 head" sh -c "
		[ $rc = 1 ] && grep -q 'llm_tools_fp8_vocab' '$T/peer' && grep -q 'lm_head.weight: F8_E4M3' '$T/peer'"
	rm -rf "$T/v"
done
$Q -q --fp8-vocab "$T/t16" "$T/tv"
check "--fp8-vocab on a tied model marks the embedding and the lm_head it is" python3 -c "
import json
q = json.load(open('$T/tv/config.json'))['quantization_config']
assert q['llm_tools_fp8_vocab'] == ['model.embed_tokens', 'lm_head'] and q['modules_to_not_convert'] == [], q"
$Q -q --dequantize "$T/tv" "$T/tvd"
check "--dequantize drops quantization_config, marks and all" sh -c "! grep -q 'quantization_config\|llm_tools' '$T/tvd/config.json'"

# the engine: --lm-head (needs a tokenizer: stories260K's, 512 tokens as tiny-check)
if ! have_stories; then
	skip "--lm-head on generated text" "no stories260K in \$LLM_TEST_MODELS"
	tap_done
fi
M=$(stories)
printf 'Once upon a time\nThe little dog\nLily and Ben went\n' >"$T/prompts"
gen() { local d=$1; shift; llm-generate -t 1 -m "$d" --json --temp 0 -n 12 --ignore-eos --logprobs 2 "$@" <"$T/prompts" 2>"$T/gerr" |
	python3 -c "import json,sys; [print(json.dumps([o['ids'], o.get('logprobs')])) for o in map(json.loads, sys.stdin)]"; }
$Q -q --random $untied --dtype bf16 --seed 4 --tokenizer "$M" "$T/g16"
$Q -q "$T/g16" "$T/g8"                                         # default: BF16 lm_head
$Q -q --include 'lm_head|proj[.]weight$' "$T/g16" "$T/g8h"      # the lm_head FP8 in the file
check_fails "--lm-head with a bad value is a usage error naming it" 2 llm-generate -m "$T/g8" --lm-head fp16 -p x
grep -q -- "--lm-head: 'fp16' is not auto, file or fp8" "$T/err" && ok "... the message names the flag and the value" ||
	notok "... the message names the flag and the value"
gen "$T/g8" --lm-head fp8 >"$T/o-fp8"
gen "$T/g8" --lm-head file >"$T/o-file"
gen "$T/g8" >"$T/o-auto"
gen "$T/g8h" --lm-head file >"$T/o-h"
gen "$T/g8h" --lm-head fp8 >"$T/o-hfp8"
check "--lm-head fp8: the head quantized at load gives the ids and log-probs of the file with an FP8 lm_head, bit for bit" \
	sh -c "[ -s '$T/o-fp8' ] && cmp -s '$T/o-fp8' '$T/o-h'"
check "--lm-head fp8 on a head that is FP8 already changes nothing" cmp -s "$T/o-h" "$T/o-hfp8"
check "--lm-head auto on the cpu backend, FP8 decoder: the head in FP8" cmp -s "$T/o-auto" "$T/o-fp8"
check "--lm-head file: the BF16 head gives other log-probs" sh -c "[ -s '$T/o-file' ] && ! cmp -s '$T/o-file' '$T/o-fp8'"
gen "$T/g16" >"$T/p-auto"
gen "$T/g16" --lm-head file >"$T/p-file"
check "--lm-head auto on a BF16 model keeps its head as stored" sh -c "[ -s '$T/p-auto' ] && cmp -s '$T/p-auto' '$T/p-file'"
wb() { llm-serve -m "$1" --plan "${@:2}" 2>/dev/null | python3 -c "import json,sys; print(json.load(sys.stdin)['weight_bytes'])"; }
a=$(wb "$T/g8") f=$(wb "$T/g8" --lm-head file)
check "--plan counts the head quantized at load: 512 x 128 codes and 512 scales in place of the BF16 head ($a, $f)" \
	sh -c "[ -n '$a' ] && [ -n '$f' ] && [ \$(($f - $a)) = \$((512 * 128 * 2 - 512 * 128 - 512 * 4)) ]"
$Q -q --fp8-vocab "$T/g16" "$T/g8v"
check "llm-generate loads the --fp8-vocab file (ours alone)" sh -c "llm-generate -t 1 -m '$T/g8v' -p 'Once' -n 4 --temp 0 >/dev/null 2>&1"
tap_done
