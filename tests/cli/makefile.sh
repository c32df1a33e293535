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
tap_done
