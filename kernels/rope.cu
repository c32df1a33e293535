/* kernels/rope.cu: the CUDA rope op, in place on f32 rows with a row
 * stride (HF rotate_half pairs).
 *
 * Reference: cpu_rope in common/engine/backend_cpu.c: the angle pos * inv_freq in
 * f32, then cosf/sinf (CUDA's are within 2 ulp, glibc's within 1), then
 * the same rounded products and sums (rope_pair, cuda_device.h). The
 * fused rope_store (attn_paged.cu) rotates with the same function. */
#include "cuda_device.h"

/* One thread per (token, head, pair j). */
__global__ void rope_f32_kernel(float *x, int64_t xs, int64_t rows, const int32_t *pos,
                                int n_head, int d_head, const float *inv_freq)
{
	int half = d_head / 2;
	int64_t n = rows * n_head * half;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / ((int64_t)n_head * half);
		int rem = (int)(i % ((int64_t)n_head * half));
		int h = rem / half, j = rem % half;
		rope_pair(x + t * xs + (int64_t)h * d_head, j, half, pos[t], inv_freq);
	}
}

extern "C" cudaError_t llm_cuda_rope(float *x, int64_t xs, int64_t rows, const int32_t *pos,
                                     int n_head, int d_head, const float *inv_freq, cudaStream_t stream)
{
	int64_t n = rows * n_head * (d_head / 2);
	if (n < 1)
		return cudaSuccess;
	rope_f32_kernel<<<llm_grid_1d(n, 256), 256, 0, stream>>>(x, xs, rows, pos, n_head, d_head, inv_freq);
	return cudaGetLastError();
}
