/* bench/cpu_fma_peak.c: the f32 FMA peak of one core, the ceiling of the
 * matmul tiles that batched decode and prefill run on (bench/matmul_bench
 * reports their GFLOP/s; the share of this peak is the tiles' efficiency).
 *
 *   cpu_fma_peak [SECONDS]        (default 0.5 a measurement)
 *
 * Twelve independent chains of vfmadd231ps in registers (enough to cover
 * the FMA latency on every x86 core with two FMA pipes), 256-bit (AVX2+FMA)
 * and, where the CPU has AVX-512F, 512-bit; the best of 5 runs, thread CPU
 * time. One JSON line: GFLOP/s (2 flops an FMA lane) for each width.
 * Build: cc -O2 -o cpu_fma_peak bench/cpu_fma_peak.c (x86-64 only). */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double cpu_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

#define FMA(R, I) "vfmadd231ps %%" R "14, %%" R "15, %%" R I "\n\t"
#define FMA12(R)                                                                     \
	FMA(R, "0") FMA(R, "1") FMA(R, "2") FMA(R, "3") FMA(R, "4") FMA(R, "5")         \
	FMA(R, "6") FMA(R, "7") FMA(R, "8") FMA(R, "9") FMA(R, "10") FMA(R, "11")

/* N iterations of 12 FMAs of WIDTH bits; the registers start at zero, so
 * no value ever leaves the normal range (0 * 0 + 0). */
static void run256(long n)
{
	__asm__ volatile("vpxor %%xmm14, %%xmm14, %%xmm14\n\tvpxor %%xmm15, %%xmm15, %%xmm15\n\t"
	                 "1:\n\t" FMA12("ymm") "dec %0\n\tjnz 1b\n\tvzeroupper"
	                 : "+r"(n)
	                 :
	                 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
	                   "xmm10", "xmm11", "xmm14", "xmm15", "cc");
}

__attribute__((target("avx512f"))) static void run512(long n)
{
	__asm__ volatile("vpxord %%zmm14, %%zmm14, %%zmm14\n\tvpxord %%zmm15, %%zmm15, %%zmm15\n\t"
	                 "1:\n\t" FMA12("zmm") "dec %0\n\tjnz 1b\n\tvzeroupper"
	                 : "+r"(n)
	                 :
	                 : "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9",
	                   "xmm10", "xmm11", "xmm14", "xmm15", "cc");
}

/* GFLOP/s of FN: iterations sized to about SEC seconds, best of 5 */
static double peak(void (*fn)(long), int lanes, double sec)
{
	long n = 1000000;
	double t0 = cpu_s();
	fn(n);
	double dt = cpu_s() - t0;
	if (dt > 0)
		n = (long)((double)n * sec / dt) + 1;
	double best = 1e30;
	for (int r = 0; r < 5; r++) {
		t0 = cpu_s();
		fn(n);
		dt = cpu_s() - t0;
		best = dt < best ? dt : best;
	}
	return (double)n * 12.0 * lanes * 2.0 / best * 1e-9;
}

int main(int argc, char **argv)
{
	double sec = argc > 1 ? atof(argv[1]) : 0.5;
	if (!(sec > 0 && sec < 60)) {
		fprintf(stderr, "cpu_fma_peak: SECONDS %s is not in (0, 60)\n", argv[1]);
		return 2;
	}
	__builtin_cpu_init();
	if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) {
		fprintf(stderr, "cpu_fma_peak: this CPU has no AVX2 with FMA\n");
		return 1;
	}
	printf("{\"what\": \"fma_peak\", \"threads\": 1, \"avx2_gflops\": %.1f", peak(run256, 8, sec));
	if (__builtin_cpu_supports("avx512f"))
		printf(", \"avx512_gflops\": %.1f", peak(run512, 16, sec));
	printf("}\n");
	return 0;
}
