/* common/train/finetune.c: a LoRA fine-tuning run (see train.h): data, steps with
 * gradient accumulation, AdamW, progress, the loss log, the training state
 * and resuming, the adapter files.
 *
 * Determinism: a step's rows, dropout masks and learning rate are functions
 * of (seed, step) alone, and the trainer is deterministic, so a run resumed
 * from a saved state (parameters, AdamW moments, step) ends with the same
 * adapter, bit for bit, as one never interrupted. */
#define _GNU_SOURCE
#include "train.h"
#include "tokenizer.h"
#include "fileio.h"
#include "comm.h"
#include "hash.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include "banned.h"

#define STATE_MAGIC "LLMFTST1"
#define STATE_NAME "training_state.bin"

enum llm_status llm_finetune_tokenizer(const struct llm_model *m, const char *path,
                                       struct llm_tokenizer **tk)
{
	if (llm_ckpt_aux(&m->ck, "tokenizer.json") && !m->ck.is_dir) {
		return llm_tokenizer_open_ckpt(tk, path, &m->ck);
	}
	if (m->ck.is_dir)
		return llm_tokenizer_open(tk, path);
	return llm_fail(LLM_ERR_FORMAT, "%s: no tokenizer.json in the checkpoint", path);
}

static void warn_line(const char *msg) { llm_warn("%s", msg); }

/* Everything that shapes the trajectory: a resumed run must match it. */
static uint64_t fingerprint(const struct llm_finetune_opts *o, const struct llm_lora *lo,
                            const struct llm_dataset *d, int64_t steps)
{
	char buf[1024];
	const struct llm_adamw_opts *a = &o->adam;
	int n = snprintf(buf, sizeof buf, "%zu %d %a %a %u %d %d %d %lld %a %a %lld %a %a %a %a %a %llu %d %d",
	                 lo->n_params, lo->rank, (double)lo->alpha, (double)lo->dropout, lo->targets,
	                 o->seq_len, o->micro_batch, o->grad_accum, (long long)steps, a->lr, a->min_lr_ratio,
	                 (long long)a->warmup, a->beta1, a->beta2, a->eps, a->weight_decay, a->clip,
	                 (unsigned long long)o->seed, o->pack, o->data_o.train_on_prompt);
	uint64_t h = llm_hash_fnv1a(LLM_FNV1A_INIT, buf, (size_t)n);
	for (int i = 0; i < d->n; i++) {
		h = llm_hash_fnv1a(h, d->s[i].ids, (size_t)d->s[i].n * sizeof(int32_t));
		h = llm_hash_fnv1a(h, d->s[i].loss, (size_t)d->s[i].n);
	}
	return h;
}

struct state_hdr {
	char magic[8];
	uint64_t fingerprint;
	int64_t step;           /* updates done */
	int64_t adam_step;
	uint64_t n_params;
};

static enum llm_status state_save(const char *path, uint64_t fp, int64_t step, const struct llm_lora *lo,
                                  const struct llm_adamw *a)
{
	size_t n = lo->n_params, bytes = sizeof(struct state_hdr) + 3 * n * sizeof(float);
	char *buf = malloc(bytes);
	if (!buf)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	struct state_hdr h;
	memset(&h, 0, sizeof h);
	memcpy(h.magic, STATE_MAGIC, 8);
	h.fingerprint = fp;
	h.step = step;
	h.adam_step = a->step;
	h.n_params = n;
	memcpy(buf, &h, sizeof h);
	memcpy(buf + sizeof h, lo->params, n * sizeof(float));
	memcpy(buf + sizeof h + n * sizeof(float), a->m, n * sizeof(float));
	memcpy(buf + sizeof h + 2 * n * sizeof(float), a->v, n * sizeof(float));
	enum llm_status s = llm_write_file_atomic(path, buf, bytes);
	free(buf);
	return s;
}

static enum llm_status state_load(const char *path, uint64_t fp, int64_t *step, struct llm_lora *lo,
                                  struct llm_adamw *a)
{
	char *buf;
	size_t len;
	LLM_TRY(llm_read_file(path, &buf, &len));
	struct state_hdr h;
	size_t n = lo->n_params;
	enum llm_status s = LLM_OK;
	if (len < sizeof h) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: truncated", path);
		goto out;
	}
	memcpy(&h, buf, sizeof h);
	if (memcmp(h.magic, STATE_MAGIC, 8) || h.n_params != n || len != sizeof h + 3 * n * sizeof(float)) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: not a training state of this adapter", path);
		goto out;
	}
	if (h.fingerprint != fp) {
		s = llm_fail(LLM_ERR_USAGE, "%s: the state was saved with other options or data; "
		             "resume with the same ones", path);
		goto out;
	}
	memcpy(lo->params, buf + sizeof h, n * sizeof(float));
	memcpy(a->m, buf + sizeof h + n * sizeof(float), n * sizeof(float));
	memcpy(a->v, buf + sizeof h + 2 * n * sizeof(float), n * sizeof(float));
	a->step = h.adam_step;
	*step = h.step;
out:
	free(buf);
	return s;
}

/* The log kept through step STEP (a resumed run rewrites what followed). */
static enum llm_status log_open(const char *path, int resume, int64_t step, FILE **f)
{
	static const char header[] = "step,loss,lr,grad_norm,tokens,tokens_per_s,elapsed_s\n";
	char *keep = NULL;
	size_t klen = 0;
	if (resume && llm_exists(path)) {
		char *buf;
		size_t len;
		LLM_TRY(llm_read_file(path, &buf, &len));
		keep = malloc(len + sizeof header);
		if (!keep) {
			free(buf);
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		}
		memcpy(keep, header, sizeof header - 1);
		klen = sizeof header - 1;
		for (char *p = buf, *e; p < buf + len; p = e + 1) {
			e = memchr(p, '\n', (size_t)(buf + len - p));
			if (!e)
				break;       /* a torn last line */
			long long s = strtoll(p, NULL, 10);
			if (s >= 1 && s <= step) {
				memcpy(keep + klen, p, (size_t)(e - p + 1));
				klen += (size_t)(e - p + 1);
			}
		}
		free(buf);
	}
	enum llm_status s = llm_write_file_atomic(path, keep ? keep : header, keep ? klen : sizeof header - 1);
	free(keep);
	if (s)
		return s;
	if (!(*f = fopen(path, "a")))
		return llm_fail(LLM_ERR_IO, "%s: %s", path, strerror(errno));
	return LLM_OK;
}

/* The global stream of packed rows: epoch after epoch. */
struct stream {
	const struct llm_dataset *d;
	int seq_len, pack;
	uint64_t seed;
	int64_t epoch, first;       /* the packed epoch and its first global row */
	struct llm_packed p;
};

static enum llm_status stream_row(struct stream *s, int64_t g, int *row)
{
	if (!s->p.tok || g < s->first) {
		llm_packed_free(&s->p);
		s->epoch = 0;
		s->first = 0;
		LLM_TRY(llm_dataset_pack(s->d, s->seq_len, s->pack, s->seed, 0, &s->p));
	}
	while (g >= s->first + s->p.n_row) {
		s->first += s->p.n_row;
		s->epoch++;
		llm_packed_free(&s->p);
		LLM_TRY(llm_dataset_pack(s->d, s->seq_len, s->pack, s->seed, s->epoch, &s->p));
		if (!s->p.n_row)
			return llm_fail(LLM_ERR_INTERNAL, "an epoch without rows");
	}
	*row = (int)(g - s->first);
	return LLM_OK;
}

static size_t peak_rss(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (size_t)ru.ru_maxrss * 1024;
}

static void fmt_time(char *buf, size_t n, double s)
{
	if (!(s >= 0) || s > 1e8)
		s = 0;
	long t = (long)(s + 0.5);
	snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

static void plot(const double *loss, int64_t n)
{
	enum { W = 60, HGT = 10 };
	if (n < 2)
		return;
	double lo = loss[0], hi = loss[0];
	for (int64_t i = 0; i < n; i++) {
		lo = fmin(lo, loss[i]);
		hi = fmax(hi, loss[i]);
	}
	if (hi - lo < 1e-12)
		hi = lo + 1e-12;
	char grid[HGT][W + 1];
	memset(grid, ' ', sizeof grid);
	for (int x = 0; x < W; x++) {
		int64_t a = x * n / W, b = (x + 1) * n / W;
		if (b <= a)
			b = a + 1;
		double m = 0;
		for (int64_t i = a; i < b && i < n; i++)
			m += loss[i];
		m /= (double)(b - a);
		int y = (int)((hi - m) / (hi - lo) * (HGT - 1) + 0.5);
		grid[y][x] = '*';
	}
	LLM_INFO("loss by step (1 to %lld):\n", (long long)n);
	for (int y = 0; y < HGT; y++) {
		grid[y][W] = 0;
		LLM_INFO("%9.4f |%s\n", hi - (hi - lo) * y / (HGT - 1), grid[y]);
	}
}

/* ---- the frozen base: sharded and off-loaded layers (train.h) ---------------- */

#define N_LW LLM_LAYER_WEIGHTS
#define SEG_ALIGN 64

/* Segment k of a layer: even k the data of weight k / 2, odd k its scales
 * (E4M3 only; else empty). */
static const void *seg_ptr(const struct llm_layer *L, int k)
{
	const struct llm_weight *w = llm_layer_weight(L, k / 2);
	return k % 2 ? (const void *)w->scale : w->data;
}

static size_t seg_len(const struct llm_layer *L, int k)
{
	const struct llm_weight *w = llm_layer_weight(L, k / 2);
	return k % 2 ? llm_weight_scale_bytes(w) : llm_weight_data_bytes(w);
}

/* The blob of layer L: OFF[k] of each segment, each SEG_ALIGN-aligned;
 * returns the blob's size, *RAW the bytes without padding. */
static size_t layer_layout(const struct llm_layer *L, size_t off[2 * N_LW], size_t *raw)
{
	size_t at = 0;
	*raw = 0;
	for (int k = 0; k < 2 * N_LW; k++) {
		off[k] = at;
		at += (seg_len(L, k) + SEG_ALIGN - 1) / SEG_ALIGN * SEG_ALIGN;
		*raw += seg_len(L, k);
	}
	return at;
}

/* A rank's share of a blob of B bytes: SEG_ALIGN-rounded ceil(B / N). */
static size_t share_of(size_t b, int n)
{
	size_t c = (b + (size_t)n - 1) / (size_t)n;
	return (c + SEG_ALIGN - 1) / SEG_ALIGN * SEG_ALIGN;
}

enum llm_status llm_frozen_check(const struct llm_model *m, const char *path, int shard, double offload)
{
	/* a layer's blob (layer_layout) holds its dense weights, not its experts */
	if (m->cfg.moe.n_expert && (shard || offload > 0))
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: --shard-base and --offload-base on a mixture of experts (%d "
		                "experts) are not supported", path, m->cfg.moe.n_expert);
	return LLM_OK;
}

void llm_frozen_plan(const struct llm_model *m, int ranks, int shard, double offload,
                     struct llm_frozen_plan *p)
{
	memset(p, 0, sizeof *p);
	int nl = m->cfg.n_layer;
	p->n_offloaded = (int)llround(offload * nl);
	if (p->n_offloaded > nl)
		p->n_offloaded = nl;
	for (int l = 0; l < nl; l++) {
		size_t off[2 * N_LW], raw, blob = layer_layout(&m->layers[l], off, &raw);
		size_t held = shard ? share_of(blob, ranks) : raw;
		size_t buf = shard ? share_of(blob, ranks) * (size_t)ranks : blob;
		p->decoder += raw;
		if (l < p->n_offloaded)
			p->offloaded += held;
		else
			p->resident += held;
		if ((shard || l < p->n_offloaded) && buf > p->buffer)
			p->buffer = buf;
	}
	p->other = m->weight_bytes - p->decoder;
	p->resident += p->other;
}

/* Linux maps up to fault_around_bytes (64 KiB by default, aligned) of a
 * file's cached pages around a read fault */
#define FAULT_WINDOW 65536

size_t llm_embed_resident(const struct llm_model *m, const struct llm_dataset *d, size_t *table)
{
	const struct llm_weight *e = &m->embed;
	size_t rb = (size_t)e->cols * llm_dtype_size(e->dtype), nb = rb * (size_t)e->rows;
	*table = nb;
	if (!d || !e->data || e->data == m->lm_head.data)
		return nb;
	size_t lead = (size_t)((uintptr_t)e->data % FAULT_WINDOW), nwin = (lead + nb + FAULT_WINDOW - 1) / FAULT_WINDOW;
	uint8_t *hit = calloc(nwin, 1);
	if (!hit)
		return nb;
	size_t n = 0;
	for (int i = -1; i < d->n; i++)
		for (int j = 0; j < (i < 0 ? 1 : d->s[i].n); j++) {
			int64_t id = i < 0 ? 0 : d->s[i].ids[j];      /* 0: the pad of packed rows */
			if (id < 0 || id >= e->rows)
				continue;
			for (size_t w = (lead + (size_t)id * rb) / FAULT_WINDOW;
			     w <= (lead + (size_t)(id + 1) * rb - 1) / FAULT_WINDOW; w++)
				if (!hit[w]) {
					hit[w] = 1;
					n++;
				}
		}
	free(hit);
	return n * FAULT_WINDOW < nb ? n * FAULT_WINDOW : nb;
}

struct frozen {
	struct llm_model *m;
	struct llm_comm *comm;
	int shard, n_off;
	size_t *off;                /* (n_layer, 2 N_LW) segment offsets in the blob */
	size_t *share, *at;         /* (n_layer) this rank's share of the blob, its offset in shards */
	uint8_t *shards;            /* this rank's share of every layer, back to back */
	uint8_t *buf;               /* the working layer (gathered or copied in), SEG_ALIGN-aligned */
	struct llm_layer view;      /* the layer as it lies in buf */
	uint64_t gathered, copied;  /* bytes from other ranks; bytes copied in from host memory */
};

/* Drop the pages of [P, P + N) from this process when they lie in a
 * mapping of CK's files (heap copies are left alone: they would be lost). */
static void drop_pages(const struct llm_ckpt *ck, const void *p, size_t n)
{
	for (size_t i = 0; i < ck->n_file; i++) {
		const struct llm_st_file *f = &ck->files[i];
		const uint8_t *b = p;
		if (f->mapped != 1 || b < f->base || b + n > f->base + f->size)
			continue;
		uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
		uintptr_t lo = ((uintptr_t)b + pg - 1) & ~(pg - 1), hi = ((uintptr_t)b + n) & ~(pg - 1);
		if (hi > lo)
			madvise((void *)lo, hi - lo, MADV_DONTNEED);
	}
}

static void frozen_free(struct frozen *f)
{
	free(f->off);
	free(f->share);
	free(f->at);
	free(f->shards);
	free(f->buf);
	memset(f, 0, sizeof *f);
}

/* Build the source for model M: with SHARD, copy this rank's share of each
 * layer's blob (touching only those bytes of the mapping) and drop the
 * layer's pages; N_OFF layers off-loaded. */
static enum llm_status frozen_init(struct frozen *f, struct llm_model *m, struct llm_comm *comm, int shard,
                                   int n_off, size_t buffer)
{
	memset(f, 0, sizeof *f);
	int nl = m->cfg.n_layer, N = comm->size;
	f->m = m;
	f->comm = comm;
	f->shard = shard;
	f->n_off = n_off;
	f->off = malloc((size_t)nl * 2 * N_LW * sizeof *f->off);
	f->share = calloc((size_t)nl, sizeof *f->share);
	f->at = calloc((size_t)nl, sizeof *f->at);
	if (!f->off || !f->share || !f->at || posix_memalign((void **)&f->buf, SEG_ALIGN, buffer ? buffer : 1))
		return llm_fail(LLM_ERR_NOMEM, "out of memory for the frozen-weight buffers");
	size_t total = 0;
	for (int l = 0; l < nl; l++) {
		size_t raw, blob = layer_layout(&m->layers[l], f->off + (size_t)l * 2 * N_LW, &raw);
		f->share[l] = shard ? share_of(blob, N) : 0;
		f->at[l] = total;
		total += f->share[l];
	}
	if (!shard)
		return LLM_OK;
	if (!(f->shards = calloc(total ? total : 1, 1)))
		return llm_fail(LLM_ERR_NOMEM, "cannot allocate %zu bytes for this rank's shard of the base", total);
	for (int l = 0; l < nl; l++) {
		const struct llm_layer *L = &m->layers[l];
		const size_t *off = f->off + (size_t)l * 2 * N_LW;
		size_t lo = (size_t)comm->rank * f->share[l], hi = lo + f->share[l];
		for (int k = 0; k < 2 * N_LW; k++) {
			size_t a = off[k], b = off[k] + seg_len(L, k);
			if (a < lo)
				a = lo;
			if (b > hi)
				b = hi;
			if (a < b)
				memcpy(f->shards + f->at[l] + (a - lo), (const uint8_t *)seg_ptr(L, k) + (a - off[k]), b - a);
		}
		for (int k = 0; k < 2 * N_LW; k++)
			if (seg_len(L, k))
				drop_pages(&m->ck, seg_ptr(L, k), seg_len(L, k));
	}
	return LLM_OK;
}

/* struct llm_layer_source: the layer in place, or gathered / copied into buf. */
static const struct llm_layer *frozen_fetch(void *ctx, int l)
{
	struct frozen *f = ctx;
	const struct llm_layer *L = &f->m->layers[l];
	const size_t *off = f->off + (size_t)l * 2 * N_LW;
	if (f->shard) {
		/* on a GPU: the shard is copied in from host memory when off-loaded,
		 * then gathered from every rank into the device buffer */
		if (llm_comm_allgather(f->comm, f->shards + f->at[l], f->share[l], f->buf))
			return NULL;
		f->gathered += f->share[l] * (size_t)(f->comm->size - 1);
		if (l < f->n_off)
			f->copied += f->share[l];
	} else if (l < f->n_off) {
		for (int k = 0; k < 2 * N_LW; k++) {
			size_t n = seg_len(L, k);
			if (n)
				memcpy(f->buf + off[k], seg_ptr(L, k), n);
			f->copied += n;
		}
	} else {
		return L;
	}
	/* the family's vectors (biases, q/k norms, sandwich norms: llm_layer) are
	 * the model's own F32 arena, not the mapping: they stay where they are */
	f->view = *L;
	for (int i = 0; i < N_LW; i++) {
		struct llm_weight *v = (struct llm_weight *)llm_layer_weight(&f->view, i);
		*v = *llm_layer_weight(L, i);
		v->data = f->buf + off[2 * i];
		if (v->dtype == LLM_DTYPE_E4M3)
			v->scale = (const float *)(void *)(f->buf + off[2 * i + 1]);
	}
	return &f->view;
}

/* Nothing to free: the next fetch overwrites the buffer. */
static void frozen_release(void *ctx, int l)
{
	(void)ctx, (void)l;
}

/* ---- ranks ------------------------------------------------------------------- */

/* Every rank reached this point with status S: OK when all are; else the
 * lowest failing rank keeps its own status and message, the others get
 * LLM_ERR_COMM and *PEER_FAILED (the lowest reports, once). */
static enum llm_status agree(struct llm_comm *c, enum llm_status s, int *peer_failed)
{
	if (c->size == 1)
		return s;
	int32_t mine = (int32_t)s, *all = calloc((size_t)c->size, sizeof *all);
	if (!all)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	enum llm_status cs = llm_comm_allgather(c, &mine, sizeof mine, all);
	int first = -1;
	for (int r = 0; !cs && r < c->size && first < 0; r++)
		if (all[r])
			first = r;
	free(all);
	if (cs)
		return cs;
	if (first < 0)
		return LLM_OK;
	if (first == c->rank)
		return s;
	*peer_failed = 1;
	return llm_fail(LLM_ERR_COMM, "rank %d of %d failed", first, c->size);
}

/* LLM_FINETUNE_FAIL=RANK:STEP: rank RANK fails at the start of step STEP
 * (1-based): the failure path of a multi-rank run, for the tests. */
static int fail_here(int rank, int64_t step)
{
	const char *e = getenv("LLM_FINETUNE_FAIL");
	long long r, st;
	return e && sscanf(e, "%lld:%lld", &r, &st) == 2 && r == rank && st == step + 1;
}

static uint64_t params_hash(const float *p, size_t n)
{
	return llm_hash_fnv1a(LLM_FNV1A_INIT, p, n * sizeof *p);
}

enum llm_status llm_finetune(const struct llm_finetune_opts *o, struct llm_finetune_result *r)
{
	memset(r, 0, sizeof *r);
	struct llm_comm one = { &llm_comm_single_ops, 0, 1, 0, 1, NULL, { 0 } };
	struct llm_comm *cm = o->comm ? o->comm : &one;
	int N = cm->size, me = cm->rank, root = me == 0;
	struct llm_model m;
	struct llm_tokenizer *tk = NULL;
	struct llm_dataset d = { 0 };
	struct llm_lora lo = { 0 };
	struct llm_trainer *tr = NULL;
	struct llm_adamw a = { 0 };
	struct stream st = { 0 };
	struct frozen fz = { 0 };
	FILE *logf = NULL;
	double *losses = NULL;
	int32_t *stage = NULL;
	int64_t *row_id = NULL;
	char *state_path = NULL;
	int model_open = 0, use_src = 0;
	uint64_t fp = 0;
	int64_t step = 0, steps = o->steps, R = (int64_t)o->micro_batch * o->grad_accum;
	enum llm_status s;
	double t_load = llm_now();
	memset(&m, 0, sizeof m);
	r->n_ranks = N;

	/* ---- set-up: local work on every rank, then every rank agrees ---- */
	if ((s = llm_model_open(&m, o->model)))
		goto setup_done;
	model_open = 1;
	if ((s = llm_frozen_check(&m, o->model, o->shard_base, o->offload_base)))
		goto setup_done;
	if ((s = llm_finetune_tokenizer(&m, o->model, &tk)))
		goto setup_done;
	struct llm_data_opts dopt = o->data_o;
	dopt.seq_len = o->seq_len;
	if ((s = llm_dataset_load(&d, o->data, tk, &dopt, root ? warn_line : NULL)))
		goto setup_done;
	r->n_skipped = d.n_skipped;
	r->n_samples = d.n;
	if (d.n_skipped && root)
		llm_warn("%s: %d bad line%s skipped", o->data, d.n_skipped, d.n_skipped > 1 ? "s" : "");
	if (o->adapter) {
		if ((s = llm_lora_load(&lo, o->adapter, &m.cfg)))
			goto setup_done;
	} else if ((s = llm_lora_init(&lo, &m.cfg, o->rank, (float)o->alpha, (float)o->dropout, o->targets,
	                              o->seed))) {
		goto setup_done;
	}
	free(lo.base_model);
	lo.base_model = llm_strdup(o->model);
	if (R % N) {
		s = llm_fail(LLM_ERR_USAGE, "a step's %lld rows (--micro-batch x --grad-accum) do not split evenly "
		             "over %d ranks", (long long)R, N);
		goto setup_done;
	}
	/* the output: refuse to clobber an adapter before spending hours */
	state_path = llm_path_join(o->out, STATE_NAME);
	if (root) {
		char *am = llm_path_join(o->out, "adapter_model.safetensors");
		int exists = am && llm_exists(am);
		free(am);
		if (exists && !o->force && !o->resume) {
			s = llm_fail(LLM_ERR_EXISTS, "%s: holds an adapter already (--force replaces it)", o->out);
			goto setup_done;
		}
		if (mkdir(o->out, 0755) && errno != EEXIST) {
			s = llm_fail(LLM_ERR_IO, "%s: cannot create directory: %s", o->out, strerror(errno));
			goto setup_done;
		}
	}
	/* steps: --steps, or enough for --epochs passes over the packed rows */
	st.d = &d;
	st.seq_len = o->seq_len;
	st.pack = o->pack;
	st.seed = o->seed;
	if (!steps) {
		int64_t rows = 0;
		for (int64_t e = 0; e < o->epochs; e++) {
			struct llm_packed p;
			if ((s = llm_dataset_pack(&d, o->seq_len, o->pack, o->seed, e, &p)))
				goto setup_done;
			rows += p.n_row;
			llm_packed_free(&p);
		}
		steps = (rows + R - 1) / R;
	}
	r->steps = steps;
	/* the frozen base: in place, or sharded / off-loaded through a layer source */
	llm_frozen_plan(&m, N, o->shard_base, o->offload_base, &r->frozen);
	{       /* of an untied input embedding, the pages the data's rows use */
		size_t table, emb = llm_embed_resident(&m, &d, &table);
		r->frozen.resident = r->frozen.resident - table + emb;
	}
	struct llm_layer_source src = { frozen_fetch, frozen_release, &fz };
	use_src = o->shard_base || r->frozen.n_offloaded > 0;
	if (use_src && (s = frozen_init(&fz, &m, cm, o->shard_base, r->frozen.n_offloaded, r->frozen.buffer)))
		goto setup_done;
	struct llm_train_opts to = { .seq_len = o->seq_len, .n_seq = o->micro_batch, .checkpoint = o->checkpoint,
	                             .n_threads = o->n_threads };
	if ((s = llm_trainer_open(&tr, &m, &lo, &to, use_src ? &src : NULL)))
		goto setup_done;
	struct llm_adamw_opts ao = o->adam;
	ao.total = steps;
	if ((s = llm_adamw_init(&a, lo.n_params, &ao)))
		goto setup_done;
	int nt = 0;
	for (int k = 0; k < LLM_LORA_N; k++)
		nt += lo.targets >> k & 1;
	llm_train_plan(&m.cfg, lo.n_params, lo.rank, nt, &to, to.n_threads > 0 ? to.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN), &r->plan);
	r->weight_bytes = m.weight_bytes;
	fp = fingerprint(o, &lo, &d, steps);
	if (o->resume && root) {
		if (!llm_exists(state_path)) {
			s = llm_fail(LLM_ERR_IO, "%s: no training state to resume from", state_path);
			goto setup_done;
		}
		if ((s = state_load(state_path, fp, &step, &lo, &a)))
			goto setup_done;
	}
	if (root && o->log && (s = log_open(o->log, o->resume, step, &logf)))
		goto setup_done;
	losses = calloc((size_t)(steps > 0 ? steps : 1), sizeof *losses);
	stage = malloc((size_t)4 * (size_t)o->micro_batch * (size_t)o->seq_len * sizeof *stage);
	row_id = malloc((size_t)o->micro_batch * sizeof *row_id);
	if (!losses || !stage || !row_id)
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
setup_done:
	if ((s = agree(cm, s, &r->peer_failed)))
		goto out;
	/* a resumed state reaches every rank from rank 0 */
	if (o->resume && N > 1) {
		int64_t hdr[2] = { step, a.step };
		size_t nb = lo.n_params * sizeof(float);
		if ((s = llm_comm_bcast(cm, hdr, sizeof hdr, 0)) || (s = llm_comm_bcast(cm, lo.params, nb, 0)) ||
		    (s = llm_comm_bcast(cm, a.m, nb, 0)) || (s = llm_comm_bcast(cm, a.v, nb, 0)))
			goto out;
		step = hdr[0];
		a.step = hdr[1];
	}
	if (o->resume && root)
		LLM_INFO("resuming at step %lld of %lld\n", (long long)step, (long long)steps);
	r->start_step = step;
	if (root) {
		LLM_INFO("%s: %d samples (%lld tokens, %lld in completions), %lld steps of %lld rows x %d tokens, "
		         "%zu LoRA parameters (rank %d), loaded in %.1f s\n", o->data, d.n, (long long)d.n_tok,
		         (long long)d.n_loss_tok, (long long)steps, (long long)R, o->seq_len, lo.n_params, lo.rank,
		         llm_now() - t_load);
		if (N > 1 || use_src)
			LLM_INFO("%d rank%s, %lld rows each per step; frozen weights per rank: %.1f MiB resident, "
			         "%.1f MiB off-loaded (%d layers), %.1f MiB layer buffer%s\n", N, N > 1 ? "s" : "",
			         (long long)(R / N), (double)r->frozen.resident / 1048576.0,
			         (double)r->frozen.offloaded / 1048576.0, r->frozen.n_offloaded,
			         (double)r->frozen.buffer / 1048576.0, o->shard_base ? " (--shard-base)" : "");
	}

	/* ---- the steps: rank ME takes rows [k0, k1) of each step's R ---- */
	double t0 = llm_now();
	int64_t tokens = 0, k0 = R / N * me, k1 = k0 + R / N;
	float *grads = llm_trainer_grads(tr);
	for (; step < steps; step++) {
		if (fail_here(me, step)) {
			s = llm_fail(LLM_ERR_INTERNAL, "step %lld: failure injected by LLM_FINETUNE_FAIL", (long long)step + 1);
			goto out;
		}
		/* the step's counted targets, over all its rows (every rank) */
		int64_t count = 0;
		for (int64_t k = 0; k < R; k++) {
			int row;
			if ((s = stream_row(&st, step * R + k, &row)))
				goto out;
			for (int i = 0; i < st.p.used[row]; i++)
				count += st.p.tgt[(size_t)row * o->seq_len + (size_t)i] >= 0;
		}
		llm_trainer_zero_grad(tr);
		/* this rank's loss sum, counted targets and sample tokens */
		double mine[3] = { 0, 0, 0 };
		for (int64_t k = k0; k < k1; k += o->micro_batch) {
			/* stage up to micro_batch rows, trimmed to the longest one */
			int nr = (int)(k1 - k < o->micro_batch ? k1 - k : o->micro_batch), L = 1;
			for (int j = 0; j < nr; j++) {
				int row;
				if ((s = stream_row(&st, step * R + k + j, &row)))
					goto out;
				if (st.p.used[row] > L)
					L = st.p.used[row];
			}
			int32_t *tok = stage, *tgt = tok + (size_t)nr * L, *pos = tgt + (size_t)nr * L,
			        *start = pos + (size_t)nr * L;
			for (int j = 0; j < nr; j++) {
				int row;
				if ((s = stream_row(&st, step * R + k + j, &row)))
					goto out;
				size_t from = (size_t)row * o->seq_len, dst = (size_t)j * L;
				memcpy(tok + dst, st.p.tok + from, (size_t)L * sizeof *tok);
				memcpy(tgt + dst, st.p.tgt + from, (size_t)L * sizeof *tgt);
				memcpy(pos + dst, st.p.pos + from, (size_t)L * sizeof *pos);
				memcpy(start + dst, st.p.start + from, (size_t)L * sizeof *start);
				row_id[j] = step * R + k + j;     /* the dropout masks follow the global row */
				mine[2] += st.p.used[row];
			}
			struct llm_train_batch b = { nr, L, tok, tgt, pos, start, row_id };
			double ls;
			int64_t c;
			uint64_t key = llm_hash_u64(o->seed ^ llm_hash_u64((uint64_t)step));
			if ((s = llm_trainer_step(tr, &b, count ? 1.0 / (double)count : 0.0, key,
			                          LLM_TRAIN_GRAD | LLM_TRAIN_DROPOUT, &ls, &c)))
				goto out;
			mine[0] += ls;
			mine[1] += (double)c;
		}
		/* one flat all-reduce of the gradient (each rank's part already
		 * divided by the step's global count), and the step's totals summed
		 * in rank order, so every rank holds the same bits */
		double tot[3] = { mine[0], mine[1], mine[2] };
		if (N > 1) {
			double *all = malloc((size_t)N * sizeof mine);
			if (!all) {
				s = llm_fail(LLM_ERR_NOMEM, "out of memory");
				goto out;
			}
			if (!(s = llm_comm_allreduce_sum_f32(cm, grads, lo.n_params)))
				s = llm_comm_allgather(cm, mine, sizeof mine, all);
			for (int q = 0; q < 3; q++) {
				tot[q] = 0;
				for (int k = 0; k < N; k++)
					tot[q] += all[(size_t)k * 3 + (size_t)q];
			}
			free(all);
			if (s)
				goto out;
		}
		tokens += (int64_t)tot[2];
		double norm = llm_grad_norm(grads, lo.n_params), lr = llm_lr_at(&a.o, step);
		double mean = tot[1] > 0 ? tot[0] / tot[1] : 0.0;
		/* a NaN or Inf loss or gradient (non-finite base weights, an
		 * overflow) would reach every parameter through the update and
		 * train nothing: stop before it, writing no adapter (every rank
		 * holds the same sums, so all stop here) */
		if (!isfinite(tot[0]) || !isfinite(norm)) {
			char where[256] = "";
			for (size_t i = 0; i < lo.n_params; i++)
				if (!isfinite(grads[i])) {
					char name[160];
					size_t at;
					if (llm_lora_param_name(&lo, i, name, sizeof name, &at))
						snprintf(where, sizeof where, "; the first non-finite gradient: tensor '%s' at index %zu",
						         name, at);
					break;
				}
			s = llm_fail(LLM_ERR_RANGE, "step %lld: the %s is not finite (loss %g, gradient norm %g)%s: stopped, no "
			             "adapter written (check the base model: llm-quantize --check)", (long long)step + 1,
			             !isfinite(tot[0]) ? "loss" : "gradient", mean, norm, where);
			goto out;
		}
		if (count)
			llm_adamw_update(&a, lo.params, grads, norm, lr);
		losses[step] = mean;
		if (step == r->start_step)
			r->first_loss = mean;
		r->last_loss = mean;
		double el = llm_now() - t0, tps = el > 0 ? (double)tokens / el : 0;
		int64_t done = step + 1 - r->start_step;
		char eta[32];
		fmt_time(eta, sizeof eta, el / (double)done * (double)(steps - step - 1));
		if (root)
			LLM_INFO("step %lld/%lld  loss %.4f  lr %.3e  |g| %.3f  %.0f tok/s  eta %s\n", (long long)(step + 1),
			         (long long)steps, mean, lr, norm, tps, eta);
		if (logf) {
			fprintf(logf, "%lld,%.6f,%.6e,%.6f,%lld,%.1f,%.3f\n", (long long)(step + 1), mean, lr, norm,
			        (long long)tokens, tps, el);
			fflush(logf);
		}
		if (root && o->save_every && (step + 1) % o->save_every == 0 && step + 1 < steps &&
		    (s = state_save(state_path, fp, step + 1, &lo, &a)))
			goto out;
	}
	double el = llm_now() - t0;
	r->tokens = tokens;
	r->tokens_per_s = el > 0 ? (double)tokens / el : 0;
	r->gathered = fz.gathered;
	r->copied_in = fz.copied;
	/* every rank must hold the same adapter: the same bits in, the same
	 * updates; a difference is a bug, not noise */
	if (N > 1) {
		uint64_t h = params_hash(lo.params, lo.n_params), *all = malloc((size_t)N * sizeof h);
		if (!all) {
			s = llm_fail(LLM_ERR_NOMEM, "out of memory");
			goto out;
		}
		s = llm_comm_allgather(cm, &h, sizeof h, all);
		for (int k = 1; !s && k < N; k++)
			if (all[k] != all[0])
				s = llm_fail(LLM_ERR_INTERNAL, "rank %d's adapter differs from rank 0's after %lld steps",
				             k, (long long)steps);
		free(all);
		if (s)
			goto out;
	}
	s = root ? llm_lora_save(&lo, o->out, 1) : LLM_OK;
	if ((s = agree(cm, s, &r->peer_failed)))
		goto out;
	if (root) {
		unlink(state_path);
		llm_fsync_dir(o->out);
		if (o->plot)
			plot(losses, steps);
	}
	r->peak_rss = r->peak_rss_max = peak_rss();
	if (N > 1) {
		uint64_t mine_rss = r->peak_rss, *all = malloc((size_t)N * sizeof mine_rss);
		if (!all) {
			s = llm_fail(LLM_ERR_NOMEM, "out of memory");
			goto out;
		}
		if (!(s = llm_comm_allgather(cm, &mine_rss, sizeof mine_rss, all)))
			for (int k = 0; k < N; k++) {
				if (all[k] > r->peak_rss_max)
					r->peak_rss_max = all[k];
				if (root)
					LLM_INFO("rank %d: peak RSS %.1f MiB\n", k, (double)all[k] / 1048576.0);
			}
		free(all);
	}
out:
	if (logf)
		fclose(logf);
	free(losses);
	free(stage);
	free(row_id);
	free(state_path);
	llm_packed_free(&st.p);
	llm_adamw_free(&a);
	llm_trainer_close(tr);
	frozen_free(&fz);
	llm_lora_free(&lo);
	llm_dataset_free(&d);
	llm_tokenizer_close(tk);
	if (model_open)
		llm_model_close(&m);
	return s;
}

enum llm_status llm_finetune_sample(const char *model, const char *adapter, const char *text,
                                    int n_new, int n_threads, char **out)
{
	*out = NULL;
	struct llm_model m;
	LLM_TRY(llm_model_open(&m, model));
	struct llm_tokenizer *tk = NULL;
	struct llm_lora lo = { 0 };
	struct llm_trainer *tr = NULL;
	int32_t *ids = NULL, *gen = NULL;
	size_t n = 0, len;
	int ng = 0;
	enum llm_status s;
	if ((s = llm_finetune_tokenizer(&m, model, &tk)))
		goto out;
	if (adapter)
		s = llm_lora_load(&lo, adapter, &m.cfg);
	else   /* no adapter: a rank-1 one with B = 0 changes nothing */
		s = llm_lora_init(&lo, &m.cfg, 1, 1.0f, 0.0f, 1u << LLM_LORA_Q, 0);
	if (s || (s = llm_tokenizer_encode(tk, text, strlen(text), true, &ids, &n)))
		goto out;
	int L = (int)n + n_new;
	if (L > m.cfg.max_ctx)
		L = m.cfg.max_ctx;
	struct llm_train_opts to = { .seq_len = L, .n_seq = 1, .n_threads = n_threads, .logit_chunk = 1 };
	if ((s = llm_trainer_open(&tr, &m, &lo, &to, NULL)))
		goto out;
	if (!(gen = malloc((size_t)(n_new > 0 ? n_new : 1) * sizeof *gen))) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	if ((s = llm_trainer_greedy(tr, ids, (int)n, n_new, gen, &ng)))
		goto out;
	/* the continuation's text as llm-generate and llm-serve give it:
	 * decode(prompt + generated) less decode(prompt), so a leading space
	 * that the decoder drops at the start of a text is kept */
	int32_t *all = realloc(ids, (n + (size_t)ng) * sizeof *ids);
	if (!all) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	ids = all;
	memcpy(ids + n, gen, (size_t)ng * sizeof *ids);
	char *head = NULL, *whole = NULL;
	size_t hl, wl;
	if (!(s = llm_tokenizer_decode(tk, ids, n, true, &head, &hl))
	    && !(s = llm_tokenizer_decode(tk, ids, n + (size_t)ng, true, &whole, &wl))) {
		if (wl >= hl && !memcmp(whole, head, hl)) {
			memmove(whole, whole + hl, wl - hl + 1);
			*out = whole;
			whole = NULL;
		} else {
			s = llm_tokenizer_decode(tk, gen, (size_t)ng, true, out, &len);
		}
	}
	free(head);
	free(whole);
out:
	free(ids);
	free(gen);
	llm_trainer_close(tr);
	llm_lora_free(&lo);
	llm_tokenizer_close(tk);
	llm_model_close(&m);
	return s;
}
