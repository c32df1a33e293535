/* common/engine/cpu_simd.h: what the CPU kernel files (cpu_matmul.c,
 * cpu_attention.c) share: the target attributes of their AVX2 and AVX-512
 * levels and the forced-inline marker. A function marked T256 or T512 is
 * only called after the caller's ISA check (llm_cpu_isa >= LLM_ISA_AVX2 or
 * LLM_ISA_AVX512, from __builtin_cpu_supports), so the binary still runs on
 * any x86-64. Not a public header. */
#ifndef LLM_CPU_SIMD_H
#define LLM_CPU_SIMD_H

#define T256 __attribute__((target("avx2,fma,f16c")))
#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INL inline __attribute__((always_inline))

#endif
