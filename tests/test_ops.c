/* tests/test_ops.c: every op of the CPU backend, at every level this CPU
 * runs, against the plain reference (common/engine/cpu_ref.h); every SIMD path
 * against the scalar one; plus the KV cache bookkeeping.
 *
 * Against the reference (test_ref; u = 2^-24, the reference being the
 * exact result rounded once, each bound is the optimised op's worst case,
 * derived at its check):
 * - matmul, every weight dtype and E4M3 block shape, matmul_n:
 *   |cpu - ref| <= (k + 2) u sum|x w| (f32 sums in any order); at
 *   avx512bf16 the reference rounds x and w to bf16 as the kernels do.
 *   Small integers and power-of-two scales: bit for bit.
 * - rmsnorm, add_rmsnorm: rtol (n/2 + 6) u; the residual x + y exact.
 * - swiglu: rtol 8 u (llm_cpu_exp 2 ulp, four roundings), atol 1e-30.
 * - rope (positions to 131071): atol 8 u (|x| <= 1; the f32 angle is the
 *   definition on both sides). softmax: rtol (2 max|x - max| + n + 8) u.
 * - attention: (2 (d + 2) sqrt(d) + 4 sqrt(d) + 2 n + 8) u absolute for
 *   |q|, |k|, |v| <= 1 (d = d_head, n = positions).
 * - embed, add, gather, kv_store and the store of rope_store (f32, bf16 and fp8
 *   caches): exact.
 *
 * Between levels (the reason for each):
 * - matmul, every weight dtype: SIMD levels sum in another order than the
 *   scalar loop, both in f32, and nothing else differs (an element is
 *   dequantized and scaled identically on every level). The worst-case
 *   bound of reordering n f32 additions is about n * 2^-24 * sum|x w|, so
 *   the test requires |simd - scalar| <= n * 2^-24 * sum_c |x_c w_c|.
 * - matmul at avx512bf16 (BF16 and E4M3 weights): x is rounded to bf16, so
 *   the scalar reference runs on the same rounded x. E4M3 there takes each
 *   element as the bf16 of code * scale, so its scalar reference runs on
 *   those bf16 weights (the same n bound), and the E4M3 matmul must equal
 *   the avx512bf16 matmul of that BF16 matrix bit for bit.
 * - crafted inputs whose products and sums are exact (small integers,
 *   power-of-two scales): every level must agree bit for bit.
 * - batch invariance: a row computed alone, in a batch of 7 or a prompt
 *   of 37 tokens, or in a thread's row range gives the same bits on every
 *   level.
 * - attention through the backend: scores use the SIMD dot (same bound,
 *   n = d_head), softmax and the weighted sum are scalar: rtol 1e-5. */
#define _GNU_SOURCE
#include "check.h"
#include "backend.h"
#include "cpu_ref.h"
#include "kvcache.h"
#include "dtype.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng = 88172645463325252ull;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) * 0x1.0p-53;
}
static float frand(void) { return (float)(urand() * 2 - 1); }
/* the KV cache element types, in the order the tests loop over them */
static const enum llm_dtype KV_DT[3] = { LLM_DTYPE_F32, LLM_DTYPE_BF16, LLM_DTYPE_E4M3 };

struct wbuf {
	struct llm_weight w;
	void *data;
	float *scale;
	float *deq;      /* (rows, cols) the dequantized values, for the bound */
};

/* A random weight of DTYPE; E4M3 with blocks br x bc (0: whole dimension). */
static void make_weight(struct wbuf *b, enum llm_dtype dt, int64_t rows, int64_t cols,
                        int64_t br, int64_t bc, int exact)
{
	memset(b, 0, sizeof *b);
	size_t n = (size_t)(rows * cols);
	b->data = malloc(n * llm_dtype_size(dt));
	b->deq = malloc(n * sizeof(float));
	b->w.name = "test";
	b->w.dtype = dt;
	b->w.rows = rows;
	b->w.cols = cols;
	b->w.data = b->data;
	if (dt == LLM_DTYPE_E4M3) {
		br = br ? br : rows;
		bc = bc ? bc : cols;
		b->w.block_rows = br;
		b->w.block_cols = bc;
		b->w.scale_rows = (rows + br - 1) / br;
		b->w.scale_cols = (cols + bc - 1) / bc;
		b->scale = malloc((size_t)(b->w.scale_rows * b->w.scale_cols) * sizeof(float));
		for (int64_t i = 0; i < b->w.scale_rows * b->w.scale_cols; i++)
			b->scale[i] = exact ? ldexpf(1.0f, (int)(urand() * 6) - 3)
			              : (float)((urand() * 0.01 + 1e-4) * (i % 3 == 2 ? -1 : 1));   /* some negative */
		b->w.scale = b->scale;
	}
	for (size_t i = 0; i < n; i++) {
		float v = exact ? (float)((int)(urand() * 9) - 4) : frand();
		switch (dt) {
		case LLM_DTYPE_F32: ((float *)b->data)[i] = v; break;
		case LLM_DTYPE_F16: ((uint16_t *)b->data)[i] = llm_f32_to_f16(v); break;
		case LLM_DTYPE_BF16: ((uint16_t *)b->data)[i] = llm_f32_to_bf16(v); break;
		default: {
			uint8_t c = exact ? llm_f32_to_e4m3(v) : (uint8_t)(urand() * 256);
			if ((c & 0x7f) == 0x7f)
				c = 0x3f;          /* no NaN codes */
			((uint8_t *)b->data)[i] = c;
		}
		}
	}
	for (int64_t r = 0; r < rows; r++)
		llm_weight_row_f32(&b->w, r, b->deq + r * cols);
}

static void free_weight(struct wbuf *b)
{
	free(b->data);
	free(b->scale);
	free(b->deq);
}

static const char *wname(enum llm_dtype dt, int64_t br, int64_t bc)
{
	static char s[64];
	if (dt != LLM_DTYPE_E4M3)
		return llm_dtype_name(dt);
	snprintf(s, sizeof s, "E4M3 %lldx%lld", (long long)br, (long long)bc);
	return s;
}

/* SIMD level ISA vs scalar on one weight: bound check, then invariance. */
static void matmul_case(enum llm_cpu_isa isa, enum llm_dtype dt, int64_t rows, int64_t cols,
                        int64_t br, int64_t bc)
{
	struct wbuf b;
	make_weight(&b, dt, rows, cols, br, bc, 0);
	int n_tok = 7;
	float *x = malloc((size_t)(n_tok * cols) * sizeof(float));
	float *ref = malloc((size_t)(n_tok * rows) * sizeof(float));
	float *got = malloc((size_t)(n_tok * rows) * sizeof(float));
	float *one = malloc((size_t)rows * sizeof(float));
	for (int64_t i = 0; i < n_tok * cols; i++)
		x[i] = frand();
	/* the BF16 dot-product path rounds activations to bf16: so does its reference */
	int bfx = llm_cpu_matmul_isa(isa, dt) == LLM_ISA_AVX512BF16;
	float *xr = malloc((size_t)(n_tok * cols) * sizeof(float));
	for (int64_t i = 0; i < n_tok * cols; i++)
		xr[i] = bfx ? llm_bf16_to_f32(llm_f32_to_bf16(x[i])) : x[i];
	/* E4M3 at avx512bf16: each element is bf16(code * scale) (see the top) */
	int bfw = bfx && dt == LLM_DTYPE_E4M3;
	uint16_t *w16 = NULL;
	struct llm_weight wb = b.w;
	if (bfw) {
		w16 = malloc((size_t)(rows * cols) * sizeof *w16);
		for (int64_t i = 0; i < rows * cols; i++) {
			w16[i] = llm_f32_to_bf16(b.deq[i]);
			b.deq[i] = llm_bf16_to_f32(w16[i]);
		}
		wb = (struct llm_weight){ "test-bf16", LLM_DTYPE_BF16, rows, cols, w16, NULL, 0, 0, 0, 0 };
	}
	llm_cpu_matmul_rows(LLM_ISA_SCALAR, ref, rows, xr, cols, n_tok, &wb, 0, rows);
	llm_cpu_matmul_rows(isa, got, rows, x, cols, n_tok, &b.w, 0, rows);
	double nfac = (double)cols;
	double worst = 0;
	int bad = 0;
	for (int t = 0; t < n_tok; t++)
		for (int64_t r = 0; r < rows; r++) {
			double mag = 0;
			for (int64_t c = 0; c < cols; c++)
				mag += fabs((double)xr[t * cols + c] * b.deq[r * cols + c]);
			double bound = nfac * 0x1.0p-24 * mag + 1e-30;
			double e = fabs((double)got[t * rows + r] - ref[t * rows + r]) / bound;
			if (!(e <= 1.0))
				bad++;
			if (e > worst || isnan(e))
				worst = e;
		}
	check(!bad, "matmul %s %s %lldx%lld, 7 tokens: |simd - scalar%s| <= n 2^-24 sum|xw| (worst %.3f of the bound)",
	      llm_cpu_isa_name(llm_cpu_matmul_isa(isa, dt)), wname(dt, br, bc), (long long)rows, (long long)cols,
	      bfw ? " on bf16-rounded x and bf16(code * scale)" : bfx ? " on bf16-rounded x" : "", worst);
	if (bfw) {     /* the same bits as the BF16 matrix of those weights */
		llm_cpu_matmul_rows(isa, ref, rows, x, cols, n_tok, &wb, 0, rows);
		check(!memcmp(ref, got, (size_t)(n_tok * rows) * sizeof(float)),
		      "matmul %s %s %lldx%lld = avx512bf16 matmul of its bf16(code * scale) matrix, bit for bit",
		      llm_cpu_isa_name(isa), wname(dt, br, bc), (long long)rows, (long long)cols);
	}
	free(w16);
	free(xr);
	/* invariance: each token alone, and rows in odd ranges */
	int same = 1;
	for (int t = 0; t < n_tok; t++) {
		llm_cpu_matmul_rows(isa, one, rows, x + t * cols, cols, 1, &b.w, 0, rows);
		if (memcmp(one, got + t * rows, (size_t)rows * sizeof(float)))
			same = 0;
	}
	int64_t cut = rows / 3 | 1;
	llm_cpu_matmul_rows(isa, ref, rows, x, cols, n_tok, &b.w, 0, cut);
	llm_cpu_matmul_rows(isa, ref, rows, x, cols, n_tok, &b.w, cut, rows);
	if (memcmp(ref, got, (size_t)(n_tok * rows) * sizeof(float)))
		same = 0;
	check(same, "matmul %s %s: a token alone, in a batch of 7 or in a split row range: same bits",
	      llm_cpu_isa_name(isa), wname(dt, br, bc));
	free(x);
	free(ref);
	free(got);
	free(one);
	free_weight(&b);
}

/* Exact inputs: every level equals the scalar bit for bit. */
static void matmul_exact(enum llm_cpu_isa isa, enum llm_dtype dt, int64_t br, int64_t bc)
{
	int64_t rows = 19, cols = 200;
	struct wbuf b;
	make_weight(&b, dt, rows, cols, br, bc, 1);
	int n_tok = 5;
	float *x = malloc((size_t)(n_tok * cols) * sizeof(float));
	float *ref = malloc((size_t)(n_tok * rows) * sizeof(float));
	float *got = malloc((size_t)(n_tok * rows) * sizeof(float));
	for (int64_t i = 0; i < n_tok * cols; i++)
		x[i] = (float)((int)(urand() * 7) - 3);
	llm_cpu_matmul_rows(LLM_ISA_SCALAR, ref, rows, x, cols, n_tok, &b.w, 0, rows);
	llm_cpu_matmul_rows(isa, got, rows, x, cols, n_tok, &b.w, 0, rows);
	check(!memcmp(ref, got, (size_t)(n_tok * rows) * sizeof(float)),
	      "matmul %s %s on small integers and power-of-two scales: equal to scalar bit for bit",
	      llm_cpu_isa_name(isa), wname(dt, br, bc));
	free(x);
	free(ref);
	free(got);
	free_weight(&b);
}

/* MIN_TOK..MAX_TOK tokens at a time through weight B, x rows XS apart,
 * computed in two row ranges split at CUT: the bits of each token alone
 * (the decode tiles). Returns 1 when every size agreed. */
static int matmul_vs_alone(enum llm_cpu_isa isa, const struct wbuf *b, int min_tok, int max_tok, int64_t xs,
                           int64_t cut)
{
	int64_t rows = b->w.rows, cols = b->w.cols;
	float *x = malloc((size_t)(max_tok * xs) * sizeof(float));
	float *got = malloc((size_t)(max_tok * rows) * sizeof(float));
	float *one = malloc((size_t)(max_tok * rows) * sizeof(float));
	for (int64_t i = 0; i < max_tok * xs; i++)
		x[i] = frand();
	int same = 1;
	for (int n_tok = min_tok; n_tok <= max_tok; n_tok++) {
		llm_cpu_matmul_rows(isa, got, rows, x, xs, n_tok, &b->w, 0, cut);
		llm_cpu_matmul_rows(isa, got, rows, x, xs, n_tok, &b->w, cut, rows);
		for (int t = 0; t < n_tok; t++)
			llm_cpu_matmul_rows(isa, one + t * rows, rows, x + t * xs, cols, 1, &b->w, 0, rows);
		same &= !memcmp(one, got, (size_t)(n_tok * rows) * sizeof(float));
	}
	free(x);
	free(got);
	free(one);
	return same;
}

/* A decode batch of 2 to 8 tokens (at AVX2: the decode tiles up to 4, the
 * panel path from 5) with a strided x, and a prompt of 37 tokens (the AVX2
 * prefill path: row panels, 4-token tiles and a 1-token tail, two column
 * blocks): the bits of each token computed alone, in split row ranges. */
static void matmul_batch(enum llm_cpu_isa isa, enum llm_dtype dt, int64_t br, int64_t bc)
{
	struct wbuf b;
	make_weight(&b, dt, 23, 1000, br, bc, 0);
	check(matmul_vs_alone(isa, &b, 2, 8, 1011, 9),
	      "matmul %s %s 23x1000, batches of 2..8 tokens, x stride 1011, split rows: the bits of each token alone",
	      llm_cpu_isa_name(isa), wname(dt, br, bc));
	free_weight(&b);
}

static void matmul_prefill(enum llm_cpu_isa isa, enum llm_dtype dt, int64_t br, int64_t bc)
{
	struct wbuf b;
	make_weight(&b, dt, 70, 1000, br, bc, 0);
	check(matmul_vs_alone(isa, &b, 37, 37, 1000, 31),
	      "matmul %s %s 70x1000, a prompt of 37 tokens in split row ranges: the bits of each token alone",
	      llm_cpu_isa_name(isa), wname(dt, br, bc));
	free_weight(&b);
}

/* AVX2 puts an E4M3 weight's block scale on the activations only where
 * every scale of the weight is plain (0, or 2^-40 to 2^16: cpu_matmul.c);
 * one other scale (ODD) sends the whole weight to code * scale. Either way a
 * token alone, in decode batches of 1..8 and in a prompt of 37 gives the
 * same bits, in split row ranges. */
static void matmul_odd_scale(enum llm_cpu_isa isa)
{
	static const float odd[] = { 0x1p20f, 0x1p-60f, 0.0f };
	int same = 1;
	for (size_t k = 0; k < sizeof odd / sizeof *odd; k++) {
		struct wbuf b;
		make_weight(&b, LLM_DTYPE_E4M3, 70, 1000, 16, 128, 0);
		b.scale[13] = odd[k];           /* scale row 1: rows 16..31 */
		same &= matmul_vs_alone(isa, &b, 1, 8, 1011, 9);
		same &= matmul_vs_alone(isa, &b, 37, 37, 1000, 31);
		free_weight(&b);
	}
	check(same, "matmul %s E4M3 16x128 70x1000 with one scale of 2^20, 2^-60 or 0: 1..8 and 37 tokens, "
	      "split rows: the bits of each token alone", llm_cpu_isa_name(isa));
}

/* E4M3 weights of whole 32-column groups (AVX2: the grouped order, a row
 * at a time in decode, the panel's four parts in a prompt; cpu_matmul.c):
 * block scales shared by 128, 4 and 1 rows, two column blocks in a prompt,
 * activations of more than the decode's 64 KiB (3 and 4 tokens of 8192
 * columns): a token alone, in decode batches of 1..8 and in a prompt of 37,
 * in split row ranges, gives the same bits; and the scalar bound holds. */
static void matmul_grouped(enum llm_cpu_isa isa)
{
	static const int64_t shape[][4] = {   /* rows, cols, block rows, block cols */
		{ 23, 1024, 128, 128 }, { 70, 1024, 4, 64 }, { 9, 8192, 1, 8192 }, { 19, 4096, 4, 128 },
		{ 13, 576, 1, 576 },
	};
	int same = 1;
	for (size_t s = 0; s < sizeof shape / sizeof *shape; s++) {
		struct wbuf b;
		make_weight(&b, LLM_DTYPE_E4M3, shape[s][0], shape[s][1], shape[s][2], shape[s][3], 0);
		same &= matmul_vs_alone(isa, &b, 1, 8, shape[s][1] + 32, 5);
		same &= matmul_vs_alone(isa, &b, 37, 37, shape[s][1], 7);
		free_weight(&b);
		matmul_case(isa, LLM_DTYPE_E4M3, shape[s][0], shape[s][1], shape[s][2], shape[s][3]);
	}
	check(same, "matmul %s E4M3 in 32-column groups (23x1024 128x128, 70x1024 4x64, 9x8192 and 13x576 a scale "
	      "a row, 19x4096 4x128): 1..8 and 37 tokens, split rows: the bits of each token alone", llm_cpu_isa_name(isa));
}

/* Every E4M3 code through the SIMD decode: W (1, 256) = codes 0..255 with
 * one scale, x one-hot: y = table[code] * scale, rounded once, whatever
 * the scale: 2^-3, one whose product with 2^120 would overflow (256 and
 * up: the AVX2 level converts those blocks another way), just under it,
 * a subnormal one, a negative one; 256 tokens at once (the prompt path) and
 * each token alone (the decode tiles). At avx512bf16 the element is the
 * bf16 of that f32 product (nearest even), and a product below 2^-126 is
 * zero (the bf16 dot product flushes subnormal inputs: cpu_matmul.c). */
static void e4m3_codes(enum llm_cpu_isa isa)
{
	static const float scales[] = { 0.125f, 1000.0f, 255.5f, 256.0f, 0x1p-130f, -3.0f };
	uint8_t codes[256];
	static float x[256 * 256];
	float y[256], y1[256], want[256];
	int bad = 0, bad1 = 0, bf = llm_cpu_matmul_isa(isa, LLM_DTYPE_E4M3) == LLM_ISA_AVX512BF16;
	for (int i = 0; i < 256; i++)
		codes[i] = (uint8_t)((i & 0x7f) == 0x7f ? 0 : i);
	memset(x, 0, sizeof x);
	for (int t = 0; t < 256; t++)
		x[t * 256 + t] = 1.0f;
	for (size_t k = 0; k < sizeof scales / sizeof *scales; k++) {
		float scale = scales[k];
		struct llm_weight w = { "codes", LLM_DTYPE_E4M3, 1, 256, codes, &scale, 1, 1, 1, 256 };
		for (int t = 0; t < 256; t++) {
			want[t] = llm_e4m3_table[codes[t]] * scale;
			if (bf)
				want[t] = fabsf(want[t]) < 0x1p-126f ? 0.0f : llm_bf16_to_f32(llm_f32_to_bf16(want[t]));
		}
		llm_cpu_matmul_rows(isa, y, 1, x, 256, 256, &w, 0, 1);
		for (int t = 0; t < 256; t++)
			llm_cpu_matmul_rows(isa, &y1[t], 1, x + t * 256, 256, 1, &w, 0, 1);
		for (int t = 0; t < 256; t++) {
			bad += llm_f32_bits(y[t]) != llm_f32_bits(want[t]) && !(y[t] == 0 && want[t] == 0);
			bad1 += llm_f32_bits(y1[t]) != llm_f32_bits(want[t]) && !(y1[t] == 0 && want[t] == 0);
		}
	}
	check(!bad && !bad1, "E4M3 decode on %s: all 254 non-NaN codes %s at 6 scales (2^-3, 1000, 255.5, 256, "
	      "2^-130, -3), 256 tokens at once and each alone (%d, %d wrong)", llm_cpu_isa_name(isa),
	      bf ? "bf16(code * scale)" : "exact", bad, bad1);
}

/* E4M3 at avx512bf16: the AVX512_VBMI kernels (64 codes per step, byte
 * permutes) give the same bits as the word-permute ones, for every code
 * (NaN included), ragged widths and tails, 1 to 9 tokens (decode tiles and
 * the bf16 copy of prefill) and block widths of 64 and more. */
static void e4m3_vbmi(void)
{
	if (!llm_cpu_matmul_vbmi(-1)) {
		check_skip("this CPU lacks AVX512_VBMI", "E4M3 matmul, VBMI kernels against the word-permute ones");
		return;
	}
	static const int64_t shape[][4] = {   /* rows, cols, block rows, block cols */
		{ 64, 576, 128, 128 }, { 37, 300, 1, 128 }, { 13, 200, 1, 0 }, { 9, 1000, 16, 64 },
		{ 5, 70, 0, 0 }, { 130, 127, 128, 96 }, { 3, 8300, 1, 64 }, { 7, 2000, 3, 96 },
	};
	int same = 1, cases = 0;
	for (size_t s = 0; s < sizeof shape / sizeof *shape; s++) {
		struct wbuf wb;
		int64_t rows = shape[s][0], cols = shape[s][1];
		make_weight(&wb, LLM_DTYPE_E4M3, rows, cols, shape[s][2], shape[s][3], 0);
		uint8_t *codes = wb.data;
		for (int64_t i = 0; i < rows * cols; i += 97)
			codes[i] = (uint8_t)(i & 1 ? 0xff : 0x7f);   /* NaN codes */
		for (int c = 0; c < 256 && c < rows * cols; c++)
			codes[c] = (uint8_t)c;                        /* every code */
		for (int nt = 1; nt <= 9; nt += 4) {
			float *x = malloc((size_t)(nt * cols) * 4), *y0 = malloc((size_t)(nt * rows) * 4);
			float *y1 = malloc((size_t)(nt * rows) * 4);
			for (int64_t i = 0; i < nt * cols; i++)
				x[i] = frand();
			llm_cpu_matmul_vbmi(0);
			llm_cpu_matmul_rows(LLM_ISA_AVX512BF16, y0, rows, x, cols, nt, &wb.w, 0, rows);
			llm_cpu_matmul_vbmi(1);
			llm_cpu_matmul_rows(LLM_ISA_AVX512BF16, y1, rows, x, cols, nt, &wb.w, 0, rows);
			same &= !memcmp(y0, y1, (size_t)(nt * rows) * 4);
			cases++;
			free(x);
			free(y0);
			free(y1);
		}
		free_weight(&wb);
	}
	llm_cpu_matmul_vbmi(1);
	check(same, "E4M3 matmul: VBMI kernels = word-permute kernels bit for bit (%d cases, NaN codes, tails)",
	      cases);
}

static void test_matmul(enum llm_cpu_isa best)
{
	static const struct { enum llm_dtype dt; int64_t br, bc; } w[] = {
		{ LLM_DTYPE_F32, 0, 0 }, { LLM_DTYPE_F16, 0, 0 }, { LLM_DTYPE_BF16, 0, 0 },
		{ LLM_DTYPE_E4M3, 128, 128 }, { LLM_DTYPE_E4M3, 1, 128 }, { LLM_DTYPE_E4M3, 1, 0 },
		{ LLM_DTYPE_E4M3, 16, 32 }, { LLM_DTYPE_E4M3, 0, 0 }, { LLM_DTYPE_E4M3, 4, 40 },
		{ LLM_DTYPE_E4M3, 4, 64 },
	};
	/* 70 x 384: 4-row tiles and a 2-row tail over columns in whole 64-code
	 * steps, where a batch's first token tile converts as it multiplies */
	static const int64_t shape[][2] = { { 37, 172 }, { 64, 64 }, { 130, 300 }, { 5, 7 }, { 70, 384 } };
	for (enum llm_cpu_isa isa = LLM_ISA_AVX2; isa <= LLM_ISA_AVX512BF16; isa++) {
		if (isa > best) {
			check_skip("this CPU lacks it", "matmul on %s", llm_cpu_isa_name(isa));
			continue;
		}
		for (size_t k = 0; k < sizeof w / sizeof *w; k++) {
			if (llm_cpu_matmul_isa(isa, w[k].dt) != isa)
				continue;         /* the same kernels as the level below */
			for (size_t s = 0; s < sizeof shape / sizeof *shape; s++)
				matmul_case(isa, w[k].dt, shape[s][0], shape[s][1], w[k].br, w[k].bc);
			matmul_exact(isa, w[k].dt, w[k].br, w[k].bc);
			matmul_prefill(isa, w[k].dt, w[k].br, w[k].bc);
			matmul_batch(isa, w[k].dt, w[k].br, w[k].bc);
		}
		/* more than 128 scale blocks in a row (the kernels keep the tables
		 * of 128), in the bf16 copy (n <= 8192) and in registers */
		matmul_case(isa, LLM_DTYPE_E4M3, 5, 4000, 2, 24);
		matmul_case(isa, LLM_DTYPE_E4M3, 3, 8300, 1, 64);
		matmul_odd_scale(isa);
		matmul_grouped(isa);
		e4m3_codes(isa);
		if (isa == LLM_ISA_AVX512BF16) {
			e4m3_vbmi();
			continue;
		}
		/* the attention dot */
		float a[77], b[77];
		for (int i = 0; i < 77; i++) {
			a[i] = frand();
			b[i] = frand();
		}
		double worst = 0, mag = 0;
		for (int n = 1; n <= 77; n++) {
			float r = llm_cpu_dot(LLM_ISA_SCALAR, a, b, n), g = llm_cpu_dot(isa, a, b, n);
			mag = 0;
			for (int i = 0; i < n; i++)
				mag += fabs((double)a[i] * b[i]);
			double e = fabs((double)g - r) / (n * 0x1.0p-24 * mag);
			if (e > worst)
				worst = e;
		}
		check(worst <= 1.0, "dot %s, n = 1..77: within n 2^-24 sum|ab| of scalar (worst %.3f)",
		      llm_cpu_isa_name(isa), worst);
	}
	e4m3_codes(LLM_ISA_SCALAR);
}

/* llm_cpu_exp: within 2 ulp of e^x (rounded from double) over its range,
 * clamped outside it; the softmax and SwiGLU helpers give the same bits at
 * the best ISA as one lane at a time (scalar), ragged lengths included, and
 * the softmax is within a few ulp of the double-precision one. */
static float ulps(float a, float b)
{
	int32_t ia, ib;
	memcpy(&ia, &a, 4);
	memcpy(&ib, &b, 4);
	return (float)fabs((double)ia - (double)ib);
}

static void test_exp(enum llm_cpu_isa best)
{
	float worst = 0, at = 0;
	for (int i = 0; i <= 2000000; i++) {
		float x = -87.0f + 175.0f * (float)i / 2000000.0f;
		float u = ulps(llm_cpu_exp(x), (float)exp((double)x));
		if (u > worst) {
			worst = u;
			at = x;
		}
	}
	check(worst <= 2, "llm_cpu_exp within 2 ulp of exp over [-87, 88] (2M points): worst %.0f ulp at %g", worst, at);
	check(llm_cpu_exp(-1000.0f) == llm_cpu_exp(-87.0f) && llm_cpu_exp(-INFINITY) > 0 &&
	      isfinite(llm_cpu_exp(1000.0f)) && isfinite(llm_cpu_exp(INFINITY)) && llm_cpu_exp(0.0f) == 1.0f,
	      "llm_cpu_exp clamps: e^-inf = e^-87 > 0, e^inf finite, e^0 = 1");
	float a[67], b[67], g[67], u[67], o1[67], o2[67];
	int same = 1;
	for (int n = 1; n <= 67; n++) {
		for (int i = 0; i < n; i++) {
			a[i] = b[i] = 40.0f * frand();
			g[i] = (i % 11 == 3) ? 120.0f * frand() : 12.0f * frand();
			u[i] = frand();
		}
		if (n > 2) {
			g[1] = -0.0f;
			a[2] = b[2] = -300.0f;
		}
		float s1 = llm_cpu_softmax(best, a, n), s2 = llm_cpu_softmax(LLM_ISA_SCALAR, b, n);
		same &= s1 == s2;
		llm_cpu_silu_mul(best, o1, g, u, n);
		llm_cpu_silu_mul(LLM_ISA_SCALAR, o2, g, u, n);
		same &= !memcmp(a, b, (size_t)n * 4) && !memcmp(o1, o2, (size_t)n * 4);
	}
	/* weights of one size, so that the order of the sum shows in its bits */
	for (int n = 1; n <= 300 && same; n++) {
		float a2[300], b2[300];
		for (int i = 0; i < n; i++)
			a2[i] = b2[i] = frand();
		same &= llm_cpu_softmax(best, a2, n) == llm_cpu_softmax(LLM_ISA_SCALAR, b2, n)
		        && !memcmp(a2, b2, (size_t)n * 4);
	}
	double werr = 0;
	for (int n = 1; n <= 300; n += 7) {
		float x[300];
		double e[300], sum = 0, mx = -1e30;
		for (int i = 0; i < n; i++) {
			x[i] = 30.0f * frand();
			mx = x[i] > mx ? x[i] : mx;
		}
		for (int i = 0; i < n; i++)   /* of the f32 differences, as defined */
			sum += e[i] = exp((double)(x[i] - (float)mx));
		llm_cpu_softmax(best, x, n);
		for (int i = 0; i < n; i++) {
			double err = fabs(x[i] - e[i] / sum) / (e[i] / sum);
			werr = err > werr ? err : werr;
		}
	}
	check(werr < 4e-7, "softmax %s within 4e-7 relative of double, 1..300 elements (worst %.2g)",
	      llm_cpu_isa_name(best), werr);
	check(same, "softmax and SwiGLU %s equal scalar bit for bit, 1..67 elements, |g| to 120 (softmax: "
	      "and 1..300 elements in [-1, 1])",
	      llm_cpu_isa_name(best));
}

/* The attention block helpers equal per-position loops bit for bit:
 * scores = llm_cpu_dot / scale, values summed in position order (AVX-512:
 * fmaf; AVX2: the product rounded, then added); for 1 to 4 heads sharing
 * the rows, each head as if alone. E4M3 rows (where the level reads them)
 * give the bits of the f32 rows llm_cpu_e4m3_rows decodes them to: codes
 * of every kind (subnormal included) and per-row scales from 2^-20 to 2^40.
 * The weighted sum in two column ranges gives the bits of one call. */
static void test_attn_block(enum llm_cpu_isa best)
{
	static const int dims[] = { 24, 64, 80 };
	static const float rsc[5] = { 1.0f, 0x1p-20f, 3.1e-3f, 7.5f, 0x1.8p40f };
	enum { NPOS = 13, AS = 17 };
	for (int kt = 0; kt < 3; kt++)
		for (size_t di = 0; di < sizeof dims / sizeof *dims; di++) {
			int d = dims[di], ks = 3 * d + 5, same = 1, ran = 1;
			enum llm_dtype dt = kt == 2 ? LLM_DTYPE_E4M3 : kt ? LLM_DTYPE_BF16 : LLM_DTYPE_F32;
			if (!llm_cpu_attn_reads(best, dt, d))
				continue;
			float q[4 * 80], kf[80], att[4 * AS], ref[NPOS], o1[4 * 80], o2[80];
			float *k = malloc((size_t)(NPOS * ks) * 4), *v = malloc((size_t)(NPOS * ks) * 4);
			float ksc[NPOS * 2], vsc[NPOS * 2];     /* a scale per row, 2 apart */
			uint16_t *kh = malloc((size_t)(NPOS * ks) * 2), *vh = malloc((size_t)(NPOS * ks) * 2);
			uint8_t *k8 = malloc((size_t)(NPOS * ks)), *v8 = malloc((size_t)(NPOS * ks));
			for (int p = 0; p < NPOS; p++) {
				ksc[2 * p] = rsc[p % 5];
				vsc[2 * p] = rsc[(p + 2) % 5];
			}
			for (int i = 0; i < NPOS * ks; i++) {
				if (dt == LLM_DTYPE_E4M3) {
					k8[i] = (uint8_t)(rand() & 0xff);
					v8[i] = (uint8_t)(rand() & 0xff);
					k8[i] = (k8[i] & 0x7f) == 0x7f ? 0x01 : k8[i];   /* no NaN codes */
					v8[i] = (v8[i] & 0x7f) == 0x7f ? 0x81 : v8[i];
					k[i] = llm_e4m3_to_f32(k8[i]) * ksc[2 * (i / ks)];
					v[i] = llm_e4m3_to_f32(v8[i]) * vsc[2 * (i / ks)];
					continue;
				}
				kh[i] = llm_f32_to_bf16(frand());
				vh[i] = llm_f32_to_bf16(frand());
				k[i] = llm_bf16_to_f32(kh[i]);
				v[i] = llm_bf16_to_f32(vh[i]);
			}
			const void *kin = kt == 2 ? (const void *)k8 : kt ? (const void *)kh : k;
			const void *vin = kt == 2 ? (const void *)v8 : kt ? (const void *)vh : v;
			for (int i = 0; i < 4 * d; i++)
				q[i] = frand();
			for (int nh = 1; nh <= 4; nh++)
				for (int n = 1; n <= NPOS; n++) {
					if (!llm_cpu_attn_scores(best, att, AS, q, nh, kin, dt, ks, ksc, 2, n, d, 8.0f)) {
						ran = 0;
						break;
					}
					for (int h = 0; h < nh; h++) {
						for (int p = 0; p < n; p++) {
							memcpy(kf, k + p * ks, (size_t)d * 4);
							ref[p] = llm_cpu_dot(best, q + h * d, kf, d) / 8.0f;
						}
						same &= !memcmp(att + h * AS, ref, (size_t)n * 4);
					}
					if (dt == LLM_DTYPE_E4M3)       /* weights of a softmax's size: no overflow */
						for (int i = 0; i < 4 * AS; i++)
							att[i] = frand() * 0x1p-40f;
					for (int i = 0; i < nh * d; i++)
						o1[i] = frand();
					float o0[4 * 80];
					memcpy(o0, o1, (size_t)(nh * d) * 4);
					llm_cpu_attn_wsum(best, o1, nh, att, AS, vin, dt, ks, vsc, 2, n, d, 0, d);
					/* the columns in two ranges: the same bits */
					float o3[4 * 80];
					int cm = 8 * (d / 16);
					memcpy(o3, o0, (size_t)(nh * d) * 4);
					same &= llm_cpu_attn_wsum(best, o3, nh, att, AS, vin, dt, ks, vsc, 2, n, d, cm, d);
					same &= llm_cpu_attn_wsum(best, o3, nh, att, AS, vin, dt, ks, vsc, 2, n, d, 0, cm);
					same &= !memcmp(o3, o1, (size_t)(nh * d) * 4);
					for (int h = 0; h < nh; h++) {
						memcpy(o2, o0 + h * d, (size_t)d * 4);
						for (int p = 0; p < n; p++)
							for (int i = 0; i < d; i++)
								o2[i] = best >= LLM_ISA_AVX512 ? fmaf(att[h * AS + p], v[p * ks + i], o2[i])
								                               : o2[i] + att[h * AS + p] * v[p * ks + i];
						same &= !memcmp(o1 + h * d, o2, (size_t)d * 4);
					}
				}
			if (ran)
				check(same, "attention block helpers %s, %s KV, d_head %d, 1..4 heads x 1..13 positions, columns whole and in two ranges: same bits as the loops",
				      llm_cpu_isa_name(best), llm_dtype_name(dt), d);
			else
				check(0, "attention block helpers %s, %s KV, d_head %d: refused rows llm_cpu_attn_reads accepts",
				      llm_cpu_isa_name(best), llm_dtype_name(dt), d);
			free(k);
			free(v);
			free(kh);
			free(vh);
			free(k8);
			free(v8);
		}
}

/* ---- backend ops: scalar backend vs SIMD backend ------------------------ */

/* E4M3 cache rows to f32: every code (but the NaN codes, which the store
 * never writes from finite values) at scales from subnormal to 2^100, at
 * the best level, equal the table times the scale, bit for bit, d_head 24
 * (a vector part and a tail of 0 elements) and 13 (a tail of 5). */
static void test_e4m3_rows(enum llm_cpu_isa best)
{
	static const float sc[6] = { 1.0f, 0.0f, 1e-40f, 3.1e-3f, 7.5f, 0x1.8p100f };
	for (int d = 13; d <= 24; d += 11) {
		uint8_t c[6 * 24];
		float scale[6], got[6 * 24];
		int bad = 0;
		for (int off = 0; off < 256; off += 6 * d / 2) {
			for (int r = 0; r < 6; r++) {
				scale[r] = sc[r];
				for (int i = 0; i < d; i++) {
					int code = (off + r * d + i) & 0xff;
					c[r * d + i] = (code & 0x7f) == 0x7f ? 0 : (uint8_t)code;
				}
			}
			llm_cpu_e4m3_rows(best, got, c, (size_t)d, scale, 1, 6, d);
			for (int r = 0; r < 6; r++)
				for (int i = 0; i < d; i++) {
					float want = llm_e4m3_to_f32(c[r * d + i]) * scale[r];
					bad += memcmp(&got[r * d + i], &want, 4) != 0;
				}
		}
		check(!bad, "e4m3 cache rows %s, d %d, every code, scales 0 to 2^100 (subnormal included): "
		      "table * scale bit for bit (%d differ)", llm_cpu_isa_name(best), d, bad);
	}
}

/* Decode rows at depth through backends of 1, 2 and 3 threads. With more
 * than one thread a step of decode rows whose KV groups are too few for
 * the threads runs as backend_cpu.c's attn_split (runs of blocks, then of
 * columns, among the threads), other steps as one item per row run and KV
 * group (attn_task; a step with a prefill run always): a row's output has
 * the same bits either way, alone or beside another, at any thread count,
 * in every KV dtype. GQA 6 query heads on 2 KV heads of 32, 16-position
 * blocks, 700 and 333 cached positions. */
static void test_attn_split(enum llm_cpu_isa best)
{
	enum { NH = 6, NKV = 2, D = 32, DQ = NH * D, DKV = NKV * D, LEN0 = 700, LEN1 = 333 };
	struct llm_backend *be[3];
	for (int i = 0; i < 3; i++) {
		struct llm_backend_opts o = { i + 1, best, 0 };
		if (!check(llm_backend_open("cpu", &o, &be[i]) == LLM_OK, "open a %d-thread cpu backend", i + 1))
			return;
	}
	struct llm_kv_opts ko = { 1, NKV, D, LLM_DTYPE_F32, 16, 128, 2, 1024 };
	float *k = malloc((size_t)(LEN0 + LEN1) * DKV * 4), *v = malloc((size_t)(LEN0 + LEN1) * DKV * 4);
	float q[3 * DQ], out[3][2 * DQ];
	int32_t pos[LEN0], seq[LEN0], tok[LEN0] = { 0 };
	for (int t = 0; t < (LEN0 + LEN1) * DKV; t++) {
		k[t] = frand();
		v[t] = frand();
	}
	for (int t = 0; t < 3 * DQ; t++)
		q[t] = frand();
	for (int kt = 0; kt < 3; kt++) {
		ko.dtype = KV_DT[kt];
		int same = 1, ok = 1;
		for (int i = 0; i < 3; i++) {
			struct llm_kv kv;
			int s0, s1;
			ok &= llm_kv_init(&kv, be[i], &ko) == LLM_OK && llm_kv_seq_new(&kv, &s0) == LLM_OK
			      && llm_kv_seq_new(&kv, &s1) == LLM_OK;
			if (!ok)
				break;
			for (int sq = 0; sq < 2; sq++) {   /* the contexts */
				int n = sq ? LEN1 : LEN0;
				for (int t = 0; t < n; t++) {
					pos[t] = t;
					seq[t] = sq ? s1 : s0;
				}
				size_t o = sq ? (size_t)LEN0 * DKV : 0;
				struct llm_batch b = { n, tok, pos, seq, NULL, NULL };
				ok &= llm_kv_prepare(&kv, &b) == LLM_OK
				      && be[i]->ops->kv_store(be[i], &kv, 0, &b, llm_view_f32(k + o, n, DKV), llm_view_f32(v + o, n, DKV)) == LLM_OK;
			}
			/* rows at the last cached positions (attention reads what is
			 * stored): s0's alone, s0's and s1's, s0's beside a 2-row run of s1 */
			int32_t dp[3] = { LEN0 - 1, LEN1 - 2, LEN1 - 1 }, ds[3] = { s0, s1, s1 };
			int32_t pp[2] = { LEN0 - 1, LEN1 - 1 }, ps[2] = { s0, s1 };
			struct llm_batch alone = { 1, tok, dp, ds, NULL, NULL }, pair = { 2, tok, pp, ps, NULL, NULL };
			struct llm_batch mixed = { 3, tok, dp, ds, NULL, NULL };
			float o2[2 * DQ], o3[3 * DQ], q2[2 * DQ];
			memcpy(q2, q, DQ * 4);
			memcpy(q2 + DQ, q + 2 * DQ, DQ * 4);
			ok &= be[i]->ops->attention(be[i], llm_view_f32(out[i], 1, DQ), llm_view_f32(q, 1, DQ), &kv, 0, &alone, NH) == LLM_OK
			      && be[i]->ops->attention(be[i], llm_view_f32(o2, 2, DQ), llm_view_f32(q2, 2, DQ), &kv, 0, &pair, NH) == LLM_OK
			      && be[i]->ops->attention(be[i], llm_view_f32(o3, 3, DQ), llm_view_f32(q, 3, DQ), &kv, 0, &mixed, NH) == LLM_OK;
			memcpy(out[i] + DQ, o3 + 2 * DQ, DQ * 4);   /* s1's last row, in the prefill run */
			same &= !memcmp(o2, out[i], sizeof o2) && !memcmp(o3, out[i], DQ * 4);
			llm_kv_free(&kv);
		}
		for (int i = 1; i < 3 && ok; i++)
			same &= !memcmp(out[i], out[0], sizeof out[0]);
		check(ok && same, "decode attention %s KV, %d and %d cached positions, decode rows alone or beside a prefill run, "
		      "1, 2 and 3 threads: the same bits", llm_dtype_name(ko.dtype), LEN0, LEN1);
	}
	free(k);
	free(v);
	for (int i = 0; i < 3; i++)
		llm_backend_close(be[i]);
}

static void test_backend_ops(enum llm_cpu_isa best)
{
	struct llm_backend_opts so = { 1, LLM_ISA_SCALAR, 0 }, vo = { 2, best, 0 };
	struct llm_backend *sb, *vb;
	if (!check(llm_backend_open("cpu", &so, &sb) == LLM_OK && llm_backend_open("cpu", &vo, &vb) == LLM_OK,
	           "open scalar and %s cpu backends", llm_cpu_isa_name(best)))
		return;
	int n_head = 6, n_kv = 2, d = 24, dq = n_head * d, dkv = n_kv * d;
	struct llm_kv_opts ko = { 1, n_kv, d, LLM_DTYPE_F32, 4, 64, 3, 40 };
	for (int kt = 0; kt < 3; kt++) {
		ko.dtype = KV_DT[kt];
		struct llm_kv ks, kvv;
		llm_kv_init(&ks, sb, &ko);
		llm_kv_init(&kvv, vb, &ko);
		int s0, s1;
		llm_kv_seq_new(&ks, &s0);
		llm_kv_seq_new(&ks, &s1);
		llm_kv_seq_new(&kvv, &s0);
		llm_kv_seq_new(&kvv, &s1);
		/* a step mixing a 13-token prefill of s0 and a 5-token one of s1 */
		int n = 18;
		int32_t pos[18], seq[18], tok[18];
		for (int i = 0; i < n; i++) {
			seq[i] = i < 13 ? s0 : s1;
			pos[i] = i < 13 ? i : i - 13;
			tok[i] = 0;
		}
		struct llm_batch b = { n, tok, pos, seq, NULL, NULL };
		float *q = malloc((size_t)(n * dq) * 4), *k = malloc((size_t)(n * dkv) * 4);
		float *v = malloc((size_t)(n * dkv) * 4), *o1 = malloc((size_t)(n * dq) * 4);
		float *o2 = malloc((size_t)(n * dq) * 4);
		for (int i = 0; i < n * dq; i++)
			q[i] = frand();
		for (int i = 0; i < n * dkv; i++) {
			k[i] = frand();
			v[i] = frand();
		}
		llm_kv_prepare(&ks, &b);
		llm_kv_prepare(&kvv, &b);
		sb->ops->kv_store(sb, &ks, 0, &b, llm_view_f32(k, n, dkv), llm_view_f32(v, n, dkv));
		vb->ops->kv_store(vb, &kvv, 0, &b, llm_view_f32(k, n, dkv), llm_view_f32(v, n, dkv));
		sb->ops->attention(sb, llm_view_f32(o1, n, dq), llm_view_f32(q, n, dq), &ks, 0, &b, n_head);
		vb->ops->attention(vb, llm_view_f32(o2, n, dq), llm_view_f32(q, n, dq), &kvv, 0, &b, n_head);
		char name[128];
		snprintf(name, sizeof name, "attention %s vs scalar, GQA 6/2 heads, mixed prefill, %s KV",
		         llm_cpu_isa_name(best), llm_dtype_name(ko.dtype));
		check_close(name, o2, o1, (size_t)(n * dq), 1e-6, 1e-5);
		/* crafted: one position -> softmax weight 1 -> output = v exactly */
		if (!kt)
			check(!memcmp(o1, v, (size_t)d * 4), "attention at position 0 returns v exactly (f32 KV)");
		free(q);
		free(k);
		free(v);
		free(o1);
		free(o2);
		llm_kv_free(&ks);
		llm_kv_free(&kvv);
	}
	/* matmul through the backend (x rounded to bf16 once per call at
	 * avx512bf16, rows split among 2 threads) equals the kernel bit for bit */
	static const enum llm_dtype mdt[] = { LLM_DTYPE_F32, LLM_DTYPE_BF16, LLM_DTYPE_E4M3 };
	for (size_t k = 0; k < sizeof mdt / sizeof *mdt; k++) {
		struct wbuf wb;
		int64_t rows = 300, cols = 256, nt = 9;
		make_weight(&wb, mdt[k], rows, cols, 128, 128, 0);
		float *mx = malloc((size_t)(nt * cols) * 4), *my1 = malloc((size_t)(nt * rows) * 4);
		float *my2 = malloc((size_t)(nt * rows) * 4);
		for (int64_t i = 0; i < nt * cols; i++)
			mx[i] = frand();
		llm_cpu_matmul_rows(best, my1, rows, mx, cols, nt, &wb.w, 0, rows);
		vb->ops->matmul(vb, llm_view_f32(my2, nt, rows), llm_view_f32(mx, nt, cols), &wb.w);
		check(!memcmp(my1, my2, (size_t)(nt * rows) * 4), "matmul %s %s through the backend (2 threads): same bits as the kernel",
		      llm_cpu_isa_name(llm_cpu_matmul_isa(best, mdt[k])), llm_dtype_name(mdt[k]));
		free(mx);
		free(my1);
		free(my2);
		free_weight(&wb);
	}
	/* several weights sharing x in one dispatch (q, k, v): each output the
	 * same bits as its own kernel call, whatever thread got which rows */
	if (vb->ops->matmul_n) {
		static const enum llm_dtype ndt[] = { LLM_DTYPE_F32, LLM_DTYPE_E4M3 };
		for (size_t k = 0; k < sizeof ndt / sizeof *ndt; k++) {
			int64_t rows[3] = { 301, 97, 97 }, cols = 192, nt = 5;
			struct wbuf wb[3];
			struct llm_view ys[3];
			const struct llm_weight *ws[3];
			float *mx = malloc((size_t)(nt * cols) * 4), *ref[3];
			for (int64_t i = 0; i < nt * cols; i++)
				mx[i] = frand();
			for (int i = 0; i < 3; i++) {
				make_weight(&wb[i], ndt[k], rows[i], cols, 128, 64, 0);
				ref[i] = malloc((size_t)(nt * rows[i]) * 4);
				llm_cpu_matmul_rows(best, ref[i], rows[i], mx, cols, nt, &wb[i].w, 0, rows[i]);
				ys[i] = llm_view_f32(malloc((size_t)(nt * rows[i]) * 4), nt, rows[i]);
				ws[i] = &wb[i].w;
			}
			vb->ops->matmul_n(vb, 3, ys, llm_view_f32(mx, nt, cols), ws);
			int same = 1;
			for (int i = 0; i < 3; i++) {
				same &= !memcmp(ref[i], ys[i].data, (size_t)(nt * rows[i]) * 4);
				free(ref[i]);
				free(ys[i].data);
				free_weight(&wb[i]);
			}
			check(same, "matmul_n %s: 3 weights of 301, 97, 97 rows in one dispatch (2 threads), "
			      "each the same bits as its own kernel call", llm_dtype_name(ndt[k]));
			free(mx);
		}
	}
	/* rmsnorm through both backends (scalar op on both: must be identical) */
	float x[3 * 50], w[50], o1[3 * 50], o2[3 * 50];
	for (int i = 0; i < 150; i++)
		x[i] = frand();
	for (int i = 0; i < 50; i++)
		w[i] = frand();
	struct llm_weight wn = { "norm", LLM_DTYPE_F32, 1, 50, w, NULL, 0, 0, 0, 0 };
	sb->ops->rmsnorm(sb, llm_view_f32(o1, 3, 50), llm_view_f32(x, 3, 50), &wn, 1e-5f);
	vb->ops->rmsnorm(vb, llm_view_f32(o2, 3, 50), llm_view_f32(x, 3, 50), &wn, 1e-5f);
	check(!memcmp(o1, o2, sizeof o1), "rmsnorm: same bits on both backends");
	/* crafted rmsnorm: x = 2 everywhere, w = 1, eps 0 -> 1 exactly */
	for (int i = 0; i < 50; i++) {
		x[i] = 2.0f;
		w[i] = 1.0f;
	}
	sb->ops->rmsnorm(sb, llm_view_f32(o1, 1, 50), llm_view_f32(x, 1, 50), &wn, 0.0f);
	int ones = 1;
	for (int i = 0; i < 50; i++)
		ones &= o1[i] == 1.0f;
	check(ones, "rmsnorm of a constant vector is 1 exactly");
	/* rope at position 0 is the identity; a quarter turn swaps the halves */
	float r[16], inv[4] = { 1, 1, 1, 1 }, r0[16];
	for (int i = 0; i < 16; i++)
		r[i] = r0[i] = frand();
	int32_t p0 = 0;
	sb->ops->rope(sb, llm_view_f32(r, 1, 16), &p0, 2, 8, inv);
	check(!memcmp(r, r0, sizeof r), "rope at position 0 is the identity");
	llm_backend_close(sb);
	llm_backend_close(vb);
}

/* ---- fused ops: equal to the ops they replace ---------------------------- */

/* add_rmsnorm = add then rmsnorm, and rope_store = rope(q), rope(k),
 * kv_store: the same bits, on 1 thread and on 2 (rows and tokens split);
 * rope against run.c's formula written out here. */
static void test_fused_ops(enum llm_cpu_isa best)
{
	struct llm_backend_opts o1 = { 1, best, 0 }, o2 = { 2, best, 0 };
	struct llm_backend *bes[2];
	if (!check(llm_backend_open("cpu", &o1, &bes[0]) == LLM_OK && llm_backend_open("cpu", &o2, &bes[1]) == LLM_OK,
	           "open cpu backends of 1 and 2 threads"))
		return;
	for (int bi = 0; bi < 2; bi++) {
		struct llm_backend *be = bes[bi];
		check(be->ops->add_rmsnorm && be->ops->rope_store, "cpu has add_rmsnorm and rope_store");
		/* 67 rows x 211: enough work to split; OUT = Y as in the model */
		int64_t R = 67, C = 211;
		float *x1 = malloc((size_t)(R * C) * 4), *x2 = malloc((size_t)(R * C) * 4);
		float *y1 = malloc((size_t)(R * C) * 4), *y2 = malloc((size_t)(R * C) * 4), *w = malloc((size_t)C * 4);
		for (int64_t i = 0; i < R * C; i++) {
			x1[i] = x2[i] = frand();
			y1[i] = y2[i] = frand();
		}
		for (int64_t i = 0; i < C; i++)
			w[i] = frand();
		struct llm_weight wn = { "norm", LLM_DTYPE_F32, 1, C, w, NULL, 0, 0, 0, 0 };
		for (int64_t rows = 1; rows <= R; rows += 66) {
			be->ops->add(be, llm_view_f32(x1, rows, C), llm_view_f32(y1, rows, C));
			be->ops->rmsnorm(be, llm_view_f32(y1, rows, C), llm_view_f32(x1, rows, C), &wn, 1e-5f);
			int st = be->ops->add_rmsnorm(be, llm_view_f32(y2, rows, C), llm_view_f32(x2, rows, C),
			                              llm_view_f32(y2, rows, C), &wn, 1e-5f);
			check(st == LLM_OK && !memcmp(x1, x2, (size_t)(rows * C) * 4) && !memcmp(y1, y2, (size_t)(rows * C) * 4),
			      "add_rmsnorm, %d thread(s), %lld rows, out = y: x and out the same bits as add then rmsnorm",
			      bi + 1, (long long)rows);
		}
		free(x1);
		free(x2);
		free(y1);
		free(y2);
		free(w);

		/* rope_store over a mixed step (two prefills and a decode) */
		static const int dh_list[] = { 24, 10 };
		for (size_t di = 0; di < 2; di++)
			for (int kt = 0; kt < 3; kt++) {
				int d = dh_list[di], half = d / 2, nh = 6, nkv = 2, dq = nh * d, dkv = nkv * d, n = 37;
				struct llm_kv_opts ko = { 3, nkv, d, KV_DT[kt], 4, 64, 3, 400 };
				struct llm_kv ka, kb;
				llm_kv_init(&ka, be, &ko);
				llm_kv_init(&kb, be, &ko);
				int sq[3];
				for (int i = 0; i < 3; i++) {
					llm_kv_seq_new(&ka, &sq[i]);
					llm_kv_seq_new(&kb, &sq[i]);
				}
				int32_t pos[37], seq[37], tok[37] = { 0 };
				for (int i = 0; i < n; i++) {
					seq[i] = sq[i < 20 ? 0 : i < 36 ? 1 : 2];
					pos[i] = i < 20 ? i : i < 36 ? i - 20 : 0;
				}
				struct llm_batch b = { n, tok, pos, seq, NULL, NULL };
				float inv[12];
				for (int j = 0; j < half; j++)
					inv[j] = 1.0f / powf(10000.0f, (float)(2 * j) / (float)d);
				float *q = malloc((size_t)(n * dq) * 4), *k = malloc((size_t)(n * dkv) * 4);
				float *v = malloc((size_t)(n * dkv) * 4), *q2 = malloc((size_t)(n * dq) * 4);
				float *k2 = malloc((size_t)(n * dkv) * 4), *qr = malloc((size_t)(n * dq) * 4);
				for (int i = 0; i < n * dq; i++)
					q[i] = q2[i] = qr[i] = frand();
				for (int i = 0; i < n * dkv; i++) {
					k[i] = k2[i] = frand();
					v[i] = frand();
				}
				/* run.c's rotation, pair by pair, at positions up to 360 */
				int32_t pr[37];
				for (int t = 0; t < n; t++)
					pr[t] = (t * 97) % 361;
				for (int t = 0; t < n; t++)
					for (int h = 0; h < nh; h++)
						for (int j = 0; j < half; j++) {
							float a = (float)pr[t] * inv[j], c = cosf(a), sn = sinf(a);
							float *pp = qr + t * dq + h * d, v0 = pp[j], v1 = pp[j + half];
							pp[j] = v0 * c - v1 * sn;
							pp[j + half] = v0 * sn + v1 * c;
						}
				float *qp = malloc((size_t)(n * dq) * 4);
				memcpy(qp, q, (size_t)(n * dq) * 4);
				be->ops->rope(be, llm_view_f32(qp, n, dq), pr, nh, d, inv);
				check(!memcmp(qp, qr, (size_t)(n * dq) * 4),
				      "rope, %d thread(s), d_head %d, %s: run.c's rotation bit for bit", bi + 1, d,
				      kt ? "table reused" : "new table");
				free(qp);
				if (!check(llm_kv_prepare(&ka, &b) == LLM_OK && llm_kv_prepare(&kb, &b) == LLM_OK,
				           "kv prepare: prefills of 20 and 16, a first token"))
					break;
				for (int layer = 0; layer < 3; layer++) {
					be->ops->rope(be, llm_view_f32(q, n, dq), pos, nh, d, inv);
					be->ops->rope(be, llm_view_f32(k, n, dkv), pos, nkv, d, inv);
					be->ops->kv_store(be, &ka, layer, &b, llm_view_f32(k, n, dkv), llm_view_f32(v, n, dkv));
					be->ops->rope_store(be, llm_view_f32(q2, n, dq), llm_view_f32(k2, n, dkv),
					                    llm_view_f32(v, n, dkv), &kb, layer, &b, nh, nkv, d, inv);
				}
				size_t kvb = (size_t)3 * 64 * 4 * (size_t)dkv * ka.elt, ksb = (size_t)3 * 64 * 4 * nkv * 4;
				check(!memcmp(q, q2, (size_t)(n * dq) * 4) && !memcmp(k, k2, (size_t)(n * dkv) * 4)
				      && !memcmp(ka.k, kb.k, kvb) && !memcmp(ka.v, kb.v, kvb)
				      && (!ka.ks || (!memcmp(ka.ks, kb.ks, ksb) && !memcmp(ka.vs, kb.vs, ksb))),
				      "rope_store, %d thread(s), d_head %d, %s KV, 3 layers: q, k and the cache the same bits "
				      "as rope, rope, kv_store", bi + 1, d, llm_dtype_name(ko.dtype));
				free(q);
				free(k);
				free(v);
				free(q2);
				free(k2);
				free(qr);
				llm_kv_free(&ka);
				llm_kv_free(&kb);
			}
	}
	llm_backend_close(bes[0]);
	llm_backend_close(bes[1]);
}

/* ---- backends and KV bookkeeping ------------------------------------------ */

/* chain (llm_backend_ops.chain): with it on, the matmul after an rmsnorm,
 * add_rmsnorm, swiglu or attention takes the bf16 x that op wrote; the
 * results must be the bits of the same ops with it off. Also with it on:
 * a matmul of another view converts its own x, and the op's output read
 * twice (the second matmul finds the copy taken). */
static void test_chain(enum llm_cpu_isa best)
{
	struct llm_backend_opts o = { 2, best, 0 };
	struct llm_backend *be;
	if (!check(llm_backend_open("cpu", &o, &be) == LLM_OK, "open a 2-thread cpu backend"))
		return;
	if (!check(be->ops->chain != NULL, "cpu has chain")) {
		llm_backend_close(be);
		return;
	}
	enum { C = 192, F = 200, NH = 4, NKV = 2, D = 16, DQ = NH * D, DKV = NKV * D, NMAX = 37 };
	struct wbuf wq, wk, wd, wo, wn;
	make_weight(&wq, LLM_DTYPE_E4M3, 96, C, 32, 64, 0);
	make_weight(&wk, LLM_DTYPE_E4M3, 40, C, 0, 0, 0);
	make_weight(&wd, LLM_DTYPE_E4M3, C, F, 64, 128, 0);
	make_weight(&wo, LLM_DTYPE_BF16, C, DQ, 0, 0, 0);
	make_weight(&wn, LLM_DTYPE_F32, 1, C, 0, 0, 0);
	float *x = malloc(NMAX * C * 4), *x0 = malloc(NMAX * C * 4), *y = malloc(NMAX * C * 4), *xo = malloc(NMAX * C * 4);
	float *g = malloc(NMAX * F * 4), *u = malloc(NMAX * F * 4), *h = malloc(NMAX * F * 4);
	float *q = malloc(NMAX * DQ * 4), *k = malloc(NMAX * DKV * 4), *v = malloc(NMAX * DKV * 4), *att = malloc(NMAX * DQ * 4);
	float *out[2][7];
	for (int i = 0; i < NMAX * C; i++) {
		x0[i] = frand();
		xo[i] = frand();
	}
	for (int i = 0; i < NMAX * F; i++) {
		g[i] = frand();
		u[i] = frand();
	}
	for (int i = 0; i < NMAX * DQ; i++)
		q[i] = frand();
	for (int i = 0; i < NMAX * DKV; i++) {
		k[i] = frand();
		v[i] = frand();
	}
	static const int ns[2] = { 1, NMAX };
	for (int ni = 0; ni < 2; ni++) {
		int n = ns[ni];
		for (int on = 0; on < 2; on++) {
			struct llm_kv_opts ko = { 1, NKV, D, LLM_DTYPE_F32, 4, 64, 3, 64 };
			struct llm_kv kv;
			llm_kv_init(&kv, be, &ko);
			int s0, s1;
			llm_kv_seq_new(&kv, &s0);
			llm_kv_seq_new(&kv, &s1);
			int32_t pos[NMAX], seq[NMAX], tok[NMAX] = { 0 };
			for (int i = 0; i < n; i++) {
				seq[i] = i < 20 ? s0 : s1;
				pos[i] = i < 20 ? i : i - 20;
			}
			struct llm_batch b = { n, tok, pos, seq, NULL, NULL };
			llm_kv_prepare(&kv, &b);
			be->ops->kv_store(be, &kv, 0, &b, llm_view_f32(k, n, DKV), llm_view_f32(v, n, DKV));
			for (int i = 0; i < 7; i++)
				out[on][i] = calloc(NMAX * C, 4);   /* the widest output */
			memcpy(x, x0, NMAX * C * 4);
			memset(y, 0, NMAX * C * 4);
			be->ops->chain(be, on);
			struct llm_view xv = llm_view_f32(x, n, C), yv = llm_view_f32(y, n, C);
			struct llm_view ys[2] = { llm_view_f32(out[on][0], n, 96), llm_view_f32(out[on][1], n, 40) };
			const struct llm_weight *ws[2] = { &wq.w, &wk.w };
			be->ops->rmsnorm(be, yv, xv, &wn.w, 1e-5f);
			be->ops->matmul_n(be, 2, ys, yv, ws);
			be->ops->swiglu(be, llm_view_f32(h, n, F), llm_view_f32(g, n, F), llm_view_f32(u, n, F));
			be->ops->matmul(be, llm_view_f32(out[on][2], n, C), llm_view_f32(h, n, F), &wd.w);
			be->ops->attention(be, llm_view_f32(att, n, DQ), llm_view_f32(q, n, DQ), &kv, 0, &b, NH);
			be->ops->matmul(be, llm_view_f32(out[on][3], n, C), llm_view_f32(att, n, DQ), &wo.w);
			/* y = rmsnorm(x + y): read by a matmul of another view, then twice */
			be->ops->add_rmsnorm(be, yv, xv, yv, &wn.w, 1e-5f);
			be->ops->matmul(be, llm_view_f32(out[on][4], n, 40), llm_view_f32(xo, n, C), &wk.w);
			be->ops->matmul(be, llm_view_f32(out[on][5], n, 96), yv, &wq.w);
			be->ops->matmul(be, llm_view_f32(out[on][6], n, 96), yv, &wq.w);
			be->ops->chain(be, 0);
			llm_kv_free(&kv);
		}
		int same = 1;
		for (int i = 0; i < 7; i++)
			same &= !memcmp(out[0][i], out[1][i], NMAX * C * 4);
		check(same, "chain on, %d token(s): matmuls after rmsnorm, swiglu, attention and add_rmsnorm, of another "
		      "view, and twice, the same bits as with it off", n);
		for (int on = 0; on < 2; on++)
			for (int i = 0; i < 7; i++)
				free(out[on][i]);
	}
	free(x);
	free(x0);
	free(y);
	free(xo);
	free(g);
	free(u);
	free(h);
	free(q);
	free(k);
	free(v);
	free(att);
	free_weight(&wq);
	free_weight(&wk);
	free_weight(&wd);
	free_weight(&wo);
	free_weight(&wn);
	llm_backend_close(be);
}

static void test_registry(void)
{
	struct llm_backend *be = NULL;
	enum llm_status s = llm_backend_open("auto", NULL, &be);
	/* with CUDA built in, auto is cuda where a device opens, else cpu */
	check(s == LLM_OK && be && (!strcmp(be->ops->name, "cpu") || !strcmp(be->ops->name, "cuda")),
	      "backend auto opens (%s)", be ? be->ops->name : "-");
	llm_backend_close(be);
#ifndef LLM_CUDA
	s = llm_backend_open("cuda", NULL, &be);
	check(s == LLM_ERR_UNSUPPORTED && strstr(llm_errmsg(), "built without CUDA support"),
	      "backend cuda without CUDA: %s", llm_errmsg());
#endif
	s = llm_backend_open("tpu", NULL, &be);
	check(s == LLM_ERR_USAGE, "backend tpu: %s", llm_errmsg());
	check(llm_cpu_isa_parse("scalar") == LLM_ISA_SCALAR && llm_cpu_isa_parse("nope") == -2,
	      "isa names parse");
}

static void test_kv(void)
{
	struct llm_backend *be;
	struct llm_backend_opts o = { 1, LLM_ISA_SCALAR, 0 };
	llm_backend_open("cpu", &o, &be);
	struct llm_kv_opts ko = { 2, 1, 4, LLM_DTYPE_F32, 4, 6, 4, 32 };
	struct llm_kv kv;
	check(llm_kv_init(&kv, be, &ko) == LLM_OK, "kv init: 6 blocks of 4");
	int a, b, c;
	llm_kv_seq_new(&kv, &a);
	check(llm_kv_reserve(&kv, a, 6) == LLM_OK && kv.n_free == 4, "6 positions take 2 blocks");
	kv.seq[a].len = 6;
	/* mark the data of block 1 slot 1 (position 5) of layer 1 */
	((float *)kv.k)[llm_kv_offset(&kv, 1, a, 5, 0)] = 42.0f;
	check(llm_kv_seq_fork(&kv, a, 6, &b) == LLM_OK && kv.n_free == 4 && kv.ref[kv.seq[a].blk[1]] == 2,
	      "fork shares both blocks (refcount 2, nothing allocated)");
	check(llm_kv_blocks_needed(&kv, b, 1) == 1, "writing after a shared partial block needs one copy");
	check(llm_kv_reserve(&kv, b, 1) == LLM_OK && kv.seq[b].blk[1] != kv.seq[a].blk[1] && kv.n_free == 3,
	      "copy on write: the fork gets its own last block");
	check(((float *)kv.k)[llm_kv_offset(&kv, 1, b, 5, 0)] == 42.0f, "the copy holds the shared data");
	check(kv.seq[b].blk[0] == kv.seq[a].blk[0], "full blocks stay shared");
	llm_kv_seq_free(&kv, a);
	check(kv.n_free == 4 && kv.ref[kv.seq[b].blk[0]] == 1, "free drops one reference");
	llm_kv_seq_new(&kv, &c);
	enum llm_status s = llm_kv_reserve(&kv, c, 32);
	check(s == LLM_ERR_NOMEM && kv.n_free == 4 && kv.seq[c].n_blk == 0, "a full pool fails cleanly: %s", llm_errmsg());
	s = llm_kv_reserve(&kv, c, 33);
	check(s == LLM_ERR_RANGE, "past the context: %s", llm_errmsg());
	llm_kv_seq_truncate(&kv, b, 3);
	check(kv.n_free == 5 && kv.seq[b].len == 3, "truncate releases the blocks past the end");
	llm_kv_free(&kv);
	llm_backend_close(be);
}

/* A sliding window of 6 over blocks of 4: a step's blocks wholly before
 * its first query's window go back to the pool; a fork or a step that would
 * read one is refused. */
static void test_kv_window(void)
{
	struct llm_backend *be;
	struct llm_backend_opts o = { 1, LLM_ISA_SCALAR, 0 };
	llm_backend_open("cpu", &o, &be);
	struct llm_kv_opts ko = { 1, 1, 4, LLM_DTYPE_F32, 4, 8, 4, 32 };
	struct llm_kv kv;
	llm_kv_init(&kv, be, &ko);
	llm_kv_set_window(&kv, 6);
	int a, f;
	int32_t tok[8] = { 0 }, pos[8], seq[8];
	llm_kv_seq_new(&kv, &a);
	for (int i = 0; i < 8; i++)
		pos[i] = i, seq[i] = a;
	struct llm_batch b = { 8, tok, pos, seq, NULL, NULL };
	check(llm_kv_prepare(&kv, &b) == LLM_OK && kv.n_free == 6 && kv.seq[a].blk[0] >= 0,
	      "window: a prefill of 8 from position 0 keeps its 2 blocks");
	pos[0] = 8;
	b.n_tok = 1;
	check(llm_kv_prepare(&kv, &b) == LLM_OK && kv.n_free == 5 && kv.seq[a].blk[0] >= 0,
	      "window: position 8 (keys from 3 on) keeps block 0");
	pos[0] = 9;
	check(llm_kv_prepare(&kv, &b) == LLM_OK && kv.n_free == 6 && kv.seq[a].blk[0] == -1,
	      "window: position 9 (keys from 4 on) releases block 0");
	check(llm_kv_can_fork(&kv, a, 10) && llm_kv_seq_fork(&kv, a, 10, &f) == LLM_OK && kv.n_free == 6,
	      "window: a fork at 10 shares the held blocks");
	check(!llm_kv_can_fork(&kv, a, 4) && llm_kv_seq_fork(&kv, a, 4, &f) == LLM_ERR_RANGE,
	      "window: a fork at 4 would read block 0 and is refused: %s", llm_errmsg());
	llm_kv_seq_free(&kv, f);
	llm_kv_seq_truncate(&kv, a, 3);
	pos[0] = 3;
	check(llm_kv_prepare(&kv, &b) == LLM_ERR_USAGE, "window: a step that reads a released block is refused: %s",
	      llm_errmsg());
	llm_kv_seq_free(&kv, a);
	check(kv.n_free == 8, "window: every block back after the sequence ends");
	/* keep 3 (a draft model's cache): decoded one position a step up to
	 * 13, then cut back to 10 (its drafts rejected): the step at 10 reads
	 * keys from 5 on (block 1); without keep, the step at 13 (keys from 8
	 * on) would have released block 1 too */
	llm_kv_set_keep(&kv, 3);
	llm_kv_seq_new(&kv, &a);
	b.n_tok = 8;
	for (int i = 0; i < 8; i++)
		pos[i] = i, seq[i] = a;
	int ok = llm_kv_prepare(&kv, &b) == LLM_OK;
	b.n_tok = 1;
	for (int p = 8; p < 14; p++) {
		pos[0] = p;
		ok &= llm_kv_prepare(&kv, &b) == LLM_OK;
	}
	llm_kv_seq_truncate(&kv, a, 10);
	pos[0] = 10;
	check(ok && kv.seq[a].blk[0] == -1 && kv.seq[a].blk[1] >= 0 && llm_kv_prepare(&kv, &b) == LLM_OK,
	      "window, keep 3: 14 positions then cut back to 10: block 0 released, block 1 held, position 10 runs");
	llm_kv_seq_free(&kv, a);
	llm_kv_free(&kv);
	llm_backend_close(be);
}

/* ---- every op against the plain reference (common/engine/cpu_ref.h) -------------
 * The backend at each level this CPU runs (scalar included: it is the
 * optimised code too, threads, tables and all), 2 threads, against
 * llm_ref_*, which computes each definition in double and rounds once; so
 * each bound below is the optimised op's own worst-case error (u = 2^-24,
 * the unit roundoff of f32), derived next to its check. */

#define U24 0x1.0p-24

/* Matmul Y (n_tok, rows) against llm_ref_matmul (BF16_IN as the level
 * rounds): |got - ref| <= (k + 2) u sum_c |x_c w_c|. The optimised sums k
 * f32 products in some order (lanes, then a tree): each product rounds
 * once (or not, in an fma), each of the k - 1 additions by at most u of
 * the partial sum's magnitude, itself <= sum |x w|; the reference adds
 * half a unit when it rounds its double. Returns the worst |err| / bound. */
static double matmul_vs_ref(const float *got, const float *x, int64_t n_tok, const struct llm_weight *w,
                            int bf16_in, int64_t *n_bad)
{
	int64_t rows = w->rows, k = w->cols;
	float *ref = malloc((size_t)(n_tok * rows) * 4), *wr = malloc((size_t)k * 4);
	llm_ref_matmul(llm_view_f32(ref, n_tok, rows), llm_view_f32((float *)x, n_tok, k), w, bf16_in);
	double worst = 0;
	*n_bad = 0;
	for (int64_t r = 0; r < rows; r++) {
		for (int64_t c = 0; c < k; c++) {
			wr[c] = llm_ref_weight_at(w, r, c);
			wr[c] = bf16_in ? llm_ref_round_bf16(wr[c]) : wr[c];
		}
		for (int64_t t = 0; t < n_tok; t++) {
			double mag = 0;
			for (int64_t c = 0; c < k; c++) {
				float xc = bf16_in ? llm_ref_round_bf16(x[t * k + c]) : x[t * k + c];
				mag += fabs((double)xc * wr[c]);
			}
			double e = fabs((double)got[t * rows + r] - ref[t * rows + r]) / ((double)(k + 2) * U24 * mag + 1e-37);
			if (!(e <= 1.0))
				++*n_bad;
			if (e > worst || isnan(e))
				worst = e;
		}
	}
	free(ref);
	free(wr);
	return worst;
}

static void ref_matmul(struct llm_backend *be)
{
	static const struct { enum llm_dtype dt; int64_t br, bc; } w[] = {
		{ LLM_DTYPE_F32, 0, 0 }, { LLM_DTYPE_F16, 0, 0 }, { LLM_DTYPE_BF16, 0, 0 },
		{ LLM_DTYPE_E4M3, 128, 128 }, { LLM_DTYPE_E4M3, 1, 128 }, { LLM_DTYPE_E4M3, 0, 0 },
		{ LLM_DTYPE_E4M3, 16, 32 }, { LLM_DTYPE_E4M3, 4, 40 },
	};
	/* odd sizes, tails of every tile, a logits-like wide output */
	static const int64_t shape[][3] = {   /* rows, cols, tokens */
		{ 5, 7, 1 }, { 37, 172, 3 }, { 130, 300, 9 }, { 70, 384, 5 }, { 1000, 64, 2 },
	};
	const char *isa = llm_cpu_isa_name(be->isa);
	for (size_t k = 0; k < sizeof w / sizeof *w; k++) {
		int bfx = llm_cpu_matmul_isa(be->isa, w[k].dt) == LLM_ISA_AVX512BF16;
		double worst = 0;
		int64_t bad = 0, nb;
		for (size_t s = 0; s < sizeof shape / sizeof *shape; s++) {
			int64_t rows = shape[s][0], cols = shape[s][1], nt = shape[s][2];
			struct wbuf wb;
			make_weight(&wb, w[k].dt, rows, cols, w[k].br, w[k].bc, 0);
			float *x = malloc((size_t)(nt * cols) * 4), *y = malloc((size_t)(nt * rows) * 4);
			for (int64_t i = 0; i < nt * cols; i++)
				x[i] = frand();
			be->ops->matmul(be, llm_view_f32(y, nt, rows), llm_view_f32(x, nt, cols), &wb.w);
			double e = matmul_vs_ref(y, x, nt, &wb.w, bfx, &nb);
			worst = e > worst ? e : worst;
			bad += nb;
			free(x);
			free(y);
			free_weight(&wb);
		}
		check(!bad, "ref: matmul %s %s, 5 shapes (1..9 tokens, odd sizes, 1000 outputs): |cpu - ref%s| <= "
		      "(k + 2) u sum|xw| (worst %.3f of the bound)", isa, wname(w[k].dt, w[k].br, w[k].bc),
		      bfx ? " on bf16 x and w" : "", worst);
		/* small integers, power-of-two scales: every product and partial
		 * sum is exact in f32 (and in bf16), so the bits must agree */
		struct wbuf wb;
		int64_t rows = 19, cols = 200, nt = 5;
		make_weight(&wb, w[k].dt, rows, cols, w[k].br, w[k].bc, 1);
		float *x = malloc((size_t)(nt * cols) * 4), *y = malloc((size_t)(nt * rows) * 4);
		float *ref = malloc((size_t)(nt * rows) * 4);
		for (int64_t i = 0; i < nt * cols; i++)
			x[i] = (float)((int)(urand() * 7) - 3);
		be->ops->matmul(be, llm_view_f32(y, nt, rows), llm_view_f32(x, nt, cols), &wb.w);
		llm_ref_matmul(llm_view_f32(ref, nt, rows), llm_view_f32(x, nt, cols), &wb.w, 0);
		check(!memcmp(y, ref, (size_t)(nt * rows) * 4), "ref: matmul %s %s on small integers: equal to the "
		      "reference bit for bit", isa, wname(w[k].dt, w[k].br, w[k].bc));
		free(x);
		free(y);
		free(ref);
		free_weight(&wb);
	}
	/* matmul_n: q, k, v sharing x, each against the reference */
	if (be->ops->matmul_n) {
		int64_t rows[3] = { 301, 97, 97 }, cols = 192, nt = 5, bad = 0, nb;
		struct wbuf wb[3];
		struct llm_view ys[3];
		const struct llm_weight *ws[3];
		float *x = malloc((size_t)(nt * cols) * 4);
		for (int64_t i = 0; i < nt * cols; i++)
			x[i] = frand();
		for (int i = 0; i < 3; i++) {
			make_weight(&wb[i], LLM_DTYPE_E4M3, rows[i], cols, 128, 64, 0);
			ys[i] = llm_view_f32(malloc((size_t)(nt * rows[i]) * 4), nt, rows[i]);
			ws[i] = &wb[i].w;
		}
		be->ops->matmul_n(be, 3, ys, llm_view_f32(x, nt, cols), ws);
		double worst = 0;
		for (int i = 0; i < 3; i++) {
			double e = matmul_vs_ref(ys[i].data, x, nt, ws[i],
			                         llm_cpu_matmul_isa(be->isa, LLM_DTYPE_E4M3) == LLM_ISA_AVX512BF16, &nb);
			worst = e > worst ? e : worst;
			bad += nb;
			free(ys[i].data);
			free_weight(&wb[i]);
		}
		free(x);
		check(!bad, "ref: matmul_n %s E4M3, 3 weights of 301, 97, 97 rows: each within (k + 2) u sum|xw| "
		      "(worst %.3f of the bound)", isa, worst);
	}
}

/* embed, rmsnorm, add_rmsnorm, swiglu, add, gather on odd shapes. */
static void ref_rowwise(struct llm_backend *be)
{
	static const int64_t shape[][2] = { { 1, 7 }, { 5, 576 }, { 67, 211 } };
	const char *isa = llm_cpu_isa_name(be->isa);
	char name[160];
	for (size_t s = 0; s < sizeof shape / sizeof *shape; s++) {
		int64_t R = shape[s][0], C = shape[s][1];
		size_t n = (size_t)(R * C);
		/* got and ref also take gather's 3 rows */
		float *x = malloc(n * 4), *y = malloc(n * 4), *got = malloc(n * 4 + (size_t)(3 * C) * 4);
		float *ref = malloc(n * 4 + (size_t)(3 * C) * 4), *x2 = malloc(n * 4), *y2 = malloc(n * 4);
		for (size_t i = 0; i < n; i++) {
			x[i] = frand();
			y[i] = frand();
		}
		/* embed: an exact dequantized copy, for every weight dtype */
		static const enum llm_dtype edt[] = { LLM_DTYPE_F32, LLM_DTYPE_F16, LLM_DTYPE_BF16, LLM_DTYPE_E4M3 };
		int same = 1;
		int32_t *tok = malloc((size_t)R * 4);
		for (int64_t t = 0; t < R; t++)
			tok[t] = (int32_t)((t * 37 + 5) % 50);
		for (size_t e = 0; e < 4; e++) {
			struct wbuf emb;
			make_weight(&emb, edt[e], 50, C, 1, 64, 0);
			be->ops->embed(be, llm_view_f32(got, R, C), tok, &emb.w);
			llm_ref_embed(llm_view_f32(ref, R, C), tok, &emb.w);
			same &= !memcmp(got, ref, n * 4);
			free_weight(&emb);
		}
		check(same, "ref: embed %s %lldx%lld, F32/F16/BF16/E4M3 tables: the reference's bits", isa,
		      (long long)R, (long long)C);
		free(tok);
		/* rmsnorm: the f32 sum of n squares errs by at most n u relative
		 * (positive terms), the mean, + eps, sqrtf and 1/ by u each (the
		 * root halving what it is given), the two products by u each:
		 * (n/2 + 5) u relative, plus the reference's rounding */
		double rt = ((double)C / 2 + 6) * U24;
		static const enum llm_dtype ndt[] = { LLM_DTYPE_F32, LLM_DTYPE_BF16 };
		for (size_t d = 0; d < 2; d++) {
			struct wbuf wn;
			make_weight(&wn, ndt[d], 1, C, 0, 0, 0);
			be->ops->rmsnorm(be, llm_view_f32(got, R, C), llm_view_f32(x, R, C), &wn.w, 1e-5f);
			llm_ref_rmsnorm(llm_view_f32(ref, R, C), llm_view_f32(x, R, C), &wn.w, 1e-5f);
			snprintf(name, sizeof name, "ref: rmsnorm %s %lldx%lld, %s weight, rtol (n/2 + 6) u", isa,
			         (long long)R, (long long)C, llm_dtype_name(ndt[d]));
			check_close(name, got, ref, n, 0, rt);
			/* add_rmsnorm, OUT = Y as in the model: x + y exact (f32 adds
			 * on both sides), then the rmsnorm bound */
			memcpy(x2, x, n * 4);
			memcpy(y2, y, n * 4);
			memcpy(got, y, n * 4);
			be->ops->add_rmsnorm(be, llm_view_f32(got, R, C), llm_view_f32(x2, R, C), llm_view_f32(got, R, C),
			                     &wn.w, 1e-5f);
			memcpy(ref, x, n * 4);
			llm_ref_add_rmsnorm(llm_view_f32(y2, R, C), llm_view_f32(ref, R, C), llm_view_f32(y2, R, C),
			                    &wn.w, 1e-5f);
			check(!memcmp(x2, ref, n * 4), "ref: add_rmsnorm %s %lldx%lld: x + y the reference's bits", isa,
			      (long long)R, (long long)C);
			snprintf(name, sizeof name, "ref: add_rmsnorm %s %lldx%lld, %s weight, out = y: rtol (n/2 + 6) u",
			         isa, (long long)R, (long long)C, llm_dtype_name(ndt[d]));
			check_close(name, got, y2, n, 0, rt);
			free_weight(&wn);
		}
		/* swiglu, |g| to 12 and some to 120 (the exp's clamp): e^-g
		 * within 2 ulp (llm_cpu_exp), then 1 + e, 1/, g * and * u by u
		 * each: 6 u relative, 8 u with the reference's rounding; atol
		 * 1e-30 where g < -87 (e^-g clamped at e^88: true values under
		 * 1e-36, the computed ones under 1e-36 too, possibly subnormal) */
		for (size_t i = 0; i < n; i++)
			x2[i] = (i % 11 == 3 ? 120.0f : 12.0f) * x[i];
		be->ops->swiglu(be, llm_view_f32(got, R, C), llm_view_f32(x2, R, C), llm_view_f32(y, R, C));
		llm_ref_swiglu(llm_view_f32(ref, R, C), llm_view_f32(x2, R, C), llm_view_f32(y, R, C));
		snprintf(name, sizeof name, "ref: swiglu %s %lldx%lld, rtol 8 u, atol 1e-30", isa, (long long)R, (long long)C);
		check_close(name, got, ref, n, 1e-30, 8 * U24);
		/* geglu, |g| to 12 and some to 120: 1 + tanhf(z) loses relative
		 * precision where tanh nears -1, so the bound is absolute in
		 * |g u| (the product's size): tanhf within a few ulp of 1, z's own
		 * rounding damped by tanh' <= 1 times |z| sech^2 z <= 0.45: 32 u |g u| */
		be->ops->geglu(be, llm_view_f32(got, R, C), llm_view_f32(x2, R, C), llm_view_f32(y, R, C));
		llm_ref_geglu(llm_view_f32(ref, R, C), llm_view_f32(x2, R, C), llm_view_f32(y, R, C));
		{
			int gok = 1;
			for (size_t i = 0; i < n; i++)
				gok &= fabs((double)got[i] - ref[i]) <= 32 * U24 * fabs((double)x2[i] * y[i]) + 1e-30;
			check(gok, "ref: geglu %s %lldx%lld, atol 32 u |g u|", isa, (long long)R, (long long)C);
		}
		/* softcap: x / cap, tanhf, * cap: a few u of the cap */
		memcpy(got, x2, n * 4);
		memcpy(ref, x2, n * 4);
		be->ops->softcap(be, llm_view_f32(got, R, C), 30.0f);
		llm_ref_softcap(llm_view_f32(ref, R, C), 30.0f);
		snprintf(name, sizeof name, "ref: softcap %s %lldx%lld, cap 30: atol 8 u cap", isa, (long long)R, (long long)C);
		check_close(name, got, ref, n, 8 * U24 * 30.0, 0);
		/* add and gather: exact */
		memcpy(got, x, n * 4);
		memcpy(ref, x, n * 4);
		be->ops->add(be, llm_view_f32(got, R, C), llm_view_f32(y, R, C));
		llm_ref_add(llm_view_f32(ref, R, C), llm_view_f32(y, R, C));
		check(!memcmp(got, ref, n * 4), "ref: add %s %lldx%lld: the reference's bits", isa, (long long)R, (long long)C);
		int32_t idx[3] = { (int32_t)(R - 1), 0, (int32_t)(R / 2) };
		be->ops->gather(be, llm_view_f32(got, 3, C), llm_view_f32(x, R, C), idx);
		llm_ref_gather(llm_view_f32(ref, 3, C), llm_view_f32(x, R, C), idx);
		check(!memcmp(got, ref, (size_t)(3 * C) * 4), "ref: gather %s, 3 of %lld rows: the reference's bits", isa,
		      (long long)R);
		free(x);
		free(y);
		free(x2);
		free(y2);
		free(got);
		free(ref);
	}
}

/* softmax helper at this level: e^(x - max) / sum with x to +-30, n up to
 * 300. The f32 difference x - max rounds by u |x - max| (<= 60 u): that
 * much relative error in its exponential, plus 2 ulp of llm_cpu_exp; the
 * lane sum of n terms <= 1 by n u relative; the division by u: rtol
 * (2 * 60 + n + 8) u, with the reference's rounding. */
static void ref_softmax(enum llm_cpu_isa isa)
{
	int ok = 1;
	double worst = 0;
	for (int n = 1; n <= 300; n += 13) {
		float a[300], r[300];
		for (int i = 0; i < n; i++)
			a[i] = r[i] = 30.0f * frand();
		llm_cpu_softmax(isa, a, n);
		llm_ref_softmax(r, n);
		double rt = (120.0 + n + 8) * U24;
		for (int i = 0; i < n; i++) {
			double e = fabs((double)a[i] - r[i]) / (rt * r[i] + 1e-37);
			ok &= e <= 1.0;
			worst = e > worst ? e : worst;
		}
	}
	check(ok, "ref: softmax %s, 1..300 elements to +-30: rtol (120 + n + 8) u (worst %.3f of it)",
	      llm_cpu_isa_name(isa), worst);
}

/* rope at positions deep into the table (to 131071) and d_head with and
 * without a tail of 4 pairs. The angle is the same f32 product on both
 * sides (the definition); cosf/sinf are within 1 ulp (glibc), so within
 * u of the exact cos/sin (|c|, |s| <= 1), each product rounds by u of
 * itself, the sum by u of the result: |err| <= 3 u (|x0| + |x1|) + u,
 * <= 7 u for |x| <= 1: atol 8 u. */
static void ref_rope(struct llm_backend *be)
{
	static const int dh[] = { 10, 24, 64 };
	for (size_t di = 0; di < sizeof dh / sizeof *dh; di++) {
		int d = dh[di], half = d / 2, nh = 5, n = 9, dq = nh * d;
		float inv[32];
		for (int j = 0; j < half; j++)
			inv[j] = (float)pow(500000.0, -2.0 * j / d);
		int32_t pos[9] = { 0, 1, 15, 16, 17, 300, 4095, 65537, 131071 };
		float *q = malloc((size_t)(n * dq) * 4), *r = malloc((size_t)(n * dq) * 4);
		for (int i = 0; i < n * dq; i++)
			q[i] = r[i] = frand();
		be->ops->rope(be, llm_view_f32(q, n, dq), pos, nh, d, inv);
		llm_ref_rope(llm_view_f32(r, n, dq), pos, nh, d, inv);
		char name[128];
		snprintf(name, sizeof name, "ref: rope %s d_head %d, positions 0..131071: atol 8 u", llm_cpu_isa_name(be->isa), d);
		check_close(name, q, r, (size_t)(n * dq), 8 * U24, 0);
		free(q);
		free(r);
	}
}

/* Attention (and kv_store, rope_store) over the paged cache: three
 * sequences grown over 12 steps in chunks of 23, 7 and 1 tokens (so their
 * blocks interleave in the pool and A reaches position 275, 18 blocks into
 * its table), GQA, MQA and MHA, f32, bf16 and fp8 caches. kv_store and the
 * store of rope_store: the reference's bytes (bf16: the same rounding; fp8:
 * the same codes and scales, the reference's codes found by search). The
 * reference reads an fp8 element as the f32 code * scale, as the backend
 * does, so the attention bound below is the same for every cache.
 * Attention, with |q|, |k|, |v| <= 1, d = d_head, n = positions: a score
 * errs by (d + 2) u sqrt(d) at most (f32 dot of d terms of |q k| <= 1, the
 * division), the f32 difference from the max by 2 sqrt(d) u, llm_cpu_exp by
 * 2 ulp, the sum of n weights by n u relative, the division by u; the
 * weighted sum of n values by (n + 1) u of sum p |v| <= 1. The output then
 * errs by at most 2 (d + 2) u sqrt(d) + 4 sqrt(d) u + (2 n + 8) u (weights'
 * relative error counted twice: through each term and through the sum).
 * About 1e-4 for d 64, n 276: a wrong position, head or sign moves the
 * output by 1e-3 or more (a weight of ~1/n of values ~1). */
static void ref_attention(struct llm_backend *be)
{
	static const struct { int h, kvh, d; } cases[] = { { 6, 2, 24 }, { 8, 1, 64 }, { 4, 4, 80 } };
	const char *isa = llm_cpu_isa_name(be->isa);
	for (int kt = 0; kt < 3; kt++)
		for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
			int nh = cases[ci].h, nkv = cases[ci].kvh, d = cases[ci].d, dq = nh * d, dkv = nkv * d;
			enum llm_dtype kdt = KV_DT[kt];
			struct llm_kv_opts ko = { 2, nkv, d, kdt, 16, 40, 3, 320 };
			struct llm_kv kc, kr;
			if (llm_kv_init(&kc, be, &ko) != LLM_OK || llm_kv_init(&kr, be, &ko) != LLM_OK) {
				check(0, "ref: kv init: %s", llm_errmsg());
				return;
			}
			int sq[3];
			for (int i = 0; i < 3; i++) {
				llm_kv_seq_new(&kc, &sq[i]);
				llm_kv_seq_new(&kr, &sq[i]);
			}
			float inv[64];
			for (int j = 0; j < d / 2; j++)
				inv[j] = 1.0f / powf(10000.0f, (float)(2 * j) / (float)d);
			enum { NMAX = 31, STEPS = 12 };
			int32_t len[3] = { 0, 0, 0 }, pos[NMAX], seq[NMAX], tok[NMAX] = { 0 };
			static const int chunk[3] = { 23, 7, 1 };
			float *q = malloc(NMAX * (size_t)dq * 4), *k = malloc(NMAX * (size_t)dkv * 4);
			float *v = malloc(NMAX * (size_t)dkv * 4), *qr = malloc(NMAX * (size_t)dq * 4);
			float *kr2 = malloc(NMAX * (size_t)dkv * 4), *got = malloc(NMAX * (size_t)dq * 4);
			float *ref = malloc(NMAX * (size_t)dq * 4);
			int store_same = 1, rope_ok = 1, attn_ok = 1, ex_ok = 1;
			double worst_rope = 0, worst_attn = 0, worst_ex = 0;
			for (int st = 0; st < STEPS; st++) {
				int n = 0;
				for (int s = 0; s < 3; s++)
					for (int i = 0; i < chunk[s]; i++, n++) {
						seq[n] = sq[s];
						pos[n] = len[s]++;
					}
				struct llm_batch b = { n, tok, pos, seq, NULL, NULL };
				if (llm_kv_prepare(&kc, &b) != LLM_OK || llm_kv_prepare(&kr, &b) != LLM_OK) {
					check(0, "ref: kv prepare step %d: %s", st, llm_errmsg());
					attn_ok = 0;
					break;
				}
				for (int layer = 0; layer < 2; layer++) {
					for (int i = 0; i < n * dq; i++)
						q[i] = qr[i] = frand();
					for (int i = 0; i < n * dkv; i++) {
						k[i] = kr2[i] = frand();
						v[i] = frand();
					}
					/* layer 0 through rope_store, layer 1 through rope, rope, kv_store */
					if (layer == 0)
						be->ops->rope_store(be, llm_view_f32(q, n, dq), llm_view_f32(k, n, dkv),
						                    llm_view_f32(v, n, dkv), &kc, layer, &b, nh, nkv, d, inv);
					else {
						be->ops->rope(be, llm_view_f32(q, n, dq), pos, nh, d, inv);
						be->ops->rope(be, llm_view_f32(k, n, dkv), pos, nkv, d, inv);
						be->ops->kv_store(be, &kc, layer, &b, llm_view_f32(k, n, dkv), llm_view_f32(v, n, dkv));
					}
					llm_ref_rope(llm_view_f32(qr, n, dq), pos, nh, d, inv);
					llm_ref_rope(llm_view_f32(kr2, n, dkv), pos, nkv, d, inv);
					for (int i = 0; i < n * dq; i++) {
						double e = fabs((double)q[i] - qr[i]) / (8 * U24);
						rope_ok &= e <= 1.0;
						worst_rope = e > worst_rope ? e : worst_rope;
					}
					for (int i = 0; i < n * dkv; i++) {
						double e = fabs((double)k[i] - kr2[i]) / (8 * U24);
						rope_ok &= e <= 1.0;
						worst_rope = e > worst_rope ? e : worst_rope;
					}
					/* the store checked on its own: the reference stores the
					 * backend's rotated k (the rotation is checked above) */
					llm_ref_kv_store(&kr, layer, &b, llm_view_f32(k, n, dkv), llm_view_f32(v, n, dkv));
					be->ops->attention(be, llm_view_f32(got, n, dq), llm_view_f32(q, n, dq), &kc, layer, &b, nh);
					llm_ref_attention(llm_view_f32(ref, n, dq), llm_view_f32(q, n, dq), &kr, layer, &b, nh);
					int pmax = len[0];
					double tol = (2.0 * (d + 2) * sqrt(d) + 4 * sqrt(d) + 2.0 * pmax + 8) * U24;
					for (int i = 0; i < n * dq; i++) {
						double e = fabs((double)got[i] - ref[i]) / tol;
						attn_ok &= e <= 1.0;
						worst_attn = e > worst_attn || isnan(e) ? e : worst_attn;
					}
					/* attention_ex: another divisor, a softcap of 0.7 and a
					 * window of 37 (a block and a part): the same bound, with
					 * tanhf's few ulp of the cap added to each score (the
					 * cap's derivative is at most 1, so nothing else grows) */
					struct llm_attn_opts ao = { sqrtf((float)d) * 0.8f, 0.7f, 37 };
					be->ops->attention_ex(be, llm_view_f32(got, n, dq), llm_view_f32(q, n, dq), &kc, layer, &b,
					                      nh, &ao);
					llm_ref_attention_ex(llm_view_f32(ref, n, dq), llm_view_f32(q, n, dq), &kr, layer, &b, nh,
					                     &ao);
					for (int i = 0; i < n * dq; i++) {
						double e = fabs((double)got[i] - ref[i]) / (tol + 16 * U24);
						ex_ok &= e <= 1.0;
						worst_ex = e > worst_ex || isnan(e) ? e : worst_ex;
					}
				}
			}
			size_t bytes = (size_t)ko.n_layer * (size_t)ko.n_block * (size_t)ko.block_size * (size_t)dkv * kc.elt;
			store_same = !memcmp(kc.k, kr.k, bytes) && !memcmp(kc.v, kr.v, bytes);
			if (kc.ks)             /* one f32 scale per (token, head) */
				store_same &= !memcmp(kc.ks, kr.ks, bytes / (size_t)d * 4) && !memcmp(kc.vs, kr.vs, bytes / (size_t)d * 4);
			check(ex_ok, "ref: attention_ex %s %d/%d heads d %d, %s KV: divisor, softcap 0.7, window 37 "
			      "(worst %.3f of the bound)", isa, nh, nkv, d, llm_dtype_name(kdt), worst_ex);
			check(rope_ok, "ref: rope_store and rope %s %d/%d heads d %d, %s KV: q, k within 8 u (worst %.3f of it)",
			      isa, nh, nkv, d, llm_dtype_name(kdt), worst_rope);
			check(store_same, "ref: kv_store and rope_store %s %d/%d heads d %d, %s KV, 3 sequences, 12 steps: "
			      "the reference's cache bytes", isa, nh, nkv, d, llm_dtype_name(kdt));
			check(attn_ok, "ref: attention %s %d/%d heads d %d, %s KV, positions to 275 (block 17): within "
			      "(2 (d + 2) sqrt(d) + 4 sqrt(d) + 2 n + 8) u (worst %.3f of it)", isa, nh, nkv, d,
			      llm_dtype_name(kdt), worst_attn);
			free(q);
			free(k);
			free(v);
			free(qr);
			free(kr2);
			free(got);
			free(ref);
			llm_kv_free(&kc);
			llm_kv_free(&kr);
		}
}

static void test_ref(enum llm_cpu_isa best)
{
	for (enum llm_cpu_isa isa = LLM_ISA_SCALAR; isa < LLM_ISA_COUNT; isa++) {
		if (isa > best) {
			check_skip("this CPU lacks it", "ref: every op at %s against the reference", llm_cpu_isa_name(isa));
			continue;
		}
		struct llm_backend_opts o = { 2, isa, 0 };
		struct llm_backend *be;
		if (!check(llm_backend_open("cpu", &o, &be) == LLM_OK, "ref: open a 2-thread %s cpu backend",
		           llm_cpu_isa_name(isa)))
			continue;
		ref_matmul(be);
		ref_rowwise(be);
		ref_rope(be);
		ref_attention(be);
		ref_softmax(isa);
		llm_backend_close(be);
	}
}

int main(void)
{
	enum llm_cpu_isa best = llm_cpu_isa_detect();
	check_diag("cpu: best level %s", llm_cpu_isa_name(best));
	test_registry();
	test_matmul(best);
	test_exp(best);
	test_attn_block(best);
	test_attn_split(best);
	test_e4m3_rows(best);
	test_backend_ops(best);
	test_fused_ops(best);
	test_chain(best);
	test_ref(best);
	test_kv();
	test_kv_window();
	return check_done();
}
