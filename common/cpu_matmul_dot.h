/* common/cpu_matmul_dot.h: the AVX512_BF16 tile kernels of cpu_matmul.c,
 * included there twice: DOT_VBMI 0 converts E4M3 codes 32 at a time through
 * 16-bit word permutes; DOT_VBMI 1 (CPUs with AVX512_VBMI) converts 64 at a
 * time with byte permutes (two table lookups, the sign, two interleaves:
 * five instructions for 64 codes instead of fourteen). Both give the same
 * bf16 words and feed the same dot products in the same order, so the two
 * variants agree bit for bit. The includer defines DOT_TARGET (the target
 * attribute), DOT_NAME(f) (the variant's name of f) and DOT_VBMI. */

/* NT tokens x NR rows; CODES and SCALED are constants at every call, so
 * each shape compiles to straight-line code (blk in registers; acc is only
 * touched once per block). */
DOT_TARGET static INL void DOT_NAME(tile_dot)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                             const int nt, const int nr, const int codes, const int scaled,
                             const struct wsrc *ws, int64_t n, const struct e4m3_lut *lut)
{
	__m512 acc[4][4], blk[4][4];
#pragma GCC unroll 4
	for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
		for (int t = 0; t < nt; t++)
			acc[i][t] = _mm512_setzero_ps();
	int64_t bk = scaled ? ws->bk : n;
	const int64_t step = DOT_VBMI && codes ? 64 : 32;
	for (int64_t c0 = 0, b = 0; c0 < n; c0 += bk, b++) {      /* scale blocks */
		int64_t ce = c0 + bk < n ? c0 + bk : n;
#pragma GCC unroll 4
		for (int i = 0; i < nr; i++)
#pragma GCC unroll 4
			for (int t = 0; t < nt; t++)
				blk[i][t] = _mm512_setzero_ps();
		for (int64_t c = c0; c < ce; c += step) {
			int64_t left = ce - c;
#if DOT_VBMI
			if (codes) {    /* 64 codes a row at a time, two chunks of 32 */
				int two = left > 32;
				__mmask32 m0 = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1);
				__mmask32 m1 = left >= 64 ? (__mmask32)0xffffffffu
				               : two ? (__mmask32)((1u << (left - 32)) - 1) : 0;
				__mmask64 m = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
				__m512bh xv0[4], xv1[4];
#pragma GCC unroll 4
				for (int t = 0; t < nt; t++) {
					xv0[t] = (__m512bh)_mm512_maskz_loadu_epi16(m0, xb + t * xbs + c);
					xv1[t] = (__m512bh)_mm512_maskz_loadu_epi16(m1, xb + t * xbs + c + 32);
				}
#pragma GCC unroll 4
				for (int i = 0; i < nr; i++) {
					const uint8_t *wp = (const uint8_t *)ws->p + (size_t)i * (size_t)ws->stride + (size_t)c;
					_mm_prefetch((const char *)(wp + ws->pf), _MM_HINT_T1);
					__m512i w0, w1;
					e4m3x64_bf16(lut, wp, m, &w0, &w1);
#pragma GCC unroll 4
					for (int t = 0; t < nt; t++)
						blk[i][t] = _mm512_dpbf16_ps(blk[i][t], xv0[t], (__m512bh)w0);
					if (two)
#pragma GCC unroll 4
						for (int t = 0; t < nt; t++)
							blk[i][t] = _mm512_dpbf16_ps(blk[i][t], xv1[t], (__m512bh)w1);
				}
				continue;
			}
#endif
			__mmask32 m = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1);
			__m512bh xv[4];
#pragma GCC unroll 4
			for (int t = 0; t < nt; t++)
				xv[t] = (__m512bh)_mm512_maskz_loadu_epi16(m, xb + t * xbs + c);
#pragma GCC unroll 4
			for (int i = 0; i < nr; i++) {
				__m512i wi;
				if (codes) {
					const uint8_t *wp = (const uint8_t *)ws->p + (size_t)i * (size_t)ws->stride + (size_t)c;
					/* the rows of the next tile, same columns: narrow rows
					 * (d_model 576) defeat the hardware prefetcher */
					_mm_prefetch((const char *)(wp + ws->pf), _MM_HINT_T1);
					wi = e4m3x32_bf16(lut, wp, m);
				} else {
					const uint16_t *wp = (const uint16_t *)ws->p + (size_t)i * (size_t)ws->stride + (size_t)c;
					_mm_prefetch((const char *)(wp + ws->pf), _MM_HINT_T1);
					wi = _mm512_maskz_loadu_epi16(m, wp);
				}
#pragma GCC unroll 4
				for (int t = 0; t < nt; t++)
					blk[i][t] = _mm512_dpbf16_ps(blk[i][t], xv[t], (__m512bh)wi);
			}
		}
#pragma GCC unroll 4
		for (int i = 0; i < nr; i++) {
			__m512 s = _mm512_set1_ps(scaled ? ws->srow[i][b] : 1.0f);
#pragma GCC unroll 4
			for (int t = 0; t < nt; t++)
				acc[i][t] = scaled ? _mm512_fmadd_ps(blk[i][t], s, acc[i][t]) : blk[i][t];
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < nt; t++) {
		float *yt = y + t * ys;
		if (nr == 4) {
			__m512 s = reduce4_512(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
			s = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s);
			_mm_storeu_ps(yt, _mm512_castps512_ps128(s));
		} else {
#pragma GCC unroll 4
			for (int i = 0; i < nr; i++)
				yt[i] = _mm512_reduce_add_ps(acc[i][t]);
		}
	}
}

/* The 4x4 tile over bf16 rows (a BF16 matrix, or the copy of an E4M3 row
 * block with its scales) when n and the scale block are multiples of 64:
 * the ops of tile_dot(codes 0) in the same order (two 32-column chunks a
 * step), without masks or branches in the loop. PF: prefetch distance in
 * elements (0: none, the copy is in cache). */
DOT_TARGET static INL void DOT_NAME(tile44)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                           const uint16_t *w, int64_t n, int64_t bk, const float *const srow[4],
                           const int scaled, size_t pf)
{
	__m512 acc[4][4], blk[4][4];
#pragma GCC unroll 4
	for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
		for (int t = 0; t < 4; t++)
			acc[i][t] = _mm512_setzero_ps();
	for (int64_t c0 = 0, b = 0; c0 < n; c0 += bk, b++) {
		int64_t ce = c0 + bk < n ? c0 + bk : n;
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++)
#pragma GCC unroll 4
			for (int t = 0; t < 4; t++)
				blk[i][t] = _mm512_setzero_ps();
		for (int64_t c = c0; c < ce; c += 64) {
			__m512bh x0[4], x1[4];
#pragma GCC unroll 4
			for (int t = 0; t < 4; t++) {
				x0[t] = (__m512bh)_mm512_loadu_si512(xb + t * xbs + c);
				x1[t] = (__m512bh)_mm512_loadu_si512(xb + t * xbs + c + 32);
			}
#pragma GCC unroll 4
			for (int i = 0; i < 4; i++) {
				if (!scaled && pf) {      /* 64 bf16 columns: two lines */
					_mm_prefetch((const char *)(w + i * n + c + pf), _MM_HINT_T1);
					_mm_prefetch((const char *)(w + i * n + c + pf + 32), _MM_HINT_T1);
				}
				__m512bh w0 = (__m512bh)_mm512_loadu_si512(w + i * n + c);
				__m512bh w1 = (__m512bh)_mm512_loadu_si512(w + i * n + c + 32);
#pragma GCC unroll 4
				for (int t = 0; t < 4; t++)
					blk[i][t] = _mm512_dpbf16_ps(blk[i][t], x0[t], w0);
#pragma GCC unroll 4
				for (int t = 0; t < 4; t++)
					blk[i][t] = _mm512_dpbf16_ps(blk[i][t], x1[t], w1);
			}
		}
#pragma GCC unroll 4
		for (int i = 0; i < 4; i++) {
			__m512 s = _mm512_set1_ps(scaled ? srow[i][b] : 1.0f);
#pragma GCC unroll 4
			for (int t = 0; t < 4; t++)
				acc[i][t] = scaled ? _mm512_fmadd_ps(blk[i][t], s, acc[i][t]) : blk[i][t];
		}
	}
#pragma GCC unroll 4
	for (int t = 0; t < 4; t++) {
		__m512 s = reduce4_512(acc[0][t], acc[1][t], acc[2][t], acc[3][t]);
		s = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0), s);
		_mm_storeu_ps(y + t * ys, _mm512_castps512_ps128(s));
	}
}

DOT_TARGET static void DOT_NAME(tile44_copy)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                                const uint16_t *w, int64_t n, int64_t bk, const float *const srow[4])
{
	DOT_NAME(tile44)(y, ys, xb, xbs, w, n, bk, srow, 1, 0);
}

DOT_TARGET static void DOT_NAME(tile44_bf16)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,
                                const uint16_t *w, int64_t n, size_t pf)
{
	DOT_NAME(tile44)(y, ys, xb, xbs, w, n, n, NULL, 0, pf);
}

#define TILE_DOT_KIND(codes, scaled)                                                             \
DOT_TARGET static void DOT_NAME(tile_dot_##codes##scaled)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs,  \
                                         int nt, int nr, const struct wsrc *ws, int64_t n,       \
                                         const struct e4m3_lut *lut)                             \
{                                                                                                \
	if (nt == 4 && nr == 4)                                                                  \
		DOT_NAME(tile_dot)(y, ys, xb, xbs, 4, 4, codes, scaled, ws, n, lut);                       \
	else if (nt == 4)                                                                        \
		DOT_NAME(tile_dot)(y, ys, xb, xbs, 4, 1, codes, scaled, ws, n, lut);                       \
	else if (nr == 4)                                                                        \
		DOT_NAME(tile_dot)(y, ys, xb, xbs, 1, 4, codes, scaled, ws, n, lut);                       \
	else                                                                                     \
		DOT_NAME(tile_dot)(y, ys, xb, xbs, 1, 1, codes, scaled, ws, n, lut);                       \
}
TILE_DOT_KIND(0, 0)       /* BF16 weights */
TILE_DOT_KIND(0, 1)       /* E4M3: the bf16 copy of a row block */
TILE_DOT_KIND(1, 1)       /* E4M3 codes converted in registers */

DOT_TARGET static void DOT_NAME(matmul_dot)(float *y, int64_t ys, const uint16_t *xb, int64_t xbs, int64_t n_tok,
                           const struct llm_weight *w, int64_t r0, int64_t r1)
{
	int64_t n = w->cols;
	int fp8 = w->dtype == LLM_DTYPE_E4M3;
#if DOT_VBMI
	struct e4m3_lut lut = e4m3_lut_load_vbmi();
#else
	struct e4m3_lut lut = e4m3_lut_load();
#endif
	/* E4M3 with more than one token tile: convert a row block once */
	int64_t rbn = RB;
	int copy = 0;
	if (fp8 && n_tok > 4 && n * 4 <= WBUF_ELEMS) {
		copy = 1;
		rbn = WBUF_ELEMS / n / 4 * 4;
		if (rbn > RB)
			rbn = RB;
	}
	_Alignas(64) uint16_t wbuf[WBUF_ELEMS];
	int whole64 = fp8 && n % 64 == 0 && w->block_cols % 64 == 0;
	size_t row_bytes = (size_t)n * (fp8 ? 1 : 2), ahead = (PF_BYTES + row_bytes - 1) / row_bytes;
	size_t pf = (ahead > 4 ? ahead : 4) * (size_t)n;
	/* several token tiles: the next row block is prefetched while this one
	 * is reused from cache (BF16 rows in place, or E4M3 copied to bf16) */
	int spread = copy || (!fp8 && n_tok > 4);
	for (int64_t rb = r0; rb < r1; rb += rbn) {
		int64_t re = rb + rbn < r1 ? rb + rbn : r1;
		/* The next row block (E4M3 codes or BF16 rows) is fetched into L2
		 * while this one is multiplied, a few lines before each tile: a
		 * row block spans several pages and the hardware prefetcher
		 * starts over at each, and prefetches issued in one burst are
		 * partly dropped. Streaming 1536x576 codes with 16 tokens on one
		 * core: 44 GMAC/s without, 53 in a burst while copying, 58 spread
		 * over the tiles with the mask-free tile (about 69 with the codes
		 * in L2). */
		const char *nx = NULL, *ne = NULL;
		size_t per = 0;
		if (spread) {
			int64_t nre = re + rbn < r1 ? re + rbn : r1;
			int64_t tiles = (n_tok / 4 + n_tok % 4) * ((re - rb) / 4 + (re - rb) % 4);
			nx = (const char *)w->data + (size_t)re * row_bytes;
			ne = (const char *)w->data + (size_t)nre * row_bytes;
			per = ne > nx ? ((size_t)(ne - nx) / 64 + (size_t)tiles) / (size_t)tiles * 64 : 0;
		}
		if (copy)
			for (int64_t r = rb; r < re; r++) {
				const uint8_t *src = (const uint8_t *)w->data + (size_t)r * (size_t)n;
				uint16_t *dst = wbuf + (size_t)(r - rb) * (size_t)n;
#if DOT_VBMI
				for (int64_t c = 0; c < n; c += 64) {
					int64_t left = n - c;
					__mmask64 m = left >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << left) - 1);
					__m512i w0, w1;
					e4m3x64_bf16(&lut, src + c, m, &w0, &w1);
					_mm512_mask_storeu_epi16(dst + c, (__mmask32)m, w0);
					_mm512_mask_storeu_epi16(dst + c + 32, (__mmask32)(m >> 32), w1);
				}
#else
				for (int64_t c = 0; c < n; c += 32) {
					int64_t left = n - c;
					__mmask32 m = left >= 32 ? (__mmask32)0xffffffffu : (__mmask32)((1u << left) - 1);
					_mm512_mask_storeu_epi16(dst + c, m, e4m3x32_bf16(&lut, src + c, m));
				}
#endif
			}
		for (int64_t t = 0; t < n_tok; ) {
			int nt = n_tok - t >= 4 ? 4 : 1;
			for (int64_t r = rb; r < re; ) {
				int nr = re - r >= 4 ? 4 : 1;
				struct wsrc ws = { NULL, n, 0, { NULL }, n, spread ? 0 : pf };
				if (copy)
					ws.p = wbuf + (size_t)(r - rb) * (size_t)n;
				else if (fp8)
					ws.p = (const uint8_t *)w->data + (size_t)r * (size_t)n;
				else
					ws.p = (const uint16_t *)w->data + (size_t)r * (size_t)n;
				ws.codes = fp8 && !copy;
				if (fp8) {
					ws.bk = w->block_cols;
					for (int i = 0; i < nr; i++)
						ws.srow[i] = w->scale + ((r + i) / w->block_rows) * w->scale_cols;
				}
				for (size_t q = 0; q < per && nx < ne; q += 64, nx += 64)
					_mm_prefetch(nx, _MM_HINT_T1);
				float *yt = y + t * ys + r;
				const uint16_t *xt = xb + t * xbs;
				if (!fp8 && nt == 4 && nr == 4 && n % 64 == 0)
					DOT_NAME(tile44_bf16)(yt, ys, xt, xbs, (const uint16_t *)ws.p, n, spread ? 0 : pf);
				else if (!fp8)
					DOT_NAME(tile_dot_00)(yt, ys, xt, xbs, nt, nr, &ws, n, &lut);
				else if (copy && nt == 4 && nr == 4 && whole64)
					DOT_NAME(tile44_copy)(yt, ys, xt, xbs, (const uint16_t *)ws.p, n, ws.bk, ws.srow);
				else if (copy)
					DOT_NAME(tile_dot_01)(yt, ys, xt, xbs, nt, nr, &ws, n, &lut);
				else
					DOT_NAME(tile_dot_11)(yt, ys, xt, xbs, nt, nr, &ws, n, &lut);
				r += nr;
			}
			t += nt;
		}
	}
}


#undef DOT_TARGET
#undef DOT_NAME
#undef DOT_VBMI
