# tests/cli/makefile.sh: the README's "Preparing a model with make" example,
# run for real: make quantizes every model, a second make does nothing, and
# an interrupted conversion leaves no target, so make redoes it.
. tests/lib/tap.sh
T=$TMPD
mkdir -p "$T/hf"
llm-quantize -q --random configs/tiny-check.json --seed 1 "$T/hf/tiny-a"
llm-quantize -q --random tests/data/kill-test.json --seed 2 "$T/hf/big"
# the Makefile exactly as README.md shows it
sed -n '/^# models.mk/,/^```$/p' README.md | sed '$d' >"$T/models.mk"
check "README's models.mk extracted" grep -q 'llm-quantize --force' "$T/models.mk"
(cd "$T" && PATH="$LLM_BIN:$PATH" make -s -f models.mk fp8/tiny-a >/dev/null 2>&1)
check "make builds fp8/tiny-a" test -f "$T/fp8/tiny-a/model.safetensors"
out=$(cd "$T" && PATH="$LLM_BIN:$PATH" make -f models.mk fp8/tiny-a 2>&1)
check "a second make has nothing to do" sh -c "echo '$out' | grep -q 'up to date\|Nothing to be done'"
# interrupt the big conversion: no target may remain, and make redoes it.
# It is killed as soon as its temporary output exists (the wait is bounded at
# 60 s, for a loaded machine), and only the llm-quantize under this make.
(cd "$T" && PATH="$LLM_BIN:$PATH" exec make -s -f models.mk fp8/big >/dev/null 2>&1) & mk=$!
writing() { ls -d "$T"/fp8/big.tmp.* >/dev/null 2>&1; }
wait_until 60 writing
q=$(pgrep -P $mk -x llm-quantize || for c in $(pgrep -P $mk); do pgrep -P "$c" -x llm-quantize; done)
[ -n "$q" ] && kill -KILL $q; wait $mk 2>/dev/null
check "an interrupted conversion leaves no fp8/big" test ! -e "$T/fp8/big"
(cd "$T" && PATH="$LLM_BIN:$PATH" make -s -f models.mk fp8/big >/dev/null 2>&1)
check "the next make converts it" test -f "$T/fp8/big/model.safetensors"


# make demo's chain (tools/demo.sh), on the real model and on the random
# checkpoint it makes when the model is absent
if [ -f "${LLM_TEST_MODELS:-../shared/models}/stories260K/config.json" ]; then
	out=$(DEMO_DIR="$T/demo" tools/demo.sh 2>&1); rc=$?
	check "the demo runs to its end" sh -c "[ $rc = 0 ] && echo \"\$1\" | grep -q '^demo: done'" _ "$out"
	check "the demo generates text from its FP8 checkpoint" sh -c "echo \"\$1\" | grep -q '^Once upon a time, there was'" _ "$out"
	check "the demo's completion came back from llm-serve" sh -c "echo \"\$1\" | grep -q '\"object\":\"text_completion\"'" _ "$out"
else
	skip "the demo on stories260K" "no ${LLM_TEST_MODELS:-../shared/models}/stories260K"
fi
out=$(LLM_TEST_MODELS="$T/none" DEMO_DIR="$T/demo-random" tools/demo.sh 2>&1); rc=$?
check "without the model the demo says so and runs on a random checkpoint" sh -c "[ $rc = 0 ] && echo \"\$1\" | grep -q 'random-weight checkpoint instead' && echo \"\$1\" | grep -q '^demo: done'" _ "$out"

# the build trees: CUDA=0 and CUDA=1 apart, and nothing left to compile
# after the build make test made (skipped for make asan's own tree). The
# make under test is a fresh one, not a job of the make running the suite.
mk() { env -u MAKEFLAGS -u MAKELEVEL -u MFLAGS -u MAKEOVERRIDES -u B -u BIN -u CUDA -u CC -u CFLAGS -u LDFLAGS make --no-print-directory "$@"; }
b0=$(mk -s --eval='print-B: ; @echo $(B)' print-B CUDA=0 | tail -n 1)
b1=$(mk -s --eval='print-B: ; @echo $(B)' print-B CUDA=1 | tail -n 1)
check "CUDA=0 and CUDA=1 have their own build trees ($b0, $b1)" test "$b0" = build/cpu -a "$b1" = build/cuda
cfg=$(basename "$(dirname "$(readlink -f "$LLM_BIN")")")
case $cfg in
cpu|cuda)
	cuda=0; [ "$cfg" = cuda ] && cuda=1
	out=$(mk CUDA=$cuda all 2>&1)
	check "after the build, make CUDA=$cuda compiles and links nothing" sh -c \
		"! echo \"\$1\" | grep -qE '^(cc|gcc|clang|ar|[^ ]*nvcc) '" _ "$out" ;;
*) skip "nothing to rebuild" "$LLM_BIN is not a default build tree" ;;
esac
tap_done
