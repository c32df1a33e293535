/* tests/fuzz/fuzz_reasoning.c: libFuzzer harness for the reasoning split
 * (common/text/reasoning.c), which llm-serve runs on every chat answer of
 * a model whose template reasons, whole and at every streamed token. Byte
 * 0 bit 0: the prompt left the block open; the rest is the answer.
 *
 * Invariants: the pieces lie in the text in order (reasoning before
 * content); the reasoning holds no whole </think>; and the split of every
 * prefix, as a stream makes it, gives a reasoning and a content that are
 * prefixes of the whole answer's, at the same offsets, so the streamed
 * deltas add up to the final message. Never a crash or a read out of
 * bounds.
 *   make fuzz && build/fuzz/fuzz_reasoning -max_total_time=300 /tmp/frs tests/data/fuzz-reasoning */
#include <stdlib.h>
#include <string.h>
#include "llm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void check_split(const char *t, size_t n, const struct llm_reasoning_split *s)
{
	if (s->r_begin > s->r_end || s->r_end > n || s->c_begin > s->c_end || s->c_end > n)
		__builtin_trap();
	if (s->r_end > s->r_begin && s->c_end > s->c_begin && s->r_end > s->c_begin)
		__builtin_trap();
	for (size_t i = s->r_begin; i + 8 <= s->r_end; i++)
		if (!memcmp(t + i, "</think>", 8))
			__builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 2048)
		return 0;
	int open = data[0] & 1;
	size_t n = size - 1;
	char *t = malloc(n + 1);   /* exactly the answer's bytes (+ NUL for the prompt check) */
	if (!t)
		return 0;
	memcpy(t, data + 1, n);
	t[n] = 0;
	(void)llm_reasoning_of(t);
	(void)llm_reasoning_prompt_open(t, n);
	struct llm_reasoning_split whole, p;
	llm_reasoning_split(t, n, open, 1, &whole);
	check_split(t, n, &whole);
	for (size_t k = 0; k <= n; k++) {
		llm_reasoning_split(t, k, open, 0, &p);
		check_split(t, k, &p);
		if (p.r_end > p.r_begin && (p.r_begin != whole.r_begin || p.r_end > whole.r_end))
			__builtin_trap();
		if (p.c_end > p.c_begin && (p.c_begin != whole.c_begin || p.c_end > whole.c_end))
			__builtin_trap();
	}
	free(t);
	return 0;
}
