/* common/cpu_matmul.c: CPU matrix kernels y = x . W^T for F32, F16, BF16 and
 * E4M3 (FP8, block scales) weights with F32 activations.
 *
 * Levels: scalar (the reference), AVX2+FMA+F16C, AVX-512 (F/BW/VL), and for
 * BF16 weights AVX512_BF16 dot products (activations rounded to BF16), chosen at
 * run time; every function with a target attribute is only called after
 * __builtin_cpu_supports() said yes, so the binary runs on any x86-64.
 *
 * Numerics, common to all levels:
 * - An element of W is dequantized to f32 exactly (F16, BF16 and E4M3 codes
 *   are exact in f32); an E4M3 element is then multiplied by its block scale,
 *   once, in f32 (code * scale rounded once: the same product on every level,
 *   the SIMD paths fold the 2^8 of the F16 trick into the scale, which is an
 *   exact power of two).
 * - Accumulation is f32. The scalar level sums c = 0, 1, ... in order (as
 *   llama2.c run.c does); SIMD levels keep one accumulator per lane over
 *   16 (AVX-512) or 8 (AVX2) column chunks and reduce the lanes at the end.
 * - Batch invariance: y[t, r] goes through exactly the same operations in
 *   the same order whatever the tile it is computed in (tiles of 1..4 tokens
 *   and 1..4 rows), so it does not depend on n_tok, the other tokens or the
 *   thread that computes it. */
#include "backend.h"

#include <math.h>
#include <immintrin.h>
#include "banned.h"

/* ---- shared helpers ---------------------------------------------------- */

static inline float weight_at(const struct llm_weight *w, int64_t r, int64_t c)
{
	size_t i = (size_t)r * (size_t)w->cols + (size_t)c;
	switch (w->dtype) {
	case LLM_DTYPE_F32:  return ((const float *)w->data)[i];
	case LLM_DTYPE_F16:  return llm_f16_to_f32(((const uint16_t *)w->data)[i]);
	case LLM_DTYPE_BF16: return llm_bf16_to_f32(((const uint16_t *)w->data)[i]);
	case LLM_DTYPE_E4M3: {
		float s = w->scale[(r / w->block_rows) * w->scale_cols + c / w->block_cols];
		return llm_e4m3_table[((const uint8_t *)w->data)[i]] * s;
	}
	default: return NAN;
	}
}

void llm_weight_row_f32(const struct llm_weight *w, int64_t r, float *out)
{
	if (w->dtype == LLM_DTYPE_F32) {
		const float *p = (const float *)w->data + (size_t)r * (size_t)w->cols;
		for (int64_t c = 0; c < w->cols; c++)
			out[c] = p[c];
		return;
	}
	for (int64_t c = 0; c < w->cols; c++)
		out[c] = weight_at(w, r, c);
}

/* ---- scalar reference -------------------------------------------------- */

static void matmul_scalar(float *y, int64_t ys, const float *x, int64_t xs, int64_t n_tok,
                          const struct llm_weight *w, int64_t r0, int64_t r1)
{
	int64_t n = w->cols;
	for (int64_t r = r0; r < r1; r++) {
		if (w->dtype == LLM_DTYPE_F32) {
			const float *wr = (const float *)w->data + (size_t)r * (size_t)n;
			for (int64_t t = 0; t < n_tok; t++) {
				const float *xt = x + t * xs;
				float acc = 0.0f;
				for (int64_t c = 0; c < n; c++)
					acc += wr[c] * xt[c];
				y[t * ys + r] = acc;
			}
			continue;
		}
		for (int64_t t = 0; t < n_tok; t++) {
			const float *xt = x + t * xs;
			float acc = 0.0f;
			for (int64_t c = 0; c < n; c++)
				acc += weight_at(w, r, c) * xt[c];
			y[t * ys + r] = acc;
		}
	}
}

float llm_cpu_dot(enum llm_cpu_isa isa, const float *a, const float *b, int64_t n);

/* ---- tile driver --------------------------------------------------------
 * Rows in blocks of RB (weights stay in cache while every token tile passes
 * over them), then token tiles of 4, rows in tiles of 4, remainders of 1. */
#define RB 64

#define DEFINE_DRIVER(name, tile)                                                           \
static void name(float *y, int64_t ys, const float *x, int64_t xs, int64_t n_tok,          \
                 const struct llm_weight *w, int64_t r0, int64_t r1)                       \
{                                                                                           \
	for (int64_t rb = r0; rb < r1; rb += RB) {                                          \
		int64_t re = rb + RB < r1 ? rb + RB : r1;                                   \
		for (int64_t t = 0; t < n_tok; ) {                                          \
			int nt = n_tok - t >= 4 ? 4 : 1;                                    \
			int64_t r = rb;                                                     \
			for (; r + 4 <= re; r += 4)                                         \
				tile(y + t * ys, ys, x + t * xs, xs, nt, 4, w, r);          \
			for (; r < re; r++)                                                 \
				tile(y + t * ys, ys, x + t * xs, xs, nt, 1, w, r);          \
			t += nt;                                                            \
		}                                                                           \
	}                                                                                   \
}

/* ---- AVX-512 ----------------------------------------------------------- */

#define T512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma,f16c")))
#define INL inline __attribute__((always_inline))

/* 16 E4M3 codes -> f32 * 2^-8, exactly: sign-extend to 16 bits, shift the
 * exponent and mantissa into F16 position (bit 14 then holds a copy of the
 * sign and is cleared), convert F16 -> F32 (subnormal codes become normal). */
T512 static INL __m512 e4m3x16_512(__m128i c)
{
	__m256i h = _mm256_cvtepi8_epi16(c);
	h = _mm256_and_si256(_mm256_slli_epi16(h, 7), _mm256_set1_epi16((short)0xbfff));
	return _mm512_cvtph_ps(h);
}

/* W[r, c .. c+16) (masked) as f32; E4M3 still needs the block scale. */
T512 static INL __m512 wload_512(const struct llm_weight *w, int64_t r, int64_t c, __mmask16 m)
{
	size_t i = (size_t)r * (size_t)w->cols + (size_t)c;
	switch (w->dtype) {
	case LLM_DTYPE_F32:
		return _mm512_maskz_loadu_ps(m, (const float *)w->data + i);
	case LLM_DTYPE_F16:
		return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w->data + i));
	case LLM_DTYPE_BF16: {
		__m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)w->data + i));
		return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
	}
	default:
		return e4m3x16_512(_mm_maskz_loadu_epi8(m, (const uint8_t *)w->data + i));
	}
}

T512 static INL void tile_512(float *y, int64_t ys, const float *x, int64_t xs,
                                 int nt, int nr, const struct llm_weight *w, int64_t r)
{
	__m512 acc[4][4];
	for (int i = 0; i < nr; i++)
		for (int t = 0; t < nt; t++)
			acc[i][t] = _mm512_setzero_ps();
	int64_t n = w->cols;
	int fp8 = w->dtype == LLM_DTYPE_E4M3;
	int64_t bk = fp8 ? w->block_cols : n;
	size_t esz = llm_dtype_size(w->dtype);
	const float *srow[4] = { 0 };
	if (fp8)
		for (int i = 0; i < nr; i++)
			srow[i] = w->scale + ((r + i) / w->block_rows) * w->scale_cols;
	for (int64_t c0 = 0; c0 < n; c0 += bk) {            /* scale blocks */
		int64_t ce = c0 + bk < n ? c0 + bk : n;
		__m512 sc[4];
		if (fp8)
			for (int i = 0; i < nr; i++)
				sc[i] = _mm512_set1_ps(srow[i][c0 / bk] * 256.0f);
		for (int64_t c = c0; c < ce; c += 16) {
			int64_t left = ce - c;
			__mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
			__m512 xv[4];
			for (int t = 0; t < nt; t++)
				xv[t] = _mm512_maskz_loadu_ps(m, x + t * xs + c);
			for (int i = 0; i < nr; i++) {
				/* the rows of the next tile, same columns: narrow rows
				 * (d_model 576) defeat the hardware prefetcher */
				_mm_prefetch((const char *)w->data + ((size_t)(r + nr + i) * (size_t)n + (size_t)c) * esz,
				             _MM_HINT_T0);
				__m512 wv = wload_512(w, r + i, c, m);
				if (fp8)
					wv = _mm512_mul_ps(wv, sc[i]);
				for (int t = 0; t < nt; t++)
					acc[i][t] = _mm512_fmadd_ps(xv[t], wv, acc[i][t]);
			}
		}
	}
	for (int i = 0; i < nr; i++)
		for (int t = 0; t < nt; t++)
			y[t * ys + r + i] = _mm512_reduce_add_ps(acc[i][t]);
}

/* Specialize the tile shapes so the accumulators live in registers. */
T512 static void tile_512_dispatch(float *y, int64_t ys, const float *x, int64_t xs,
                                   int nt, int nr, const struct llm_weight *w, int64_t r)
{
	if (nt == 4 && nr == 4)
		tile_512(y, ys, x, xs, 4, 4, w, r);
	else if (nt == 4)
		tile_512(y, ys, x, xs, 4, 1, w, r);
	else if (nr == 4)
		tile_512(y, ys, x, xs, 1, 4, w, r);
	else
		tile_512(y, ys, x, xs, 1, 1, w, r);
}

T512 DEFINE_DRIVER(matmul_avx512, tile_512_dispatch)

T512 static float dot_avx512(const float *a, const float *b, int64_t n)
{
	__m512 acc = _mm512_setzero_ps();
	for (int64_t c = 0; c < n; c += 16) {
		int64_t left = n - c;
		__mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
		acc = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, a + c), _mm512_maskz_loadu_ps(m, b + c), acc);
	}
	return _mm512_reduce_add_ps(acc);
}

/* ---- AVX-512 BF16: BF16 weights, activations rounded to BF16 ----------
 * vdpbf16ps multiplies bf16 pairs exactly and adds both products to an f32
 * lane: 32 multiply-adds per instruction and no weight conversion. The
 * activations are rounded to bf16 (nearest even) on the fly, a chunk of 32
 * at a time, which is the only numerical difference from the f32 path. */

#define TBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

TBF static INL void tile_bf16(float *y, int64_t ys, const float *x, int64_t xs,
                              int nt, int nr, const struct llm_weight *w, int64_t r)
{
	__m512 acc[4][4];
	for (int i = 0; i < nr; i++)
		for (int t = 0; t < nt; t++)
			acc[i][t] = _mm512_setzero_ps();
	int64_t n = w->cols;
	const uint16_t *wd = (const uint16_t *)w->data;
	for (int64_t c = 0; c < n; c += 32) {
		int64_t left = n - c;
		__mmask32 m = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1);
		__m512bh xv[4];
		for (int t = 0; t < nt; t++) {
			__m512 lo = _mm512_maskz_loadu_ps((__mmask16)m, x + t * xs + c);
			__m512 hi = _mm512_maskz_loadu_ps((__mmask16)(m >> 16), x + t * xs + c + 16);
			xv[t] = _mm512_cvtne2ps_pbh(hi, lo);
		}
		for (int i = 0; i < nr; i++) {
			_mm_prefetch((const char *)(wd + (size_t)(r + nr + i) * (size_t)n + (size_t)c), _MM_HINT_T0);
			__m512i wi = _mm512_maskz_loadu_epi16(m, wd + (size_t)(r + i) * (size_t)n + (size_t)c);
			__m512bh wv = (__m512bh)wi;
			for (int t = 0; t < nt; t++)
				acc[i][t] = _mm512_dpbf16_ps(acc[i][t], xv[t], wv);
		}
	}
	for (int i = 0; i < nr; i++)
		for (int t = 0; t < nt; t++)
			y[t * ys + r + i] = _mm512_reduce_add_ps(acc[i][t]);
}

TBF static void tile_bf16_dispatch(float *y, int64_t ys, const float *x, int64_t xs,
                                   int nt, int nr, const struct llm_weight *w, int64_t r)
{
	if (nt == 4 && nr == 4)
		tile_bf16(y, ys, x, xs, 4, 4, w, r);
	else if (nt == 4)
		tile_bf16(y, ys, x, xs, 4, 1, w, r);
	else if (nr == 4)
		tile_bf16(y, ys, x, xs, 1, 4, w, r);
	else
		tile_bf16(y, ys, x, xs, 1, 1, w, r);
}

TBF DEFINE_DRIVER(matmul_avx512bf16, tile_bf16_dispatch)

/* ---- AVX2 -------------------------------------------------------------- */

#define T256 __attribute__((target("avx2,fma,f16c")))

T256 static INL __m256i mask8_256(int64_t left)
{
	static const int32_t ramp[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
	int k = left >= 8 ? 8 : (int)left;
	return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_loadu_si256((const __m256i *)ramp));
}

/* The last partial chunk of a row is copied to a zero-padded buffer first,
 * so no load reads past the tensor. */
T256 static INL __m256 wload_256(const struct llm_weight *w, int64_t r, int64_t c, int64_t left)
{
	size_t i = (size_t)r * (size_t)w->cols + (size_t)c;
	int k = left >= 8 ? 8 : (int)left;
	switch (w->dtype) {
	case LLM_DTYPE_F32:
		if (k == 8)
			return _mm256_loadu_ps((const float *)w->data + i);
		return _mm256_maskload_ps((const float *)w->data + i, mask8_256(k));
	case LLM_DTYPE_F16:
	case LLM_DTYPE_BF16: {
		__m128i h;
		if (k == 8) {
			h = _mm_loadu_si128((const __m128i *)((const uint16_t *)w->data + i));
		} else {
			uint16_t buf[8] = { 0 };
			for (int j = 0; j < k; j++)
				buf[j] = ((const uint16_t *)w->data)[i + (size_t)j];
			h = _mm_loadu_si128((const __m128i *)buf);
		}
		if (w->dtype == LLM_DTYPE_F16)
			return _mm256_cvtph_ps(h);
		return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
	}
	default: {
		__m128i cv;
		if (k == 8) {
			cv = _mm_loadl_epi64((const __m128i *)((const uint8_t *)w->data + i));
		} else {
			uint8_t buf[16] = { 0 };
			for (int j = 0; j < k; j++)
				buf[j] = ((const uint8_t *)w->data)[i + (size_t)j];
			cv = _mm_loadu_si128((const __m128i *)buf);
		}
		__m128i h = _mm_cvtepi8_epi16(cv);
		h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16((short)0xbfff));
		return _mm256_cvtph_ps(h);
	}
	}
}

T256 static INL float hsum_256(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

T256 static INL void tile_256(float *y, int64_t ys, const float *x, int64_t xs,
                                 int nt, int nr, const struct llm_weight *w, int64_t r)
{
	__m256 acc[4][4];
	for (int i = 0; i < nr; i++)
		for (int t = 0; t < nt; t++)
			acc[i][t] = _mm256_setzero_ps();
	int64_t n = w->cols;
	int fp8 = w->dtype == LLM_DTYPE_E4M3;
	int64_t bk = fp8 ? w->block_cols : n;
	size_t esz = llm_dtype_size(w->dtype);
	const float *srow[4] = { 0 };
	if (fp8)
		for (int i = 0; i < nr; i++)
			srow[i] = w->scale + ((r + i) / w->block_rows) * w->scale_cols;
	for (int64_t c0 = 0; c0 < n; c0 += bk) {
		int64_t ce = c0 + bk < n ? c0 + bk : n;
		__m256 sc[4];
		if (fp8)
			for (int i = 0; i < nr; i++)
				sc[i] = _mm256_set1_ps(srow[i][c0 / bk] * 256.0f);
		for (int64_t c = c0; c < ce; c += 8) {
			int64_t left = ce - c;
			__m256 xv[4];
			if (left >= 8) {
				for (int t = 0; t < nt; t++)
					xv[t] = _mm256_loadu_ps(x + t * xs + c);
			} else {
				__m256i m = mask8_256(left);
				for (int t = 0; t < nt; t++)
					xv[t] = _mm256_maskload_ps(x + t * xs + c, m);
			}
			for (int i = 0; i < nr; i++) {
				_mm_prefetch((const char *)w->data + ((size_t)(r + nr + i) * (size_t)n + (size_t)c) * esz,
				             _MM_HINT_T0);
				__m256 wv = wload_256(w, r + i, c, left);
				if (fp8)
					wv = _mm256_mul_ps(wv, sc[i]);
				for (int t = 0; t < nt; t++)
					acc[i][t] = _mm256_fmadd_ps(xv[t], wv, acc[i][t]);
			}
		}
	}
	for (int i = 0; i < nr; i++)
		for (int t = 0; t < nt; t++)
			y[t * ys + r + i] = hsum_256(acc[i][t]);
}

T256 static void tile_256_dispatch(float *y, int64_t ys, const float *x, int64_t xs,
                                   int nt, int nr, const struct llm_weight *w, int64_t r)
{
	if (nt == 4 && nr == 4)
		tile_256(y, ys, x, xs, 4, 4, w, r);
	else if (nt == 4)
		tile_256(y, ys, x, xs, 4, 1, w, r);
	else if (nr == 4)
		tile_256(y, ys, x, xs, 1, 4, w, r);
	else
		tile_256(y, ys, x, xs, 1, 1, w, r);
}

T256 DEFINE_DRIVER(matmul_avx2, tile_256_dispatch)

T256 static float dot_avx2(const float *a, const float *b, int64_t n)
{
	__m256 acc = _mm256_setzero_ps();
	int64_t c = 0;
	for (; c + 8 <= n; c += 8)
		acc = _mm256_fmadd_ps(_mm256_loadu_ps(a + c), _mm256_loadu_ps(b + c), acc);
	if (c < n) {
		__m256i m = mask8_256(n - c);
		acc = _mm256_fmadd_ps(_mm256_maskload_ps(a + c, m), _mm256_maskload_ps(b + c, m), acc);
	}
	return hsum_256(acc);
}

/* ---- dispatch ---------------------------------------------------------- */

enum llm_cpu_isa llm_cpu_matmul_isa(enum llm_cpu_isa isa, enum llm_dtype t)
{
	if (isa >= LLM_ISA_AVX512BF16 && t == LLM_DTYPE_BF16)
		return LLM_ISA_AVX512BF16;
	if (isa >= LLM_ISA_AVX512)
		return LLM_ISA_AVX512;
	return isa < LLM_ISA_SCALAR ? LLM_ISA_SCALAR : isa;
}

void llm_cpu_matmul_rows(enum llm_cpu_isa isa, float *y, int64_t y_stride,
                         const float *x, int64_t x_stride, int64_t n_tok,
                         const struct llm_weight *w, int64_t r0, int64_t r1)
{
	switch (llm_cpu_matmul_isa(isa, w->dtype)) {
	case LLM_ISA_AVX512BF16:
		matmul_avx512bf16(y, y_stride, x, x_stride, n_tok, w, r0, r1);
		break;
	case LLM_ISA_AVX512:
		matmul_avx512(y, y_stride, x, x_stride, n_tok, w, r0, r1);
		break;
	case LLM_ISA_AVX2:
		matmul_avx2(y, y_stride, x, x_stride, n_tok, w, r0, r1);
		break;
	default:
		matmul_scalar(y, y_stride, x, x_stride, n_tok, w, r0, r1);
	}
}

float llm_cpu_dot(enum llm_cpu_isa isa, const float *a, const float *b, int64_t n)
{
	if (isa >= LLM_ISA_AVX512)
		return dot_avx512(a, b, n);
	if (isa == LLM_ISA_AVX2)
		return dot_avx2(a, b, n);
	float acc = 0.0f;
	for (int64_t i = 0; i < n; i++)
		acc += a[i] * b[i];
	return acc;
}
