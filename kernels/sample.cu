/* kernels/sample.cu: greedy sampling on the GPU, so that only token ids
 * cross to the host.
 *
 * Reference: common/sampler.c with temperature 0: the repetition penalty
 * (logit / p when positive, logit * p when negative, for every id seen in
 * the prompt or output, as Hugging Face and vLLM), then argmax with ties to
 * the lowest id (as llama2.c run.c). Exact: comparisons and one multiply or
 * divide per penalized logit, the same operations as the CPU. */
#include "cuda_device.h"

#define ARGMAX_THREADS 512

/* One block per row. */
__global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_f32_kernel(int32_t *ids, const float *logits, int64_t ls, int64_t n_vocab,
                  const uint8_t *seen, float rep)
{
	__shared__ float bv[ARGMAX_THREADS / 32];
	__shared__ int32_t bi[ARGMAX_THREADS / 32];
	const float *l = logits + (int64_t)blockIdx.x * ls;
	const uint8_t *sn = seen ? seen + (int64_t)blockIdx.x * n_vocab : nullptr;
	float best = -INFINITY;
	int32_t bidx = INT32_MAX;
	for (int64_t i = threadIdx.x; i < n_vocab; i += ARGMAX_THREADS) {
		float v = l[i];
		if (sn && sn[i] && rep != 1.0f)
			v = v > 0.0f ? v / rep : v * rep;
		if (v > best || (v == best && (int32_t)i < bidx) || bidx == INT32_MAX) {
			best = v;
			bidx = (int32_t)i;
		}
	}
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(0xffffffffu, best, o);
		int32_t oi = __shfl_xor_sync(0xffffffffu, bidx, o);
		if (ov > best || (ov == best && oi < bidx)) {
			best = ov;
			bidx = oi;
		}
	}
	if ((threadIdx.x & 31) == 0) {
		bv[threadIdx.x >> 5] = best;
		bi[threadIdx.x >> 5] = bidx;
	}
	__syncthreads();
	if (threadIdx.x == 0) {
		for (int w = 1; w < ARGMAX_THREADS / 32; w++)
			if (bv[w] > best || (bv[w] == best && bi[w] < bidx)) {
				best = bv[w];
				bidx = bi[w];
			}
		ids[blockIdx.x] = bidx;
	}
}

extern "C" cudaError_t llm_cuda_argmax_f32(int32_t *ids, const float *logits, int64_t ls, int64_t rows,
                                       int64_t n_vocab, const uint8_t *seen, float rep_penalty,
                                       cudaStream_t stream)
{
	if (rows < 1 || rows > INT32_MAX || n_vocab < 1 || n_vocab > INT32_MAX)
		return rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
	argmax_f32_kernel<<<(unsigned)rows, ARGMAX_THREADS, 0, stream>>>(ids, logits, ls, n_vocab, seen, rep_penalty);
	return cudaGetLastError();
}
