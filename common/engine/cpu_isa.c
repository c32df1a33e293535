/* common/engine/cpu_isa.c: the CPU's instruction-set levels (scalar, AVX2,
 * AVX-512, AVX-512 BF16): their names, the best this CPU runs, and the cap
 * $LLM_CPU_ISA sets. Declared in backend.h; the CPU backend, the trainer and
 * the benchmarks call it, and it calls nothing of theirs. */
#include "backend.h"

#include <stdlib.h>
#include <string.h>

#include "banned.h"

static const char *isa_names[LLM_ISA_COUNT] = {
	[LLM_ISA_SCALAR] = "scalar", [LLM_ISA_AVX2] = "avx2",
	[LLM_ISA_AVX512] = "avx512", [LLM_ISA_AVX512BF16] = "avx512bf16",
};

const char *llm_cpu_isa_name(enum llm_cpu_isa isa)
{
	if (isa == LLM_ISA_AUTO)
		return "auto";
	return (unsigned)isa < LLM_ISA_COUNT ? isa_names[isa] : "?";
}

int llm_cpu_isa_parse(const char *s)
{
	if (!strcmp(s, "auto"))
		return LLM_ISA_AUTO;
	for (int i = 0; i < LLM_ISA_COUNT; i++)
		if (!strcmp(s, isa_names[i]))
			return i;
	return -2;
}

enum llm_cpu_isa llm_cpu_isa_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_cpu_init();
	int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	/* F16C has no __builtin_cpu_supports name in gcc 12: every AVX2 CPU has it */
	int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
	             && __builtin_cpu_supports("avx512vl");
	if (avx512 && __builtin_cpu_supports("avx512bf16"))
		return LLM_ISA_AVX512BF16;
	if (avx512)
		return LLM_ISA_AVX512;
	if (avx2)
		return LLM_ISA_AVX2;
#endif
	return LLM_ISA_SCALAR;
}

enum llm_cpu_isa llm_cpu_isa_capped(int *bad)
{
	enum llm_cpu_isa isa = llm_cpu_isa_detect();
	const char *env = getenv("LLM_CPU_ISA");
	int v = env && *env ? llm_cpu_isa_parse(env) : LLM_ISA_AUTO;
	if (bad)
		*bad = v == -2;
	if (v >= 0 && v < (int)isa)
		isa = (enum llm_cpu_isa)v;
	return isa;
}
