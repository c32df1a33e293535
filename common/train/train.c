/* common/train/train.c: the LoRA trainer (see train.h): the helpers the kernels
 * share (their loops run on the engine's thread pool, pool.h), and the
 * forward/backward pass of train_impl.h instantiated for float (training)
 * and double (the gradient check). */
#define _GNU_SOURCE
#include "train.h"
#include "hash.h"
#include "pool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif
#include "banned.h"

#define MMT_TILE 32           /* rows of W dequantized at once by the dx kernel */
#define DEFAULT_CHUNK 64

/* ---- the trainer ----------------------------------------------------------------- */

struct llm_trainer {
	const struct llm_model *m;
	struct llm_lora *lo;
	struct llm_train_opts o;
	struct llm_layer_source src;
	enum llm_cpu_isa isa;
	int nth;
	int chunk;                /* logit rows per lm_head chunk */
	struct llm_pool *pool;    /* NULL: one thread */
	void *st;                 /* struct state_f32 or state_f64 */
	int32_t *lg_idx, *lg_tgt; /* (chunk) */
	double *lg_loss;          /* (chunk) */
	uint64_t drop_key;
	uint64_t *drop_tok;       /* (n_seq * seq_len) the token id the masks hash */
	uint32_t drop_thresh;     /* a column is dropped when hash < thresh (of 2^32) */
	/* a mixture of experts (train_moe.h): the routing of the layer at hand */
	const int32_t *rowmap;    /* NULL: a projection's rows are the batch's; else each one's batch row */
	int32_t *msel, *mrows;    /* (n K) each row's chosen experts; the gathered rows' batch rows */
	int32_t *mstart;          /* (2 E + 1) expert e's gathered rows from mstart[e]; E more: positions */
	double *mwt, *mgj;        /* (n K) the chosen experts' weights; (K) a row's weight gradients */
};

/* Run FN(ctx, ith, nth) for every ith < nth (the trainer's thread count)
 * on the pool when WORK (multiply-adds) is worth it, else FN(ctx, 0, 1).
 * A task's rows and its scratch (tscr + ith * tscr_per) follow ith alone,
 * whichever thread runs it (pool.h): the same bits as one thread per ith. */
static void par(struct llm_trainer *t, double work, void (*fn)(void *, int, int), void *ctx)
{
	if (!t->pool || work < 32768.0) {
		fn(ctx, 0, 1);
		return;
	}
	llm_pool_run(t->pool, t->nth, fn, ctx);
}

static void split(int64_t n, int ith, int nth, int64_t align, int64_t *b, int64_t *e)
{
	int64_t per = (n + nth - 1) / nth;
	per = (per + align - 1) / align * align;
	*b = (int64_t)ith * per;
	*e = *b + per;
	if (*b > n)
		*b = n;
	if (*e > n)
		*e = n;
}

/* Columns [c0, c1) of row r of W as f32 (FP8: code times its block scale). */
static void weight_slice(const struct llm_weight *w, int64_t r, int64_t c0, int64_t c1, float *out)
{
	size_t base = (size_t)r * (size_t)w->cols;
	switch (w->dtype) {
	case LLM_DTYPE_F32:
		memcpy(out, (const float *)w->data + base + c0, (size_t)(c1 - c0) * sizeof(float));
		break;
	case LLM_DTYPE_F16:
		llm_to_f32(out, (const uint16_t *)w->data + base + c0, LLM_DTYPE_F16, (size_t)(c1 - c0));
		break;
	case LLM_DTYPE_BF16:
		llm_to_f32(out, (const uint16_t *)w->data + base + c0, LLM_DTYPE_BF16, (size_t)(c1 - c0));
		break;
	case LLM_DTYPE_E4M3: {
		const uint8_t *q = (const uint8_t *)w->data + base;
		const float *sc = w->scale + (r / w->block_rows) * w->scale_cols;
		for (int64_t c = c0; c < c1; c++)
			out[c - c0] = llm_e4m3_table[q[c]] * sc[c / w->block_cols];
		break;
	}
	default:
		for (int64_t c = c0; c < c1; c++)
			out[c - c0] = NAN;
	}
}

/* Whether column c of row i of the input of (layer, slot) survives the
 * dropout: a function of the row's token (t->rowmap maps an expert's
 * gathered rows to theirs). A projection's id is layer << 3 | target; an
 * expert's puts its slot above, with 7 (no projection's) below. */
static inline int keep(const struct llm_trainer *t, int layer, int slot, int64_t i, int64_t c, int64_t din)
{
	uint64_t id = slot < LLM_LORA_N ? (uint64_t)layer << 3 | (uint64_t)slot
	                                : ((uint64_t)slot << 32 | (uint64_t)layer) << 3 | 7u;
	uint64_t tok = t->drop_tok[t->rowmap ? t->rowmap[i] : i];
	uint64_t h = llm_hash_mix64(t->drop_key ^ llm_hash_mix64(id + LLM_SPLITMIX_GAMMA)
	                    ^ (tok * (uint64_t)din + (uint64_t)c) * 0xd1342543de82ef95ull);
	return (uint32_t)(h >> 32) >= t->drop_thresh;
}

static void release_layer(struct llm_trainer *t, int l);

/* Layer L, from the source; NULL (message set) when the fetch fails or the
 * layer lacks a vector the family reads (a source that dropped it would
 * train another model). */
static const struct llm_layer *fetch_layer(struct llm_trainer *t, int l)
{
	if (!t->src.fetch)
		return &t->m->layers[l];
	const struct llm_layer *L = t->src.fetch(t->src.ctx, l);
	if (!L)
		return NULL;
	const struct llm_family *f = t->m->cfg.fam;
	const char *miss = !L->attn_norm.data || !L->ffn_norm.data ? "norm" :
	                   f->qkv_bias && (!L->bq.data || !L->bk.data || !L->bv.data) ? "q/k/v bias" :
	                   f->qk_norm && (!L->q_norm.data || !L->k_norm.data) ? "q/k norm" :
	                   f->sandwich && (!L->post_attn_norm.data || !L->post_ffn_norm.data) ? "post norm" : NULL;
	if (!miss)
		return L;
	release_layer(t, l);
	llm_fail(LLM_ERR_INTERNAL, "the layer source gave no %s weights (model_type %s)", miss, f->model_type);
	return NULL;
}

/* A layer source that returned NULL (its message is set). */
static enum llm_status fetch_failed(int l)
{
	return llm_fail_prefix(LLM_ERR_COMM, "layer %d", l);
}

static void release_layer(struct llm_trainer *t, int l)
{
	if (t->src.release)
		t->src.release(t->src.ctx, l);
}

static size_t maxdim(const struct llm_config *c)
{
	size_t d = (size_t)c->d_model, q = (size_t)c->n_head * (size_t)c->d_head;
	size_t m = d > q ? d : q;
	m = m > (size_t)c->moe.d_ff_expert ? m : (size_t)c->moe.d_ff_expert;
	return m > (size_t)c->d_ff ? m : (size_t)c->d_ff;
}

/* The dense MLP's width when some layer has one (d_ff), else 0: a mixture
 * of experts without dense layers keeps no (n, d_ff) activations. */
static int64_t dense_ff(const struct llm_config *c)
{
	for (int l = 0; l < c->n_layer; l++)
		if (!llm_moe_layer(c, l))
			return c->d_ff;
	return 0;
}

/* Bytes of the routing arrays of a mixture of experts for N token slots
 * (struct llm_trainer's msel ... mgj), outside the arena. */
static size_t moe_host_bytes(const struct llm_config *c, size_t n)
{
	size_t E = (size_t)c->moe.n_expert, K = (size_t)c->moe.n_expert_used;
	if (!E)
		return 0;
	return n * K * (2 * sizeof(int32_t) + sizeof(double)) + (2 * E + 1) * sizeof(int32_t) + K * sizeof(double);
}

/* Per-thread scratch in elements of ES bytes: the larger of the attention
 * rows (3 L), a dropped-out input row, a dequantized weight row and a dx
 * tile (MMT_TILE rows of one thread's column band, in f32). */
static size_t tscr_elems(const struct llm_config *c, size_t L, size_t R, size_t es, int nth)
{
	size_t md = maxdim(c);
	size_t band = (md + (size_t)nth - 1) / (size_t)nth;
	band = (band + 15) / 16 * 16;
	size_t f32 = MMT_TILE * band;
	if (f32 < md)
		f32 = md;
	size_t n = (f32 * sizeof(float) + es - 1) / es;
	if (n < 3 * L)
		n = 3 * L;
	if (n < md)
		n = md;
	(void)R;
	return (n + 15) / 16 * 16;
}

/* ---- vector helpers (F32) ------------------------------------------------------
 * y += a * x over n floats, and the four-row form y += a0 x0 + a1 x1 + a2 x2
 * + a3 x3 (each element summed in that order). AVX2 + FMA when the CPU has
 * it (fused multiply-adds round once: results differ from the scalar form in
 * the last bits, but not between runs or thread counts on one machine). */
#if defined(__x86_64__)
__attribute__((target("avx2,fma")))
static void axpy4_avx2(float *y, const float *a, const float *const *x, int64_t n)
{
	__m256 a0 = _mm256_set1_ps(a[0]), a1 = _mm256_set1_ps(a[1]);
	__m256 a2 = _mm256_set1_ps(a[2]), a3 = _mm256_set1_ps(a[3]);
	int64_t c = 0;
	for (; c + 8 <= n; c += 8) {
		__m256 d = _mm256_loadu_ps(y + c);
		d = _mm256_fmadd_ps(a0, _mm256_loadu_ps(x[0] + c), d);
		d = _mm256_fmadd_ps(a1, _mm256_loadu_ps(x[1] + c), d);
		d = _mm256_fmadd_ps(a2, _mm256_loadu_ps(x[2] + c), d);
		d = _mm256_fmadd_ps(a3, _mm256_loadu_ps(x[3] + c), d);
		_mm256_storeu_ps(y + c, d);
	}
	for (; c < n; c++)
		y[c] = fmaf(a[3], x[3][c], fmaf(a[2], x[2][c], fmaf(a[1], x[1][c], fmaf(a[0], x[0][c], y[c]))));
}

__attribute__((target("avx2,fma")))
static void axpy_avx2(float *y, float a, const float *x, int64_t n)
{
	__m256 av = _mm256_set1_ps(a);
	int64_t c = 0;
	for (; c + 8 <= n; c += 8)
		_mm256_storeu_ps(y + c, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + c), _mm256_loadu_ps(y + c)));
	for (; c < n; c++)
		y[c] = fmaf(a, x[c], y[c]);
}
#endif

static void axpy4_f32(enum llm_cpu_isa isa, float *y, const float *a, const float *const *x, int64_t n)
{
#if defined(__x86_64__)
	if (isa >= LLM_ISA_AVX2) {
		axpy4_avx2(y, a, x, n);
		return;
	}
#endif
	(void)isa;
	for (int64_t c = 0; c < n; c++)
		y[c] = y[c] + a[0] * x[0][c] + a[1] * x[1][c] + a[2] * x[2][c] + a[3] * x[3][c];
}

static void axpy_f32(enum llm_cpu_isa isa, float *y, float a, const float *x, int64_t n)
{
#if defined(__x86_64__)
	if (isa >= LLM_ISA_AVX2) {
		axpy_avx2(y, a, x, n);
		return;
	}
#endif
	(void)isa;
	for (int64_t c = 0; c < n; c++)
		y[c] += a * x[c];
}

static void axpy4_f64(enum llm_cpu_isa isa, double *y, const double *a, const float *const *x, int64_t n)
{
	(void)isa;
	for (int64_t c = 0; c < n; c++)
		y[c] = y[c] + a[0] * x[0][c] + a[1] * x[1][c] + a[2] * x[2][c] + a[3] * x[3][c];
}

static void axpy_f64(enum llm_cpu_isa isa, double *y, double a, const double *x, int64_t n)
{
	(void)isa;
	for (int64_t c = 0; c < n; c++)
		y[c] += a * x[c];
}

static float dot_f32(enum llm_cpu_isa isa, const float *a, const float *b, int64_t n)
{
	return llm_cpu_dot(isa, a, b, n);
}

static double dot_f64(enum llm_cpu_isa isa, const double *a, const double *b, int64_t n)
{
	(void)isa;
	double s = 0;
	for (int64_t i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

#define REAL float
#define F(name) name##_f32
#define TRAIN_F64 0
#include "train_impl.h"
#undef REAL
#undef F
#undef TRAIN_F64

#define REAL double
#define F(name) name##_f64
#define TRAIN_F64 1
#include "train_impl.h"
#undef REAL
#undef F
#undef TRAIN_F64

/* ---- plan -------------------------------------------------------------------------- */

void llm_train_plan(const struct llm_config *c, size_t n_params, int rank, int n_targets,
                    const struct llm_train_opts *o, int n_threads, struct llm_train_plan *p)
{
	memset(p, 0, sizeof *p);
	size_t es = o->f64 ? sizeof(double) : sizeof(float);
	size_t n = (size_t)o->n_seq * (size_t)o->seq_len, D = (size_t)c->d_model;
	size_t Q = (size_t)c->n_head * (size_t)c->d_head, KV = (size_t)c->n_kv_head * (size_t)c->d_head;
	size_t FF = (size_t)dense_ff(c), H = (size_t)c->n_head, R = (size_t)rank;
	size_t E = (size_t)c->moe.n_expert, NK = n * (size_t)c->moe.n_expert_used, FE = (size_t)c->moe.d_ff_expert;
	size_t C = (size_t)(o->logit_chunk > 0 ? o->logit_chunk : DEFAULT_CHUNK);
	size_t V = (size_t)c->n_vocab, L = (size_t)o->seq_len, half = (size_t)c->d_head / 2;
	p->params = n_params * es;
	p->grads = n_params * es;
	p->optimizer = o->f64 ? 0 : 2 * n_params * sizeof(float);
	p->checkpoints = ((size_t)c->n_layer + 1) * n * D * es;
	size_t per_layer = n * (3 * D + 2 + 2 * Q + 2 * KV + H + 3 * FF + (size_t)n_targets * R);
	if (c->fam->qk_norm)          /* q, k before their per-head norms, and its 1/rms */
		per_layer += n * (Q + KV + H + (size_t)c->n_kv_head);
	if (c->fam->sandwich)         /* o_proj's and down_proj's outputs before their norms */
		per_layer += n * (2 * D + 2);
	/* a mixture of experts: logits, each expert's gathered gate, up, h,
	 * output and the adapters' (n K, R) of its gate, up, down */
	if (E)
		per_layer += n * E + NK * (3 * FE + D + 3 * R);
	p->layer_acts = (o->checkpoint ? 1 : (size_t)c->n_layer) * per_layer * es;
	p->workspace = (n * (D + 1) + n * (3 * D + 2 * Q + 2 * KV + 3 * FF) + (E ? NK : n) * R + D + 2 * L * half +
	                (E ? NK * (3 * D + 3 * FE + 2) + n * E : 0)) * es +
	               n * sizeof(uint64_t) + moe_host_bytes(c, n);   /* the dropout token ids, the routing */
	p->logits = (C * (2 * D + V)) * es + C * (2 * sizeof(int32_t) + sizeof(double));
	p->threads = (size_t)n_threads * tscr_elems(c, L, R, es, n_threads) * es;
	p->total = p->params + p->grads + p->optimizer + p->checkpoints + p->layer_acts +
	           p->workspace + p->logits + p->threads;
}

static int online_cpus(void)
{
	long n = sysconf(_SC_NPROCESSORS_ONLN);
	return n < 1 ? 1 : n > 256 ? 256 : (int)n;
}

enum llm_status llm_trainer_open(struct llm_trainer **tp, const struct llm_model *m,
                                 struct llm_lora *lo, const struct llm_train_opts *o,
                                 const struct llm_layer_source *src)
{
	*tp = NULL;
	const struct llm_config *c = &m->cfg;
	if (o->seq_len < 1 || o->n_seq < 1 || (int64_t)o->seq_len * o->n_seq > (1 << 24))
		return llm_fail(LLM_ERR_USAGE, "trainer: %d sequences of %d tokens", o->n_seq, o->seq_len);
	if (o->seq_len > c->max_ctx)
		return llm_fail(LLM_ERR_USAGE, "trainer: sequence length %d exceeds the model context %d",
		                o->seq_len, c->max_ctx);
	if (lo->n_layer != c->n_layer || lo->d_in[LLM_LORA_Q] != c->d_model || lo->d_out[LLM_LORA_UP] != c->d_ff ||
	    lo->n_expert != c->moe.n_expert || (lo->n_expert && lo->d_out[LLM_LORA_N] != c->moe.d_ff_expert))
		return llm_fail(LLM_ERR_USAGE, "trainer: the adapter does not fit the model");
	struct llm_trainer *t = calloc(1, sizeof *t);
	if (!t)
		return llm_fail(LLM_ERR_NOMEM, "trainer: out of memory");
	t->m = m;
	t->lo = lo;
	t->o = *o;
	if (src)
		t->src = *src;
	t->isa = llm_cpu_isa_capped(NULL);               /* $LLM_CPU_ISA caps the level, as in the backend */
	t->nth = o->f64 ? 1 : o->n_threads > 0 ? o->n_threads : online_cpus();
	t->chunk = o->logit_chunk > 0 ? o->logit_chunk : DEFAULT_CHUNK;
	double thr = (double)lo->dropout * 4294967296.0;
	t->drop_thresh = thr >= 4294967295.0 ? 0xffffffffu : (uint32_t)thr;
	enum llm_status s = LLM_OK;
	t->lg_idx = malloc((size_t)t->chunk * sizeof(int32_t));
	t->lg_tgt = malloc((size_t)t->chunk * sizeof(int32_t));
	t->lg_loss = malloc((size_t)t->chunk * sizeof(double));
	t->drop_tok = malloc((size_t)o->n_seq * (size_t)o->seq_len * sizeof *t->drop_tok);
	if (!t->lg_idx || !t->lg_tgt || !t->lg_loss || !t->drop_tok)
		s = llm_fail(LLM_ERR_NOMEM, "trainer: out of memory");
	if (!s && c->moe.n_expert) {
		size_t nk = (size_t)o->n_seq * (size_t)o->seq_len * (size_t)c->moe.n_expert_used;
		t->msel = malloc(nk * sizeof *t->msel);
		t->mrows = malloc(nk * sizeof *t->mrows);
		t->mstart = malloc((2 * (size_t)c->moe.n_expert + 1) * sizeof *t->mstart);
		t->mwt = malloc(nk * sizeof *t->mwt);
		t->mgj = malloc((size_t)c->moe.n_expert_used * sizeof *t->mgj);
		if (!t->msel || !t->mrows || !t->mstart || !t->mwt || !t->mgj)
			s = llm_fail(LLM_ERR_NOMEM, "trainer: out of memory for the experts' routing");
	}
	if (!s && t->nth > 1)
		s = llm_pool_open(&t->pool, t->nth);
	if (!s)
		s = o->f64 ? open_f64(t) : open_f32(t);
	if (!s) {
		/* the plan and the allocation are one computation */
		int nt = 0;
		for (int k = 0; k < LLM_LORA_N; k++)
			nt += lo->targets >> k & 1;
		struct llm_train_plan p;
		llm_train_plan(c, lo->n_params, lo->rank, nt, o, t->nth, &p);
		size_t es = o->f64 ? sizeof(double) : sizeof(float);
		size_t got = (o->f64 ? carve_f64(t, NULL) : carve_f32(t, NULL)) * es;
		size_t want = p.total - p.optimizer - (o->f64 ? 0 : p.params) -
		              (size_t)t->chunk * (2 * sizeof(int32_t) + sizeof(double)) -
		              (size_t)o->n_seq * (size_t)o->seq_len * sizeof(uint64_t) -
		              moe_host_bytes(c, (size_t)o->n_seq * (size_t)o->seq_len);
		if (got != want)
			s = llm_fail(LLM_ERR_INTERNAL, "trainer: allocated %zu bytes, the plan says %zu", got, want);
	}
	if (s) {
		llm_trainer_close(t);
		return s;
	}
	*tp = t;
	return LLM_OK;
}

void llm_trainer_close(struct llm_trainer *t)
{
	if (!t)
		return;
	if (t->o.f64)
		close_f64(t);
	else
		close_f32(t);
	llm_pool_close(t->pool);
	free(t->lg_idx);
	free(t->lg_tgt);
	free(t->lg_loss);
	free(t->drop_tok);
	free(t->msel);
	free(t->mrows);
	free(t->mstart);
	free(t->mwt);
	free(t->mgj);
	free(t);
}

static enum llm_status check_batch(const struct llm_trainer *t, const struct llm_train_batch *b)
{
	const struct llm_config *c = &t->m->cfg;
	if (b->n_seq < 1 || b->seq_len < 1 || b->n_seq > t->o.n_seq || b->seq_len > t->o.seq_len ||
	    (int64_t)b->n_seq * b->seq_len > (int64_t)t->o.n_seq * t->o.seq_len)
		return llm_fail(LLM_ERR_USAGE, "trainer: batch of %d x %d tokens exceeds %d x %d",
		                b->n_seq, b->seq_len, t->o.n_seq, t->o.seq_len);
	for (int r = 0; r < b->n_seq; r++)
		for (int i = 0; i < b->seq_len; i++) {
			int64_t k = (int64_t)r * b->seq_len + i;
			if (b->tok[k] < 0 || b->tok[k] >= c->n_vocab)
				return llm_fail(LLM_ERR_RANGE, "batch row %d slot %d: token %d is not in the vocabulary [0, %d)",
				                r, i, b->tok[k], c->n_vocab);
			if (b->tgt[k] >= c->n_vocab)
				return llm_fail(LLM_ERR_RANGE, "batch row %d slot %d: target %d is not in the vocabulary",
				                r, i, b->tgt[k]);
			if (b->start[k] < 0 || b->start[k] > i || b->pos[k] != i - b->start[k] || b->pos[k] >= c->max_ctx)
				return llm_fail(LLM_ERR_USAGE, "batch row %d slot %d: start %d and position %d do not fit",
				                r, i, b->start[k], b->pos[k]);
		}
	return LLM_OK;
}

enum llm_status llm_trainer_step(struct llm_trainer *t, const struct llm_train_batch *b,
                                 double gscale, uint64_t dropout_key, int flags,
                                 double *loss_sum, int64_t *n_count)
{
	LLM_TRY(check_batch(t, b));
	t->drop_key = llm_hash_mix64(dropout_key + 0x632be59bd9b4e019ull);
	/* a row's tokens are (row id << 24) + slot: unique while rows are
	 * shorter than 2^24 slots (llm_trainer_open's limit) */
	for (int r = 0; r < b->n_seq; r++)
		for (int i = 0; i < b->seq_len; i++) {
			int64_t k = (int64_t)r * b->seq_len + i;
			t->drop_tok[k] = b->row ? ((uint64_t)b->row[r] << 24) + (uint64_t)i : (uint64_t)k;
		}
	int grad = flags & LLM_TRAIN_GRAD, drop = (flags & LLM_TRAIN_DROPOUT) != 0;
	return t->o.f64 ? step_f64(t, b, gscale, grad, drop, loss_sum, n_count)
	                : step_f32(t, b, gscale, grad, drop, loss_sum, n_count);
}

void *llm_trainer_params(struct llm_trainer *t)
{
	return t->o.f64 ? (void *)((struct state_f64 *)t->st)->params : (void *)((struct state_f32 *)t->st)->params;
}

void *llm_trainer_grads(struct llm_trainer *t)
{
	return t->o.f64 ? (void *)((struct state_f64 *)t->st)->grads : (void *)((struct state_f32 *)t->st)->grads;
}

size_t llm_trainer_n_params(const struct llm_trainer *t) { return t->lo->n_params; }

void llm_trainer_zero_grad(struct llm_trainer *t)
{
	memset(llm_trainer_grads(t), 0, t->lo->n_params * (t->o.f64 ? sizeof(double) : sizeof(float)));
}

enum llm_status llm_trainer_greedy(struct llm_trainer *t, const int32_t *prompt, int n_prompt,
                                   int n_new, int32_t *out, int *n_out)
{
	*n_out = 0;
	int L = t->o.seq_len;
	if (n_prompt < 1 || n_prompt > L)
		return llm_fail(LLM_ERR_RANGE, "prompt of %d tokens (1 to %d)", n_prompt, L);
	int32_t *tok = calloc((size_t)L * 4, sizeof(int32_t));
	if (!tok)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	int32_t *tgt = tok + L, *pos = tgt + L, *start = pos + L;
	for (int i = 0; i < L; i++) {
		tgt[i] = -1;
		pos[i] = i;
	}
	memcpy(tok, prompt, (size_t)n_prompt * sizeof(int32_t));
	int n = n_prompt;
	enum llm_status s = LLM_OK;
	while (*n_out < n_new && n < L) {
		struct llm_train_batch b = { 1, n, tok, tgt, pos, start, NULL };
		if ((s = check_batch(t, &b)))
			break;
		int32_t id;
		if ((s = t->o.f64 ? argmax_last_f64(t, &b, n - 1, &id) : argmax_last_f32(t, &b, n - 1, &id)))
			break;
		out[(*n_out)++] = id;
		tok[n++] = id;
		int eos = 0;
		for (int k = 0; k < t->m->cfg.n_eos; k++)
			eos |= id == t->m->cfg.eos_id[k];
		if (eos)
			break;
	}
	free(tok);
	return s;
}

/* ---- single ops for the tests ------------------------------------------------ */

void llm_train_rmsnorm_f64(double *y, double *rstd, const double *x, const struct llm_weight *w,
                           int64_t n, int64_t d, float eps)
{
	double *wv = malloc((size_t)d * sizeof(double));
	float *tmp = malloc((size_t)d * sizeof(float));
	if (!wv || !tmp)
		goto out;
	llm_weight_row_f32(w, 0, tmp);
	for (int64_t i = 0; i < d; i++)
		wv[i] = tmp[i];
	struct norm_job_f64 j = { y, rstd, x, wv, NULL, NULL, n, d, eps };
	norm_task_f64(&j, 0, 1);
out:
	free(wv);
	free(tmp);
}

void llm_train_rmsnorm_bwd_f64(double *dx, const double *dy, const double *x, const double *rstd,
                               const struct llm_weight *w, int64_t n, int64_t d)
{
	double *wv = malloc((size_t)d * sizeof(double));
	float *tmp = malloc((size_t)d * sizeof(float));
	if (!wv || !tmp)
		goto out;
	llm_weight_row_f32(w, 0, tmp);
	for (int64_t i = 0; i < d; i++)
		wv[i] = tmp[i];
	struct norm_job_f64 j = { NULL, (double *)rstd, x, wv, dy, dx, n, d, 0 };
	norm_bwd_task_f64(&j, 0, 1);
out:
	free(wv);
	free(tmp);
}
