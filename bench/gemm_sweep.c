/* bench/gemm_sweep.c: regenerate kernels/tune_table.h on the GPU at hand.
 *
 *   make && cc -std=c11 -O2 -iquote common -Ikernels -I/usr/local/cuda/include \
 *      -DLLM_CUDA bench/gemm_sweep.c build/cuda/libllm.a -o build/gemm_sweep \
 *      -ljansson -lpcre2-8 -lutf8proc -lmicrohttpd -lm -pthread \
 *      -L/usr/local/cuda/lib64 -lcudart -lcublas -lstdc++ $(mpicc --showme:link)
 *   build/gemm_sweep > kernels/tune_table.h.new && mv kernels/tune_table.h.new kernels/tune_table.h
 *
 * Then rebuild, rerun tests/test_cuda (the batch-invariance check covers
 * the new table) and commit the table with the device it was measured on. */
#include <stdio.h>
#include "llm_cuda.h"

int main(void)
{
	struct llm_gemm_bench_opts o = { 0 };
	o.cfg = -1;
	if (llm_cuda_gemm_sweep(&o, stdout) != LLM_OK) {
		fprintf(stderr, "gemm_sweep: %s\n", llm_errmsg());
		return 1;
	}
	return 0;
}
