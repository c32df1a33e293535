/* kernels/embed.cu: the CUDA embed op, out row i = row tok[i] of the
 * embedding (any dtype, dequantized to f32). Reference: cpu_embed in
 * common/engine/backend_cpu.c; exact (the same f32 element as the CPU's). */
#include "cuda_device.h"

__global__ void embed_f32_kernel(float *out, int64_t os, const int32_t *tok, int64_t rows,
                                 struct llm_cuda_mat emb)
{
	int64_t n = rows * emb.cols;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t t = i / emb.cols, c = i % emb.cols;
		out[t * os + c] = weight_at(emb, tok[t], c);
	}
}

extern "C" cudaError_t llm_cuda_embed(float *out, int64_t os, const int32_t *tok, int64_t rows,
                                      const struct llm_cuda_mat *emb, cudaStream_t stream)
{
	if (rows * emb->cols < 1)
		return cudaSuccess;
	embed_f32_kernel<<<llm_grid_1d(rows * emb->cols, 256), 256, 0, stream>>>(out, os, tok, rows, *emb);
	return cudaGetLastError();
}
