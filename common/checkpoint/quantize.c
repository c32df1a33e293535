/* common/checkpoint/quantize.c: checkpoint quantization, dequantization and random
 * checkpoints, streamed one band of rows at a time.
 *
 * Every output tensor is produced in bands of block_rows rows converted to
 * f32 (the input rows, the dequantized rows, or seeded random rows), so the
 * peak memory is one band plus the write buffer, not the model. Scales are
 * amax / 448 per block (E4M3's largest finite value); a zero block stores
 * scale 0 and codes 0 and no division happens. A NaN or Inf input value is
 * an error naming the tensor: no scale written is ever non-finite. */
#define _GNU_SOURCE
#include "quantize.h"
#include "config.h"
#include "fileio.h"
#include "hash.h"

#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <regex.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define E4M3_MAX 448.0f

/* One block: columns [c0, c1) of ROWS rows with stride COLS. NaN inputs are
 * ignored by amax (and encode to NaN); a zero or non-finite amax stores
 * scale 0 and zero codes. */
static void quantize_block_scalar(const float *x, int64_t rows, int64_t cols, int64_t c0, int64_t c1,
                                  uint8_t *codes, float *scale_out)
{
	float amax = 0;
	for (int64_t r = 0; r < rows; r++)
		for (int64_t c = c0; c < c1; c++) {
			float a = fabsf(x[r * cols + c]);
			amax = a > amax ? a : amax;
		}
	float scale = amax / E4M3_MAX;
	if (scale == 0 || !isfinite(scale)) {
		*scale_out = 0;
		for (int64_t r = 0; r < rows; r++)
			memset(codes + r * cols + c0, 0, (size_t)(c1 - c0));
		return;
	}
	*scale_out = scale;
	for (int64_t r = 0; r < rows; r++)
		for (int64_t c = c0; c < c1; c++)
			codes[r * cols + c] = llm_f32_to_e4m3(x[r * cols + c] / scale);
}

#if defined(__x86_64__)
#include <immintrin.h>
/* The same block with AVX-512: amax by vector max (NaN lanes lose, as in the
 * scalar loop), then x / scale encoded by the bit operations of
 * llm_f32_to_e4m3 on 16 lanes at once. Bit-identical to the scalar path. */
__attribute__((target("avx512f,avx512bw,avx512vl")))
static void quantize_block_avx512(const float *x, int64_t rows, int64_t cols, int64_t c0, int64_t c1,
                                  uint8_t *codes, float *scale_out)
{
	__m512 vmax = _mm512_setzero_ps();
	for (int64_t r = 0; r < rows; r++)
		for (int64_t c = c0; c < c1; c += 16) {
			__mmask16 m = c1 - c >= 16 ? 0xffff : (__mmask16)((1u << (c1 - c)) - 1);
			__m512 v = _mm512_abs_ps(_mm512_maskz_loadu_ps(m, x + r * cols + c));
			vmax = _mm512_max_ps(v, vmax);      /* NaN in v: keeps vmax */
		}
	float amax = _mm512_reduce_max_ps(vmax);
	float scale = amax / E4M3_MAX;
	if (scale == 0 || !isfinite(scale)) {
		*scale_out = 0;
		for (int64_t r = 0; r < rows; r++)
			memset(codes + r * cols + c0, 0, (size_t)(c1 - c0));
		return;
	}
	*scale_out = scale;
	const __m512 vs = _mm512_set1_ps(scale);
	const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff), one = _mm512_set1_epi32(1);
	const __m512i rnd = _mm512_set1_epi32(0x7ffff), rebias = _mm512_set1_epi32(120 << 3);
	const __m512i maxc = _mm512_set1_epi32(0x7e), nanc = _mm512_set1_epi32(0x7f);
	for (int64_t r = 0; r < rows; r++)
		for (int64_t c = c0; c < c1; c += 16) {
			__mmask16 m = c1 - c >= 16 ? 0xffff : (__mmask16)((1u << (c1 - c)) - 1);
			__m512 q = _mm512_div_ps(_mm512_maskz_loadu_ps(m, x + r * cols + c), vs);
			__m512i u = _mm512_castps_si512(q);
			__m512i sign = _mm512_and_si512(_mm512_srli_epi32(u, 24), _mm512_set1_epi32(0x80));
			__m512i a = _mm512_and_si512(u, abs_mask);
			/* normal: round the mantissa to 3 bits, ties to even */
			__m512i n = _mm512_add_epi32(a, _mm512_add_epi32(rnd, _mm512_and_si512(_mm512_srli_epi32(a, 20), one)));
			n = _mm512_min_epi32(_mm512_sub_epi32(_mm512_srli_epi32(n, 20), rebias), maxc);
			/* subnormal: the integer a * 2^9, rounded by the 2^23 trick */
			__m512 t = _mm512_add_ps(_mm512_mul_ps(_mm512_castsi512_ps(a), _mm512_set1_ps(512.0f)),
			                         _mm512_set1_ps(8388608.0f));
			__m512i sub = _mm512_sub_epi32(_mm512_castps_si512(t), _mm512_set1_epi32(0x4b000000));
			__m512i code = _mm512_mask_blend_epi32(_mm512_cmplt_epu32_mask(a, _mm512_set1_epi32(0x3c800000)), n, sub);
			code = _mm512_mask_mov_epi32(code, _mm512_cmpge_epu32_mask(a, _mm512_set1_epi32(0x43e00000)), maxc);
			code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(a, _mm512_set1_epi32(0x7f800000)), nanc);
			_mm512_mask_cvtepi32_storeu_epi8(codes + r * cols + c, m, _mm512_or_si512(code, sign));
		}
}
#endif

typedef void (*quant_block_fn)(const float *, int64_t, int64_t, int64_t, int64_t, uint8_t *, float *);

/* The fastest block quantizer this CPU runs; LLM_FORCE_SCALAR=1 picks the
 * reference (the tests compare the two). */
static quant_block_fn quant_block(void)
{
	static quant_block_fn fn;
	if (!fn) {
		const char *e = getenv("LLM_FORCE_SCALAR");
		fn = quantize_block_scalar;
#if defined(__x86_64__)
		if (!(e && *e == '1') && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
		    __builtin_cpu_supports("avx512vl"))
			fn = quantize_block_avx512;
#else
		(void)e;
#endif
	}
	return fn;
}

void llm_quantize_band(const float *x, int64_t rows, int64_t cols, int64_t block_cols,
                       uint8_t *codes, float *scales)
{
	quant_block_fn fn = quant_block();
	int64_t nb = (cols + block_cols - 1) / block_cols;
	for (int64_t b = 0; b < nb; b++) {
		int64_t c0 = b * block_cols, c1 = c0 + block_cols < cols ? c0 + block_cols : cols;
		fn(x, rows, cols, c0, c1, codes, &scales[b]);
	}
}

/* ---- sources: where the f32 rows come from ----------------------------- */

struct source {
	struct llm_ckpt *ck;        /* file source; NULL for random */
	uint64_t seed;
	float norm;                 /* random: the norm weights' value (1; 0 where the
	                               family stores them as w of 1 + w) */
};

static int is_norm(const char *name)
{
	size_t n = strlen(name);
	return n >= 11 && !strcmp(name + n - 11, "norm.weight");
}

/* Random rows: uniform with standard deviation 0.02 (norm weights NORM: a
 * scale of 1), from a stream that depends only on (seed, tensor name, row). */
static void random_rows(uint64_t seed, float norm, const struct llm_tensor *t, int64_t r0, int64_t r1,
                        int64_t cols, float *dst)
{
	if (is_norm(t->name)) {
		for (int64_t i = 0; i < (r1 - r0) * cols; i++)
			dst[i] = norm;
		return;
	}
	const float a = 0.02f * 1.7320508f;           /* sqrt(3) * std */
	/* FNV-1a of the name from 1469598103934665603, the offset basis short of
	 * its last digit: random checkpoints are pinned by it */
	uint64_t th = llm_hash_fnv1a(1469598103934665603ull, t->name, strlen(t->name)) ^ seed * 0x2545f4914f6cdd1dull;
	for (int64_t r = r0; r < r1; r++) {
		uint64_t s = th + (uint64_t)r * LLM_SPLITMIX_GAMMA;
		uint64_t x = llm_rng_splitmix64(&s) | 1;
		float *d = dst + (r - r0) * cols;
		for (int64_t c = 0; c < cols; c++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;          /* xorshift64 */
			d[c] = ((float)(x >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f) * a;
		}
	}
}

/* Rows [r0, r1) of input tensor T (or weight W when it is E4M3) as f32. */
static void source_rows(const struct source *src, const struct llm_tensor *t, const struct llm_weight *w,
                        int64_t r0, int64_t r1, int64_t cols, float *dst)
{
	if (!src->ck) {
		random_rows(src->seed, src->norm, t, r0, r1, cols, dst);
		return;
	}
	size_t es = llm_dtype_size(t->dtype);
	const uint8_t *base = (const uint8_t *)t->data + (size_t)(r0 * cols) * es;
	if (t->dtype != LLM_DTYPE_E4M3) {
		llm_to_f32(dst, base, t->dtype, (size_t)((r1 - r0) * cols));
		return;
	}
	for (int64_t r = r0; r < r1; r++) {
		const uint8_t *code = (const uint8_t *)w->data + r * cols;
		const float *sc = w->scale + (r / w->block_rows) * w->scale_cols;
		float *d = dst + (r - r0) * cols;
		for (int64_t c0 = 0; c0 < cols; c0 += w->block_cols) {
			int64_t c1 = c0 + w->block_cols < cols ? c0 + w->block_cols : cols;
			float s = sc[c0 / w->block_cols];
			for (int64_t c = c0; c < c1; c++)
				d[c] = llm_e4m3_table[code[c]] * s;
		}
	}
}

/* ---- the plan: one entry per output tensor ----------------------------- */

enum action { A_COPY, A_QUANT, A_SCALE, A_CONVERT };

struct item {
	enum action act;
	int64_t bn, bk;                /* A_QUANT: block rows, cols (0: K) */
	const struct llm_tensor *in;   /* input tensor (desc only for random) */
	struct llm_weight w;           /* E4M3 input being dequantized */
	struct llm_tensor out;         /* output descriptor */
};

struct job {
	const struct llm_quant_opts *o;
	struct source src;
	struct item *items;
	size_t n;
	int64_t bn, bk;                /* effective block rows, cols (0: K) */
	int ct;                        /* per channel (bk 0): the compressed-tensors layout */
	json_t *skip;                  /* linear modules left plain (modules_to_not_convert) */
	json_t *ours;                  /* modules in FP8 that the peers keep plain */
	struct llm_ckpt_writer *w;
	float *band;                   /* bn x max_cols f32 */
	uint8_t *codes, *conv;
	float *scales;                 /* all scales of the current weight */
	size_t max_cols;
	int nth;                       /* threads per band */
};

/* A band is filled (rows split across threads), then quantized (column
 * blocks split) or converted (rows split). Each thread owns disjoint
 * outputs, so the result does not depend on the number of threads. */
enum band_phase { FILL, QUANT, CONVERT };

struct band_work {
	struct job *j;
	struct item *it;
	int64_t r0, r1, cols, bk, nbk;
	float *sc;                  /* the band's scales */
	enum band_phase phase;
};

struct band_arg {
	struct band_work *w;
	int tid;
};

static void *band_thread(void *p)
{
	struct band_arg *a = p;
	struct band_work *w = a->w;
	struct job *j = w->j;
	int64_t n = w->r1 - w->r0, per = (n + j->nth - 1) / j->nth;
	int64_t s = a->tid * per, e = s + per < n ? s + per : n;
	switch (w->phase) {
	case FILL:
		if (s < e)
			source_rows(&j->src, w->it->in, &w->it->w, w->r0 + s, w->r0 + e, w->cols, j->band + s * w->cols);
		break;
	case QUANT: {
		quant_block_fn fn = quant_block();
		for (int64_t b = a->tid; b < w->nbk; b += j->nth) {
			int64_t c0 = b * w->bk, c1 = c0 + w->bk < w->cols ? c0 + w->bk : w->cols;
			fn(j->band, n, w->cols, c0, c1, j->codes, &w->sc[b]);
		}
		break;
	}
	case CONVERT:
		if (s < e)
			llm_from_f32(j->conv + (size_t)(s * w->cols) * llm_dtype_size(w->it->out.dtype), w->it->out.dtype,
			             j->band + s * w->cols, (size_t)((e - s) * w->cols));
		break;
	}
	return NULL;
}

static void band_run(struct band_work *w, enum band_phase phase)
{
	pthread_t th[16];
	struct band_arg args[16];
	int started[16] = { 0 };
	w->phase = phase;
	for (int t = 0; t < w->j->nth; t++)
		args[t] = (struct band_arg){ w, t };
	for (int t = 1; t < w->j->nth; t++)
		started[t] = pthread_create(&th[t], NULL, band_thread, &args[t]) == 0;
	band_thread(&args[0]);
	for (int t = 1; t < w->j->nth; t++) {
		if (started[t])
			pthread_join(th[t], NULL);
		else
			band_thread(&args[t]);     /* no thread: do its share here */
	}
}

static enum llm_status write_quant(struct job *j, struct item *it)
{
	int64_t rows = it->out.shape[0], cols = it->out.shape[1];
	int64_t bn = it->bn, bk = it->bk ? it->bk : cols, nbk = (cols + bk - 1) / bk;
	double err2 = 0, ref2 = 0, maxabs = 0;
	for (int64_t r0 = 0; r0 < rows; r0 += bn) {
		int64_t r1 = r0 + bn < rows ? r0 + bn : rows;
		float *sc = j->scales + (r0 / bn) * nbk;
		struct band_work bw = { j, it, r0, r1, cols, bk, nbk, sc, FILL };
		band_run(&bw, FILL);
		/* a NaN or Inf input has no finite scale (its block would be stored
		 * as zeros, or as a NaN code): refused, naming where it is */
		int64_t bad = llm_first_nonfinite(j->band, LLM_DTYPE_F32, (size_t)((r1 - r0) * cols));
		if (bad >= 0) {
			float v = j->band[bad];
			return llm_fail(LLM_ERR_RANGE, "%s: tensor '%s': %s at row %lld, column %lld: no finite FP8 scale "
			                "for its block", j->src.ck ? j->src.ck->path : "random", it->in->name,
			                v != v ? "NaN" : v > 0 ? "+Inf" : "-Inf", (long long)(r0 + bad / cols),
			                (long long)(bad % cols));
		}
		band_run(&bw, QUANT);
		if (j->o->stats)
			for (int64_t r = 0; r < r1 - r0; r++)
				for (int64_t c = 0; c < cols; c++) {
					double x = j->band[r * cols + c];
					double q = llm_e4m3_table[j->codes[r * cols + c]] * sc[c / bk];
					double d = fabs(x - q);
					err2 += d * d;
					ref2 += x * x;
					maxabs = d > maxabs ? d : maxabs;
				}
		LLM_TRY(llm_ckpt_write_data(j->w, j->codes, (size_t)((r1 - r0) * cols)));
	}
	if (j->o->stats) {
		double rel = ref2 > 0 ? sqrt(err2 / ref2) : 0;
		if (j->o->stats == 2)
			printf("{\"tensor\":\"%s\",\"shape\":[%lld,%lld],\"block\":[%lld,%lld],\"rel_rms_error\":%.6g,\"max_abs_error\":%.6g}\n",
			       it->out.name, (long long)rows, (long long)cols, (long long)bn, (long long)bk, rel, maxabs);
		else {
			llm_progress_clear(j->o->write.progress);    /* the table line goes above the bar */
			fprintf(stderr, "%-56s %6lldx%-6lld rel_rms %.3e  max_abs %.3e\n", it->out.name,
			        (long long)rows, (long long)cols, rel, maxabs);
		}
	}
	return LLM_OK;
}

static enum llm_status write_convert(struct job *j, struct item *it)
{
	int64_t rows = it->out.n_dim == 2 ? it->out.shape[0] : 1;
	int64_t cols = it->out.n_dim >= 1 ? it->out.shape[it->out.n_dim - 1] : 1;
	if (it->out.n_dim > 2)
		rows = llm_tensor_numel(&it->out) / cols;
	size_t es = llm_dtype_size(it->out.dtype);
	int64_t step = j->bn;
	for (int64_t r0 = 0; r0 < rows; r0 += step) {
		int64_t r1 = r0 + step < rows ? r0 + step : rows;
		struct band_work bw = { j, it, r0, r1, cols, 0, 0, NULL, FILL };
		band_run(&bw, FILL);
		band_run(&bw, CONVERT);
		LLM_TRY(llm_ckpt_write_data(j->w, j->conv, (size_t)((r1 - r0) * cols) * es));
	}
	return LLM_OK;
}

static enum llm_status run_job(struct job *j, const char *out, const struct llm_aux *aux, size_t n_aux)
{
	enum llm_status s;
	struct llm_tensor *descs = calloc(j->n + 1, sizeof *descs);
	if (!descs)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	size_t max_cols = 1, max_scales = 1;
	for (size_t i = 0; i < j->n; i++) {
		descs[i] = j->items[i].out;
		const struct llm_tensor *t = &j->items[i].out;
		size_t c = t->n_dim ? (size_t)t->shape[t->n_dim - 1] : 1;
		max_cols = c > max_cols ? c : max_cols;
		if (j->items[i].act == A_SCALE)
			max_scales = (size_t)llm_tensor_numel(t) > max_scales ? (size_t)llm_tensor_numel(t) : max_scales;
	}
	j->max_cols = max_cols;
	size_t band = (size_t)j->bn * max_cols;
	j->band = malloc(band * sizeof(float));
	j->codes = malloc(band);
	j->conv = malloc(band * 4);
	j->scales = malloc(max_scales * sizeof(float));
	if (!j->band || !j->codes || !j->conv || !j->scales) {
		free(descs);
		return llm_fail(LLM_ERR_NOMEM, "out of memory for a band of %lld x %zu", (long long)j->bn, max_cols);
	}
	s = llm_ckpt_write_begin(&j->w, out, descs, j->n, aux, n_aux, &j->o->write);
	free(descs);
	if (s)
		return s;
	long nc = sysconf(_SC_NPROCESSORS_ONLN);
	j->nth = j->o->threads > 0 ? j->o->threads : nc > 0 ? (int)nc : 1;
	j->nth = j->nth > 16 ? 16 : j->nth;
	long i;
	while (!s && (i = llm_ckpt_write_next(j->w)) >= 0) {
		struct item *it = &j->items[i];
		switch (it->act) {
		case A_COPY: {
			const uint8_t *p = it->in->data;
			for (size_t off = 0; !s && off < it->in->nbytes; off += 64u << 20) {
				size_t k = it->in->nbytes - off < (64u << 20) ? it->in->nbytes - off : (64u << 20);
				s = llm_ckpt_write_data(j->w, p + off, k);
			}
			break;
		}
		case A_QUANT: s = write_quant(j, it); break;
		case A_SCALE: s = llm_ckpt_write_data(j->w, j->scales, it->out.nbytes); break;
		case A_CONVERT: s = write_convert(j, it); break;
		}
		if (j->src.ck && it->in && it->act != A_SCALE)
			llm_ckpt_release(j->src.ck, it->in);   /* keep the resident set small */
	}
	if (s) {
		llm_ckpt_write_abort(j->w);
		j->w = NULL;
		return s;
	}
	s = llm_ckpt_write_commit(j->w);
	j->w = NULL;
	return s;
}

static void job_free(struct job *j)
{
	json_decref(j->skip);
	json_decref(j->ours);
	for (size_t i = 0; i < j->n; i++)
		free(j->items[i].out.name);
	free(j->items);
	free(j->band);
	free(j->codes);
	free(j->conv);
	free(j->scales);
}

static enum llm_status add_item(struct job *j, enum action act, const struct llm_tensor *in,
                                const char *name, const char *suffix, enum llm_dtype dt,
                                int n_dim, const int64_t *shape)
{
	struct item *it = &j->items[j->n];
	memset(it, 0, sizeof *it);
	it->act = act;
	it->in = in;
	size_t len = strlen(name) + (suffix ? strlen(suffix) : 0) + 1;
	it->out.name = malloc(len);
	if (!it->out.name)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	snprintf(it->out.name, len, "%s%s", name, suffix ? suffix : "");
	it->out.dtype = dt;
	it->out.n_dim = n_dim;
	memcpy(it->out.shape, shape, sizeof(int64_t) * (size_t)n_dim);
	it->out.nbytes = (size_t)llm_tensor_numel(&it->out) * llm_dtype_size(dt);
	j->n++;
	return LLM_OK;
}

/* The embedding and lm_head are split by vocabulary rows at any row
 * (llm-checkpoint(5): [floor(t V / T), floor((t+1) V / T))), so they take
 * one scale per row, which every split keeps whole; a block of rows would
 * not divide most vocabularies by 4 or 8 ranks (128256 / 4 / 128 = 250.5). */
static int per_row_tensor(const char *name)
{
	return !strcmp(name, "model.embed_tokens.weight") || !strcmp(name, "lm_head.weight");
}

/* The module of weight NAME ("lm_head" of "lm_head.weight") appended to
 * the JSON array A, once. */
static void add_module(json_t *a, const char *name)
{
	size_t n = strlen(name);
	if (n > 7 && !strcmp(name + n - 7, ".weight"))
		n -= 7;
	size_t i;
	json_t *v;
	json_array_foreach(a, i, v)
		if (strlen(json_string_value(v)) == n && !strncmp(json_string_value(v), name, n))
			return;
	json_array_append_new(a, json_stringn(name, n));
}

/* Which tensors are quantized: INC (the default: the decoder linears, the
 * peers' set) or, with fp8_vocab, the embedding and lm_head, and never EXC.
 * PEER matches the linear weights the peers quantize (the decoder linears
 * and lm_head, which their fp8 loaders keep plain unless told). */
struct select {
	regex_t inc, exc, vocab, peer;
	int have_exc, fp8_vocab, n_re;
};

static enum llm_status compile_re(regex_t *re, const char *pat, const char *flag);

static enum llm_status select_init(struct select *sel, const struct llm_quant_opts *o)
{
	memset(sel, 0, sizeof *sel);
	sel->fp8_vocab = o->fp8_vocab;
	LLM_TRY(compile_re(&sel->inc, o->include ? o->include : LLM_QUANT_DEFAULT_INCLUDE, "--include"));
	sel->n_re = 1;
	LLM_TRY(compile_re(&sel->vocab, LLM_QUANT_VOCAB_INCLUDE, "vocabulary"));
	sel->n_re = 2;
	LLM_TRY(compile_re(&sel->peer, LLM_QUANT_DEFAULT_INCLUDE "|^lm_head\\.weight$|" LLM_QUANT_ROUTER, "peer"));
	sel->n_re = 3;
	if (o->exclude) {
		LLM_TRY(compile_re(&sel->exc, o->exclude, "--exclude"));
		sel->have_exc = 1;
	}
	return LLM_OK;
}

static void select_free(struct select *sel)
{
	regex_t *re[3] = { &sel->inc, &sel->vocab, &sel->peer };
	for (int i = 0; i < sel->n_re; i++)
		regfree(re[i]);
	if (sel->have_exc)
		regfree(&sel->exc);
	sel->n_re = sel->have_exc = 0;
}

static int select_want(const struct select *sel, const char *name)
{
	int in = regexec(&sel->inc, name, 0, NULL, 0) == 0 ||
	         (sel->fp8_vocab && regexec(&sel->vocab, name, 0, NULL, 0) == 0);
	return in && !(sel->have_exc && regexec(&sel->exc, name, 0, NULL, 0) == 0);
}

/* Note what the output's quantization_config says of tensor NAME: a linear
 * weight of the peers' set left plain goes to modules_to_not_convert, an
 * embedding or lm_head in FP8 to llm_tools_fp8_vocab (a tied embedding in
 * FP8 is the lm_head too). */
static void note_module(struct job *j, const struct select *sel, const char *name, int quantized, int tied)
{
	int vocab = regexec(&sel->vocab, name, 0, NULL, 0) == 0;
	if (quantized && vocab) {
		add_module(j->ours, name);
		if (tied)
			add_module(j->ours, "lm_head.weight");
	} else if (!quantized && regexec(&sel->peer, name, 0, NULL, 0) == 0) {
		add_module(j->skip, name);
	}
}

/* A quantized weight: the codes, then its scales (computed while the codes
 * are written, so they follow them in the file). */
static enum llm_status add_quant(struct job *j, const struct llm_tensor *in)
{
	int row = per_row_tensor(in->name);
	int64_t bn = row ? 1 : j->bn, bk0 = row ? 0 : j->bk;
	int64_t rows = in->shape[0], cols = in->shape[1], bk = bk0 ? bk0 : cols;
	int64_t sshape[2] = { (rows + bn - 1) / bn, (cols + bk - 1) / bk };
	LLM_TRY(add_item(j, A_QUANT, in, in->name, NULL, LLM_DTYPE_E4M3, 2, in->shape));
	j->items[j->n - 1].bn = bn;
	j->items[j->n - 1].bk = bk0;
	return add_item(j, A_SCALE, in, in->name, j->ct ? "_scale" : "_scale_inv", LLM_DTYPE_F32, 2, sshape);
}

/* quantization_config as the peers' loaders read it (llm-checkpoint(5)).
 * Blocks: transformers' and vLLM's "fp8" method, weight_block_size [bn, bk]
 * and "<name>.weight_scale_inv"; per channel (bk 0): the compressed-tensors
 * layout of llm-compressor's FP8_DYNAMIC scheme, a (d_out, 1)
 * "<name>.weight_scale" with strategy "channel" and dynamic per-token
 * activations. Both list the linear modules left plain (lm_head), and
 * "llm_tools_fp8_vocab" the embedding and lm_head when they are FP8. */
static json_t *quant_config(const struct job *j)
{
	json_t *q;
	if (j->ct) {
		json_t *w = json_pack("{s:i, s:s, s:b, s:s, s:b, s:n, s:n, s:n, s:s, s:{}}", "num_bits", 8,
		                      "type", "float", "symmetric", 1, "strategy", "channel", "dynamic", 0,
		                      "group_size", "block_structure", "actorder", "observer", "minmax",
		                      "observer_kwargs");
		json_t *in = json_pack("{s:i, s:s, s:b, s:s, s:b, s:n, s:n, s:n, s:n, s:{}}", "num_bits", 8,
		                       "type", "float", "symmetric", 1, "strategy", "token", "dynamic", 1,
		                       "group_size", "block_structure", "actorder", "observer", "observer_kwargs");
		q = json_pack("{s:s, s:s, s:s, s:{s:{s:[s], s:o, s:o, s:n}}, s:O, s:n}",
		              "quant_method", "compressed-tensors", "format", "float-quantized",
		              "quantization_status", "compressed", "config_groups", "group_0", "targets", "Linear",
		              "weights", w, "input_activations", in, "output_activations", "ignore", j->skip,
		              "kv_cache_scheme");
	} else {
		q = json_pack("{s:s, s:s, s:s, s:[I, I], s:O}", "quant_method", "fp8", "fmt", "e4m3",
		              "activation_scheme", "dynamic", "weight_block_size", (json_int_t)j->bn,
		              (json_int_t)j->bk, "modules_to_not_convert", j->skip);
	}
	if (q && json_array_size(j->ours))
		json_object_set(q, "llm_tools_fp8_vocab", j->ours);
	return q;
}

/* config.json with quantization_config added (J given) or removed. */
static enum llm_status edit_config(const struct llm_aux *a, const struct job *j,
                                   const char *torch_dtype, struct llm_aux *outa)
{
	json_error_t err;
	json_t *root = json_loadb(a->data, a->len, 0, &err);
	if (!json_is_object(root)) {
		json_decref(root);
		return llm_fail(LLM_ERR_FORMAT, "config.json: %s", root ? "not a JSON object" : err.text);
	}
	if (j) {
		json_t *q = quant_config(j);
		if (!q) {
			json_decref(root);
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		}
		json_object_set_new(root, "quantization_config", q);
	} else {
		json_object_del(root, "quantization_config");
	}
	if (torch_dtype)
		json_object_set_new(root, "torch_dtype", json_string(torch_dtype));
	char *js = json_dumps(root, JSON_INDENT(2));
	json_decref(root);
	if (!js)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	size_t n = strlen(js);
	outa->name = llm_strdup("config.json");
	outa->data = realloc(js, n + 2);
	outa->data[n] = '\n';
	outa->data[n + 1] = 0;
	outa->len = n + 1;
	return LLM_OK;
}

static const char *torch_name(enum llm_dtype t)
{
	return t == LLM_DTYPE_F32 ? "float32" : t == LLM_DTYPE_F16 ? "float16" : "bfloat16";
}

static enum llm_status compile_re(regex_t *re, const char *pat, const char *flag)
{
	int rc = regcomp(re, pat, REG_EXTENDED | REG_NOSUB);
	if (rc) {
		char msg[256];
		regerror(rc, re, msg, sizeof msg);
		return llm_fail(LLM_ERR_USAGE, "%s '%s': %s", flag, pat, msg);
	}
	return LLM_OK;
}

static enum llm_status check_block(const struct llm_quant_opts *o, struct job *j)
{
	/* block_rows 0: 128, or 1 for a whole row (bk 0: per channel); when
	 * dequantizing, bn is only the band of rows converted at a time */
	j->bn = o->block_rows > 0 ? o->block_rows : o->block_cols == 0 && !o->dequantize ? 1 : 128;
	j->bk = o->block_cols;          /* 0: per channel (whole row) */
	if (j->bk < 0)
		return llm_fail(LLM_ERR_USAGE, "--block: columns must be positive");
	if (j->bk == 0 && j->bn != 1 && !o->dequantize)
		return llm_fail(LLM_ERR_USAGE, "--block: a block of whole rows (K) is one row high (1xK)");
	j->ct = j->bk == 0;
	j->skip = json_array();
	j->ours = json_array();
	if (!j->skip || !j->ours)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	return LLM_OK;
}

enum llm_status llm_quantize(const char *in, const char *out, const struct llm_quant_opts *o)
{
	struct llm_ckpt ck;
	struct job j = { .o = o };
	struct select sel;
	struct llm_aux *aux = NULL;
	size_t n_aux = 0;
	enum llm_status s = check_block(o, &j);
	if (!s && strcmp(out, "-") && llm_exists(out) && !o->write.force)
		s = llm_fail(LLM_ERR_EXISTS, "%s: exists (use --force to replace it)", out);
	if (s) {
		job_free(&j);
		return s;
	}
	s = select_init(&sel, o);
	if (!s)
		s = llm_ckpt_open(&ck, in);
	if (s)
		goto out_re;
	j.src.ck = &ck;
	if (o->write.progress)
		for (size_t f = 0; f < ck.n_file; f++)
			for (size_t i = 0; i < ck.files[f].n_tensor; i++) {
				o->write.progress->bytes_in += ck.files[f].tensors[i].nbytes;
				o->write.progress->items_in++;
			}
	int fp8 = llm_ckpt_is_fp8(&ck);
	if (fp8 && !o->dequantize) {
		s = llm_fail(LLM_ERR_USAGE, "%s: already quantized (it has F8_E4M3 tensors); use --dequantize", in);
		goto out;
	}
	if (!fp8 && o->dequantize) {
		s = llm_fail(LLM_ERR_USAGE, "%s: not quantized (no F8_E4M3 tensors): nothing to dequantize", in);
		goto out;
	}
	j.items = calloc(2 * ck.n_tensor + 1, sizeof *j.items);
	if (!j.items) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	/* output in the input's file order, so a round trip keeps it */
	for (size_t f = 0; !s && f < ck.n_file; f++)
		for (size_t i = 0; !s && i < ck.files[f].n_tensor; i++) {
			const struct llm_tensor *t = &ck.files[f].tensors[i];
			size_t nl = strlen(t->name);
			if (o->dequantize) {
				if ((nl > 10 && !strcmp(t->name + nl - 10, "_scale_inv")) ||
				    (nl > 6 && !strcmp(t->name + nl - 6, "_scale") && t->dtype != LLM_DTYPE_E4M3))
					continue;                   /* folded into its weight */
				if (t->dtype == LLM_DTYPE_E4M3) {
					struct item *it = &j.items[j.n];
					s = add_item(&j, A_CONVERT, t, t->name, NULL, o->out_dtype, t->n_dim, t->shape);
					if (!s)
						s = llm_ckpt_weight(&ck, t->name, &it->w);
					continue;
				}
				s = add_item(&j, A_COPY, t, t->name, NULL, t->dtype, t->n_dim, t->shape);
				continue;
			}
			int floaty = t->dtype == LLM_DTYPE_F32 || t->dtype == LLM_DTYPE_F16 || t->dtype == LLM_DTYPE_BF16;
			int q = select_want(&sel, t->name) && floaty && t->n_dim == 2 && t->shape[0] > 0 && t->shape[1] > 0;
			note_module(&j, &sel, t->name, q, !llm_ckpt_find(&ck, "lm_head.weight"));
			if (q)
				s = add_quant(&j, t);
			else
				s = add_item(&j, A_COPY, t, t->name, NULL, t->dtype, t->n_dim, t->shape);
		}
	if (s)
		goto out;
	/* a tied lm_head (no tensor of its own) is the embedding */
	if (!o->dequantize && !llm_ckpt_find(&ck, "lm_head.weight") && !json_array_size(j.ours))
		add_module(j.skip, "lm_head.weight");
	/* side files: config.json edited, the rest carried unchanged */
	aux = calloc(ck.n_aux + 1, sizeof *aux);
	if (!aux) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; !s && i < ck.n_aux; i++) {
		if (!strcmp(ck.aux[i].name, "config.json")) {
			s = edit_config(&ck.aux[i], o->dequantize ? NULL : &j,
			                o->dequantize ? torch_name(o->out_dtype) : NULL, &aux[n_aux]);
			if (s)
				s = llm_fail_prefix(s, "%s", in);
			n_aux++;
		} else {
			aux[n_aux].name = llm_strdup(ck.aux[i].name);
			aux[n_aux].data = malloc(ck.aux[i].len + 1);
			if (aux[n_aux].data)
				memcpy(aux[n_aux].data, ck.aux[i].data, ck.aux[i].len + 1);
			aux[n_aux].len = ck.aux[i].len;
			n_aux++;
		}
	}
	if (!s)
		s = run_job(&j, out, aux, n_aux);
out:
	for (size_t i = 0; i < n_aux; i++) {
		free(aux[i].name);
		free(aux[i].data);
	}
	free(aux);
	llm_ckpt_close(&ck);
out_re:
	job_free(&j);
	select_free(&sel);
	return s;
}

static int64_t cfg_int(json_t *root, const char *key, int64_t def, enum llm_status *s, const char *path)
{
	json_t *v = json_object_get(root, key);
	if (!v || json_is_null(v)) {
		if (def < 0 && !*s)
			*s = llm_fail(LLM_ERR_FORMAT, "%s: missing field %s", path, key);
		return def;
	}
	if (!json_is_integer(v) || json_integer_value(v) <= 0) {
		if (!*s)
			*s = llm_fail(LLM_ERR_FORMAT, "%s: field %s is not a positive integer", path, key);
		return 1;
	}
	return json_integer_value(v);
}

enum llm_status llm_quantize_random(const char *config, const char *out, const struct llm_quant_opts *o)
{
	struct job j = { .o = o };
	struct llm_aux cfg = { 0 };
	enum llm_status s = check_block(o, &j);
	if (!s && strcmp(out, "-") && llm_exists(out) && !o->write.force)
		s = llm_fail(LLM_ERR_EXISTS, "%s: exists (use --force to replace it)", out);
	if (!s)
		s = llm_read_file(config, &cfg.data, &cfg.len);
	if (s) {
		job_free(&j);
		return s;
	}
	json_error_t err;
	json_t *root = json_loadb(cfg.data, cfg.len, 0, &err);
	struct llm_aux aux[16] = { { 0 } };
	size_t n_aux = 0;
	struct llm_tensor *descs = NULL;
	if (!json_is_object(root)) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: %s", config, root ? "not a JSON object" : err.text);
		goto out;
	}
	int64_t d = cfg_int(root, "hidden_size", -1, &s, config);
	int64_t ff = cfg_int(root, "intermediate_size", -1, &s, config);
	int64_t nl = cfg_int(root, "num_hidden_layers", -1, &s, config);
	int64_t nh = cfg_int(root, "num_attention_heads", -1, &s, config);
	int64_t nkv = cfg_int(root, "num_key_value_heads", nh, &s, config);
	int64_t nv = cfg_int(root, "vocab_size", -1, &s, config);
	int64_t dh = cfg_int(root, "head_dim", s ? 1 : d / nh, &s, config);
	/* what the engine would refuse, refused with its line; the family's tensors */
	struct llm_config lc;
	if (!s)
		s = llm_config_parse(&lc, cfg.data, cfg.len, config);
	if (s)
		goto out;
	const struct llm_family *fam = lc.fam;
	int tied = lc.tied;
	int64_t ne = lc.moe.n_expert, ffe = lc.moe.d_ff_expert;
	size_t nt = 3 + (16 + 1 + 3 * (size_t)ne) * (size_t)nl;
	descs = calloc(nt + 1, sizeof *descs);     /* NULL name ends the list */
	j.items = calloc(2 * nt, sizeof *j.items);
	if (!descs || !j.items) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	int fp8 = o->out_dtype == LLM_DTYPE_E4M3;
	enum llm_dtype plain = fp8 ? LLM_DTYPE_BF16 : o->out_dtype;
	size_t k = 0;
	char name[256];
#define DESC(nm, r, c) do { descs[k].name = llm_strdup(nm); descs[k].dtype = plain;            \
		descs[k].n_dim = (c) ? 2 : 1; descs[k].shape[0] = (r); descs[k].shape[1] = (c); k++; } while (0)
	DESC("model.embed_tokens.weight", nv, d);
	static const char *lin[7] = { "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
	                              "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj" };
	for (int64_t l = 0; l < nl; l++) {
		int64_t rows[7] = { nh * dh, nkv * dh, nkv * dh, d, ff, ff, d };
		int64_t cols[7] = { d, d, d, nh * dh, d, d, ff };
		snprintf(name, sizeof name, "model.layers.%lld.input_layernorm.weight", (long long)l);
		DESC(name, d, 0);
		int moe = llm_moe_layer(&lc, (int)l);
		for (int i = 0; i < (moe ? 4 : 7); i++) {
			snprintf(name, sizeof name, "model.layers.%lld.%s.weight", (long long)l, lin[i]);
			DESC(name, rows[i], cols[i]);
			if (i < 3 && fam->qkv_bias) {
				snprintf(name, sizeof name, "model.layers.%lld.%s.bias", (long long)l, lin[i]);
				DESC(name, rows[i], 0);
			}
			if (i == 2 && fam->qk_norm) {
				snprintf(name, sizeof name, "model.layers.%lld.self_attn.q_norm.weight", (long long)l);
				DESC(name, dh, 0);
				snprintf(name, sizeof name, "model.layers.%lld.self_attn.k_norm.weight", (long long)l);
				DESC(name, dh, 0);
			}
			if (i == 3) {
				snprintf(name, sizeof name, "model.layers.%lld.post_attention_layernorm.weight", (long long)l);
				DESC(name, d, 0);
				if (fam->sandwich) {
					snprintf(name, sizeof name, "model.layers.%lld.pre_feedforward_layernorm.weight", (long long)l);
					DESC(name, d, 0);
				}
			}
			if (i == 6 && fam->sandwich) {
				snprintf(name, sizeof name, "model.layers.%lld.post_feedforward_layernorm.weight", (long long)l);
				DESC(name, d, 0);
			}
		}
		/* a mixture-of-experts layer: the router, then each expert's gate, up, down */
		static const char *proj[2][3] = { { "w1", "w3", "w2" }, { "gate_proj", "up_proj", "down_proj" } };
		int qwen = lc.moe.names == LLM_MOE_NAMES_QWEN3;
		const char *blk = qwen ? "mlp" : "block_sparse_moe";
		for (int64_t e = -1; moe && e < ne; e++) {
			if (e < 0) {
				snprintf(name, sizeof name, "model.layers.%lld.%s.gate.weight", (long long)l, blk);
				DESC(name, ne, d);
				continue;
			}
			for (int i = 0; i < 3; i++) {
				snprintf(name, sizeof name, "model.layers.%lld.%s.experts.%lld.%s.weight", (long long)l, blk,
				         (long long)e, proj[qwen][i]);
				DESC(name, i == 2 ? d : ffe, i == 2 ? ffe : d);
			}
		}
	}
	DESC("model.norm.weight", d, 0);
	if (!tied)
		DESC("lm_head.weight", nv, d);
#undef DESC
	struct select sel;
	s = select_init(&sel, o);
	for (size_t i = 0; !s && i < k; i++) {
		descs[i].nbytes = (size_t)llm_tensor_numel(&descs[i]) * llm_dtype_size(plain);
		int q = fp8 && descs[i].n_dim == 2 && select_want(&sel, descs[i].name);
		note_module(&j, &sel, descs[i].name, q, tied);
		if (q)
			s = add_quant(&j, &descs[i]);
		else
			s = add_item(&j, A_CONVERT, &descs[i], descs[i].name, NULL, plain, descs[i].n_dim, descs[i].shape);
	}
	if (tied && !json_array_size(j.ours))
		add_module(j.skip, "lm_head.weight");
	select_free(&sel);
	if (s)
		goto out;
	j.src.seed = o->seed;
	j.src.norm = fam->norm_plus_one ? 0.0f : 1.0f;
	if (o->tokenizer_dir) {
		static const char *tok[] = { "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
		                             "tokenizer.model", "generation_config.json" };
		for (size_t i = 0; !s && i < sizeof tok / sizeof *tok; i++) {
			char *p = llm_path_join(o->tokenizer_dir, tok[i]);
			if (llm_exists(p)) {
				aux[n_aux].name = llm_strdup(tok[i]);
				s = llm_read_file(p, &aux[n_aux].data, &aux[n_aux].len);
				n_aux++;
			}
			free(p);
		}
	}
	if (!s)
		s = edit_config(&cfg, fp8 ? &j : NULL, torch_name(plain), &aux[n_aux++]);
	if (!s)
		s = run_job(&j, out, aux, n_aux);
out:
	if (descs) {
		for (size_t i = 0; descs[i].name; i++)
			free(descs[i].name);
		free(descs);
	}
	for (size_t i = 0; i < n_aux; i++) {
		free(aux[i].name);
		free(aux[i].data);
	}
	job_free(&j);
	json_decref(root);
	free(cfg.data);
	return s;
}
