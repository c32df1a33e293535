/* kernels/add.cu: the CUDA add op, x += y on f32 rows with a row stride.
 * Reference: cpu_add in common/engine/backend_cpu.c; exact. */
#include "cuda_device.h"

__global__ void add_f32_kernel(float *x, int64_t xs, const float *y, int64_t ys, int64_t rows, int64_t cols)
{
	int64_t n = rows * cols;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / cols, c = i % cols;
		x[t * xs + c] += y[t * ys + c];
	}
}

extern "C" cudaError_t llm_cuda_add(float *x, int64_t xs, const float *y, int64_t ys, int64_t rows,
                                    int64_t cols, cudaStream_t stream)
{
	if (rows * cols < 1)
		return cudaSuccess;
	add_f32_kernel<<<llm_grid_1d(rows * cols, 256), 256, 0, stream>>>(x, xs, y, ys, rows, cols);
	return cudaGetLastError();
}
