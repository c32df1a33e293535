/* kernels/attn_paged.cu: the paged KV cache on the GPU: store K/V rows of a
 * batch, and causal attention over each token's own sequence (decode tokens
 * and prefill chunks alike; grouped-query heads).
 *
 * Reference: cpu_kv_store and cpu_attention (common/engine/backend_cpu.c) and the
 * layout of common/engine/kvcache.h: k, v (n_layer, n_block, n_kv_head,
 * block_size, d_head), position p of a sequence in block
 * tab[p / block_size], slot p % block_size. BF16 caches round to nearest even (llm_f32_to_bf16), so
 * the stored bits equal the CPU's. FP8 (E4M3) caches store a head's row as
 * codes and one scale amax / 448 (llm_kv_e4m3_row: code = e4m3(x / scale),
 * nearest even, saturating), the CPU's bytes; an element reads as
 * e4m3(code) * scale, one f32 rounding, as on the CPU. Attention: scores q.k / sqrtf(d_head) in
 * f32, softmax computed online (running max and sum, rescaled per chunk of
 * 32 positions, as in FlashAttention) instead of the CPU's two passes: the
 * same function, rounding differs by a few ulp. */
#include "cuda_device.h"
#include <cuda_fp8.h>

#define ATTN_WARPS 4
#define ATTN_MAX_D 256

/* The element index of KV head KH's row at position P (its d_head elements
 * follow). */
static __device__ __forceinline__ int64_t kv_row(const struct llm_cuda_kvgeom &g, int layer,
                                                 const int32_t *tab, int32_t p, int kh)
{
	int32_t blk = tab[p / g.block_size];
	return ((((int64_t)layer * g.n_block + blk) * g.n_kv_head + kh) * g.block_size + p % g.block_size)
	       * g.d_head;
}

/* Element I of K (SC: ks) or V (vs): scales are one per d_head elements. */
static __device__ __forceinline__ float kv_at(const struct llm_cuda_kvgeom &g, const void *base,
                                              const float *sc, int64_t i)
{
	if (g.fp8)
		return e4m3x2_scaled(((const uint8_t *)base)[i]).x * (sc[i / g.d_head] * 256.0f);
	return g.bf16 ? __bfloat162float(((const __nv_bfloat16 *)base)[i]) : ((const float *)base)[i];
}

/* One head's row X (d_head f32) of K (W 0) or V (W 1) into an FP8 cache
 * at element OFF, by the 32 lanes of a warp: the row's largest magnitude,
 * the scale amax / 448, then each lane's codes. */
static __device__ __forceinline__ void kv_put_e4m3_row(const struct llm_cuda_kvgeom &g, int w, int64_t off,
                                                       const float *x, int lane)
{
	const int d = g.d_head;
	uint8_t *c = (uint8_t *)(w ? g.v : g.k) + off;
	float amax = 0.0f;
	for (int i = lane; i < d; i += 32)
		amax = fmaxf(amax, fabsf(x[i]));
	amax = warp_max(amax);
	const float s = amax / 448.0f;
	for (int i = lane; i < d; i += 32)
		c[i] = s > 0.0f ? (uint8_t)__nv_cvt_float_to_fp8(x[i] / s, __NV_SATFINITE, __NV_E4M3) : 0;
	if (lane == 0)
		(w ? g.vs : g.ks)[off / d] = s;
}

/* One K or V element into an f32 or bf16 cache (bf16: nearest even). */
static __device__ __forceinline__ void kv_put(const struct llm_cuda_kvgeom &g, void *base, int64_t off, float x)
{
	if (g.bf16)
		((__nv_bfloat16 *)base)[off] = __float2bfloat16_rn(x);
	else
		((float *)base)[off] = x;
}

/* FP8 caches: one warp per (token, KV head); the lanes find the row's
 * largest magnitude, then each encodes its elements. */
__global__ void kv_store_e4m3_kernel(struct llm_cuda_kvgeom g, int layer, struct llm_cuda_kvmeta m,
                                     const float *k, int64_t ks, const float *v, int64_t vs)
{
	const int lane = threadIdx.x & 31;
	const int64_t n = (int64_t)m.n_tok * g.n_kv_head, warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
	for (int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; item < n; item += warps) {
	for (int w = 0; w < 2; w++) {   /* k, then v */
		const int t = (int)(item / g.n_kv_head), h = (int)(item % g.n_kv_head), d = g.d_head;
		const int64_t off = kv_row(g, layer, m.tab + m.tab_off[t], m.pos[t], h);
		const float *x = (w ? v + (int64_t)t * vs : k + (int64_t)t * ks) + (int64_t)h * d;
		kv_put_e4m3_row(g, w, off, x, lane);
	}
	}
}

/* One thread per (token, element). */
__global__ void kv_store_kernel(struct llm_cuda_kvgeom g, int layer, struct llm_cuda_kvmeta m,
                                const float *k, int64_t ks, const float *v, int64_t vs)
{
	int64_t n = (int64_t)m.n_tok * g.kv_dim;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int t = (int)(i / g.kv_dim), c = (int)(i % g.kv_dim);
		int64_t off = kv_row(g, layer, m.tab + m.tab_off[t], m.pos[t], c / g.d_head) + c % g.d_head;
		kv_put(g, g.k, off, k[(int64_t)t * ks + c]);
		kv_put(g, g.v, off, v[(int64_t)t * vs + c]);
	}
}

/* One warp per (token, head). Positions go in chunks of 32, one per lane for
 * the score (the lane reads its whole K row); then the chunk's weights are
 * broadcast and every lane accumulates its own output elements
 * (lane + 32 r) over the chunk's V rows, coalesced. */
__global__ void __launch_bounds__(ATTN_WARPS * 32)
attention_paged_f32_kernel(float *out, int64_t os, const float *q, int64_t qs,
                           struct llm_cuda_kvgeom g, int layer, struct llm_cuda_kvmeta m, int n_head)
{
	__shared__ float qsh[ATTN_WARPS][ATTN_MAX_D];
	const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
	const int64_t item = (int64_t)blockIdx.x * ATTN_WARPS + wid;
	if (item >= (int64_t)m.n_tok * n_head)
		return;                      /* whole warps leave; no block barrier below */
	const int t = (int)(item / n_head), h = (int)(item % n_head);
	const int d = g.d_head, group = n_head / g.n_kv_head;
	const int kh = h / group;
	const int32_t pos = m.pos[t];
	const int32_t *tab = m.tab + m.tab_off[t];
	const float scale = sqrtf((float)d);
	float *qw = qsh[wid];
	for (int i = lane; i < d; i += 32)
		qw[i] = q[(int64_t)t * qs + (int64_t)h * d + i];
	__syncwarp();

	float m_run = -INFINITY, l_run = 0.0f;
	float acc[ATTN_MAX_D / 32];
#pragma unroll
	for (int r = 0; r < ATTN_MAX_D / 32; r++)
		acc[r] = 0.0f;
	for (int32_t c0 = 0; c0 <= pos; c0 += 32) {
		const int32_t p = c0 + lane;
		float s = -INFINITY;
		if (p <= pos) {
			int64_t kr = kv_row(g, layer, tab, p, kh);
			float dot = 0.0f;
			for (int i = 0; i < d; i++)
				dot = fmaf(qw[i], kv_at(g, g.k, g.ks, kr + i), dot);
			s = dot / scale;
		}
		float m_new = fmaxf(m_run, warp_max(s));   /* finite: position c0 <= pos */
		float corr = expf(m_run - m_new);          /* 0 on the first chunk */
		float e = p <= pos ? expf(s - m_new) : 0.0f;
		l_run = l_run * corr + warp_sum(e);
#pragma unroll
		for (int r = 0; r < ATTN_MAX_D / 32; r++)
			acc[r] *= corr;
		const int nv = pos - c0 + 1 < 32 ? pos - c0 + 1 : 32;
		for (int j = 0; j < nv; j++) {
			float ej = __shfl_sync(0xffffffffu, e, j);
			int64_t vr = kv_row(g, layer, tab, c0 + j, kh);
#pragma unroll
			for (int r = 0; r < ATTN_MAX_D / 32; r++) {
				int i = lane + 32 * r;
				if (i < d)
					acc[r] = fmaf(ej, kv_at(g, g.v, g.vs, vr + i), acc[r]);
			}
		}
		m_run = m_new;
	}
	float inv = 1.0f / l_run;
	float *o = out + (int64_t)t * os + (int64_t)h * d;
#pragma unroll
	for (int r = 0; r < ATTN_MAX_D / 32; r++) {
		int i = lane + 32 * r;
		if (i < d)
			o[i] = acc[r] * inv;
	}
}

/* rope_store: one warp per (token, head) over the n_head heads of q and
 * then the n_kv_head heads of k: the rotation in place (rope_pair, as the
 * rope op), and for a k head its rotated row and v's row into the cache
 * (kv_put_e4m3_row and kv_put, as the kv_store op): one launch where the
 * separate ops take three, and k is read once after its rotation. */
__global__ void rope_store_kernel(struct llm_cuda_kvgeom g, int layer, struct llm_cuda_kvmeta m, float *q,
                                  int64_t qs, float *k, int64_t ks, const float *v, int64_t vs, int n_head,
                                  const float *inv_freq)
{
	const int lane = threadIdx.x & 31, d = g.d_head, half = d / 2, nh = n_head + g.n_kv_head;
	const int64_t n = (int64_t)m.n_tok * nh, warps = ((int64_t)gridDim.x * blockDim.x) >> 5;
	for (int64_t item = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5; item < n; item += warps) {
		const int t = (int)(item / nh), h = (int)(item % nh), kh = h - n_head;
		const int32_t pos = m.pos[t];
		float *x = kh < 0 ? q + (int64_t)t * qs + (int64_t)h * d : k + (int64_t)t * ks + (int64_t)kh * d;
		for (int j = lane; j < half; j += 32)
			rope_pair(x, j, half, pos, inv_freq);
		if (kh < 0)
			continue;
		__syncwarp();            /* every lane's rotated pairs, visible to the others */
		const int64_t off = kv_row(g, layer, m.tab + m.tab_off[t], pos, kh);
		const float *vr = v + (int64_t)t * vs + (int64_t)kh * d;
		if (g.fp8) {
			kv_put_e4m3_row(g, 0, off, x, lane);
			kv_put_e4m3_row(g, 1, off, vr, lane);
		} else {
			for (int i = lane; i < d; i += 32) {
				kv_put(g, g.k, off + i, x[i]);
				kv_put(g, g.v, off + i, vr[i]);
			}
		}
		__syncwarp();
	}
}

extern "C" cudaError_t llm_cuda_rope_store(const struct llm_cuda_kvgeom *g, int layer,
                                           const struct llm_cuda_kvmeta *m, float *q, int64_t qs, float *k,
                                           int64_t ks, const float *v, int64_t vs, int n_head,
                                           const float *inv_freq, cudaStream_t stream)
{
	if (g->d_head < 2 || g->d_head % 2 || n_head < 0)
		return cudaErrorInvalidValue;
	int64_t th = (int64_t)m->n_tok * (n_head + g->n_kv_head) * 32;
	if (th < 1)
		return cudaSuccess;
	rope_store_kernel<<<llm_grid_1d(th, 256), 256, 0, stream>>>(*g, layer, *m, q, qs, k, ks, v, vs, n_head,
	                                                            inv_freq);
	return cudaGetLastError();
}

extern "C" cudaError_t llm_cuda_kv_store(const struct llm_cuda_kvgeom *g, int layer,
                                         const struct llm_cuda_kvmeta *m, const float *k, int64_t ks,
                                         const float *v, int64_t vs, cudaStream_t stream)
{
	int64_t n = (int64_t)m->n_tok * g->kv_dim;
	if (n < 1)
		return cudaSuccess;
	if (g->fp8) {
		int64_t th = (int64_t)m->n_tok * g->n_kv_head * 32;
		kv_store_e4m3_kernel<<<llm_grid_1d(th, 256), 256, 0, stream>>>(*g, layer, *m, k, ks, v, vs);
		return cudaGetLastError();
	}
	kv_store_kernel<<<llm_grid_1d(n, 256), 256, 0, stream>>>(*g, layer, *m, k, ks, v, vs);
	return cudaGetLastError();
}

extern "C" cudaError_t llm_cuda_attention(float *out, int64_t os, const float *q, int64_t qs,
                                          const struct llm_cuda_kvgeom *g, int layer,
                                          const struct llm_cuda_kvmeta *m, int n_head, cudaStream_t stream)
{
	if (g->d_head < 1 || g->d_head > ATTN_MAX_D || n_head < 1 || n_head % g->n_kv_head)
		return cudaErrorInvalidValue;
	int64_t items = (int64_t)m->n_tok * n_head;
	if (items < 1)
		return cudaSuccess;
	int64_t blocks = (items + ATTN_WARPS - 1) / ATTN_WARPS;
	if (blocks > INT32_MAX)
		return cudaErrorInvalidValue;
	attention_paged_f32_kernel<<<(unsigned)blocks, ATTN_WARPS * 32, 0, stream>>>(out, os, q, qs, *g, layer, *m, n_head);
	return cudaGetLastError();
}
