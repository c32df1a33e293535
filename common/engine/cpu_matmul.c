/* common/engine/cpu_matmul.c: CPU matrix kernels y = x . W^T for F32, F16, BF16 and
 * E4M3 (FP8, block scales) weights with F32 activations.
 *
 * Levels: scalar (the reference), AVX2+FMA+F16C, AVX-512 (F/BW/VL), and for
 * BF16 and E4M3 weights AVX512_BF16 dot products (activations rounded to BF16,
 * an E4M3 element rounded to BF16 after its scale: see that section), chosen
 * at run time; every function with a target attribute is only called after
 * __builtin_cpu_supports() said yes, so the binary runs on any x86-64.
 *
 * Numerics, common to all levels:
 * - An element of W is dequantized to f32 exactly (F16, BF16 and E4M3 codes
 *   are exact in f32); an E4M3 element is then multiplied by its block scale,
 *   once, in f32 (code * scale rounded once: the same product on every level,
 *   the SIMD paths fold the 2^8 of the F16 trick into the scale, which is an
 *   exact power of two). The AVX512_BF16 level then rounds that product to
 *   bf16, as it rounds x. The AVX2 level instead multiplies x by the scale
 *   (rounded once: fl(x * s) * code, see "AVX2 E4M3: the block scale on the
 *   activations") for a weight whose scales are all plain, on every path.
 * - Accumulation is f32. The scalar level sums c = 0, 1, ... in order (as
 *   llama2.c run.c does); SIMD levels keep one accumulator per lane over
 *   16 (AVX-512) or 8 (AVX2) column chunks and reduce the lanes at the end.
 * - Batch invariance: y[t, r] goes through exactly the same operations in
 *   the same order whatever the tile it is computed in (tiles of 1..4 tokens
 *   and 1..4 rows; AVX2: 1..8 tokens for a decode, and for a prompt of 9+
 *   tokens 4 tokens x 3 rows over a panel of rows converted once, the
 *   columns in blocks whose accumulators are stored and reloaded exactly),
 *   so it does not depend on n_tok, the other tokens or the thread that
 *   computes it. */
#include "backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <immintrin.h>
#include "cpu_simd.h"
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

/* small loops over a tile's rows and tokens, unrolled so the accumulators
 * live in registers */
#define UNROLL _Pragma("GCC unroll 8")

#define DEFINE_DRIVER(name, tile) DEFINE_DRIVER_NR(name, tile, 4)
/* NR4: the rows of a 4-token tile (the registers decide: 16 accumulators
 * fit AVX-512's 32, not AVX2's 16); a 1-token tile takes 4 rows. */
#define DEFINE_DRIVER_NR(name, tile, NR4)                                                   \
static void name(float *y, int64_t ys, const float *x, int64_t xs, int64_t n_tok,          \
                 const struct llm_weight *w, int64_t r0, int64_t r1)                       \
{                                                                                           \
	for (int64_t rb = r0; rb < r1; rb += RB) {                                          \
		int64_t re = rb + RB < r1 ? rb + RB : r1;                                   \
		for (int64_t t = 0; t < n_tok; ) {                                          \
			int nt = n_tok - t >= 4 ? 4 : 1, nr = nt == 4 ? (NR4) : 4;          \
			int64_t r = rb;                                                     \
			for (; r + nr <= re; r += nr)                                       \
				tile(y + t * ys, ys, x + t * xs, xs, nt, nr, w, r);         \
			for (; r < re; r++)                                                 \
				tile(y + t * ys, ys, x + t * xs, xs, nt, 1, w, r);          \
			t += nt;                                                            \
		}                                                                           \
	}                                                                                   \
}

/* ---- AVX-512 ----------------------------------------------------------- */

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
	UNROLL
	for (int i = 0; i < nr; i++) {
		UNROLL
		for (int t = 0; t < nt; t++)
			acc[i][t] = _mm512_setzero_ps();
	}
	int64_t n = w->cols;
	int fp8 = w->dtype == LLM_DTYPE_E4M3;
	int64_t bk = fp8 ? w->block_cols : n;
	size_t esz = llm_dtype_size(w->dtype);
	const float *srow[4] = { 0 };
	UNROLL
	for (int i = 0; i < nr; i++)
		srow[i] = fp8 ? w->scale + ((r + i) / w->block_rows) * w->scale_cols : NULL;
	for (int64_t c0 = 0; c0 < n; c0 += bk) {            /* scale blocks */
		int64_t ce = c0 + bk < n ? c0 + bk : n;
		__m512 sc[4];
		UNROLL
		for (int i = 0; i < nr; i++)
			sc[i] = _mm512_set1_ps(fp8 ? srow[i][c0 / bk] * 256.0f : 1.0f);
		for (int64_t c = c0; c < ce; c += 16) {
			int64_t left = ce - c;
			__mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
			__m512 xv[4];
			UNROLL
			for (int t = 0; t < nt; t++)
				xv[t] = _mm512_maskz_loadu_ps(m, x + t * xs + c);
			UNROLL
			for (int i = 0; i < nr; i++) {
				/* the rows of the next tile, same columns: narrow rows
				 * (d_model 576) defeat the hardware prefetcher */
				_mm_prefetch((const char *)w->data + ((size_t)(r + nr + i) * (size_t)n + (size_t)c) * esz,
				             _MM_HINT_T0);
				__m512 wv = wload_512(w, r + i, c, m);
				if (fp8)
					wv = _mm512_mul_ps(wv, sc[i]);
				UNROLL
				for (int t = 0; t < nt; t++)
					acc[i][t] = _mm512_fmadd_ps(xv[t], wv, acc[i][t]);
			}
		}
	}
	UNROLL
	for (int i = 0; i < nr; i++) {
		UNROLL
		for (int t = 0; t < nt; t++)
			y[t * ys + r + i] = _mm512_reduce_add_ps(acc[i][t]);
	}
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

/* ---- AVX-512 BF16: BF16 and E4M3 weights, activations rounded to BF16 --
 * vdpbf16ps multiplies bf16 pairs exactly and adds both products to an f32
 * lane: 32 multiply-adds per instruction. The activations are rounded to
 * bf16 (nearest even) once per matmul (llm_cpu_x_to_bf16), which is the only
 * rounding that the f32 path does not have for BF16 weights. An E4M3 element
 * becomes the bf16 of code * scale: the f32 product rounded to nearest even
 * (vcvtne2ps2bf16), the value llm-quantize --dequantize --dtype bf16 writes
 * (except for a product below 2^-126, which becomes zero here: a scale
 * under 2^-117, which no quantizer makes). So E4M3 weights take exactly the
 * dot products of their dequantized BF16 form, bit for bit, and the GPU's
 * tensor-core kernel rounds the same product the same way. The products
 * are taken through a table per scale: the 128 magnitudes times the scale,
 * built once per scale row and matmul call (a few instructions for 128 x 128
 * codes), looked up by permutes in registers, the sign flipped by the code's
 * bit 7.
 *
 * Per output element the order is fixed: 32-column chunks (two columns per
 * lane) at multiples of 32, in column order, then the 16 lanes reduced by
 * the tree of _mm512_reduce_add_ps (reduce4_512 adds in the same pairs). The
 * E4M3 codes reach the dot product either converted in registers (few
 * tokens: decode) or from a per-thread bf16 copy of a row block made once
 * and reused by every token tile (more than 4 tokens, and row-group
 * layouts from 2); both hold the same bf16 words, so the choice, which
 * depends on n_tok, does not change a bit of the result. */

#define TBF __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx2,fma,f16c")))

/* The table of one scale: the bf16 words of magnitude * scale for the 128
 * magnitudes (code & 0x7f; 127 is NaN). Word layout (t[q]: words 32q ..
 * 32q + 31) for the word-permute kernels; for the VBMI kernels the low bytes
 * of the 128 words (t[0], t[1]) and their high bytes (t[2], t[3]). */
struct e4m3_tab { __m512i t[4]; };

TBF static INL void e4m3_tab_words(float s, struct e4m3_tab *tb)
{
	__m512 sv = _mm512_set1_ps(s);
#pragma GCC unroll 4
	for (int q = 0; q < 4; q++)
		tb->t[q] = (__m512i)_mm512_cvtne2ps_pbh(_mm512_mul_ps(_mm512_loadu_ps(llm_e4m3_table + 32 * q + 16), sv),
		                                         _mm512_mul_ps(_mm512_loadu_ps(llm_e4m3_table + 32 * q), sv));
}

/* 32 E4M3 codes (masked) -> 32 bf16 words: the magnitude through the table
 * (two 64-entry word permutes, bit 6 picks one), bit 7 flips the sign. */
TBF static INL __m512i e4m3x32_bf16(const struct e4m3_tab *tb, const uint8_t *p, __mmask32 m)
{
	__m512i c = _mm512_cvtepu8_epi16(_mm256_maskz_loadu_epi8(m, p));
	__m512i lo = _mm512_permutex2var_epi16(tb->t[0], c, tb->t[1]);
	__m512i hi = _mm512_permutex2var_epi16(tb->t[2], c, tb->t[3]);
	__m512i v = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(c, _mm512_set1_epi16(0x40)), lo, hi);
	return _mm512_ternarylogic_epi32(v, _mm512_slli_epi16(c, 8), _mm512_set1_epi16((short)0x8000), 0x78);
}

/* The sums of a, b, c, d in lanes 0, 4, 8, 12, each added in the pairs of
 * _mm512_reduce_add_ps (i + i+8, then i+4, i+2, i+1): the same bits. */
TBF static INL __m512 reduce4_512(__m512 a, __m512 b, __m512 c, __m512 d)
{
	__m512 ab = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xee));
	__m512 cd = _mm512_add_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xee));
	__m512 s = _mm512_add_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xdd));
	s = _mm512_add_ps(s, _mm512_permute_ps(s, 0x4e));
	return _mm512_add_ps(s, _mm512_permute_ps(s, 0xb1));
}

/* The tables of one scale row of an E4M3 weight: those of column blocks
 * below TAB_MAX kept for the whole row (built when the row changes), a
 * block past them built into SPARE at each use. */
#define TAB_MAX 128                 /* 32 KiB: 16384 columns of 128-column blocks */
struct tabs {
	const float *scale;
	int64_t scale_cols, bk, br;
	int64_t row;                    /* the scale row held; -1: none */
	int64_t spare_b;                /* the block SPARE holds; -1: none */
	struct e4m3_tab *t;             /* [TAB_MAX] */
	struct e4m3_tab spare;
};

/* A row tile prefetches (into L2) the same columns this many bytes or more
 * further on (whole rows ahead, at least the next tile). Streaming from
 * memory on one core: next tile into L1 (2.3 KB ahead for 576-column E4M3
 * rows) 9.8 GB/s; 8 KB+ ahead into L2 20-22 GB/s, for rows of 576 to 5632
 * columns (a plain read loop: 25 GB/s). */
#define PF_BYTES 8192

/* bf16 copy of an E4M3 row block, on the stack of the thread (64 KiB) */
#define WBUF_ELEMS 32768
/* the fewest tokens for which E4M3 rows are copied to bf16 (matmul_dot) */
#define COPY_MIN_TOK 8

#define TVB __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi,avx2,fma,f16c")))

/* byte j of the words of 32 codes: its low (even j) or high (odd j) byte,
 * from the low-byte (0..63) or high-byte (64..127) lookup of code j / 2;
 * then the same for codes 32..63 */
static const uint8_t e4m3_interleave[128] = {
	  0,  64,   1,  65,   2,  66,   3,  67,   4,  68,   5,  69,   6,  70,   7,  71,
	  8,  72,   9,  73,  10,  74,  11,  75,  12,  76,  13,  77,  14,  78,  15,  79,
	 16,  80,  17,  81,  18,  82,  19,  83,  20,  84,  21,  85,  22,  86,  23,  87,
	 24,  88,  25,  89,  26,  90,  27,  91,  28,  92,  29,  93,  30,  94,  31,  95,
	 32,  96,  33,  97,  34,  98,  35,  99,  36, 100,  37, 101,  38, 102,  39, 103,
	 40, 104,  41, 105,  42, 106,  43, 107,  44, 108,  45, 109,  46, 110,  47, 111,
	 48, 112,  49, 113,  50, 114,  51, 115,  52, 116,  53, 117,  54, 118,  55, 119,
	 56, 120,  57, 121,  58, 122,  59, 123,  60, 124,  61, 125,  62, 126,  63, 127,
};

/* byte j of 64 bf16 words: even (low) or odd (high) bytes */
static const uint8_t byte_lo[64] = {
	  0,   2,   4,   6,   8,  10,  12,  14,  16,  18,  20,  22,  24,  26,  28,  30,
	 32,  34,  36,  38,  40,  42,  44,  46,  48,  50,  52,  54,  56,  58,  60,  62,
	 64,  66,  68,  70,  72,  74,  76,  78,  80,  82,  84,  86,  88,  90,  92,  94,
	 96,  98, 100, 102, 104, 106, 108, 110, 112, 114, 116, 118, 120, 122, 124, 126,
};

/* The word table split into its low and high bytes (two 128-byte tables,
 * two registers each): four byte permutes. */
TVB static INL void e4m3_tab_bytes(float s, struct e4m3_tab *tb)
{
	struct e4m3_tab w;
	e4m3_tab_words(s, &w);
	__m512i lo = _mm512_loadu_si512(byte_lo), hi = _mm512_add_epi8(lo, _mm512_set1_epi8(1));
	tb->t[0] = _mm512_permutex2var_epi8(w.t[0], lo, w.t[1]);
	tb->t[1] = _mm512_permutex2var_epi8(w.t[2], lo, w.t[3]);
	tb->t[2] = _mm512_permutex2var_epi8(w.t[0], hi, w.t[1]);
	tb->t[3] = _mm512_permutex2var_epi8(w.t[2], hi, w.t[3]);
}

/* 64 E4M3 codes (masked) -> 64 bf16 words in order (codes 0..31 in *w0,
 * 32..63 in *w1), the same words as e4m3x32_bf16: the low and high byte of
 * a magnitude's word by two 128-entry byte permutes (bit 7 ignored), the
 * sign flipped in the high byte, then the bytes interleaved into words by
 * IA and IB (e4m3_interleave). */
TVB static INL void e4m3x64_bf16(const struct e4m3_tab *tb, __m512i ia, __m512i ib, const uint8_t *p,
                                 __mmask64 m, __m512i *w0, __m512i *w1)
{
	__m512i c = _mm512_maskz_loadu_epi8(m, p);
	__m512i lo = _mm512_permutex2var_epi8(tb->t[0], c, tb->t[1]);
	__m512i hi = _mm512_permutex2var_epi8(tb->t[2], c, tb->t[3]);
	hi = _mm512_ternarylogic_epi32(hi, c, _mm512_set1_epi8((char)0x80), 0x78);
	*w0 = _mm512_permutex2var_epi8(lo, ia, hi);
	*w1 = _mm512_permutex2var_epi8(lo, ib, hi);
}

#define DOT_TARGET TBF
#define DOT_NAME(f) f##_bf16
#define DOT_VBMI 0
#include "cpu_matmul_dot.h"

#define DOT_TARGET TVB
#define DOT_NAME(f) f##_vbmi
#define DOT_VBMI 1
#include "cpu_matmul_dot.h"

/* AVX512_VBMI where the CPU has it (same results, faster E4M3); 0 or 1
 * forced by llm_cpu_matmul_vbmi (tests compare the two). */
static int use_vbmi = -1;

int llm_cpu_matmul_vbmi(int on)
{
	int have = __builtin_cpu_supports("avx512vbmi") != 0;
	if (on >= 0)
		use_vbmi = on && have;
	else if (use_vbmi < 0)
		use_vbmi = have;
	return use_vbmi;
}

static void matmul_dot(float *y, int64_t ys, const uint16_t *xb, int64_t xbs, int64_t n_tok,
                       const struct llm_weight *w, int64_t r0, int64_t r1)
{
	int v = use_vbmi;
	if (v < 0)
		v = llm_cpu_matmul_vbmi(-1);
	/* 64-column steps: only worth it for scale blocks of >= 64 columns */
	if (v && w->dtype == LLM_DTYPE_E4M3 && w->block_cols >= 64)
		matmul_dot_vbmi(y, ys, xb, xbs, n_tok, w, r0, r1);
	else
		matmul_dot_bf16(y, ys, xb, xbs, n_tok, w, r0, r1);
}

TBF static void x_to_bf16_512(uint16_t *dst, int64_t ds, const float *x, int64_t xs,
                              int64_t n_tok, int64_t cols)
{
	for (int64_t t = 0; t < n_tok; t++)
		for (int64_t c = 0; c < cols; c += 16) {
			int64_t left = cols - c;
			__mmask16 m = left >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << left) - 1);
			__m256bh h = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + t * xs + c));
			_mm256_mask_storeu_epi16(dst + t * ds + c, m, (__m256i)h);
		}
}

/* ---- AVX2 -------------------------------------------------------------- */


T256 static INL __m256i mask8_256(int64_t left)
{
	static const int32_t ramp[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };
	int k = left >= 8 ? 8 : (int)left;
	return _mm256_cmpgt_epi32(_mm256_set1_epi32(k), _mm256_loadu_si256((const __m256i *)ramp));
}

/* 8 E4M3 codes -> f32, exactly, two ways. WIDE: code * 2^-120 in three
 * operations: sign-extend to 32 bits, shift the exponent and mantissa into
 * place under f32's exponent field, clear the sign's copies above them (bit
 * 31 keeps one); a subnormal code becomes an f32 subnormal, exact too.
 * Otherwise code * 2^-8 through F16 (as the AVX-512 level does). The power
 * of two goes into the block scale (e4m3_scale_256): code * scale is then
 * rounded once either way, the same f32. WIDE needs scale * 2^120 finite,
 * so a block whose scale is 256 or more (amax over 114688: no quantizer
 * makes one) takes the F16 way. */
T256 static INL __m256 e4m3x8_256(__m128i c, const int wide)
{
	if (wide) {
		__m256i v = _mm256_slli_epi32(_mm256_cvtepi8_epi32(c), 20);
		return _mm256_castsi256_ps(_mm256_and_si256(v, _mm256_set1_epi32((int)0x87f00000u)));
	}
	__m128i h = _mm_cvtepi8_epi16(c);
	h = _mm_and_si128(_mm_slli_epi16(h, 7), _mm_set1_epi16((short)0xbfff));
	return _mm256_cvtph_ps(h);
}

static inline int e4m3_wide(float s)
{
	return fabsf(s) < 256.0f;
}

static inline float e4m3_scale_256(float s, int wide)
{
	return s * (wide ? 0x1p120f : 256.0f);
}

/* The last partial chunk of a row is copied to a zero-padded buffer first,
 * so no load reads past the tensor. WIDE: the E4M3 conversion (above). */
T256 static INL __m256 wload_256(const struct llm_weight *w, enum llm_dtype dt, int64_t r, int64_t c, int64_t left,
                                 const int wide)
{
	size_t i = (size_t)r * (size_t)w->cols + (size_t)c;
	int k = left >= 8 ? 8 : (int)left;
	switch (dt) {
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
		if (dt == LLM_DTYPE_F16)
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
		return e4m3x8_256(cv, wide);
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

/* Columns [c0, ce) of one column block into the accumulators of rows r,
 * r + rs, ..., r + (nr - 1) rs: SC the rows' block scales as
 * e4m3_scale_256 made them (1 for other dtypes). One prefetch a 64-byte
 * line, PF rows past each row. */
T256 static INL void block_256(__m256 acc[4][8], const float *x, int64_t xs, const int nt, const int nr,
                               const struct llm_weight *w, int64_t r, int64_t rs, int64_t ahead,
                               const enum llm_dtype dt, int64_t c0, int64_t ce, const __m256 sc[4], const int wide)
{
	int fp8 = dt == LLM_DTYPE_E4M3;
	int64_t n = w->cols;
	size_t esz = llm_dtype_size(dt);
	int64_t c = c0;
	for (; c + 8 <= ce; c += 8) {   /* x is read from L1 by each FMA: 8 tokens leave no registers for it */
		int pf = ((size_t)c * esz & 63) == 0;
		UNROLL
		for (int i = 0; i < nr; i++) {
			if (pf && ahead)
				_mm_prefetch((const char *)w->data + ((size_t)(r + i * rs + ahead) * (size_t)n + (size_t)c) * esz,
				             _MM_HINT_T0);
			__m256 wv = wload_256(w, dt, r + i * rs, c, 8, wide);
			if (fp8)
				wv = _mm256_mul_ps(wv, sc[i]);
			UNROLL
			for (int t = 0; t < nt; t++)
				acc[i][t] = _mm256_fmadd_ps(_mm256_loadu_ps(x + t * xs + c), wv, acc[i][t]);
		}
	}
	if (c < ce) {                   /* the block's last, partial chunk */
		__m256i m = mask8_256(ce - c);
		UNROLL
		for (int i = 0; i < nr; i++) {
			__m256 wv = wload_256(w, dt, r + i * rs, c, ce - c, wide);
			if (fp8)
				wv = _mm256_mul_ps(wv, sc[i]);
			UNROLL
			for (int t = 0; t < nt; t++)
				acc[i][t] = _mm256_fmadd_ps(_mm256_maskload_ps(x + t * xs + c, m), wv, acc[i][t]);
		}
	}
}

/* The rows r + i rs (i < nr) against NT tokens: one accumulator a row and
 * token over the columns in order, so a row's bits do not depend on the
 * rows beside it nor on RS. PF: prefetch distance in rows (block_256's
 * AHEAD; 0: none). */
T256 static INL void tile_256(float *y, int64_t ys, const float *x, int64_t xs, int nt, int nr,
                              const struct llm_weight *w, int64_t r, int64_t rs, int64_t pf, enum llm_dtype dt)
{
	__m256 acc[4][8];
	UNROLL
	for (int i = 0; i < nr; i++) {
		UNROLL
		for (int t = 0; t < nt; t++)
			acc[i][t] = _mm256_setzero_ps();
	}
	int64_t n = w->cols;
	int fp8 = dt == LLM_DTYPE_E4M3;
	int64_t bk = fp8 ? w->block_cols : n;
	const float *srow[4] = { 0 };
	UNROLL
	for (int i = 0; i < nr; i++)
		srow[i] = fp8 ? w->scale + ((r + i * rs) / w->block_rows) * w->scale_cols : NULL;
	for (int64_t c0 = 0; c0 < n; c0 += bk) {
		int64_t ce = c0 + bk < n ? c0 + bk : n;
		__m256 sc[4];
		int wide = 1;
		UNROLL
		for (int i = 0; i < nr; i++)
			wide &= !fp8 || e4m3_wide(srow[i][c0 / bk]);
		UNROLL
		for (int i = 0; i < nr; i++)
			sc[i] = _mm256_set1_ps(fp8 ? e4m3_scale_256(srow[i][c0 / bk], wide) : 1.0f);
		if (wide)
			block_256(acc, x, xs, nt, nr, w, r, rs, pf, dt, c0, ce, sc, 1);
		else
			block_256(acc, x, xs, nt, nr, w, r, rs, pf, dt, c0, ce, sc, 0);
	}
	UNROLL
	for (int i = 0; i < nr; i++) {
		UNROLL
		for (int t = 0; t < nt; t++)
			y[t * ys + r + i * rs] = hsum_256(acc[i][t]);
	}
}

/* The tile shapes the driver asks for, each with its weight dtype fixed, so
 * the conversion is chosen once and the accumulators stay in registers. */
#define TILE_256_DT(dt)                                                                     \
	do {                                                                                \
		switch (nt * 8 + nr) {                                                      \
		case 8 * 8 + 1: tile_256(y, ys, x, xs, 8, 1, w, r, rs, pf, dt); break;      \
		case 7 * 8 + 1: tile_256(y, ys, x, xs, 7, 1, w, r, rs, pf, dt); break;      \
		case 6 * 8 + 1: tile_256(y, ys, x, xs, 6, 1, w, r, rs, pf, dt); break;      \
		case 5 * 8 + 1: tile_256(y, ys, x, xs, 5, 1, w, r, rs, pf, dt); break;      \
		case 4 * 8 + 2: tile_256(y, ys, x, xs, 4, 2, w, r, rs, pf, dt); break;      \
		case 4 * 8 + 1: tile_256(y, ys, x, xs, 4, 1, w, r, rs, pf, dt); break;      \
		case 3 * 8 + 2: tile_256(y, ys, x, xs, 3, 2, w, r, rs, pf, dt); break;      \
		case 3 * 8 + 1: tile_256(y, ys, x, xs, 3, 1, w, r, rs, pf, dt); break;      \
		case 2 * 8 + 4: tile_256(y, ys, x, xs, 2, 4, w, r, rs, pf, dt); break;      \
		case 2 * 8 + 2: tile_256(y, ys, x, xs, 2, 2, w, r, rs, pf, dt); break;      \
		case 2 * 8 + 1: tile_256(y, ys, x, xs, 2, 1, w, r, rs, pf, dt); break;      \
		case 1 * 8 + 4: tile_256(y, ys, x, xs, 1, 4, w, r, rs, pf, dt); break;      \
		case 1 * 8 + 2: tile_256(y, ys, x, xs, 1, 2, w, r, rs, pf, dt); break;      \
		default: tile_256(y, ys, x, xs, 1, 1, w, r, rs, pf, dt); break;             \
		}                                                                           \
	} while (0)

T256 static void tile_256_dispatch(float *y, int64_t ys, const float *x, int64_t xs, int nt, int nr,
                                   const struct llm_weight *w, int64_t r, int64_t rs, int64_t pf)
{
	switch (w->dtype) {
	case LLM_DTYPE_E4M3: TILE_256_DT(LLM_DTYPE_E4M3); break;
	case LLM_DTYPE_BF16: TILE_256_DT(LLM_DTYPE_BF16); break;
	case LLM_DTYPE_F16: TILE_256_DT(LLM_DTYPE_F16); break;
	default: TILE_256_DT(LLM_DTYPE_F32); break;
	}
}

/* ---- AVX2 E4M3: the block scale on the activations ----------------------
 * AVX2 has no instruction that multiplies bf16 or E4M3 pairs, so each code
 * becomes an f32 first (e4m3x8_256: three operations for 8 codes) and the
 * per-element product code * scale of tile_256 is a fourth, on the FMA
 * ports, with a slow path on subnormal f32 inputs (the E4M3 subnormals);
 * at one token that bounded a decode step (Zen 5 at LLM_CPU_ISA=avx2, 1024
 * x 512 from L2, one thread: 29 us, 36 with 1/16 subnormal codes; the same
 * loop without the multiply 22 us either way). So for a weight whose
 * scales are all "plain" (e4m3_xs: 0, or 2^-40 <= |s| <= 2^16: every
 * quantizer's) the scale goes on x instead, once per token and 8 columns
 * for every row of the tile that shares the scale row:
 *
 *   y[t, r] = 2^64 * hsum( sum over 8-column chunks c, in order, of
 *             fma(xs, w', acc) ),  xs = x[t, c] * (s * 2^56)  (rounded once),
 *                                  w' = code * 2^-120        (exact, e4m3x8_256)
 *
 * The real product xs * w' is fl(x * s) * code * 2^-64: code * (x * s) with
 * one rounding, as the reference's fl(code * s) * x has one, so the
 * bound of test_ops (n 2^-24 sum|x w|) holds the same way; the powers of
 * two are exact while |x s| < 2^72 (no overflow of xs) and a term under
 * 2^-62 loses bits to subnormals (absolute error below 2^-85 each).
 * Decode tiles and the prefill panel (which stores w' and scales the
 * token tile's x once per column block) compute exactly this, so a token's
 * bits do not depend on the batch. A weight with any other scale (a huge
 * one, a subnormal one, NaN) keeps tile_256's numerics on every path. */
#define XS_Y 0x1p64f                /* y = XS_Y * the sum */
#define XS_S 0x1p56f                /* xs = x * (s * XS_S) */

/* Whether W (E4M3, whole 8-column chunks) takes the scaled activations:
 * every scale 0 or 2^-40 <= |s| <= 2^16. Reads all the scales (a few
 * thousand at most for block scales; d_out for a per-row head, ~1% of its
 * codes), so each thread's row range decides alike. */
static int e4m3_xs(const struct llm_weight *w)
{
	if (w->dtype != LLM_DTYPE_E4M3 || w->cols % 8 || w->block_cols % 8)
		return 0;
	int64_t ns = w->scale_rows * w->scale_cols;
	int ok = 1;
	for (int64_t i = 0; i < ns; i++) {
		float a = fabsf(w->scale[i]);
		ok &= a == 0.0f || (a >= 0x1p-40f && a <= 0x1p16f);
	}
	return ok;
}

/* A scale a row for the whole row (a per-row head): in the grouped order
 * (below) the row's scale multiplies its sum once, y = (XS_Y s) hsum(...)
 * with xs = x * XS_S (exact), not each product, so a prompt's panel is not
 * cut at every row nor its x scaled for each (16 tokens of SmolLM2's
 * 49152 x 576 head at LLM_CPU_ISA=avx2: 90 ms that way, 15 ms with 128 x
 * 128 blocks). The products are then x code 2^-64, exact, and y is rounded
 * once more than a term's own rounding: the test_ops bound holds the same
 * way (a term under 2^-62 still loses bits to subnormals: 2^-85 |s| at
 * most). XS_Y s is exact while |s| <= 2^16 (e4m3_xs). */
static int row_scaled(const struct llm_weight *w)
{
	return w->block_rows == 1 && w->scale_cols == 1;
}

/* ---- AVX2 decode: 1 to 4 tokens over E4M3 rows ---------------------------
 * Where the columns and the scale blocks are whole 8-column chunks, each
 * row's codes go in steps of one 64-byte line (eight chunks unrolled, no
 * per-chunk tests), and the line DEC_PF_BYTES or more further on (whole
 * rows ahead, at least the next tile) is prefetched into L2 once a step.
 * XS: the scaled activations above; otherwise tile_256's operations in the
 * same order (the same bits). One Zen 5 core under LLM_CPU_ISA=avx2, 1
 * token, 2048 x 2048 from memory (thread CPU time): tile_256, with its
 * 4-rows-ahead prefetch into L1 tested per chunk and the per-code
 * multiply, 12-14 GB/s on codes with almost no subnormals (6-8 on
 * matmul_bench's uniform codes, 1/16 subnormal); these tiles 15-17
 * (17.7-18.9). */
#define DEC_STEP 64
#define DEC_PF_BYTES 8192

/* One chunk at column C of rows WP into the accumulators. XS: SC holds
 * the rows' s * XS_S, SHARED: all rows the same (one scaled x a token). */
T256 static INL void dec_chunk_e4m3(__m256 acc[4][4], const float *x, int64_t xs, const int nt, const int nr,
                                    const uint8_t *const wp[4], int64_t c, const __m256 sc[4], const int wide,
                                    const int xsc, const int shared)
{
	__m256 xv[4];
	UNROLL
	for (int t = 0; t < nt; t++) {
		xv[t] = _mm256_loadu_ps(x + t * xs + c);
		if (xsc && shared)
			xv[t] = _mm256_mul_ps(xv[t], sc[0]);
	}
	UNROLL
	for (int i = 0; i < nr; i++) {
		__m256 wv = e4m3x8_256(_mm_loadl_epi64((const __m128i *)(wp[i] + c)), xsc ? 1 : wide);
		if (!xsc)
			wv = _mm256_mul_ps(wv, sc[i]);
		UNROLL
		for (int t = 0; t < nt; t++)
			acc[i][t] = _mm256_fmadd_ps(xsc && !shared ? _mm256_mul_ps(xv[t], sc[i]) : xv[t], wv, acc[i][t]);
	}
}

/* Columns [c0, ce) (whole chunks) of one scale block for rows WP. */
T256 static INL void dec_block_e4m3(__m256 acc[4][4], const float *x, int64_t xs, const int nt, const int nr,
                                    const uint8_t *const wp[4], int64_t c0, int64_t ce, const __m256 sc[4],
                                    const int wide, const int xsc, const int shared, size_t pf)
{
	int64_t c = c0;
	for (; c + DEC_STEP <= ce; c += DEC_STEP) {
		UNROLL
		for (int i = 0; i < nr; i++)
			_mm_prefetch((const char *)(wp[i] + c + pf), _MM_HINT_T1);
		UNROLL
		for (int j = 0; j < DEC_STEP; j += 8)
			dec_chunk_e4m3(acc, x, xs, nt, nr, wp, c + j, sc, wide, xsc, shared);
	}
	for (; c < ce; c += 8) {        /* a block's last chunks short of a step */
		if ((c & (DEC_STEP - 1)) == 0) {
			UNROLL
			for (int i = 0; i < nr; i++)
				_mm_prefetch((const char *)(wp[i] + c + pf), _MM_HINT_T1);
		}
		dec_chunk_e4m3(acc, x, xs, nt, nr, wp, c, sc, wide, xsc, shared);
	}
}

T256 static INL void dec_tile_e4m3(float *y, int64_t ys, const float *x, int64_t xs, const int nt, const int nr,
                                   const struct llm_weight *w, int64_t r, const int xsc, const int shared, size_t pf)
{
	__m256 acc[4][4];
	UNROLL
	for (int i = 0; i < nr; i++) {
		UNROLL
		for (int t = 0; t < nt; t++)
			acc[i][t] = _mm256_setzero_ps();
	}
	int64_t n = w->cols, bk = w->block_cols;
	const uint8_t *wp[4] = { 0 };
	const float *srow[4] = { 0 };
	UNROLL
	for (int i = 0; i < nr; i++) {
		wp[i] = (const uint8_t *)w->data + (size_t)(r + i) * (size_t)n;
		srow[i] = w->scale + ((r + i) / w->block_rows) * w->scale_cols;
	}
	for (int64_t c0 = 0, b = 0; c0 < n; c0 += bk, b++) {
		int64_t ce = c0 + bk < n ? c0 + bk : n;
		__m256 sc[4];
		if (xsc) {
			for (int i = 0; i < (shared ? 1 : nr); i++)
				sc[i] = _mm256_set1_ps(srow[i][b] * XS_S);
			dec_block_e4m3(acc, x, xs, nt, nr, wp, c0, ce, sc, 1, 1, shared, pf);
			continue;
		}
		int wide = 1;
		UNROLL
		for (int i = 0; i < nr; i++)
			wide &= e4m3_wide(srow[i][b]);
		UNROLL
		for (int i = 0; i < nr; i++)
			sc[i] = _mm256_set1_ps(e4m3_scale_256(srow[i][b], wide));
		if (wide)
			dec_block_e4m3(acc, x, xs, nt, nr, wp, c0, ce, sc, 1, 0, 0, pf);
		else
			dec_block_e4m3(acc, x, xs, nt, nr, wp, c0, ce, sc, 0, 0, 0, pf);
	}
	UNROLL
	for (int i = 0; i < nr; i++) {
		UNROLL
		for (int t = 0; t < nt; t++)
			y[t * ys + r + i] = xsc ? hsum_256(acc[i][t]) * XS_Y : hsum_256(acc[i][t]);
	}
}

#define DEC_SHAPES(XSC, SH)                                                                       \
	switch (nt * 8 + nr) {                                                                    \
	case 1 * 8 + 4: dec_tile_e4m3(y, ys, x, xs, 1, 4, w, r, XSC, SH, pf); break;              \
	case 2 * 8 + 4: dec_tile_e4m3(y, ys, x, xs, 2, 4, w, r, XSC, SH, pf); break;              \
	case 3 * 8 + 2: dec_tile_e4m3(y, ys, x, xs, 3, 2, w, r, XSC, SH, pf); break;              \
	case 4 * 8 + 2: dec_tile_e4m3(y, ys, x, xs, 4, 2, w, r, XSC, SH, pf); break;              \
	case 4 * 8 + 1: dec_tile_e4m3(y, ys, x, xs, 4, 1, w, r, XSC, SH, pf); break;              \
	case 3 * 8 + 1: dec_tile_e4m3(y, ys, x, xs, 3, 1, w, r, XSC, SH, pf); break;              \
	case 2 * 8 + 1: dec_tile_e4m3(y, ys, x, xs, 2, 1, w, r, XSC, SH, pf); break;              \
	default: dec_tile_e4m3(y, ys, x, xs, 1, 1, w, r, XSC, SH, pf); break;                     \
	}

/* XSC: the weight takes the scaled activations (e4m3_xs); the rows of a
 * tile then share one scaled x when they share a scale row. */
T256 static void dec_tile_e4m3_any(float *y, int64_t ys, const float *x, int64_t xs, int nt, int nr,
                                   const struct llm_weight *w, int64_t r, int xsc, size_t pf)
{
	if (!xsc)
		DEC_SHAPES(0, 0)
	else if (r / w->block_rows == (r + nr - 1) / w->block_rows)
		DEC_SHAPES(1, 1)
	else
		DEC_SHAPES(1, 0)
}

/* Whether the decode tiles above take W for N_TOK tokens. */
static int dec_fits(const struct llm_weight *w, int64_t n_tok)
{
	return w->dtype == LLM_DTYPE_E4M3 && n_tok <= 4 && w->cols % 8 == 0 && w->block_cols % 8 == 0;
}

/* N_TOK <= 4 tokens, every one in one tile: rows in tiles of 4 (1 or 2
 * tokens) or 2 (3 or 4: 8 accumulators), the rest one at a time. */
T256 static void matmul_avx2_dec(float *y, int64_t ys, const float *x, int64_t xs, int64_t n_tok,
                                 const struct llm_weight *w, int64_t r0, int64_t r1, int xsc)
{
	int nt = (int)n_tok, nr = nt >= 3 ? 2 : 4;
	size_t n = (size_t)w->cols, ahead = (DEC_PF_BYTES + n - 1) / n;
	size_t pf = (ahead > 4 ? ahead : 4) * n;
	int64_t r = r0;
	for (; r + nr <= r1; r += nr)
		dec_tile_e4m3_any(y, ys, x, xs, nt, nr, w, r, xsc, pf);
	for (; r < r1; r++)
		dec_tile_e4m3_any(y, ys, x, xs, nt, 1, w, r, xsc, pf);
}

/* ---- AVX2 E4M3 in the grouped order: one row, one stream -----------------
 * The 4-row decode tiles above read four rows at once, four streams that
 * the hardware prefetchers follow badly: one Zen 5 core at
 * LLM_CPU_ISA=avx2, 2048 x 2048 codes from memory (64 copies, thread CPU
 * time, median) read 11-18 codes/ns that way and 23-25 a row at a time,
 * the rate of the same loop in cache (a loop that interleaves 4 rows:
 * 11-18 with or without software prefetch). A row alone has one output a token,
 * so one accumulator a token would wait on the FMA's latency; the grouped
 * order gives each output four, by the position of 8 columns in a group of
 * 32, and this order is the one every path computes for such a weight (the
 * prompt panel below too), so a token's bits still do not depend on the
 * batch:
 *
 *   group g (columns 32g .. 32g+31), part k (0..3) = columns 4k..4k+3 and
 *   16+4k..16+4k+3 of it; A_k = sum over g, in order, of
 *   fma(xs[part k of g], w'[part k of g], A_k); y = XS_Y hsum((A_0 + A_1)
 *   + (A_2 + A_3))
 *
 * with xs and w' of the scaled activations (e4m3_xs); a weight with a scale
 * a row for the whole row (row_scaled) has xs = x XS_S and y = (XS_Y s)
 * hsum(...) instead. The parts are what
 * the conversion gives without a lane-crossing shuffle (e4m3x32_g: 32
 * codes in 10 operations, against 12 for four e4m3x8_256), and the
 * activations are permuted to them once per call (and scaled once per
 * scale row where rows share one). For weights of whole groups (columns
 * and block columns multiples of 32) with plain scales; others keep the
 * order above. Through the engine (llm-bench, LLM_CPU_ISA=avx2 on Zen 5,
 * one thread, medians of 3 alternating runs against the 4-row tiles):
 * decode of one sequence 1.18x (SmolLM2-135M) and 1.21x (TinyLlama-1.1B),
 * 2 and 4 sequences 1.06-1.10x; a 512-token prompt 1.19x on TinyLlama
 * (matmul_avx2_pp_g makes a scale row's x once, not once per 3-row panel of
 * the 5632-column down projection) and 0.95x on SmolLM2 (the panel's 4
 * passes over 576 columns). bench/results/decode-avx2-rows-zen5-2026-11-29.txt. */
#define G_COLS 32
#define DECG_PF 4096                /* bytes ahead (4 tokens, 2048 x 2048 from memory: 2x) */
#define DECG_NT 8                   /* tokens of the decode rows */
#define DECG_XP_FLOATS 32896        /* 128.5 KiB: 8 tokens of 4096 columns (a row 16 floats longer) */

/* 32 codes at Q -> their f32 code * 2^-120 (exact, as e4m3x8_256's WIDE
 * way), part k in V[k]: each byte to the top of a 16-bit word (unpack with
 * zero), an arithmetic shift by 4 puts exponent and mantissa under bf16's
 * exponent field and repeats the sign, the mask keeps one sign bit; each
 * bf16 word to the top of a 32-bit word (unpack with zero). */
T256 static INL void e4m3x32_g(const uint8_t *q, __m256 v[4], const int k0, const int nk)
{
	const __m256i z = _mm256_setzero_si256(), m = _mm256_set1_epi16((short)0x87f0);
	__m256i b = _mm256_loadu_si256((const __m256i *)q);
#define WANT(k) (k0 <= (k) && (k) < k0 + nk)
	if (WANT(0) || WANT(1)) {
		__m256i lo = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpacklo_epi8(z, b), 4), m);
		if (WANT(0))
			v[0] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, lo));
		if (WANT(1))
			v[1] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, lo));
	}
	if (WANT(2) || WANT(3)) {
		__m256i hi = _mm256_and_si256(_mm256_srai_epi16(_mm256_unpackhi_epi8(z, b), 4), m);
		if (WANT(2))
			v[2] = _mm256_castsi256_ps(_mm256_unpacklo_epi16(z, hi));
		if (WANT(3))
			v[3] = _mm256_castsi256_ps(_mm256_unpackhi_epi16(z, hi));
	}
#undef WANT
}

/* The 32 activations at X into the parts' order at OUT, times SC (a
 * product rounded once, the same as scaling first) when SCALE. */
T256 static INL void x_perm_g(float *out, const float *x, __m256 sc, const int scale)
{
	__m256 a = _mm256_loadu_ps(x), b = _mm256_loadu_ps(x + 8);
	__m256 c = _mm256_loadu_ps(x + 16), d = _mm256_loadu_ps(x + 24);
	__m256 v[4] = { _mm256_permute2f128_ps(a, c, 0x20), _mm256_permute2f128_ps(a, c, 0x31),
	                _mm256_permute2f128_ps(b, d, 0x20), _mm256_permute2f128_ps(b, d, 0x31) };
	UNROLL
	for (int k = 0; k < 4; k++)
		_mm256_store_ps(out + 8 * k, scale ? _mm256_mul_ps(v[k], sc) : v[k]);
}

/* NT tokens of X (XS apart), N columns, permuted into XP (rows XPS apart),
 * group by group, each group's 4 parts in turn; SROW: times each scale
 * block's s * XS_S, else times UNIT (1 or XS_S, exact). */
T256 static void x_perm_rows_g(float *xp, int64_t xps, const float *x, int64_t xs, int64_t nt, int64_t n,
                               const float *srow, int64_t bk, float unit)
{
	for (int64_t t = 0; t < nt; t++)
		for (int64_t b0 = 0; b0 < n; b0 += bk) {
			__m256 sv = _mm256_set1_ps(srow ? srow[b0 / bk] * XS_S : unit);
			int64_t hi = b0 + bk < n ? b0 + bk : n;
			for (int64_t c = b0; c < hi; c += G_COLS) {
				if (srow || unit != 1.0f)
					x_perm_g(xp + t * xps + c, x + t * xs + c, sv, 1);
				else
					x_perm_g(xp + t * xps + c, x + t * xs + c, sv, 0);
			}
		}
}

/* Parts [k0, k0 + nk) of row R's sums for NT tokens of the permuted XP (XPS
 * apart) over columns [cs, ce) into ACC[t][k], from zero or (LOAD) from
 * KEEP[t][k]; SCALE: the row's scales SROW applied here (else XP is scaled
 * already); the codes PF bytes ahead are prefetched. */
T256 static INL void dec_row_g_parts(__m256 acc[DECG_NT][4], const float *xp, int64_t xps, const int nt,
                                     const struct llm_weight *w, int64_t r, const float *srow,
                                     const int scale, const int k0, const int nk, int64_t cs, int64_t ce,
                                     const int load, float keep[DECG_NT][4][8], size_t pf)
{
	int64_t n = w->cols, bk = w->block_cols;
	const uint8_t *q = (const uint8_t *)w->data + (size_t)r * (size_t)n;
	UNROLL
	for (int t = 0; t < nt; t++) {
		UNROLL
		for (int k = k0; k < k0 + nk; k++)
			acc[t][k] = load ? _mm256_load_ps(keep[t][k]) : _mm256_setzero_ps();
	}
	/* prescaled x: one loop over the columns; else scale block by block */
	for (int64_t b0 = scale ? cs / bk * bk : cs; b0 < ce; b0 += scale ? bk : ce) {
		int64_t lo = b0 > cs ? b0 : cs, hi = scale && b0 + bk < ce ? b0 + bk : ce;
		__m256 sc = _mm256_set1_ps(scale ? srow[b0 / bk] * XS_S : 1.0f);
		for (int64_t g = lo; g < hi; g += G_COLS) {
			__m256 v[4];
			if (k0 == 0)
				_mm_prefetch((const char *)(q + g + pf), _MM_HINT_T0);
			e4m3x32_g(q + g, v, k0, nk);
			UNROLL
			for (int t = 0; t < nt; t++) {
				UNROLL
				for (int k = k0; k < k0 + nk; k++) {
					__m256 xv = _mm256_load_ps(xp + t * xps + g + 8 * k);
					if (scale)
						xv = _mm256_mul_ps(xv, sc);
					acc[t][k] = _mm256_fmadd_ps(xv, v[k], acc[t][k]);
				}
			}
		}
	}
}

/* Columns [cs, ce) of row R for NT (1 to 8) tokens: all four parts at once
 * up to 2 tokens, parts 0-1 then 2-3 for 3 or 4, one part a pass for 5 to
 * 8 (8 accumulators at most; the later passes read the codes from L1); the
 * accumulators come from KEEP unless CS is 0 and go back to it unless CE
 * is the row's end, where y = YK hsum((A_0 + A_1) + (A_2 + A_3)), or, with
 * VO, (A_0 + A_1) + (A_2 + A_3) goes to VO + 64 t for hsum8_256. */
T256 static INL void dec_row_g(float *y, int64_t ys, const float *xp, int64_t xps, const int nt,
                               const struct llm_weight *w, int64_t r, const float *srow, const int scale,
                               int64_t cs, int64_t ce, float keep[DECG_NT][4][8], size_t pf, float yk,
                               float *vo)
{
	__m256 acc[DECG_NT][4];
	int last = ce == w->cols;
	if (nt <= 2) {
		dec_row_g_parts(acc, xp, xps, nt, w, r, srow, scale, 0, 4, cs, ce, cs > 0, keep, pf);
		if (!last) {
			UNROLL
			for (int t = 0; t < nt; t++) {
				UNROLL
				for (int k = 0; k < 4; k++)
					_mm256_store_ps(keep[t][k], acc[t][k]);
			}
			return;
		}
	} else {
		const int nk = nt <= 4 ? 2 : 1;
		UNROLL
		for (int k0 = 0; k0 < 4; k0 += nk) {
			dec_row_g_parts(acc, xp, xps, nt, w, r, srow, scale, k0, nk, cs, ce, cs > 0, keep, pf);
			UNROLL
			for (int t = 0; t < nt; t++) {
				UNROLL
				for (int k = k0; k < k0 + nk; k++)
					_mm256_store_ps(keep[t][k], acc[t][k]);
			}
			/* in memory during the other passes, not in registers they need */
			__asm__ volatile("" : : "r"(keep) : "memory");
		}
		if (!last)
			return;
		UNROLL
		for (int t = 0; t < nt; t++) {
			UNROLL
			for (int k = 0; k < 4; k++)
				acc[t][k] = _mm256_load_ps(keep[t][k]);
		}
	}
	UNROLL
	for (int t = 0; t < nt; t++) {
		__m256 v = _mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]), _mm256_add_ps(acc[t][2], acc[t][3]));
		if (vo)
			_mm256_store_ps(vo + 64 * t, v);
		else
			y[t * ys + r] = hsum_256(v) * yk;
	}
}

/* hsum_256 of each of the 8 vectors at V (8 floats each), the same bits,
 * the 8 sums in one vector: lo + hi of two rows a permute apart, then the
 * pairs and the halves of the pairs as hsum_256 adds them (a sum of two
 * does not depend on the order of its terms). 21 operations for 8 rows,
 * against 6 a row each ending in a chain of 3 dependent adds. */
T256 static INL __m256 hsum8_256(const float *v)
{
	__m256 s[4];
	UNROLL
	for (int i = 0; i < 4; i++) {       /* row i in the low lane, row i + 4 in the high */
		__m256 a = _mm256_load_ps(v + 8 * i), b = _mm256_load_ps(v + 8 * (i + 4));
		s[i] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
	}
	/* (s0 + s2, s1 + s3) of rows i and i + 1 */
	__m256 p = _mm256_add_ps(_mm256_shuffle_ps(s[0], s[1], 0x44), _mm256_shuffle_ps(s[0], s[1], 0xee));
	__m256 q = _mm256_add_ps(_mm256_shuffle_ps(s[2], s[3], 0x44), _mm256_shuffle_ps(s[2], s[3], 0xee));
	return _mm256_add_ps(_mm256_shuffle_ps(p, q, 0x88), _mm256_shuffle_ps(p, q, 0xdd));
}

/* Up to DECG_NT tokens over rows [r0, r1) of W in the grouped order, in
 * blocks of DECG_RB rows whose sums hsum8_256 finishes together (one
 * matmul_bench call, LLM_CPU_ISA=avx2 on Zen 5, codes from memory, one
 * token: 576 x 576 16.8 -> 15.9 us, 192 x 576 5.6 -> 5.1, the 49152 x 576
 * head 1398 -> 1344; the same bits). Where the tokens' x fits DECG_L1
 * floats, a row at a time (one stream, the codes DECG_PF bytes ahead
 * prefetched); otherwise (x of 4 tokens of 5632
 * columns, 90 KiB, would come from L2 for every row: 0.7x the 2-row
 * tiles) in blocks of DECG_RB rows, a segment of columns whose x fits at
 * a time for all the block's rows (the accumulators kept in memory between
 * segments, exact), the next row's segment prefetched. 5 to 8 tokens take
 * this path too, not the prompt panel: a decode step reads its weights
 * from memory, where the panel cost 2.3-2.7x of 4 tokens for 5-8 (one Zen 5
 * core at LLM_CPU_ISA=avx2, matmul_bench, 2048 x 2048 from memory: 5
 * tokens 1030 -> 629 us, 8 tokens 1200 -> 1004; in cache the panel stays
 * ahead at 8 tokens, 958 against 1090). Not inlined: its 137 KiB frame. */
#define DECG_L1 6144                /* 24 KiB of x */
#define DECG_RB 8
T256 __attribute__((noinline)) static void matmul_avx2_dec_g(float *y, int64_t ys, const float *x, int64_t xs,
                                                             int64_t n_tok, const struct llm_weight *w,
                                                             int64_t r0, int64_t r1)
{
	_Alignas(32) float buf[DECG_XP_FLOATS];
	_Alignas(32) float keep[DECG_RB][DECG_NT][4][8];
	_Alignas(32) float part[DECG_NT][DECG_RB][8];    /* rows' vectors for hsum8_256 */
	int64_t n = w->cols, xps = n + 16;     /* token rows a line apart in L1's sets */
	int nt = (int)n_tok;
	float *xp = buf;
	if (n_tok * xps > DECG_XP_FLOATS && !(xp = aligned_alloc(32, (size_t)(n_tok * xps) * sizeof *xp))) {
		for (int64_t t = 0; t < n_tok; t++)      /* out of memory: a visibly wrong result */
			for (int64_t r = r0; r < r1; r++)
				y[t * ys + r] = NAN;
		return;
	}
	int64_t seg = DECG_L1 / nt / G_COLS * G_COLS;
	size_t pf = seg >= n ? DECG_PF : 2 * (size_t)n;
	/* rows sharing a scale row share the scaled activations; a scale a
	 * row (a head's) multiplies the row's sum (row_scaled); scales a row
	 * and column block scale x in the loop */
	int rs = row_scaled(w), shared = w->block_rows > 1 || rs;
	int64_t cur = -1;
	if (w->block_rows == 1)
		x_perm_rows_g(xp, xps, x, xs, n_tok, n, NULL, w->block_cols, rs ? XS_S : 1.0f);
	for (int64_t rb = r0, re; rb < r1; rb = re) {
		int64_t sr = rb / w->block_rows;
		const float *srow = w->scale + sr * w->scale_cols;
		re = rb + DECG_RB < r1 ? rb + DECG_RB : r1;
		if (shared && !rs) {
			int64_t end = (sr + 1) * w->block_rows;     /* a block within one scale row */
			re = re < end ? re : end;
			if (sr != cur) {
				x_perm_rows_g(xp, xps, x, xs, n_tok, n, srow, w->block_cols, 1.0f);
				cur = sr;
			}
		}
		int full = re - rb == DECG_RB;
		for (int64_t cs = 0; cs < n; cs += seg) {
			int64_t ce = cs + seg < n ? cs + seg : n;
			for (int64_t r = rb; r < re; r++) {
				const float *sw = w->scale + r * w->scale_cols;   /* unshared: a scale row a row */
				float (*kp)[4][8] = keep[r - rb];
				float yk = rs ? XS_Y * w->scale[r] : XS_Y, *vo = full ? part[0][r - rb] : NULL;
				switch (nt * 2 + shared) {
#define DECG_CASE(T)                                                                                      \
				case T * 2 + 1: dec_row_g(y, ys, xp, xps, T, w, r, sw, 0, cs, ce, kp, pf, yk, vo); break; \
				case T * 2: dec_row_g(y, ys, xp, xps, T, w, r, sw, 1, cs, ce, kp, pf, yk, vo); break;
				DECG_CASE(1) DECG_CASE(2) DECG_CASE(3) DECG_CASE(4)
				DECG_CASE(5) DECG_CASE(6) DECG_CASE(7) DECG_CASE(8)
#undef DECG_CASE
				}
			}
		}
		if (full) {           /* y = YK hsum of each row, 8 rows at once */
			__m256 yv = _mm256_set1_ps(XS_Y);
			if (rs)
				yv = _mm256_mul_ps(yv, _mm256_loadu_ps(w->scale + rb));
			for (int t = 0; t < nt; t++)
				_mm256_storeu_ps(y + t * ys + rb, _mm256_mul_ps(hsum8_256(part[t][0]), yv));
		}
	}
	if (xp != buf)
		free(xp);
}

/* ---- AVX2 prefill: many tokens ------------------------------------------
 * A step of n_tok >= PP_MIN_TOK tokens: the rows of a row block are
 * converted once (E4M3, BF16, F16 -> f32, E4M3 times its block scale: the
 * very wload_256 * sc values of tile_256) into a panel on the thread's stack
 * (F32 weights are their own panel), then every token passes over the panel
 * in tiles of PP_NT tokens x PP_NR rows: 12 accumulators in registers, per
 * 8 columns PP_NR panel loads and PP_NT x loads for 12 FMAs, no conversion.
 * Columns go in blocks of at most KC_MAX, so a token tile's x stays in L1
 * while the row tiles stream the panel from L2; between column blocks the
 * accumulators wait in a small scratch (an exact f32 store and reload).
 * Each output still sees acc = 0, acc = fma(x[c..c+8), w[c..c+8), acc) for
 * c = 0, 8, 16, ... in order, then hsum_256: the operations of tile_256, so
 * its bits do not depend on this path being taken. Only for whole 8-column
 * chunks (cols and E4M3 block columns multiples of 8), where tile_256 has no
 * masked tail. */
/* from 5 tokens the panel beats the decode tiles (one thread, FP8: 5 to 8
 * tokens 1.05-1.3x, 4 tokens 0.85x), whose 5-8-token shape is one row
 * with 8 x pointers and too few registers for them */
#define PP_MIN_TOK 5
#define PP_NR 3
#define PP_NT 4
#define PANEL_FLOATS 32768          /* 128 KiB: 56 rows of 576 columns */
#define PP_MB_MAX 96                /* rows of a panel (the scratch's size) */
#define KC_MAX 768

/* The panel tiles' FMAs: columns [ca, cb) of NR panel rows (PS apart) and
 * NT tokens of x (XS apart, column XO at x[0]) into ACC, 8 at a time in
 * order. F32 weights are their own, unaligned panel. */
T256 static INL void pp_fma_run(__m256 acc[PP_NR][PP_NT], const float *x, int64_t xs, int64_t xo,
                                const float *p, int64_t ps, int64_t ca, int64_t cb, int nt, int nr)
{
	for (int64_t c = ca; c < cb; c += 8) {
		__m256 wv[PP_NR];
		UNROLL
		for (int i = 0; i < nr; i++)
			wv[i] = _mm256_loadu_ps(p + i * ps + c);
		UNROLL
		for (int t = 0; t < nt; t++) {
			__m256 xv = _mm256_loadu_ps(x + t * xs + (c - xo));
			UNROLL
			for (int i = 0; i < nr; i++)
				acc[i][t] = _mm256_fmadd_ps(xv, wv[i], acc[i][t]);
		}
	}
}

T256 static INL void pp_tile_256(float *y, int64_t ys, const float *x, int64_t xs, int64_t xo,
                                 const float *p, int64_t ps, int64_t c0, int64_t c1,
                                 float *acc_save, int first, int last, float yk, int nt, int nr)
{
	/* acc_save: (nr, nt, 8) f32, this tile's accumulators between column blocks */
	__m256 acc[PP_NR][PP_NT];
	UNROLL
	for (int i = 0; i < nr; i++) {
		UNROLL
		for (int t = 0; t < nt; t++)
			acc[i][t] = first ? _mm256_setzero_ps() : _mm256_load_ps(acc_save + (i * nt + t) * 8);
	}
	pp_fma_run(acc, x, xs, xo, p, ps, c0, c1, nt, nr);
	UNROLL
	for (int i = 0; i < nr; i++) {
		UNROLL
		for (int t = 0; t < nt; t++) {
			if (last)
				y[t * ys + i] = hsum_256(acc[i][t]) * yk;
			else
				_mm256_store_ps(acc_save + (i * nt + t) * 8, acc[i][t]);
		}
	}
}

/* XO: the column x[0] holds (the scaled token tile starts at its column
 * block); YK: the factor of the sums (XS_Y for scaled activations, else 1,
 * an exact multiply). */
T256 static void pp_tile_256_dispatch(float *y, int64_t ys, const float *x, int64_t xs, int64_t xo,
                                      const float *p, int64_t ps, int64_t c0, int64_t c1,
                                      float *acc_save, int first, int last, float yk, int nt, int nr)
{
#define PP_CASE(T, R) case T * 8 + R:                                                       \
	pp_tile_256(y, ys, x, xs, xo, p, ps, c0, c1, acc_save, first, last, yk, T, R); break;
	switch (nt * 8 + nr) {
	PP_CASE(4, 3) PP_CASE(4, 2) PP_CASE(4, 1)
	PP_CASE(3, 3) PP_CASE(3, 2) PP_CASE(3, 1)
	PP_CASE(2, 3) PP_CASE(2, 2) PP_CASE(2, 1)
	PP_CASE(1, 3) PP_CASE(1, 2)
	default: pp_tile_256(y, ys, x, xs, xo, p, ps, c0, c1, acc_save, first, last, yk, 1, 1); break;
	}
#undef PP_CASE
}

/* G_LAYOUT: the prompt panel and its token tile's x hold a column block of
 * whole groups 8 columns of each group at a time: columns 8j..8j+7 of the
 * block's groups, in order, at j len + 8 g (len = the block's width / 4),
 * so a pass over one j reads a contiguous quarter of the block. The element
 * at column C of the block: */
static inline int64_t g_pos(int64_t c, int64_t len)
{
	return (c & 31) / 8 * len + c / 32 * 8 + (c & 7);
}

/* Rows [r, r + nr) of W as code * 2^-120 into p (nr, cols) in G_LAYOUT,
 * column blocks of KC. */
T256 static void pp_panel_g(float *p, const struct llm_weight *w, int64_t r, int64_t nr, int64_t kc)
{
	int64_t n = w->cols;
	for (int64_t i = 0; i < nr; i++)
		for (int64_t k0 = 0; k0 < n; k0 += kc) {
			int64_t len = (k0 + kc < n ? kc : n - k0) / 4;
			for (int64_t c = k0; c < k0 + 4 * len; c += G_COLS) {
				float *o = p + i * n + k0 + (c - k0) / 4;
				UNROLL
				for (int j = 0; j < 4; j++)
					_mm256_store_ps(o + j * len, wload_256(w, LLM_DTYPE_E4M3, r + i, c + 8 * j, 8, 1));
			}
		}
}

/* The grouped order's panel tile: columns 8 CLS .. 8 CLS + 7 of every
 * group in columns [c0, c1) (G_LAYOUT) into accumulators B_CLS, kept in
 * acc_save (4 x nr x nt x 8) between column blocks and passes. Lane l of
 * B_j sums column 8j + l of each group in order, as a lane of one part's
 * accumulator of the decode rows does, so after pass 3 of the last block
 * the B_j permuted into parts give the decode rows' y = YK hsum((A_0 +
 * A_1) + (A_2 + A_3)), bit for bit. The 4 passes keep the 12 accumulators
 * and the loads per FMA of pp_tile_256. */
T256 static INL void pp_tile_g(float *y, int64_t ys, const float *x, int64_t xs, int64_t xo,
                               const float *p, int64_t ps, int64_t c0, int64_t c1,
                               float *acc_save, int first, int last, float yk, const float *rsc,
                               int nt, int nr, int cls)
{
	__m256 acc[PP_NR][PP_NT];
	float *sv = acc_save + cls * nr * nt * 8;
	UNROLL
	for (int i = 0; i < nr; i++) {
		UNROLL
		for (int t = 0; t < nt; t++)
			acc[i][t] = first ? _mm256_setzero_ps() : _mm256_load_ps(sv + (i * nt + t) * 8);
	}
	int64_t len = (c1 - c0) / 4;
	pp_fma_run(acc, x, xs, xo, p, ps, c0 + cls * len, c0 + (cls + 1) * len, nt, nr);
	UNROLL
	for (int i = 0; i < nr; i++) {
		UNROLL
		for (int t = 0; t < nt; t++) {
			if (last && cls == 3) {
				int o = (i * nt + t) * 8, pt = nr * nt * 8;
				/* B_j: columns 8j..8j+7 of each group; part k of
				 * the decode rows = halves of B_(k/2) and B_(k/2+2) */
				__m256 b0 = _mm256_load_ps(acc_save + o), b1 = _mm256_load_ps(acc_save + pt + o);
				__m256 b2 = _mm256_load_ps(acc_save + 2 * pt + o), b3 = acc[i][t];
				__m256 a0 = _mm256_permute2f128_ps(b0, b2, 0x20), a1 = _mm256_permute2f128_ps(b0, b2, 0x31);
				__m256 a2 = _mm256_permute2f128_ps(b1, b3, 0x20), a3 = _mm256_permute2f128_ps(b1, b3, 0x31);
				y[t * ys + i] = hsum_256(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) *
				                (rsc ? yk * rsc[i] : yk);
			} else {
				_mm256_store_ps(sv + (i * nt + t) * 8, acc[i][t]);
			}
		}
	}
}

T256 static void pp_tile_g_dispatch(float *y, int64_t ys, const float *x, int64_t xs, int64_t xo,
                                    const float *p, int64_t ps, int64_t c0, int64_t c1,
                                    float *acc_save, int first, int last, float yk, const float *rsc,
                                    int nt, int nr)
{
#define PP_CASE(T, R) case T * 8 + R:                                                           \
	for (int k = 0; k < 4; k++)                                                               \
		pp_tile_g(y, ys, x, xs, xo, p, ps, c0, c1, acc_save, first, last, yk, rsc, T, R, k); \
	break;
	switch (nt * 8 + nr) {
	PP_CASE(4, 3) PP_CASE(4, 2) PP_CASE(4, 1)
	PP_CASE(3, 3) PP_CASE(3, 2) PP_CASE(3, 1)
	PP_CASE(2, 3) PP_CASE(2, 2) PP_CASE(2, 1)
	PP_CASE(1, 3) PP_CASE(1, 2)
	default: PP_CASE(1, 1)
	}
#undef PP_CASE
}

/* Rows [r, r + nr) of W as f32 into p (nr, cols): the values tile_256 feeds
 * its FMAs (whole 8-column chunks only, see above); XSC: those of the decode
 * tiles with scaled activations, code * 2^-120. */
T256 static void pp_panel_256(float *p, const struct llm_weight *w, int64_t r, int64_t nr, int xsc)
{
	int64_t n = w->cols;
	enum llm_dtype dt = w->dtype;
	int fp8 = dt == LLM_DTYPE_E4M3;
	int64_t bk = fp8 ? w->block_cols : n;
	for (int64_t i = 0; i < nr; i++) {
		const float *srow = fp8 ? w->scale + ((r + i) / w->block_rows) * w->scale_cols : NULL;
		float *pr = p + i * n;
		for (int64_t c0 = 0; c0 < n; c0 += bk) {
			int64_t ce = c0 + bk < n ? c0 + bk : n;
			if (fp8 && xsc) {
				for (int64_t c = c0; c < ce; c += 8)
					_mm256_store_ps(pr + c, wload_256(w, LLM_DTYPE_E4M3, r + i, c, 8, 1));
			} else if (fp8) {
				int wide = e4m3_wide(srow[c0 / bk]);
				__m256 sc = _mm256_set1_ps(e4m3_scale_256(srow[c0 / bk], wide));
				if (wide)
					for (int64_t c = c0; c < ce; c += 8)
						_mm256_store_ps(pr + c, _mm256_mul_ps(wload_256(w, LLM_DTYPE_E4M3, r + i, c, 8, 1), sc));
				else
					for (int64_t c = c0; c < ce; c += 8)
						_mm256_store_ps(pr + c, _mm256_mul_ps(wload_256(w, LLM_DTYPE_E4M3, r + i, c, 8, 0), sc));
			} else if (dt == LLM_DTYPE_BF16) {
				for (int64_t c = c0; c < ce; c += 8)
					_mm256_store_ps(pr + c, wload_256(w, LLM_DTYPE_BF16, r + i, c, 8, 1));
			} else {
				for (int64_t c = c0; c < ce; c += 8)
					_mm256_store_ps(pr + c, wload_256(w, LLM_DTYPE_F16, r + i, c, 8, 1));
			}
		}
	}
}

static int pp_fits(const struct llm_weight *w, int64_t n_tok)
{
	return n_tok >= PP_MIN_TOK && w->cols % 8 == 0 && w->cols <= PANEL_FLOATS &&
	       (w->dtype != LLM_DTYPE_E4M3 || w->block_cols % 8 == 0);
}

/* The end of the panel of at most MB rows from RB (below R1) for scaled
 * activations: to the scale row's end, in panels of about equal size (whole
 * PP_NR-row tiles where they fit): 128 rows of mb 63 as 45 + 45 + 38, not
 * 63 + 63 + 2. */
static int64_t pp_panel_end(const struct llm_weight *w, int64_t rb, int64_t r1, int64_t mb)
{
	int64_t end = (rb / w->block_rows + 1) * w->block_rows;
	end = end < r1 ? end : r1;
	int64_t left = end - rb, k = (left + mb - 1) / mb;
	int64_t size = (left + k - 1) / k;
	size = (size + PP_NR - 1) / PP_NR * PP_NR;
	int64_t re = rb + (size < mb ? size : mb);
	return re < end ? re : end;
}

/* not inlined: a decode would otherwise set up (and probe) its 140 KiB frame */
/* XSC: scaled activations (e4m3_xs): a panel's rows then lie in one scale
 * row, and each token tile's x is scaled once per column block. */
T256 __attribute__((noinline)) static void matmul_avx2_pp(float *y, int64_t ys, const float *x, int64_t xs, int64_t n_tok,
                                const struct llm_weight *w, int64_t r0, int64_t r1, int xsc)
{
	_Alignas(32) float panel[PANEL_FLOATS];                 /* (mb, n) f32 */
	_Alignas(32) float acc_save[PP_MB_MAX * PP_NT * 8];     /* (mb, PP_NT, 8) f32 */
	_Alignas(32) float xsb[PP_NT * KC_MAX];                 /* (PP_NT, kc) scaled x */
	int64_t n = w->cols;
	int64_t mb = PANEL_FLOATS / n < PP_MB_MAX ? PANEL_FLOATS / n : PP_MB_MAX;
	mb = mb >= PP_NR ? mb / PP_NR * PP_NR : mb;
	int64_t nkb = (n + KC_MAX - 1) / KC_MAX, kc = (n / 8 + nkb - 1) / nkb * 8;
	for (int64_t rb = r0, re; rb < r1; rb = re) {
		re = rb + mb < r1 ? rb + mb : r1;
		if (xsc)
			re = pp_panel_end(w, rb, r1, mb);
		const float *p = panel;
		if (w->dtype == LLM_DTYPE_F32)
			p = (const float *)w->data + (size_t)rb * (size_t)n;
		else
			pp_panel_256(panel, w, rb, re - rb, xsc);
		const float *srow = xsc ? w->scale + (rb / w->block_rows) * w->scale_cols : NULL;
		for (int64_t t = 0; t < n_tok; t += PP_NT) {
			int nt = n_tok - t < PP_NT ? (int)(n_tok - t) : PP_NT;
			for (int64_t c0 = 0; c0 < n; c0 += kc) {
				int64_t c1 = c0 + kc < n ? c0 + kc : n;
				const float *xt = x + t * xs;
				int64_t xts = xs, xo = 0;
				if (xsc) {            /* the decode tiles' x * (s * XS_S) */
					int64_t bk = w->block_cols;
					for (int64_t b0 = c0 / bk * bk; b0 < c1; b0 += bk) {
						__m256 sv = _mm256_set1_ps(srow[b0 / bk] * XS_S);
						int64_t lo = b0 > c0 ? b0 : c0, hi = b0 + bk < c1 ? b0 + bk : c1;
						for (int tt = 0; tt < nt; tt++)
							for (int64_t c = lo; c < hi; c += 8)
								_mm256_store_ps(xsb + tt * kc + (c - c0),
								                _mm256_mul_ps(_mm256_loadu_ps(x + (t + tt) * xs + c), sv));
					}
					xt = xsb;
					xts = kc;
					xo = c0;
				}
				for (int64_t r = rb; r < re; r += PP_NR) {
					int nr = re - r < PP_NR ? (int)(re - r) : PP_NR;
					pp_tile_256_dispatch(y + t * ys + r, ys, xt, xts, xo, p + (r - rb) * n, n,
					                     c0, c1, acc_save + (r - rb) * PP_NT * 8, c0 == 0, c1 == n,
					                     xsc ? XS_Y : 1.0f, nt, nr);
				}
			}
		}
	}
}

/* The prompt path in the grouped order: as matmul_avx2_pp (row panels
 * within a scale row, 3 x 4 token tiles, column blocks), in G_LAYOUT with
 * column blocks of up to 4 KC_MAX (a pass reads a quarter of one), and the
 * scaled x of up to PPG_TOK tokens made once per scale row, not once per
 * panel (a panel of a wide weight holds 3 rows: 5632 columns). */
#define PPG_TOK 256
T256 __attribute__((noinline)) static void matmul_avx2_pp_g(float *y, int64_t ys, const float *x, int64_t xs,
                                                            int64_t n_tok, const struct llm_weight *w,
                                                            int64_t r0, int64_t r1)
{
	_Alignas(32) float panel[PANEL_FLOATS];                 /* (mb, n) f32, G_LAYOUT */
	_Alignas(32) float acc_save[PP_MB_MAX * PP_NT * 8 * 4]; /* (mb, 4, PP_NT, 8) f32 */
	int64_t n = w->cols, bk = w->block_cols;
	int64_t mb = PANEL_FLOATS / n < PP_MB_MAX ? PANEL_FLOATS / n : PP_MB_MAX;
	mb = mb >= PP_NR ? mb / PP_NR * PP_NR : mb;
	int64_t nkb = (n + 4 * KC_MAX - 1) / (4 * KC_MAX), kc = (n / G_COLS + nkb - 1) / nkb * G_COLS;
	int64_t tch = n_tok < PPG_TOK ? n_tok : PPG_TOK;
	float *xa = aligned_alloc(32, (size_t)(tch * n) * sizeof *xa);   /* (tch, n) scaled x, G_LAYOUT */
	if (!xa) {          /* out of memory: a visibly wrong result */
		for (int64_t t = 0; t < n_tok; t++)
			for (int64_t r = r0; r < r1; r++)
				y[t * ys + r] = NAN;
		return;
	}
	int rs = row_scaled(w);
	for (int64_t t0 = 0; t0 < n_tok; t0 += tch) {
		int64_t tn = n_tok - t0 < tch ? n_tok - t0 : tch, seg = -1;
		for (int64_t rb = r0, re; rb < r1; rb = re) {
			re = rs ? (rb + mb < r1 ? rb + mb : r1) : pp_panel_end(w, rb, r1, mb);
			if (rs ? seg < 0 : rb / w->block_rows != seg) {
				seg = rb / w->block_rows;
				const float *srow = w->scale + seg * w->scale_cols;
				for (int64_t t = 0; t < tn; t++)
					for (int64_t k0 = 0; k0 < n; k0 += kc) {
						int64_t len = (k0 + kc < n ? kc : n - k0) / 4;
						for (int64_t b0 = k0 / bk * bk; b0 < k0 + 4 * len; b0 += bk) {
							__m256 sv = _mm256_set1_ps(rs ? XS_S : srow[b0 / bk] * XS_S);
							int64_t lo = b0 > k0 ? b0 : k0, hi = b0 + bk < k0 + 4 * len ? b0 + bk : k0 + 4 * len;
							for (int64_t c = lo; c < hi; c += 8)
								_mm256_store_ps(xa + t * n + k0 + g_pos(c - k0, len),
								                _mm256_mul_ps(_mm256_loadu_ps(x + (t0 + t) * xs + c), sv));
						}
					}
			}
			pp_panel_g(panel, w, rb, re - rb, kc);
			for (int64_t t = 0; t < tn; t += PP_NT) {
				int nt = tn - t < PP_NT ? (int)(tn - t) : PP_NT;
				for (int64_t c0 = 0; c0 < n; c0 += kc) {
					int64_t c1 = c0 + kc < n ? c0 + kc : n;
					for (int64_t r = rb; r < re; r += PP_NR) {
						int nr = re - r < PP_NR ? (int)(re - r) : PP_NR;
						pp_tile_g_dispatch(y + (t0 + t) * ys + r, ys, xa + t * n, n, 0, panel + (r - rb) * n, n,
						                   c0, c1, acc_save + (r - rb) * PP_NT * 8 * 4, c0 == 0, c1 == n,
						                   XS_Y, rs ? w->scale + r : NULL, nt, nr);
					}
				}
			}
		}
	}
	free(xa);
}

/* ---- AVX2: a few tokens over rows a stride apart -----------------------
 * A tile of rows side by side (r .. r + 3) reads 2-4 short streams that
 * start anew every tile: narrow rows (576 columns, 1152 bytes of bf16)
 * come from memory at half the rate of long ones. So up to STRIDE_NT tokens
 * take tiles of rows a quarter (a half) of the range apart, r, r + q, r +
 * 2q, r + 3q, each of them a long stream through its quarter, with a
 * prefetch one row ahead in each; 5 to 8 tokens pass as two token groups
 * (3 + 2 .. 4 + 4: 8 accumulators at most) over the same STRIDE_BLOCK
 * bytes of rows, the second from cache, where the prompt panel made a
 * copy of the rows for 5 tokens as for 256. A row and token keep one
 * accumulator over the columns in order (tile_256): the bits of the tiles
 * of side-by-side rows and of the panel. One Zen 5 core at
 * LLM_CPU_ISA=avx2, bf16 from memory (matmul_bench): 1 token 49152 x 576
 * 18 -> 34 GB/s, 2048 x 2048 26 -> 34; 4 tokens 11 -> 19 and 14 -> 17;
 * 5 / 8 tokens on 2048 x 2048 1081 -> 713 / 1250 -> 843 us. */
#define STRIDE_NT 8
#define STRIDE_BLOCK 16384

/* AVX2 has 16 registers: token tiles of up to 8 (5 to 8 tokens one row,
 * 3 or 4 two rows, 1 or 2 four rows: 8 accumulators at most). Up to
 * STRIDE_NT tokens take the strided tiles above, more the panel path where
 * it fits (the same bits), else token tiles of 8 over blocks of RB rows.
 * E4M3 weights of the scaled activations take the decode tiles (up to 4
 * tokens) and the panel, and in the grouped order its decode rows up to
 * DECG_NT tokens and its panel from there. */

T256 static void matmul_avx2(float *y, int64_t ys, const float *x, int64_t xs, int64_t n_tok,
                             const struct llm_weight *w, int64_t r0, int64_t r1)
{
	/* scaled activations only where the panel takes the prompts (up to
	 * PANEL_FLOATS columns), so that every token count computes them */
	int xsc = e4m3_xs(w) && w->cols <= PANEL_FLOATS;
	if (xsc && w->cols % G_COLS == 0 && w->block_cols % G_COLS == 0)
		xsc = 2;                /* the grouped order */
	if (xsc == 2 && n_tok <= DECG_NT) {
		matmul_avx2_dec_g(y, ys, x, xs, n_tok, w, r0, r1);
		return;
	}
	if (pp_fits(w, n_tok) && (n_tok > STRIDE_NT || xsc)) {
		if (xsc == 2)
			matmul_avx2_pp_g(y, ys, x, xs, n_tok, w, r0, r1);
		else
			matmul_avx2_pp(y, ys, x, xs, n_tok, w, r0, r1, xsc);
		return;
	}
	if (dec_fits(w, n_tok)) {
		matmul_avx2_dec(y, ys, x, xs, n_tok, w, r0, r1, xsc);
		return;
	}
	if (n_tok <= STRIDE_NT) {
		int nr = n_tok >= 3 ? 2 : 4;
		int64_t g = n_tok > 4 ? (n_tok + 1) / 2 : n_tok;
		int64_t q = (r1 - r0) / nr, rowb = w->cols * (int64_t)llm_dtype_size(w->dtype);
		int64_t sb = STRIDE_BLOCK / (nr * rowb) > 1 ? STRIDE_BLOCK / (nr * rowb) : 1;
		for (int64_t jb = 0; jb < q; jb += sb) {
			int64_t je = jb + sb < q ? jb + sb : q;
			for (int64_t t = 0; t < n_tok; t += g) {
				int nt = (int)(n_tok - t < g ? n_tok - t : g);
				for (int64_t j = jb; j < je; j++)
					tile_256_dispatch(y + t * ys, ys, x + t * xs, xs, nt, nr, w, r0 + j, q, t == 0);
			}
		}
		for (int64_t r = r0 + nr * q; r < r1; r++)
			for (int64_t t = 0; t < n_tok; t += g)
				tile_256_dispatch(y + t * ys, ys, x + t * xs, xs, (int)(n_tok - t < g ? n_tok - t : g), 1, w,
				                  r, 1, 1);
		return;
	}
	for (int64_t rb = r0; rb < r1; rb += RB) {
		int64_t re = rb + RB < r1 ? rb + RB : r1;
		for (int64_t t = 0; t < n_tok; ) {
			/* up to 8 tokens in one pass over the weights (a decode of a
			 * few sequences, a speculative verify): 8 accumulators at most */
			int nt = n_tok - t >= 8 ? 8 : (int)(n_tok - t), nr = nt >= 5 ? 1 : nt >= 3 ? 2 : 4;
			int64_t r = rb;
			for (; r + nr <= re; r += nr)
				tile_256_dispatch(y + t * ys, ys, x + t * xs, xs, nt, nr, w, r, 1, nr);
			for (; r < re; r++)
				tile_256_dispatch(y + t * ys, ys, x + t * xs, xs, nt, 1, w, r, 1, 1);
			t += nt;
		}
	}
}

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
	if (isa >= LLM_ISA_AVX512BF16 && (t == LLM_DTYPE_BF16 || t == LLM_DTYPE_E4M3))
		return LLM_ISA_AVX512BF16;
	if (isa >= LLM_ISA_AVX512)
		return LLM_ISA_AVX512;
	return isa < LLM_ISA_SCALAR ? LLM_ISA_SCALAR : isa;
}

void llm_cpu_x_to_bf16(uint16_t *dst, int64_t dst_stride, const float *x, int64_t x_stride,
                       int64_t n_tok, int64_t cols)
{
	x_to_bf16_512(dst, dst_stride, x, x_stride, n_tok, cols);
}

void llm_cpu_matmul_rows_bf16x(float *y, int64_t y_stride, const uint16_t *xb, int64_t xb_stride,
                               int64_t n_tok, const struct llm_weight *w, int64_t r0, int64_t r1)
{
	matmul_dot(y, y_stride, xb, xb_stride, n_tok, w, r0, r1);
}

void llm_cpu_matmul_rows(enum llm_cpu_isa isa, float *y, int64_t y_stride,
                         const float *x, int64_t x_stride, int64_t n_tok,
                         const struct llm_weight *w, int64_t r0, int64_t r1)
{
	switch (llm_cpu_matmul_isa(isa, w->dtype)) {
	case LLM_ISA_AVX512BF16: {
		/* the backend rounds x once per matmul into its own buffer; this
		 * entry (the op tests) rounds a few tokens at a time */
		uint16_t xb[4 * 1024];
		int64_t per = (int64_t)(sizeof xb / sizeof *xb) / w->cols;
		if (per >= 1) {
			per = per >= 4 ? per / 4 * 4 : per;
			for (int64_t t = 0; t < n_tok; t += per) {
				int64_t k = n_tok - t < per ? n_tok - t : per;
				x_to_bf16_512(xb, w->cols, x + t * x_stride, x_stride, k, w->cols);
				matmul_dot(y + t * y_stride, y_stride, xb, w->cols, k, w, r0, r1);
			}
			break;
		}
		uint16_t *xh = malloc((size_t)w->cols * sizeof *xh);
		if (!xh) {          /* out of memory: a visibly wrong result */
			for (int64_t t = 0; t < n_tok; t++)
				for (int64_t r = r0; r < r1; r++)
					y[t * y_stride + r] = NAN;
			break;
		}
		for (int64_t t = 0; t < n_tok; t++) {
			x_to_bf16_512(xh, w->cols, x + t * x_stride, x_stride, 1, w->cols);
			matmul_dot(y + t * y_stride, y_stride, xh, w->cols, 1, w, r0, r1);
		}
		free(xh);
		break;
	}
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
