/* kernels/swiglu.cu: the CUDA swiglu op, out = silu(gate) * up on f32
 * rows with a row stride.
 *
 * Reference: cpu_swiglu in common/engine/backend_cpu.c: SiLU g / (1 + expf(-g))
 * (CUDA expf within 2 ulp), then times up. */
#include "cuda_device.h"

__global__ void swiglu_f32_kernel(float *out, int64_t os, const float *gate, int64_t gs,
                                  const float *up, int64_t us, int64_t rows, int64_t cols)
{
	int64_t n = rows * cols;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / cols, c = i % cols;
		float v = gate[t * gs + c];
		v *= 1.0f / (1.0f + expf(-v));
		out[t * os + c] = v * up[t * us + c];
	}
}

extern "C" cudaError_t llm_cuda_swiglu(float *out, int64_t os, const float *gate, int64_t gs,
                                       const float *up, int64_t us, int64_t rows, int64_t cols,
                                       cudaStream_t stream)
{
	if (rows * cols < 1)
		return cudaSuccess;
	swiglu_f32_kernel<<<llm_grid_1d(rows * cols, 256), 256, 0, stream>>>(out, os, gate, gs, up, us, rows, cols);
	return cudaGetLastError();
}
