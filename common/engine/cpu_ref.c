/* common/engine/cpu_ref.c: the plain reference of every backend op (cpu_ref.h).
 *
 * Written to be read, not run fast: one loop nest per definition, double
 * for every reduction, one rounding to f32 per output element. It shares
 * nothing with the optimised code it checks (backend_cpu.c, cpu_matmul.c,
 * kernels/): the narrow types are decoded here from their bit layouts
 * (dtype.h documents them) and the KV cache is addressed from the layout in
 * kvcache.h, so a bug there cannot hide in both sides of a comparison. */
#include "cpu_ref.h"

#include <math.h>
#include <string.h>
#include "banned.h"

#define REF_D_MAX 1024               /* head_dim limit of the model (model.c) */

static float *vrow(struct llm_view v, int64_t i) { return (float *)v.data + i * v.stride; }

static enum llm_status need_f32(const char *op, struct llm_view v)
{
	if (v.dtype != LLM_DTYPE_F32)
		return llm_fail(LLM_ERR_UNSUPPORTED, "cpu_ref %s: %s activations (f32 only)", op,
		                llm_dtype_name(v.dtype));
	return LLM_OK;
}

static enum llm_status need_shape(const char *op, struct llm_view v, int64_t rows, int64_t cols)
{
	if (v.rows < rows || v.cols < cols || v.stride < v.cols)
		return llm_fail(LLM_ERR_INTERNAL, "cpu_ref %s: view (%lld, %lld) stride %lld, need (%lld, %lld)",
		                op, (long long)v.rows, (long long)v.cols, (long long)v.stride,
		                (long long)rows, (long long)cols);
	return LLM_OK;
}

/* ---- element types, from their bit layouts ----------------------------- */

/* IEEE binary16: 1 sign, 5 exponent (bias 15), 10 mantissa bits. */
static double f16_value(uint16_t h)
{
	int s = h >> 15, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	double v = e == 0 ? ldexp(m, -24) : e == 31 ? (m ? NAN : INFINITY) : ldexp(1024 + m, e - 25);
	return s ? -v : v;
}

/* BF16: the upper 16 bits of a binary32. */
static double bf16_value(uint16_t h)
{
	uint32_t u = (uint32_t)h << 16;
	float f;
	memcpy(&f, &u, 4);
	return f;
}

/* OCP E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; exponent 0 is
 * subnormal (m/8 * 2^-6), S.1111.111 is NaN, no infinities. */
static double e4m3_value(uint8_t c)
{
	int s = c >> 7, e = (c >> 3) & 0xf, m = c & 7;
	double v = e == 0 ? ldexp(m, -9) : (e == 15 && m == 7) ? NAN : ldexp(8 + m, e - 10);
	return s ? -v : v;
}

/* The E4M3 code nearest Y (ties to the even code, i.e. the even
 * mantissa), |y| past 448 giving +-448: a search over the 127 finite
 * magnitudes, not the bit arithmetic of dtype.h. */
static uint8_t e4m3_nearest(float y)
{
	double a = fabs((double)y);
	int best = 0;
	for (int c = 1; c < 0x7f; c++) {
		double dc = fabs(e4m3_value((uint8_t)c) - a), db = fabs(e4m3_value((uint8_t)best) - a);
		if (dc < db || (dc == db && !(c & 1)))
			best = c;
	}
	return (uint8_t)(best | (signbit(y) ? 0x80 : 0));
}

/* kvcache.h: a head's row as codes and a scale amax / 448 (f32 ops). */
static void e4m3_row(uint8_t *c, float *scale, const float *x, int d)
{
	float amax = 0;
	for (int i = 0; i < d; i++)
		amax = fabsf(x[i]) > amax ? fabsf(x[i]) : amax;
	*scale = amax / 448.0f;
	for (int i = 0; i < d; i++)
		c[i] = amax > 0 ? e4m3_nearest(x[i] / *scale) : 0;
}

float llm_ref_weight_at(const struct llm_weight *w, int64_t r, int64_t c)
{
	size_t i = (size_t)r * (size_t)w->cols + (size_t)c;
	switch (w->dtype) {
	case LLM_DTYPE_F32:  return ((const float *)w->data)[i];
	case LLM_DTYPE_F16:  return (float)f16_value(((const uint16_t *)w->data)[i]);
	case LLM_DTYPE_BF16: return (float)bf16_value(((const uint16_t *)w->data)[i]);
	case LLM_DTYPE_E4M3: {
		float s = w->scale[(r / w->block_rows) * w->scale_cols + c / w->block_cols];
		/* the double product of two floats is exact; one rounding to f32,
		 * as the f32 product code * scale */
		return (float)(e4m3_value(((const uint8_t *)w->data)[i]) * (double)s);
	}
	default: return NAN;
	}
}

float llm_ref_round_bf16(float x)
{
	uint32_t u, lo, hi;
	memcpy(&u, &x, 4);
	if (isnan(x)) {
		u = (u | 0x00400000u) & 0xffff0000u;     /* quiet, in the upper half */
		memcpy(&x, &u, 4);
		return x;
	}
	if (isinf(x))
		return x;
	/* the two bf16 neighbours of x (same sign): truncated, and one step
	 * further from zero (which may be infinity) */
	lo = u & 0xffff0000u;
	hi = lo + 0x10000u;
	float a, b;
	memcpy(&a, &lo, 4);
	memcpy(&b, &hi, 4);
	double da = fabs((double)x - a), db = fabs((double)b - x);
	if (da < db || (da == db && !(lo & 0x10000u)))
		return a;
	return b;
}

static uint16_t bf16_bits(float x)
{
	float r = llm_ref_round_bf16(x);
	uint32_t u;
	memcpy(&u, &r, 4);
	return (uint16_t)(u >> 16);
}

/* ---- ops ---------------------------------------------------------------- */

enum llm_status llm_ref_embed(struct llm_view out, const int32_t *tok, const struct llm_weight *emb)
{
	LLM_TRY(need_f32("embed", out));
	LLM_TRY(need_shape("embed", out, out.rows, emb->cols));
	for (int64_t t = 0; t < out.rows; t++) {
		if (tok[t] < 0 || tok[t] >= emb->rows)
			return llm_fail(LLM_ERR_RANGE, "cpu_ref embed: token %lld: id %d not in [0, %lld)",
			                (long long)t, tok[t], (long long)emb->rows);
		for (int64_t c = 0; c < emb->cols; c++)
			vrow(out, t)[c] = llm_ref_weight_at(emb, tok[t], c);
	}
	return LLM_OK;
}

/* One row: out[i] = w[i] * x[i] / sqrt(mean(x^2) + eps). */
static void rmsnorm_row(float *out, const float *x, int64_t n, const struct llm_weight *w, float eps)
{
	double ss = 0;
	for (int64_t i = 0; i < n; i++)
		ss += (double)x[i] * x[i];
	double inv = 1.0 / sqrt(ss / (double)n + (double)eps);
	for (int64_t i = 0; i < n; i++)
		out[i] = (float)((double)llm_ref_weight_at(w, 0, i) * ((double)x[i] * inv));
}

enum llm_status llm_ref_rmsnorm(struct llm_view out, struct llm_view x, const struct llm_weight *w,
                                float eps)
{
	LLM_TRY(need_f32("rmsnorm", x));
	LLM_TRY(need_shape("rmsnorm", out, x.rows, x.cols));
	if (w->cols != x.cols)
		return llm_fail(LLM_ERR_INTERNAL, "cpu_ref rmsnorm: weight of %lld for rows of %lld",
		                (long long)w->cols, (long long)x.cols);
	for (int64_t t = 0; t < x.rows; t++)
		rmsnorm_row(vrow(out, t), vrow(x, t), x.cols, w, eps);
	return LLM_OK;
}

enum llm_status llm_ref_add_rmsnorm(struct llm_view out, struct llm_view x, struct llm_view y,
                                    const struct llm_weight *w, float eps)
{
	LLM_TRY(need_f32("add_rmsnorm", x));
	LLM_TRY(need_shape("add_rmsnorm", y, x.rows, x.cols));
	LLM_TRY(need_shape("add_rmsnorm", out, x.rows, x.cols));
	if (w->cols != x.cols)
		return llm_fail(LLM_ERR_INTERNAL, "cpu_ref add_rmsnorm: weight of %lld for rows of %lld",
		                (long long)w->cols, (long long)x.cols);
	for (int64_t t = 0; t < x.rows; t++) {
		for (int64_t i = 0; i < x.cols; i++)
			vrow(x, t)[i] += vrow(y, t)[i];
		rmsnorm_row(vrow(out, t), vrow(x, t), x.cols, w, eps);
	}
	return LLM_OK;
}

enum llm_status llm_ref_matmul(struct llm_view y, struct llm_view x, const struct llm_weight *w,
                               int bf16_in)
{
	LLM_TRY(need_f32("matmul", x));
	LLM_TRY(need_f32("matmul", y));
	if (x.cols != w->cols || y.cols != w->rows || y.rows != x.rows)
		return llm_fail(LLM_ERR_INTERNAL, "cpu_ref matmul: (%lld, %lld) x (%lld, %lld)^T -> (%lld, %lld)",
		                (long long)x.rows, (long long)x.cols, (long long)w->rows, (long long)w->cols,
		                (long long)y.rows, (long long)y.cols);
	for (int64_t t = 0; t < x.rows; t++)
		for (int64_t r = 0; r < w->rows; r++) {
			double acc = 0;
			for (int64_t c = 0; c < w->cols; c++) {
				float a = vrow(x, t)[c], b = llm_ref_weight_at(w, r, c);
				if (bf16_in) {
					a = llm_ref_round_bf16(a);
					b = llm_ref_round_bf16(b);
				}
				acc += (double)a * b;
			}
			vrow(y, t)[r] = (float)acc;
		}
	return LLM_OK;
}

/* Rotate the N_HEAD heads of row X for position POS. */
static void rope_row(float *x, int32_t pos, int n_head, int d_head, const float *inv_freq)
{
	int half = d_head / 2;
	for (int h = 0; h < n_head; h++) {
		float *p = x + (size_t)h * (size_t)d_head;
		for (int j = 0; j < half; j++) {
			float a = (float)pos * inv_freq[j];     /* the f32 angle (see cpu_ref.h) */
			double c = cos((double)a), s = sin((double)a), x0 = p[j], x1 = p[j + half];
			p[j] = (float)(x0 * c - x1 * s);
			p[j + half] = (float)(x1 * c + x0 * s);
		}
	}
}

enum llm_status llm_ref_rope(struct llm_view x, const int32_t *pos, int n_head, int d_head,
                             const float *inv_freq)
{
	LLM_TRY(need_f32("rope", x));
	LLM_TRY(need_shape("rope", x, x.rows, (int64_t)n_head * d_head));
	if (d_head % 2)
		return llm_fail(LLM_ERR_INTERNAL, "cpu_ref rope: odd head_dim %d", d_head);
	for (int64_t t = 0; t < x.rows; t++)
		rope_row(vrow(x, t), pos[t], n_head, d_head, inv_freq);
	return LLM_OK;
}

/* Element index of KV head KH's row at (LAYER, SEQ, POS) in kv->k or kv->v
 * (kvcache.h layout: (n_layer, n_block, n_kv_head, block_size, d_head)). */
static size_t kv_index(const struct llm_kv *kv, int layer, int seq, int32_t pos, int kh)
{
	int32_t blk = kv->seq[seq].blk[pos / kv->block_size];
	size_t run = ((size_t)layer * (size_t)kv->n_block + (size_t)blk) * (size_t)kv->n_kv_head + (size_t)kh;
	return (run * (size_t)kv->block_size + (size_t)(pos % kv->block_size)) * (size_t)kv->d_head;
}

static enum llm_status kv_check(const char *op, const struct llm_kv *kv, int layer, const struct llm_batch *b)
{
	if (layer < 0 || layer >= kv->n_layer
	    || (kv->dtype != LLM_DTYPE_F32 && kv->dtype != LLM_DTYPE_BF16 && kv->dtype != LLM_DTYPE_E4M3))
		return llm_fail(LLM_ERR_INTERNAL, "cpu_ref %s: layer %d of %d, cache %s", op, layer, kv->n_layer,
		                llm_dtype_name(kv->dtype));
	for (int t = 0; t < b->n_tok; t++) {
		int s = b->seq[t];
		if (s < 0 || s >= kv->max_seq || b->pos[t] < 0
		    || b->pos[t] / kv->block_size >= kv->seq[s].n_blk)
			return llm_fail(LLM_ERR_INTERNAL, "cpu_ref %s: token %d: seq %d pos %d has no block", op, t,
			                s, b->pos[t]);
	}
	return LLM_OK;
}

enum llm_status llm_ref_kv_store(struct llm_kv *kv, int layer, const struct llm_batch *b,
                                 struct llm_view k, struct llm_view v)
{
	LLM_TRY(need_f32("kv_store", k));
	LLM_TRY(need_f32("kv_store", v));
	LLM_TRY(need_shape("kv_store", k, b->n_tok, kv->kv_dim));
	LLM_TRY(need_shape("kv_store", v, b->n_tok, kv->kv_dim));
	LLM_TRY(kv_check("kv_store", kv, layer, b));
	for (int t = 0; t < b->n_tok; t++)
		for (int h = 0; h < kv->n_kv_head; h++) {
			size_t at = kv_index(kv, layer, b->seq[t], b->pos[t], h), ho = (size_t)h * (size_t)kv->d_head;
			if (kv->dtype == LLM_DTYPE_E4M3) {   /* scales: one per row of d_head, index at / d_head */
				e4m3_row((uint8_t *)kv->k + at, kv->ks + at / (size_t)kv->d_head, vrow(k, t) + ho, kv->d_head);
				e4m3_row((uint8_t *)kv->v + at, kv->vs + at / (size_t)kv->d_head, vrow(v, t) + ho, kv->d_head);
				continue;
			}
			for (int i = 0; i < kv->d_head; i++) {
				float kf = vrow(k, t)[ho + (size_t)i], vf = vrow(v, t)[ho + (size_t)i];
				if (kv->dtype == LLM_DTYPE_F32) {
					((float *)kv->k)[at + (size_t)i] = kf;
					((float *)kv->v)[at + (size_t)i] = vf;
				} else {
					((uint16_t *)kv->k)[at + (size_t)i] = bf16_bits(kf);
					((uint16_t *)kv->v)[at + (size_t)i] = bf16_bits(vf);
				}
			}
		}
	return LLM_OK;
}

enum llm_status llm_ref_rope_store(struct llm_view q, struct llm_view k, struct llm_view v,
                                   struct llm_kv *kv, int layer, const struct llm_batch *b, int n_head,
                                   int n_kv_head, int d_head, const float *inv_freq)
{
	q.rows = k.rows = v.rows = b->n_tok;
	LLM_TRY(llm_ref_rope(q, b->pos, n_head, d_head, inv_freq));
	LLM_TRY(llm_ref_rope(k, b->pos, n_kv_head, d_head, inv_freq));
	return llm_ref_kv_store(kv, layer, b, k, v);
}

/* Element I of the cached row at element index AT of ARR (kv->k or kv->v). */
static double kv_at(const struct llm_kv *kv, const void *arr, size_t at, int i)
{
	if (kv->dtype == LLM_DTYPE_F32)
		return ((const float *)arr)[at + (size_t)i];
	if (kv->dtype == LLM_DTYPE_E4M3) {   /* code * scale rounded to f32 once, as the cache defines it */
		const float *sc = arr == kv->k ? kv->ks : kv->vs;
		return (float)(e4m3_value(((const uint8_t *)arr)[at + (size_t)i]) * (double)sc[(at + (size_t)i) / (size_t)kv->d_head]);
	}
	return bf16_value(((const uint16_t *)arr)[at + (size_t)i]);
}

/* q . k_p / sqrt(d) for head QH (its query Q) over KV head KH. */
/* A score as the opts define it: q . k_p / div, capped where cap > 0 */
static double score(const struct llm_kv *kv, int layer, int seq, int32_t p, int kh, const float *q, double div,
                    double cap)
{
	size_t at = kv_index(kv, layer, seq, p, kh);
	double s = 0;
	for (int i = 0; i < kv->d_head; i++)
		s += (double)q[i] * kv_at(kv, kv->k, at, i);
	s /= div;
	return cap > 0 ? tanh(s / cap) * cap : s;
}

static enum llm_status attention(struct llm_view out, struct llm_view q, const struct llm_kv *kv,
                                 int layer, const struct llm_batch *b, int n_head, double div, double cap,
                                 int window)
{
	int d = kv->d_head;
	LLM_TRY(need_f32("attention", q));
	LLM_TRY(need_f32("attention", out));
	LLM_TRY(need_shape("attention", q, b->n_tok, (int64_t)n_head * d));
	LLM_TRY(need_shape("attention", out, b->n_tok, (int64_t)n_head * d));
	LLM_TRY(kv_check("attention", kv, layer, b));
	if (d > REF_D_MAX || n_head % kv->n_kv_head)
		return llm_fail(LLM_ERR_INTERNAL, "cpu_ref attention: %d heads over %d KV heads of %d", n_head,
		                kv->n_kv_head, d);
	int group = n_head / kv->n_kv_head;
	double acc[REF_D_MAX];
	for (int t = 0; t < b->n_tok; t++) {
		int seq = b->seq[t];
		int32_t pos = b->pos[t], lo = window > 0 && pos - window + 1 > 0 ? pos - window + 1 : 0;
		for (int h = 0; h < n_head; h++) {
			const float *qh = vrow(q, t) + (size_t)h * (size_t)d;
			int kh = h / group;
			/* softmax in three passes over the positions (the scores
			 * recomputed, the same doubles each time): max, sum, then
			 * the weighted sum of the values */
			double mx = -INFINITY, sum = 0;
			for (int32_t p = lo; p <= pos; p++) {
				double s = score(kv, layer, seq, p, kh, qh, div, cap);
				mx = s > mx ? s : mx;
			}
			for (int32_t p = lo; p <= pos; p++)
				sum += exp(score(kv, layer, seq, p, kh, qh, div, cap) - mx);
			for (int i = 0; i < d; i++)
				acc[i] = 0;
			for (int32_t p = lo; p <= pos; p++) {
				double a = exp(score(kv, layer, seq, p, kh, qh, div, cap) - mx) / sum;
				size_t at = kv_index(kv, layer, seq, p, kh);
				for (int i = 0; i < d; i++)
					acc[i] += a * kv_at(kv, kv->v, at, i);
			}
			float *o = vrow(out, t) + (size_t)h * (size_t)d;
			for (int i = 0; i < d; i++)
				o[i] = (float)acc[i];
		}
	}
	return LLM_OK;
}

enum llm_status llm_ref_attention(struct llm_view out, struct llm_view q, const struct llm_kv *kv,
                                  int layer, const struct llm_batch *b, int n_head)
{
	return attention(out, q, kv, layer, b, n_head, sqrt((double)kv->d_head), 0, 0);
}

enum llm_status llm_ref_attention_ex(struct llm_view out, struct llm_view q, const struct llm_kv *kv,
                                     int layer, const struct llm_batch *b, int n_head,
                                     const struct llm_attn_opts *o)
{
	return attention(out, q, kv, layer, b, n_head, o->div, o->softcap, o->window);
}

enum llm_status llm_ref_geglu(struct llm_view out, struct llm_view gate, struct llm_view up)
{
	LLM_TRY(need_f32("geglu", gate));
	LLM_TRY(need_shape("geglu", up, gate.rows, gate.cols));
	LLM_TRY(need_shape("geglu", out, gate.rows, gate.cols));
	for (int64_t t = 0; t < gate.rows; t++)
		for (int64_t i = 0; i < gate.cols; i++) {
			double g = vrow(gate, t)[i];
			double z = 0.79788456080286536 * (g + 0.044715 * g * g * g);   /* sqrt(2 / pi) */
			vrow(out, t)[i] = (float)(0.5 * g * (1.0 + tanh(z)) * (double)vrow(up, t)[i]);
		}
	return LLM_OK;
}

enum llm_status llm_ref_softcap(struct llm_view x, float cap)
{
	LLM_TRY(need_f32("softcap", x));
	for (int64_t t = 0; t < x.rows; t++)
		for (int64_t i = 0; i < x.cols; i++)
			vrow(x, t)[i] = (float)(tanh((double)vrow(x, t)[i] / cap) * cap);
	return LLM_OK;
}

enum llm_status llm_ref_swiglu(struct llm_view out, struct llm_view gate, struct llm_view up)
{
	LLM_TRY(need_f32("swiglu", gate));
	LLM_TRY(need_shape("swiglu", up, gate.rows, gate.cols));
	LLM_TRY(need_shape("swiglu", out, gate.rows, gate.cols));
	for (int64_t t = 0; t < gate.rows; t++)
		for (int64_t i = 0; i < gate.cols; i++) {
			double g = vrow(gate, t)[i];
			vrow(out, t)[i] = (float)(g / (1.0 + exp(-g)) * (double)vrow(up, t)[i]);
		}
	return LLM_OK;
}

enum llm_status llm_ref_add(struct llm_view x, struct llm_view y)
{
	LLM_TRY(need_f32("add", x));
	LLM_TRY(need_shape("add", y, x.rows, x.cols));
	for (int64_t t = 0; t < x.rows; t++)
		for (int64_t i = 0; i < x.cols; i++)
			vrow(x, t)[i] += vrow(y, t)[i];
	return LLM_OK;
}

enum llm_status llm_ref_gather(struct llm_view out, struct llm_view x, const int32_t *idx)
{
	LLM_TRY(need_f32("gather", x));
	LLM_TRY(need_shape("gather", out, out.rows, x.cols));
	for (int64_t i = 0; i < out.rows; i++) {
		if (idx[i] < 0 || idx[i] >= x.rows)
			return llm_fail(LLM_ERR_INTERNAL, "cpu_ref gather: row %lld: index %d not in [0, %lld)",
			                (long long)i, idx[i], (long long)x.rows);
		for (int64_t c = 0; c < x.cols; c++)
			vrow(out, i)[c] = vrow(x, idx[i])[c];
	}
	return LLM_OK;
}

void llm_ref_softmax(float *a, int64_t n)
{
	double mx = -INFINITY, sum = 0;
	for (int64_t i = 0; i < n; i++)
		mx = a[i] > mx ? a[i] : mx;
	for (int64_t i = 0; i < n; i++)
		sum += exp((double)a[i] - mx);
	for (int64_t i = 0; i < n; i++)
		a[i] = (float)(exp((double)a[i] - mx) / sum);
}
