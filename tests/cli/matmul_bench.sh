# tests/cli/matmul_bench.sh: bench/matmul_bench (built beside the tools)
# prints a row a token count whose first token's outputs do not depend on
# how many tokens ran with it: the kernels' batch invariance, on odd shapes
# and every scale layout, at this machine's best CPU level and at AVX2.
# Timings are printed, never checked.
. tests/lib/tap.sh
T=$TMPD
MB=$(dirname "$LLM_TESTBIN")/bench/matmul_bench
check_fails "matmul_bench: an unknown option is a usage error" 2 "$MB" --frob 1
check_fails "matmul_bench: a bad --dtype is a usage error" 2 "$MB" --dtype f16
check_fails "matmul_bench: a bad token list is a usage error" 2 "$MB" --tokens 1,x
TOK=1,2,3,4,5,6,7,8,9,16,33
# same ISA ARGS...: one run at CPU level ISA ("": the best), a row a token
# count, one token-0 sum
same() {
	local isa=$1 out=$T/out.$RANDOM
	shift
	LLM_CPU_ISA=$isa "$MB" --tokens $TOK --reps 1 "$@" >"$out" || return 1
	sed 's/^/#   /' "$out"
	[ "$(grep -vc '^#\|^tokens' "$out")" = 11 ] || return 1
	[ "$(grep -v '^#\|^tokens' "$out" | awk '{print $NF}' | sort -u | wc -l)" = 1 ]
}
for isa in "" avx2; do
	at=${isa:-best}
	check "matmul_bench E4M3 130x300 128x128 blocks ($at): 1 to 33 tokens, one token-0 sum" \
		same "$isa" --rows 130 --cols 300
	check "matmul_bench E4M3 130x300 a scale a row ($at): 1 to 33 tokens, one token-0 sum" \
		same "$isa" --rows 130 --cols 300 --block 1x300
	check "matmul_bench E4M3 67x256 3x64 blocks ($at): 1 to 33 tokens, one token-0 sum" \
		same "$isa" --rows 67 --cols 256 --block 3x64
	check "matmul_bench BF16 130x300 ($at): 1 to 33 tokens, one token-0 sum" \
		same "$isa" --dtype bf16 --rows 130 --cols 300
done
tap_done
