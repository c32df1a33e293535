/* bench/gemm_sweep.c: the fused FP8 GEMM on the GPU at hand, two ways:
 *
 *   build/cuda/bench/gemm_sweep [--iters N] > kernels/tune_table.h.new
 *       the offline tile sweep (llm_cuda_gemm_sweep, kernels/bench_gemm.c):
 *       a complete kernels/tune_table.h naming the device;
 *   build/cuda/bench/gemm_sweep --bench [--iters N]
 *       the FP8 GEMM against cuBLAS BF16 (llm_cuda_bench_gemm) on the Llama
 *       3.1 8B and 70B linear shapes, M = 1 .. 8192: one JSON object per
 *       (shape, M) on stdout, each with its #wrong count.
 *
 * Built by make in CUDA builds (make CUDA=1); bench/gpu.sh runs both. After
 * the sweep: move the new table over kernels/tune_table.h, rebuild, rerun
 * test_cuda (its batch-invariance check covers the new table) and commit the
 * table with the device it was measured on. Exit status: 0 ok, 1 a CUDA
 * error or no device, 2 usage. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llm.h"
#include "../kernels/llm_cuda.h"
#include "banned.h"

int main(int argc, char **argv)
{
	struct llm_gemm_bench_opts o = { 0 };
	int bench = 0;
	o.cfg = -1;
	for (int i = 1; i < argc; i++) {
		int64_t v;
		if (!strcmp(argv[i], "--bench"))
			bench = 1;
		else if (!strcmp(argv[i], "--iters") && i + 1 < argc && !llm_parse_int(argv[i + 1], 1, 100000, &v))
			o.iters = (int)v, i++;
		else {
			fprintf(stderr, "usage: gemm_sweep [--bench] [--iters N]\n");
			return 2;
		}
	}
	if (!bench) {
		if (llm_cuda_gemm_sweep(&o, stdout) != LLM_OK) {
			fprintf(stderr, "gemm_sweep: %s\n", llm_errmsg());
			return 1;
		}
		return 0;
	}
	struct llm_gemm_bench_row *r = NULL;
	size_t n = 0;
	char dev[300] = "";
	if (llm_cuda_bench_gemm(&o, &r, &n, dev, sizeof dev) != LLM_OK) {
		fprintf(stderr, "gemm_sweep: %s\n", llm_errmsg());
		return 1;
	}
	for (size_t i = 0; i < n; i++)
		printf("{\"device\": \"%s\", \"shape\": \"%s\", \"m\": %lld, \"n\": %lld, \"k\": %lld, \"cfg\": %d, "
		       "\"us_fp8\": %.3f, \"us_bf16\": %.3f, \"speedup\": %.4f, \"tflops_fp8\": %.3f, \"gbs_fp8\": %.1f, "
		       "\"wrong\": %lld}\n",
		       dev, r[i].shape, (long long)r[i].m, (long long)r[i].n, (long long)r[i].k, r[i].cfg, r[i].us_fp8,
		       r[i].us_bf16, r[i].speedup, r[i].tflops_fp8, r[i].gbs_fp8, (long long)r[i].n_wrong);
	free(r);
	return 0;
}
