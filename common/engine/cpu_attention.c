/* common/engine/cpu_attention.c: the CPU backend's attention over one KV block
 * (scores q . k / scale and the weighted sum of values, AVX-512 and AVX2,
 * for 1 to 4 heads sharing a KV head), E4M3 cache rows to f32, and the e^x
 * they and SwiGLU use: llm_cpu_exp,
 * llm_cpu_silu_mul and llm_cpu_softmax (backend.h).
 *
 * Guarantees: every level gives the same bits. A score equals
 * llm_cpu_dot(isa, q, k) / scale, e^x is one sequence of f32 operations a
 * lane at a time, eight or sixteen, and the softmax sum is taken in one fixed
 * order (see each section). The attention helpers also run at AVX2 (d_head
 * a multiple of 8), with the bits of the loops of backend_cpu.c at that
 * level, and there read E4M3 rows in place (the bits of the rows
 * llm_cpu_e4m3_rows decodes); a caller below AVX2, or with another d_head,
 * gets false from llm_cpu_attn_* and runs those loops (llm_cpu_attn_reads
 * says which rows a level reads). */
#include "backend.h"

#include <math.h>
#include <immintrin.h>
#include "cpu_simd.h"
#include "banned.h"

/* ---- attention over one KV block ---------------------------------------
 * The scores and the weighted sum of values, a run of positions whose rows
 * are KSTRIDE elements apart (F32 or BF16; bf16 -> f32 is exact; E4M3 at
 * AVX2, below). A score is
 * llm_cpu_dot(isa, q, k) / scale bit for bit (four positions share the lane
 * reduction, in the same pairs), and o[i] = fmaf(a, v[i], o[i]), positions
 * in order (one rounding per term; the loops below AVX-512 in backend_cpu.c
 * round the product too). */

T512 static INL __m512 kv_load_512(const void *base, enum llm_dtype dt, size_t off, __mmask16 m)
{
	if (dt == LLM_DTYPE_F32)
		return _mm512_maskz_loadu_ps(m, (const float *)base + off);
	__m512i v = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, (const uint16_t *)base + off));
	return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
}

/* NH heads (compile-time at each call) over 4 positions at a time: the
 * four key rows are loaded once per 16 columns, each head's four lane sums
 * reduced in the pairs of reduce4_512. */
T512 static INL void scores_512(float *att, size_t as, const float *q, const int nh, const void *k,
                                enum llm_dtype dt, int64_t ks, int n_pos, int d, float scale)
{
	int p = 0;
	for (; p + 4 <= n_pos; p += 4) {
		__m512 a[4][4];
#pragma GCC unroll 4
		for (int j = 0; j < nh; j++)
#pragma GCC unroll 4
			for (int u = 0; u < 4; u++)
				a[j][u] = _mm512_setzero_ps();
		size_t o = (size_t)p * (size_t)ks;
		for (int c = 0; c < d; c += 16) {
			int left = d - c;
			__mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
			__m512 kv[4];
#pragma GCC unroll 4
			for (int u = 0; u < 4; u++)
				kv[u] = kv_load_512(k, dt, o + (size_t)u * (size_t)ks + (size_t)c, m);
#pragma GCC unroll 4
			for (int j = 0; j < nh; j++) {
				__m512 qv = _mm512_maskz_loadu_ps(m, q + (size_t)j * (size_t)d + c);
#pragma GCC unroll 4
				for (int u = 0; u < 4; u++)
					a[j][u] = _mm512_fmadd_ps(qv, kv[u], a[j][u]);
			}
		}
#pragma GCC unroll 4
		for (int j = 0; j < nh; j++) {
			/* reduce4_512 without the bf16 target: the same pairs */
			__m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a[j][0], a[j][1], 0x44),
			                          _mm512_shuffle_f32x4(a[j][0], a[j][1], 0xee));
			__m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(a[j][2], a[j][3], 0x44),
			                          _mm512_shuffle_f32x4(a[j][2], a[j][3], 0xee));
			__m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
			s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4e));
			s = _mm512_add_ps(s, _mm512_permute_ps(s, 0xb1));
			s = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s);
			_mm_storeu_ps(att + (size_t)j * as + p, _mm_div_ps(_mm512_castps512_ps128(s), _mm_set1_ps(scale)));
		}
	}
	for (; p < n_pos; p++) {
		size_t o = (size_t)p * (size_t)ks;
#pragma GCC unroll 4
		for (int j = 0; j < nh; j++) {
			__m512 a0 = _mm512_setzero_ps();
			for (int c = 0; c < d; c += 16) {
				int left = d - c;
				__mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
				a0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + (size_t)j * (size_t)d + c),
				                     kv_load_512(k, dt, o + (size_t)c, m), a0);
			}
			att[(size_t)j * as + p] = _mm512_reduce_add_ps(a0) / scale;
		}
	}
}

/* NH heads, 64 columns of each in registers: a value row is loaded once
 * for all of them. */
T512 static INL void wsum_512(float *out, const int nh, const float *att, size_t as, const void *v,
                              enum llm_dtype dt, int64_t vs, int n_pos, int d, int c0, int c1)
{
	for (int c = c0; c < c1; c += 64) {
		__mmask16 m[4];
		__m512 o[4][4];
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++) {
			int left = c1 - c - 16 * i;
			m[i] = left >= 16 ? (__mmask16)0xffff : left <= 0 ? 0 : (__mmask16)((1u << left) - 1);
#pragma GCC unroll 4
			for (int j = 0; j < nh; j++)
				o[j][i] = _mm512_maskz_loadu_ps(m[i], out + (size_t)j * (size_t)d + c + 16 * i);
		}
		for (int p = 0; p < n_pos; p++) {
			size_t off = (size_t)p * (size_t)vs + (size_t)c;
			__m512 vv[4];
#pragma GCC unroll 4
			for (int i = 0; i < 4; i++)
				vv[i] = kv_load_512(v, dt, off + 16 * (size_t)i, m[i]);
#pragma GCC unroll 4
			for (int j = 0; j < nh; j++) {
				__m512 a = _mm512_set1_ps(att[(size_t)j * as + p]);
#pragma GCC unroll 4
				for (int i = 0; i < 4; i++)
					o[j][i] = _mm512_fmadd_ps(a, vv[i], o[j][i]);
			}
		}
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
			for (int j = 0; j < nh; j++)
				_mm512_mask_storeu_ps(out + (size_t)j * (size_t)d + c + 16 * i, m[i], o[j][i]);
	}
}

#define ATTN_NH(F, nh, ...)                                            \
	switch (nh) {                                                  \
	case 1: F(__VA_ARGS__, 1); break;                              \
	case 2: F(__VA_ARGS__, 2); break;                              \
	case 3: F(__VA_ARGS__, 3); break;                              \
	default: F(__VA_ARGS__, 4); break;                             \
	}

T512 static void scores_512_n(float *att, size_t as, const float *q, int nh, const void *k,
                              enum llm_dtype dt, int64_t ks, int n_pos, int d, float scale)
{
#define SC(dummy, NH) scores_512(att, as, q, NH, k, dt, ks, n_pos, d, scale)
	ATTN_NH(SC, nh, 0)
#undef SC
}

T512 static void wsum_512_n(float *out, int nh, const float *att, size_t as, const void *v,
                            enum llm_dtype dt, int64_t vs, int n_pos, int d, int c0, int c1)
{
#define WS(dummy, NH) wsum_512(out, NH, att, as, v, dt, vs, n_pos, d, c0, c1)
	ATTN_NH(WS, nh, 0)
#undef WS
}

/* ---- the same at AVX2 ----------------------------------------------------
 * For d a multiple of 8. A score is dot_avx2's (cpu_matmul.c) bit for bit:
 * one 8-lane FMA accumulator over the columns in order, its lanes added as
 * hsum_256 adds them, then / scale. A BF16 row becomes f32 by widening each
 * element to 32 bits and shifting it up 16 (exact), eight at a time. The
 * weighted sum rounds the product, then adds it (o[i] += a * v[i], as the
 * portable loops of backend_cpu.c do), positions in order, so AVX2 gives
 * the bits it gave before these helpers. Several positions (scores) or
 * column groups (weighted sum) run side by side: independent FMA/add
 * chains, a key or value row loaded once for the NH heads. */

/* eight E4M3 codes to f32 times S (the row's scale * 256): the code c =
 * s eeee mmm becomes the half s 0 eeee mmm 0000000 ((c + (c & 0x80)) << 7
 * moves the sign up one bit), whose value is e4m3(c) * 2^-8, subnormals
 * included; see llm_cpu_e4m3_rows below for why the product is exact */
T256 static INL __m256 e4m3_8(const uint8_t *c, __m256 s)
{
	__m128i w = _mm_cvtepu8_epi16(_mm_loadl_epi64((const __m128i *)c));
	__m128i h = _mm_slli_epi16(_mm_add_epi16(w, _mm_and_si128(w, _mm_set1_epi16(0x80))), 7);
	return _mm256_mul_ps(_mm256_cvtph_ps(h), s);
}

/* eight elements of a row at OFF; S: the row's scale * 256 (E4M3 only) */
T256 static INL __m256 kv_load_256(const void *base, enum llm_dtype dt, size_t off, __m256 s)
{
	if (dt == LLM_DTYPE_F32)
		return _mm256_loadu_ps((const float *)base + off);
	if (dt == LLM_DTYPE_E4M3)
		return e4m3_8((const uint8_t *)base + off, s);
	__m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)base + off));
	return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* the scale of row P as kv_load_256 takes it (E4M3; else unused) */
T256 static INL __m256 kv_scale_256(enum llm_dtype dt, const float *sc, size_t ss, int p)
{
	return dt == LLM_DTYPE_E4M3 ? _mm256_set1_ps(sc[(size_t)p * ss] * 256.0f) : _mm256_setzero_ps();
}

/* the lane sum of dot_avx2 (cpu_matmul.c: hsum_256), the same adds */
T256 static INL float hsum8_256(__m256 v)
{
	__m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
	s = _mm_add_ps(s, _mm_movehl_ps(s, s));
	s = _mm_add_ss(s, _mm_movehdup_ps(s));
	return _mm_cvtss_f32(s);
}

/* Four lane sums at once, each with hsum8_256's adds in its pairs: per
 * vector y_i = x_i + x_(i+4), then (y_0 + y_2) + (y_1 + y_3). */
T256 static INL __m128 hsum8x4_256(__m256 a0, __m256 a1, __m256 a2, __m256 a3)
{
	__m256 y01 = _mm256_add_ps(_mm256_permute2f128_ps(a0, a1, 0x20), _mm256_permute2f128_ps(a0, a1, 0x31));
	__m256 y23 = _mm256_add_ps(_mm256_permute2f128_ps(a2, a3, 0x20), _mm256_permute2f128_ps(a2, a3, 0x31));
	/* lanes [y0_0 + y0_2, y0_1 + y0_3, y2_0 + y2_2, y2_1 + y2_3 | the same of y1, y3] */
	__m256 h = _mm256_add_ps(_mm256_shuffle_ps(y01, y23, 0x44), _mm256_shuffle_ps(y01, y23, 0xee));
	h = _mm256_hadd_ps(h, h);                      /* [s0, s2, s0, s2 | s1, s3, s1, s3] */
	return _mm_unpacklo_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
}

/* NH heads over NP positions from P (both compile-time at each call) */
T256 static INL void scores_256_np(float *att, size_t as, const float *q, const int nh, const void *k,
                                   const enum llm_dtype dt, int64_t ks, const float *sc, size_t ss, int p,
                                   const int np, int d, float scale)
{
	__m256 a[4][4], s[4];
#pragma GCC unroll 4
	for (int u = 0; u < np; u++)
		s[u] = kv_scale_256(dt, sc, ss, p + u);
#pragma GCC unroll 4
	for (int j = 0; j < nh; j++)
#pragma GCC unroll 4
		for (int u = 0; u < np; u++)
			a[j][u] = _mm256_setzero_ps();
	size_t o = (size_t)p * (size_t)ks;
	for (int c = 0; c < d; c += 8) {
		__m256 qv[4];
#pragma GCC unroll 4
		for (int j = 0; j < nh; j++)
			qv[j] = _mm256_loadu_ps(q + (size_t)j * (size_t)d + c);
		/* one key row at a time: NH query vectors, one row and
		 * NH * NP accumulators (3 heads: 3 + 1 + 12 registers) */
#pragma GCC unroll 4
		for (int u = 0; u < np; u++) {
			__m256 kv = kv_load_256(k, dt, o + (size_t)u * (size_t)ks + (size_t)c, s[u]);
#pragma GCC unroll 4
			for (int j = 0; j < nh; j++)
				a[j][u] = _mm256_fmadd_ps(qv[j], kv, a[j][u]);
		}
	}
	if (np == 4) {
#pragma GCC unroll 4
		for (int j = 0; j < nh; j++)
			_mm_storeu_ps(att + (size_t)j * as + (size_t)p,
			              _mm_div_ps(hsum8x4_256(a[j][0], a[j][1], a[j][2], a[j][3]), _mm_set1_ps(scale)));
		return;
	}
#pragma GCC unroll 4
	for (int j = 0; j < nh; j++)
#pragma GCC unroll 4
		for (int u = 0; u < np; u++)
			att[(size_t)j * as + (size_t)(p + u)] = hsum8_256(a[j][u]) / scale;
}

/* four positions a step for 1 to 3 heads (3: 12 accumulators, the 3 query
 * vectors and one key row fill the 16 registers), two for 4 heads or E4M3
 * rows at 3 (their scales take registers too) */
T256 static INL void scores_256(float *att, size_t as, const float *q, const int nh, const void *k,
                                const enum llm_dtype dt, int64_t ks, const float *sc, size_t ss, int n_pos,
                                int d, float scale)
{
	const int np = nh <= 2 || (nh == 3 && dt != LLM_DTYPE_E4M3) ? 4 : 2;
	int p = 0;
	for (; p + np <= n_pos; p += np)
		scores_256_np(att, as, q, nh, k, dt, ks, sc, ss, p, np, d, scale);
	for (; p < n_pos; p++)
		scores_256_np(att, as, q, nh, k, dt, ks, sc, ss, p, 1, d, scale);
}

/* NH heads, NC groups of 8 columns from C (both compile-time at each call) */
T256 static INL void wsum_256_nc(float *out, const int nh, const float *att, size_t as, const void *v,
                                 const enum llm_dtype dt, int64_t vs, const float *sc, size_t ss, int n_pos,
                                 int d, int c, const int nc)
{
	__m256 o[4][4];
#pragma GCC unroll 4
	for (int j = 0; j < nh; j++)
#pragma GCC unroll 4
		for (int i = 0; i < nc; i++)
			o[j][i] = _mm256_loadu_ps(out + (size_t)j * (size_t)d + c + 8 * i);
	for (int p = 0; p < n_pos; p++) {
		size_t off = (size_t)p * (size_t)vs + (size_t)c;
		__m256 vv[4], s = kv_scale_256(dt, sc, ss, p);
#pragma GCC unroll 4
		for (int i = 0; i < nc; i++)
			vv[i] = kv_load_256(v, dt, off + 8 * (size_t)i, s);
#pragma GCC unroll 4
		for (int j = 0; j < nh; j++) {
			__m256 a = _mm256_set1_ps(att[(size_t)j * as + p]);
#pragma GCC unroll 4
			for (int i = 0; i < nc; i++)
				o[j][i] = _mm256_add_ps(o[j][i], _mm256_mul_ps(a, vv[i]));
		}
	}
#pragma GCC unroll 4
	for (int j = 0; j < nh; j++)
#pragma GCC unroll 4
		for (int i = 0; i < nc; i++)
			_mm256_storeu_ps(out + (size_t)j * (size_t)d + c + 8 * i, o[j][i]);
}

/* 32 columns a pass for 1 or 2 heads, 16 for 3 or 4, then 8 at a time */
T256 static INL void wsum_256(float *out, const int nh, const float *att, size_t as, const void *v,
                              const enum llm_dtype dt, int64_t vs, const float *sc, size_t ss, int n_pos, int d,
                              int c0, int c1)
{
	const int nc = nh <= 2 ? 4 : 2;
	int c = c0;
	for (; c + 8 * nc <= c1; c += 8 * nc)
		wsum_256_nc(out, nh, att, as, v, dt, vs, sc, ss, n_pos, d, c, nc);
	for (; c < c1; c += 8)
		wsum_256_nc(out, nh, att, as, v, dt, vs, sc, ss, n_pos, d, c, 1);
}

/* each (dtype, heads) its own code: the row loads and the unrolling are
 * fixed at compile time */
#define ATTN_DT(F, dt, nh)                                                     \
	switch (dt) {                                                          \
	case LLM_DTYPE_F32: ATTN_NH(F, nh, LLM_DTYPE_F32) break;               \
	case LLM_DTYPE_E4M3: ATTN_NH(F, nh, LLM_DTYPE_E4M3) break;             \
	default: ATTN_NH(F, nh, LLM_DTYPE_BF16) break;                         \
	}

T256 static void scores_256_n(float *att, size_t as, const float *q, int nh, const void *k,
                              enum llm_dtype dt, int64_t ks, const float *sc, size_t ss, int n_pos, int d,
                              float scale)
{
#define SC(DT, NH) scores_256(att, as, q, NH, k, DT, ks, sc, ss, n_pos, d, scale)
	ATTN_DT(SC, dt, nh)
#undef SC
}

T256 static void wsum_256_n(float *out, int nh, const float *att, size_t as, const void *v,
                            enum llm_dtype dt, int64_t vs, const float *sc, size_t ss, int n_pos, int d,
                            int c0, int c1)
{
#define WS(DT, NH) wsum_256(out, NH, att, as, v, DT, vs, sc, ss, n_pos, d, c0, c1)
	ATTN_DT(WS, dt, nh)
#undef WS
}

bool llm_cpu_attn_reads(enum llm_cpu_isa isa, enum llm_dtype dt, int d)
{
	if (isa >= LLM_ISA_AVX512)
		return dt == LLM_DTYPE_F32 || dt == LLM_DTYPE_BF16;
	return isa == LLM_ISA_AVX2 && d % 8 == 0
	       && (dt == LLM_DTYPE_F32 || dt == LLM_DTYPE_BF16 || dt == LLM_DTYPE_E4M3);
}

bool llm_cpu_attn_scores(enum llm_cpu_isa isa, float *att, size_t att_stride, const float *q, int nh,
                         const void *k, enum llm_dtype dt, int64_t k_stride, const float *k_scale,
                         size_t k_scale_stride, int n_pos, int d, float scale)
{
	if (nh < 1 || nh > 4 || !llm_cpu_attn_reads(isa, dt, d))
		return false;
	if (isa >= LLM_ISA_AVX512)
		scores_512_n(att, att_stride, q, nh, k, dt, k_stride, n_pos, d, scale);
	else
		scores_256_n(att, att_stride, q, nh, k, dt, k_stride, k_scale, k_scale_stride, n_pos, d, scale);
	return true;
}

bool llm_cpu_attn_wsum(enum llm_cpu_isa isa, float *out, int nh, const float *att, size_t att_stride,
                       const void *v, enum llm_dtype dt, int64_t v_stride, const float *v_scale,
                       size_t v_scale_stride, int n_pos, int d, int c0, int c1)
{
	if (nh < 1 || nh > 4 || !llm_cpu_attn_reads(isa, dt, d) || c0 < 0 || c1 > d || c0 > c1
	    || (isa < LLM_ISA_AVX512 && (c0 % 8 || c1 % 8)))
		return false;
	if (isa >= LLM_ISA_AVX512)
		wsum_512_n(out, nh, att, att_stride, v, dt, v_stride, n_pos, d, c0, c1);
	else
		wsum_256_n(out, nh, att, att_stride, v, dt, v_stride, v_scale, v_scale_stride, n_pos, d, c0, c1);
	return true;
}

/* ---- E4M3 cache rows to f32 ----------------------------------------------
 * dst = e4m3(code) * scale, one f32 rounding of the exact product: the
 * table lookup times the scale, or at AVX2 (F16C) the code placed in a
 * half (exponent bias 15 against 7, so its value times 2^-8, subnormals
 * included) widened to f32 and times scale * 256: both factors move by a
 * power of two (exact; scale * 256 cannot overflow, scale <= FLT_MAX / 448),
 * so the exact product and its rounding are the same. Code 0x7f, which
 * only a NaN input writes, reads as NaN on the table and 480 on F16C. */

T256 static void e4m3_rows_256(float *dst, const uint8_t *src, size_t ss, const float *scale, size_t sc,
                               int n_rows, int d)
{
	for (int r = 0; r < n_rows; r++) {
		const uint8_t *c = src + (size_t)r * ss;
		float *o = dst + (size_t)r * (size_t)d;
		__m256 s = _mm256_set1_ps(scale[(size_t)r * sc] * 256.0f);
		int i = 0;
		for (; i + 8 <= d; i += 8)
			_mm256_storeu_ps(o + i, e4m3_8(c + i, s));
		for (; i < d; i++)
			o[i] = llm_e4m3_table[c[i]] * scale[(size_t)r * sc];
	}
}

void llm_cpu_e4m3_rows(enum llm_cpu_isa isa, float *dst, const uint8_t *src, size_t src_stride,
                       const float *scale, size_t scale_stride, int n_rows, int d)
{
	if (isa >= LLM_ISA_AVX2) {
		e4m3_rows_256(dst, src, src_stride, scale, scale_stride, n_rows, d);
		return;
	}
	for (int r = 0; r < n_rows; r++)
		for (int i = 0; i < d; i++)
			dst[(size_t)r * (size_t)d + (size_t)i] = llm_e4m3_table[src[(size_t)r * src_stride + (size_t)i]]
			                                         * scale[(size_t)r * scale_stride];
}

T256 static void bf16_rows_256(float *dst, const uint16_t *src, size_t n)
{
	size_t i = 0;
	for (; i + 16 <= n; i += 16) {
		__m256i h = _mm256_loadu_si256((const __m256i *)(src + i));
		__m256i lo = _mm256_cvtepu16_epi32(_mm256_castsi256_si128(h));
		__m256i hi = _mm256_cvtepu16_epi32(_mm256_extracti128_si256(h, 1));
		_mm256_storeu_ps(dst + i, _mm256_castsi256_ps(_mm256_slli_epi32(lo, 16)));
		_mm256_storeu_ps(dst + i + 8, _mm256_castsi256_ps(_mm256_slli_epi32(hi, 16)));
	}
	llm_to_f32(dst + i, src + i, LLM_DTYPE_BF16, n - i);
}

void llm_cpu_bf16_rows(enum llm_cpu_isa isa, float *dst, const uint16_t *src, size_t n)
{
	if (isa >= LLM_ISA_AVX2)
		bf16_rows_256(dst, src, n);
	else
		llm_to_f32(dst, src, LLM_DTYPE_BF16, n);
}

/* ---- e^x for the softmax and SiLU ---------------------------------------
 * One sequence of f32 operations, run a lane at a time (fmaf), eight (AVX2) or sixteen
 * (AVX-512) with the same bits: range reduction by ln 2 in two parts
 * (t = rint(x log2 e)), a degree-6 polynomial for e^r, then times 2^t,
 * exact because the input is clamped to [-87, 88] where every result is a
 * normal float (e^-87 = 1.6e-38 stands in for anything smaller, e^88 for
 * anything larger; NaN gives e^88). Within 2 ulp of e^x (test_ops measures
 * it); libm expf had to run one call per element. */

static const float EXP_LO = -87.0f, EXP_HI = 88.0f, EXP_L2E = 1.44269504089f;
static const float EXP_C1 = 0.693359375f, EXP_C2 = -2.12194440e-4f;
static const float EXP_P[6] = { 1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f };

static INL float exp_1(float x)
{
	x = x < EXP_HI ? x : EXP_HI;   /* fminf, fmaxf, NaN included (to EXP_HI), without their libm calls */
	x = x > EXP_LO ? x : EXP_LO;
	float t = rintf(x * EXP_L2E);
	float r = fmaf(-t, EXP_C2, fmaf(-t, EXP_C1, x));
	float p = fmaf(EXP_P[0], r, EXP_P[1]);
	p = fmaf(p, r, EXP_P[2]);
	p = fmaf(p, r, EXP_P[3]);
	p = fmaf(p, r, EXP_P[4]);
	p = fmaf(p, r, EXP_P[5]);
	p = fmaf(p * r, r, r + 1.0f);
	union { uint32_t u; float f; } two = { (uint32_t)((int32_t)t + 127) << 23 };
	return p * two.f;
}

T512 static INL __m512 exp_512(__m512 x)
{
	x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(EXP_HI)), _mm512_set1_ps(EXP_LO));
	__m512 t = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(EXP_L2E)),
	                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m512 r = _mm512_fnmadd_ps(t, _mm512_set1_ps(EXP_C2), _mm512_fnmadd_ps(t, _mm512_set1_ps(EXP_C1), x));
	__m512 p = _mm512_fmadd_ps(_mm512_set1_ps(EXP_P[0]), r, _mm512_set1_ps(EXP_P[1]));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P[2]));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P[3]));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P[4]));
	p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(EXP_P[5]));
	p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
	__m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(t), _mm512_set1_epi32(127)), 23);
	return _mm512_mul_ps(p, _mm512_castsi512_ps(e));
}

float llm_cpu_exp(float x)
{
	return exp_1(x);
}

T512 static void silu_mul_512(float *o, const float *g, const float *u, int64_t n)
{
	const __m512 one = _mm512_set1_ps(1.0f);
	for (int64_t i = 0; i < n; i += 16) {
		int64_t left = n - i;
		__mmask16 k = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
		__m512 v = _mm512_maskz_loadu_ps(k, g + i);
		__m512 e = exp_512(_mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(v), _mm512_set1_epi32((int)0x80000000u))));
		v = _mm512_mul_ps(v, _mm512_div_ps(one, _mm512_add_ps(one, e)));
		_mm512_mask_storeu_ps(o + i, k, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(k, u + i)));
	}
}

/* The portable loop; silu_mul_256 below is its AVX2 twin. */
static INL void silu_mul_1(float *o, const float *g, const float *u, int64_t n)
{
	for (int64_t i = 0; i < n; i++) {
		float v = g[i];
		v *= 1.0f / (1.0f + exp_1(-v));
		o[i] = v * u[i];
	}
}

T256 static void silu_mul_256(float *o, const float *g, const float *u, int64_t n);

void llm_cpu_silu_mul(enum llm_cpu_isa isa, float *o, const float *g, const float *u, int64_t n)
{
	if (isa >= LLM_ISA_AVX512)
		silu_mul_512(o, g, u, n);
	else if (isa == LLM_ISA_AVX2)
		silu_mul_256(o, g, u, n);
	else
		silu_mul_1(o, g, u, n);
}

/* ---- softmax ------------------------------------------------------------
 * a[i] = e^(a[i] - max) / sum in place, the sum taken in 16 lanes (lane l
 * adds elements l, l + 16, ... in order) and the lanes added in the tree of
 * _mm512_reduce_add_ps (l + l+8, then +4, +2, +1): one order for the vector
 * code and its scalar twin, so every ISA gives the same bits. Returns the
 * sum. */
T512 static float softmax_512(float *a, int64_t n)
{
	__m512 vm = _mm512_set1_ps(a[0]);
	int64_t i = 0;
	for (; i + 16 <= n; i += 16)
		vm = _mm512_max_ps(_mm512_loadu_ps(a + i), vm);
	float mx = _mm512_reduce_max_ps(vm);
	for (; i < n; i++)
		if (a[i] > mx)
			mx = a[i];
	if (a[0] != a[0])
		mx = a[0];
	const __m512 m = _mm512_set1_ps(mx);
	__m512 acc = _mm512_setzero_ps();
	for (i = 0; i < n; i += 16) {
		int64_t left = n - i;
		__mmask16 k = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
		__m512 e = _mm512_maskz_mov_ps(k, exp_512(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, a + i), m)));
		_mm512_mask_storeu_ps(a + i, k, e);
		acc = _mm512_add_ps(acc, e);
	}
	__m256 s8 = _mm256_add_ps(_mm512_castps512_ps256(acc),
	                          _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1)));
	__m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
	__m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
	float sum = _mm_cvtss_f32(s2) + _mm_cvtss_f32(_mm_shuffle_ps(s2, s2, 1));
	const __m512 sv = _mm512_set1_ps(sum);
	for (i = 0; i < n; i += 16) {
		int64_t left = n - i;
		__mmask16 k = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
		_mm512_mask_storeu_ps(a + i, k, _mm512_div_ps(_mm512_maskz_loadu_ps(k, a + i), sv));
	}
	return sum;
}

static INL float softmax_1(float *a, int64_t n)
{
	float mx = a[0], lane[16] = { 0 };
	for (int64_t i = 1; i < n; i++)
		if (a[i] > mx)
			mx = a[i];
	for (int64_t i = 0; i < n; i++) {
		a[i] = exp_1(a[i] - mx);
		lane[i % 16] += a[i];
	}
	for (int l = 0; l < 8; l++)
		lane[l] += lane[l + 8];
	for (int l = 0; l < 4; l++)
		lane[l] += lane[l + 4];
	lane[0] += lane[2];
	lane[1] += lane[3];
	float sum = lane[0] + lane[1];
	for (int64_t i = 0; i < n; i++)
		a[i] /= sum;
	return sum;
}

/* exp_1 eight lanes at a time: the same operations (min and max take the
 * bound when x is NaN, as exp_1's comparisons do; fnmadd(t, c, x) is
 * fmaf(-t, c, x); the round is rintf's, to nearest even), so the same bits */
T256 static INL __m256 exp_256(__m256 x)
{
	x = _mm256_max_ps(_mm256_min_ps(x, _mm256_set1_ps(EXP_HI)), _mm256_set1_ps(EXP_LO));
	__m256 t = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(EXP_L2E)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
	__m256 r = _mm256_fnmadd_ps(t, _mm256_set1_ps(EXP_C2), _mm256_fnmadd_ps(t, _mm256_set1_ps(EXP_C1), x));
	__m256 p = _mm256_fmadd_ps(_mm256_set1_ps(EXP_P[0]), r, _mm256_set1_ps(EXP_P[1]));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P[2]));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P[3]));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P[4]));
	p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(EXP_P[5]));
	p = _mm256_fmadd_ps(_mm256_mul_ps(p, r), r, _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
	__m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(t), _mm256_set1_epi32(127)), 23);
	return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

/* silu_mul_1 eight lanes at a time: exp_256 for exp_1, -v by the sign
 * bit, and the same divide and products (nothing fused: FP contraction is
 * off), so the same bits. The loop left to the compiler stayed scalar (4%
 * of a 16-sequence decode step on this VM). */
T256 static void silu_mul_256(float *o, const float *g, const float *u, int64_t n)
{
	const __m256 one = _mm256_set1_ps(1.0f), sign = _mm256_set1_ps(-0.0f);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8) {
		__m256 v = _mm256_loadu_ps(g + i);
		__m256 e = exp_256(_mm256_xor_ps(v, sign));
		v = _mm256_mul_ps(v, _mm256_div_ps(one, _mm256_add_ps(one, e)));
		_mm256_storeu_ps(o + i, _mm256_mul_ps(v, _mm256_loadu_ps(u + i)));
	}
	silu_mul_1(o + i, g + i, u + i, n - i);
}

/* softmax_1 in vectors: the max as its comparisons take it (max_ps keeps
 * the running max when an element is NaN, and a NaN a[0]; -0 and +0 give
 * the same e^x), lanes 0-7 and 8-15 of its sum in two accumulators kept in
 * registers (sixteen elements a pass; the last 1..15 masked, the elements
 * past n as +0, which adds nothing), the same tree. */
T256 static float softmax_256(float *a, int64_t n)
{
	__m256 vm = _mm256_set1_ps(a[0]);
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		vm = _mm256_max_ps(_mm256_loadu_ps(a + i), vm);
	__m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vm), _mm256_extractf128_ps(vm, 1));
	m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
	m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
	float mx = _mm_cvtss_f32(m4);
	for (; i < n; i++)
		if (a[i] > mx)
			mx = a[i];
	if (a[0] != a[0])
		mx = a[0];
	const __m256 m = _mm256_set1_ps(mx);
	__m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
	for (i = 0; i + 16 <= n; i += 16) {
		__m256 e0 = exp_256(_mm256_sub_ps(_mm256_loadu_ps(a + i), m));
		__m256 e1 = exp_256(_mm256_sub_ps(_mm256_loadu_ps(a + i + 8), m));
		_mm256_storeu_ps(a + i, e0);
		_mm256_storeu_ps(a + i + 8, e1);
		acc0 = _mm256_add_ps(acc0, e0);
		acc1 = _mm256_add_ps(acc1, e1);
	}
	const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
	for (int half = 0; i < n; i += 8, half++) {
		int64_t left = n - i;
		__m256i k = _mm256_cmpgt_epi32(_mm256_set1_epi32(left >= 8 ? 8 : (int)left), lane);
		__m256 e = _mm256_and_ps(exp_256(_mm256_sub_ps(_mm256_maskload_ps(a + i, k), m)), _mm256_castsi256_ps(k));
		_mm256_maskstore_ps(a + i, k, e);
		if (half)
			acc1 = _mm256_add_ps(acc1, e);
		else
			acc0 = _mm256_add_ps(acc0, e);
	}
	__m256 s8 = _mm256_add_ps(acc0, acc1);
	__m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
	__m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
	float sum = _mm_cvtss_f32(s2) + _mm_cvtss_f32(_mm_shuffle_ps(s2, s2, 1));
	const __m256 sv = _mm256_set1_ps(sum);
	for (i = 0; i + 8 <= n; i += 8)
		_mm256_storeu_ps(a + i, _mm256_div_ps(_mm256_loadu_ps(a + i), sv));
	for (; i < n; i++)
		a[i] /= sum;
	return sum;
}

float llm_cpu_softmax(enum llm_cpu_isa isa, float *a, int64_t n)
{
	if (n < 1)
		return 0.0f;
	if (isa >= LLM_ISA_AVX512)
		return softmax_512(a, n);
	return isa == LLM_ISA_AVX2 ? softmax_256(a, n) : softmax_1(a, n);
}
