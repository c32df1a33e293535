/* kernels/rmsnorm.cu: the CUDA rmsnorm and add_rmsnorm ops (RMSNorm, and
 * RMSNorm fused with the residual add), on f32 rows with a row stride, as
 * struct llm_view; the weight in any dtype.
 *
 * Reference: cpu_rmsnorm and cpu_add_rmsnorm in common/engine/backend_cpu.c, with
 * llama2.c run.c's numerics: w * (x * (1 / sqrtf(mean(x^2) + eps))) (IEEE
 * sqrt and division: nvcc's defaults -prec-sqrt=true -prec-div=true; only
 * the order of the sum of squares differs, a tree here). */
#include "cuda_device.h"

#define ROW_THREADS 256

/* Sum of V over the block (ROW_THREADS threads); every thread gets it. */
static __device__ float block_sum(float v)
{
	__shared__ float part[ROW_THREADS / 32];
	__shared__ float total;
	v = warp_sum(v);
	if ((threadIdx.x & 31) == 0)
		part[threadIdx.x >> 5] = v;
	__syncthreads();
	if (threadIdx.x < 32) {
		float s = threadIdx.x < ROW_THREADS / 32 ? part[threadIdx.x] : 0.0f;
		s = warp_sum(s);
		if (threadIdx.x == 0)
			total = s;
	}
	__syncthreads();
	return total;
}

/* One block per row. FUSED: x += y first (written back), then the norm. */
template <bool FUSED>
__global__ void __launch_bounds__(ROW_THREADS)
rmsnorm_f32_kernel(float *out, int64_t os, float *x, int64_t xs, const float *y, int64_t ys,
                   int64_t cols, struct llm_cuda_mat w, float eps)
{
	float *xr = x + (int64_t)blockIdx.x * xs;
	float *orow = out + (int64_t)blockIdx.x * os;
	float ss = 0.0f;
	for (int64_t i = threadIdx.x; i < cols; i += ROW_THREADS) {
		float v = xr[i];
		if (FUSED) {
			v += y[(int64_t)blockIdx.x * ys + i];
			xr[i] = v;
		}
		ss += v * v;
	}
	ss = block_sum(ss);
	ss /= (float)cols;
	ss += eps;
	ss = 1.0f / sqrtf(ss);
	/* each thread reads back only the elements it wrote: OUT may equal X */
	for (int64_t i = threadIdx.x; i < cols; i += ROW_THREADS)
		orow[i] = weight_at(w, 0, i) * (ss * xr[i]);
}

extern "C" cudaError_t llm_cuda_rmsnorm(float *out, int64_t os, const float *x, int64_t xs,
                                        int64_t rows, int64_t cols, const struct llm_cuda_mat *w,
                                        float eps, cudaStream_t stream)
{
	if (rows < 1 || rows > INT32_MAX)
		return rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
	rmsnorm_f32_kernel<false><<<(unsigned)rows, ROW_THREADS, 0, stream>>>(out, os, (float *)x, xs,
	                                                                     nullptr, 0, cols, *w, eps);
	return cudaGetLastError();
}

extern "C" cudaError_t llm_cuda_add_rmsnorm_f32(float *out, int64_t os, float *x, int64_t xs,
                                            const float *y, int64_t ys, int64_t rows, int64_t cols,
                                            const struct llm_cuda_mat *w, float eps, cudaStream_t stream)
{
	if (rows < 1 || rows > INT32_MAX)
		return rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
	rmsnorm_f32_kernel<true><<<(unsigned)rows, ROW_THREADS, 0, stream>>>(out, os, x, xs, y, ys, cols, *w, eps);
	return cudaGetLastError();
}
