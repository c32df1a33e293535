/* kernels/gather.cu: the CUDA gather op, out row i = x row idx[i], on f32
 * rows with a row stride. Reference: cpu_gather in common/engine/backend_cpu.c;
 * exact. */
#include "cuda_device.h"

__global__ void gather_f32_kernel(float *out, int64_t os, const float *x, int64_t xs,
                                  const int32_t *idx, int64_t rows, int64_t cols)
{
	int64_t n = rows * cols;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / cols, c = i % cols;
		out[t * os + c] = x[(int64_t)idx[t] * xs + c];
	}
}

extern "C" cudaError_t llm_cuda_gather(float *out, int64_t os, const float *x, int64_t xs,
                                       const int32_t *idx, int64_t rows, int64_t cols, cudaStream_t stream)
{
	if (rows * cols < 1)
		return cudaSuccess;
	gather_f32_kernel<<<llm_grid_1d(rows * cols, 256), 256, 0, stream>>>(out, os, x, xs, idx, rows, cols);
	return cudaGetLastError();
}
