/* kernels/cuda_ops.c: the CUDA backend: struct llm_backend_ops filled in C
 * (STYLE.md section 3) over the launchers in the .cu files beside it.
 *
 * Every op has the semantics of the CPU op of the same name
 * (common/engine/backend_cpu.c, the reference; tests/test_cuda.c compares them op
 * by op with a tolerance table). What this file adds (llm_cuda.h):
 * - state: one device, one non-blocking stream for compute, one for weight
 *   uploads, a cuBLAS handle (BF16 weights), device scratch that grows to
 *   the largest batch seen (freed and reallocated only when it grows);
 * - weights: struct llm_weight points into the host checkpoint mapping; each
 *   is uploaded once, on first use or through llm_cuda_weight_preload(),
 *   through two pinned staging buffers (the memcpy into one overlaps the DMA
 *   out of the other), and found again by its host address (a hash table);
 * - host arrays of the interface (token ids, positions, gather indices,
 *   inv_freq, the batch's KV block tables) go up in "slots": an op uploads
 *   only when the contents changed since the slot's last upload, so the 2 x
 *   n_layer rope, kv_store and attention calls of a step upload once;
 * - matmul into host memory (the logits) computes into a device buffer,
 *   copies back and waits; every other view must be device memory from this
 *   backend's alloc (checked: LLM_ERR_USAGE otherwise).
 * - CUDA graphs (graph_begin/graph_end, backend.h): a decode step of n
 *   tokens runs op by op the first time, is captured the second time, and
 *   replayed after that: the host still walks every op (checks, and the
 *   uploads of its host arrays into a pinned arena that the graph's copy
 *   nodes read), but launches nothing until graph_end launches the graph.
 *   A replay whose uploads differ from the record's in size or order of
 *   contents, or whose ops see other views or weights (a hash of them),
 *   launches nothing and asks the caller to run the step again op by op.
 *   A step that would allocate, upload a weight or copy to the host cannot
 *   be captured and runs op by op. Growing the bf16 activation buffer or
 *   replacing weights drops every graph (they hold the old addresses).
 *   $LLM_CUDA_GRAPHS=0 turns graphs off.
 * matmul_add (backend.h) adds into the residual from the GEMM's epilogue.
 * comm_open: the NCCL communicator of distributed GPU ranks (builds with
 * NCCL: common/engine/comm_nccl.c is linked into this library, not libllm.a).
 * Matmul: E4M3 weights through the fused FP8 GEMM with the configuration of
 * kernels/tune_table.h, BF16 weights through cublasGemmEx (bf16 x bf16,
 * f32 accumulation and output), F32/F16 through the generic kernel. */
#include "backend.h"
#include "kvcache.h"
#include "sampler.h"
#include "llm_cuda.h"
#include "cuda_kernels.h"
#include "cuda_check.h"
#include "comm.h"

#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

#define PINNED_CHUNK ((size_t)8 << 20)    /* bytes per staging buffer */
#define GRAPH_MAX 64                       /* decode batch sizes with a graph */
#define ARENA_BYTES ((size_t)16 << 20)     /* the graphs' uploads, pinned and on the device */

enum { GM_OFF, GM_CAPTURE, GM_REPLAY };

/* Upload I of a recorded step: its arena entry (FRESH: the upload that
 * filled it; else a later one with the same bytes) and its size. */
struct gup { int entry, fresh; size_t len; };

struct cgraph {
	int64_t key;
	int state;              /* 0: seen (ran op by op), 1: captured, -1: cannot be */
	const void *out;
	cudaGraphExec_t exec;
	uint64_t hash;          /* of the ops' views and weights */
	struct gup *up;
	int n_up, cap_up;
	size_t *ent_off;        /* (n_ent) arena offsets of the entries */
	int n_ent, cap_ent;
};

enum { SLOT_TOK, SLOT_POS, SLOT_IDX, SLOT_FREQ, SLOT_KVPOS, SLOT_KVOFF, SLOT_KVTAB, SLOT_COUNT };

struct slot {
	void *dev;              /* device copy, cap bytes */
	void *host;             /* what dev holds (len bytes), for the comparison */
	size_t cap, len;
	int valid;
};

struct dev_alloc { char *p; size_t n; };

struct wentry {
	const void *host;       /* key: w->data */
	const float *hscale;
	int dtype;
	int64_t rows, cols, scale_rows, scale_cols, block_rows, block_cols;
	void *data;             /* device copies */
	float *scale;
};

struct cuda_be {
	int dev;
	int force_cfg;          /* -1: the tile table */
	char name[256];
	cudaStream_t stream, upload;
	cublasHandle_t blas;
	struct dev_alloc *allocs;
	size_t n_alloc, cap_alloc;
	struct wentry *wtab;    /* open addressing, wcap a power of two */
	size_t wcap, wcount, wbytes;
	void *pinned[2];
	cudaEvent_t pev[2], updone;
	struct slot slot[SLOT_COUNT];
	void *xbf;              /* bf16 activations for the tensor-core paths */
	size_t xbf_cap;
	void *ystage;           /* matmul output bound for the host */
	size_t ystage_cap;
	void *yadd;             /* matmul_add's product where cuBLAS computes it */
	size_t yadd_cap;
	int32_t *ids;           /* argmax output */
	size_t ids_cap;
	char *sp_host;          /* sample: the packed rows and lists, host side */
	size_t sp_host_cap;
	void *sp_dev;           /* ... their device copy */
	size_t sp_dev_cap;
	void *sp_work;          /* ... the kernels' work space (llm_cuda_sample_work) */
	size_t sp_work_cap;
	struct llm_cuda_sample_out *sp_out, *sp_hout;   /* (rows) device, host */
	size_t sp_out_cap, sp_hout_cap;
	int graphs;             /* 0: off ($LLM_CUDA_GRAPHS=0, llm_cuda_graphs) */
	int gmode;              /* GM_*: this step */
	int gbad;               /* this step cannot be captured or replayed */
	int up_i;               /* uploads of this step so far */
	uint64_t ghash;
	struct cgraph *gcur;
	struct cgraph gr[GRAPH_MAX];
	int n_gr;
	unsigned epoch, graph_epoch;   /* bumped when an address a graph holds changes */
	char *arena_h;          /* (ARENA_BYTES) pinned */
	char *arena_d;          /* (ARENA_BYTES) device */
	size_t arena_used;
	long n_captured, n_replayed, n_redo;
	int32_t *hpos, *hoff, *htab, *first;   /* host builders of the KV metadata */
	size_t hpos_cap, hoff_cap, htab_cap, first_cap;
};

static struct cuda_be *cu(struct llm_backend *be) { return be->priv; }

static enum llm_status set_dev(struct cuda_be *c)
{
	if (c->dev)        /* another thread may call: the current device is per thread */
		LLM_CUDA_TRY(cudaSetDevice(c->dev));
	return LLM_OK;
}

int llm_cuda_device_count(void)
{
	int n = 0;
	if (cudaGetDeviceCount(&n) != cudaSuccess) {
		(void)cudaGetLastError();
		return 0;
	}
	return n;
}

/* The free memory of device DEV (cudaMemGetInfo), for sizing the KV cache
 * before the engine opens (common/serve/memplan.c); 0 on success. */
int llm_cuda_mem_free(int dev, size_t *free_bytes)
{
	size_t total = 0;
	*free_bytes = 0;
	if (cudaSetDevice(dev) != cudaSuccess || cudaMemGetInfo(free_bytes, &total) != cudaSuccess) {
		(void)cudaGetLastError();
		return -1;
	}
	return 0;
}

/* ---- device memory ----------------------------------------------------- */

static int is_dev(const struct cuda_be *c, const void *p)
{
	const char *q = p;
	for (size_t i = 0; i < c->n_alloc; i++)
		if (q >= c->allocs[i].p && q < c->allocs[i].p + c->allocs[i].n)
			return 1;
	return 0;
}

/* Fold V into the step's hash while recording or replaying. */
static void gnote(struct cuda_be *c, uint64_t v)
{
	if (c->gmode)
		c->ghash = (c->ghash ^ v) * 0x100000001b3ull;
}

static enum llm_status need_dev(struct cuda_be *c, const char *op, const char *what,
                                struct llm_view v)
{
	gnote(c, (uint64_t)(uintptr_t)op);
	gnote(c, (uint64_t)(uintptr_t)v.data);
	gnote(c, (uint64_t)v.rows);
	gnote(c, (uint64_t)v.cols);
	gnote(c, (uint64_t)v.stride);
	if (v.dtype != LLM_DTYPE_F32)
		return llm_fail(LLM_ERR_UNSUPPORTED, "cuda backend: %s: %s activations (f32 only)",
		                op, llm_dtype_name(v.dtype));
	if (v.rows > 0 && !is_dev(c, v.data))
		return llm_fail(LLM_ERR_USAGE, "cuda backend: %s: %s is not device memory of this backend",
		                op, what);
	return LLM_OK;
}

static enum llm_status cuda_alloc(struct llm_backend *be, size_t n, void **p)
{
	struct cuda_be *c = cu(be);
	*p = NULL;
	LLM_TRY(set_dev(c));
	if (c->n_alloc == c->cap_alloc) {
		size_t cap = c->cap_alloc ? 2 * c->cap_alloc : 16;
		struct dev_alloc *a = realloc(c->allocs, cap * sizeof *a);
		if (!a)
			return llm_fail(LLM_ERR_NOMEM, "cuda backend: out of host memory");
		c->allocs = a;
		c->cap_alloc = cap;
	}
	cudaError_t e = cudaMalloc(p, n ? n : 64);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		*p = NULL;
		return llm_fail(e == cudaErrorMemoryAllocation ? LLM_ERR_NOMEM : LLM_ERR_CUDA,
		                "cuda backend: cannot allocate %zu bytes on %s: %s", n, c->name,
		                cudaGetErrorString(e));
	}
	e = cudaMemsetAsync(*p, 0, n, c->stream);
	if (e != cudaSuccess) {
		cudaFree(*p);
		*p = NULL;
		return llm_fail(LLM_ERR_CUDA, "cuda backend: cudaMemsetAsync: %s", cudaGetErrorString(e));
	}
	c->allocs[c->n_alloc].p = *p;
	c->allocs[c->n_alloc].n = n ? n : 64;
	c->n_alloc++;
	return LLM_OK;
}

static void cuda_release(struct llm_backend *be, void *p)
{
	struct cuda_be *c = cu(be);
	if (!p)
		return;
	for (size_t i = 0; i < c->n_alloc; i++)
		if (c->allocs[i].p == p) {
			c->allocs[i] = c->allocs[--c->n_alloc];
			break;
		}
	set_dev(c);
	cudaFree(p);
}

static enum llm_status cuda_copy_in(struct llm_backend *be, void *dst, const void *src, size_t n)
{
	struct cuda_be *c = cu(be);
	LLM_TRY(set_dev(c));
	LLM_CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, c->stream));
	LLM_CUDA_TRY(cudaStreamSynchronize(c->stream));
	return LLM_OK;
}

enum llm_status llm_cuda_copy_out(struct llm_backend *be, void *dst, const void *src, size_t n)
{
	struct cuda_be *c = cu(be);
	LLM_TRY(set_dev(c));
	LLM_CUDA_TRY(cudaMemcpyAsync(dst, src, n, cudaMemcpyDefault, c->stream));
	LLM_CUDA_TRY(cudaStreamSynchronize(c->stream));
	return LLM_OK;
}

/* A device scratch buffer of at least N bytes (grows; never shrinks). */
static enum llm_status scratch(void **p, size_t *cap, size_t n, const char *what)
{
	if (*cap >= n)
		return LLM_OK;
	if (*p)
		cudaFree(*p);      /* synchronizes the device: nothing still reads it */
	*p = NULL;
	*cap = 0;
	size_t want = n + n / 4;
	cudaError_t e = cudaMalloc(p, want);
	if (e != cudaSuccess) {
		(void)cudaGetLastError();
		*p = NULL;
		return llm_fail(LLM_ERR_NOMEM, "cuda backend: %s: cannot allocate %zu bytes: %s", what, want,
		                cudaGetErrorString(e));
	}
	*cap = want;
	return LLM_OK;
}

/* A graph step's upload of the N host bytes at SRC: recording, into a new
 * arena entry (a copy node of the graph) unless an entry of this step
 * holds the same bytes; replaying, into the record's entry, or checked
 * equal to it; a difference makes the step bad (run again op by op). */
static enum llm_status graph_put(struct cuda_be *c, const void *src, size_t n, void **dev)
{
	struct cgraph *g = c->gcur;
	*dev = c->arena_d;
	if (c->gbad)
		return LLM_OK;
	if (c->gmode == GM_REPLAY) {
		int i = c->up_i++;
		if (i >= g->n_up || g->up[i].len != n) {
			c->gbad = 1;
			return LLM_OK;
		}
		size_t off = g->ent_off[g->up[i].entry];
		if (g->up[i].fresh)
			memcpy(c->arena_h + off, src, n);
		else if (memcmp(c->arena_h + off, src, n))
			c->gbad = 1;
		*dev = c->arena_d + off;
		return LLM_OK;
	}
	int e = -1, fresh = 0;
	for (int k = 0; k < g->n_up && e < 0; k++)
		if (g->up[k].len == n && !memcmp(c->arena_h + g->ent_off[g->up[k].entry], src, n))
			e = g->up[k].entry;
	if (e < 0) {
		size_t off = (c->arena_used + 255) & ~(size_t)255;
		if (off + n > ARENA_BYTES) {
			c->gbad = 1;
			return LLM_OK;
		}
		if (g->n_ent == g->cap_ent) {
			int cap = g->cap_ent ? 2 * g->cap_ent : 32;
			size_t *t = realloc(g->ent_off, (size_t)cap * sizeof *t);
			if (!t)
				return llm_fail(LLM_ERR_NOMEM, "cuda backend: out of host memory");
			g->ent_off = t;
			g->cap_ent = cap;
		}
		memcpy(c->arena_h + off, src, n);
		c->arena_used = off + n;
		g->ent_off[g->n_ent] = off;
		e = g->n_ent++;
		fresh = 1;
		LLM_CUDA_TRY(cudaMemcpyAsync(c->arena_d + off, c->arena_h + off, n, cudaMemcpyHostToDevice, c->stream));
	}
	if (g->n_up == g->cap_up) {
		int cap = g->cap_up ? 2 * g->cap_up : 64;
		struct gup *t = realloc(g->up, (size_t)cap * sizeof *t);
		if (!t)
			return llm_fail(LLM_ERR_NOMEM, "cuda backend: out of host memory");
		g->up = t;
		g->cap_up = cap;
	}
	g->up[g->n_up].entry = e;
	g->up[g->n_up].fresh = fresh;
	g->up[g->n_up].len = n;
	g->n_up++;
	*dev = c->arena_d + g->ent_off[e];
	return LLM_OK;
}

/* Device copy of the N host bytes at SRC in slot S, uploaded only when
 * they differ from the slot's last upload (in a graph step: graph_put). */
static enum llm_status slot_put(struct cuda_be *c, int s, const void *src, size_t n, void **dev)
{
	if (c->gmode)
		return graph_put(c, src, n, dev);
	struct slot *sl = &c->slot[s];
	if (sl->valid && sl->len == n && !memcmp(sl->host, src, n)) {
		*dev = sl->dev;
		return LLM_OK;
	}
	sl->valid = 0;
	if (sl->cap < n) {
		void *h = realloc(sl->host, n + n / 4);
		if (!h)
			return llm_fail(LLM_ERR_NOMEM, "cuda backend: out of host memory");
		sl->host = h;
		LLM_TRY(scratch(&sl->dev, &sl->cap, n, "batch arrays"));
	}
	memcpy(sl->host, src, n);
	/* pageable source: returns once the bytes are staged, so sl->host may change after */
	LLM_CUDA_TRY(cudaMemcpyAsync(sl->dev, sl->host, n, cudaMemcpyHostToDevice, c->stream));
	sl->len = n;
	sl->valid = 1;
	*dev = sl->dev;
	return LLM_OK;
}

/* ---- weights ----------------------------------------------------------- */

static size_t ptr_hash(const void *p)
{
	uint64_t x = (uint64_t)(uintptr_t)p;
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	return (size_t)x;
}

/* N bytes from host SRC to device DST through the two pinned buffers, on
 * the upload stream; the compute stream waits for it. */
static enum llm_status upload(struct cuda_be *c, void *dst, const void *src, size_t n)
{
	if (!c->pinned[0]) {
		for (int i = 0; i < 2; i++) {
			LLM_CUDA_TRY(cudaMallocHost(&c->pinned[i], PINNED_CHUNK));
			LLM_CUDA_TRY(cudaEventCreateWithFlags(&c->pev[i], cudaEventDisableTiming));
		}
		LLM_CUDA_TRY(cudaEventCreateWithFlags(&c->updone, cudaEventDisableTiming));
	}
	int i = 0;
	for (size_t off = 0; off < n; off += PINNED_CHUNK, i ^= 1) {
		size_t len = n - off < PINNED_CHUNK ? n - off : PINNED_CHUNK;
		LLM_CUDA_TRY(cudaEventSynchronize(c->pev[i]));     /* its previous copy is done */
		memcpy(c->pinned[i], (const char *)src + off, len);
		LLM_CUDA_TRY(cudaMemcpyAsync((char *)dst + off, c->pinned[i], len, cudaMemcpyHostToDevice,
		                             c->upload));
		LLM_CUDA_TRY(cudaEventRecord(c->pev[i], c->upload));
	}
	LLM_CUDA_TRY(cudaEventRecord(c->updone, c->upload));
	LLM_CUDA_TRY(cudaStreamWaitEvent(c->stream, c->updone, 0));
	return LLM_OK;
}

static int wentry_same(const struct wentry *e, const struct llm_weight *w)
{
	return e->hscale == w->scale && e->dtype == (int)w->dtype && e->rows == w->rows
	       && e->cols == w->cols && e->scale_rows == w->scale_rows && e->scale_cols == w->scale_cols
	       && e->block_rows == w->block_rows && e->block_cols == w->block_cols;
}

static void wentry_free(struct cuda_be *c, struct wentry *e)
{
	if (e->data)
		cudaFree(e->data);
	if (e->scale)
		cudaFree(e->scale);
	e->data = NULL;
	e->scale = NULL;
	c->wbytes -= (size_t)e->rows * (size_t)e->cols * llm_dtype_size(e->dtype)
	             + (e->dtype == LLM_DTYPE_E4M3 ? (size_t)e->scale_rows * (size_t)e->scale_cols * 4 : 0);
}

static enum llm_status wentry_fill(struct cuda_be *c, struct wentry *e, const struct llm_weight *w)
{
	if (w->dtype != LLM_DTYPE_F32 && w->dtype != LLM_DTYPE_F16 && w->dtype != LLM_DTYPE_BF16
	    && w->dtype != LLM_DTYPE_E4M3)
		return llm_fail(LLM_ERR_UNSUPPORTED, "cuda backend: tensor '%s': %s weights",
		                w->name ? w->name : "?", llm_dtype_name(w->dtype));
	memset(e, 0, sizeof *e);
	e->host = w->data;
	e->hscale = w->scale;
	e->dtype = (int)w->dtype;
	e->rows = w->rows;
	e->cols = w->cols;
	e->scale_rows = w->scale_rows;
	e->scale_cols = w->scale_cols;
	e->block_rows = w->block_rows;
	e->block_cols = w->block_cols;
	size_t nb = (size_t)w->rows * (size_t)w->cols * llm_dtype_size(w->dtype);
	size_t ns = w->dtype == LLM_DTYPE_E4M3 ? (size_t)w->scale_rows * (size_t)w->scale_cols * 4 : 0;
	cudaError_t err = cudaMalloc(&e->data, nb ? nb : 16);
	if (err == cudaSuccess && ns)
		err = cudaMalloc((void **)&e->scale, ns);
	if (err != cudaSuccess) {
		(void)cudaGetLastError();
		if (e->data)
			cudaFree(e->data);
		memset(e, 0, sizeof *e);
		return llm_fail(LLM_ERR_NOMEM, "cuda backend: tensor '%s': cannot allocate %zu bytes: %s",
		                w->name ? w->name : "?", nb + ns, cudaGetErrorString(err));
	}
	c->wbytes += nb + ns;
	enum llm_status s = upload(c, e->data, w->data, nb);
	if (!s && ns)
		s = upload(c, e->scale, w->scale, ns);
	if (s) {
		wentry_free(c, e);
		memset(e, 0, sizeof *e);
		return llm_fail_prefix(s, "cuda backend: tensor '%s'", w->name ? w->name : "?");
	}
	return LLM_OK;
}

static enum llm_status wtab_grow(struct cuda_be *c)
{
	size_t cap = c->wcap ? 2 * c->wcap : 256;
	struct wentry *t = calloc(cap, sizeof *t);
	if (!t)
		return llm_fail(LLM_ERR_NOMEM, "cuda backend: out of host memory");
	for (size_t i = 0; i < c->wcap; i++) {
		if (!c->wtab[i].host)
			continue;
		size_t j = ptr_hash(c->wtab[i].host) & (cap - 1);
		while (t[j].host)
			j = (j + 1) & (cap - 1);
		t[j] = c->wtab[i];
	}
	free(c->wtab);
	c->wtab = t;
	c->wcap = cap;
	return LLM_OK;
}

/* The device copy of W (uploaded now if it is not yet). */
static enum llm_status weight_get(struct cuda_be *c, const struct llm_weight *w, struct llm_cuda_mat *m)
{
	if ((c->wcount + 1) * 2 > c->wcap)
		LLM_TRY(wtab_grow(c));
	size_t j = ptr_hash(w->data) & (c->wcap - 1);
	while (c->wtab[j].host && c->wtab[j].host != w->data)
		j = (j + 1) & (c->wcap - 1);
	struct wentry *e = &c->wtab[j];
	gnote(c, (uint64_t)(uintptr_t)w->data);
	if (c->gmode && (!e->host || !wentry_same(e, w))) {   /* no upload inside a graph step */
		c->gbad = 1;
		memset(m, 0, sizeof *m);
		return LLM_OK;
	}
	if (e->host && !wentry_same(e, w)) {     /* same address, another tensor: replace */
		wentry_free(c, e);
		c->wcount--;
		e->host = NULL;
		c->epoch++;
	}
	if (!e->host) {
		LLM_TRY(wentry_fill(c, e, w));
		c->wcount++;
	}
	m->dtype = e->dtype;
	m->rows = e->rows;
	m->cols = e->cols;
	m->data = e->data;
	m->scale = e->scale;
	m->scale_rows = e->scale_rows;
	m->scale_cols = e->scale_cols;
	m->block_rows = e->block_rows;
	m->block_cols = e->block_cols;
	return LLM_OK;
}

enum llm_status llm_cuda_weight_preload(struct llm_backend *be, const struct llm_weight *w)
{
	struct llm_cuda_mat m;
	LLM_TRY(set_dev(cu(be)));
	return weight_get(cu(be), w, &m);
}

void llm_cuda_weights_drop(struct llm_backend *be)
{
	struct cuda_be *c = cu(be);
	set_dev(c);
	cudaStreamSynchronize(c->stream);
	for (size_t i = 0; i < c->wcap; i++)
		if (c->wtab[i].host)
			wentry_free(c, &c->wtab[i]);
	free(c->wtab);
	c->wtab = NULL;
	c->wcap = c->wcount = 0;
	c->wbytes = 0;
	c->epoch++;
}

size_t llm_cuda_weight_bytes(struct llm_backend *be) { return cu(be)->wbytes; }

void llm_cuda_gemm_force(struct llm_backend *be, int cfg)
{
	cu(be)->force_cfg = cfg >= 0 && cfg < LLM_GEMM_CFG_COUNT ? cfg : -1;
}

/* ---- ops --------------------------------------------------------------- */

/* A kernel launch of an op: queued, or captured into the step's graph,
 * or (replaying) left to the graph. */
#define LAUNCH(call) do { if (c->gmode != GM_REPLAY) LLM_CUDA_TRY(call); } while (0)

static bool cuda_supports(enum llm_op op, enum llm_dtype w, enum llm_dtype act)
{
	(void)op;
	if (act != LLM_DTYPE_F32)
		return false;
	return w == LLM_DTYPE_F32 || w == LLM_DTYPE_F16 || w == LLM_DTYPE_BF16 || w == LLM_DTYPE_E4M3;
}

static enum llm_status cuda_embed(struct llm_backend *be, struct llm_view out,
                                  const int32_t *tok, const struct llm_weight *emb)
{
	struct cuda_be *c = cu(be);
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "embed", "out", out));
	for (int64_t i = 0; i < out.rows; i++)
		if (tok[i] < 0 || tok[i] >= emb->rows)
			return llm_fail(LLM_ERR_RANGE, "embed: token %lld: id %d not in [0, %lld)",
			                (long long)i, tok[i], (long long)emb->rows);
	if (out.rows < 1)
		return LLM_OK;
	struct llm_cuda_mat m;
	void *dtok;
	LLM_TRY(weight_get(c, emb, &m));
	LLM_TRY(slot_put(c, SLOT_TOK, tok, (size_t)out.rows * sizeof(int32_t), &dtok));
	LAUNCH(llm_cuda_embed(out.data, out.stride, dtok, out.rows, &m, c->stream));
	return LLM_OK;
}

static enum llm_status cuda_rmsnorm(struct llm_backend *be, struct llm_view out,
                                    struct llm_view x, const struct llm_weight *w, float eps)
{
	struct cuda_be *c = cu(be);
	struct llm_cuda_mat m;
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "rmsnorm", "x", x));
	LLM_TRY(need_dev(c, "rmsnorm", "out", out));
	LLM_TRY(weight_get(c, w, &m));
	LAUNCH(llm_cuda_rmsnorm(out.data, out.stride, x.data, x.stride, x.rows, x.cols, &m, eps, c->stream));
	return LLM_OK;
}

enum llm_status llm_cuda_add_rmsnorm(struct llm_backend *be, struct llm_view out, struct llm_view x,
                                     struct llm_view y, const struct llm_weight *w, float eps)
{
	struct cuda_be *c = cu(be);
	struct llm_cuda_mat m;
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "add_rmsnorm", "x", x));
	LLM_TRY(need_dev(c, "add_rmsnorm", "y", y));
	LLM_TRY(need_dev(c, "add_rmsnorm", "out", out));
	LLM_TRY(weight_get(c, w, &m));
	LAUNCH(llm_cuda_add_rmsnorm_f32(out.data, out.stride, x.data, x.stride, y.data, y.stride, x.rows,
	                            x.cols, &m, eps, c->stream));
	return LLM_OK;
}

/* A scratch buffer that graphs may hold the address of, at least N bytes.
 * It moves when it grows: growing drops the graphs, and inside a graph step
 * it is refused (the step runs again op by op, where it may grow). */
static enum llm_status graph_scratch(struct cuda_be *c, void **buf, size_t *cap, size_t n, const char *what)
{
	if (*cap >= n)
		return LLM_OK;
	if (c->gmode) {
		c->gbad = 1;
		return LLM_OK;
	}
	c->epoch++;
	return scratch(buf, cap, n, what);
}

/* The bf16 activation buffer. */
static enum llm_status xbf_get(struct cuda_be *c, size_t n)
{
	return graph_scratch(c, &c->xbf, &c->xbf_cap, n, "bf16 activations");
}

/* The product buffer of matmul_add where the kernel has no add in its
 * epilogue (cuBLAS). */
static enum llm_status yadd_get(struct cuda_be *c, size_t n)
{
	return graph_scratch(c, &c->yadd, &c->yadd_cap, n, "matmul_add product");
}

/* YD (x.rows, m->rows; row stride YS, device) = x . W^T, or with ADD
 * YD += x . W^T: the E4M3 and generic kernels add in their epilogue,
 * cuBLAS writes the product to yadd and the add kernel adds it. */
static enum llm_status gemm(struct cuda_be *c, float *yd, int64_t ys, struct llm_view x,
                            const struct llm_weight *w, const struct llm_cuda_mat *m, int add)
{
	size_t xbf_bytes = (size_t)x.rows * (size_t)x.cols * 2;
	if (m->dtype == LLM_DTYPE_E4M3) {
		enum llm_cuda_gemm_cfg cfg = llm_cuda_gemm_pick(m, x.rows);
		if (c->force_cfg >= 0 && llm_cuda_gemm_cfg_ok((enum llm_cuda_gemm_cfg)c->force_cfg, m, x.rows))
			cfg = (enum llm_cuda_gemm_cfg)c->force_cfg;
		if (cfg != LLM_GEMM_GEMV && cfg != LLM_GEMM_GENERIC) {
			LLM_TRY(xbf_get(c, xbf_bytes));
			LAUNCH(llm_cuda_f32_to_bf16(c->xbf, x.data, x.stride, x.rows, x.cols, c->stream));
		}
		LAUNCH(llm_cuda_gemm_e4m3(cfg, yd, ys, x.data, x.stride, c->xbf, x.rows, m, add, c->stream));
	} else if (m->dtype == LLM_DTYPE_BF16 && x.rows <= INT32_MAX && x.cols <= INT32_MAX
	           && w->rows <= INT32_MAX && ys <= INT32_MAX) {
		/* column-major view: y^T (N x M, ld ys) = W (N x K, stored as K x N) ^T . x^T (K x M) */
		const float one = 1.0f, zero = 0.0f;
		float *yb = yd;
		int64_t ybs = ys;
		if (add) {
			LLM_TRY(yadd_get(c, (size_t)x.rows * (size_t)w->rows * sizeof(float)));
			yb = c->yadd;
			ybs = w->rows;
		}
		LLM_TRY(xbf_get(c, xbf_bytes));
		LAUNCH(llm_cuda_f32_to_bf16(c->xbf, x.data, x.stride, x.rows, x.cols, c->stream));
		if (c->gmode != GM_REPLAY)
			LLM_CUBLAS_TRY(cublasGemmEx(c->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)x.rows,
		                            (int)x.cols, &one, m->data, CUDA_R_16BF, (int)x.cols, c->xbf,
		                            CUDA_R_16BF, (int)x.cols, &zero, yb, CUDA_R_32F, (int)ybs,
		                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
		if (add)
			LAUNCH(llm_cuda_add(yd, ys, yb, ybs, x.rows, w->rows, c->stream));
	} else {
		LAUNCH(llm_cuda_matmul_generic(yd, ys, x.data, x.stride, x.rows, m, add, c->stream));
	}
	return LLM_OK;
}

static enum llm_status matmul_shapes(const char *op, struct llm_view y, struct llm_view x, const struct llm_weight *w)
{
	if (x.cols != w->cols || y.cols != w->rows || y.rows != x.rows)
		return llm_fail(LLM_ERR_INTERNAL, "%s %s: shapes (%lld, %lld) x (%lld, %lld)^T -> (%lld, %lld)", op,
		                w->name ? w->name : "?", (long long)x.rows, (long long)x.cols,
		                (long long)w->rows, (long long)w->cols, (long long)y.rows, (long long)y.cols);
	if (y.dtype != LLM_DTYPE_F32)
		return llm_fail(LLM_ERR_UNSUPPORTED, "cuda backend: %s: %s output (f32 only)", op,
		                llm_dtype_name(y.dtype));
	return LLM_OK;
}

static enum llm_status cuda_matmul(struct llm_backend *be, struct llm_view y,
                                   struct llm_view x, const struct llm_weight *w)
{
	struct cuda_be *c = cu(be);
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "matmul", "x", x));
	LLM_TRY(matmul_shapes("matmul", y, x, w));
	if (x.rows < 1)
		return LLM_OK;
	struct llm_cuda_mat m;
	LLM_TRY(weight_get(c, w, &m));
	int host_out = !is_dev(c, y.data);
	if (c->gmode && (host_out || c->gbad)) {
		c->gbad = 1;       /* a copy to the host: not inside a graph */
		return LLM_OK;
	}
	float *yd = y.data;
	int64_t ys = y.stride;
	if (host_out) {
		LLM_TRY(scratch(&c->ystage, &c->ystage_cap, (size_t)y.rows * (size_t)y.cols * sizeof(float),
		                "matmul output"));
		yd = c->ystage;
		ys = y.cols;
	}
	LLM_TRY(gemm(c, yd, ys, x, w, &m, 0));
	if (host_out) {
		LLM_CUDA_TRY(cudaMemcpy2DAsync(y.data, (size_t)y.stride * sizeof(float), yd,
		                               (size_t)ys * sizeof(float), (size_t)y.cols * sizeof(float),
		                               (size_t)y.rows, cudaMemcpyDeviceToHost, c->stream));
		LLM_CUDA_TRY(cudaStreamSynchronize(c->stream));
	}
	return LLM_OK;
}

/* x += a . W^T (backend.h matmul_add): the residual add in the GEMM's
 * epilogue; both views device memory. */
static enum llm_status cuda_matmul_add(struct llm_backend *be, struct llm_view x, struct llm_view a,
                                       const struct llm_weight *w)
{
	struct cuda_be *c = cu(be);
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "matmul_add", "a", a));
	LLM_TRY(need_dev(c, "matmul_add", "x", x));
	LLM_TRY(matmul_shapes("matmul_add", x, a, w));
	if (a.rows < 1)
		return LLM_OK;
	struct llm_cuda_mat m;
	LLM_TRY(weight_get(c, w, &m));
	if (c->gmode && c->gbad)
		return LLM_OK;
	return gemm(c, x.data, x.stride, a, w, &m, 1);
}

static enum llm_status cuda_rope(struct llm_backend *be, struct llm_view x, const int32_t *pos,
                                 int n_head, int d_head, const float *inv_freq)
{
	struct cuda_be *c = cu(be);
	void *dpos, *dfreq;
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "rope", "x", x));
	if (x.rows < 1 || d_head < 2)
		return LLM_OK;
	LLM_TRY(slot_put(c, SLOT_POS, pos, (size_t)x.rows * sizeof(int32_t), &dpos));
	LLM_TRY(slot_put(c, SLOT_FREQ, inv_freq, (size_t)(d_head / 2) * sizeof(float), &dfreq));
	LAUNCH(llm_cuda_rope(x.data, x.stride, x.rows, dpos, n_head, d_head, dfreq, c->stream));
	return LLM_OK;
}

static enum llm_status grow_host(int32_t **p, size_t *cap, size_t n)
{
	if (*cap >= n)
		return LLM_OK;
	int32_t *q = realloc(*p, (n + n / 2 + 16) * sizeof(int32_t));
	if (!q)
		return llm_fail(LLM_ERR_NOMEM, "cuda backend: out of host memory");
	*p = q;
	*cap = n + n / 2 + 16;
	return LLM_OK;
}

/* The batch's positions and block tables, uploaded when they changed. */
static enum llm_status kv_meta(struct cuda_be *c, struct llm_kv *kv, const struct llm_batch *b,
                               struct llm_cuda_kvmeta *m, struct llm_cuda_kvgeom *g)
{
	size_t n = (size_t)b->n_tok, ntab = 0;
	if (!is_dev(c, kv->k) || !is_dev(c, kv->v))
		return llm_fail(LLM_ERR_USAGE, "cuda backend: the kv cache is not in this backend's memory");
	LLM_TRY(grow_host(&c->hpos, &c->hpos_cap, n));
	LLM_TRY(grow_host(&c->hoff, &c->hoff_cap, n));
	if (c->first_cap < (size_t)kv->max_seq) {
		size_t old = c->first_cap;
		LLM_TRY(grow_host(&c->first, &c->first_cap, (size_t)kv->max_seq));
		for (size_t i = old; i < c->first_cap; i++)
			c->first[i] = -1;
	}
	for (size_t i = 0; i < n; i++) {
		int s = b->seq[i];
		if (s < 0 || s >= kv->max_seq)
			return llm_fail(LLM_ERR_USAGE, "cuda backend: batch token %zu: sequence %d", i, s);
		if (c->first[s] < 0) {
			size_t nb = (size_t)kv->seq[s].n_blk;
			LLM_TRY(grow_host(&c->htab, &c->htab_cap, ntab + nb));
			memcpy(c->htab + ntab, kv->seq[s].blk, nb * sizeof(int32_t));
			c->first[s] = (int32_t)ntab;
			ntab += nb;
		}
		c->hoff[i] = c->first[s];
		c->hpos[i] = b->pos[i];
	}
	for (size_t i = 0; i < n; i++)
		c->first[b->seq[i]] = -1;
	if (c->gmode) {           /* a graph's copy has a fixed size: every token's table at its longest */
		size_t full = n * (size_t)(kv->max_blk > 0 ? kv->max_blk : 1);
		LLM_TRY(grow_host(&c->htab, &c->htab_cap, full));
		memset(c->htab + ntab, 0, (full - ntab) * sizeof(int32_t));
		ntab = full;
	}
	gnote(c, (uint64_t)(uintptr_t)kv->k);
	if (ntab == 0) {          /* never empty: a zero-length upload has no buffer */
		LLM_TRY(grow_host(&c->htab, &c->htab_cap, 1));
		c->htab[0] = 0;
		ntab = 1;
	}
	void *dpos, *doff, *dtab;
	LLM_TRY(slot_put(c, SLOT_KVPOS, c->hpos, n * sizeof(int32_t), &dpos));
	LLM_TRY(slot_put(c, SLOT_KVOFF, c->hoff, n * sizeof(int32_t), &doff));
	LLM_TRY(slot_put(c, SLOT_KVTAB, c->htab, ntab * sizeof(int32_t), &dtab));
	m->n_tok = b->n_tok;
	m->pos = dpos;
	m->tab_off = doff;
	m->tab = dtab;
	g->k = kv->k;
	g->v = kv->v;
	g->n_block = kv->n_block;
	g->block_size = kv->block_size;
	g->kv_dim = kv->kv_dim;
	g->n_kv_head = kv->n_kv_head;
	g->d_head = kv->d_head;
	g->bf16 = kv->dtype == LLM_DTYPE_BF16;
	g->fp8 = kv->dtype == LLM_DTYPE_E4M3;
	g->ks = kv->ks;
	g->vs = kv->vs;
	return LLM_OK;
}

static enum llm_status cuda_kv_store(struct llm_backend *be, struct llm_kv *kv, int layer,
                                     const struct llm_batch *b, struct llm_view k, struct llm_view v)
{
	struct cuda_be *c = cu(be);
	struct llm_cuda_kvmeta m;
	struct llm_cuda_kvgeom g;
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "kv_store", "k", k));
	LLM_TRY(need_dev(c, "kv_store", "v", v));
	if (b->n_tok < 1)
		return LLM_OK;
	LLM_TRY(kv_meta(c, kv, b, &m, &g));
	LAUNCH(llm_cuda_kv_store(&g, layer, &m, k.data, k.stride, v.data, v.stride, c->stream));
	return LLM_OK;
}

static enum llm_status cuda_rope_store(struct llm_backend *be, struct llm_view q, struct llm_view k,
                                      struct llm_view v, struct llm_kv *kv, int layer,
                                      const struct llm_batch *b, int n_head, int n_kv_head, int d_head,
                                      const float *inv_freq)
{
	struct cuda_be *c = cu(be);
	struct llm_cuda_kvmeta m;
	struct llm_cuda_kvgeom g;
	void *dfreq;
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "rope_store", "q", q));
	LLM_TRY(need_dev(c, "rope_store", "k", k));
	LLM_TRY(need_dev(c, "rope_store", "v", v));
	if (b->n_tok < 1)
		return LLM_OK;
	if (d_head < 2 || d_head % 2 || d_head != kv->d_head || n_kv_head != kv->n_kv_head) {
		/* the separate ops where the fused kernel does not apply */
		q.rows = k.rows = v.rows = b->n_tok;
		LLM_TRY(cuda_rope(be, q, b->pos, n_head, d_head, inv_freq));
		LLM_TRY(cuda_rope(be, k, b->pos, n_kv_head, d_head, inv_freq));
		return cuda_kv_store(be, kv, layer, b, k, v);
	}
	LLM_TRY(kv_meta(c, kv, b, &m, &g));
	LLM_TRY(slot_put(c, SLOT_FREQ, inv_freq, (size_t)(d_head / 2) * sizeof(float), &dfreq));
	LAUNCH(llm_cuda_rope_store(&g, layer, &m, q.data, q.stride, k.data, k.stride, v.data, v.stride, n_head,
	                           dfreq, c->stream));
	return LLM_OK;
}

static enum llm_status cuda_attention(struct llm_backend *be, struct llm_view out, struct llm_view q,
                                      struct llm_kv *kv, int layer, const struct llm_batch *b,
                                      int n_head)
{
	struct cuda_be *c = cu(be);
	struct llm_cuda_kvmeta m;
	struct llm_cuda_kvgeom g;
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "attention", "q", q));
	LLM_TRY(need_dev(c, "attention", "out", out));
	if (kv->d_head > 256)
		return llm_fail(LLM_ERR_UNSUPPORTED, "cuda backend: attention: d_head %d (at most 256)", kv->d_head);
	if (b->n_tok < 1)
		return LLM_OK;
	LLM_TRY(kv_meta(c, kv, b, &m, &g));
	LAUNCH(llm_cuda_attention(out.data, out.stride, q.data, q.stride, &g, layer, &m, n_head, c->stream));
	return LLM_OK;
}

static enum llm_status cuda_swiglu(struct llm_backend *be, struct llm_view out,
                                   struct llm_view gate, struct llm_view up)
{
	struct cuda_be *c = cu(be);
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "swiglu", "gate", gate));
	LLM_TRY(need_dev(c, "swiglu", "up", up));
	LLM_TRY(need_dev(c, "swiglu", "out", out));
	LAUNCH(llm_cuda_swiglu(out.data, out.stride, gate.data, gate.stride, up.data, up.stride,
	                       gate.rows, gate.cols, c->stream));
	return LLM_OK;
}

static enum llm_status cuda_add(struct llm_backend *be, struct llm_view x, struct llm_view y)
{
	struct cuda_be *c = cu(be);
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "add", "x", x));
	LLM_TRY(need_dev(c, "add", "y", y));
	LAUNCH(llm_cuda_add(x.data, x.stride, y.data, y.stride, x.rows, x.cols, c->stream));
	return LLM_OK;
}

static enum llm_status cuda_gather(struct llm_backend *be, struct llm_view out, struct llm_view x,
                                   const int32_t *idx)
{
	struct cuda_be *c = cu(be);
	void *didx;
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "gather", "x", x));
	LLM_TRY(need_dev(c, "gather", "out", out));
	if (out.rows < 1)
		return LLM_OK;
	for (int64_t i = 0; i < out.rows; i++)
		if (idx[i] < 0 || idx[i] >= x.rows)
			return llm_fail(LLM_ERR_INTERNAL, "gather: row %lld: index %d not in [0, %lld)",
			                (long long)i, idx[i], (long long)x.rows);
	LLM_TRY(slot_put(c, SLOT_IDX, idx, (size_t)out.rows * sizeof(int32_t), &didx));
	LAUNCH(llm_cuda_gather(out.data, out.stride, x.data, x.stride, didx, out.rows, x.cols, c->stream));
	return LLM_OK;
}

enum llm_status llm_cuda_argmax(struct llm_backend *be, int32_t *ids, struct llm_view logits,
                                const uint8_t *seen, float repetition_penalty)
{
	struct cuda_be *c = cu(be);
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "argmax", "logits", logits));
	if (logits.rows < 1)
		return LLM_OK;
	if (seen && !is_dev(c, seen))
		return llm_fail(LLM_ERR_USAGE, "cuda backend: argmax: seen is not device memory of this backend");
	LLM_TRY(scratch((void **)&c->ids, &c->ids_cap, (size_t)logits.rows * sizeof(int32_t), "token ids"));
	LAUNCH(llm_cuda_argmax_f32(c->ids, logits.data, logits.stride, logits.rows, logits.cols, seen,
	                       repetition_penalty, c->stream));
	LLM_CUDA_TRY(cudaMemcpyAsync(ids, c->ids, (size_t)logits.rows * sizeof(int32_t),
	                             cudaMemcpyDeviceToHost, c->stream));
	LLM_CUDA_TRY(cudaStreamSynchronize(c->stream));
	return LLM_OK;
}

/* The sample op (backend.h): the rows' parameters and lists packed into
 * one upload, the kernels of sample.cu, the ids and log-probs back. */
static enum llm_status cuda_sample(struct llm_backend *be, struct llm_view logits,
                                   const struct llm_sample_row *rows, int32_t *ids, float *logprob)
{
	struct cuda_be *c = cu(be);
	LLM_TRY(set_dev(c));
	LLM_TRY(need_dev(c, "sample", "logits", logits));
	int64_t R = logits.rows, nv = logits.cols;
	if (R < 1)
		return LLM_OK;
	size_t work = llm_cuda_sample_work(R, nv);
	if (!work)
		return llm_fail(LLM_ERR_UNSUPPORTED, "cuda backend: sample: %lld rows of %lld logits (at most 2^31 - 1 "
		                "elements)", (long long)R, (long long)nv);
	size_t naux = 0;
	int sampled = 0;
	for (int64_t r = 0; r < R; r++) {
		const struct llm_sample_row *w = &rows[r];
		for (int k = 0; k < w->n_bias; k++)
			if (w->bias[k].id < 0 || w->bias[k].id >= nv)
				return llm_fail(LLM_ERR_RANGE, "cuda backend: sample: row %lld: logit_bias id %d is not in the "
				                "vocabulary [0, %lld)", (long long)r, w->bias[k].id, (long long)nv);
		for (int k = 0; k < w->n_hold; k++)
			if (w->hold[k] < 0 || w->hold[k] >= nv)
				return llm_fail(LLM_ERR_RANGE, "cuda backend: sample: row %lld: held id %d is not in the "
				                "vocabulary", (long long)r, w->hold[k]);
		for (int k = 0; k < w->n_seen; k++)
			if (w->seen[k] < 0 || w->seen[k] >= nv)
				return llm_fail(LLM_ERR_RANGE, "cuda backend: sample: row %lld: seen id %d is not in the "
				                "vocabulary", (long long)r, w->seen[k]);
		naux += 2 * (size_t)w->n_bias + (size_t)w->n_hold + 2 * (size_t)w->n_seen;
		sampled |= w->temperature != 0;
	}
	size_t pbytes = (size_t)R * sizeof(struct llm_cuda_sample_row), nbytes = pbytes + (naux ? naux : 1) * 4;
	if (c->sp_host_cap < nbytes) {
		char *h = realloc(c->sp_host, nbytes + nbytes / 2);
		if (!h)
			return llm_fail(LLM_ERR_NOMEM, "cuda backend: out of host memory");
		c->sp_host = h;
		c->sp_host_cap = nbytes + nbytes / 2;
	}
	if (c->sp_hout_cap < (size_t)R) {
		struct llm_cuda_sample_out *h = realloc(c->sp_hout, (size_t)R * sizeof *h);
		if (!h)
			return llm_fail(LLM_ERR_NOMEM, "cuda backend: out of host memory");
		c->sp_hout = h;
		c->sp_hout_cap = (size_t)R;
	}
	struct llm_cuda_sample_row *prm = (struct llm_cuda_sample_row *)c->sp_host;
	int32_t *aux = (int32_t *)(c->sp_host + pbytes);
	size_t at = 0;
	for (int64_t r = 0; r < R; r++) {
		const struct llm_sample_row *w = &rows[r];
		struct llm_cuda_sample_row *p = &prm[r];
		memset(p, 0, sizeof *p);
		p->temperature = w->temperature;
		p->top_p = w->top_p;
		p->min_p = w->min_p;
		p->rep = w->repetition_penalty;
		p->freq = w->frequency_penalty;
		p->pres = w->presence_penalty;
		p->top_k = w->top_k;
		p->want_logprob = w->want_logprob;
		p->u = w->u;
		p->n_bias = w->n_bias;
		p->bias = (int64_t)at;
		for (int k = 0; k < w->n_bias; k++) {
			aux[at + (size_t)k] = w->bias[k].id;
			memcpy(&aux[at + (size_t)w->n_bias + (size_t)k], &w->bias[k].bias, 4);
		}
		at += 2 * (size_t)w->n_bias;
		p->n_hold = w->n_hold;
		p->hold = (int64_t)at;
		for (int k = 0; k < w->n_hold; k++)
			aux[at++] = w->hold[k];
		p->n_seen = w->n_seen;
		p->seen = (int64_t)at;
		for (int k = 0; k < w->n_seen; k++) {
			aux[at + (size_t)k] = w->seen[k];
			aux[at + (size_t)w->n_seen + (size_t)k] = w->count[k];
		}
		at += 2 * (size_t)w->n_seen;
	}
	LLM_TRY(scratch(&c->sp_dev, &c->sp_dev_cap, nbytes, "sampling parameters"));
	LLM_TRY(scratch(&c->sp_work, &c->sp_work_cap, work, "sampling work space"));
	LLM_TRY(scratch((void **)&c->sp_out, &c->sp_out_cap, (size_t)R * sizeof *c->sp_out, "sampled ids"));
	/* pageable source: returns once the bytes are staged */
	LLM_CUDA_TRY(cudaMemcpyAsync(c->sp_dev, c->sp_host, nbytes, cudaMemcpyHostToDevice, c->stream));
	LAUNCH(llm_cuda_sample(c->sp_out, logits.data, logits.stride, R, nv, c->sp_dev,
	                       (const int32_t *)((char *)c->sp_dev + pbytes), sampled, c->sp_work, c->sp_work_cap,
	                       c->stream));
	LLM_CUDA_TRY(cudaMemcpyAsync(c->sp_hout, c->sp_out, (size_t)R * sizeof *c->sp_out, cudaMemcpyDeviceToHost,
	                             c->stream));
	LLM_CUDA_TRY(cudaStreamSynchronize(c->stream));
	for (int64_t r = 0; r < R; r++) {
		ids[r] = c->sp_hout[r].id;
		logprob[r] = c->sp_hout[r].logprob;
	}
	return LLM_OK;
}

/* Every graph and the arena's contents go (their addresses changed). */
static void graphs_reset(struct cuda_be *c)
{
	for (int i = 0; i < c->n_gr; i++) {
		if (c->gr[i].exec)
			cudaGraphExecDestroy(c->gr[i].exec);
		free(c->gr[i].up);
		free(c->gr[i].ent_off);
	}
	memset(c->gr, 0, sizeof c->gr);
	c->n_gr = 0;
	c->arena_used = 0;
	c->graph_epoch = c->epoch;
}

static int cuda_graph_begin(struct llm_backend *be, int64_t key, const void *out)
{
	struct cuda_be *c = cu(be);
	if (!c->graphs || c->gmode || !out || !is_dev(c, out) || set_dev(c))
		return 0;
	if (c->graph_epoch != c->epoch)
		graphs_reset(c);
	struct cgraph *g = NULL;
	for (int i = 0; i < c->n_gr && !g; i++)
		if (c->gr[i].key == key)
			g = &c->gr[i];
	if (!g) {                 /* the first step of this size runs op by op (uploads, buffers) */
		if (c->n_gr < GRAPH_MAX) {
			g = &c->gr[c->n_gr++];
			g->key = key;
			g->out = out;
		}
		return 0;
	}
	if (g->state < 0)
		return 0;
	if (g->out != out) {      /* another output: record again */
		if (g->exec)
			cudaGraphExecDestroy(g->exec);
		g->exec = NULL;
		g->n_up = g->n_ent = 0;
		g->state = 0;
		g->out = out;
		return 0;
	}
	if (!c->arena_h) {
		if (cudaMallocHost((void **)&c->arena_h, ARENA_BYTES) != cudaSuccess
		    || cudaMalloc((void **)&c->arena_d, ARENA_BYTES) != cudaSuccess) {
			(void)cudaGetLastError();
			c->graphs = 0;
			return 0;
		}
	}
	c->gcur = g;
	c->gbad = 0;
	c->up_i = 0;
	c->ghash = 0xcbf29ce484222325ull;
	if (g->state == 1) {
		c->gmode = GM_REPLAY;
		return 1;
	}
	if (cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) {
		(void)cudaGetLastError();
		g->state = -1;
		return 0;
	}
	g->n_up = g->n_ent = 0;
	c->gmode = GM_CAPTURE;
	return 1;
}

static enum llm_status cuda_graph_end(struct llm_backend *be, int failed, int *redo)
{
	struct cuda_be *c = cu(be);
	struct cgraph *g = c->gcur;
	int mode = c->gmode;
	*redo = 0;
	c->gmode = GM_OFF;
	c->gcur = NULL;
	if (!g || mode == GM_OFF)
		return LLM_OK;
	LLM_TRY(set_dev(c));
	if (mode == GM_CAPTURE) {
		cudaGraph_t graph = NULL;
		cudaError_t e = cudaStreamEndCapture(c->stream, &graph);
		if (e == cudaSuccess && !failed && !c->gbad) {
			e = cudaGraphInstantiate(&g->exec, graph, 0);
			if (e != cudaSuccess)
				g->exec = NULL;
		}
		if (graph)
			cudaGraphDestroy(graph);
		if (e != cudaSuccess || failed || c->gbad || !g->exec) {
			/* nothing ran: op by op again, where an op's own error shows;
			 * this size is not captured again */
			(void)cudaGetLastError();
			if (g->exec)
				cudaGraphExecDestroy(g->exec);
			g->exec = NULL;
			g->state = -1;
			*redo = 1;
			c->n_redo++;
			return LLM_OK;
		}
		g->state = 1;
		g->hash = c->ghash;
		c->n_captured++;
	} else {
		if (failed)
			return LLM_OK;
		if (c->gbad || c->up_i != g->n_up || c->ghash != g->hash) {
			*redo = 1;
			c->n_redo++;
			return LLM_OK;
		}
		c->n_replayed++;
	}
	LLM_CUDA_TRY(cudaGraphLaunch(g->exec, c->stream));
	LLM_CUDA_TRY(cudaStreamSynchronize(c->stream));
	return LLM_OK;
}

void llm_cuda_graphs(struct llm_backend *be, int on)
{
	struct cuda_be *c = cu(be);
	c->graphs = on != 0;
	c->epoch++;
}

void llm_cuda_graph_stats(struct llm_backend *be, long *captured, long *replayed, long *redone)
{
	struct cuda_be *c = cu(be);
	*captured = c->n_captured;
	*replayed = c->n_replayed;
	*redone = c->n_redo;
}

#ifdef LLM_NCCL
/* comm_open (backend.h): NCCL over BOOT's ranks on this backend's device
 * (common/engine/comm_nccl.c, built into this library with it). */
static enum llm_status cuda_comm_open(struct llm_backend *be, struct llm_comm *boot, struct llm_comm **out)
{
	return llm_comm_nccl_open(boot, cu(be)->dev, out);
}
#endif

static enum llm_status cuda_sync(struct llm_backend *be)
{
	struct cuda_be *c = cu(be);
	if (c->gmode)             /* a graph step: graph_end launches and waits */
		return LLM_OK;
	LLM_TRY(set_dev(c));
	LLM_CUDA_TRY(cudaStreamSynchronize(c->stream));
	LLM_CUDA_TRY(cudaGetLastError());
	return LLM_OK;
}

/* ---- lifecycle --------------------------------------------------------- */

static void cuda_fini(struct llm_backend *be)
{
	struct cuda_be *c = cu(be);
	if (!c)
		return;
	set_dev(c);
	if (c->stream)
		cudaStreamSynchronize(c->stream);
	if (c->upload)
		cudaStreamSynchronize(c->upload);
	llm_cuda_weights_drop(be);
	for (int i = 0; i < SLOT_COUNT; i++) {
		if (c->slot[i].dev)
			cudaFree(c->slot[i].dev);
		free(c->slot[i].host);
	}
	for (size_t i = 0; i < c->n_alloc; i++)     /* what the caller did not release */
		cudaFree(c->allocs[i].p);
	free(c->allocs);
	if (c->xbf)
		cudaFree(c->xbf);
	if (c->ystage)
		cudaFree(c->ystage);
	if (c->yadd)
		cudaFree(c->yadd);
	if (c->ids)
		cudaFree(c->ids);
	if (c->sp_dev)
		cudaFree(c->sp_dev);
	if (c->sp_work)
		cudaFree(c->sp_work);
	if (c->sp_out)
		cudaFree(c->sp_out);
	free(c->sp_host);
	free(c->sp_hout);
	graphs_reset(c);
	if (c->arena_h)
		cudaFreeHost(c->arena_h);
	if (c->arena_d)
		cudaFree(c->arena_d);
	for (int i = 0; i < 2; i++) {
		if (c->pinned[i])
			cudaFreeHost(c->pinned[i]);
		if (c->pev[i])
			cudaEventDestroy(c->pev[i]);
	}
	if (c->updone)
		cudaEventDestroy(c->updone);
	if (c->blas)
		cublasDestroy(c->blas);
	if (c->stream)
		cudaStreamDestroy(c->stream);
	if (c->upload)
		cudaStreamDestroy(c->upload);
	free(c->hpos);
	free(c->hoff);
	free(c->htab);
	free(c->first);
	free(c);
	be->priv = NULL;
}

static enum llm_status cuda_init(struct llm_backend *be, const struct llm_backend_opts *o)
{
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		(void)cudaGetLastError();
		return llm_fail(LLM_ERR_UNSUPPORTED, "backend cuda: no CUDA device (%s)",
		                e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
	}
	if (o->device < 0 || o->device >= n)
		return llm_fail(LLM_ERR_USAGE, "backend cuda:%d: %d device%s visible", o->device, n, n == 1 ? "" : "s");
	struct cudaDeviceProp p;
	LLM_CUDA_TRY(cudaGetDeviceProperties(&p, o->device));
	if (p.major < 8)
		return llm_fail(LLM_ERR_UNSUPPORTED, "backend cuda:%d: %s is compute capability %d.%d; "
		                "the kernels need 8.0 or later (bf16 tensor cores)", o->device, p.name,
		                p.major, p.minor);
	struct cuda_be *c = calloc(1, sizeof *c);
	if (!c)
		return llm_fail(LLM_ERR_NOMEM, "cuda backend: out of memory");
	be->priv = c;
	c->dev = o->device;
	c->force_cfg = -1;
	const char *gv = getenv("LLM_CUDA_GRAPHS");
	c->graphs = !(gv && !strcmp(gv, "0"));
	snprintf(c->name, sizeof c->name, "%s", p.name);
	enum llm_status s = LLM_OK;
	if ((e = cudaSetDevice(c->dev)) != cudaSuccess
	    || (e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess
	    || (e = cudaStreamCreateWithFlags(&c->upload, cudaStreamNonBlocking)) != cudaSuccess) {
		s = llm_fail(LLM_ERR_CUDA, "backend cuda:%d: %s", c->dev, cudaGetErrorString(e));
	} else {
		cublasStatus_t bs = cublasCreate(&c->blas);
		if (bs == CUBLAS_STATUS_SUCCESS)
			bs = cublasSetStream(c->blas, c->stream);
		if (bs != CUBLAS_STATUS_SUCCESS)
			s = llm_fail(LLM_ERR_CUDA, "backend cuda:%d: cuBLAS: %s", c->dev, cublasGetStatusString(bs));
	}
	if (s) {
		cuda_fini(be);
		return s;
	}
	be->n_threads = 1;
	return LLM_OK;
}

const struct llm_backend_ops llm_cuda_ops = {
	.name = "cuda",
	.supports = cuda_supports,
	.init = cuda_init,
	.fini = cuda_fini,
	.alloc = cuda_alloc,
	.release = cuda_release,
	.copy_in = cuda_copy_in,
	.embed = cuda_embed,
	.rmsnorm = cuda_rmsnorm,
	.matmul = cuda_matmul,
	.rope = cuda_rope,
	.kv_store = cuda_kv_store,
	.attention = cuda_attention,
	.swiglu = cuda_swiglu,
	.add = cuda_add,
	.add_rmsnorm = llm_cuda_add_rmsnorm,
	.rope_store = cuda_rope_store,
	.matmul_add = cuda_matmul_add,
	.gather = cuda_gather,
	.sample = cuda_sample,
	.graph_begin = cuda_graph_begin,
	.graph_end = cuda_graph_end,
#ifdef LLM_NCCL
	.comm_open = cuda_comm_open,
#endif
	.sync = cuda_sync,
};
