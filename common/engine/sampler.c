/* common/engine/sampler.c: sampling (see sampler.h for the order and guarantees). */
#include "sampler.h"
#include "hash.h"
#include "dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

void llm_rng_seed(uint64_t st[4], uint64_t seed)
{
	for (int i = 0; i < 4; i++)
		st[i] = llm_rng_splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }

double llm_rng_uniform(uint64_t s[4])
{
	uint64_t r = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;   /* xoshiro256** */
	s[2] ^= s[0];
	s[3] ^= s[1];
	s[1] ^= s[2];
	s[0] ^= s[3];
	s[2] ^= t;
	s[3] = rotl(s[3], 45);
	return (double)(r >> 11) * 0x1.0p-53;
}

enum llm_status llm_sample_params_check(const struct llm_sample_params *p)
{
	if (!(p->temperature >= 0 && p->temperature <= 100))
		return llm_fail(LLM_ERR_USAGE, "temperature: %g is outside [0, 100]", p->temperature);
	if (p->top_k < 0)
		return llm_fail(LLM_ERR_USAGE, "top_k: %d is negative", p->top_k);
	if (!(p->top_p > 0 && p->top_p <= 1))
		return llm_fail(LLM_ERR_USAGE, "top_p: %g is outside (0, 1]", p->top_p);
	if (!(p->min_p >= 0 && p->min_p <= 1))
		return llm_fail(LLM_ERR_USAGE, "min_p: %g is outside [0, 1]", p->min_p);
	if (!(p->repetition_penalty > 0 && p->repetition_penalty <= 100))
		return llm_fail(LLM_ERR_USAGE, "repetition_penalty: %g is outside (0, 100]", p->repetition_penalty);
	if (!(fabsf(p->frequency_penalty) <= 2))
		return llm_fail(LLM_ERR_USAGE, "frequency_penalty: %g is outside [-2, 2]", p->frequency_penalty);
	if (!(fabsf(p->presence_penalty) <= 2))
		return llm_fail(LLM_ERR_USAGE, "presence_penalty: %g is outside [-2, 2]", p->presence_penalty);
	if (p->max_tokens < 0)
		return llm_fail(LLM_ERR_USAGE, "max_tokens: %d is negative", p->max_tokens);
	if (p->n_logprobs < 0 || p->n_logprobs > LLM_MAX_LOGPROBS)
		return llm_fail(LLM_ERR_USAGE, "logprobs: %d is outside [0, %d]", p->n_logprobs, LLM_MAX_LOGPROBS);
	if (p->n_stop_ids < 0 || p->n_stop_ids > LLM_MAX_STOP)
		return llm_fail(LLM_ERR_USAGE, "stop ids: %d (at most %d)", p->n_stop_ids, LLM_MAX_STOP);
	if (p->n_stop < 0 || p->n_stop > LLM_MAX_STOP)
		return llm_fail(LLM_ERR_USAGE, "stop strings: %d (at most %d)", p->n_stop, LLM_MAX_STOP);
	for (int i = 0; i < p->n_stop; i++)
		if (!p->stop[i] || !p->stop[i][0])
			return llm_fail(LLM_ERR_USAGE, "stop string %d is empty", i);
	if (p->min_tokens < 0)
		return llm_fail(LLM_ERR_USAGE, "min_tokens: %d is negative", p->min_tokens);
	if (p->max_tokens > 0 && p->min_tokens > p->max_tokens)
		return llm_fail(LLM_ERR_USAGE, "min_tokens: %d exceeds max_tokens %d", p->min_tokens, p->max_tokens);
	if (p->n_bias < 0 || p->n_bias > LLM_MAX_BIAS || (p->n_bias && !p->bias))
		return llm_fail(LLM_ERR_USAGE, "logit_bias: %d entries (at most %d)", p->n_bias, LLM_MAX_BIAS);
	for (int i = 0; i < p->n_bias; i++)
		if (!(fabsf(p->bias[i].bias) <= 100))
			return llm_fail(LLM_ERR_USAGE, "logit_bias: token %d: %g is outside [-100, 100]", p->bias[i].id,
			                p->bias[i].bias);
	return LLM_OK;
}

/* Whether P changes logits by the tokens seen so far. */
static int penalized(const struct llm_sample_params *p)
{
	return p->repetition_penalty != 1.0f || p->frequency_penalty != 0 || p->presence_penalty != 0;
}

enum llm_status llm_sampler_init(struct llm_sampler *s, const struct llm_sample_params *p, int n_vocab)
{
	memset(s, 0, sizeof *s);
	LLM_TRY(llm_sample_params_check(p));
	for (int i = 0; i < p->n_bias; i++)
		if (p->bias[i].id < 0 || p->bias[i].id >= n_vocab)
			return llm_fail(LLM_ERR_RANGE, "logit_bias: token id %d is not in the vocabulary [0, %d)",
			                p->bias[i].id, n_vocab);
	s->p = *p;
	s->n_vocab = n_vocab;
	llm_rng_seed(s->rng, p->seed);
	/* only what the parameters use: a vocabulary-sized array is 200 KB at
	 * 49152 tokens, and fresh pages cost a request its faults (greedy
	 * without penalties, the common case in serving, needs none) */
	int pen = penalized(p), smp = p->temperature != 0, adj = pen || p->n_bias || p->min_tokens || p->grammar;
	if (pen) {
		s->count = calloc((size_t)n_vocab, sizeof *s->count);
		s->seen = calloc((size_t)n_vocab, 1);
		s->seen_id = malloc((size_t)n_vocab * sizeof *s->seen_id);
		s->seen_cnt = malloc((size_t)n_vocab * sizeof *s->seen_cnt);
	}
	if (adj)
		s->work = malloc((size_t)n_vocab * sizeof *s->work);
	if (smp) {
		s->idx = malloc((size_t)n_vocab * sizeof *s->idx);
		s->tmp = malloc((size_t)n_vocab * sizeof *s->tmp);
		s->prob = malloc((size_t)n_vocab * sizeof *s->prob);
	}
	if ((pen && (!s->count || !s->seen || !s->seen_id || !s->seen_cnt)) || (adj && !s->work) || (smp && (!s->idx || !s->tmp || !s->prob))) {
		llm_sampler_free(s);
		return llm_fail(LLM_ERR_NOMEM, "sampler: out of memory");
	}
	return LLM_OK;
}

void llm_sampler_free(struct llm_sampler *s)
{
	free(s->count);
	free(s->seen);
	free(s->work);
	free(s->idx);
	free(s->tmp);
	free(s->prob);
	free(s->dist);
	free(s->seen_id);
	free(s->seen_cnt);
	memset(s, 0, sizeof *s);
}

void llm_sampler_hold(struct llm_sampler *s, const int32_t *ids, int n)
{
	for (int i = 0; i < n && s->n_hold < LLM_MAX_HOLD; i++)
		if (ids[i] >= 0 && ids[i] < s->n_vocab)
			s->hold[s->n_hold++] = ids[i];
}

void llm_sampler_prompt(struct llm_sampler *s, const int32_t *ids, int n)
{
	for (int i = 0; i < n && s->seen; i++)
		if (ids[i] >= 0 && ids[i] < s->n_vocab && !s->seen[ids[i]]) {
			s->seen[ids[i]] = 1;
			s->seen_id[s->n_seen++] = ids[i];
		}
}

void llm_sampler_accept(struct llm_sampler *s, int32_t id)
{
	s->n_out++;
	if (s->seen && id >= 0 && id < s->n_vocab) {
		if (!s->seen[id])
			s->seen_id[s->n_seen++] = id;
		s->seen[id] = 1;
		s->count[id]++;
	}
}

int llm_sampler_row_ok(const struct llm_sampler *s)
{
	return !s->p.grammar && !s->mask && s->p.n_logprobs == 0;
}

void llm_sampler_row(struct llm_sampler *s, struct llm_sample_row *row)
{
	const struct llm_sample_params *p = &s->p;
	memset(row, 0, sizeof *row);
	row->temperature = p->temperature;
	row->top_k = p->top_k;
	row->top_p = p->top_p;
	row->min_p = p->min_p;
	row->repetition_penalty = p->repetition_penalty;
	row->frequency_penalty = p->frequency_penalty;
	row->presence_penalty = p->presence_penalty;
	row->n_bias = p->n_bias;
	row->bias = p->bias;
	if (s->n_hold && s->n_out < p->min_tokens) {
		row->n_hold = s->n_hold;
		row->hold = s->hold;
	}
	if (penalized(p)) {
		for (int i = 0; i < s->n_seen; i++)
			s->seen_cnt[i] = s->count[s->seen_id[i]];
		row->n_seen = s->n_seen;
		row->seen = s->seen_id;
		row->count = s->seen_cnt;
	}
	row->want_logprob = !p->skip_logprob;
	row->u = p->temperature != 0 ? llm_rng_uniform(s->rng) : 0;
}

/* The log-sum-exp of a vocabulary runs once per generated token (the
 * chosen token's log-prob); in f64 with libm exp it took ~0.3 ms for
 * 49152 logits, 8% of a 16-sequence decode step. With AVX-512: the max, then
 * exp in f32 (range reduction by ln 2 in two parts, degree-6 polynomial,
 * relative error < 2e-7 per term) summed in f64 lanes: the log-prob is off
 * by < 3e-7 absolute, below what its f32 result resolves near 1. */
#if defined(__x86_64__)
#include <immintrin.h>
__attribute__((target("avx512f"))) static double lse_512(const float *x, int n, float *pmx)
{
	__m512 vm = _mm512_set1_ps(-INFINITY);
	int i = 0;
	for (; i + 16 <= n; i += 16)
		vm = _mm512_max_ps(vm, _mm512_loadu_ps(x + i));
	float mx = _mm512_reduce_max_ps(vm);
	for (; i < n; i++)
		mx = x[i] > mx ? x[i] : mx;
	const __m512 m = _mm512_set1_ps(mx), lo = _mm512_set1_ps(-87.0f), l2e = _mm512_set1_ps(1.44269504089f);
	const __m512 c1 = _mm512_set1_ps(0.693359375f), c2 = _mm512_set1_ps(-2.12194440e-4f);
	const __m512 p0 = _mm512_set1_ps(1.9875691500e-4f), p1 = _mm512_set1_ps(1.3981999507e-3f);
	const __m512 p2 = _mm512_set1_ps(8.3334519073e-3f), p3 = _mm512_set1_ps(4.1665795894e-2f);
	const __m512 p4 = _mm512_set1_ps(1.6666665459e-1f), p5 = _mm512_set1_ps(5.0000001201e-1f);
	const __m512 one = _mm512_set1_ps(1.0f);
	__m512d s0 = _mm512_setzero_pd(), s1 = _mm512_setzero_pd();
	for (i = 0; i < n; i += 16) {
		int left = n - i;
		__mmask16 k = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
		__m512 v = _mm512_max_ps(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, x + i), m), lo);
		__m512 t = _mm512_roundscale_ps(_mm512_mul_ps(v, l2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		__m512 r = _mm512_fnmadd_ps(t, c2, _mm512_fnmadd_ps(t, c1, v));
		__m512 p = _mm512_fmadd_ps(p0, r, p1);
		p = _mm512_fmadd_ps(p, r, p2);
		p = _mm512_fmadd_ps(p, r, p3);
		p = _mm512_fmadd_ps(p, r, p4);
		p = _mm512_fmadd_ps(p, r, p5);
		p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, one));
		__m512 e = _mm512_maskz_mov_ps(k, _mm512_scalef_ps(p, t));
		s0 = _mm512_add_pd(s0, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
		s1 = _mm512_add_pd(s1, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
	}
	*pmx = mx;
	return _mm512_reduce_add_pd(_mm512_add_pd(s0, s1));
}

/* The same with AVX2 and FMA, eight lanes: 2^t built in the exponent bits
 * (t in [-126, 0] since v in [-87, 0]); the tail is padded with -inf, and
 * a -inf lane (the padding's or a logit's) adds 0. */
__attribute__((target("avx2,fma"))) static double lse_256(const float *x, int n, float *pmx)
{
	__m256 vm = _mm256_set1_ps(-INFINITY);
	int i = 0;
	for (; i + 8 <= n; i += 8)
		vm = _mm256_max_ps(vm, _mm256_loadu_ps(x + i));
	__m128 h = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
	h = _mm_max_ps(h, _mm_movehl_ps(h, h));
	h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
	float mx = _mm_cvtss_f32(h);
	for (; i < n; i++)
		mx = x[i] > mx ? x[i] : mx;
	const __m256 m = _mm256_set1_ps(mx), lo = _mm256_set1_ps(-87.0f), l2e = _mm256_set1_ps(1.44269504089f);
	const __m256 c1 = _mm256_set1_ps(0.693359375f), c2 = _mm256_set1_ps(-2.12194440e-4f);
	const __m256 p0 = _mm256_set1_ps(1.9875691500e-4f), p1 = _mm256_set1_ps(1.3981999507e-3f);
	const __m256 p2 = _mm256_set1_ps(8.3334519073e-3f), p3 = _mm256_set1_ps(4.1665795894e-2f);
	const __m256 p4 = _mm256_set1_ps(1.6666665459e-1f), p5 = _mm256_set1_ps(5.0000001201e-1f);
	const __m256 one = _mm256_set1_ps(1.0f);
	const __m256i bias = _mm256_set1_epi32(127);
	__m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
	for (i = 0; i < n; i += 8) {
		__m256 xv;
		if (n - i >= 8) {
			xv = _mm256_loadu_ps(x + i);
		} else {
			float t8[8];
			for (int k = 0; k < 8; k++)
				t8[k] = i + k < n ? x[i + k] : -INFINITY;
			xv = _mm256_loadu_ps(t8);
		}
		__m256 v = _mm256_max_ps(_mm256_sub_ps(xv, m), lo);
		__m256 t = _mm256_round_ps(_mm256_mul_ps(v, l2e), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
		__m256 r = _mm256_fnmadd_ps(t, c2, _mm256_fnmadd_ps(t, c1, v));
		__m256 p = _mm256_fmadd_ps(p0, r, p1);
		p = _mm256_fmadd_ps(p, r, p2);
		p = _mm256_fmadd_ps(p, r, p3);
		p = _mm256_fmadd_ps(p, r, p4);
		p = _mm256_fmadd_ps(p, r, p5);
		p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, one));
		__m256 two_t = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(t), bias), 23));
		/* -inf lanes: v clamped to -87 would give e^-87, not 0 */
		__m256 e = _mm256_and_ps(_mm256_mul_ps(p, two_t), _mm256_cmp_ps(xv, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ));
		s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
		s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
	}
	*pmx = mx;
	__m256d s = _mm256_add_pd(s0, s1);
	__m128d d = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
	return _mm_cvtsd_f64(_mm_add_sd(d, _mm_unpackhi_pd(d, d)));
}
#endif

/* The first index of the largest value: what `if (w[i] > w[tok]) tok = i`
 * returns from tok = 0 (a NaN never wins; a NaN at 0 is kept; -0 and +0
 * tie). With AVX-512 a max pass that skips NaNs (vmaxps keeps its second
 * operand when the first is NaN), then the first index equal to it. */
#if defined(__x86_64__)
/* Read on the pool's threads too (the scheduler's parallel draws): the
 * cached answer is an atomic int (every thread stores the same value). */
static int have_avx512(void)
{
	static int v = -1;
	int r = __atomic_load_n(&v, __ATOMIC_RELAXED);
	if (r < 0) {
		r = __builtin_cpu_supports("avx512f") != 0;
		__atomic_store_n(&v, r, __ATOMIC_RELAXED);
	}
	return r;
}

__attribute__((target("avx512f"))) static int32_t argmax_512(const float *w, int n)
{
	__m512 vm = _mm512_set1_ps(w[0]);
	int i = 0;
	for (; i + 16 <= n; i += 16)
		vm = _mm512_max_ps(_mm512_loadu_ps(w + i), vm);
	float mx = _mm512_reduce_max_ps(vm);
	for (; i < n; i++)
		if (w[i] > mx)
			mx = w[i];
	const __m512 m = _mm512_set1_ps(mx);
	for (i = 0; i + 16 <= n; i += 16) {
		__mmask16 k = _mm512_cmp_ps_mask(_mm512_loadu_ps(w + i), m, _CMP_EQ_OQ);
		if (k)
			return i + __builtin_ctz(k);
	}
	for (; i < n; i++)
		if (w[i] == mx)
			return i;
	return 0;
}

/* The same with AVX2: vmaxps keeps its second operand, the running max,
 * when the loaded value is NaN. */
__attribute__((target("avx2"))) static int32_t argmax_256(const float *w, int n)
{
	__m256 vm = _mm256_set1_ps(w[0]);
	int i = 0;
	for (; i + 32 <= n; i += 32) {   /* four chains: vmaxps's latency, not its throughput */
		__m256 a = _mm256_max_ps(_mm256_loadu_ps(w + i), vm);
		__m256 b = _mm256_max_ps(_mm256_loadu_ps(w + i + 8), vm);
		__m256 c = _mm256_max_ps(_mm256_loadu_ps(w + i + 16), vm);
		__m256 d = _mm256_max_ps(_mm256_loadu_ps(w + i + 24), vm);
		vm = _mm256_max_ps(_mm256_max_ps(a, b), _mm256_max_ps(c, d));
	}
	for (; i + 8 <= n; i += 8)
		vm = _mm256_max_ps(_mm256_loadu_ps(w + i), vm);
	float lane[8], mx = w[0];
	_mm256_storeu_ps(lane, vm);
	for (int k = 0; k < 8; k++)
		mx = lane[k] > mx ? lane[k] : mx;
	for (; i < n; i++)
		if (w[i] > mx)
			mx = w[i];
	const __m256 m = _mm256_set1_ps(mx);
	for (i = 0; i + 8 <= n; i += 8) {
		int k = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(w + i), m, _CMP_EQ_OQ));
		if (k)
			return i + __builtin_ctz((unsigned)k);
	}
	for (; i < n; i++)
		if (w[i] == mx)
			return i;
	return 0;
}

static int have_avx2(void)
{
	static int v = -1;
	int r = __atomic_load_n(&v, __ATOMIC_RELAXED);
	if (r < 0) {
		r = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
		__atomic_store_n(&v, r, __ATOMIC_RELAXED);
	}
	return r;
}
#endif

int32_t llm_argmax(const float *w, int n)
{
#if defined(__x86_64__)
	if (have_avx512() && n > 0 && w[0] == w[0])
		return argmax_512(w, n);
	if (have_avx2() && n > 0 && w[0] == w[0])
		return argmax_256(w, n);
#endif
	int32_t tok = 0;
	for (int i = 1; i < n; i++)
		if (w[i] > w[tok])
			tok = i;
	return tok;
}

double llm_logprob(const float *logits, int n, int32_t id)
{
#if defined(__x86_64__)
	if (have_avx512()) {
		float mx;
		double sum = lse_512(logits, n, &mx);
		return (double)logits[id] - (double)mx - log(sum);
	}
	if (have_avx2()) {
		float mx;
		double sum = lse_256(logits, n, &mx);
		return (double)logits[id] - (double)mx - log(sum);
	}
#endif
	double mx = logits[0];
	for (int i = 1; i < n; i++)
		if (logits[i] > mx)
			mx = logits[i];
	double sum = 0;
	for (int i = 0; i < n; i++)
		sum += exp((double)logits[i] - mx);
	return (double)logits[id] - mx - log(sum);
}

/* Better first: higher value, then lower id. */
static inline int better(float a, int32_t ia, float b, int32_t ib)
{
	return a > b || (a == b && ia < ib);
}

int llm_top_logprobs(const float *logits, int n_vocab, int n, struct llm_logprob *out)
{
	if (n > n_vocab)
		n = n_vocab;
	int k = 0;
	for (int32_t i = 0; i < n_vocab; i++) {       /* insertion into a short sorted list */
		if (k == n && !better(logits[i], i, out[k - 1].logprob, out[k - 1].id))
			continue;
		int j = k < n ? k++ : k - 1;
		while (j > 0 && better(logits[i], i, out[j - 1].logprob, out[j - 1].id)) {
			out[j] = out[j - 1];
			j--;
		}
		out[j].id = i;
		out[j].logprob = logits[i];
	}
	if (k) {
		double lse = llm_logprob(logits, n_vocab, out[0].id);   /* logprob of the best */
		double base = (double)out[0].logprob - lse;             /* = logsumexp */
		for (int j = 0; j < k; j++)
			out[j].logprob = (float)((double)out[j].logprob - base);
	}
	return k;
}

/* Stable merge sort of indices, best first (ties by id). */
static void sort_idx(int32_t *idx, int32_t *tmp, int n, const float *key)
{
	if (n < 2)
		return;
	int h = n / 2;
	sort_idx(idx, tmp, h, key);
	sort_idx(idx + h, tmp, n - h, key);
	int i = 0, j = h, k = 0;
	while (i < h && j < n)
		tmp[k++] = better(key[idx[j]], idx[j], key[idx[i]], idx[i]) ? idx[j++] : idx[i++];
	while (i < h)
		tmp[k++] = idx[i++];
	while (j < n)
		tmp[k++] = idx[j++];
	memcpy(idx, tmp, (size_t)n * sizeof *idx);
}

/* The same order for many candidates: a stable LSD radix sort of 32-bit
 * keys, four passes of 8 bits (a pass whose digit is the same for all is
 * skipped). A key orders the values largest first (-0 keyed as +0, so the
 * two tie as they compare), and stability keeps IDX's ascending ids within
 * a value: the ties by id, hence exactly sort_idx's order. KEYS holds 2 N
 * words of scratch. On a 49152-token vocabulary the merge sort took ~8 ms a
 * draw, most of a decode step; this sort ~1 ms (on this VM 3 passes of 11
 * bits, keys and ids packed in 64 bits, were 20% faster; a bucket sort by
 * value, then each bucket in cache, was not faster at all). */
static void radix_idx(int32_t *idx, int32_t *tmp, uint32_t *keys, int n, const float *key)
{
	uint32_t *ka = keys, *kb = keys + n;
	uint32_t cnt[4][256];
	memset(cnt, 0, sizeof cnt);
	for (int i = 0; i < n; i++) {
		float f = key[idx[i]];
		uint32_t u;
		memcpy(&u, &f, sizeof u);
		if (f == 0)
			u = 0;
		u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);   /* ascending */
		u = ~u;                                            /* largest first */
		ka[i] = u;
		cnt[0][u & 255]++;
		cnt[1][(u >> 8) & 255]++;
		cnt[2][(u >> 16) & 255]++;
		cnt[3][u >> 24]++;
	}
	int32_t *ia = idx, *ib = tmp;
	for (int pass = 0; pass < 4; pass++) {
		uint32_t *c = cnt[pass];
		int shift = 8 * pass;
		if (c[(ka[0] >> shift) & 255] == (uint32_t)n)
			continue;               /* one digit for all: nothing moves */
		uint32_t sum = 0;
		for (int d = 0; d < 256; d++) {
			uint32_t t = c[d];
			c[d] = sum;
			sum += t;
		}
		for (int i = 0; i < n; i++) {
			uint32_t at = c[(ka[i] >> shift) & 255]++;
			kb[at] = ka[i];
			ib[at] = ia[i];
		}
		uint32_t *tk = ka;
		ka = kb;
		kb = tk;
		int32_t *ti = ia;
		ia = ib;
		ib = ti;
	}
	if (ia != idx)
		memcpy(idx, ia, (size_t)n * sizeof *idx);
}

/* W: LOGITS, or the sampler's adjusted copy (mask, biases, min_tokens'
 * hold, penalties), in the order sampler.h gives. */
static enum llm_status adjust(struct llm_sampler *s, const float *logits, const float **pw_out)
{
	const struct llm_sample_params *p = &s->p;
	int n = s->n_vocab;
	/* a NaN or infinite logit has no probability: refused, not sampled (the
	 * top-p walk over NaN probabilities chose no candidate, and argmax
	 * skips NaNs, so either would make up a token) */
	int64_t bad = llm_first_nonfinite(logits, LLM_DTYPE_F32, (size_t)n);
	if (bad >= 0)
		return llm_fail(LLM_ERR_RANGE, "the model's logits are not finite (%g at token %lld): "
		                "its weights may hold NaN or Inf (see llm-quantize --check)",
		                (double)logits[bad], (long long)bad);
	const float *w = logits;       /* the adjusted copy where something adjusts them */
	int hold = s->n_hold && s->n_out < p->min_tokens;
	if (penalized(p) || p->n_bias || hold || s->mask) {
		float *pw = s->work;
		memcpy(pw, logits, (size_t)n * sizeof *pw);
		w = pw;
		for (int i = 0; s->mask && i < n; i++)
			if (i >= s->n_mask || !s->mask[i])
				pw[i] = -INFINITY;
		for (int i = 0; i < p->n_bias; i++)
			pw[p->bias[i].id] += p->bias[i].bias;
		for (int i = 0; hold && i < s->n_hold; i++)
			pw[s->hold[i]] = -INFINITY;
		if (penalized(p))              /* only seen ids are penalised: their list, not the vocabulary */
			for (int k = 0; k < s->n_seen; k++) {
				int32_t i = s->seen_id[k];
				if (p->repetition_penalty != 1.0f)
					pw[i] = pw[i] > 0 ? pw[i] / p->repetition_penalty : pw[i] * p->repetition_penalty;
				if (s->count[i])
					pw[i] -= p->frequency_penalty * (float)s->count[i] + p->presence_penalty;
			}
	}
	if (s->mask && w[llm_argmax(w, n)] == -INFINITY)
		return llm_fail(LLM_ERR_RANGE, "no token is allowed here (the grammar's mask, min_tokens)");
	*pw_out = w;
	return LLM_OK;
}

/* Temperature > 0: the candidates s->idx[0..m) (best first) and their
 * unnormalised probabilities s->prob[0..m) after temperature, top-k,
 * top-p and min-p; returns m, *SUM their total. */
static int candidates(struct llm_sampler *s, const float *w, double *psum)
{
	const struct llm_sample_params *p = &s->p;
	int n = s->n_vocab;
	/* candidates, sorted best first; tokens with p < e^-40 * p_max at this
	 * temperature cannot matter and are left out of the sort */
	int32_t *idx = s->idx;
	float mx = w[llm_argmax(w, n)];
	float cut = mx - 40.0f * p->temperature;
	int m = 0;
	for (int i = 0; i < n; i++)
		if (w[i] >= cut)
			idx[m++] = i;
	if (m < 256)
		sort_idx(idx, s->tmp, m, w);
	else                            /* s->prob is free until the sort is done */
		radix_idx(idx, s->tmp, (uint32_t *)(void *)s->prob, m, w);
	if (p->top_k > 0 && p->top_k < m)
		m = p->top_k;
	double *pr = s->prob, sum = 0;
	for (int i = 0; i < m; i++) {
		pr[i] = exp(((double)w[idx[i]] - mx) / p->temperature);
		sum += pr[i];
	}
	if (p->top_p < 1.0f) {          /* smallest prefix with mass >= top_p */
		double c = 0;
		int k = 0;
		while (k < m) {
			c += pr[k++] / sum;
			if (c >= p->top_p)
				break;
		}
		m = k;
	}
	if (p->min_p > 0) {             /* p >= min_p * p_max */
		int k = 1;
		while (k < m && pr[k] >= p->min_p * pr[0])
			k++;
		m = k;
	}
	sum = 0;
	for (int i = 0; i < m; i++)
		sum += pr[i];
	*psum = sum;
	return m;
}

/* OUT's log-probs (raw distribution) for token TOK. */
static void fill_out(struct llm_sampler *s, const float *logits, int32_t tok, struct llm_sample_out *out)
{
	out->token = tok;
	out->logprob = s->p.skip_logprob ? NAN : (float)llm_logprob(logits, s->n_vocab, tok);
	out->n_top = s->p.n_logprobs ? llm_top_logprobs(logits, s->n_vocab, s->p.n_logprobs, out->top) : 0;
}

enum llm_status llm_sampler_sample(struct llm_sampler *s, const float *logits, struct llm_sample_out *out)
{
	const float *w;
	LLM_TRY(adjust(s, logits, &w));
	int n = s->n_vocab;
	int32_t tok = 0;
	if (s->p.temperature == 0) {
		tok = llm_argmax(w, n);
	} else {
		double sum;
		int m = candidates(s, w, &sum);
		const int32_t *idx = s->idx;
		const double *pr = s->prob;
		double r = llm_rng_uniform(s->rng) * sum, c = 0;
		tok = idx[m - 1];
		for (int i = 0; i < m; i++) {
			c += pr[i];
			if (r < c) {
				tok = idx[i];
				break;
			}
		}
	}
	fill_out(s, logits, tok, out);
	return LLM_OK;
}

enum llm_status llm_sampler_dist(struct llm_sampler *s, const float *logits, float *prob)
{
	const float *w;
	LLM_TRY(adjust(s, logits, &w));
	int n = s->n_vocab;
	memset(prob, 0, (size_t)n * sizeof *prob);
	if (s->p.temperature == 0) {
		prob[llm_argmax(w, n)] = 1.0f;
		return LLM_OK;
	}
	double sum;
	int m = candidates(s, w, &sum);
	for (int i = 0; i < m; i++)
		prob[s->idx[i]] = (float)(s->prob[i] / sum);
	return LLM_OK;
}

int32_t llm_spec_reject(const float *p, const float *q, int n, int32_t x, uint64_t rng[4], int *accepted)
{
	/* accept with min(1, p(x) / q(x)); x was drawn from q, so q(x) > 0
	 * (q(x) == 0 would be a caller's bug: then accepted when p(x) > 0) */
	double px = p[x], qx = q[x], u = llm_rng_uniform(rng);
	if (px > 0 && (qx <= px || u * qx < px)) {
		*accepted = 1;
		return x;
	}
	*accepted = 0;
	/* residual norm(max(0, p - q)), summed in double; where rounding leaves
	 * it empty (p == q up to float), p itself */
	double total = 0, rp = 0, v = llm_rng_uniform(rng);
	for (int i = 0; i < n; i++) {
		double d = (double)p[i] - (double)q[i];
		total += d > 0 ? d : 0;
		rp += p[i];
	}
	double r = v * total, c = 0;
	int32_t last = -1;
	if (total > 0) {
		for (int i = 0; i < n; i++) {
			double d = (double)p[i] - (double)q[i];
			if (d <= 0)
				continue;
			c += d;
			last = i;
			if (r < c)
				return i;
		}
		return last;
	}
	r = v * rp;
	c = 0;
	for (int i = 0; i < n; i++) {
		if (p[i] <= 0)
			continue;
		c += p[i];
		last = i;
		if (r < c)
			return i;
	}
	return last < 0 ? x : last;
}

enum llm_status llm_sampler_verify(struct llm_sampler *s, const float *logits, const float *q, int32_t x,
                                   struct llm_sample_out *out, int *accepted)
{
	if (!s->dist && !(s->dist = malloc((size_t)s->n_vocab * sizeof *s->dist)))
		return llm_fail(LLM_ERR_NOMEM, "sampler: out of memory");
	LLM_TRY(llm_sampler_dist(s, logits, s->dist));
	fill_out(s, logits, llm_spec_reject(s->dist, q, s->n_vocab, x, s->rng, accepted), out);
	return LLM_OK;
}
