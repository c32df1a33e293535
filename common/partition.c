/* common/partition.c: plan a tensor x pipeline partition, write it one rank
 * file at a time, and read partitioned checkpoints back (the merged view
 * every tool sees, and the pieces llm-repartition streams from).
 *
 * Slicing is byte copying: a slice of a row-major tensor is a run of rows
 * (dim 0) or the same column range of every row (last dim), so a merge
 * returns the original bytes. The split rules are documented in
 * partition.h; the file layout in man/llm-checkpoint.5. */
#define _GNU_SOURCE
#include "partition.h"
#include "fileio.h"
#include "model.h"

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

/* ---- the record -------------------------------------------------------- */

static void src_free(struct llm_part_src *src);

void llm_partition_free(struct llm_partition *p)
{
	if (!p)
		return;
	if (p->src)
		src_free(p->src);
	free(p->layer0);
	for (int r = 0; p->ranks && r < p->n_rank; r++)
		free(p->ranks[r].file);
	free(p->ranks);
	for (size_t i = 0; i < p->n_tensor; i++)
		free(p->tensors[i].name);
	free(p->tensors);
	free(p->split);
	for (size_t i = 0; i < p->n_slice; i++)
		free(p->slice_name[i]);
	free(p->slice_name);
	free(p->slice);
	free(p);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

const struct llm_slice *llm_partition_slice(const struct llm_partition *p, const char *name)
{
	if (!p || !p->n_slice)
		return NULL;
	char *const *r = bsearch(&name, p->slice_name, p->n_slice, sizeof *p->slice_name, cmp_str);
	return r ? &p->slice[r - p->slice_name] : NULL;
}

enum llm_status llm_partition_check_world(const struct llm_partition *p, int size, const char *path)
{
	if (p->n_rank != size)
		return llm_fail(LLM_ERR_USAGE, "%s: partitioned for --tp %d x --pp %d = %d ranks, but %d %s launched "
		                "(mpirun -np %d)", path, p->tp, p->pp, p->n_rank, size, size == 1 ? "was" : "were",
		                p->n_rank);
	return LLM_OK;
}

int llm_partition_is_dir(const char *path)
{
	char *p = llm_path_join(path, LLM_PART_FILE);
	int r = p && llm_exists(p);
	free(p);
	return r;
}

static int json_int(json_t *o, const char *key, int64_t min, int64_t max, int64_t *out)
{
	json_t *v = json_object_get(o, key);
	if (!json_is_integer(v) || json_integer_value(v) < min || json_integer_value(v) > max)
		return -1;
	*out = json_integer_value(v);
	return 0;
}

/* The common fields of partition.json and of a rank's metadata. */
static enum llm_status parse_common(struct llm_partition *p, json_t *root, const char *where)
{
	int64_t tp, pp, nl;
	const char *fmt = json_string_value(json_object_get(root, "format"));
	if (!fmt || strcmp(fmt, "llm-partition") || json_integer_value(json_object_get(root, "version")) != 1)
		return llm_fail(LLM_ERR_FORMAT, "%s: not an llm-partition record of version 1", where);
	if (json_int(root, "tp", 1, LLM_PART_MAX_RANKS, &tp) || json_int(root, "pp", 1, LLM_PART_MAX_RANKS, &pp) ||
	    tp * pp > LLM_PART_MAX_RANKS || json_int(root, "n_layer", 1, 1 << 20, &nl))
		return llm_fail(LLM_ERR_FORMAT, "%s: tp, pp or n_layer missing or out of range", where);
	p->tp = (int)tp;
	p->pp = (int)pp;
	p->n_rank = (int)(tp * pp);
	p->n_layer = (int)nl;
	return LLM_OK;
}

static int safe_file_name(const char *f)
{
	return f && *f && !strchr(f, '/') && strcmp(f, ".") && strcmp(f, "..");
}

enum llm_status llm_partition_load(struct llm_partition **pp_out, const char *dir)
{
	*pp_out = NULL;
	char *path = llm_path_join(dir, LLM_PART_FILE), *buf = NULL;
	size_t len;
	enum llm_status s = llm_read_file(path, &buf, &len);
	json_t *root = NULL;
	struct llm_partition *p = calloc(1, sizeof *p);
	if (s || !p) {
		s = s ? s : llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	p->rank = -1;
	json_error_t err;
	root = json_loadb(buf, len, 0, &err);
	if (!json_is_object(root)) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: %s", path, root ? "not a JSON object" : err.text);
		goto out;
	}
	if ((s = parse_common(p, root, path)))
		goto out;
	json_t *stages = json_object_get(root, "stages"), *ranks = json_object_get(root, "ranks");
	json_t *tens = json_object_get(root, "tensors");
	if (!json_is_array(stages) || (int)json_array_size(stages) != p->pp || !json_is_array(ranks) ||
	    (int)json_array_size(ranks) != p->n_rank || !json_is_array(tens)) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: stages, ranks or tensors missing, or not %d stages and %d ranks",
		             path, p->pp, p->n_rank);
		goto out;
	}
	p->layer0 = calloc((size_t)p->pp + 1, sizeof *p->layer0);
	p->ranks = calloc((size_t)p->n_rank, sizeof *p->ranks);
	p->n_tensor = json_array_size(tens);
	p->tensors = calloc(p->n_tensor + 1, sizeof *p->tensors);
	p->split = calloc(p->n_tensor + 1, sizeof *p->split);
	if (!p->layer0 || !p->ranks || !p->tensors || !p->split) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	for (int i = 0; i < p->pp; i++) {
		json_t *st = json_array_get(stages, (size_t)i);
		int64_t a = json_integer_value(json_array_get(st, 0)), b = json_integer_value(json_array_get(st, 1));
		if (!json_is_array(st) || a != (i ? p->layer0[i] : 0) || b <= a || b > p->n_layer ||
		    (i == p->pp - 1 && b != p->n_layer)) {
			s = llm_fail(LLM_ERR_FORMAT, "%s: stage %d: layer range does not continue the stages before it "
			             "or leaves layers out", path, i);
			goto out;
		}
		p->layer0[i] = (int)a;
		p->layer0[i + 1] = (int)b;
	}
	for (int r = 0; r < p->n_rank; r++) {
		json_t *e = json_array_get(ranks, (size_t)r);
		struct llm_part_rank *k = &p->ranks[r];
		int64_t rk, st, t;
		const char *f = json_string_value(json_object_get(e, "file"));
		if (json_int(e, "rank", r, r, &rk) || json_int(e, "stage", r / p->tp, r / p->tp, &st) ||
		    json_int(e, "tp_rank", r % p->tp, r % p->tp, &t) || !safe_file_name(f)) {
			s = llm_fail(LLM_ERR_FORMAT, "%s: ranks[%d]: rank, stage, tp_rank or file wrong "
			             "(rank = stage * tp + tp_rank; a file name inside the directory)", path, r);
			goto out;
		}
		for (int q = 0; q < r; q++)
			if (!strcmp(p->ranks[q].file, f)) {
				s = llm_fail(LLM_ERR_FORMAT, "%s: ranks %d and %d share the file %s", path, q, r, f);
				goto out;
			}
		*k = (struct llm_part_rank){ (int)rk, (int)st, (int)t, p->layer0[st], p->layer0[st + 1], llm_strdup(f),
		                             (uint64_t)json_integer_value(json_object_get(e, "bytes")) };
	}
	for (size_t i = 0; i < p->n_tensor; i++) {
		json_t *e = json_array_get(tens, i), *sh = json_object_get(e, "shape"), *sp = json_object_get(e, "split");
		const char *name = json_string_value(json_object_get(e, "name"));
		int dt = llm_dtype_parse(json_string_value(json_object_get(e, "dtype")) ? json_string_value(json_object_get(e, "dtype")) : "");
		struct llm_tensor *t = &p->tensors[i];
		if (!name || dt < 0 || !json_is_array(sh) || json_array_size(sh) > LLM_MAX_DIM ||
		    !(json_is_null(sp) || json_is_integer(sp))) {
			s = llm_fail(LLM_ERR_FORMAT, "%s: tensors[%zu]: name, dtype, shape or split missing or wrong", path, i);
			goto out;
		}
		t->name = llm_strdup(name);
		t->dtype = (enum llm_dtype)dt;
		t->n_dim = (int)json_array_size(sh);
		for (int d = 0; d < t->n_dim; d++) {
			t->shape[d] = json_integer_value(json_array_get(sh, (size_t)d));
			if (t->shape[d] < 0 || t->shape[d] > ((int64_t)1 << 40)) {
				s = llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': bad shape", path, name);
				goto out;
			}
		}
		t->nbytes = (size_t)llm_tensor_numel(t) * llm_dtype_size(t->dtype);
		p->split[i] = json_is_null(sp) ? -1 : (int)json_integer_value(sp);
		if (p->split[i] < -1 || p->split[i] >= (t->n_dim ? t->n_dim : 1)) {
			s = llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': split dimension %d out of range", path, name, p->split[i]);
			goto out;
		}
	}
out:
	json_decref(root);
	free(buf);
	free(path);
	if (s)
		llm_partition_free(p);
	else
		*pp_out = p;
	return s;
}

enum llm_status llm_partition_from_meta(struct llm_partition **out, const struct llm_st_file *f)
{
	*out = NULL;
	const char *js = llm_st_meta(f, LLM_PART_META);
	if (!js)
		return llm_fail(LLM_ERR_FORMAT, "%s: no %s record in the metadata", f->path, LLM_PART_META);
	struct llm_partition *p = calloc(1, sizeof *p);
	json_error_t err;
	json_t *root = json_loads(js, 0, &err);
	enum llm_status s = LLM_OK;
	if (!p) {
		json_decref(root);
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	if (!json_is_object(root)) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: metadata %s: %s", f->path, LLM_PART_META, root ? "not an object" : err.text);
		goto out;
	}
	if ((s = parse_common(p, root, f->path)))
		goto out;
	int64_t rk, st, t;
	json_t *ly = json_object_get(root, "layers"), *sl = json_object_get(root, "slices");
	if (json_int(root, "rank", 0, p->n_rank - 1, &rk) || json_int(root, "stage", rk / p->tp, rk / p->tp, &st) ||
	    json_int(root, "tp_rank", rk % p->tp, rk % p->tp, &t) || !json_is_array(ly) || !json_is_object(sl)) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: metadata %s: rank, stage, tp_rank, layers or slices wrong",
		             f->path, LLM_PART_META);
		goto out;
	}
	p->rank = (int)rk;
	p->ranks = calloc((size_t)p->n_rank, sizeof *p->ranks);     /* only ranks[rank] filled */
	p->n_slice = json_object_size(sl);
	p->slice_name = calloc(p->n_slice + 1, sizeof *p->slice_name);
	p->slice = calloc(p->n_slice + 1, sizeof *p->slice);
	if (!p->ranks || !p->slice_name || !p->slice) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	const char *b = strrchr(f->path, '/');
	p->ranks[rk] = (struct llm_part_rank){ (int)rk, (int)st, (int)t,
	                                      (int)json_integer_value(json_array_get(ly, 0)),
	                                      (int)json_integer_value(json_array_get(ly, 1)),
	                                      llm_strdup(b ? b + 1 : f->path), 0 };
	size_t k = 0;
	const char *name;
	json_t *v;
	json_object_foreach(sl, name, v) {
		const struct llm_tensor *ten = llm_st_find(f, name);
		int64_t dim = json_integer_value(json_array_get(v, 0)), start = json_integer_value(json_array_get(v, 1));
		int64_t full = json_integer_value(json_array_get(v, 2));
		if (!ten || !json_is_array(v) || json_array_size(v) != 3 || dim < 0 || dim >= (ten->n_dim ? ten->n_dim : 1) ||
		    (ten->n_dim == 2 && dim != 0 && dim != 1) || (ten->n_dim > 2) || start < 0 ||
		    start + (ten->n_dim ? ten->shape[dim] : 1) > full) {
			s = llm_fail(LLM_ERR_FORMAT, "%s: metadata %s: slice of '%s' wrong (no such tensor, or its range "
			             "leaves the whole tensor)", f->path, LLM_PART_META, name);
			p->n_slice = k;
			goto out;
		}
		p->slice_name[k] = llm_strdup(name);
		p->slice[k] = (struct llm_slice){ (int)dim, start, ten->n_dim ? ten->shape[dim] : 1, full };
		k++;
	}
	/* sort names, carrying the slices along */
	for (size_t i = 1; i < k; i++)
		for (size_t j = i; j > 0 && strcmp(p->slice_name[j - 1], p->slice_name[j]) > 0; j--) {
			char *tn = p->slice_name[j];
			struct llm_slice ts = p->slice[j];
			p->slice_name[j] = p->slice_name[j - 1], p->slice[j] = p->slice[j - 1];
			p->slice_name[j - 1] = tn, p->slice[j - 1] = ts;
		}
out:
	json_decref(root);
	if (s)
		llm_partition_free(p);
	else
		*out = p;
	return s;
}

enum llm_status llm_partition_attach(struct llm_ckpt *ck, struct llm_partition *p, int rank)
{
	struct llm_partition *m = ck->part;
	enum llm_status s = LLM_OK;
	if (!m)
		s = llm_fail(LLM_ERR_FORMAT, "%s: no %s record in the metadata: not a rank file", ck->path, LLM_PART_META);
	else if (m->rank != rank || m->tp != p->tp || m->pp != p->pp || m->n_layer != p->n_layer ||
	         m->ranks[rank].layer_begin != p->ranks[rank].layer_begin || m->ranks[rank].layer_end != p->ranks[rank].layer_end ||
	         strcmp(m->ranks[rank].file, p->ranks[rank].file))
		s = llm_fail(LLM_ERR_FORMAT, "%s: its record (rank %d of tp %d x pp %d) disagrees with %s (rank %d of tp %d x pp %d)",
		             ck->path, m->rank, m->tp, m->pp, LLM_PART_FILE, rank, p->tp, p->pp);
	if (s) {
		llm_partition_free(p);
		return s;
	}
	p->rank = rank;
	p->n_slice = m->n_slice, p->slice_name = m->slice_name, p->slice = m->slice;
	m->n_slice = 0, m->slice_name = NULL, m->slice = NULL;
	llm_partition_free(m);
	ck->part = p;
	return LLM_OK;
}

/* ---- pieces: a whole tensor from the rank files ------------------------ */

struct piece {
	const struct llm_tensor *t;   /* in rank file rk */
	int rk;
	int dim;                      /* -1: t is the whole tensor */
	int64_t start;
};

struct whole {
	struct piece *pc;             /* tiling the whole tensor, in order along dim */
	size_t n_pc;
};

struct llm_part_src {
	int n_rk;
	struct llm_ckpt *rk;          /* (n_rk) rank files */
	struct whole *w;              /* (n_tensor) parallel to the view's tensors */
	size_t n_w;
};

static void src_free(struct llm_part_src *src)
{
	for (int i = 0; src->rk && i < src->n_rk; i++)
		llm_ckpt_close(&src->rk[i]);
	free(src->rk);
	for (size_t i = 0; src->w && i < src->n_w; i++)
		free(src->w[i].pc);
	free(src->w);
	free(src);
}

/* 2-D view of T: rows, cols; whether split dim D runs along the rows. */
static void view2d(const struct llm_tensor *t, int64_t *rows, int64_t *cols)
{
	*cols = t->n_dim ? t->shape[t->n_dim - 1] : 1;
	*rows = *cols ? llm_tensor_numel(t) / *cols : 0;
	if (!*cols)
		*rows = t->n_dim > 1 ? t->shape[0] : 1;
}

static int split_is_rows(const struct llm_tensor *t, int dim)
{
	return dim == 0 && t->n_dim == 2;
}

/* Rows and columns of the whole tensor W that piece P covers. */
static void piece_box(const struct llm_tensor *w, const struct piece *p, int64_t *r0, int64_t *r1,
                      int64_t *c0, int64_t *c1)
{
	view2d(w, r1, c1);
	*r0 = *c0 = 0;
	if (p->dim < 0)
		return;
	if (split_is_rows(w, p->dim)) {
		*r0 = p->start;
		*r1 = p->start + p->t->shape[0];
	} else {
		*c0 = p->start;
		*c1 = p->start + (p->t->n_dim ? p->t->shape[p->t->n_dim - 1] : 1);
	}
}

static int cmp_piece(const void *a, const void *b)
{
	const struct piece *x = a, *y = b;
	return x->start < y->start ? -1 : x->start > y->start ? 1 : x->rk - y->rk;
}

/* The pieces of whole tensor W (record index I) among the rank files: one
 * whole copy if any rank holds one, else the slices tiling it. */
static enum llm_status find_pieces(struct llm_part_src *src, const struct llm_tensor *w, const char *dir,
                                   struct whole *out)
{
	struct piece *pc = calloc((size_t)src->n_rk + 1, sizeof *pc);
	size_t n = 0;
	if (!pc)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	out->pc = pc;
	for (int r = 0; r < src->n_rk; r++) {
		const struct llm_tensor *t = llm_ckpt_find(&src->rk[r], w->name);
		if (!t)
			continue;
		const struct llm_slice *sl = llm_partition_slice(src->rk[r].part, w->name);
		const char *what = NULL;
		if (t->dtype != w->dtype)
			what = "dtype";
		else if (t->n_dim != w->n_dim)
			what = "rank of its shape";
		for (int d = 0; !what && d < t->n_dim; d++)
			if (t->shape[d] != w->shape[d] && !(sl && sl->dim == d && sl->full == w->shape[d]))
				what = "shape";
		if (what)
			return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s' in %s: its %s does not match %s", dir, w->name,
			                src->rk[r].path, what, LLM_PART_FILE);
		if (!sl) {                /* a whole copy: take it alone */
			pc[0] = (struct piece){ t, r, -1, 0 };
			out->n_pc = 1;
			return LLM_OK;
		}
		pc[n++] = (struct piece){ t, r, sl->dim, sl->start };
	}
	if (!n)
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s' is in no rank file", dir, w->name);
	qsort(pc, n, sizeof *pc, cmp_piece);
	/* tile [0, full): identical replicas (kv heads) kept once */
	size_t k = 0;
	int64_t at = 0, full = w->shape[pc[0].dim];
	for (size_t i = 0; i < n; i++) {
		int64_t len = pc[i].t->shape[pc[i].dim];
		if (pc[i].dim != pc[0].dim)
			return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s' is split along two dimensions", dir, w->name);
		if (k && pc[i].start == pc[k - 1].start && len == pc[k - 1].t->shape[pc[i].dim])
			continue;
		if (pc[i].start != at)
			return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': %s [%lld, %lld) of %lld along dimension %d",
			                dir, w->name, pc[i].start > at ? "no rank file holds" : "rank files overlap in",
			                (long long)(pc[i].start > at ? at : pc[i].start),
			                (long long)(pc[i].start > at ? pc[i].start : at), (long long)full, pc[i].dim);
		at += len;
		pc[k++] = pc[i];
	}
	if (at != full)
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': no rank file holds [%lld, %lld) along dimension %d",
		                dir, w->name, (long long)at, (long long)full, pc[0].dim);
	out->n_pc = k;
	return LLM_OK;
}

static enum llm_status gather(const struct llm_tensor *w, const struct whole *wh, int64_t r0, int64_t r1,
                              int64_t c0, int64_t c1, uint8_t *dst)
{
	size_t es = llm_dtype_size(w->dtype);
	int64_t rows, cols;
	view2d(w, &rows, &cols);
	if (r0 < 0 || r1 > rows || r0 > r1 || c0 < 0 || c1 > cols || c0 > c1)
		return llm_fail(LLM_ERR_INTERNAL, "tensor '%s': read [%lld, %lld) x [%lld, %lld) outside %lld x %lld",
		                w->name, (long long)r0, (long long)r1, (long long)c0, (long long)c1,
		                (long long)rows, (long long)cols);
	for (int64_t r = r0; r < r1;) {
		int64_t c = c0, adv = 1;
		while (c < c1) {
			const struct piece *p = NULL;
			int64_t pr0 = 0, pr1 = 0, pc0 = 0, pc1 = 0;
			for (size_t i = 0; i < wh->n_pc && !p; i++) {
				piece_box(w, &wh->pc[i], &pr0, &pr1, &pc0, &pc1);
				if (pr0 <= r && r < pr1 && pc0 <= c && c < pc1)
					p = &wh->pc[i];
			}
			if (!p)
				return llm_fail(LLM_ERR_FORMAT, "tensor '%s': element (%lld, %lld) is in no rank file",
				                w->name, (long long)r, (long long)c);
			const uint8_t *src = (const uint8_t *)p->t->data;
			int64_t pw = pc1 - pc0;
			if (c == c0 && pc0 == c0 && pc1 == c1) {
				/* whole rows of the piece: a run of rows is one copy */
				adv = (r1 < pr1 ? r1 : pr1) - r;
				memcpy(dst, src + (size_t)((r - pr0) * pw) * es, (size_t)(adv * pw) * es);
				dst += (size_t)(adv * pw) * es;
				break;
			}
			int64_t k = (c1 < pc1 ? c1 : pc1) - c;
			memcpy(dst, src + (size_t)((r - pr0) * pw + (c - pc0)) * es, (size_t)k * es);
			dst += (size_t)k * es;
			c += k;
		}
		r += adv;
	}
	return LLM_OK;
}

static const struct whole *whole_of(const struct llm_ckpt *ck, const struct llm_tensor *t)
{
	if (!ck->part || !ck->part->src || ck->n_file != 1)
		return NULL;
	size_t i = (size_t)(t - ck->files[0].tensors);
	return t >= ck->files[0].tensors && i < ck->part->src->n_w ? &ck->part->src->w[i] : NULL;
}

enum llm_status llm_partition_read(const struct llm_ckpt *ck, const struct llm_tensor *t,
                                   int64_t r0, int64_t r1, int64_t c0, int64_t c1, void *dst)
{
	const struct whole *wh = whole_of(ck, t);
	struct piece one = { t, 0, -1, 0 };
	struct whole w1 = { &one, 1 };
	if (t->data || !wh)
		wh = &w1;               /* whole in memory: the tensor is its one piece */
	if (!wh->pc[0].t->data)
		return llm_fail(LLM_ERR_INTERNAL, "tensor '%s' has no data", t->name);
	return gather(t, wh, r0, r1, c0, c1, dst);
}

/* Drop the source pages of T from the resident set (streaming). */
static void release_whole(const struct llm_ckpt *ck, const struct llm_tensor *t)
{
	const struct whole *wh = whole_of(ck, t);
	if (!wh) {
		llm_ckpt_release(ck, t);
		return;
	}
	for (size_t i = 0; i < wh->n_pc; i++)
		llm_ckpt_release(&ck->part->src->rk[wh->pc[i].rk], wh->pc[i].t);
}

enum llm_status llm_partition_open_view(struct llm_ckpt *ck, const char *dir, int assemble)
{
	struct llm_partition *p;
	LLM_TRY(llm_partition_load(&p, dir));
	ck->part = p;            /* freed by llm_ckpt_close from here on */
	struct llm_part_src *src = calloc(1, sizeof *src);
	if (!src)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	p->src = src;
	src->rk = calloc((size_t)p->n_rank, sizeof *src->rk);
	src->w = calloc(p->n_tensor + 1, sizeof *src->w);
	ck->files = calloc(1, sizeof *ck->files);
	if (!src->rk || !src->w || !ck->files)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	src->n_w = p->n_tensor;
	for (int r = 0; r < p->n_rank; r++) {
		char *path = llm_path_join(dir, p->ranks[r].file);
		enum llm_status s = llm_ckpt_open(&src->rk[r], path);
		src->n_rk = r + 1;
		if (!s && !src->rk[r].part)
			s = llm_fail(LLM_ERR_FORMAT, "%s: no %s record in the metadata", path, LLM_PART_META);
		else if (!s && (src->rk[r].part->rank != r || src->rk[r].part->tp != p->tp || src->rk[r].part->pp != p->pp))
			s = llm_fail(LLM_ERR_FORMAT, "%s: its record says rank %d of tp %d x pp %d; %s says rank %d of tp %d x pp %d",
			             path, src->rk[r].part->rank, src->rk[r].part->tp, src->rk[r].part->pp, LLM_PART_FILE,
			             r, p->tp, p->pp);
		free(path);
		if (s)
			return s;
	}
	/* every tensor of every rank file belongs to the record */
	for (int r = 0; r < p->n_rank; r++)
		for (size_t i = 0; i < src->rk[r].n_tensor; i++) {
			const char *nm = src->rk[r].tensors[i]->name;
			size_t j = 0;
			while (j < p->n_tensor && strcmp(p->tensors[j].name, nm))
				j++;
			if (j == p->n_tensor)
				return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s' of %s is not in %s", dir, nm,
				                p->ranks[r].file, LLM_PART_FILE);
		}
	/* the view: one virtual file of whole tensors, in the record's order */
	struct llm_st_file *f = &ck->files[0];
	ck->n_file = 1;
	f->path = llm_strdup(dir);
	f->tensors = calloc(p->n_tensor + 1, sizeof *f->tensors);
	f->copies = calloc(p->n_tensor + 1, sizeof *f->copies);
	if (!f->tensors || !f->copies)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < p->n_tensor; i++) {
		struct llm_tensor *t = &f->tensors[i];
		*t = p->tensors[i];
		t->name = llm_strdup(p->tensors[i].name);
		t->data = NULL;
		f->n_tensor = i + 1;
		LLM_TRY(find_pieces(src, t, dir, &src->w[i]));
		if (src->w[i].pc[0].dim < 0) {
			t->data = src->w[i].pc[0].t->data;
			continue;
		}
		if (!assemble)
			continue;
		void *buf = aligned_alloc(64, (t->nbytes + 63) & ~(size_t)63);
		if (!buf)
			return llm_fail(LLM_ERR_NOMEM, "%s: out of memory assembling '%s' (%zu bytes)", dir, t->name, t->nbytes);
		f->copies[f->n_copies++] = buf;
		int64_t rows, cols;
		view2d(t, &rows, &cols);
		LLM_TRY(gather(t, &src->w[i], 0, rows, 0, cols, buf));
		t->data = buf;
	}
	return LLM_OK;
}

/* ---- planning ---------------------------------------------------------- */

enum kind { K_OTHER, K_LAYER, K_EMBED, K_HEAD, K_FNORM, K_Q, K_KV, K_O, K_FF, K_DOWN, K_SCALE };

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
	double t0, last;
	uint64_t done_before, total;
	int cur;
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

/* weight_block_size of config.json's quantization_config (0: none). */
static void config_block(const struct llm_ckpt *ck, int64_t *bn, int64_t *bk)
{
	*bn = *bk = 0;
	const struct llm_aux *a = llm_ckpt_aux(ck, "config.json");
	json_t *root = a ? json_loadb(a->data, a->len, 0, NULL) : NULL;
	json_t *b = json_object_get(json_object_get(root, "quantization_config"), "weight_block_size");
	if (json_is_array(b) && json_array_size(b) == 2) {
		*bn = json_integer_value(json_array_get(b, 0));
		*bk = json_integer_value(json_array_get(b, 1));
	}
	json_decref(root);
}

/* Scales of the E4M3 weights: which tensor, which block. The layouts are
 * those llm_ckpt_weight (ckpt.c) reads: "_scale_inv" 2-D blocks (block from
 * config.json or the shapes), "_scale" per tensor or per output channel. */
static enum llm_status find_scales(struct plan *pl)
{
	int64_t cbn, cbk;
	config_block(&pl->ck, &cbn, &cbk);
	for (size_t i = 0; i < pl->n_w; i++) {
		const struct llm_tensor *w = pl->w[i];
		if (w->dtype != LLM_DTYPE_E4M3)
			continue;
		if (w->n_dim != 2)
			return llm_fail(LLM_ERR_UNSUPPORTED, "%s: tensor '%s': an F8_E4M3 tensor of %d dimensions cannot be split",
			                pl->ck.path, w->name, w->n_dim);
		char sn[1024];
		snprintf(sn, sizeof sn, "%s_scale_inv", w->name);
		long j = find_whole(pl, sn);
		int inv = j >= 0;
		if (j < 0) {
			snprintf(sn, sizeof sn, "%s_scale", w->name);
			j = find_whole(pl, sn);
		}
		if (j < 0)
			return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s' is F8_E4M3 but has no '%s_scale_inv' or '%s_scale'",
			                pl->ck.path, w->name, w->name, w->name);
		const struct llm_tensor *sc = pl->w[j];
		int64_t R = w->shape[0], C = w->shape[1], sn_el = llm_tensor_numel(sc), bn, bk;
		if (inv && sc->n_dim == 2) {
			bn = cbn, bk = cbk;
			if (bn <= 0 || bk <= 0) {
				bn = sc->shape[0] ? (R + sc->shape[0] - 1) / sc->shape[0] : 0;
				bk = sc->shape[1] ? (C + sc->shape[1] - 1) / sc->shape[1] : 0;
			}
			if (bn <= 0 || bk <= 0 || sc->shape[0] != (R + bn - 1) / bn || sc->shape[1] != (C + bk - 1) / bk)
				return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': shape [%lld, %lld] does not match blocks %lldx%lld of a %lldx%lld weight",
				                pl->ck.path, sc->name, (long long)sc->shape[0], (long long)sc->shape[1],
				                (long long)bn, (long long)bk, (long long)R, (long long)C);
		} else if (sn_el == 1) {
			bn = R, bk = C;
		} else if (sn_el == R && (sc->n_dim == 1 || (sc->n_dim == 2 && sc->shape[1] == 1))) {
			bn = 1, bk = C;
		} else {
			return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': unsupported scale shape for a %lldx%lld weight",
			                pl->ck.path, sc->name, (long long)R, (long long)C);
		}
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
	static const enum kind order[] = { K_Q, K_O, K_KV, K_FF, K_DOWN, K_EMBED, K_HEAD };
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
		int64_t want = c->k == K_Q || c->k == K_O ? (int64_t)g->n_head * g->d_head :
		               c->k == K_KV ? (int64_t)g->n_kv_head * g->d_head :
		               c->k == K_FF || c->k == K_DOWN ? g->d_ff : g->n_vocab;
		if (w->shape[c->dim] != want)
			return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': %lld along dimension %d, config.json implies %lld",
			                pl->ck.path, w->name, (long long)w->shape[c->dim], c->dim, (long long)want);
		if (T == 1)
			continue;
		int64_t n = c->k == K_Q || c->k == K_O ? g->n_head : c->k == K_KV ? g->n_kv_head :
		            c->k == K_FF || c->k == K_DOWN ? g->d_ff : g->n_vocab;
		if ((c->k == K_Q || c->k == K_O) && n % T)
			return llm_fail(LLM_ERR_USAGE, "tensor '%s': %lld attention heads do not split evenly over --tp %d",
			                w->name, (long long)n, T);
		if ((c->k == K_FF || c->k == K_DOWN) && n % T)
			return llm_fail(LLM_ERR_USAGE, "tensor '%s': intermediate_size %lld does not split evenly over --tp %d",
			                w->name, (long long)n, T);
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

static void progress(struct plan *pl, struct llm_ckpt_writer *w, int final)
{
	if (!pl->o->progress)
		return;
	double now = llm_now();
	if (!final && now - pl->last < 0.25)
		return;
	pl->last = now;
	size_t done = 0, total = 0;
	if (w)
		llm_ckpt_write_progress(w, &done, &total);
	uint64_t d = pl->done_before + done;
	double el = now - pl->t0, mbs = el > 0 ? d / 1e6 / el : 0;
	fprintf(stderr, "\r%s: rank %d/%d  %.0f/%.0f MB  %.0f MB/s  ETA %.0f s   ", llm_progname(), pl->cur + 1,
	        pl->n_rank, d / 1e6, pl->total / 1e6, mbs, mbs > 0 ? (pl->total - d) / 1e6 / mbs : 0);
	if (final)
		fputc('\n', stderr);
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
			progress(pl, w, 0);
		}
		return LLM_OK;
	}
	int64_t rows, cols, r0 = 0, c0 = 0;
	view2d(t, &rows, &cols);
	int64_t r1 = rows, c1 = cols;
	if (ps->s.dim >= 0 && split_is_rows(t, ps->s.dim))
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
		progress(pl, w, 0);
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
		release_whole(&pl->ck, pl->w[pr->v[i].w]);
	}
	if (s) {
		llm_ckpt_write_abort(w);
		return s;
	}
	pl->done_before += pr->bytes;
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
static enum llm_status write_partitioned(struct plan *pl, const char *out, uint8_t *buf)
{
	char tmp[4096], old[4096] = "";
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", out, (int)getpid());
	if (mkdir(tmp, 0755) != 0)
		return llm_fail(LLM_ERR_IO, "%s: %s", tmp, strerror(errno));
	enum llm_status s = LLM_OK;
	const struct llm_aux *cfg = llm_ckpt_aux(&pl->ck, "config.json");
	for (int r = 0; !s && r < pl->n_rank; r++) {
		pl->cur = r;
		char *f = rank_file(r, r / pl->o->tp, r % pl->o->tp), *path = llm_path_join(tmp, f), *meta = rank_meta(pl, r);
		struct llm_aux aux[2] = { { (char *)"config.json", cfg->data, cfg->len },
		                          { (char *)LLM_PART_META, meta, meta ? strlen(meta) : 0 } };
		struct llm_ckpt_write_opts wo = { 0 };
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
	pl.t0 = pl.last = llm_now();
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
	if (!s)
		progress(&pl, NULL, 1);
out:
	free(buf);
	plan_free(&pl);
	return s;
}
