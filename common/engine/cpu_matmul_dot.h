/* common/engine/cpu_matmul_dot.h: the AVX512_BF16 tile kernels of cpu_matmul.c,
 * included there twice: DOT_VBMI 0 converts E4M3 codes 32 at a time through
 * 16-bit word permutes; DOT_VBMI 1 (CPUs with AVX512_VBMI) converts 64 at a
 * time with byte permutes (two table lookups, the sign, two interleaves:
 * five instructions for 64 codes instead of fourteen). Both give the same
 * bf16 words and feed the same dot products in the same order, so the two
 * variants agree bit for bit. The includer defines DOT_TARGET (the target
 * attribute), DOT_NAME(f) (the variant's name of f) and DOT_VBMI. */

#if DOT_VBMI
#define DOT_STEP 64               /* codes converted at a time */
#else
#define DOT_STEP 32
#endif

/* ---- E4M3 codes to bf16 words ------------------------------------------ */

DOT_TARGET static INL void DOT_NAME(tab_build)(float s, struct e4m3_tab *tb)
{
#if DOT_VBMI
	e4m3_tab_bytes(s, tb);
#else
	e4m3_tab_words(s, tb);
#endif
}

/* Scale row SR becomes the one TS holds. */
DOT_TARGET static void DOT_NAME(tabs_row)(struct tabs *ts, int64_t sr)
{
	if (ts->row == sr)
		return;
	ts->row = sr;
	ts->spare_b = -1;
	int64_t nb = ts->scale_cols < TAB_MAX ? ts->scale_cols : TAB_MAX;
	const float *s = ts->scale + sr * ts->scale_cols;
	for (int64_t b = 0; b < nb; b++)
		DOT_NAME(tab_build)(s[b], &ts->t[b]);
}

/* The table of column block B in the scale row held. */
DOT_TARGET static INL const struct e4m3_tab *DOT_NAME(tab_at)(struct tabs *ts, int64_t b)
{
	if (b < TAB_MAX)
		return &ts->t[b];
	if (ts->spare_b != b) {
		DOT_NAME(tab_build)(ts->scale[ts->row * ts->scale_cols + b], &ts->spare);
		ts->spare_b = b;
	}
	return &ts->spare;
}

/* K <= DOT_STEP codes of one scale block (table TB) -> bf16 words w[0]
 * (codes 0..31) and, VBMI, w[1] (32..63); the words past K are zero. */
DOT_TARGET static INL void DOT_NAME(conv)(const struct e4m3_tab *tb, __m512i ia, __m512i ib,
                                         const uint8_t *p, int64_t k, __m512i w[2])
{
#if DOT_VBMI
	__mmask64 m = k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << k) - 1);
	e4m3x64_bf16(tb, ia, ib, p, m, &w[0], &w[1]);
	if (k < 64) {
		w[0] = _mm512_maskz_mov_epi16((__mmask32)m, w[0]);
		w[1] = _mm512_maskz_mov_epi16((__mmask32)(m >> 32), w[1]);
	}
#else
	(void)ia;
	(void)ib;
	__mmask32 m = k >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << k) - 1);
	w[0] = e4m3x32_bf16(tb, p, m);
	if (k < 32)
		w[0] = _mm512_maskz_mov_epi16(m, w[0]);
	w[1] = _mm512_setzero_si512();
#endif
}

/* Codes [c, e) of ROW (a step, e - c <= DOT_STEP) across scale blocks: each
 * block's codes through its own table, blended into place. */
DOT_TARGET static __attribute__((noinline)) void DOT_NAME(conv_span)(struct tabs *ts, __m512i ia, __m512i ib,
                                                                    const uint8_t *row, int64_t c, int64_t e,
                                                                    __m512i w[2])
{
	w[0] = w[1] = _mm512_setzero_si512();
	for (int64_t b = c / ts->bk; b * ts->bk < e; b++) {
		int64_t lo = b * ts->bk > c ? b * ts->bk - c : 0;
		int64_t hi = (b + 1) * ts->bk < e ? (b + 1) * ts->bk - c : e - c;
		__m512i v[2];
		DOT_NAME(conv)(DOT_NAME(tab_at)(ts, b), ia, ib, row + c, e - c, v);
		/* words [lo, hi) of the step */
		uint64_t m = (hi >= 64 ? ~(uint64_t)0 : (((uint64_t)1 << hi) - 1)) & ~(((uint64_t)1 << lo) - 1);
		w[0] = _mm512_mask_blend_epi16((__mmask32)m, w[0], v[0]);
		w[1] = _mm512_mask_blend_epi16((__mmask32)(m >> 32), w[1], v[1]);
	}
}

/* Row ROW (N codes, scale row held by TS) -> N bf16 words at DST. */
DOT_TARGET static void DOT_NAME(row_words)(uint16_t *dst, const uint8_t *row, int64_t n, struct tabs *ts,
                                          __m512i ia, __m512i ib)
{
	int64_t start = 0;          /* codes before it are done */
#if DOT_VBMI
	/* Blocks of whole steps (the usual 128): a block's table stays in
	 * registers and its full steps take no masks. Same words as below;
	 * this loop is a third of a batched E4M3 matmul. A short last step
	 * goes through the loop below. */
	if (ts->bk % DOT_STEP == 0) {
		int64_t full = n / DOT_STEP * DOT_STEP;
		for (int64_t c0 = 0, b = 0; c0 < full; c0 += ts->bk, b++) {
			struct e4m3_tab tb = *DOT_NAME(tab_at)(ts, b);
			int64_t ce = c0 + ts->bk < full ? c0 + ts->bk : full;
			for (int64_t c = c0; c < ce; c += DOT_STEP) {
				__m512i w0, w1;
				e4m3x64_bf16(&tb, ia, ib, row + c, ~(__mmask64)0, &w0, &w1);
				_mm512_storeu_si512(dst + c, w0);
				_mm512_storeu_si512(dst + c + 32, w1);
			}
		}
		start = full;
	}
#endif
	int64_t b = start / ts->bk, bend = (b + 1) * ts->bk;
	for (int64_t c = start; c < n; c += DOT_STEP) {
		int64_t e = c + DOT_STEP < n ? c + DOT_STEP : n;
		while (c >= bend) {
			b++;
			bend += ts->bk;
		}
		__m512i w[2];
		if (e <= bend)
			DOT_NAME(conv)(DOT_NAME(tab_at)(ts, b), ia, ib, row + c, e - c, w);
		else
			DOT_NAME(conv_span)(ts, ia, ib, row, c, e, w);
		int64_t k = e - c;
		if (k == DOT_STEP) {
			_mm512_storeu_si512(dst + c, w[0]);
#if DOT_VBMI
			_mm512_storeu_si512(dst + c + 32, w[1]);
#endif
		} else {
			_mm512_mask_storeu_epi16(dst + c, k >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << k) - 1), w[0]);
			if (k > 32)
				_mm512_mask_storeu_epi16(dst + c + 32, (__mmask32)((1u << (k - 32)) - 1), w[1]);
		}
	}
}

/* ---- tiles: NT tokens x NR rows ----------------------------------------
 * NT and NR are constants at every call, so each shape compiles to
 * straight-line code with the accumulators in registers. */

DOT_TARGET static INL void DOT_NAME(tile_zero)(__m512 acc[4][4], const int nt, const int nr)
{
#pragma GCC unroll 4
	for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
		for (int t = 0; t < nt; t++)
			acc[i][t] = _mm512_setzero_ps();
}

/* y[t * ys + i * yrs] = the lane sum of acc[i][t] (reduce4_512 for four
 * rows: the same bits as _mm512_reduce_add_ps of each). */
DOT_TARGET static INL void DOT_NAME(tile_store)(float *y, int64_t ys, int64_t yrs, __m512 acc[4][4], const int nt,
                                               const int nr)
{
#pragma GCC unroll 4
	for (int t = 0; t < nt; t++) {
		float *yt = y + t * ys;
		if (nr == 4) {
			__m512 s = reduce4_512(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
			s = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s);
			if (yrs == 1) {
				_mm_storeu_ps(yt, _mm512_castps512_ps128(s));
			} else {
				float v[4];
				_mm_storeu_ps(v, _mm512_castps512_ps128(s));
				for (int i = 0; i < 4; i++)
					yt[i * yrs] = v[i];
			}
		} else {
#pragma GCC unroll 4
			for (int i = 0; i < nr; i++)
				yt[i * yrs] = _mm512_reduce_add_ps(acc[i][t]);
		}
	}
}

/* Over bf16 rows W (a BF16 matrix, or the bf16 copy of an E4M3 row block),
 * STRIDE elements apart, into y rows YRS apart; PF: prefetch distance in
 * elements (0: none). */
DOT_TARGET static INL void DOT_NAME(tile_w16)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                                             const int nt, const int nr, const uint16_t *w, int64_t stride,
                                             int64_t n, size_t pf, int64_t yrs)
{
	__m512 acc[4][4];
	DOT_NAME(tile_zero)(acc, nt, nr);
	for (int64_t c = 0; c < n; c += 32) {
		int64_t left = n - c;
		__mmask32 m = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1);
		__m512bh xv[4];
#pragma GCC unroll 4
		for (int t = 0; t < nt; t++)
			xv[t] = (__m512bh)_mm512_maskz_loadu_epi16(m, xb + t * xbs + c);
#pragma GCC unroll 4
		for (int i = 0; i < nr; i++) {
			const uint16_t *wp = w + (size_t)i * (size_t)stride + (size_t)c;
			if (pf)
				_mm_prefetch((const char *)(wp + pf), _MM_HINT_T1);
			__m512bh wi = (__m512bh)_mm512_maskz_loadu_epi16(m, wp);
#pragma GCC unroll 4
			for (int t = 0; t < nt; t++)
				acc[i][t] = _mm512_dpbf16_ps(acc[i][t], xv[t], wi);
		}
	}
	DOT_NAME(tile_store)(y, ys, yrs, acc, nt, nr);
}

/* One step of tile_codes: the K codes at column C of each row (through
 * table TB, TB[i] for row i when EACH, or across blocks when SPAN) into the
 * accumulators. */
DOT_TARGET static INL void DOT_NAME(step)(__m512 acc[4][4], const uint16_t *xb, int64_t xbs, const int nt,
                                         const int nr, const uint8_t *w, int64_t stride, int64_t c, int64_t k,
                                         const struct e4m3_tab *tb, const int each, int span, struct tabs *ts,
                                         __m512i ia, __m512i ib, size_t pf)
{
	__mmask32 m0 = k >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << k) - 1);
	__m512bh xv0[4];
#pragma GCC unroll 4
	for (int t = 0; t < nt; t++)
		xv0[t] = (__m512bh)_mm512_maskz_loadu_epi16(m0, xb + t * xbs + c);
#if DOT_VBMI
	int two = k > 32;
	__mmask32 m1 = k >= 64 ? (__mmask32)0xffffffffu : two ? (__mmask32)((1u << (k - 32)) - 1) : 0;
	__m512bh xv1[4];
#pragma GCC unroll 4
	for (int t = 0; t < nt; t++)
		xv1[t] = (__m512bh)_mm512_maskz_loadu_epi16(m1, xb + t * xbs + c + 32);
#endif
#pragma GCC unroll 4
	for (int i = 0; i < nr; i++) {
		const uint8_t *wp = w + (size_t)i * (size_t)stride;
		/* the rows of the next tile, same columns: narrow rows
		 * (d_model 576) defeat the hardware prefetcher */
		if (pf)
			_mm_prefetch((const char *)(wp + c + pf), _MM_HINT_T1);
		__m512i wv[2];
		if (!span)
			DOT_NAME(conv)(tb + (each ? i : 0), ia, ib, wp + c, k, wv);
		else
			DOT_NAME(conv_span)(ts, ia, ib, wp, c, c + k, wv);
#pragma GCC unroll 4
		for (int t = 0; t < nt; t++)
			acc[i][t] = _mm512_dpbf16_ps(acc[i][t], xv0[t], (__m512bh)wv[0]);
#if DOT_VBMI
		if (two)
#pragma GCC unroll 4
			for (int t = 0; t < nt; t++)
				acc[i][t] = _mm512_dpbf16_ps(acc[i][t], xv1[t], (__m512bh)wv[1]);
#endif
	}
}

/* Over E4M3 codes converted in registers: rows W, STRIDE bytes apart, all
 * in the scale row TS holds. Steps of DOT_STEP codes at multiples of
 * DOT_STEP; a step that crosses a scale block (blocks not a multiple of the
 * step) takes conv_span. */
DOT_TARGET static INL void DOT_NAME(tile_codes)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                                               const int nt, const int nr, const uint8_t *w, int64_t stride,
                                               int64_t n, struct tabs *ts, __m512i ia, __m512i ib, size_t pf)
{
	__m512 acc[4][4];
	DOT_NAME(tile_zero)(acc, nt, nr);
	int64_t bk = ts->bk;
	struct e4m3_tab tb;
	if (bk % DOT_STEP == 0) {             /* steps inside blocks */
		for (int64_t c0 = 0, b = 0; c0 < n; c0 += bk, b++) {
			int64_t ce = c0 + bk < n ? c0 + bk : n;
			tb = *DOT_NAME(tab_at)(ts, b);
			for (int64_t c = c0; c < ce; c += DOT_STEP)
				DOT_NAME(step)(acc, xb, xbs, nt, nr, w, stride, c, ce - c < DOT_STEP ? ce - c : DOT_STEP,
				               &tb, 0, 0, ts, ia, ib, pf);
		}
	} else {
		int64_t b = 0, bend = bk, cur = -1;
		for (int q = 0; q < 4; q++)
			tb.t[q] = _mm512_setzero_si512();
		for (int64_t c = 0; c < n; c += DOT_STEP) {
			int64_t e = c + DOT_STEP < n ? c + DOT_STEP : n;
			while (c >= bend) {
				b++;
				bend += bk;
			}
			int span = e > bend;
			if (!span && b != cur) {
				tb = *DOT_NAME(tab_at)(ts, b);
				cur = b;
			}
			DOT_NAME(step)(acc, xb, xbs, nt, nr, w, stride, c, e - c, &tb, 0, span, ts, ia, ib, pf);
		}
	}
	DOT_NAME(tile_store)(y, ys, 1, acc, nt, nr);
}

/* NT tokens (1 to 4) over 4 rows of E4M3 codes whose scale rows differ (a
 * (d_out, 1) scale: the FP8 embedding as lm_head; 1xK blocks), each row
 * through its own table: tile_codes' steps, so each row gets the
 * operations of an NT x 1 tile in the same order and the same bits; four
 * rows' accumulator chains instead of one, whose dot-product latency
 * bounded the 1-row tile, and a row's codes converted once for the NT
 * tokens. SROW: each row's scale row; blocks of BK columns, a multiple of
 * DOT_STEP or the whole row. */
DOT_TARGET static INL void DOT_NAME(tile_codes_rows4)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                                                     const int nt, const uint8_t *w, int64_t n,
                                                     const float *const srow[4], int64_t bk,
                                                     __m512i ia, __m512i ib, size_t pf)
{
	__m512 acc[4][4];
	DOT_NAME(tile_zero)(acc, nt, 4);
	for (int64_t c0 = 0, b = 0; c0 < n; c0 += bk, b++) {
		int64_t ce = c0 + bk < n ? c0 + bk : n;
		struct e4m3_tab tb[4];
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++)
			DOT_NAME(tab_build)(srow[i][b], &tb[i]);
		for (int64_t c = c0; c < ce; c += DOT_STEP)
			DOT_NAME(step)(acc, xb, xbs, nt, 4, w, n, c, ce - c < DOT_STEP ? ce - c : DOT_STEP,
			               tb, 1, 0, NULL, ia, ib, pf);
	}
	DOT_NAME(tile_store)(y, ys, 1, acc, nt, 4);
}

DOT_TARGET static void DOT_NAME(tile_codes_rows4_any)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                                                     int nt, const uint8_t *w, int64_t n,
                                                     const float *const srow[4], int64_t bk,
                                                     __m512i ia, __m512i ib, size_t pf)
{
	if (nt == 1)
		DOT_NAME(tile_codes_rows4)(y, ys, xb, xbs, 1, w, n, srow, bk, ia, ib, pf);
	else if (nt == 2)
		DOT_NAME(tile_codes_rows4)(y, ys, xb, xbs, 2, w, n, srow, bk, ia, ib, pf);
	else if (nt == 3)
		DOT_NAME(tile_codes_rows4)(y, ys, xb, xbs, 3, w, n, srow, bk, ia, ib, pf);
	else
		DOT_NAME(tile_codes_rows4)(y, ys, xb, xbs, 4, w, n, srow, bk, ia, ib, pf);
}

/* The 4x4 tile over bf16 rows when n is a multiple of 64: the operations of
 * tile_w16 in the same order (two 32-column chunks a step), without masks
 * or branches in the loop. PF: prefetch distance in elements (0: none, the
 * rows are in cache). */
DOT_TARGET static void DOT_NAME(tile44)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                                       const uint16_t *w, int64_t n, size_t pf)
{
	__m512 acc[4][4];
#pragma GCC unroll 4
	for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
		for (int t = 0; t < 4; t++)
			acc[i][t] = _mm512_setzero_ps();
	for (int64_t c = 0; c < n; c += 64) {
		__m512bh x0[4], x1[4];
#pragma GCC unroll 4
		for (int t = 0; t < 4; t++) {
			x0[t] = (__m512bh)_mm512_loadu_si512(xb + t * xbs + c);
			x1[t] = (__m512bh)_mm512_loadu_si512(xb + t * xbs + c + 32);
		}
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++) {
			if (pf) {                 /* 64 bf16 columns: two lines */
				_mm_prefetch((const char *)(w + i * n + c + pf), _MM_HINT_T1);
				_mm_prefetch((const char *)(w + i * n + c + pf + 32), _MM_HINT_T1);
			}
			__m512bh w0 = (__m512bh)_mm512_loadu_si512(w + i * n + c);
			__m512bh w1 = (__m512bh)_mm512_loadu_si512(w + i * n + c + 32);
#pragma GCC unroll 4
			for (int t = 0; t < 4; t++)
				acc[i][t] = _mm512_dpbf16_ps(acc[i][t], x0[t], w0);
#pragma GCC unroll 4
			for (int t = 0; t < 4; t++)
				acc[i][t] = _mm512_dpbf16_ps(acc[i][t], x1[t], w1);
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < 4; t++) {
		__m512 s = reduce4_512(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
		s = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s);
		_mm_storeu_ps(y + t * ys, _mm512_castps512_ps128(s));
	}
}

#if DOT_VBMI
/* tile44 over E4M3 codes converted here, leaving the 4 rows' bf16 words at
 * KEEP (rows N apart) for the row block's other token tiles: the permutes
 * of the conversion overlap the dot products instead of running before
 * them. The words and the operations are those of row_words then tile44,
 * in the same order. The tokens' x is read at each use (a memory operand),
 * so the 16 accumulators, the table and the permute indices stay in
 * registers. Needs N and the scale blocks' width multiples of 64, and the
 * 4 rows in one scale row (TS holds it). */
DOT_TARGET static void DOT_NAME(tile44_keep)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                                            const uint8_t *w, int64_t n, struct tabs *ts, __m512i ia,
                                            __m512i ib, uint16_t *keep)
{
	__m512 acc[4][4];
	DOT_NAME(tile_zero)(acc, 4, 4);
	for (int64_t c0 = 0, b = 0; c0 < n; c0 += ts->bk, b++) {
		struct e4m3_tab tb = *DOT_NAME(tab_at)(ts, b);
		int64_t ce = c0 + ts->bk < n ? c0 + ts->bk : n;
		for (int64_t c = c0; c < ce; c += 64) {
#pragma GCC unroll 4
			for (int i = 0; i < 4; i++) {
				__m512i w0, w1;
				e4m3x64_bf16(&tb, ia, ib, w + (size_t)i * (size_t)n + (size_t)c, ~(__mmask64)0, &w0, &w1);
				uint16_t *kp = keep + (size_t)i * (size_t)n + (size_t)c;
				_mm512_storeu_si512(kp, w0);
				_mm512_storeu_si512(kp + 32, w1);
#pragma GCC unroll 4
				for (int t = 0; t < 4; t++)
					acc[i][t] = _mm512_dpbf16_ps(acc[i][t], (__m512bh)_mm512_loadu_si512(xb + t * xbs + c),
					                             (__m512bh)w0);
#pragma GCC unroll 4
				for (int t = 0; t < 4; t++)
					acc[i][t] = _mm512_dpbf16_ps(acc[i][t], (__m512bh)_mm512_loadu_si512(xb + t * xbs + c + 32),
					                             (__m512bh)w1);
			}
		}
	}
	DOT_NAME(tile_store)(y, ys, 1, acc, 4, 4);
}
#endif

DOT_TARGET static void DOT_NAME(tile_w16_any)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                                             int nt, int nr, const uint16_t *w, int64_t stride, int64_t n,
                                             size_t pf, int64_t yrs)
{
	if (nt == 4 && nr == 4)
		DOT_NAME(tile_w16)(y, ys, xb, xbs, 4, 4, w, stride, n, pf, yrs);
	else if (nt == 3 && nr == 4)
		DOT_NAME(tile_w16)(y, ys, xb, xbs, 3, 4, w, stride, n, pf, yrs);
	else if (nt == 2 && nr == 4)
		DOT_NAME(tile_w16)(y, ys, xb, xbs, 2, 4, w, stride, n, pf, yrs);
	else if (nt == 4)
		DOT_NAME(tile_w16)(y, ys, xb, xbs, 4, 1, w, stride, n, pf, yrs);
	else if (nt == 3)
		DOT_NAME(tile_w16)(y, ys, xb, xbs, 3, 1, w, stride, n, pf, yrs);
	else if (nt == 2)
		DOT_NAME(tile_w16)(y, ys, xb, xbs, 2, 1, w, stride, n, pf, yrs);
	else if (nr == 4)
		DOT_NAME(tile_w16)(y, ys, xb, xbs, 1, 4, w, stride, n, pf, yrs);
	else
		DOT_NAME(tile_w16)(y, ys, xb, xbs, 1, 1, w, stride, n, pf, yrs);
}

DOT_TARGET static void DOT_NAME(tile_codes_any)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                                               int nt, int nr, const uint8_t *w, int64_t stride, int64_t n,
                                               struct tabs *ts, __m512i ia, __m512i ib, size_t pf)
{
	if (nt == 4 && nr == 4)
		DOT_NAME(tile_codes)(y, ys, xb, xbs, 4, 4, w, stride, n, ts, ia, ib, pf);
	else if (nt == 3 && nr == 4)
		DOT_NAME(tile_codes)(y, ys, xb, xbs, 3, 4, w, stride, n, ts, ia, ib, pf);
	else if (nt == 2 && nr == 4)
		DOT_NAME(tile_codes)(y, ys, xb, xbs, 2, 4, w, stride, n, ts, ia, ib, pf);
	else if (nt == 3)
		DOT_NAME(tile_codes)(y, ys, xb, xbs, 3, 1, w, stride, n, ts, ia, ib, pf);
	else if (nt == 2)
		DOT_NAME(tile_codes)(y, ys, xb, xbs, 2, 1, w, stride, n, ts, ia, ib, pf);
	else if (nt == 4)
		DOT_NAME(tile_codes)(y, ys, xb, xbs, 4, 1, w, stride, n, ts, ia, ib, pf);
	else if (nr == 4)
		DOT_NAME(tile_codes)(y, ys, xb, xbs, 1, 4, w, stride, n, ts, ia, ib, pf);
	else
		DOT_NAME(tile_codes)(y, ys, xb, xbs, 1, 1, w, stride, n, ts, ia, ib, pf);
}

DOT_TARGET static void DOT_NAME(matmul_dot)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs, int64_t n_tok,
                           const struct llm_weight *w, int64_t r0, int64_t r1)
{
	int64_t n = w->cols;
	int fp8 = w->dtype == LLM_DTYPE_E4M3;
	/* 1 to 3 tokens read from the weights (no bf16 copy): every token of
	 * the step in one tile, so a row is read (and an E4M3 code converted)
	 * once a step, not once a token. BF16 rows go in tiles of four rows a
	 * quarter of the range apart, four long streams, each with a prefetch
	 * one row ahead: four rows side by side (four short streams a row
	 * apart, 4 KiB for d_model 2048) ran at 72% of the read bandwidth on
	 * one Zen 5 core, and one row at a time waits on the latency of its
	 * one accumulator. E4M3 keeps 4-row tiles below (the conversion, not
	 * the stream, bounds them). */
	if (!fp8 && n_tok < 4) {
		const uint16_t *wd = (const uint16_t *)w->data;
		int64_t q = (r1 - r0) / 4;
		for (int64_t j = 0; j < q; j++)
			DOT_NAME(tile_w16_any)(y + r0 + j, ys, xb, xbs, (int)n_tok, 4, wd + (size_t)(r0 + j) * (size_t)n,
			                       q * n, n, (size_t)n, q);
		for (int64_t r = r0 + 4 * q; r < r1; r++)
			DOT_NAME(tile_w16_any)(y + r, ys, xb, xbs, (int)n_tok, 1, wd + (size_t)r * (size_t)n, n, n,
			                       (size_t)n, 1);
		return;
	}
#if DOT_VBMI
	__m512i ia = _mm512_loadu_si512(e4m3_interleave), ib = _mm512_loadu_si512(e4m3_interleave + 64);
#else
	__m512i ia = _mm512_setzero_si512(), ib = ia;
#endif
	struct e4m3_tab tabv[TAB_MAX];
	struct tabs ts = { .scale = w->scale, .scale_cols = w->scale_cols, .bk = w->block_cols,
	                   .br = w->block_rows, .row = -1, .spare_b = -1, .t = tabv };
	/* E4M3 for COPY_MIN_TOK tokens or more: convert a row block to bf16
	 * once, for all the token tiles. Fewer stay in registers, each token
	 * tile converting the codes again: from memory (a decode step) that
	 * was as fast as the copy's store and reload or faster (matmul_bench,
	 * one thread, Zen 5, 5 to 7 tokens: 2048 x 2048 in 128x128 blocks
	 * 338-438 -> 337-401 us; 49152 x 576 with a scale a row 2467-3232 ->
	 * 1966-2295 us); at 8 the copy is as fast from memory and faster from
	 * cache. Rows whose scale rows differ take tile_codes_rows4 (a table a
	 * row) for every token count below it (49152 x 576, 2 to 4 tokens:
	 * 2240-2738 -> 1198-1377 us; they were copied). */
	int64_t rbn = RB;
	int copy = 0;
	if (fp8 && n_tok >= COPY_MIN_TOK && n * 4 <= WBUF_ELEMS) {
		copy = 1;
		rbn = WBUF_ELEMS / n / 4 * 4;
		if (rbn > RB)
			rbn = RB;
	}
	_Alignas(64) uint16_t wbuf[WBUF_ELEMS];
	size_t row_bytes = (size_t)n * (fp8 ? 1 : 2), ahead = (PF_BYTES + row_bytes - 1) / row_bytes;
	size_t pf = (ahead > 4 ? ahead : 4) * (size_t)n;
	/* several token tiles: the next row block is prefetched while this one
	 * is reused from cache (BF16 rows in place, or E4M3 copied to bf16) */
	int spread = copy || (!fp8 && n_tok > 4);
	int64_t sr_lo = 0, sr_hi = 0;        /* the rows of the scale row TS holds */
	for (int64_t rb = r0; rb < r1; rb += rbn) {
		int64_t re = rb + rbn < r1 ? rb + rbn : r1;
		/* The next row block (E4M3 codes or BF16 rows) is fetched into L2
		 * while this one is multiplied, a few lines before each tile: a
		 * row block spans several pages and the hardware prefetcher
		 * starts over at each, and prefetches issued in one burst are
		 * partly dropped. */
		const char *nx = NULL, *ne = NULL;
		size_t per = 0;
		if (spread) {
			/* past r1 too: the pool hands a thread neighbouring chunks */
			int64_t nre = re + rbn < w->rows ? re + rbn : w->rows;
			int64_t tiles = (n_tok + 3) / 4 * ((re - rb) / 4 + (re - rb) % 4);
			nx = (const char *)w->data + (size_t)re * row_bytes;
			ne = (const char *)w->data + (size_t)nre * row_bytes;
			per = ne > nx ? ((size_t)(ne - nx) / 64 + (size_t)tiles) / (size_t)tiles * 64 : 0;
		}
		/* the first token tile converts (tile44_keep) where it can;
		 * otherwise the block is converted first */
		int fuse = copy && DOT_VBMI && n_tok >= 4 && n % 64 == 0 && w->block_cols % 64 == 0
		           && w->block_rows % 4 == 0;
		if (copy && !fuse)
			for (int64_t r = rb; r < re; r++) {
				if (r < sr_lo || r >= sr_hi) {
					int64_t sr = r / w->block_rows;
					sr_lo = sr * w->block_rows;
					sr_hi = sr_lo + w->block_rows;
					DOT_NAME(tabs_row)(&ts, sr);
				}
				DOT_NAME(row_words)(wbuf + (size_t)(r - rb) * (size_t)n,
				                    (const uint8_t *)w->data + (size_t)r * (size_t)n, n, &ts, ia, ib);
			}
		for (int64_t t = 0; t < n_tok; ) {
			/* tiles of 4 tokens, then one of the rest (BF16 from
			 * memory, one thread, 2048 x 2048, 6 and 7 tokens as
			 * 4 + 1 + 1 (+ 1): 515-537 us; as 4 + 2, 4 + 3: 415-437) */
			int nt = n_tok - t < 4 ? (int)(n_tok - t) : 4;
			for (int64_t r = rb; r < re; ) {
				int nr = re - r >= 4 ? 4 : 1;
				if (fp8 && !copy && nr == 4 && (r + 3) / w->block_rows != r / w->block_rows &&
				    (w->block_cols % DOT_STEP == 0 || w->block_cols >= n)) {
					/* 4 rows across scale rows, a table each */
					const float *srow[4];
					for (int i = 0; i < 4; i++)
						srow[i] = w->scale + ((r + i) / w->block_rows) * w->scale_cols;
					DOT_NAME(tile_codes_rows4_any)(y + t * ys + r, ys, xb + t * xbs, xbs, nt,
					                               (const uint8_t *)w->data + (size_t)r * (size_t)n, n,
					                               srow, w->block_cols, ia, ib, pf);
					r += 4;
					continue;
				}
				if (fp8 && (!copy || (fuse && t == 0))) {   /* the rows of a tile share a scale row */
					if (r < sr_lo || r >= sr_hi) {
						int64_t sr = r / w->block_rows;
						sr_lo = sr * w->block_rows;
						sr_hi = sr_lo + w->block_rows;
						DOT_NAME(tabs_row)(&ts, sr);
					}
					if (nr == 4 && r + 3 >= sr_hi)
						nr = 1;
				}
				for (size_t q = 0; q < per && nx < ne; q += 64, nx += 64)
					_mm_prefetch(nx, _MM_HINT_T1);
				float *yt = y + t * ys + r;
				const uint16_t *xt = xb + t * xbs;
				const uint16_t *w16 = copy ? wbuf + (size_t)(r - rb) * (size_t)n
				                      : fp8 ? NULL : (const uint16_t *)w->data + (size_t)r * (size_t)n;
				size_t tpf = spread ? 0 : pf;
				if (fuse && t == 0) {
					const uint8_t *wc = (const uint8_t *)w->data + (size_t)r * (size_t)n;
					uint16_t *kw = wbuf + (size_t)(r - rb) * (size_t)n;
#if DOT_VBMI
					if (nr == 4)
						DOT_NAME(tile44_keep)(yt, ys, xt, xbs, wc, n, &ts, ia, ib, kw);
					else
#endif
					{
						DOT_NAME(row_words)(kw, wc, n, &ts, ia, ib);
						DOT_NAME(tile_w16_any)(yt, ys, xt, xbs, nt, nr, kw, n, n, 0, 1);
					}
				} else if (w16 && nt == 4 && nr == 4 && n % 64 == 0)
					DOT_NAME(tile44)(yt, ys, xt, xbs, w16, n, tpf);
				else if (w16)
					DOT_NAME(tile_w16_any)(yt, ys, xt, xbs, nt, nr, w16, n, n, tpf, 1);
				else
					DOT_NAME(tile_codes_any)(yt, ys, xt, xbs, nt, nr,
					                         (const uint8_t *)w->data + (size_t)r * (size_t)n, n, n,
					                         &ts, ia, ib, tpf);
				r += nr;
			}
			t += nt;
		}
	}
}

#undef DOT_STEP
#undef DOT_TARGET
#undef DOT_NAME
#undef DOT_VBMI
