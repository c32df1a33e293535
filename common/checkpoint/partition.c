/* common/checkpoint/partition.c: plan a tensor x pipeline partition and write it one
 * rank file at a time (llm-repartition). Partitioned checkpoints are read
 * back (the merged view every tool sees, and the pieces streamed from here)
 * by ckpt_part.c, in the checkpoint layer.
 *
 * Slicing is byte copying: a slice of a row-major tensor is a run of rows
 * (dim 0) or the same column range of every row (last dim), so a merge
 * returns the original bytes. The split rules are documented in
 * partition.h; the file layout in man/llm-checkpoint.5. */
#define _GNU_SOURCE
#include "partition.h"
#include "fileio.h"
#include "config.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define CHUNK (8u << 20)          /* bytes gathered per write */

/* ---- ranges and layer balance ------------------------------------------ */

void llm_part_range(int64_t n, int tp, int t, int64_t *start, int64_t *len)
{
	int64_t a = n * t / tp, b = n * (t + 1) / tp;
	*start = a;
	*len = b - a;
}

enum llm_status llm_part_balance(const int64_t *cost, int n_layer, int64_t first_extra,
                                 int64_t last_extra, int pp, int *layer0)
{
	if (pp < 1 || pp > n_layer)
		return llm_fail(LLM_ERR_USAGE, "--pp %d needs at least %d layers; the model has %d", pp, pp, n_layer);
	/* best[p][i]: smallest possible largest stage cost for layers [0, i) on
	 * stages [0, p]; cut[p][i]: where stage p starts in that solution. */
	size_t n = (size_t)n_layer + 1;
	int64_t *pre = calloc(n, sizeof *pre), *best = calloc(n * (size_t)pp, sizeof *best);
	int *cut = calloc(n * (size_t)pp, sizeof *cut);
	if (!pre || !best || !cut) {
		free(pre), free(best), free(cut);
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	for (int i = 0; i < n_layer; i++)
		pre[i + 1] = pre[i] + cost[i];
	for (int p = 0; p < pp; p++)
		for (int i = p + 1; i <= n_layer; i++) {
			int64_t *b = &best[(size_t)p * n + (size_t)i];
			*b = INT64_MAX;
			for (int j = p; j < i; j++) {       /* stage p holds [j, i) */
				if (p == 0 && j != 0)
					break;
				int64_t c = pre[i] - pre[j] + (p == 0 ? first_extra : 0) + (p == pp - 1 ? last_extra : 0);
				int64_t m = p == 0 ? c : best[(size_t)(p - 1) * n + (size_t)j];
				m = c > m ? c : m;
				if (m < *b) {
					*b = m;
					cut[(size_t)p * n + (size_t)i] = j;
				}
			}
		}
	layer0[pp] = n_layer;
	for (int p = pp - 1; p >= 0; p--)
		layer0[p] = cut[(size_t)p * n + (size_t)layer0[p + 1]];
	free(pre), free(best), free(cut);
	return LLM_OK;
}

/* ---- planning ---------------------------------------------------------- */

enum kind { K_OTHER, K_LAYER, K_EMBED, K_HEAD, K_FNORM, K_Q, K_KV, K_O, K_FF, K_DOWN, K_EFF, K_EDOWN, K_SCALE };

struct cls {
	enum kind k;
	int layer;                 /* -1: not in a layer */
	int dim;                   /* dimension split across TP, -1: replicated */
	size_t base;               /* K_SCALE: its weight */
	size_t scale;              /* an E4M3 weight: its scale (SIZE_MAX: none) */
	int64_t bn, bk;            /* an E4M3 weight: block rows, cols */
};

struct pslice {
	size_t w;                  /* whole tensor index */
	struct llm_slice s;
	struct llm_tensor out;     /* name borrowed; sliced shape */
};

struct prank {
	struct pslice *v;
	size_t n;
	uint64_t bytes;
};

struct plan {
	const struct llm_part_opts *o;
	struct llm_ckpt ck;
	const struct llm_tensor **w;     /* whole tensors in order */
	size_t n_w;
	struct cls *c;
	struct llm_config cfg;
	int tied_head;                   /* no lm_head.weight: the embedding is the head */
	int *layer0;                     /* (pp + 1) */
	int n_rank;
	struct prank *rk;
	uint64_t total;                  /* bytes of all ranks */
};

static int ends_with(const char *s, const char *suf)
{
	size_t n = strlen(s), m = strlen(suf);
	return n >= m && !strcmp(s + n - m, suf);
}

static long find_whole(const struct plan *pl, const char *name)
{
	const struct llm_tensor *t = llm_ckpt_find(&pl->ck, name);
	for (size_t i = 0; t && i < pl->n_w; i++)
		if (pl->w[i] == t)
			return (long)i;
	return -1;
}

/* An expert's weight (after "model.layers.N."): gate and up split by rows,
 * down by columns, as the dense FFN's; the router ("...gate.weight")
 * stays whole on every rank. */
static void expert(const char *n, struct cls *c)
{
	static const struct { const char *suf; enum kind k; int dim; } ex[] = {
		{ "w1.weight", K_EFF, 0 }, { "w3.weight", K_EFF, 0 }, { "w2.weight", K_EDOWN, 1 },
		{ "gate_proj.weight", K_EFF, 0 }, { "up_proj.weight", K_EFF, 0 }, { "down_proj.weight", K_EDOWN, 1 },
	};
	const char *p = !strncmp(n, "block_sparse_moe.experts.", 25) ? n + 25 :
	                !strncmp(n, "mlp.experts.", 12) ? n + 12 : NULL;
	if (!p || *p < '0' || *p > '9')
		return;
	while (*p >= '0' && *p <= '9')
		p++;
	for (size_t m = 0; *p == '.' && m < sizeof ex / sizeof *ex; m++)
		if (!strcmp(p + 1, ex[m].suf)) {
			c->k = ex[m].k;
			c->dim = ex[m].dim;
		}
}

static void classify(struct plan *pl, size_t i)
{
	const char *n = pl->w[i]->name;
	struct cls *c = &pl->c[i];
	*c = (struct cls){ K_OTHER, -1, -1, 0, SIZE_MAX, 0, 0 };
	static const struct { const char *suf; enum kind k; int dim; } mods[] = {
		{ "self_attn.q_proj.weight", K_Q, 0 },   { "self_attn.q_proj.bias", K_Q, 0 },
		{ "self_attn.k_proj.weight", K_KV, 0 },  { "self_attn.k_proj.bias", K_KV, 0 },
		{ "self_attn.v_proj.weight", K_KV, 0 },  { "self_attn.v_proj.bias", K_KV, 0 },
		{ "self_attn.o_proj.weight", K_O, 1 },
		{ "mlp.gate_proj.weight", K_FF, 0 },     { "mlp.gate_proj.bias", K_FF, 0 },
		{ "mlp.up_proj.weight", K_FF, 0 },       { "mlp.up_proj.bias", K_FF, 0 },
		{ "mlp.down_proj.weight", K_DOWN, 1 },
	};
	if (!strncmp(n, "model.layers.", 13) && n[13] >= '0' && n[13] <= '9') {
		char *e;
		long l = strtol(n + 13, &e, 10);
		if (*e == '.' && l < (1 << 20)) {
			c->k = K_LAYER;
			c->layer = (int)l;
			for (size_t m = 0; m < sizeof mods / sizeof *mods; m++)
				if (!strcmp(e + 1, mods[m].suf)) {
					c->k = mods[m].k;
					c->dim = mods[m].dim;
				}
			expert(e + 1, c);
		}
	} else if (!strcmp(n, "model.embed_tokens.weight")) {
		c->k = K_EMBED, c->dim = 0;
	} else if (!strcmp(n, "lm_head.weight")) {
		c->k = K_HEAD, c->dim = 0;
	} else if (!strcmp(n, "model.norm.weight")) {
		c->k = K_FNORM;
	}
	if (pl->w[i]->n_dim == 1 && c->dim == 1)
		c->dim = -1;
}

/* Scales of the E4M3 weights: which tensor, which block, by the rules
 * llm_ckpt_weight reads them with (llm_ckpt_fp8_scale, ckpt.h). */
static enum llm_status find_scales(struct plan *pl)
{
	for (size_t i = 0; i < pl->n_w; i++) {
		const struct llm_tensor *w = pl->w[i];
		if (w->dtype != LLM_DTYPE_E4M3)
			continue;
		if (w->n_dim != 2)
			return llm_fail(LLM_ERR_UNSUPPORTED, "%s: tensor '%s': an F8_E4M3 tensor of %d dimensions cannot be split",
			                pl->ck.path, w->name, w->n_dim);
		const struct llm_tensor *sc;
		int64_t bn, bk;
		LLM_TRY(llm_ckpt_fp8_scale(&pl->ck, w->name, w->shape[0], w->shape[1], &sc, &bn, &bk));
		long j = find_whole(pl, sc->name);
		if (j < 0)
			return llm_fail(LLM_ERR_INTERNAL, "%s: tensor '%s' is not in the plan", pl->ck.path, sc->name);
		pl->c[i].scale = (size_t)j;
		pl->c[i].bn = bn, pl->c[i].bk = bk;
		pl->c[j] = (struct cls){ K_SCALE, pl->c[i].layer, pl->c[i].dim, i, SIZE_MAX, 0, 0 };
	}
	return LLM_OK;
}

/* The TP slice of weight I for TP rank T (the extent was checked). */
static struct llm_slice tp_slice(const struct plan *pl, size_t i, int t)
{
	const struct llm_tensor *w = pl->w[i];
	const struct cls *c = &pl->c[i];
	int T = pl->o->tp;
	struct llm_slice s = { -1, 0, 0, 0 };
	if (T == 1 || c->dim < 0)
		return s;
	const struct llm_config *g = &pl->cfg;
	s.dim = c->dim;
	s.full = w->shape[c->dim];
	int64_t D = g->d_head;
	switch (c->k) {
	case K_Q: case K_O:
		s.start = (int64_t)t * (g->n_head / T) * D, s.len = (int64_t)(g->n_head / T) * D;
		break;
	case K_KV:
		if (T <= g->n_kv_head)
			s.start = (int64_t)t * (g->n_kv_head / T) * D, s.len = (int64_t)(g->n_kv_head / T) * D;
		else
			s.start = (int64_t)t * g->n_kv_head / T * D, s.len = D;
		break;
	case K_FF: case K_DOWN:
		s.start = (int64_t)t * (g->d_ff / T), s.len = g->d_ff / T;
		break;
	case K_EFF: case K_EDOWN:
		s.start = (int64_t)t * (g->moe.d_ff_expert / T), s.len = g->moe.d_ff_expert / T;
		break;
	default:
		llm_part_range(s.full, T, t, &s.start, &s.len);
	}
	return s;
}

/* The slice of scale J (of weight I, sliced as WS): the blocks under it. */
static enum llm_status scale_slice(const struct plan *pl, size_t i, const struct llm_slice *ws, struct llm_slice *out)
{
	const struct cls *c = &pl->c[i];
	const struct llm_tensor *w = pl->w[i], *sc = pl->w[c->scale];
	*out = (struct llm_slice){ -1, 0, 0, 0 };
	if (ws->dim < 0 || llm_tensor_numel(sc) == 1 || (ws->dim == 1 && sc->n_dim == 1))
		return LLM_OK;
	int64_t b = ws->dim == 0 ? c->bn : c->bk, ext = sc->shape[ws->dim];
	if (ext == 1)
		return LLM_OK;           /* one block spans the dimension: replicated */
	int64_t e = ws->start + ws->len;
	if (ws->start % b || (e % b && e != ws->full)) {
		int64_t at = ws->start % b ? ws->start : e;
		return llm_fail(LLM_ERR_USAGE, "tensor '%s' (%lldx%lld): --tp %d puts a shard boundary at %s %lld, "
		                "inside a %lld-%s FP8 block (%lld blocks of %lldx%lld); shards must start on block boundaries",
		                w->name, (long long)w->shape[0], (long long)w->shape[1], pl->o->tp,
		                ws->dim == 0 ? "row" : "column", (long long)at, (long long)b, ws->dim == 0 ? "row" : "column",
		                (long long)ext, (long long)c->bn, (long long)c->bk);
	}
	*out = (struct llm_slice){ ws->dim, ws->start / b, (e + b - 1) / b - ws->start / b, ext };
	return LLM_OK;
}

/* Heads, sizes and blocks allow --tp; names the first tensor that does not.
 * The most basic reason is reported first: query heads, kv heads,
 * intermediate size, vocabulary, then FP8 blocks (pass by pass). */
static enum llm_status check_tp(struct plan *pl)
{
	int T = pl->o->tp;
	const struct llm_config *g = &pl->cfg;
	static const enum kind order[] = { K_Q, K_O, K_KV, K_FF, K_DOWN, K_EFF, K_EDOWN, K_EMBED, K_HEAD };
	for (size_t i = 0; i < pl->n_w; i++)
		if (pl->c[i].layer >= g->n_layer)
			return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': layer %d, but config.json has %d layers",
			                pl->ck.path, pl->w[i]->name, pl->c[i].layer, g->n_layer);
	for (size_t pass = 0; pass <= sizeof order / sizeof *order; pass++)
	for (size_t i = 0; i < pl->n_w; i++) {
		if (pass < sizeof order / sizeof *order && pl->c[i].k != order[pass])
			continue;
		if (pass == sizeof order / sizeof *order && pl->c[i].scale == SIZE_MAX)
			continue;
		const struct cls *c = &pl->c[i];
		const struct llm_tensor *w = pl->w[i];
		if (c->dim < 0 || c->k == K_SCALE)
			continue;
		int ex = c->k == K_EFF || c->k == K_EDOWN;
		int64_t want = c->k == K_Q || c->k == K_O ? (int64_t)g->n_head * g->d_head :
		               c->k == K_KV ? (int64_t)g->n_kv_head * g->d_head :
		               c->k == K_FF || c->k == K_DOWN ? g->d_ff : ex ? g->moe.d_ff_expert : g->n_vocab;
		if (w->shape[c->dim] != want)
			return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': %lld along dimension %d, config.json implies %lld",
			                pl->ck.path, w->name, (long long)w->shape[c->dim], c->dim, (long long)want);
		if (T == 1)
			continue;
		int64_t n = c->k == K_Q || c->k == K_O ? g->n_head : c->k == K_KV ? g->n_kv_head :
		            c->k == K_FF || c->k == K_DOWN ? g->d_ff : ex ? g->moe.d_ff_expert : g->n_vocab;
		if ((c->k == K_Q || c->k == K_O) && n % T)
			return llm_fail(LLM_ERR_USAGE, "tensor '%s': %lld attention heads do not split evenly over --tp %d",
			                w->name, (long long)n, T);
		if ((c->k == K_FF || c->k == K_DOWN) && n % T)
			return llm_fail(LLM_ERR_USAGE, "tensor '%s': intermediate_size %lld does not split evenly over --tp %d",
			                w->name, (long long)n, T);
		if (ex && n % T)
			return llm_fail(LLM_ERR_USAGE, "tensor '%s': the experts' intermediate size %lld does not split "
			                "evenly over --tp %d", w->name, (long long)n, T);
		if (c->k == K_KV && (T <= n ? n % T : T % n))
			return llm_fail(LLM_ERR_USAGE, "tensor '%s': %lld key-value heads cannot be shared by --tp %d ranks "
			                "(T must divide them or be a multiple of them)", w->name, (long long)n, T);
		if (pass == sizeof order / sizeof *order)
			for (int t = 0; t < T; t++) {
				struct llm_slice ws = tp_slice(pl, i, t), ss;
				LLM_TRY(scale_slice(pl, i, &ws, &ss));
			}
	}
	return LLM_OK;
}

static int on_stage(const struct plan *pl, size_t i, int p)
{
	const struct cls *c = &pl->c[i];
	if (c->k == K_SCALE)
		c = &pl->c[c->base];
	int P = pl->o->pp;
	switch (c->k) {
	case K_EMBED: return p == 0 || (pl->tied_head && p == P - 1);
	case K_HEAD: case K_FNORM: return p == P - 1;
	case K_OTHER: return 1;
	default: return pl->layer0[p] <= c->layer && c->layer < pl->layer0[p + 1];
	}
}

static enum llm_status plan_layers(struct plan *pl)
{
	int P = pl->o->pp, L = pl->cfg.n_layer;
	pl->layer0 = calloc((size_t)P + 1, sizeof *pl->layer0);
	int64_t *cost = calloc((size_t)L + 1, sizeof *cost), first = 0, last = 0;
	if (!pl->layer0 || !cost) {
		free(cost);
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	if (pl->o->layers) {
		int sum = 0;
		for (int p = 0; p < P; p++) {
			pl->layer0[p] = sum;
			sum += pl->o->layers[p];
			if (pl->o->layers[p] < 1) {
				free(cost);
				return llm_fail(LLM_ERR_USAGE, "--layers: stage %d gets %d layers; every stage needs at least one",
				                p, pl->o->layers[p]);
			}
		}
		pl->layer0[P] = sum;
		free(cost);
		if (sum != L)
			return llm_fail(LLM_ERR_USAGE, "--layers adds up to %d layers; the model has %d", sum, L);
		return LLM_OK;
	}
	/* cost: the bytes a stage maps, the embedding on the first stage and
	 * the head (and final norm) on the last counted in */
	for (size_t i = 0; i < pl->n_w; i++) {
		const struct cls *c = pl->c[i].k == K_SCALE ? &pl->c[pl->c[i].base] : &pl->c[i];
		int64_t b = (int64_t)pl->w[i]->nbytes;
		if (c->layer >= 0)
			cost[c->layer] += b;
		if (c->k == K_EMBED)
			first += b;
		if (c->k == K_HEAD || c->k == K_FNORM || (c->k == K_EMBED && pl->tied_head && P > 1))
			last += b;
	}
	enum llm_status s = llm_part_balance(cost, L, first, last, P, pl->layer0);
	free(cost);
	return s;
}

static enum llm_status plan_ranks(struct plan *pl)
{
	int T = pl->o->tp;
	pl->n_rank = T * pl->o->pp;
	pl->rk = calloc((size_t)pl->n_rank, sizeof *pl->rk);
	if (!pl->rk)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (int r = 0; r < pl->n_rank; r++) {
		struct prank *k = &pl->rk[r];
		int p = r / T, t = r % T;
		k->v = calloc(pl->n_w + 1, sizeof *k->v);
		if (!k->v)
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		for (size_t i = 0; i < pl->n_w; i++) {
			if (!on_stage(pl, i, p))
				continue;
			struct pslice *ps = &k->v[k->n++];
			const struct cls *c = &pl->c[i];
			ps->w = i;
			if (c->k == K_SCALE) {
				struct llm_slice ws = tp_slice(pl, c->base, t);
				LLM_TRY(scale_slice(pl, c->base, &ws, &ps->s));
			} else {
				ps->s = tp_slice(pl, i, t);
			}
			ps->out = *pl->w[i];
			ps->out.data = NULL;
			if (ps->s.dim >= 0)
				ps->out.shape[ps->s.dim] = ps->s.len;
			ps->out.nbytes = (size_t)llm_tensor_numel(&ps->out) * llm_dtype_size(ps->out.dtype);
			k->bytes += ps->out.nbytes;
		}
	}
	return LLM_OK;
}

/* ---- writing ----------------------------------------------------------- */

static char *rank_file(int r, int p, int t)
{
	char b[96];
	snprintf(b, sizeof b, "rank-%05d-pp%d-tp%d.safetensors", r, p, t);
	return llm_strdup(b);
}

/* Stream the slice PS of its whole tensor into W. */
static enum llm_status write_slice(struct plan *pl, struct llm_ckpt_writer *w, const struct pslice *ps, uint8_t *buf)
{
	const struct llm_tensor *t = pl->w[ps->w];
	if (ps->s.dim < 0 && t->data) {                   /* whole, in one mapping */
		const uint8_t *p = t->data;
		for (size_t off = 0; off < t->nbytes; off += CHUNK) {
			size_t k = t->nbytes - off < CHUNK ? t->nbytes - off : CHUNK;
			LLM_TRY(llm_ckpt_write_data(w, p + off, k));
		}
		return LLM_OK;
	}
	int64_t rows, cols, r0 = 0, c0 = 0;
	llm_partition_view2d(t, &rows, &cols);
	int64_t r1 = rows, c1 = cols;
	if (ps->s.dim >= 0 && llm_partition_split_rows(t, ps->s.dim))
		r0 = ps->s.start, r1 = ps->s.start + ps->s.len;
	else if (ps->s.dim >= 0)
		c0 = ps->s.start, c1 = ps->s.start + ps->s.len;
	size_t es = llm_dtype_size(t->dtype), row = (size_t)(c1 - c0) * es;
	if (row > CHUNK)
		return llm_fail(LLM_ERR_UNSUPPORTED, "tensor '%s': a row of %zu bytes is larger than the %u-byte chunk",
		                t->name, row, CHUNK);
	int64_t step = row ? (int64_t)(CHUNK / row) : rows;
	for (int64_t r = r0; r < r1; r += step) {
		int64_t e = r + step < r1 ? r + step : r1;
		LLM_TRY(llm_partition_read(&pl->ck, t, r, e, c0, c1, buf));
		LLM_TRY(llm_ckpt_write_data(w, buf, (size_t)(e - r) * row));
	}
	return LLM_OK;
}

/* Write the tensors of PR to OUT (any writer mode), with AUX. */
static enum llm_status write_one(struct plan *pl, const struct prank *pr, const char *out,
                                 const struct llm_aux *aux, size_t n_aux, const struct llm_ckpt_write_opts *wo,
                                 uint8_t *buf)
{
	struct llm_tensor *descs = calloc(pr->n + 1, sizeof *descs);
	if (!descs)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < pr->n; i++)
		descs[i] = pr->v[i].out;
	struct llm_ckpt_writer *w;
	enum llm_status s = llm_ckpt_write_begin(&w, out, descs, pr->n, aux, n_aux, wo);
	free(descs);
	if (s)
		return s;
	long i;
	while (!s && (i = llm_ckpt_write_next(w)) >= 0) {
		s = write_slice(pl, w, &pr->v[i], buf);
		llm_partition_release(&pl->ck, pl->w[pr->v[i].w]);
	}
	if (s) {
		llm_ckpt_write_abort(w);
		return s;
	}
	return llm_ckpt_write_commit(w);
}

static json_t *stages_json(const struct plan *pl)
{
	json_t *a = json_array();
	for (int p = 0; p < pl->o->pp; p++)
		json_array_append_new(a, json_pack("[i, i]", pl->layer0[p], pl->layer0[p + 1]));
	return a;
}

static json_t *common_json(const struct plan *pl)
{
	return json_pack("{s:s, s:i, s:i, s:i, s:i}", "format", "llm-partition", "version", 1,
	                 "tp", pl->o->tp, "pp", pl->o->pp, "n_layer", pl->cfg.n_layer);
}

/* The LLM_PART_META record of rank R. */
static char *rank_meta(const struct plan *pl, int r)
{
	int T = pl->o->tp, p = r / T;
	json_t *root = common_json(pl), *sl = json_object();
	json_object_set_new(root, "rank", json_integer(r));
	json_object_set_new(root, "stage", json_integer(p));
	json_object_set_new(root, "tp_rank", json_integer(r % T));
	json_object_set_new(root, "layers", json_pack("[i, i]", pl->layer0[p], pl->layer0[p + 1]));
	for (size_t i = 0; i < pl->rk[r].n; i++) {
		const struct pslice *ps = &pl->rk[r].v[i];
		if (ps->s.dim >= 0)
			json_object_set_new(sl, ps->out.name, json_pack("[i, I, I]", ps->s.dim, (json_int_t)ps->s.start,
			                                                (json_int_t)ps->s.full));
	}
	json_object_set_new(root, "slices", sl);
	char *js = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(root);
	return js;
}

static char *record_json(const struct plan *pl)
{
	json_t *root = common_json(pl), *ranks = json_array(), *tens = json_array();
	json_object_set_new(root, "stages", stages_json(pl));
	for (int r = 0; r < pl->n_rank; r++) {
		int p = r / pl->o->tp;
		char *f = rank_file(r, p, r % pl->o->tp);
		json_array_append_new(ranks, json_pack("{s:i, s:i, s:i, s:[i, i], s:s, s:I}", "rank", r, "stage", p,
		                                       "tp_rank", r % pl->o->tp, "layers", pl->layer0[p], pl->layer0[p + 1],
		                                       "file", f, "bytes", (json_int_t)pl->rk[r].bytes));
		free(f);
	}
	json_object_set_new(root, "ranks", ranks);
	for (size_t i = 0; i < pl->n_w; i++) {
		const struct llm_tensor *t = pl->w[i];
		json_t *sh = json_array();
		for (int d = 0; d < t->n_dim; d++)
			json_array_append_new(sh, json_integer(t->shape[d]));
		int split = -1;             /* the dimension some rank holds a slice of */
		for (int r = 0; r < pl->n_rank && split < 0; r++)
			for (size_t j = 0; j < pl->rk[r].n && split < 0; j++)
				if (pl->rk[r].v[j].w == i)
					split = pl->rk[r].v[j].s.dim;
		json_array_append_new(tens, json_pack("{s:s, s:s, s:o, s:o}", "name", t->name, "dtype",
		                                      llm_dtype_name(t->dtype), "shape", sh,
		                                      "split", split >= 0 ? json_integer(split) : json_null()));
	}
	json_object_set_new(root, "tensors", tens);
	char *js = json_dumps(root, JSON_INDENT(1) | JSON_PRESERVE_ORDER);
	json_decref(root);
	return js;
}

/* tp x pp > 1: OUT is a directory, written under OUT.tmp.PID and renamed. */
static enum llm_status write_partitioned(struct plan *pl, const char *out_arg, uint8_t *buf)
{
	char tmp[4096 + 32], old[4096 + 32] = "", out[4096];   /* room for out's ".tmp.PID" */
	if (strlen(out_arg) >= sizeof out)
		return llm_fail(LLM_ERR_USAGE, "%.64s...: output path longer than %zu bytes", out_arg, sizeof out - 1);
	snprintf(out, sizeof out, "%s", out_arg);
	for (size_t n = strlen(out); n > 1 && out[n - 1] == '/';)
		out[--n] = 0;            /* "out/" names the directory out */
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
	if (mkdir(tmp, 0755) != 0)
		return llm_fail(LLM_ERR_IO, "%s: %s", tmp, strerror(errno));
	enum llm_status s = LLM_OK;
	const struct llm_aux *cfg = llm_ckpt_aux(&pl->ck, "config.json");
	for (int r = 0; !s && r < pl->n_rank; r++) {
		char *f = rank_file(r, r / pl->o->tp, r % pl->o->tp), *path = llm_path_join(tmp, f), *meta = rank_meta(pl, r);
		struct llm_aux aux[2] = { { (char *)"config.json", cfg->data, cfg->len },
		                          { (char *)LLM_PART_META, meta, meta ? strlen(meta) : 0 } };
		struct llm_ckpt_write_opts wo = { .progress = pl->o->write.progress };
		s = f && path && meta ? write_one(pl, &pl->rk[r], path, aux, 2, &wo, buf) : llm_fail(LLM_ERR_NOMEM, "out of memory");
		free(f), free(path), free(meta);
	}
	for (size_t i = 0; !s && i < pl->ck.n_aux; i++) {
		if (!strcmp(pl->ck.aux[i].name, LLM_PART_FILE))
			continue;
		char *p = llm_path_join(tmp, pl->ck.aux[i].name);
		s = llm_write_file_atomic(p, pl->ck.aux[i].data, pl->ck.aux[i].len);
		free(p);
	}
	if (!s) {
		char *js = record_json(pl), *p = llm_path_join(tmp, LLM_PART_FILE);
		s = js && p ? llm_write_file_atomic(p, js, strlen(js)) : llm_fail(LLM_ERR_NOMEM, "out of memory");
		free(js), free(p);
	}
	if (!s) {
		llm_fsync_dir(tmp);
		if (llm_exists(out)) {            /* --force: the old one goes only once the new one is there */
			snprintf(old, sizeof old, "%s.old.%d", out, (int)getpid());
			if (rename(out, old) != 0)
				s = llm_fail(LLM_ERR_IO, "%s: rename: %s", out, strerror(errno));
		}
		if (!s && rename(tmp, out) != 0) {
			s = llm_fail(LLM_ERR_IO, "%s: rename: %s", out, strerror(errno));
			if (old[0])
				rename(old, out);
		}
	}
	if (s) {
		llm_rm_rf(tmp);
		return s;
	}
	if (old[0])
		llm_rm_rf(old);
	char *parent = llm_strdup(out), *slash = strrchr(parent, '/');
	if (slash)
		*slash = 0;
	llm_fsync_dir(slash ? (*parent ? parent : "/") : ".");
	free(parent);
	return LLM_OK;
}

static void print_plan(const struct plan *pl, const char *in, FILE *out)
{
	fprintf(out, "# llm-repartition %s: --tp %d x --pp %d = %d ranks, %d layers\n", in, pl->o->tp, pl->o->pp,
	       pl->n_rank, pl->cfg.n_layer);
	fprintf(out, "%-6s %-6s %-3s %-10s %-8s %-14s %s\n", "rank", "stage", "tp", "layers", "tensors", "bytes", "file");
	for (int r = 0; r < pl->n_rank; r++) {
		int p = r / pl->o->tp;
		char ly[32], *f = rank_file(r, p, r % pl->o->tp);
		snprintf(ly, sizeof ly, "%d-%d", pl->layer0[p], pl->layer0[p + 1] - 1);
		fprintf(out, "%-6d %-6d %-3d %-10s %-8zu %-14llu %s\n", r, p, r % pl->o->tp, ly, pl->rk[r].n,
		       (unsigned long long)pl->rk[r].bytes, pl->n_rank > 1 ? f : "(Hugging Face layout)");
		free(f);
	}
}

static void plan_free(struct plan *pl)
{
	for (int r = 0; pl->rk && r < pl->n_rank; r++)
		free(pl->rk[r].v);
	free(pl->rk);
	free(pl->layer0);
	free(pl->c);
	free(pl->w);
	llm_ckpt_close(&pl->ck);
}

enum llm_status llm_repartition(const char *in, const char *out, const struct llm_part_opts *o)
{
	struct plan pl = { .o = o };
	uint8_t *buf = NULL;
	if (o->tp < 1 || o->pp < 1 || (int64_t)o->tp * o->pp > LLM_PART_MAX_RANKS)
		return llm_fail(LLM_ERR_USAGE, "--tp %d x --pp %d: each at least 1 and at most %d ranks in all",
		                o->tp, o->pp, LLM_PART_MAX_RANKS);
	if ((o->tp > 1 || o->pp > 1) && !strcmp(out, "-"))
		return llm_fail(LLM_ERR_USAGE, "a partitioned checkpoint is a directory; OUT cannot be -");
	if ((o->tp > 1 || o->pp > 1) && ends_with(out, ".safetensors"))
		return llm_fail(LLM_ERR_USAGE, "%s: a partitioned checkpoint is a directory, not one .safetensors file", out);
	if (!o->dry_run && strcmp(out, "-") && llm_exists(out) && !o->write.force)
		return llm_fail(LLM_ERR_EXISTS, "%s: exists (use --force to replace it)", out);
	enum llm_status s = llm_ckpt_open_lazy(&pl.ck, in);
	if (s)
		return s;
	const struct llm_aux *cj = llm_ckpt_aux(&pl.ck, "config.json");
	if (!cj) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: no config.json: the partition follows the model's heads and layers", in);
		goto out;
	}
	if ((s = llm_config_parse(&pl.cfg, cj->data, cj->len, "config.json"))) {
		s = llm_fail_prefix(s, "%s", in);
		goto out;
	}
	for (size_t f = 0; f < pl.ck.n_file; f++)
		pl.n_w += pl.ck.files[f].n_tensor;
	pl.w = calloc(pl.n_w + 1, sizeof *pl.w);
	pl.c = calloc(pl.n_w + 1, sizeof *pl.c);
	buf = malloc(CHUNK);
	if (!pl.w || !pl.c || !buf) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	/* whole tensors in file order (a partitioned input: the original order) */
	size_t k = 0;
	for (size_t f = 0; f < pl.ck.n_file; f++)
		for (size_t i = 0; i < pl.ck.files[f].n_tensor; i++)
			pl.w[k++] = &pl.ck.files[f].tensors[i];
	for (size_t i = 0; i < pl.n_w; i++)
		classify(&pl, i);
	pl.tied_head = !llm_ckpt_find(&pl.ck, "lm_head.weight");
	if ((s = find_scales(&pl)) || (s = check_tp(&pl)) || (s = plan_layers(&pl)) || (s = plan_ranks(&pl)))
		goto out;
	for (int r = 0; r < pl.n_rank; r++)
		pl.total += pl.rk[r].bytes;
	if (o->dry_run) {
		print_plan(&pl, in, stdout);
		goto out;
	}
	if (llm_log_level >= 2)        /* -v: on stderr, OUT may be - */
		print_plan(&pl, in, stderr);
	struct llm_progress *pg = o->write.progress;
	if (pg) {              /* totals over all ranks, before the first writer */
		pg->n_bytes = pl.total;
		for (int r = 0; r < pl.n_rank; r++)
			pg->n_items += pl.rk[r].n;
		for (size_t i = 0; i < pl.n_w; i++)
			pg->bytes_in += pl.w[i]->nbytes;
		pg->items_in = pl.n_w;
	}
	if (pl.n_rank == 1) {               /* Hugging Face layout */
		struct llm_aux *aux = calloc(pl.ck.n_aux + 1, sizeof *aux);
		size_t na = 0;
		if (!aux) {
			s = llm_fail(LLM_ERR_NOMEM, "out of memory");
			goto out;
		}
		for (size_t i = 0; i < pl.ck.n_aux; i++)
			if (strcmp(pl.ck.aux[i].name, LLM_PART_FILE))
				aux[na++] = pl.ck.aux[i];
		s = write_one(&pl, &pl.rk[0], out, aux, na, &o->write, buf);
		free(aux);
	} else {
		s = write_partitioned(&pl, out, buf);
	}
out:
	free(buf);
	plan_free(&pl);
	return s;
}
