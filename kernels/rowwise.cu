/* kernels/rowwise.cu: the row-wise ops of the CUDA backend: RMSNorm (and
 * RMSNorm fused with the residual add), RoPE, SiLU x up, add, gather,
 * embedding lookup. All on f32 rows with a row stride, as struct llm_view.
 *
 * Reference: common/backend_cpu.c (cpu_rmsnorm, cpu_rope, cpu_swiglu,
 * cpu_add, cpu_gather, cpu_embed), with llama2.c run.c's numerics:
 * RMSNorm w * (x * (1 / sqrtf(mean(x^2) + eps))) (IEEE sqrt and division:
 * nvcc's defaults -prec-sqrt=true -prec-div=true; only the order of the sum
 * of squares differs, a tree here); RoPE angle pos * inv_freq in f32, then
 * cosf/sinf (CUDA's are within 2 ulp, glibc's within 1); SiLU g / (1 +
 * expf(-g)) (CUDA expf within 2 ulp). add, gather and embed are exact. */
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
		float a = (float)pos[t] * inv_freq[j];
		float c = cosf(a), s = sinf(a);
		float *p = x + t * xs + (int64_t)h * d_head;
		float v0 = p[j], v1 = p[j + half];
		p[j] = v0 * c - v1 * s;
		p[j + half] = v0 * s + v1 * c;
	}
}

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

__global__ void add_f32_kernel(float *x, int64_t xs, const float *y, int64_t ys, int64_t rows, int64_t cols)
{
	int64_t n = rows * cols;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / cols, c = i % cols;
		x[t * xs + c] += y[t * ys + c];
	}
}

__global__ void gather_f32_kernel(float *out, int64_t os, const float *x, int64_t xs,
                                  const int32_t *idx, int64_t rows, int64_t cols)
{
	int64_t n = rows * cols;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / cols, c = i % cols;
		out[t * os + c] = x[(int64_t)idx[t] * xs + c];
	}
}

__global__ void embed_f32_kernel(float *out, int64_t os, const int32_t *tok, int64_t rows,
                                 struct llm_cuda_mat emb)
{
	int64_t n = rows * emb.cols;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / emb.cols, c = i % emb.cols;
		out[t * os + c] = weight_at(emb, tok[t], c);
	}
}

/* ---- launchers ----------------------------------------------------------- */

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

extern "C" cudaError_t llm_cuda_rope(float *x, int64_t xs, int64_t rows, const int32_t *pos,
                                     int n_head, int d_head, const float *inv_freq, cudaStream_t stream)
{
	int64_t n = rows * n_head * (d_head / 2);
	if (n < 1)
		return cudaSuccess;
	rope_f32_kernel<<<llm_grid_1d(n, 256), 256, 0, stream>>>(x, xs, rows, pos, n_head, d_head, inv_freq);
	return cudaGetLastError();
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

extern "C" cudaError_t llm_cuda_add(float *x, int64_t xs, const float *y, int64_t ys, int64_t rows,
                                    int64_t cols, cudaStream_t stream)
{
	if (rows * cols < 1)
		return cudaSuccess;
	add_f32_kernel<<<llm_grid_1d(rows * cols, 256), 256, 0, stream>>>(x, xs, y, ys, rows, cols);
	return cudaGetLastError();
}

extern "C" cudaError_t llm_cuda_gather(float *out, int64_t os, const float *x, int64_t xs,
                                       const int32_t *idx, int64_t rows, int64_t cols, cudaStream_t stream)
{
	if (rows * cols < 1)
		return cudaSuccess;
	gather_f32_kernel<<<llm_grid_1d(rows * cols, 256), 256, 0, stream>>>(out, os, x, xs, idx, rows, cols);
	return cudaGetLastError();
}

extern "C" cudaError_t llm_cuda_embed(float *out, int64_t os, const int32_t *tok, int64_t rows,
                                      const struct llm_cuda_mat *emb, cudaStream_t stream)
{
	if (rows * emb->cols < 1)
		return cudaSuccess;
	embed_f32_kernel<<<llm_grid_1d(rows * emb->cols, 256), 256, 0, stream>>>(out, os, tok, rows, *emb);
	return cudaGetLastError();
}
