/* kernels/sample.cu: sampling on the GPU, so that only token ids (and the
 * log-probs asked for) cross to the host.
 *
 * Reference: llm_sampler_sample in common/engine/sampler.c, step by step, in its
 * order: logit biases (added in list order), the min_tokens hold (-inf),
 * penalties (repetition over the ids seen, frequency and presence over the
 * output counts), then at temperature 0 the argmax (ties: the lowest id),
 * else the candidates w >= max - 40 T sorted best first (ties: the lowest
 * id), top-k, p_i = exp((w_i - max) / T) in double, top-p over the running
 * sum, min-p, and one walk of u * sum over the running sum with the
 * request's own draw u (the host draws it from the request's stream, the
 * one number the CPU would draw).
 *
 * What is exact: every f32 step (the adjusted logits, the cut, the order of
 * the candidates: the same IEEE operations, written with __f*_rn so nvcc
 * fuses nothing the CPU does not), hence greedy ids always; the running
 * sums are the CPU's, sequential in double on one thread per row. What is
 * not bit-exact: CUDA's double exp is within 1 ulp where glibc's is
 * correctly rounded, so a p_i may differ in its last bit, and a sampled id
 * differs only where u * sum falls within a few ulp of a boundary of the
 * walk (probability of order m 2^-52 per draw): the distribution is the
 * CPU's. The log-prob is log-softmax of the raw row in double (max, then a
 * tree sum of exp): within 1e-6 of the CPU's (whose AVX-512 sum is within
 * 3e-7).
 *
 * The argmax kernel below (llm_cuda_argmax_f32: greedy with the repetition
 * penalty over a dense seen mask) is the older, narrower form, kept for
 * its callers. */
#include "cuda_device.h"
#include <cub/cub.cuh>

#define ARGMAX_THREADS 512

/* The warp's largest (value, index), ties to the lower index, into every
 * lane's BEST and BIDX. */
static __device__ __forceinline__ void warp_argmax(float &best, int32_t &bidx)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1) {
		float ov = __shfl_xor_sync(0xffffffffu, best, o);
		int32_t oi = __shfl_xor_sync(0xffffffffu, bidx, o);
		if (ov > best || (ov == best && oi < bidx)) {
			best = ov;
			bidx = oi;
		}
	}
}

/* The block's largest (value, index), ties to the lower index, into every
 * thread's BEST and BIDX: the warps' results through BV and BI (shared, one
 * slot a warp of the block's N_WARP), folded by every thread in the same
 * order. The order over (value, index) is total, so the result does not
 * depend on the value a thread starts from. */
static __device__ __forceinline__ void block_argmax(float &best, int32_t &bidx, float *bv, int32_t *bi, int n_warp)
{
	warp_argmax(best, bidx);
	if ((threadIdx.x & 31) == 0) {
		bv[threadIdx.x >> 5] = best;
		bi[threadIdx.x >> 5] = bidx;
	}
	__syncthreads();
	for (int k = 0; k < n_warp; k++)
		if (bv[k] > best || (bv[k] == best && bi[k] < bidx)) {
			best = bv[k];
			bidx = bi[k];
		}
}

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
	block_argmax(best, bidx, bv, bi, ARGMAX_THREADS / 32);
	if (threadIdx.x == 0)
		ids[blockIdx.x] = bidx;
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

/* ---- the sampler (llm_cuda_sample) ------------------------------------ */

#define SAMPLE_THREADS 512

/* What the first pass leaves per row for the draw. */
struct sample_info {
	double mx_raw, sum_raw;     /* max of the raw row, sum of exp(l - mx_raw) (log-prob) */
	float mx;                   /* max of the adjusted row */
	int m;                      /* candidates (w >= mx - 40 T) */
	int bad;                    /* 1: a non-finite logit, nothing chosen */
};

/* Block reductions over SAMPLE_THREADS threads; every thread gets the
 * result. Each call ends with a barrier, so calls may follow each other. */
template <typename T, typename Op>
static __device__ T block_reduce(T v, Op op)
{
	__shared__ T part[SAMPLE_THREADS / 32];
	__shared__ T total;
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
	if ((threadIdx.x & 31) == 0)
		part[threadIdx.x >> 5] = v;
	__syncthreads();
	if (threadIdx.x == 0) {
		T t = part[0];
		for (int w = 1; w < SAMPLE_THREADS / 32; w++)
			t = op(t, part[w]);
		total = t;
	}
	__syncthreads();
	T r = total;
	__syncthreads();
	return r;
}

struct op_min_i { __device__ int operator()(int a, int b) const { return a < b ? a : b; } };
struct op_sum_i { __device__ int operator()(int a, int b) const { return a + b; } };
struct op_max_f { __device__ float operator()(float a, float b) const { return fmaxf(a, b); } };
struct op_sum_d { __device__ double operator()(double a, double b) const { return a + b; } };

/* A sort key: larger adjusted logit first, then the lower id. The float's
 * bits made monotone as an unsigned (-0 counted as +0: they tie on the
 * CPU), the id complemented below. 0 (below every finite logit) marks a
 * token that is not a candidate. */
static __device__ __forceinline__ uint64_t cand_key(float v, int64_t id)
{
	uint32_t b = __float_as_uint(__fadd_rn(v, 0.0f));
	b = (b & 0x80000000u) ? ~b : b | 0x80000000u;
	return ((uint64_t)b << 32) | (uint32_t)(0xffffffffu - (uint32_t)id);
}

static __device__ __forceinline__ int32_t cand_id(uint64_t k)
{
	return (int32_t)(0xffffffffu - (uint32_t)k);
}

/* One block per row: the adjusted row into W, the greedy choice, or the
 * candidates' keys for the sort. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_adjust_kernel(struct llm_cuda_sample_out *out, struct sample_info *info, float *w, uint64_t *keys,
                     const float *logits, int64_t ls, int64_t nv, const struct llm_cuda_sample_row *prm,
                     const int32_t *aux)
{
	const int64_t r = blockIdx.x;
	const struct llm_cuda_sample_row p = prm[r];
	const float *l = logits + r * ls;
	float *wr = w + r * nv;
	int bad = INT32_MAX;
	float mx = -INFINITY;
	for (int64_t i = threadIdx.x; i < nv; i += SAMPLE_THREADS) {
		float v = l[i];
		wr[i] = v;
		if (!isfinite(v))
			bad = bad < (int)i ? bad : (int)i;
		else
			mx = fmaxf(mx, v);
	}
	bad = block_reduce(bad, op_min_i());
	if (bad != INT32_MAX) {      /* the CPU refuses the row: nothing is chosen */
		if (threadIdx.x == 0) {
			out[r].id = -1 - bad;
			out[r].logprob = l[bad];
			info[r].bad = 1;
		}
		return;
	}
	mx = block_reduce(mx, op_max_f());
	double se = 0;
	if (p.want_logprob) {
		for (int64_t i = threadIdx.x; i < nv; i += SAMPLE_THREADS)
			se += exp((double)l[i] - (double)mx);
		se = block_reduce(se, op_sum_d());
	}
	/* biases in list order (an id twice: both added, in that order), on one
	 * thread; then the hold; then the penalties, each id once */
	if (threadIdx.x == 0)
		for (int k = 0; k < p.n_bias; k++) {
			int32_t id = aux[p.bias + k];
			wr[id] = __fadd_rn(wr[id], __int_as_float(aux[p.bias + p.n_bias + k]));
		}
	__syncthreads();
	for (int k = threadIdx.x; k < p.n_hold; k += SAMPLE_THREADS)
		wr[aux[p.hold + k]] = -INFINITY;
	__syncthreads();
	if (p.rep != 1.0f || p.freq != 0.0f || p.pres != 0.0f)
		for (int k = threadIdx.x; k < p.n_seen; k += SAMPLE_THREADS) {
			int32_t id = aux[p.seen + k], cnt = aux[p.seen + p.n_seen + k];
			float v = wr[id];
			if (p.rep != 1.0f)
				v = v > 0.0f ? __fdiv_rn(v, p.rep) : __fmul_rn(v, p.rep);
			if (cnt)
				v = __fsub_rn(v, __fadd_rn(__fmul_rn(p.freq, (float)cnt), p.pres));
			wr[id] = v;
		}
	__syncthreads();
	/* argmax of the adjusted row: the first index of the largest */
	__shared__ float bv[SAMPLE_THREADS / 32];
	__shared__ int32_t bi[SAMPLE_THREADS / 32];
	float best = -INFINITY;
	int32_t bidx = INT32_MAX;
	for (int64_t i = threadIdx.x; i < nv; i += SAMPLE_THREADS) {
		float v = wr[i];
		if (v > best || bidx == INT32_MAX) {
			best = v;
			bidx = (int32_t)i;
		}
	}
	block_argmax(best, bidx, bv, bi, SAMPLE_THREADS / 32);
	if (p.temperature == 0.0f) {
		if (threadIdx.x == 0) {
			out[r].id = bidx;
			out[r].logprob = p.want_logprob ? (float)((double)l[bidx] - (double)mx - log(se)) : NAN;
			info[r].bad = 0;
			info[r].m = 0;
		}
		return;
	}
	float cut = __fsub_rn(best, __fmul_rn(40.0f, p.temperature));
	uint64_t *kr = keys + r * nv;
	int m = 0;
	for (int64_t i = threadIdx.x; i < nv; i += SAMPLE_THREADS) {
		float v = wr[i];
		int c = v >= cut;
		m += c;
		kr[i] = c ? cand_key(v, i) : 0;
	}
	m = block_reduce(m, op_sum_i());
	if (threadIdx.x == 0) {
		info[r].mx_raw = mx;
		info[r].sum_raw = se;
		info[r].mx = best;
		info[r].m = m;
		info[r].bad = 0;
	}
}

/* One block per sampled row, after the sort (KEYS best first): the
 * probabilities in parallel, then the CPU's sequential sums and walks on
 * thread 0. PROB reuses the sort's input keys. */
__global__ void __launch_bounds__(SAMPLE_THREADS)
sample_draw_kernel(struct llm_cuda_sample_out *out, const struct sample_info *info, const float *w,
                   const uint64_t *keys, double *prob, const float *logits, int64_t ls, int64_t nv,
                   const struct llm_cuda_sample_row *prm)
{
	const int64_t r = blockIdx.x;
	const struct llm_cuda_sample_row p = prm[r];
	if (p.temperature == 0.0f || info[r].bad)
		return;
	int m = info[r].m;
	if (p.top_k > 0 && p.top_k < m)
		m = p.top_k;
	const uint64_t *kr = keys + r * nv;
	const float *wr = w + r * nv;
	double *pr = prob + r * nv;
	const double mx = info[r].mx, t = p.temperature;
	for (int i = threadIdx.x; i < m; i += SAMPLE_THREADS)
		pr[i] = exp(((double)wr[cand_id(kr[i])] - mx) / t);
	__syncthreads();
	if (threadIdx.x != 0)
		return;
	double sum = 0;
	for (int i = 0; i < m; i++)
		sum += pr[i];
	if (p.top_p < 1.0f) {          /* smallest prefix with mass >= top_p */
		double c = 0;
		int k = 0;
		while (k < m) {
			c += pr[k++] / sum;
			if (c >= (double)p.top_p)
				break;
		}
		m = k;
	}
	if (p.min_p > 0.0f) {          /* p >= min_p * p_max */
		int k = 1;
		while (k < m && pr[k] >= (double)p.min_p * pr[0])
			k++;
		m = k;
	}
	sum = 0;
	for (int i = 0; i < m; i++)
		sum += pr[i];
	double rr = p.u * sum, c = 0;
	int32_t tok = cand_id(kr[m - 1]);
	for (int i = 0; i < m; i++) {
		c += pr[i];
		if (rr < c) {
			tok = cand_id(kr[i]);
			break;
		}
	}
	out[r].id = tok;
	out[r].logprob = p.want_logprob
	                 ? (float)((double)logits[r * ls + tok] - info[r].mx_raw - log(info[r].sum_raw)) : NAN;
}

/* The work space's parts, each 256-byte aligned: W (rows, nv) f32, two key
 * arrays (rows, nv) u64, segment offsets (rows + 1), row infos, the sort's
 * temporary storage. */
struct sample_ws {
	float *w;
	uint64_t *ka, *kb;
	int *off;
	struct sample_info *info;
	void *tmp;
	size_t tmp_bytes, total;
};

static size_t up256(size_t n) { return (n + 255) & ~(size_t)255; }

static cudaError_t sample_layout(struct sample_ws *s, char *base, int64_t rows, int64_t nv)
{
	size_t n = (size_t)rows * (size_t)nv, at = 0;
	s->tmp_bytes = 0;
	cudaError_t e = cub::DeviceSegmentedRadixSort::SortKeysDescending(
		nullptr, s->tmp_bytes, (const uint64_t *)nullptr, (uint64_t *)nullptr, (int)n, (int)rows,
		(const int *)nullptr, (const int *)nullptr, 0, 64);
	if (e != cudaSuccess)
		return e;
	s->w = (float *)(base + at);
	at += up256(n * sizeof(float));
	s->ka = (uint64_t *)(base + at);
	at += up256(n * sizeof(uint64_t));
	s->kb = (uint64_t *)(base + at);
	at += up256(n * sizeof(uint64_t));
	s->off = (int *)(base + at);
	at += up256(((size_t)rows + 1) * sizeof(int));
	s->info = (struct sample_info *)(base + at);
	at += up256((size_t)rows * sizeof(struct sample_info));
	s->tmp = base + at;
	at += up256(s->tmp_bytes);
	s->total = at;
	return cudaSuccess;
}

__global__ void sample_offsets_kernel(int *off, int64_t rows, int64_t nv)
{
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i <= rows; i += (int64_t)gridDim.x * blockDim.x)
		off[i] = (int)(i * nv);
}

extern "C" size_t llm_cuda_sample_work(int64_t rows, int64_t n_vocab)
{
	struct sample_ws s;
	if (rows < 1 || n_vocab < 1 || rows * n_vocab > INT32_MAX)
		return 0;
	return sample_layout(&s, nullptr, rows, n_vocab) == cudaSuccess ? s.total : 0;
}

extern "C" cudaError_t llm_cuda_sample(struct llm_cuda_sample_out *out, const float *logits, int64_t ls,
                                       int64_t rows, int64_t n_vocab, const struct llm_cuda_sample_row *prm,
                                       const int32_t *aux, int any_sampled, void *work, size_t work_bytes,
                                       cudaStream_t stream)
{
	if (rows < 1 || n_vocab < 1 || rows * n_vocab > INT32_MAX)
		return rows == 0 ? cudaSuccess : cudaErrorInvalidValue;
	struct sample_ws s;
	cudaError_t e = sample_layout(&s, (char *)work, rows, n_vocab);
	if (e != cudaSuccess)
		return e;
	if (s.total > work_bytes)
		return cudaErrorInvalidValue;
	sample_adjust_kernel<<<(unsigned)rows, SAMPLE_THREADS, 0, stream>>>(out, s.info, s.w, s.ka, logits, ls,
	                                                                     n_vocab, prm, aux);
	if ((e = cudaGetLastError()) != cudaSuccess || !any_sampled)
		return e;
	sample_offsets_kernel<<<llm_grid_1d(rows + 1, 256), 256, 0, stream>>>(s.off, rows, n_vocab);
	if ((e = cudaGetLastError()) != cudaSuccess)
		return e;
	e = cub::DeviceSegmentedRadixSort::SortKeysDescending(s.tmp, s.tmp_bytes, s.ka, s.kb, (int)(rows * n_vocab),
	                                                      (int)rows, s.off, s.off + 1, 0, 64, stream);
	if (e != cudaSuccess)
		return e;
	sample_draw_kernel<<<(unsigned)rows, SAMPLE_THREADS, 0, stream>>>(out, s.info, s.w, s.kb, (double *)s.ka,
	                                                                   logits, ls, n_vocab, prm);
	return cudaGetLastError();
}
