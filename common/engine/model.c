/* common/engine/model.c: Llama-family weight resolution and the forward pass,
 * written once in terms of the backend ops (backend.h); config.json is
 * parsed by config.c.
 *
 * The forward pass is the one of Hugging Face LlamaForCausalLM (and llama2.c
 * run.c, which computes the same thing in f32): per layer
 *   h = x + o_proj(attn(rope(q_proj(n)), rope(k_proj(n)), v_proj(n))), n = rmsnorm(x)
 *   x = h + down_proj(silu(gate_proj(m)) * up_proj(m)),                  m = rmsnorm(h)
 * (in a mixture-of-experts layer the second line's FFN is moe.c's), then
 * logits = lm_head(rmsnorm(x)) for the rows that ask for them. The
 * last layer stores K and V of every row, and computes its attention
 * output and MLP only for those rows (the same bits: every op is row-wise).
 * q and k are in Hugging Face layout: RoPE pairs (j, j + d_head/2).
 *
 * The other families (family.h) change that forward where their traits
 * say, in this one function, not in a copy (Hugging Face Qwen2, Qwen3,
 * Mistral, Gemma2 ForCausalLM): q/k/v biases after the projections
 * (qkv_bias); q and k RMS-normed per head before RoPE (qk_norm); the
 * embedding times sqrt(d_model) (embed_scale); attention through
 * attention_ex with the family's divisor, softcap and the layer's window;
 * the attention and MLP outputs normed before their residual adds
 * (sandwich); GeGLU for SwiGLU (act); logits softcapped (final_softcap);
 * (1 + w) norm weights added once at load (norm_plus_one). */
#define _GNU_SOURCE
#include "model.h"
#include "lora.h"
#include "partition.h"
#include "quantize.h"
#include "fileio.h"

#include <math.h>
#include <stdlib.h>
#include <stdio.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include "banned.h"

/* RoPE inverse frequencies, in f32 as run.c (1 / powf(theta, 2j / d_head)),
 * then rope_scaling's: linear divides them by factor; llama3 is the band
 * scaling of Hugging Face _compute_llama3_parameters; yarn blends the
 * interpolated (f / factor) and original frequencies with a linear ramp
 * over the correction range of beta_fast and beta_slow rotations at the
 * original context (_compute_yarn_parameters; its attention factor scales
 * the scores instead: llm_config_attn_div). */
static void rope_freqs(const struct llm_config *c, float *f)
{
	int half = c->d_head / 2;
	for (int j = 0; j < half; j++)
		f[j] = 1.0f / powf(c->rope_theta, (float)(2 * j) / (float)c->d_head);
	if (c->rope_kind == LLM_ROPE_LINEAR) {
		for (int j = 0; j < half; j++)
			f[j] /= c->rope_factor;
	} else if (c->rope_kind == LLM_ROPE_YARN) {
		/* the dimension at which a frequency turns R times over the original context */
		double dim = c->d_head, base = c->rope_theta, orig = c->rope_orig_ctx;
#define CORR_DIM(r) (dim * log(orig / ((r) * 2 * M_PI)) / (2 * log(base)))
		double lo = CORR_DIM(c->rope_beta_fast), hi = CORR_DIM(c->rope_beta_slow);
#undef CORR_DIM
		if (c->rope_truncate) {
			lo = floor(lo);
			hi = ceil(hi);
		}
		lo = lo > 0 ? lo : 0;
		hi = hi < dim - 1 ? hi : dim - 1;
		if (lo == hi)
			hi += 0.001;
		for (int j = 0; j < half; j++) {
			float ramp = (float)(((double)j - lo) / (hi - lo));
			ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
			float extra = 1.0f - ramp;        /* the share of the original frequency */
			f[j] = f[j] / c->rope_factor * (1.0f - extra) + f[j] * extra;
		}
	}
	if (c->rope_kind != LLM_ROPE_LLAMA3)
		return;
	double low_wl = c->rope_orig_ctx / c->rope_low_freq;
	double high_wl = c->rope_orig_ctx / c->rope_high_freq;
	for (int j = 0; j < half; j++) {
		double wl = 2 * M_PI / f[j];
		if (wl < high_wl)
			continue;
		if (wl > low_wl) {
			f[j] = f[j] / c->rope_factor;
		} else {
			double sm = (c->rope_orig_ctx / wl - c->rope_low_freq) / (c->rope_high_freq - c->rope_low_freq);
			f[j] = (float)((1 - sm) * f[j] / c->rope_factor + sm * f[j]);
		}
	}
}

/* ---- weights ----------------------------------------------------------- */

static enum llm_status weight(struct llm_model *m, struct llm_weight *w, int64_t rows, int64_t cols,
                              const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static enum llm_status weight(struct llm_model *m, struct llm_weight *w, int64_t rows, int64_t cols,
                              const char *fmt, ...)
{
	char name[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(name, sizeof name, fmt, ap);
	va_end(ap);
	LLM_TRY(llm_ckpt_weight(&m->ck, name, w));
	if (w->rows != rows || w->cols != cols)
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': shape %lldx%lld, config.json implies %lldx%lld",
		                m->ck.path, name, (long long)w->rows, (long long)w->cols,
		                (long long)rows, (long long)cols);
	m->weight_bytes += llm_weight_data_bytes(w) + llm_weight_scale_bytes(w);
	return LLM_OK;
}

/* A vector of the family (family.h): weight NAME, 1 x N, converted to F32
 * into the model's arena at *AT (as 1 + w with PLUS_ONE: the (1 + w) norms
 * of norm_plus_one, added once here in f32 as Hugging Face computes
 * 1.0 + weight.float()), which W then points at. */
static enum llm_status vec(struct llm_model *m, struct llm_weight *w, int64_t n, int plus_one, float **at,
                           const char *fmt, ...) __attribute__((format(printf, 6, 7)));

static enum llm_status vec(struct llm_model *m, struct llm_weight *w, int64_t n, int plus_one, float **at,
                           const char *fmt, ...)
{
	char name[256];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(name, sizeof name, fmt, ap);
	va_end(ap);
	LLM_TRY(weight(m, w, 1, n, "%s", name));
	float *f = *at;
	llm_weight_row_f32(w, 0, f);
	if (plus_one)
		for (int64_t i = 0; i < n; i++)
			f[i] += 1.0f;
	w->dtype = LLM_DTYPE_F32;
	w->data = f;
	w->scale = NULL;
	w->scale_rows = w->scale_cols = w->block_rows = w->block_cols = 0;
	*at = f + n;
	return LLM_OK;
}

/* A norm: in place, or with norm_plus_one a vector as 1 + w */
static enum llm_status norm_weight(struct llm_model *m, struct llm_weight *w, float **at, const char *name)
{
	if (m->cfg.fam->norm_plus_one)
		return vec(m, w, m->cfg.d_model, 1, at, "%s", name);
	return weight(m, w, 1, m->cfg.d_model, "%s", name);
}

/* Parse the checkpoint's config.json into m->cfg. */
static enum llm_status open_config(struct llm_model *m, const char *path)
{
	const struct llm_aux *cj = llm_ckpt_aux(&m->ck, "config.json");
	if (!cj && (m->ck.is_dir || m->ck.part))
		return llm_fail(LLM_ERR_FORMAT, "%s: no config.json", path);
	if (!cj && !strcmp(path, "-"))
		return llm_fail(LLM_ERR_FORMAT, "-: no config.json in the stream's __metadata__");
	if (!cj) {            /* a file: its metadata, then its directory (ckpt.c) */
		char *dir = llm_path_dir(path);
		enum llm_status s = llm_fail(LLM_ERR_FORMAT, "%s: no config.json in its __metadata__ nor beside it in %s",
		                             path, dir ? dir : "its directory");
		free(dir);
		return s;
	}
	char cpath[1024];
	snprintf(cpath, sizeof cpath, "%s%sconfig.json", path, m->ck.is_dir || m->ck.part ? "/" : ": ");
	return llm_config_parse(&m->cfg, cj->data, cj->len, cpath);
}

/* Layer L's router and experts into L->moe, their weights at EW (n_expert
 * * 3), by the family's names (config.h, enum llm_moe_names). */
static enum llm_status resolve_experts(struct llm_model *m, struct llm_layer *L, int l, struct llm_weight *ew)
{
	static const char *proj[2][3] = { { "w1", "w3", "w2" }, { "gate_proj", "up_proj", "down_proj" } };
	const struct llm_moe_config *e = &m->cfg.moe;
	int64_t dm = m->cfg.d_model, ff = m->d_ff_expert_loc;
	int qwen = e->names == LLM_MOE_NAMES_QWEN3;
	const char *p = qwen ? "mlp" : "block_sparse_moe";
	L->moe.expert = ew;
	LLM_TRY(weight(m, &L->moe.router, e->n_expert, dm, "model.layers.%d.%s.gate.weight", l, p));
	size_t before = m->weight_bytes;
	for (int x = 0; x < e->n_expert; x++)
		for (int i = 0; i < 3; i++)
			LLM_TRY(weight(m, &ew[3 * x + i], i == 2 ? dm : ff, i == 2 ? ff : dm,
			               "model.layers.%d.%s.experts.%d.%s.weight", l, p, x, proj[qwen][i]));
	m->expert_bytes += m->weight_bytes - before;
	return LLM_OK;
}

/* Resolve this process's weights (layers [layer_begin, layer_end), local
 * head, FFN and vocabulary counts; the embedding when the first layer is
 * ours, norm and lm_head when the last is), checking shapes. */
static enum llm_status resolve(struct llm_model *m, const char *path)
{
	const struct llm_config *c = &m->cfg;
	const struct llm_family *f = c->fam;
	enum llm_status s;
	int64_t dq = (int64_t)m->n_head_loc * c->d_head, dkv = (int64_t)m->n_kv_head_loc * c->d_head;
	int64_t ff = m->d_ff_loc, nv = m->n_vocab_loc;
	/* the family's vectors, converted into one arena */
	int64_t per = (f->qkv_bias ? dq + 2 * dkv : 0) + (f->qk_norm ? 2 * c->d_head : 0)
	              + (f->norm_plus_one ? (f->sandwich ? 4 : 2) * (int64_t)c->d_model : 0);
	int64_t n_vec = per * (m->layer_end - m->layer_begin) + (f->norm_plus_one ? c->d_model : 0);
	m->layers = calloc((size_t)c->n_layer, sizeof *m->layers);
	m->inv_freq = malloc((size_t)(c->d_head / 2) * sizeof(float));
	m->vecs = n_vec ? malloc((size_t)n_vec * sizeof(float)) : NULL;
	size_t n_ex = (size_t)c->n_layer * (size_t)c->moe.n_expert * 3;
	if (n_ex)
		m->experts = calloc(n_ex, sizeof *m->experts);
	if (!m->layers || !m->inv_freq || (n_vec && !m->vecs) || (n_ex && !m->experts))
		return llm_fail(LLM_ERR_NOMEM, "%s: out of memory", path);
	float *at = m->vecs;
	rope_freqs(c, m->inv_freq);
	m->attn_ex = c->window || c->attn_softcap > 0 || llm_config_attn_div(c) != sqrtf((float)c->d_head);
	int first = m->layer_begin == 0, last = m->layer_end == c->n_layer;
	if (first && (s = weight(m, &m->embed, nv, c->d_model, "model.embed_tokens.weight")))
		return s;
	for (int l = m->layer_begin; l < m->layer_end; l++) {
		struct llm_layer *L = &m->layers[l];
		const char *p = "model.layers";
		char nm[256];
#define NM(what) (snprintf(nm, sizeof nm, "%s.%d.%s", p, l, what), nm)
		LLM_TRY(norm_weight(m, &L->attn_norm, &at, NM("input_layernorm.weight")));
		LLM_TRY(weight(m, &L->wq, dq, c->d_model, "%s.%d.self_attn.q_proj.weight", p, l));
		LLM_TRY(weight(m, &L->wk, dkv, c->d_model, "%s.%d.self_attn.k_proj.weight", p, l));
		LLM_TRY(weight(m, &L->wv, dkv, c->d_model, "%s.%d.self_attn.v_proj.weight", p, l));
		LLM_TRY(weight(m, &L->wo, c->d_model, dq, "%s.%d.self_attn.o_proj.weight", p, l));
		if (f->qkv_bias) {
			LLM_TRY(vec(m, &L->bq, dq, 0, &at, "%s.%d.self_attn.q_proj.bias", p, l));
			LLM_TRY(vec(m, &L->bk, dkv, 0, &at, "%s.%d.self_attn.k_proj.bias", p, l));
			LLM_TRY(vec(m, &L->bv, dkv, 0, &at, "%s.%d.self_attn.v_proj.bias", p, l));
		}
		if (f->qk_norm) {
			LLM_TRY(vec(m, &L->q_norm, c->d_head, 0, &at, "%s.%d.self_attn.q_norm.weight", p, l));
			LLM_TRY(vec(m, &L->k_norm, c->d_head, 0, &at, "%s.%d.self_attn.k_norm.weight", p, l));
		}
		if (f->sandwich) {
			LLM_TRY(norm_weight(m, &L->post_attn_norm, &at, NM("post_attention_layernorm.weight")));
			LLM_TRY(norm_weight(m, &L->ffn_norm, &at, NM("pre_feedforward_layernorm.weight")));
			LLM_TRY(norm_weight(m, &L->post_ffn_norm, &at, NM("post_feedforward_layernorm.weight")));
		} else {
			LLM_TRY(norm_weight(m, &L->ffn_norm, &at, NM("post_attention_layernorm.weight")));
		}
#undef NM
		if (llm_moe_layer(c, l)) {
			LLM_TRY(resolve_experts(m, L, l, m->experts + (size_t)l * (size_t)c->moe.n_expert * 3));
			if (l == m->layer_begin)
				m->wdtype = L->wq.dtype;
			continue;
		}
		LLM_TRY(weight(m, &L->w_gate, ff, c->d_model, "%s.%d.mlp.gate_proj.weight", p, l));
		LLM_TRY(weight(m, &L->w_up, ff, c->d_model, "%s.%d.mlp.up_proj.weight", p, l));
		LLM_TRY(weight(m, &L->w_down, c->d_model, ff, "%s.%d.mlp.down_proj.weight", p, l));
		if (l == m->layer_begin)
			m->wdtype = L->wq.dtype;
	}
	if (!last)
		return LLM_OK;
	LLM_TRY(norm_weight(m, &m->norm, &at, "model.norm.weight"));
	if (!c->tied || llm_ckpt_find(&m->ck, "lm_head.weight"))
		return weight(m, &m->lm_head, nv, c->d_model, "lm_head.weight");
	if (first) {
		m->lm_head = m->embed;
		return LLM_OK;
	}
	/* tied, on a last stage without the embedding: its lm_head slice */
	return weight(m, &m->lm_head, nv, c->d_model, "model.embed_tokens.weight");
}

static void share_all(struct llm_model *m)
{
	const struct llm_config *c = &m->cfg;
	m->layer_begin = 0;
	m->layer_end = c->n_layer;
	m->n_head_loc = c->n_head;
	m->n_kv_head_loc = c->n_kv_head;
	m->d_ff_loc = c->d_ff;
	m->d_ff_expert_loc = c->moe.d_ff_expert;
	m->vocab_begin = 0;
	m->n_vocab_loc = c->n_vocab;
}

enum llm_status llm_model_open(struct llm_model *m, const char *path)
{
	memset(m, 0, sizeof *m);
	LLM_TRY(llm_ckpt_open(&m->ck, path));
	enum llm_status s = open_config(m, path);
	if (!s) {
		share_all(m);
		s = resolve(m, path);
	}
	if (s)
		llm_model_close(m);
	return s;
}

int llm_model_is_partitioned(const char *path)
{
	return llm_partition_is_dir(path);
}

enum llm_status llm_dist_always(int *always)
{
	const char *v = getenv("LLM_DIST");
	*always = v && !strcmp(v, "always");
	if (v && *v && !*always)
		return llm_fail(LLM_ERR_USAGE, "LLM_DIST=%s: not always (or unset)", v);
	return LLM_OK;
}

enum llm_status llm_model_open_one_rank(struct llm_model *m, const char *path, struct llm_comm *world)
{
	LLM_TRY(llm_model_open(m, path));
	struct llm_model_dist *d = m->dist = calloc(1, sizeof *m->dist);
	enum llm_status s = d ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "%s: out of memory", path);
	if (!s)
		s = llm_grid_init(&d->grid, world, 1, 1);
	if (!s && !(d->v0 = malloc(2 * sizeof *d->v0)))
		s = llm_fail(LLM_ERR_NOMEM, "%s: out of memory", path);
	if (s) {
		llm_model_close(m);
		return s;
	}
	/* the whole model is rank 0's share: every layer, the whole vocabulary */
	d->v0[0] = 0;
	d->v0[1] = m->cfg.n_vocab;
	d->first = d->last = 1;
	d->n_micro = 1;
	d->always = 1;
	return LLM_OK;
}

enum llm_status llm_model_open_dist(struct llm_model *m, const char *dir, struct llm_comm *world)
{
	memset(m, 0, sizeof *m);
	struct llm_model_dist *d = m->dist = calloc(1, sizeof *m->dist);
	if (!d)
		return llm_fail(LLM_ERR_NOMEM, "%s: out of memory", dir);
	struct llm_partition *rec;
	enum llm_status s = llm_partition_load(&rec, dir);
	if (s)
		goto fail;
	int T = rec->tp, P = rec->pp;
	s = llm_partition_check_world(rec, world->size, dir);
	llm_partition_free(rec);
	/* the one collective, before anything a single rank can fail at (its
	 * own file), so a failing rank never leaves the others inside it */
	if (s || (s = llm_grid_init(&d->grid, world, T, P)) || (s = llm_dist_always(&d->always)))
		goto fail;
	if ((s = llm_ckpt_open_rank(&m->ck, dir, world->rank)) || (s = open_config(m, dir)))
		goto fail;
	const struct llm_config *c = &m->cfg;
	const struct llm_partition *p = m->ck.part;
	const struct llm_part_rank *me = &p->ranks[world->rank];
	int t = me->tp_rank;
	if (p->tp != T || p->pp != P || me->stage != d->grid.stage || t != d->grid.tp_rank ||
	    p->n_layer != c->n_layer || c->n_head % T || c->d_ff % T || c->moe.d_ff_expert % T ||
	    (c->n_kv_head % T && T % c->n_kv_head)) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: %s (--tp %d x --pp %d, %d layers) does not fit the grid or "
		             "config.json (%d layers, %d heads, %d kv heads, intermediate_size %d)", dir, me->file,
		             p->tp, p->pp, p->n_layer, c->n_layer, c->n_head, c->n_kv_head, c->d_ff);
		goto fail;
	}
	m->layer_begin = me->layer_begin;
	m->layer_end = me->layer_end;
	m->n_head_loc = c->n_head / T;
	m->n_kv_head_loc = T <= c->n_kv_head ? c->n_kv_head / T : 1;
	m->d_ff_loc = c->d_ff / T;
	m->d_ff_expert_loc = c->moe.d_ff_expert / T;
	llm_part_range(c->n_vocab, T, t, &m->vocab_begin, &m->n_vocab_loc);
	d->v0 = malloc(((size_t)T + 1) * sizeof *d->v0);
	if (!d->v0) {
		s = llm_fail(LLM_ERR_NOMEM, "%s: out of memory", dir);
		goto fail;
	}
	for (int r = 0; r <= T; r++)
		d->v0[r] = (int64_t)c->n_vocab * r / T;
	d->first = m->layer_begin == 0;
	d->last = m->layer_end == c->n_layer;
	/* micro-batches per pipeline step: 2P leaves a bubble of (P-1)/(3P-1) */
	d->n_micro = 2 * P;
	const char *mbs = getenv("LLM_PP_MICRO");
	long nm = mbs && *mbs ? strtol(mbs, NULL, 10) : 0;
	if (nm > 0 && nm <= 1024)
		d->n_micro = (int)nm;
	char rpath[1200];
	snprintf(rpath, sizeof rpath, "%s/%s", dir, me->file);
	if ((s = resolve(m, rpath)))
		goto fail;
	return LLM_OK;
fail:
	llm_model_close(m);
	return s;
}

/* ---- weight placement ---------------------------------------------------
 * Used in place, the weights are the checkpoint's file mapping: 4 KiB pages,
 * so a batched CPU step that streams all of them misses the TLB on every
 * page (a SmolLM2-135M FP8 step reads 40000 of them). Copied into
 * anonymous memory advised for transparent huge pages, the same bytes sit
 * in 2 MiB pages. */

const struct llm_weight *llm_layer_weight(const struct llm_layer *L, int i)
{
	const struct llm_weight *w[LLM_LAYER_WEIGHTS] = { &L->attn_norm, &L->wq, &L->wk, &L->wv, &L->wo,
	                                                  &L->ffn_norm, &L->w_gate, &L->w_up, &L->w_down };
	return w[i];
}

/* The weights of this process (unset ones have no data), lm_head last. */
static int model_weights(struct llm_model *m, struct llm_weight **ws)
{
	int n = 0;
	ws[n++] = &m->embed;
	ws[n++] = &m->norm;
	for (int l = m->layer_begin; l < m->layer_end; l++) {
		struct llm_layer *L = &m->layers[l];
		for (int i = 0; i < LLM_LAYER_WEIGHTS; i++)
			ws[n++] = (struct llm_weight *)llm_layer_weight(L, i);
		if (!L->moe.router.data)
			continue;
		ws[n++] = &L->moe.router;
		for (int i = 0; i < 3 * m->cfg.moe.n_expert; i++)
			ws[n++] = &L->moe.expert[i];
	}
	ws[n++] = &m->lm_head;
	return n;
}

#define HUGE_PAGE ((size_t)2 << 20)
#define ALIGN64(n) (((n) + 63) & ~(size_t)63)

/* A copy under way: the mapping, and one job per weight and scale, in the
 * order model_weights() lists them (commit walks them in that order). */
struct llm_model_copy {
	atomic_int stop;            /* llm_model_copy_stop: read no further */
	void *map;
	size_t len, total;
	struct llm_ckpt_copy *jobs;
	size_t n_jobs;
};

void llm_model_copy_abort(struct llm_model_copy *c)
{
	if (!c)
		return;
	if (c->map)
		munmap(c->map, c->len);
	free(c->jobs);
	free(c);
}

/* The weights this process reads, tied lm_head left out (one copy). */
static int copy_list(struct llm_model *m, struct llm_weight ***out, int *tied)
{
	size_t per = LLM_LAYER_WEIGHTS + 1 + 3 * (size_t)m->cfg.moe.n_expert;
	struct llm_weight **ws = malloc(((size_t)(m->layer_end - m->layer_begin) * per + 3) * sizeof *ws);
	if (!ws)
		return -1;
	int n = model_weights(m, ws);
	*tied = m->embed.data && m->lm_head.data == m->embed.data;
	*out = ws;
	return n - *tied;
}

enum llm_status llm_model_copy_begin(struct llm_model *m, struct llm_model_copy **out)
{
	*out = NULL;
	struct llm_weight **ws;
	int tied, n = copy_list(m, &ws, &tied);
	struct llm_model_copy *c = n < 0 ? NULL : calloc(1, sizeof *c);
	if (c)
		c->jobs = malloc((2 * (size_t)n + 1) * sizeof *c->jobs);
	if (!c || !c->jobs) {
		if (n >= 0)
			free(ws);
		llm_model_copy_abort(c);
		return llm_fail(LLM_ERR_NOMEM, "%s: out of memory", m->ck.path);
	}
	for (int i = 0; i < n; i++)
		if (ws[i]->data)
			c->total += ALIGN64(llm_weight_data_bytes(ws[i])) + ALIGN64(llm_weight_scale_bytes(ws[i]));
	c->len = (c->total + 2 * HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
	void *map = mmap(NULL, c->len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (map == MAP_FAILED) {
		size_t len = c->len;
		free(ws);
		llm_model_copy_abort(c);
		return llm_fail(LLM_ERR_NOMEM, "%s: cannot map %zu bytes for the weights", m->ck.path, len);
	}
	c->map = map;
	uint8_t *at = (uint8_t *)(((uintptr_t)map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
	madvise(at, c->total, MADV_HUGEPAGE);   /* advice: without THP the copy is plain pages */
	for (int i = 0; i < n; i++) {
		struct llm_weight *w = ws[i];
		if (!w->data)
			continue;
		size_t nb = llm_weight_data_bytes(w), ns = llm_weight_scale_bytes(w);
		c->jobs[c->n_jobs++] = (struct llm_ckpt_copy){ at, w->data, nb };
		at += ALIGN64(nb);
		if (ns) {
			c->jobs[c->n_jobs++] = (struct llm_ckpt_copy){ at, w->scale, ns };
			at += ALIGN64(ns);
		}
	}
	free(ws);
	*out = c;
	return LLM_OK;
}

enum llm_status llm_model_copy_read(const struct llm_model *m, struct llm_model_copy *c, int n_threads)
{
	/* a stop is seen between 4 MiB pieces: a process that ends right
	 * after its first token does not wait for a whole embedding */
	return llm_ckpt_copy_out(&m->ck, c->jobs, c->n_jobs, n_threads, &c->stop);
}

void llm_model_copy_stop(struct llm_model_copy *c)
{
	atomic_store(&c->stop, 1);
}

void llm_model_copy_commit(struct llm_model *m, struct llm_model_copy *c)
{
	struct llm_weight **ws;
	int tied, n = copy_list(m, &ws, &tied);
	if (n < 0) {            /* no memory for the list: keep reading the file */
		llm_model_copy_abort(c);
		return;
	}
	for (int i = 0, k = 0; i < n; i++) {
		struct llm_weight *w = ws[i];
		if (!w->data)
			continue;
		const struct llm_tensor *t = llm_ckpt_find(&m->ck, w->name);
		w->data = c->jobs[k++].dst;
		if (llm_weight_scale_bytes(w))
			w->scale = (const float *)c->jobs[k++].dst;
		if (t)
			llm_ckpt_release(&m->ck, t);   /* the file's pages: no longer ours to keep */
	}
	if (tied) {
		m->lm_head.data = m->embed.data;
		m->lm_head.scale = m->embed.scale;
	}
	free(m->head_fp8);      /* an FP8 head quantized at load: now in the copy */
	m->head_fp8 = NULL;
	uint8_t *base = (uint8_t *)(((uintptr_t)c->map + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
	mprotect(base, c->total ? c->total : 1, PROT_READ);
	free(ws);
	m->wmap = c->map;
	m->wmap_len = c->len;
	free(c->jobs);
	free(c);
}

enum llm_status llm_model_fp8_head(struct llm_model *m, int *done)
{
	struct llm_weight *w = &m->lm_head;
	if (done)
		*done = 0;
	if (!w->data || w->dtype == LLM_DTYPE_E4M3)
		return LLM_OK;
	if (m->wmap)
		return llm_fail(LLM_ERR_USAGE, "%s: the lm_head is quantized before the weights are copied", m->ck.path);
	int64_t rows = w->rows, cols = w->cols;
	size_t codes = ALIGN64((size_t)(rows * cols));
	uint8_t *q = malloc(codes + (size_t)rows * sizeof(float));
	float *row = malloc((size_t)cols * sizeof *row);
	if (!q || !row) {
		free(q);
		free(row);
		return llm_fail(LLM_ERR_NOMEM, "%s: out of memory for an FP8 lm_head of %lld x %lld",
		                m->ck.path, (long long)rows, (long long)cols);
	}
	float *scale = (float *)(q + codes);      /* (rows, 1) */
	size_t es = llm_dtype_size(w->dtype);
	for (int64_t r = 0; r < rows; r++) {
		llm_to_f32(row, (const uint8_t *)w->data + (size_t)(r * cols) * es, w->dtype, (size_t)cols);
		llm_quantize_band(row, 1, cols, cols, q + (size_t)(r * cols), &scale[r]);
	}
	free(row);
	int tied = m->embed.data && w->data == m->embed.data;
	if (!tied)            /* the plain head no longer counts; a tied one is still the embedding */
		m->weight_bytes -= llm_weight_data_bytes(w);
	w->dtype = LLM_DTYPE_E4M3;
	w->data = q;
	w->scale = scale;
	w->scale_rows = rows;
	w->scale_cols = 1;
	w->block_rows = 1;
	w->block_cols = cols;
	m->weight_bytes += llm_weight_data_bytes(w) + llm_weight_scale_bytes(w);
	free(m->head_fp8);
	m->head_fp8 = q;
	if (done)
		*done = 1;
	return LLM_OK;
}

enum llm_status llm_model_copy_weights(struct llm_model *m)
{
	if (m->wmap)
		return LLM_OK;
	struct llm_model_copy *c;
	LLM_TRY(llm_model_copy_begin(m, &c));
	enum llm_status s = llm_model_copy_read(m, c, 0);
	if (s) {
		llm_model_copy_abort(c);
		return s;
	}
	llm_model_copy_commit(m, c);
	return LLM_OK;
}

int llm_thp_available(void)
{
	FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
	if (!f)
		return 0;
	char b[128] = "";
	int ok = fgets(b, sizeof b, f) && (strstr(b, "[always]") || strstr(b, "[madvise]"));
	fclose(f);
	return ok;
}

size_t llm_mem_available(void)
{
	FILE *f = fopen("/proc/meminfo", "r");
	if (!f)
		return 0;
	char line[256];
	unsigned long long kb = 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (size_t)kb * 1024;
}

void llm_model_close(struct llm_model *m)
{
	if (m->dist) {
		if (m->dist->dtp)
			llm_comm_free(m->dist->dtp);
		if (m->dist->dpp)
			llm_comm_free(m->dist->dpp);
		free(m->dist->zero);
		if (m->dist->grid.world)
			llm_grid_free(&m->dist->grid);
		free(m->dist->v0);
		free(m->dist);
	}
	free(m->layers);
	free(m->experts);
	free(m->inv_freq);
	free(m->vecs);
	if (m->wmap)
		munmap(m->wmap, m->wmap_len);
	free(m->head_fp8);
	if (m->ck.path || m->ck.files)
		llm_ckpt_close(&m->ck);
	memset(m, 0, sizeof *m);
}

enum llm_status llm_model_check_backend(const struct llm_model *m, struct llm_backend *be)
{
	const struct llm_config *c = &m->cfg;
	const struct llm_layer *L = &m->layers[m->layer_begin];
	const struct llm_moe_weights *E = &L->moe;
	const struct llm_weight *ws[] = { &m->embed, &m->norm, &m->lm_head, &L->wq, &L->wk, &L->wv,
	                                  &L->wo, &L->w_gate, &L->w_up, &L->w_down, &L->attn_norm,
	                                  &E->router, E->expert ? &E->expert[0] : &L->w_gate,
	                                  E->expert ? &E->expert[2] : &L->w_down };
	if (m->dist && strcmp(be->ops->name, "cpu") && !be->ops->comm_open)
		return llm_fail(LLM_ERR_UNSUPPORTED, "backend %s: a distributed run on it needs its communicator "
		                "(NCCL), which this build lacks: use --backend cpu, or build with NCCL", be->ops->name);
	/* the family's ops (family.h): one line naming the first one missing */
	const struct llm_family *f = m->cfg.fam;
	const struct { int need, have; const char *name, *why; } fops[] = {
		{ m->attn_ex, be->ops->attention_ex != NULL, "attention_ex",
		  "a sliding window, an attention softcap or another score scale" },
		{ f->qkv_bias, be->ops->add_bias != NULL, "add_bias", "q/k/v biases" },
		{ f->act == LLM_ACT_GELU_TANH, be->ops->geglu != NULL, "geglu", "GeGLU" },
		{ f->embed_scale, be->ops->scale != NULL, "scale", "the embedding scale" },
		{ m->cfg.final_softcap > 0, be->ops->softcap != NULL, "softcap", "the final logit softcap" },
	};
	for (size_t i = 0; i < sizeof fops / sizeof *fops; i++)
		if (fops[i].need && !fops[i].have)
			return llm_fail(LLM_ERR_UNSUPPORTED, "backend %s: model_type %s needs op %s (%s), which this "
			                "backend lacks: use --backend cpu", be->ops->name, f->model_type, fops[i].name,
			                fops[i].why);
	int lora = 0;
	for (int i = 1; i <= m->n_lora; i++)
		lora |= m->lora[i] != NULL;
	if (lora && m->dist)
		return llm_fail(LLM_ERR_UNSUPPORTED, "a LoRA adapter on a distributed run is not supported: "
		                "merge it into the checkpoint (llm-finetune --merge) and partition that");
	if (c->moe.n_expert && strcmp(be->ops->name, "cpu"))
		return llm_fail(LLM_ERR_UNSUPPORTED, "backend %s: the mixture-of-experts FFN (%d experts) runs on "
		                "the cpu backend only: use --backend cpu", be->ops->name, c->moe.n_expert);
	if (lora && strcmp(be->ops->name, "cpu"))
		return llm_fail(LLM_ERR_UNSUPPORTED, "backend %s: a LoRA adapter is applied on the cpu backend "
		                "only: use --backend cpu, or merge it (llm-finetune --merge)", be->ops->name);
	for (size_t i = 0; i < sizeof ws / sizeof *ws; i++) {
		if (!ws[i]->data)
			continue;             /* not on this stage */
		enum llm_op op = i == 0 ? LLM_OP_EMBED : i == 1 || i == 10 ? LLM_OP_RMSNORM : LLM_OP_MATMUL;
		if (!be->ops->supports(op, ws[i]->dtype, LLM_DTYPE_F32))
			return llm_fail(LLM_ERR_UNSUPPORTED, "backend %s: op %s on tensor '%s' (%s)",
			                be->ops->name, llm_op_name(op), ws[i]->name, llm_dtype_name(ws[i]->dtype));
	}
	return LLM_OK;
}

enum llm_status llm_model_dist_bind(struct llm_model *m, struct llm_backend *be)
{
	struct llm_model_dist *d = m->dist;
	if (!d || !be->ops->comm_open || d->dbe)
		return LLM_OK;
	d->zero = calloc((size_t)m->cfg.d_model, sizeof(float));
	if (!d->zero)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	/* every rank opens both, size 1 or not, so that the collectives of
	 * the bootstrap match on every rank */
	enum llm_status st = be->ops->comm_open(be, d->grid.tp, &d->dtp);
	if (st)
		return llm_fail_prefix(st, "backend %s: the tensor-parallel group's communicator", be->ops->name);
	st = be->ops->comm_open(be, d->grid.pp, &d->dpp);
	if (st)
		return llm_fail_prefix(st, "backend %s: the pipeline group's communicator", be->ops->name);
	d->dbe = be;
	return LLM_OK;
}

/* ---- scratch ----------------------------------------------------------- */

static size_t scratch_floats(const struct llm_config *c, int max_tok, int max_logits)
{
	size_t t = (size_t)max_tok, dq = (size_t)c->n_head * (size_t)c->d_head;
	size_t dkv = (size_t)c->n_kv_head * (size_t)c->d_head;
	size_t dx = (size_t)c->d_model > dq ? (size_t)c->d_model : dq;
	return t * (2 * dx + dq + 2 * dkv + dq + 2 * (size_t)c->d_ff) + (size_t)max_logits * (size_t)c->d_model +
	       llm_moe_scratch_floats(c, max_tok);
}

size_t llm_scratch_bytes(const struct llm_config *c, int max_tok, int max_logits)
{
	return scratch_floats(c, max_tok, max_logits) * sizeof(float) + (5 * (size_t)max_logits + (size_t)max_tok) * sizeof(int32_t);
}

enum llm_status llm_scratch_init(struct llm_scratch *s, const struct llm_model *m,
                                 struct llm_backend *be, int max_tok, int max_logits)
{
	memset(s, 0, sizeof *s);
	if (max_tok < 1 || max_logits < 1 || max_logits > max_tok)
		return llm_fail(LLM_ERR_USAGE, "scratch: %d tokens, %d logit rows", max_tok, max_logits);
	const struct llm_config *c = &m->cfg;
	float *p;
	LLM_TRY(be->ops->alloc(be, scratch_floats(c, max_tok, max_logits) * sizeof(float), (void **)&p));
	s->be = be;
	s->max_tok = max_tok;
	s->max_logits = max_logits;
	size_t t = (size_t)max_tok, dq = (size_t)c->n_head * (size_t)c->d_head;
	size_t dkv = (size_t)c->n_kv_head * (size_t)c->d_head;
	size_t dx = (size_t)c->d_model > dq ? (size_t)c->d_model : dq;
	s->x = p;   p += t * dx;
	s->xb = p;  p += t * dx;
	s->q = p;   p += t * dq;
	s->k = p;   p += t * dkv;
	s->v = p;   p += t * dkv;
	s->att = p; p += t * dq;
	s->hb = p;  p += t * (size_t)c->d_ff;
	s->hb2 = p; p += t * (size_t)c->d_ff;
	s->xl = p;  p += (size_t)max_logits * (size_t)c->d_model;
	int moe_fail = llm_moe_scratch_init(&s->moe, c, p, max_tok) != LLM_OK;
	s->rows = malloc(5 * (size_t)max_logits * sizeof(int32_t));
	s->sub = s->rows + max_logits;
	s->lrows = malloc(2 * (size_t)max_tok * sizeof(int32_t));
	s->lsub = s->lrows ? s->lrows + max_tok : NULL;
	int dist_fail = 0;
	if (m->dist) {
		int64_t most = 0;
		for (int r = 0; r < m->dist->grid.n_tp; r++)
			if (m->dist->v0[r + 1] - m->dist->v0[r] > most)
				most = m->dist->v0[r + 1] - m->dist->v0[r];
		s->tok_loc = malloc((size_t)max_tok * sizeof(int32_t));
		s->lbuf = malloc((size_t)max_logits * (size_t)most * sizeof(float));
		dist_fail = !s->tok_loc || !s->lbuf;
	}
	if (!s->rows || !s->lrows || dist_fail || moe_fail) {
		llm_scratch_free(s);
		return llm_fail(LLM_ERR_NOMEM, "scratch: out of memory");
	}
	return LLM_OK;
}

void llm_scratch_free(struct llm_scratch *s)
{
	if (s->be && s->x)
		s->be->ops->release(s->be, s->x);
	free(s->rows);
	free(s->lrows);
	free(s->tok_loc);
	free(s->lbuf);
	llm_moe_scratch_free(&s->moe);
	memset(s, 0, sizeof *s);
}

/* ---- forward ----------------------------------------------------------- */

/* Distributed pieces (partition.h, "Forward on rank (p, t)"). Buffers are
 * the backend's memory: host memory through the grid's MPI communicators
 * (the CPU backend), or device memory through the backend's own (d->dtp,
 * d->dpp: NCCL), after the backend's queued work is done. */

/* The communicator of the TP or PP group for the activations, the backend
 * synchronized first where it has its own. */
static enum llm_status act_comm(struct llm_model_dist *d, int pp, struct llm_comm **c)
{
	*c = pp ? d->grid.pp : d->grid.tp;
	if (!d->dbe)
		return LLM_OK;
	*c = pp ? d->dpp : d->dtp;
	return d->dbe->ops->sync ? d->dbe->ops->sync(d->dbe) : LLM_OK;
}

/* All-reduce(sum) of BUF (n) f32 over the TP group of this stage. */
static enum llm_status tp_sum(struct llm_model_dist *d, float *buf, size_t n)
{
	struct llm_comm *c;
	if (d->grid.n_tp == 1 && !d->always)
		return LLM_OK;
	d->stats.tp_allreduce += n * sizeof(float);
	LLM_TRY(act_comm(d, 0, &c));
	return llm_comm_allreduce_sum_f32(c, buf, n);
}

/* Stage 0 with T > 1: rows of tokens in this rank's vocabulary slice, zero
 * rows elsewhere, summed over the TP group (exact: one non-zero addend). */
static enum llm_status embed_dist(struct llm_model *m, struct llm_backend *be, struct llm_scratch *s,
                                  const struct llm_batch *b, float *x)
{
	struct llm_model_dist *d = m->dist;
	int64_t n = b->n_tok, dm = m->cfg.d_model;
	for (int64_t i = 0; i < n; i++) {
		int64_t id = (int64_t)b->token[i] - m->vocab_begin;
		s->tok_loc[i] = id >= 0 && id < m->n_vocab_loc ? (int32_t)id : 0;
	}
	LLM_TRY(be->ops->embed(be, llm_view_f32(x, n, dm), s->tok_loc, &m->embed));
	for (int64_t i = 0; i < n; i++) {
		int64_t id = (int64_t)b->token[i] - m->vocab_begin;
		if (id >= 0 && id < m->n_vocab_loc)
			continue;
		if (d->dbe)             /* device memory: a row of zeros copied in */
			LLM_TRY(be->ops->copy_in(be, x + i * dm, d->zero, (size_t)dm * sizeof(float)));
		else
			memset(x + i * dm, 0, (size_t)dm * sizeof(float));
	}
	return tp_sum(d, x, (size_t)(n * dm));
}

/* Stage boundary: x (n, d_model) is the one tensor that crosses (the
 * residual stream already holds the layer output: residual and hidden
 * state fused). TP rank t sends elements [t*N/T, (t+1)*N/T) of the flat x
 * (N = n * d_model) to its peer in the next stage, which all-gathers the T
 * pieces inside its stage. */
static enum llm_status stage_send(struct llm_model_dist *d, const float *x, int64_t n_el)
{
	int64_t a, len;
	llm_part_range(n_el, d->grid.n_tp, d->grid.tp_rank, &a, &len);
	d->stats.boundary_sent += (uint64_t)len * sizeof(float);
	d->stats.boundary_unfused += 2 * (uint64_t)len * sizeof(float);
	d->stats.boundary_whole += (uint64_t)n_el * sizeof(float);
	struct llm_comm *c;
	LLM_TRY(act_comm(d, 1, &c));
	return llm_comm_send(c, x + a, (size_t)len * sizeof(float), d->grid.next, 1);
}

static enum llm_status stage_recv(struct llm_model_dist *d, float *x, int64_t n_el)
{
	int T = d->grid.n_tp;
	int64_t a, len;
	struct llm_comm *c;
	llm_part_range(n_el, T, d->grid.tp_rank, &a, &len);
	LLM_TRY(act_comm(d, 1, &c));
	LLM_TRY(llm_comm_recv(c, x + a, (size_t)len * sizeof(float), d->grid.prev, 1));
	d->stats.boundary_recvd += (uint64_t)len * sizeof(float);
	if (T == 1 && !d->always)
		return LLM_OK;
	d->stats.tp_allgather += (uint64_t)len * sizeof(float);
	LLM_TRY(act_comm(d, 0, &c));
	return llm_comm_allgather_slices(c, x, n_el);   /* the same slices, in place */
}

/* Last stage: the logits slices (n_out, V_t) of the TP ranks go to world
 * rank 0, which puts them in vocabulary order into LOGITS (n_out, n_vocab). */
static enum llm_status logits_to_root(struct llm_model *m, struct llm_scratch *s, float *logits, int n_out)
{
	struct llm_model_dist *d = m->dist;
	struct llm_comm *w = d->grid.world;
	int T = d->grid.n_tp, last0 = (d->grid.n_pp - 1) * T;   /* world rank of (P-1, 0) */
	size_t nv = (size_t)m->cfg.n_vocab;
	if (w->rank != 0) {
		if (!d->last)
			return LLM_OK;
		size_t bytes = (size_t)n_out * (size_t)m->n_vocab_loc * sizeof(float);
		d->stats.logits_sent += bytes;
		return llm_comm_send(w, s->lbuf, bytes, 0, 2);
	}
	for (int t = 0; t < T; t++) {
		int64_t v0 = d->v0[t], vl = d->v0[t + 1] - v0;
		if (last0 + t != 0)
			LLM_TRY(llm_comm_recv(w, s->lbuf, (size_t)n_out * (size_t)vl * sizeof(float), last0 + t, 2));
		for (int i = 0; i < n_out; i++)
			memcpy(logits + (size_t)i * nv + (size_t)v0, s->lbuf + (size_t)i * (size_t)vl,
			       (size_t)vl * sizeof(float));
	}
	return LLM_OK;
}

/* y[i] = x . w[i]^T for weights that share their input, in one dispatch
 * where the backend has one. */
static enum llm_status matmuls(struct llm_backend *be, int n, const struct llm_view *y,
                               struct llm_view x, const struct llm_weight *const *w)
{
	if (be->ops->matmul_n)
		return be->ops->matmul_n(be, n, y, x, w);
	for (int i = 0; i < n; i++)
		LLM_TRY(be->ops->matmul(be, y[i], x, w[i]));
	return LLM_OK;
}

/* y += the low-rank term of projection T of layer L, from the projection's
 * input x, for each adapter of the step over its own rows (the segmented
 * LoRA matmul; host memory: llm_model_check_backend refuses an adapter on
 * another backend) */
static void lora(const struct llm_model *m, const struct llm_scratch *s, int l, int t, struct llm_view y,
                 struct llm_view x)
{
	for (int g = 0; g < s->n_lgroup; g++)
		llm_lora_apply(m->lora[s->lgroup[g]], l, t, y.data, y.stride, x.data, x.stride,
		               s->lrows + s->lstart[g], s->lstart[g + 1] - s->lstart[g]);
}

/* Group the rows of B by LoRA slot into S (slot order, rows ascending; the
 * base's rows in no group). LLM_ERR_RANGE naming a token whose slot holds
 * no adapter. */
static enum llm_status lora_groups(const struct llm_model *m, struct llm_scratch *s, const struct llm_batch *b)
{
	int cnt[LLM_LORA_SLOTS + 1] = { 0 };
	s->n_lgroup = 0;
	if (!b->adapter)
		return LLM_OK;
	for (int i = 0; i < b->n_tok; i++) {
		int a = b->adapter[i];
		if (a < 0 || a > m->n_lora || (a && !m->lora[a]))
			return llm_fail(LLM_ERR_RANGE, "batch token %d: LoRA slot %d holds no adapter", i, a);
		cnt[a]++;
	}
	int at[LLM_LORA_SLOTS + 1], n = 0;
	for (int a = 1; a <= m->n_lora; a++) {
		if (!cnt[a])
			continue;
		s->lgroup[s->n_lgroup] = a;
		s->lstart[s->n_lgroup++] = n;
		at[a] = n;
		n += cnt[a];
	}
	s->lstart[s->n_lgroup] = n;
	for (int i = 0; i < b->n_tok; i++)
		if (b->adapter[i])
			s->lrows[at[b->adapter[i]]++] = i;
	return LLM_OK;
}

/* The experts' LoRA terms (moe.h's hook): for expert E's projection PROJ,
 * each adapter of the step over those of the expert's N gathered rows
 * (batch rows ROWS) that are its own (ADAPTER: the batch's slot of each
 * row), so an expert's adapter changes only the rows routed to that expert. */
struct moe_lora_ctx { const struct llm_model *m; const struct llm_scratch *s; int l; const int32_t *adapter; };

static void moe_lora(void *ctx, int e, int proj, struct llm_view y, struct llm_view x, const int32_t *rows,
                     int64_t n)
{
	const struct moe_lora_ctx *c = ctx;
	const struct llm_scratch *s = c->s;
	int slot = llm_lora_slot(e, LLM_LORA_GATE + proj);
	for (int g = 0; g < s->n_lgroup; g++) {
		int a = s->lgroup[g];
		const struct llm_lora *lo = c->m->lora[a];
		if (!llm_lora_has_slot(lo, c->l, slot))
			continue;
		int64_t k = 0;
		for (int64_t i = 0; i < n; i++)
			if (c->adapter[rows[i]] == a)
				s->lsub[k++] = (int32_t)i;
		if (k)
			llm_lora_apply_slot(lo, c->l, slot, y.data, y.stride, x.data, x.stride, s->lsub, k);
	}
}

/* x += xb, then xb = rmsnorm(x) with W: one dispatch where the backend
 * fuses the two */
static enum llm_status add_norm(struct llm_backend *be, struct llm_view xb, struct llm_view x,
                                const struct llm_weight *w, float eps)
{
	if (be->ops->add_rmsnorm)
		return be->ops->add_rmsnorm(be, xb, x, xb, w, eps);
	LLM_TRY(be->ops->add(be, x, xb));
	return be->ops->rmsnorm(be, xb, x, w, eps);
}

/* Fewest tokens in a pipeline micro-batch. A CPU matmul over few tokens
 * costs about one pass over the weights whatever the token count (memory
 * bound), so splitting a decode step of 8 tokens into 4 micro-batches
 * reads the weights 4 times and was measured slower (SmolLM2-135M pp2:
 * 7.5 vs 20.7 tok/s); a 512-token prefill step in 4 micro-batches took
 * 750 ms instead of 1120 ms. */
#define LLM_MICRO_MIN_TOK 32

/* The rest of layer L after attention, over the rows of x (n, d_model):
 * x += o_proj(att), xb = rmsnorm(x), hb = silu(gate(xb)) * up(xb),
 * xb = down(hb) (B: the batch of those rows, whose adapter slots the
 * experts' LoRA terms read); the caller adds xb into x, unless *ADDED: where the
 * backend has matmul_add (and no TP partial sums or LoRA term come
 * between the product and the add), both projections add into x from the
 * GEMM's epilogue, the same bits as matmul then add. */
static enum llm_status out_mlp(struct llm_model *m, struct llm_backend *be, struct llm_scratch *s, int l,
                               const struct llm_batch *b, struct llm_view x,
                               struct llm_view xb, struct llm_view att, struct llm_view hb, struct llm_view hb2,
                               int *added)
{
	const struct llm_backend_ops *op = be->ops;
	const struct llm_layer *L = &m->layers[l];
	struct llm_model_dist *d = m->dist;
	size_t n_el = (size_t)(x.rows * x.cols);
	const struct llm_family *f = m->cfg.fam;
	int moe = L->moe.router.data != NULL;
	int fuse = !moe && op->matmul_add && (!d || (d->grid.n_tp == 1 && !d->always)) && s->n_lgroup == 0 &&
	           !f->sandwich;
	*added = fuse;
	if (fuse) {
		LLM_TRY(op->matmul_add(be, x, att, &L->wo));
		LLM_TRY(op->rmsnorm(be, xb, x, &L->ffn_norm, m->cfg.rms_eps));
	} else {
		LLM_TRY(op->matmul(be, xb, att, &L->wo));
		lora(m, s, l, LLM_LORA_O, xb, att);
		if (d)                          /* row-parallel: partial sums */
			LLM_TRY(tp_sum(d, xb.data, n_el));
		if (f->sandwich)                /* the attention output normed before the residual add */
			LLM_TRY(op->rmsnorm(be, xb, xb, &L->post_attn_norm, m->cfg.rms_eps));
		LLM_TRY(add_norm(be, xb, x, &L->ffn_norm, m->cfg.rms_eps));
	}
	if (moe) {
		struct moe_lora_ctx mc = { m, s, l, b->adapter };
		struct llm_moe_hook hook = { moe_lora, &mc };
		LLM_TRY(llm_moe_ffn(be, &m->cfg.moe, &L->moe, &s->moe, xb, s->n_lgroup ? &hook : NULL));
		return d ? tp_sum(d, xb.data, n_el) : LLM_OK;
	}
	{
		struct llm_view ys[2] = { hb, hb2 };
		const struct llm_weight *ws[2] = { &L->w_gate, &L->w_up };
		LLM_TRY(matmuls(be, 2, ys, xb, ws));
		lora(m, s, l, LLM_LORA_GATE, hb, xb);
		lora(m, s, l, LLM_LORA_UP, hb2, xb);
	}
	if (f->act == LLM_ACT_GELU_TANH)
		LLM_TRY(op->geglu(be, hb, hb, hb2));
	else
		LLM_TRY(op->swiglu(be, hb, hb, hb2));
	if (fuse)
		return op->matmul_add(be, x, hb, &L->w_down);
	LLM_TRY(op->matmul(be, xb, hb, &L->w_down));
	lora(m, s, l, LLM_LORA_DOWN, xb, hb);
	if (d)
		LLM_TRY(tp_sum(d, xb.data, n_el));
	if (f->sandwich)                    /* the MLP output normed before the residual add */
		LLM_TRY(op->rmsnorm(be, xb, xb, &L->post_ffn_norm, m->cfg.rms_eps));
	return LLM_OK;
}

/* Causal attention of layer L (KL in the cache) as the family scores it:
 * the plain op where it is Llama's (scores / sqrt(d_head), every earlier
 * position), else attention_ex with the divisor (query_pre_attn_scalar, the
 * YaRN attention factor), the softcap and the layer's window. */
static enum llm_status attend(const struct llm_model *m, struct llm_backend *be, struct llm_view out,
                              struct llm_view q, struct llm_kv *kv, int l, const struct llm_batch *b)
{
	int kl = l - m->layer_begin;
	if (!m->attn_ex)
		return be->ops->attention(be, out, q, kv, kl, b, m->n_head_loc);
	struct llm_attn_opts o = { llm_config_attn_div(&m->cfg), m->cfg.attn_softcap, llm_config_window(&m->cfg, l) };
	return be->ops->attention_ex(be, out, q, kv, kl, b, m->n_head_loc, &o);
}

/* The model's last layer after its K and V are stored, for the N_SEL rows
 * s->rows of B only (the rows that want logits; the other rows' outputs
 * feed nothing): their queries' attention, out_mlp and the residual add,
 * into s->xl (n_sel, d_model), the final norm's input. Each row is bit for
 * bit what the whole batch gives it: every op is row-wise and batch
 * invariant (attention reads only the row's own sequence, positions
 * 0..pos). N_SEL 0: nothing to compute. */
static enum llm_status last_layer_rows(struct llm_model *m, struct llm_backend *be, struct llm_kv *kv,
                                       struct llm_scratch *s, const struct llm_batch *b, int l,
                                       int n_sel, struct llm_view x, struct llm_view q)
{
	if (n_sel == 0)
		return LLM_OK;
	int64_t dq = q.cols, ff = m->d_ff_loc, dm = m->cfg.d_model;
	int32_t *tok = s->sub, *pos = tok + s->max_logits, *seq = pos + s->max_logits, *ad = seq + s->max_logits;
	for (int i = 0; i < n_sel; i++) {
		tok[i] = b->token[s->rows[i]];
		pos[i] = b->pos[s->rows[i]];
		seq[i] = b->seq[s->rows[i]];
		ad[i] = b->adapter ? b->adapter[s->rows[i]] : 0;
	}
	struct llm_batch rb = { n_sel, tok, pos, seq, NULL, b->adapter ? ad : NULL };
	LLM_TRY(lora_groups(m, s, &rb));   /* the adapters' row groups, over these rows now */
	struct llm_view qr = llm_view_f32(s->att, n_sel, dq), att = llm_view_f32(s->q, n_sel, dq);
	struct llm_view xr = llm_view_f32(s->xl, n_sel, dm), xb = llm_view_f32(s->xb, n_sel, dm);
	LLM_TRY(be->ops->gather(be, qr, q, s->rows));
	LLM_TRY(be->ops->gather(be, xr, x, s->rows));
	LLM_TRY(attend(m, be, att, qr, kv, l, &rb));
	int added;
	LLM_TRY(out_mlp(m, be, s, l, &rb, xr, xb, att, llm_view_f32(s->hb, n_sel, ff), llm_view_f32(s->hb2, n_sel, ff),
	                &added));
	return added ? LLM_OK : be->ops->add(be, xr, xb);
}

/* The decoder layers of this rank over batch B, whose residual stream is X
 * (n_tok, d_model): from the embedding on the first stage, else received
 * from the previous stage; sent on to the next unless this is the last.
 * N_SEL >= 0 (this rank holds the model's last layer): that layer ends in
 * last_layer_rows, for the N_SEL rows s->rows, into s->xl; -1: every row
 * of every layer, into X. */
static enum llm_status forward_layers(struct llm_model *m, struct llm_backend *be, struct llm_kv *kv,
                                      struct llm_scratch *s, const struct llm_batch *b, float *xp, int n_sel)
{
	const struct llm_config *c = &m->cfg;
	const struct llm_backend_ops *op = be->ops;
	struct llm_model_dist *d = m->dist;
	/* this rank's share; the whole model in a single process */
	int64_t n = b->n_tok, dq = (int64_t)m->n_head_loc * c->d_head;
	int64_t dkv = (int64_t)m->n_kv_head_loc * c->d_head, ff = m->d_ff_loc;
	size_t n_el = (size_t)(n * c->d_model);
	struct llm_view x = llm_view_f32(xp, n, c->d_model), xb = llm_view_f32(s->xb, n, c->d_model);
	struct llm_view q = llm_view_f32(s->q, n, dq), k = llm_view_f32(s->k, n, dkv);
	struct llm_view v = llm_view_f32(s->v, n, dkv), att = llm_view_f32(s->att, n, dq);
	struct llm_view hb = llm_view_f32(s->hb, n, ff), hb2 = llm_view_f32(s->hb2, n, ff);
	if (!d || (d->first && d->grid.n_tp == 1 && !d->always))
		LLM_TRY(op->embed(be, x, b->token, &m->embed));
	else if (d->first)
		LLM_TRY(embed_dist(m, be, s, b, xp));
	else
		LLM_TRY(stage_recv(d, xp, (int64_t)n_el));
	if (c->fam->embed_scale && (!d || d->first))
		LLM_TRY(op->scale(be, x, c->embed_scale));
	int normed = 0;         /* xb holds this layer's attention norm (fused with the last add) */
	for (int l = m->layer_begin; l < m->layer_end; l++) {
		const struct llm_layer *L = &m->layers[l];
		int kl = l - m->layer_begin;            /* the cache holds this rank's layers */
		if (!normed)
			LLM_TRY(op->rmsnorm(be, xb, x, &L->attn_norm, c->rms_eps));
		{
			struct llm_view ys[3] = { q, k, v };
			const struct llm_weight *ws[3] = { &L->wq, &L->wk, &L->wv };
			LLM_TRY(matmuls(be, 3, ys, xb, ws));
			for (int t = LLM_LORA_Q; t <= LLM_LORA_V; t++)
				lora(m, s, l, t, ys[t - LLM_LORA_Q], xb);
		}
		if (c->fam->qkv_bias) {
			LLM_TRY(op->add_bias(be, q, &L->bq));
			LLM_TRY(op->add_bias(be, k, &L->bk));
			LLM_TRY(op->add_bias(be, v, &L->bv));
		}
		if (c->fam->qk_norm) {          /* each head's d_head elements, before RoPE */
			struct llm_view qh = llm_view_f32(s->q, n * m->n_head_loc, c->d_head);
			struct llm_view kh = llm_view_f32(s->k, n * m->n_kv_head_loc, c->d_head);
			LLM_TRY(op->rmsnorm(be, qh, qh, &L->q_norm, c->rms_eps));
			LLM_TRY(op->rmsnorm(be, kh, kh, &L->k_norm, c->rms_eps));
		}
		if (op->rope_store) {
			LLM_TRY(op->rope_store(be, q, k, v, kv, kl, b, m->n_head_loc, m->n_kv_head_loc, c->d_head,
			                       m->inv_freq));
		} else {
			LLM_TRY(op->rope(be, q, b->pos, m->n_head_loc, c->d_head, m->inv_freq));
			LLM_TRY(op->rope(be, k, b->pos, m->n_kv_head_loc, c->d_head, m->inv_freq));
			LLM_TRY(op->kv_store(be, kv, kl, b, k, v));
		}
		if (n_sel >= 0 && l == c->n_layer - 1)
			return last_layer_rows(m, be, kv, s, b, l, n_sel, x, q);
		LLM_TRY(attend(m, be, att, q, kv, l, b));
		int added;
		LLM_TRY(out_mlp(m, be, s, l, b, x, xb, att, hb, hb2, &added));
		normed = !added && op->add_rmsnorm && l + 1 < m->layer_end;
		if (normed)
			LLM_TRY(add_norm(be, xb, x, &m->layers[l + 1].attn_norm, c->rms_eps));
		else if (!added)
			LLM_TRY(op->add(be, x, xb));
	}
	if (d && !d->last)
		return stage_send(d, xp, (int64_t)n_el);
	return LLM_OK;
}

static enum llm_status forward(struct llm_model *m, struct llm_backend *be, struct llm_kv *kv,
                               struct llm_scratch *s, const struct llm_batch *b,
                               float *logits, int n_out)
{
	const struct llm_config *c = &m->cfg;
	const struct llm_backend_ops *op = be->ops;
	struct llm_model_dist *d = m->dist;
	int n = b->n_tok, n_mb = 1;
	if (d) {
		d->stats.steps++;
		d->stats.tokens += (uint64_t)n;
		/* pipeline micro-batches: consecutive token ranges; stage p runs
		 * micro-batch i while stage p+1 runs i-1. A token's own sequence
		 * only looks back (causal), at positions stored by an earlier
		 * micro-batch or its own, so the result is that of one batch
		 * (the ops are batch invariant). */
		n_mb = d->grid.n_pp > 1 ? d->n_micro : 1;
		if (n_mb > n / LLM_MICRO_MIN_TOK)
			n_mb = n / LLM_MICRO_MIN_TOK > 0 ? n / LLM_MICRO_MIN_TOK : 1;
		d->stats.micro += (uint64_t)n_mb;
	}
	/* the last layer's attention output and MLP only for the rows that
	 * want logits, where one forward_layers call holds the batch whole and
	 * this rank holds that layer */
	int sel = n_mb == 1 && m->layer_end == c->n_layer;
	for (int i = 0; i < n_mb; i++) {
		int a = (int)((int64_t)n * i / n_mb), e = (int)((int64_t)n * (i + 1) / n_mb);
		struct llm_batch mb = { e - a, b->token + a, b->pos + a, b->seq + a, b->logits ? b->logits + a : NULL,
		                        b->adapter ? b->adapter + a : NULL };
		LLM_TRY(forward_layers(m, be, kv, s, &mb, s->x + (size_t)a * (size_t)c->d_model, sel ? n_out : -1));
	}
	if ((d && !d->last) || n_out == 0)
		return LLM_OK;
	/* only the rows that want logits go through the final norm and lm_head
	 * (with SEL, the last layer already put them in xl) */
	struct llm_view x = llm_view_f32(s->x, n, c->d_model), xl = llm_view_f32(s->xl, n_out, c->d_model);
	float *out = d ? s->lbuf : logits;
	if (!sel)
		LLM_TRY(op->gather(be, xl, x, s->rows));
	LLM_TRY(op->rmsnorm(be, xl, xl, &m->norm, c->rms_eps));
	LLM_TRY(op->matmul(be, llm_view_f32(out, n_out, m->n_vocab_loc), xl, &m->lm_head));
	if (c->final_softcap > 0)
		LLM_TRY(op->softcap(be, llm_view_f32(out, n_out, m->n_vocab_loc), c->final_softcap));
	if (op->sync)
		LLM_TRY(op->sync(be));
	return LLM_OK;
}

enum llm_status llm_model_forward(struct llm_model *m, struct llm_backend *be, struct llm_kv *kv,
                                  struct llm_scratch *s, const struct llm_batch *b,
                                  float *logits, int *n_out)
{
	const struct llm_config *c = &m->cfg;
	if (n_out)
		*n_out = 0;
	if (b->n_tok < 1 || b->n_tok > s->max_tok)
		return llm_fail(LLM_ERR_USAGE, "forward: %d tokens in a batch (1 to %d)", b->n_tok, s->max_tok);
	int no = 0;
	for (int i = 0; i < b->n_tok; i++) {
		if (b->token[i] < 0 || b->token[i] >= c->n_vocab)
			return llm_fail(LLM_ERR_RANGE, "batch token %d: id %d is not in the vocabulary [0, %d)",
			                i, b->token[i], c->n_vocab);
		if (b->pos[i] < 0 || b->pos[i] >= c->max_ctx)
			return llm_fail(LLM_ERR_RANGE, "batch token %d: position %d is outside the model context %d",
			                i, b->pos[i], c->max_ctx);
		int want = b->logits ? b->logits[i] != 0 : i == b->n_tok - 1;
		if (want) {
			if (no == s->max_logits)
				return llm_fail(LLM_ERR_USAGE, "forward: more than %d tokens ask for logits", s->max_logits);
			s->rows[no++] = i;
		}
	}
	if (no && !logits)
		return llm_fail(LLM_ERR_USAGE, "forward: logits requested without an output buffer");
	LLM_TRY(lora_groups(m, s, b));
	if (kv->n_layer != m->layer_end - m->layer_begin || kv->kv_dim != m->n_kv_head_loc * c->d_head)
		return llm_fail(LLM_ERR_USAGE, "forward: kv cache geometry does not match the model");
	LLM_TRY(llm_kv_prepare(kv, b));
	/* forward writes no op's output between that op and its matmul */
	if (be->ops->chain)
		be->ops->chain(be, 1);
	/* decode steps (every token asks for its logits) may be recorded and
	 * replayed by the backend (CUDA graphs), keyed by their token count */
	int graph = be->ops->graph_begin && !m->dist && no == b->n_tok && be->ops->graph_begin(be, no, logits);
	enum llm_status st = forward(m, be, kv, s, b, logits, no);
	if (graph) {
		int redo = 0;
		enum llm_status gs = be->ops->graph_end(be, st != LLM_OK, &redo);
		if (redo)           /* nothing ran: op by op (an op's own error comes back there) */
			st = forward(m, be, kv, s, b, logits, no);
		else if (!st)
			st = gs;
	}
	if (be->ops->chain)
		be->ops->chain(be, 0);
	if (!st && m->dist && no)
		st = logits_to_root(m, s, logits, no);
	if (st) {
		llm_kv_unprepare(kv, b);
		return st;
	}
	if (n_out)
		*n_out = no;
	return LLM_OK;
}
