/* common/checkpoint/ckpt_part.c: reading partitioned checkpoints (written by
 * llm-repartition, partition.c): the record (partition.json, or one rank
 * file's metadata) and the merged view of the rank files. Part of the
 * checkpoint layer, declared in ckpt.h: llm_ckpt_open opens a partitioned
 * directory through llm_partition_open_view, which opens each rank file as
 * one safetensors file (llm_st_open) and reads its record from the
 * metadata. Calls go one way: ckpt.c calls this file, never the reverse. Slices are byte copies, so the merged view shows the
 * original tensor bytes. Layout: man/llm-checkpoint.5. */
#define _GNU_SOURCE
#include "ckpt.h"
#include "fileio.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

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
	struct llm_st_file *rk;       /* (n_rk) rank files */
	struct llm_partition **rec;   /* (n_rk) each rank file's record, from its metadata */
	struct whole *w;              /* (n_tensor) parallel to the view's tensors */
	size_t n_w;
};

static void src_free(struct llm_part_src *src)
{
	for (int i = 0; src->rk && i < src->n_rk; i++) {
		llm_st_close(&src->rk[i]);
		llm_partition_free(src->rec[i]);
	}
	free(src->rk);
	free(src->rec);
	for (size_t i = 0; src->w && i < src->n_w; i++)
		free(src->w[i].pc);
	free(src->w);
	free(src);
}

void llm_partition_view2d(const struct llm_tensor *t, int64_t *rows, int64_t *cols)
{
	*cols = t->n_dim ? t->shape[t->n_dim - 1] : 1;
	*rows = *cols ? llm_tensor_numel(t) / *cols : 0;
	if (!*cols)
		*rows = t->n_dim > 1 ? t->shape[0] : 1;
}

int llm_partition_split_rows(const struct llm_tensor *t, int dim)
{
	return dim == 0 && t->n_dim == 2;
}

/* Rows and columns of the whole tensor W that piece P covers. */
static void piece_box(const struct llm_tensor *w, const struct piece *p, int64_t *r0, int64_t *r1,
                      int64_t *c0, int64_t *c1)
{
	llm_partition_view2d(w, r1, c1);
	*r0 = *c0 = 0;
	if (p->dim < 0)
		return;
	if (llm_partition_split_rows(w, p->dim)) {
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
		const struct llm_tensor *t = llm_st_find(&src->rk[r], w->name);
		if (!t)
			continue;
		const struct llm_slice *sl = llm_partition_slice(src->rec[r], w->name);
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
	llm_partition_view2d(w, &rows, &cols);
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

void llm_partition_release(const struct llm_ckpt *ck, const struct llm_tensor *t)
{
	const struct whole *wh = whole_of(ck, t);
	if (!wh) {
		llm_st_release(&ck->files[t->file], t);
		return;
	}
	for (size_t i = 0; i < wh->n_pc; i++)
		llm_st_release(&ck->part->src->rk[wh->pc[i].rk], wh->pc[i].t);
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
	src->rec = calloc((size_t)p->n_rank, sizeof *src->rec);
	src->w = calloc(p->n_tensor + 1, sizeof *src->w);
	ck->files = calloc(1, sizeof *ck->files);
	if (!src->rk || !src->rec || !src->w || !ck->files)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	src->n_w = p->n_tensor;
	for (int r = 0; r < p->n_rank; r++) {
		char *path = llm_path_join(dir, p->ranks[r].file);
		enum llm_status s = llm_st_open(&src->rk[r], path);
		src->n_rk = r + 1;
		if (!s && !llm_st_meta(&src->rk[r], LLM_PART_META))
			s = llm_fail(LLM_ERR_FORMAT, "%s: no %s record in the metadata", path, LLM_PART_META);
		else if (!s)
			s = llm_partition_from_meta(&src->rec[r], &src->rk[r]);
		const struct llm_partition *rec = src->rec[r];
		if (!s && (rec->rank != r || rec->tp != p->tp || rec->pp != p->pp))
			s = llm_fail(LLM_ERR_FORMAT, "%s: its record says rank %d of tp %d x pp %d; %s says rank %d of tp %d x pp %d",
			             path, rec->rank, rec->tp, rec->pp, LLM_PART_FILE,
			             r, p->tp, p->pp);
		free(path);
		if (s)
			return s;
	}
	/* every tensor of every rank file belongs to the record */
	for (int r = 0; r < p->n_rank; r++)
		for (size_t i = 0; i < src->rk[r].n_tensor; i++) {
			const char *nm = src->rk[r].tensors[i].name;
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
		llm_partition_view2d(t, &rows, &cols);
		LLM_TRY(gather(t, &src->w[i], 0, rows, 0, cols, buf));
		t->data = buf;
	}
	return LLM_OK;
}
