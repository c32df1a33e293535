/* common/engine/backend_cpu.c: the CPU backend, the reference implementation of
 * every op in backend.h.
 *
 * Numerics follow llama2.c run.c (the reference the model tests compare
 * with): f32 everywhere, RMSNorm as w * (x * (1 / sqrtf(mean(x^2) + eps))),
 * attention scores q.k / sqrtf(d_head), softmax with the max subtracted,
 * SiLU as g * (1 / (1 + e^-g)); e^x is llm_cpu_exp (within 2 ulp of expf,
 * vectorized, the same bits at every ISA). Log-probabilities are computed
 * by the callers, in double.
 *
 * Threads: a persistent pool (pool.h); each op splits its independent output rows
 * (matmul: weight rows; attention: (run of a sequence's query rows, heads of a KV group) items; the
 * rest: tokens or elements)
 * among the threads and never splits a reduction, so results do not depend
 * on the thread count or on the other tokens of the batch. Small ops run on
 * the calling thread alone. */
#define _GNU_SOURCE
#include "backend.h"
#include "kvcache.h"
#include "pool.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "banned.h"

/* ---- backend state ----------------------------------------------------- */

struct cpu_be {
	struct llm_pool *pool;   /* the threads every op runs on */
	enum llm_cpu_isa isa;
	float *scratch;        /* (CHUNKS_PER_THREAD n_threads, scratch_per) per chunk: attention scores + k/v rows */
	size_t scratch_per;
	int attn_rows;         /* query rows an attention item takes together (the scratch holds their scores) */
	int32_t *seg;          /* (seg_cap) attention: first batch token of each run of rows, then n_tok */
	size_t seg_cap;
	uint16_t *xbf;         /* (xbf_cap) matmul input rounded to bf16 */
	size_t xbf_cap;
	int chain;             /* chain(be, 1) is in force */
	struct llm_view xbf_of;   /* the view xbf holds, made by the op that wrote it; data NULL: none */
	struct { void *p; size_t n; } big[16];   /* allocations mapped straight from the kernel */
	/* rope: per position (rope_n of them) the rope_half cosines of
	 * pos * inv_freq[j], then the rope_half sines, made once per position
	 * for the inv_freq they were made with */
	float *rope_cs, *rope_freq;
	int32_t rope_n;
	int rope_half;
};

static struct cpu_be *cpu(struct llm_backend *be) { return be->priv; }

/* Chunks worth making of WORK multiply-adds: one below 2^17 (a job costs a
 * few microseconds to hand out), else a few per thread, at most
 * CHUNKS_PER_THREAD (attention's scratch is sized by it). */
#define CHUNKS_PER_THREAD 4
static int nth_for(struct llm_backend *be, double work)
{
	int nt = llm_pool_threads(cpu(be)->pool);
	if (work < 131072.0 || nt == 1)
		return 1;
	int n = CHUNKS_PER_THREAD * nt;
	if (n > LLM_POOL_MAX_CHUNKS)
		n = LLM_POOL_MAX_CHUNKS / nt * nt;
	return work / n < 32768.0 ? nt : n;
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

static inline float vec_at(const struct llm_weight *w, int64_t i)
{
	switch (w->dtype) {
	case LLM_DTYPE_F32:  return ((const float *)w->data)[i];
	case LLM_DTYPE_F16:  return llm_f16_to_f32(((const uint16_t *)w->data)[i]);
	case LLM_DTYPE_BF16: return llm_bf16_to_f32(((const uint16_t *)w->data)[i]);
	case LLM_DTYPE_E4M3: return llm_e4m3_table[((const uint8_t *)w->data)[i]] *
	                            w->scale[i / w->block_cols];
	default: return NAN;
	}
}

static inline float *row(struct llm_view v, int64_t i) { return (float *)v.data + i * v.stride; }

/* x row T += y row T (the residual add of add and add_rmsnorm) */
static inline void add_row(struct llm_view x, struct llm_view y, int64_t t)
{
	float *a = row(x, t);
	const float *c = row(y, t);
	for (int64_t i = 0; i < x.cols; i++)
		a[i] += c[i];
}

static enum llm_status need_f32(const char *op, struct llm_view v)
{
	if (v.dtype != LLM_DTYPE_F32)
		return llm_fail(LLM_ERR_UNSUPPORTED, "cpu backend: %s: %s activations (f32 only)",
		                op, llm_dtype_name(v.dtype));
	return LLM_OK;
}

/* ---- ops --------------------------------------------------------------- */

static bool cpu_supports(enum llm_op op, enum llm_dtype w, enum llm_dtype act)
{
	(void)op;
	if (act != LLM_DTYPE_F32)
		return false;
	return w == LLM_DTYPE_F32 || w == LLM_DTYPE_F16 || w == LLM_DTYPE_BF16 || w == LLM_DTYPE_E4M3;
}

/* Zeroed memory. Large blocks (the KV pool, activations) are anonymous
 * mappings: the kernel hands out zero pages as they are first touched, so a
 * KV cache sized for long contexts costs neither start-up time (a memset of
 * 190 MB took 0.75 s of SmolLM2's start-to-first-token) nor resident memory
 * until it is used. */
#define BIG_ALLOC ((size_t)1 << 20)

static enum llm_status cpu_alloc(struct llm_backend *be, size_t n, void **p)
{
	struct cpu_be *c = cpu(be);
	*p = NULL;
	for (size_t i = 0; n >= BIG_ALLOC && c && i < sizeof c->big / sizeof *c->big; i++) {
		if (c->big[i].p)
			continue;
		void *m = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (m == MAP_FAILED)
			return llm_fail(LLM_ERR_NOMEM, "cpu backend: cannot map %zu bytes", n);
		c->big[i].p = *p = m;
		c->big[i].n = n;
		return LLM_OK;
	}
	if (posix_memalign(p, 64, n ? n : 64))
		return llm_fail(LLM_ERR_NOMEM, "cpu backend: cannot allocate %zu bytes", n);
	memset(*p, 0, n);
	return LLM_OK;
}

static void cpu_release(struct llm_backend *be, void *p)
{
	struct cpu_be *c = cpu(be);
	for (size_t i = 0; p && c && i < sizeof c->big / sizeof *c->big; i++)
		if (c->big[i].p == p) {
			munmap(p, c->big[i].n);
			c->big[i].p = NULL;
			return;
		}
	free(p);
}

static enum llm_status cpu_copy_in(struct llm_backend *be, void *dst, const void *src, size_t n)
{
	(void)be;
	memcpy(dst, src, n);
	return LLM_OK;
}

static enum llm_status cpu_embed(struct llm_backend *be, struct llm_view out,
                                 const int32_t *tok, const struct llm_weight *emb)
{
	(void)be;
	LLM_TRY(need_f32("embed", out));
	for (int64_t i = 0; i < out.rows; i++) {
		if (tok[i] < 0 || tok[i] >= emb->rows)
			return llm_fail(LLM_ERR_RANGE, "embed: token %lld: id %d not in [0, %lld)",
			                (long long)i, tok[i], (long long)emb->rows);
		llm_weight_row_f32(emb, tok[i], row(out, i));
	}
	return LLM_OK;
}

/* xbf for at least NEED elements; nonzero when out of memory */
static int xbf_reserve(struct cpu_be *c, size_t need)
{
	if (c->xbf_cap >= need)             /* grows to the largest batch, then stays */
		return 0;
	uint16_t *p = malloc(need * sizeof *p);
	if (!p)
		return 1;
	free(c->xbf);
	c->xbf = p;
	c->xbf_cap = need;
	return 0;
}

/* With the chain on (see llm_backend_ops.chain) and the bf16 dot products
 * in use, the op writing OUT also writes its bf16 rounding into xbf (rows
 * OUT.cols apart), for the matmul that reads OUT next: the threads that
 * wrote a row round it while it is in their cache. Done by one thread
 * after, the rounding read rows from the other core's cache, most of the
 * time between jobs (16 tokens: 3-9 us before each matmul). The bf16 copy
 * to write, or NULL. */
static uint16_t *chain_out(struct cpu_be *c, struct llm_view out)
{
	c->xbf_of.data = NULL;
	if (!c->chain || c->isa < LLM_ISA_AVX512BF16 || out.dtype != LLM_DTYPE_F32
	    || xbf_reserve(c, (size_t)out.rows * (size_t)out.cols))
		return NULL;
	return c->xbf;
}

/* OUT's op is done: XB (chain_out's) holds it for the next matmul */
static void chain_made(struct cpu_be *c, const uint16_t *xb, struct llm_view out)
{
	if (xb)
		c->xbf_of = out;
}

/* Elements [i0, i1) of row T of OUT, just written, into its bf16 copy XB */
static void chain_row(uint16_t *xb, struct llm_view out, int64_t t, int64_t i0, int64_t i1)
{
	if (xb && i1 > i0)
		llm_cpu_x_to_bf16(xb + t * out.cols + i0, out.cols, row(out, t) + i0, out.stride, 1, i1 - i0);
}

static void cpu_chain(struct llm_backend *be, int on)
{
	cpu(be)->chain = on;
	cpu(be)->xbf_of.data = NULL;
}

struct norm_job { struct llm_view out, x, y; const struct llm_weight *w; float eps; uint16_t *xb; };

/* Rows 4 at a time: each row's sum of squares is the same chain of f32
 * adds in column order as alone (the same bits), but four chains run
 * side by side instead of one add waiting on the last. The weight is read
 * as f32 once per chunk. With Y (add_rmsnorm) the rows of a group take
 * x += y first, before any row of OUT (which may be Y) is written. */
#define NORM_WF 8192                 /* columns of the f32 weight on the stack */
static void norm_task(void *ctx, int ith, int nth)
{
	struct norm_job *j = ctx;
	int64_t b, e, n = j->x.cols;
	split(j->x.rows, ith, nth, 1, &b, &e);
	if (b >= e)
		return;
	float wf[NORM_WF];
	int have_wf = n <= NORM_WF;
	if (have_wf)
		for (int64_t i = 0; i < n; i++)
			wf[i] = vec_at(j->w, i);
	for (int64_t t = b; t < e; t += 4) {
		int nr = e - t < 4 ? (int)(e - t) : 4;
		const float *x[4];
		for (int r = 0; r < 4; r++)
			x[r] = row(j->x, t + (r < nr ? r : 0));
		if (j->y.data)
			for (int r = 0; r < nr; r++)
				add_row(j->x, j->y, t + r);
		const float *x0 = x[0], *x1 = x[1], *x2 = x[2], *x3 = x[3];
		float s0 = 0.0f, s1 = 0.0f, s2 = 0.0f, s3 = 0.0f;
		for (int64_t i = 0; i < n; i++) {
			s0 += x0[i] * x0[i];
			s1 += x1[i] * x1[i];
			s2 += x2[i] * x2[i];
			s3 += x3[i] * x3[i];
		}
		float ss[4] = { s0, s1, s2, s3 };
		for (int r = 0; r < nr; r++) {
			float v = ss[r] / (float)n;
			v += j->eps;
			v = 1.0f / sqrtf(v);
			float *o = row(j->out, t + r);
			const float *xr = x[r];
			if (have_wf) {
				/* four lanes at a time, the scalar's two products each */
				typedef float v4 __attribute__((vector_size(16)));
				v4 vv = { v, v, v, v };
				int64_t i = 0;
				for (; i + 4 <= n; i += 4) {
					v4 a, w4;
					memcpy(&a, xr + i, sizeof a);
					memcpy(&w4, wf + i, sizeof w4);
					a = w4 * (vv * a);
					memcpy(o + i, &a, sizeof a);
				}
				for (; i < n; i++)
					o[i] = wf[i] * (v * xr[i]);
			} else {
				for (int64_t i = 0; i < n; i++)
					o[i] = vec_at(j->w, i) * (v * xr[i]);
			}
			chain_row(j->xb, j->out, t + r, 0, n);
		}
	}
}

/* J over the pool, weighted like swiglu: below a few thousand rows x
 * columns (one token) a hand-out costs more than it saves */
static enum llm_status norm_run(struct llm_backend *be, const char *op, struct norm_job *j)
{
	LLM_TRY(need_f32(op, j->x));
	j->xb = chain_out(cpu(be), j->out);
	llm_pool_run(cpu(be)->pool, nth_for(be, 16.0 * (double)j->x.rows * (double)j->x.cols), norm_task, j);
	chain_made(cpu(be), j->xb, j->out);
	return LLM_OK;
}

static enum llm_status cpu_rmsnorm(struct llm_backend *be, struct llm_view out,
                                   struct llm_view x, const struct llm_weight *w, float eps)
{
	struct norm_job j = { .out = out, .x = x, .w = w, .eps = eps };
	return norm_run(be, "rmsnorm", &j);
}

static enum llm_status cpu_add_rmsnorm(struct llm_backend *be, struct llm_view out, struct llm_view x,
                                       struct llm_view y, const struct llm_weight *w, float eps)
{
	struct norm_job j = { .out = out, .x = x, .y = y, .w = w, .eps = eps };
	return norm_run(be, "add_rmsnorm", &j);
}

/* Y[i] = X . W[i]^T for i < n: one dispatch over the rows of every W
 * (q, k and v, or gate and up, share their input), so small matrices still
 * split across threads and the pool is woken once. */
#define MM_MAX 4
struct mm_job {
	int n;
	struct llm_view y[MM_MAX], x;
	const struct llm_weight *w[MM_MAX];
	int64_t off[MM_MAX + 1];     /* first row of w[i] in the concatenation */
	enum llm_cpu_isa isa;
	const uint16_t *xb;          /* (x.rows, x.cols) x rounded to bf16, or NULL */
};

/* Rows [b, e) of chunk ITH of NTH over N (multiples of ALIGN). When the
 * chunks are CHUNKS_PER_THREAD per thread, as the pool deals them (thread
 * q's part: chunks q K .. q K + K - 1), a part's rows are split K : K-1 :
 * ... : 1, so the chunks taken last (a part's back, where an idle thread
 * steals) are the small ones and the threads end closer together. */
static void split_taper(int64_t n, int ith, int nth, int64_t align, int64_t *b, int64_t *e)
{
	const int k = CHUNKS_PER_THREAD;
	if (nth % k) {
		split(n, ith, nth, align, b, e);
		return;
	}
	int64_t pb, pe;
	split(n, ith / k, nth / k, align, &pb, &pe);
	int i = ith % k, tot = k * (k + 1) / 2, c0 = i * k - i * (i - 1) / 2, c1 = c0 + k - i;
	int64_t len = pe - pb;
	*b = pb + len * c0 / tot / align * align;
	*e = i == k - 1 ? pe : pb + len * c1 / tot / align * align;
}

static void mm_task(void *ctx, int ith, int nth)
{
	struct mm_job *j = ctx;
	int64_t b, e;
	split_taper(j->off[j->n], ith, nth, 4, &b, &e);
	for (int i = 0; i < j->n && b < e; i++) {
		int64_t lo = b > j->off[i] ? b : j->off[i], hi = e < j->off[i + 1] ? e : j->off[i + 1];
		if (lo >= hi)
			continue;
		const struct llm_weight *w = j->w[i];
		lo -= j->off[i];
		hi -= j->off[i];
		if (j->xb && llm_cpu_matmul_isa(j->isa, w->dtype) == LLM_ISA_AVX512BF16)
			llm_cpu_matmul_rows_bf16x(j->y[i].data, j->y[i].stride, j->xb, j->x.cols, j->x.rows, w, lo, hi);
		else
			llm_cpu_matmul_rows(j->isa, j->y[i].data, j->y[i].stride, j->x.data, j->x.stride,
			                    j->x.rows, w, lo, hi);
	}
}

static enum llm_status cpu_matmul_n(struct llm_backend *be, int n, const struct llm_view *y,
                                    struct llm_view x, const struct llm_weight *const *w)
{
	LLM_TRY(need_f32("matmul", x));
	struct cpu_be *c = cpu(be);
	if (n < 1 || n > MM_MAX)
		return llm_fail(LLM_ERR_INTERNAL, "matmul: %d weights in one dispatch (1 to %d)", n, MM_MAX);
	struct mm_job j = { .n = n, .x = x, .isa = c->isa };
	int bfx = 0;
	for (int i = 0; i < n; i++) {
		if (x.cols != w[i]->cols || y[i].cols != w[i]->rows || y[i].rows != x.rows)
			return llm_fail(LLM_ERR_INTERNAL,
			                "matmul %s: shapes (%lld, %lld) x (%lld, %lld)^T -> (%lld, %lld)",
			                w[i]->name ? w[i]->name : "?", (long long)x.rows, (long long)x.cols,
			                (long long)w[i]->rows, (long long)w[i]->cols, (long long)y[i].rows,
			                (long long)y[i].cols);
		j.y[i] = y[i];
		j.w[i] = w[i];
		j.off[i + 1] = j.off[i] + w[i]->rows;
		bfx |= llm_cpu_matmul_isa(c->isa, w[i]->dtype) == LLM_ISA_AVX512BF16;
	}
	if (bfx) {
		/* x rounded to bf16 once, not once per row tile: here, unless the
		 * op that wrote x did (chain_out) */
		const struct llm_view *o = &c->xbf_of;
		if (!(o->data == x.data && o->rows == x.rows && o->cols == x.cols && o->stride == x.stride)) {
			size_t need = (size_t)x.rows * (size_t)x.cols;
			if (xbf_reserve(c, need))
				return llm_fail(LLM_ERR_NOMEM, "matmul: bf16 activations of %zu elements", need);
			llm_cpu_x_to_bf16(c->xbf, x.cols, x.data, x.stride, x.rows, x.cols);
		}
		j.xb = c->xbf;
	}
	c->xbf_of.data = NULL;          /* taken (or xbf rewritten) */
	double work = (double)x.rows * (double)j.off[n] * (double)x.cols;
	llm_pool_run(c->pool, nth_for(be, work), mm_task, &j);
	return LLM_OK;
}

static enum llm_status cpu_matmul(struct llm_backend *be, struct llm_view y,
                                  struct llm_view x, const struct llm_weight *w)
{
	return cpu_matmul_n(be, 1, &y, x, &w);
}

/* The cos/sin table covering positions 0..max_pos, or NULL (out of memory:
 * the caller computes them). The table's values are the cosf/sinf of the
 * same f32 angle that the direct loop computes. */
static const float *rope_table(struct cpu_be *c, int32_t max_pos, int half, const float *inv_freq)
{
	if (c->rope_half != half || !c->rope_freq || memcmp(c->rope_freq, inv_freq, (size_t)half * sizeof *inv_freq)) {
		free(c->rope_cs);
		free(c->rope_freq);
		c->rope_cs = NULL;
		c->rope_n = 0;
		c->rope_half = half;
		if (!(c->rope_freq = malloc((size_t)half * sizeof *inv_freq)))
			return NULL;
		memcpy(c->rope_freq, inv_freq, (size_t)half * sizeof *inv_freq);
	}
	if (max_pos >= c->rope_n) {
		int64_t n = (int64_t)c->rope_n * 2 > (int64_t)max_pos + 1 ? (int64_t)c->rope_n * 2 : (int64_t)max_pos + 1;
		if (n < 256)
			n = 256;
		float *t = realloc(c->rope_cs, (size_t)n * (size_t)half * 2 * sizeof *t);
		if (!t)
			return NULL;
		for (int64_t p = c->rope_n; p < n; p++)
			for (int j = 0; j < half; j++) {
				/* as run.c: the angle and its cos/sin in f32 */
				float a = (float)p * inv_freq[j];
				t[p * half * 2 + j] = cosf(a);
				t[p * half * 2 + half + j] = sinf(a);
			}
		c->rope_cs = t;
		c->rope_n = (int32_t)n;
	}
	return c->rope_cs;
}

/* Rotate the N_HEAD heads of row X by the cosines CO and sines SI (half
 * each): the scalar products and sums of run.c, four pairs at a time (no
 * contraction: -std=c11, so the same bits). */
static void rope_row(float *x, int n_head, int d_head, const float *co, const float *si)
{
	typedef float v4 __attribute__((vector_size(16)));
	int half = d_head / 2;
	for (int h = 0; h < n_head; h++) {
		float *p0 = x + (size_t)h * (size_t)d_head, *p1 = p0 + half;
		int j = 0;
		for (; j + 4 <= half; j += 4) {
			v4 a, b, c, s;
			memcpy(&a, p0 + j, sizeof a);
			memcpy(&b, p1 + j, sizeof b);
			memcpy(&c, co + j, sizeof c);
			memcpy(&s, si + j, sizeof s);
			v4 r0 = a * c - b * s, r1 = a * s + b * c;
			memcpy(p0 + j, &r0, sizeof r0);
			memcpy(p1 + j, &r1, sizeof r1);
		}
		for (; j < half; j++) {
			float v0 = p0[j], v1 = p1[j];
			p0[j] = v0 * co[j] - v1 * si[j];
			p1[j] = v0 * si[j] + v1 * co[j];
		}
	}
}

/* rope on q (N_HEAD heads; 0: none) and k (N_KV_HEAD), then k and v into
 * the cache (KV; NULL: no store), token by token. */
struct rope_job {
	struct llm_view q, k, v;
	int n_head, n_kv_head, d_head;
	const int32_t *pos;
	const float *tab, *inv_freq;     /* tab: rope_table, or NULL */
	struct llm_kv *kv;
	int layer;
	const struct llm_batch *b;
};

#define ROPE_HALF_MAX 512            /* head_dim <= 1024 (model.c) */

static void rope_task(void *ctx, int ith, int nth)
{
	struct rope_job *j = ctx;
	int half = j->d_head / 2;
	int64_t n = j->n_head ? j->q.rows : j->k.rows, lo, hi;
	split(n, ith, nth, 1, &lo, &hi);
	float buf[2 * ROPE_HALF_MAX];
	for (int64_t t = lo; t < hi; t++) {
		if (j->n_head || j->n_kv_head) {
			const float *cs = buf;
			if (j->tab && j->pos[t] >= 0)
				cs = j->tab + (size_t)j->pos[t] * (size_t)half * 2;
			else
				for (int i = 0; i < half; i++) {      /* half <= ROPE_HALF_MAX: rope_run */
					float a = (float)j->pos[t] * j->inv_freq[i];
					buf[i] = cosf(a);
					buf[half + i] = sinf(a);
				}
			if (j->n_head)
				rope_row(row(j->q, t), j->n_head, j->d_head, cs, cs + half);
			if (j->n_kv_head)
				rope_row(row(j->k, t), j->n_kv_head, j->d_head, cs, cs + half);
		}
		if (!j->kv)
			continue;
		struct llm_kv *kv = j->kv;
		const struct llm_batch *b = j->b;
		size_t hb = (size_t)kv->d_head * kv->elt;
		for (int h = 0; h < kv->n_kv_head; h++) {   /* each head's row in its own run of the block */
			size_t off = llm_kv_offset(kv, j->layer, b->seq[t], b->pos[t], h), ho = (size_t)h * (size_t)kv->d_head;
			if (kv->dtype == LLM_DTYPE_F32) {
				memcpy((float *)kv->k + off, row(j->k, t) + ho, hb);
				memcpy((float *)kv->v + off, row(j->v, t) + ho, hb);
			} else if (kv->dtype == LLM_DTYPE_E4M3) {   /* codes and a scale */
				size_t si = llm_kv_scale_index(kv, off);
				llm_kv_e4m3_row((uint8_t *)kv->k + off, kv->ks + si, row(j->k, t) + ho, kv->d_head);
				llm_kv_e4m3_row((uint8_t *)kv->v + off, kv->vs + si, row(j->v, t) + ho, kv->d_head);
			} else {
				llm_from_f32((uint16_t *)kv->k + off, LLM_DTYPE_BF16, row(j->k, t) + ho, (size_t)kv->d_head);
				llm_from_f32((uint16_t *)kv->v + off, LLM_DTYPE_BF16, row(j->v, t) + ho, (size_t)kv->d_head);
			}
			/* the next layer stores this token's rows into lines
			 * that are not in cache (blocks lie anywhere in a cache
			 * far larger than L3): fetch them for writing now, a
			 * layer ahead */
			if (j->layer + 1 < kv->n_layer) {
				size_t nx = llm_kv_offset(kv, j->layer + 1, b->seq[t], b->pos[t], h) * kv->elt;
				for (size_t o = 0; o < hb; o += 64) {
					__builtin_prefetch((char *)kv->k + nx + o, 1, 2);
					__builtin_prefetch((char *)kv->v + nx + o, 1, 2);
				}
			}
		}
	}
}

/* rope_task over the pool, two chunks of tokens per thread (a token is a
 * few hundred nanoseconds of work, most of it the cache's write misses);
 * the cos/sin table is grown here, before any task reads it. */
static enum llm_status rope_run(struct llm_backend *be, struct rope_job *j)
{
	struct cpu_be *c = cpu(be);
	int64_t n = j->n_head ? j->q.rows : j->k.rows;
	if (j->n_head || j->n_kv_head) {
		if (j->d_head / 2 > ROPE_HALF_MAX)
			return llm_fail(LLM_ERR_UNSUPPORTED, "rope: head_dim %d over %d", j->d_head, 2 * ROPE_HALF_MAX);
		int32_t max_pos = 0;
		for (int64_t t = 0; t < n; t++)
			max_pos = j->pos[t] > max_pos ? j->pos[t] : max_pos;
		j->tab = rope_table(c, max_pos, j->d_head / 2, j->inv_freq);
	}
	int64_t n_chunk = n < 2 ? 1 : n < 2 * llm_pool_threads(c->pool) ? n : 2 * llm_pool_threads(c->pool);
	llm_pool_run(c->pool, (int)n_chunk, rope_task, j);
	return LLM_OK;
}

static enum llm_status cpu_rope(struct llm_backend *be, struct llm_view x, const int32_t *pos,
                                int n_head, int d_head, const float *inv_freq)
{
	LLM_TRY(need_f32("rope", x));
	struct rope_job j = { .q = x, .n_head = n_head, .d_head = d_head, .pos = pos, .inv_freq = inv_freq };
	return rope_run(be, &j);
}

static enum llm_status cpu_kv_store(struct llm_backend *be, struct llm_kv *kv, int layer,
                                    const struct llm_batch *b, struct llm_view k, struct llm_view v)
{
	LLM_TRY(need_f32("kv_store", k));
	struct rope_job j = { .k = k, .v = v, .pos = b->pos, .kv = kv, .layer = layer, .b = b };
	j.k.rows = b->n_tok;
	return rope_run(be, &j);
}

static enum llm_status cpu_rope_store(struct llm_backend *be, struct llm_view q, struct llm_view k,
                                      struct llm_view v, struct llm_kv *kv, int layer,
                                      const struct llm_batch *b, int n_head, int n_kv_head, int d_head,
                                      const float *inv_freq)
{
	LLM_TRY(need_f32("rope", q));
	LLM_TRY(need_f32("kv_store", k));
	struct rope_job j = { q, k, v, n_head, n_kv_head, d_head, b->pos, NULL, inv_freq, kv, layer, b };
	return rope_run(be, &j);
}

/* heads of one KV group that an attention item takes together (at most) */
#define ATTN_GS 4
/* query rows up to which an item reads E4M3 and BF16 blocks in place (each
 * row converts the elements it reads) rather than converting each block to
 * f32 once */
#define ATTN_DIRECT_ROWS 1

struct attn_job {
	struct llm_view out, q;
	struct llm_kv *kv;
	int layer, n_head, gs, n_seg;
	const struct llm_batch *b;
	const int32_t *seg;    /* (n_seg + 1) the runs of rows: first tokens, then n_tok */
	struct cpu_be *c;
	uint16_t *xb;          /* chain_out's bf16 copy of out, or NULL */
	struct llm_attn_opts o;   /* the divisor of the scores, their softcap, the window */
};

/* The first key position that a query at position POS sees under a window W (0: none) */
static int32_t win_lo(int W, int32_t pos)
{
	return W && pos - W + 1 > 0 ? pos - W + 1 : 0;
}

/* Ask for one block's rows of a KV group (ROWS rows STRIDE bytes apart, BYTES
 * each from P) to come into L2. The cache is far larger than L3 and its
 * blocks lie anywhere, so the hardware prefetcher sees only short runs: a
 * batched decode step waits on DRAM latency unless the next block is asked
 * for while this one is used. */
static void kv_prefetch(const char *p, size_t stride, int rows, size_t bytes)
{
	for (int r = 0; r < rows; r++, p += stride)
		for (size_t o = 0; o < bytes; o += 64)
			__builtin_prefetch(p + o, 0, 2);
}

/* Where LAYER's block B of ARR (kv->k or kv->v) has KV head KH's first
 * row, from its column COL; the head's rows follow d_head elements apart. */
static const char *kv_slice(const struct llm_kv *kv, const void *arr, int layer, int32_t b, int kh, int col)
{
	return (const char *)arr + (((((size_t)layer * (size_t)kv->n_block + (size_t)b) * (size_t)kv->n_kv_head
	                              + (size_t)kh) * (size_t)kv->block_size) * (size_t)kv->d_head + (size_t)col)
	                           * kv->elt;
}

/* LAYER's block B: where the E4M3 scale of KV head KH's first row is (the
 * head's rows' scales follow, one apart). */
static const float *kv_scales(const struct llm_kv *kv, const float *arr, int layer, int32_t b, int kh)
{
	return arr + (((size_t)layer * (size_t)kv->n_block + (size_t)b) * (size_t)kv->n_kv_head + (size_t)kh)
	             * (size_t)kv->block_size;
}

/* Rows [p0, pe] of one block of a KV group as the helpers take them: in
 * place (F32; BF16, and E4M3 with its scales, when DIRECT) or, for E4M3 and
 * BF16, decoded to f32 into BUF (block_size, d): exactly (BF16 widens; see
 * llm_cpu_e4m3_rows for E4M3), so the scores and sums are the same bits
 * either way, and a run of rows converts each element once instead of once
 * a row. */
struct kv_rows { const void *p; enum llm_dtype dt; int64_t stride; const float *sc; size_t scs; };

static struct kv_rows kv_rows_of(const struct llm_kv *kv, enum llm_cpu_isa isa, const void *arr,
                                 const float *sarr, int layer, int32_t b, int kh, int n, float *buf, bool direct)
{
	const char *p = kv_slice(kv, arr, layer, b, kh, 0);
	if (kv->dtype == LLM_DTYPE_BF16 && !direct) {
		llm_cpu_bf16_rows(isa, buf, (const uint16_t *)p, (size_t)n * (size_t)kv->d_head);
		return (struct kv_rows){ buf, LLM_DTYPE_F32, kv->d_head, NULL, 0 };
	}
	if (kv->dtype != LLM_DTYPE_E4M3)
		return (struct kv_rows){ p, kv->dtype, kv->d_head, NULL, 0 };
	const float *sc = kv_scales(kv, sarr, layer, b, kh);
	if (direct)
		return (struct kv_rows){ p, LLM_DTYPE_E4M3, kv->d_head, sc, 1 };
	llm_cpu_e4m3_rows(isa, buf, (const uint8_t *)p, (size_t)kv->d_head, sc, 1, n, kv->d_head);
	return (struct kv_rows){ buf, LLM_DTYPE_F32, kv->d_head, NULL, 0 };
}

/* R from its row N on */
static struct kv_rows kv_rows_skip(struct kv_rows r, int n)
{
	r.p = (const char *)r.p + (size_t)n * (size_t)r.stride * llm_dtype_size(r.dt);
	if (r.sc)
		r.sc += (size_t)n * r.scs;
	return r;
}

/* One item: a run of query rows (consecutive tokens of one sequence at
 * consecutive positions, a prefill chunk or a part of it) and GS heads of
 * one KV group. Each cached key and value block is read once for all of
 * them and used for every row that sees it, while it is in L1. An E4M3
 * block is decoded to f32 once (llm_cpu_e4m3_rows) for a run of rows; a
 * single row (decode) has the helpers read the codes in place, which gives
 * the same bits without writing and reading the f32 copy (decode attention
 * at depth 4096, E4M3 KV, 1 thread: 36 -> 28 ms a token in 30 layers).
 * Per row and head the numerics
 * are those of one head of one token alone, whatever the run: its scores
 * (each position's bits are its own), softmax (llm_cpu_softmax) over its
 * positions 0..pos, the weighted sum block by block in position order into
 * its own output; so the bits do not depend on which rows share an item.
 * While the scores of block i run, the keys of block i+1 and the values of
 * block i are prefetched, so the weighted sum finds its values in cache. */
static void attn_task(void *ctx, int ith, int nth)
{
	struct attn_job *j = ctx;
	struct llm_kv *kv = j->kv;
	int d = kv->d_head, group = j->n_head / kv->n_kv_head, gs = j->gs, per_seg = j->n_head / gs;
	int64_t b, e;
	split((int64_t)j->n_seg * per_seg, ith, nth, 1, &b, &e);
	size_t as = (size_t)kv->max_ctx;               /* one head's scores */
	float *att = j->c->scratch + (size_t)ith * j->c->scratch_per;   /* (rows, gs, max_ctx) */
	float *kf = att + (size_t)j->c->attn_rows * ATTN_GS * as;       /* (block_size, d) an E4M3 block as f32 */
	float *rf = kf + (size_t)kv->block_size * (size_t)d;            /* (d) a bf16 row as f32 */
	float scale = j->o.div, cap = j->o.softcap;
	int W = j->o.window;
	enum llm_cpu_isa isa = j->c->isa;
	for (int64_t it = b; it < e; it++) {
		int sg = (int)(it / per_seg), h0 = (int)(it % per_seg) * gs, kh = h0 / group;
		int t0 = j->seg[sg], nr = j->seg[sg + 1] - t0;
		int seq = j->b->seq[t0];
		int32_t pos0 = j->b->pos[t0], pos = pos0 + nr - 1;   /* row r is at pos0 + r */
		bool direct = nr <= ATTN_DIRECT_ROWS && llm_cpu_attn_reads(isa, kv->dtype, d);
		const int32_t *blk = kv->seq[seq].blk;
		int bs = kv->block_size;
		/* the blocks from the one holding the first row's first visible key
		 * (block 0 without a window); row r reads from win_lo(W, pos0 + r) */
		int32_t bi0 = win_lo(W, pos0) / bs, pb = bi0 * bs;
		size_t lstride = (size_t)d * kv->elt, lbytes = lstride;
		kv_prefetch(kv_slice(kv, kv->k, j->layer, blk[bi0], kh, 0), lstride, pos - pb + 1 < bs ? pos - pb + 1 : bs,
		            lbytes);
		/* positions a block at a time: one table lookup per block */
		for (int32_t p0 = pb, bi = bi0; p0 <= pos; p0 += bs, bi++) {
			int32_t pe = p0 + bs - 1 < pos ? p0 + bs - 1 : pos;
			if (pe < pos)
				kv_prefetch(kv_slice(kv, kv->k, j->layer, blk[bi + 1], kh, 0), lstride,
				            pos - pe < bs ? pos - pe : bs, lbytes);
			kv_prefetch(kv_slice(kv, kv->v, j->layer, blk[bi], kh, 0), lstride, pe - p0 + 1, lbytes);
			struct kv_rows kr = kv_rows_of(kv, isa, kv->k, kv->ks, j->layer, blk[bi], kh, pe - p0 + 1, kf, direct);
			for (int r = p0 > pos0 ? p0 - pos0 : 0; r < nr; r++) {
				const float *q = row(j->q, t0 + r) + (size_t)h0 * (size_t)d;
				float *ar = att + (size_t)r * ATTN_GS * as;
				int32_t pr = pos0 + r, pl = pe < pr ? pe : pr, lo = win_lo(W, pr), ps = p0 > lo ? p0 : lo;
				if (ps > pl)
					continue;
				struct kv_rows ks = kv_rows_skip(kr, ps - p0);
				if (llm_cpu_attn_scores(isa, ar + ps, as, q, gs, ks.p, ks.dt, ks.stride, ks.sc, ks.scs,
				                        pl - ps + 1, d, scale))
					continue;
				for (int32_t p = ps; p <= pl; p++) {
					const void *rp = (const char *)kr.p + (size_t)(p - p0) * (size_t)kr.stride * llm_dtype_size(kr.dt);
					const float *kp = rp;
					if (kr.dt != LLM_DTYPE_F32) {
						llm_to_f32(rf, rp, LLM_DTYPE_BF16, (size_t)d);
						kp = rf;
					}
					for (int h = 0; h < gs; h++)
						ar[(size_t)h * as + (size_t)p] = llm_cpu_dot(isa, q + (size_t)h * (size_t)d, kp, d) / scale;
				}
			}
		}
		for (int r = 0; r < nr; r++) {
			float *o = row(j->out, t0 + r) + (size_t)h0 * (size_t)d;
			int32_t pr = pos0 + r, lo = win_lo(W, pr);
			for (int h = 0; h < gs; h++) {
				float *ah = att + ((size_t)r * ATTN_GS + (size_t)h) * as;
				if (cap > 0)
					for (int32_t p = lo; p <= pr; p++)
						ah[p] = tanhf(ah[p] / cap) * cap;
				llm_cpu_softmax(isa, ah + lo, (int64_t)(pr - lo) + 1);
			}
			for (int i = 0; i < gs * d; i++)
				o[i] = 0.0f;
		}
		for (int32_t p0 = pb, bi = bi0; p0 <= pos; p0 += bs, bi++) {
			int32_t pe = p0 + bs - 1 < pos ? p0 + bs - 1 : pos;
			struct kv_rows vr = kv_rows_of(kv, isa, kv->v, kv->vs, j->layer, blk[bi], kh, pe - p0 + 1, kf, direct);
			for (int r = p0 > pos0 ? p0 - pos0 : 0; r < nr; r++) {
				float *o = row(j->out, t0 + r) + (size_t)h0 * (size_t)d;
				const float *ar = att + (size_t)r * ATTN_GS * as;
				int32_t pr = pos0 + r, pl = pe < pr ? pe : pr, lo = win_lo(W, pr), ps = p0 > lo ? p0 : lo;
				if (ps > pl)
					continue;
				struct kv_rows vs = kv_rows_skip(vr, ps - p0);
				if (llm_cpu_attn_wsum(isa, o, gs, ar + ps, as, vs.p, vs.dt, vs.stride, vs.sc, vs.scs,
				                      pl - ps + 1, d, 0, d))
					continue;
				for (int32_t p = ps; p <= pl; p++) {
					const void *rp = (const char *)vr.p + (size_t)(p - p0) * (size_t)vr.stride * llm_dtype_size(vr.dt);
					const float *vp = rp;
					if (vr.dt != LLM_DTYPE_F32) {
						llm_to_f32(rf, rp, LLM_DTYPE_BF16, (size_t)d);
						vp = rf;
					}
					for (int h = 0; h < gs; h++) {
						float a = ar[(size_t)h * as + (size_t)p], *oh = o + (size_t)h * (size_t)d;
						for (int i = 0; i < d; i++)
							oh[i] += a * vp[i];
					}
				}
			}
		}
		for (int r = 0; r < nr; r++)
			chain_row(j->xb, j->out, t0 + r, (int64_t)h0 * d, (int64_t)(h0 + gs) * d);
	}
}

/* ---- decode rows across positions ----------------------------------------
 * When every row of a step is a decode row (one token of its sequence) and
 * the items of attn_task (a sequence and a KV group's heads) are fewer than
 * the threads (one sequence with 1 KV group on 2 threads, or 2 groups on 3),
 * the same attention runs as three jobs that split it finer: the scores of
 * (row, heads, a run of blocks), the softmax of (row, head), the weighted
 * sum of (row, heads, a run of columns). Every
 * score, softmax and output column comes from the same helper calls on the
 * same data in the same order as in attn_task (the rows read in place, the
 * scores one max_ctx run per row and head in the chunks' scratch), so the
 * bits are the same; only which thread computes what changes. */
struct attn_split {
	struct attn_job *j;
	float *sc;             /* (n_seg, n_head, max_ctx) scores, then weights */
	int n_run, n_col, col; /* runs of blocks and of columns an item takes; COL columns a run */
};

/* Row SG's sequence, position and first head/KV head of head chunk CI. */
static void split_item(const struct attn_split *x, int sg, int ci, int *seq, int32_t *pos, int *h0, int *kh)
{
	const struct attn_job *j = x->j;
	int t0 = j->seg[sg];
	*seq = j->b->seq[t0];
	*pos = j->b->pos[t0];
	*h0 = ci * j->gs;
	*kh = *h0 / (j->n_head / j->kv->n_kv_head);
}

static void split_scores_task(void *ctx, int ith, int nth)
{
	struct attn_split *x = ctx;
	struct attn_job *j = x->j;
	struct llm_kv *kv = j->kv;
	int d = kv->d_head, bs = kv->block_size, per_seg = j->n_head / j->gs;
	size_t as = (size_t)kv->max_ctx, lstride = (size_t)d * kv->elt, lbytes = lstride;
	float scale = j->o.div;
	int64_t b, e;
	split((int64_t)j->n_seg * per_seg * x->n_run, ith, nth, 1, &b, &e);
	for (int64_t it = b; it < e; it++) {
		int sg = (int)(it / ((int64_t)per_seg * x->n_run)), ci = (int)(it / x->n_run % per_seg), ri = (int)(it % x->n_run);
		int seq, h0, kh;
		int32_t pos;
		split_item(x, sg, ci, &seq, &pos, &h0, &kh);
		int nb = pos / bs + 1, b0 = (int)((int64_t)nb * ri / x->n_run), b1 = (int)((int64_t)nb * (ri + 1) / x->n_run);
		const int32_t *blk = kv->seq[seq].blk;
		const float *q = row(j->q, j->seg[sg]) + (size_t)h0 * (size_t)d;
		float *ar = x->sc + ((size_t)sg * (size_t)j->n_head + (size_t)h0) * as;
		if (b0 < b1)
			kv_prefetch(kv_slice(kv, kv->k, j->layer, blk[b0], kh, 0), lstride, bs, lbytes);
		for (int bi = b0; bi < b1; bi++) {
			int32_t p0 = bi * bs, pe = p0 + bs - 1 < pos ? p0 + bs - 1 : pos;
			if (bi + 1 < b1)
				kv_prefetch(kv_slice(kv, kv->k, j->layer, blk[bi + 1], kh, 0), lstride, bs, lbytes);
			struct kv_rows kr = kv_rows_of(kv, j->c->isa, kv->k, kv->ks, j->layer, blk[bi], kh, pe - p0 + 1, NULL, true);
			llm_cpu_attn_scores(j->c->isa, ar + p0, as, q, j->gs, kr.p, kr.dt, kr.stride, kr.sc, kr.scs,
			                    pe - p0 + 1, d, scale);
		}
	}
}

static void split_softmax_task(void *ctx, int ith, int nth)
{
	struct attn_split *x = ctx;
	struct attn_job *j = x->j;
	int64_t b, e;
	split((int64_t)j->n_seg * j->n_head, ith, nth, 1, &b, &e);
	for (int64_t it = b; it < e; it++)
		llm_cpu_softmax(j->c->isa, x->sc + (size_t)it * (size_t)j->kv->max_ctx,
		                (int64_t)j->b->pos[j->seg[it / j->n_head]] + 1);
}

static void split_wsum_task(void *ctx, int ith, int nth)
{
	struct attn_split *x = ctx;
	struct attn_job *j = x->j;
	struct llm_kv *kv = j->kv;
	int d = kv->d_head, bs = kv->block_size, gs = j->gs, per_seg = j->n_head / gs;
	size_t as = (size_t)kv->max_ctx, lstride = (size_t)d * kv->elt;
	int64_t b, e;
	split((int64_t)j->n_seg * per_seg * x->n_col, ith, nth, 1, &b, &e);
	for (int64_t it = b; it < e; it++) {
		int sg = (int)(it / ((int64_t)per_seg * x->n_col)), ci = (int)(it / x->n_col % per_seg), wi = (int)(it % x->n_col);
		int c0 = wi * x->col, c1 = c0 + x->col < d ? c0 + x->col : d;
		if (c0 >= c1)
			continue;
		int seq, h0, kh;
		int32_t pos;
		split_item(x, sg, ci, &seq, &pos, &h0, &kh);
		int t = j->seg[sg], nb = pos / bs + 1;
		const int32_t *blk = kv->seq[seq].blk;
		const float *ar = x->sc + ((size_t)sg * (size_t)j->n_head + (size_t)h0) * as;
		float *o = row(j->out, t) + (size_t)h0 * (size_t)d;
		size_t lbytes = (size_t)(c1 - c0) * kv->elt;
		for (int h = 0; h < gs; h++)
			memset(o + (size_t)h * (size_t)d + c0, 0, (size_t)(c1 - c0) * sizeof *o);
		kv_prefetch(kv_slice(kv, kv->v, j->layer, blk[0], kh, c0), lstride, bs, lbytes);
		for (int bi = 0; bi < nb; bi++) {
			int32_t p0 = bi * bs, pe = p0 + bs - 1 < pos ? p0 + bs - 1 : pos;
			if (bi + 1 < nb)
				kv_prefetch(kv_slice(kv, kv->v, j->layer, blk[bi + 1], kh, c0), lstride, bs, lbytes);
			struct kv_rows vr = kv_rows_of(kv, j->c->isa, kv->v, kv->vs, j->layer, blk[bi], kh, pe - p0 + 1, NULL, true);
			llm_cpu_attn_wsum(j->c->isa, o, gs, ar + p0, as, vr.p, vr.dt, vr.stride, vr.sc, vr.scs,
			                  pe - p0 + 1, d, c0, c1);
		}
		for (int h = 0; h < gs; h++)
			chain_row(j->xb, j->out, t, (int64_t)(h0 + h) * d + c0, (int64_t)(h0 + h) * d + c1);
	}
}

/* Whether J runs as attn_split (above) and, if so, X set up for it. Every
 * row a decode row, the helpers reading the cache's rows in place (so no
 * item needs a decoding buffer), fewer attn_task items than threads, the
 * scores of all rows in the scratch. Runs of blocks: about 4 items a
 * thread; runs of columns: 2 a thread, whole groups of 8 (AVX2's unit).
 * As many items as threads or more run as attn_task even when one thread
 * takes two (SmolLM2, one sequence, 2 threads: 3 items): on a Zen 5 the
 * split's three jobs (the scores written by one core and read by the
 * other, two more hand-offs a layer) cost more than that imbalance, BF16
 * and FP8 weights, depth 1024 and 4096: 15 of 16 alternating pairs faster
 * without the split, by 13-40% (bench/results/attn-split-zen5-2026-11-27). */
static bool split_plan(struct attn_job *j, int nt, struct attn_split *x)
{
	struct cpu_be *c = j->c;
	struct llm_kv *kv = j->kv;
	int base = j->n_seg * (j->n_head / j->gs), d = kv->d_head;
	if (nt < 2 || base >= nt || !llm_cpu_attn_reads(c->isa, kv->dtype, d) || d % 8
	    || j->o.window || j->o.softcap > 0
	    || (size_t)j->n_seg * (size_t)j->n_head * (size_t)kv->max_ctx
	       > (size_t)(CHUNKS_PER_THREAD * nt) * c->scratch_per)
		return false;
	for (int sg = 0; sg < j->n_seg; sg++)
		if (j->seg[sg + 1] - j->seg[sg] != 1)
			return false;
	x->j = j;
	x->sc = c->scratch;
	x->n_run = (4 * nt + base - 1) / base;
	x->n_col = (2 * nt + base - 1) / base;
	x->n_col = x->n_col > d / 8 ? d / 8 : x->n_col;
	x->col = (d / 8 + x->n_col - 1) / x->n_col * 8;
	return true;
}

/* Runs of rows into c->seg: consecutive tokens of one sequence, at most
 * c->attn_rows, and short enough to leave 2 items a chunk (PER_SEG items
 * a run); returns how many. */
static int attn_segs(struct cpu_be *c, const struct llm_batch *b, int per_seg, int n_chunk)
{
	int64_t cap = (int64_t)b->n_tok * per_seg / (2 * (int64_t)n_chunk);
	int max_rows = cap < 1 ? 1 : cap < c->attn_rows ? (int)cap : c->attn_rows, n_seg = 0;
	for (int t = 0; t < b->n_tok; t++)
		if (t == 0 || b->seq[t] != b->seq[t - 1] || b->pos[t] != b->pos[t - 1] + 1
		    || t - c->seg[n_seg - 1] >= max_rows)
			c->seg[n_seg++] = t;
	c->seg[n_seg] = b->n_tok;
	return n_seg;
}

/* The scores of every chunk's rows: ATTN_SCORES floats (64 MiB) at most
 * in all, so query rows per item up to ATTN_ROWS_MAX, fewer for a long
 * context or many threads (2 threads, 4 heads a group: 16 rows at 32K
 * positions, 4 at 128K), never fewer than 1. */
#define ATTN_SCORES ((size_t)1 << 24)
#define ATTN_ROWS_MAX 32

static enum llm_status cpu_attention_ex(struct llm_backend *be, struct llm_view out, struct llm_view q,
                                        struct llm_kv *kv, int layer, const struct llm_batch *b,
                                        int n_head, const struct llm_attn_opts *o)
{
	struct cpu_be *c = cpu(be);
	LLM_TRY(need_f32("attention", q));
	size_t row_sc = (size_t)ATTN_GS * (size_t)kv->max_ctx * (size_t)(CHUNKS_PER_THREAD * llm_pool_threads(c->pool));
	int rows = (int)(ATTN_SCORES / row_sc < ATTN_ROWS_MAX ? ATTN_SCORES / row_sc : ATTN_ROWS_MAX);
	rows = rows < 1 ? 1 : rows;
	size_t per = (size_t)rows * ATTN_GS * (size_t)kv->max_ctx + (size_t)(kv->block_size + 1) * (size_t)kv->d_head;
	per = (per + 15) / 16 * 16;
	if (c->scratch_per < per || c->attn_rows != rows) {   /* first use with this cache: sized once */
		float *s = malloc((size_t)(CHUNKS_PER_THREAD * llm_pool_threads(c->pool)) * per * sizeof(float));   /* per chunk */
		if (!s)
			return llm_fail(LLM_ERR_NOMEM, "attention: scratch of %zu floats", per);
		free(c->scratch);
		c->scratch = s;
		c->scratch_per = per;
		c->attn_rows = rows;
	}
	if (c->seg_cap < (size_t)b->n_tok + 1) {       /* grows to the largest batch, then stays */
		int32_t *sg = realloc(c->seg, ((size_t)b->n_tok + 1) * sizeof *sg);
		if (!sg)
			return llm_fail(LLM_ERR_NOMEM, "attention: %d rows", b->n_tok);
		c->seg = sg;
		c->seg_cap = (size_t)b->n_tok + 1;
	}
	double work = 0;
	for (int i = 0; i < b->n_tok; i++)
		work += (double)(b->pos[i] + 1 - win_lo(o->window, b->pos[i]));
	work *= 2.0 * n_head * kv->d_head;
	int n_chunk = nth_for(be, work);
	/* heads of a KV group together (the largest divisor of the group up to
	 * ATTN_GS), so a group's keys and values are read (and E4M3 decoded)
	 * once for all of them; when the items leave threads idle, decode rows
	 * split across positions (attn_split), other steps one head an item.
	 * Measured (decode at depth 1024-16384, 2 threads, E4M3 KV, 3 groups of
	 * 3 heads): the 3 items took 40-60% of the time of 9 single-head ones,
	 * which read each group three times. */
	int group = n_head / kv->n_kv_head, gs = 1, nt = llm_pool_threads(c->pool);
	for (int g = ATTN_GS; g > 1; g--)
		if (group % g == 0) {
			gs = g;
			break;
		}
	struct attn_job j = { out, q, kv, layer, n_head, gs, attn_segs(c, b, n_head / gs, n_chunk), b, c->seg, c,
	                      chain_out(c, out), *o };
	struct attn_split x;
	if (n_chunk > 1 && split_plan(&j, nt, &x)) {
		int per_seg = n_head / gs;
		llm_pool_run(c->pool, j.n_seg * per_seg * x.n_run, split_scores_task, &x);
		llm_pool_run(c->pool, j.n_seg * n_head, split_softmax_task, &x);
		llm_pool_run(c->pool, j.n_seg * per_seg * x.n_col, split_wsum_task, &x);
	} else {
		if (gs > 1 && (int64_t)b->n_tok * (n_head / gs) < nt) {
			j.gs = 1;
			j.n_seg = attn_segs(c, b, n_head, n_chunk);
		}
		llm_pool_run(c->pool, n_chunk, attn_task, &j);
	}
	chain_made(c, j.xb, out);
	return LLM_OK;
}

static enum llm_status cpu_attention(struct llm_backend *be, struct llm_view out, struct llm_view q,
                                     struct llm_kv *kv, int layer, const struct llm_batch *b,
                                     int n_head)
{
	struct llm_attn_opts o = { sqrtf((float)kv->d_head), 0.0f, 0 };
	return cpu_attention_ex(be, out, q, kv, layer, b, n_head, &o);
}

/* The gated MLP's activation, out = act(gate) * up: SwiGLU (silu, SIMD)
 * or GeGLU (gelu_tanh in f32, tanhf) */
struct glu_job { struct llm_view out, gate, up; enum llm_cpu_isa isa; uint16_t *xb; int gelu; };

static void glu_task(void *ctx, int ith, int nth)
{
	struct glu_job *j = ctx;
	int64_t b, e, n = j->gate.cols;
	split(j->gate.rows * n, ith, nth, 16, &b, &e);
	for (int64_t k = b; k < e; ) {
		int64_t t = k / n, i0 = k % n, i1 = n < i0 + (e - k) ? n : i0 + (e - k);
		float *o = row(j->out, t);
		const float *g = row(j->gate, t), *u = row(j->up, t);
		if (!j->gelu)
			llm_cpu_silu_mul(j->isa, o + i0, g + i0, u + i0, i1 - i0);
		else
			for (int64_t i = i0; i < i1; i++) {
				float x = g[i];
				o[i] = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))) * u[i];
			}
		chain_row(j->xb, j->out, t, i0, i1);
		k += i1 - i0;
	}
}

/* COST: multiply-adds an element (an exp costs about what 16 do, a tanh 32) */
static enum llm_status cpu_glu(struct llm_backend *be, const char *what, int gelu, double cost,
                               struct llm_view out, struct llm_view gate, struct llm_view up)
{
	LLM_TRY(need_f32(what, gate));
	struct glu_job j = { out, gate, up, cpu(be)->isa, chain_out(cpu(be), out), gelu };
	llm_pool_run(cpu(be)->pool, nth_for(be, cost * (double)gate.rows * (double)gate.cols), glu_task, &j);
	chain_made(cpu(be), j.xb, out);
	return LLM_OK;
}

static enum llm_status cpu_swiglu(struct llm_backend *be, struct llm_view out,
                                  struct llm_view gate, struct llm_view up)
{
	return cpu_glu(be, "swiglu", 0, 16.0, out, gate, up);
}

static enum llm_status cpu_geglu(struct llm_backend *be, struct llm_view out,
                                 struct llm_view gate, struct llm_view up)
{
	return cpu_glu(be, "geglu", 1, 32.0, out, gate, up);
}

/* The elementwise ops below write in place: a bf16 copy the chain made of
 * X (chain_made) no longer holds it, so it is dropped. */
static enum llm_status cpu_add_bias(struct llm_backend *be, struct llm_view x, const struct llm_weight *w)
{
	LLM_TRY(need_f32("add_bias", x));
	if (w->dtype != LLM_DTYPE_F32 || w->cols != x.cols)
		return llm_fail(LLM_ERR_UNSUPPORTED, "add_bias: tensor '%s' is not an F32 vector of %lld",
		                w->name, (long long)x.cols);
	cpu(be)->xbf_of.data = NULL;
	const float *bv = w->data;
	for (int64_t t = 0; t < x.rows; t++) {
		float *r = row(x, t);
		for (int64_t i = 0; i < x.cols; i++)
			r[i] += bv[i];
	}
	return LLM_OK;
}

static enum llm_status cpu_scale(struct llm_backend *be, struct llm_view x, float s)
{
	LLM_TRY(need_f32("scale", x));
	cpu(be)->xbf_of.data = NULL;
	for (int64_t t = 0; t < x.rows; t++) {
		float *r = row(x, t);
		for (int64_t i = 0; i < x.cols; i++)
			r[i] *= s;
	}
	return LLM_OK;
}

static enum llm_status cpu_softcap(struct llm_backend *be, struct llm_view x, float cap)
{
	LLM_TRY(need_f32("softcap", x));
	cpu(be)->xbf_of.data = NULL;
	for (int64_t t = 0; t < x.rows; t++) {
		float *r = row(x, t);
		for (int64_t i = 0; i < x.cols; i++)
			r[i] = tanhf(r[i] / cap) * cap;
	}
	return LLM_OK;
}

static enum llm_status cpu_add(struct llm_backend *be, struct llm_view x, struct llm_view y)
{
	(void)be;
	LLM_TRY(need_f32("add", x));
	for (int64_t t = 0; t < x.rows; t++)
		add_row(x, y, t);
	return LLM_OK;
}

static enum llm_status cpu_gather(struct llm_backend *be, struct llm_view out, struct llm_view x,
                                  const int32_t *idx)
{
	(void)be;
	for (int64_t i = 0; i < out.rows; i++)
		memmove(row(out, i), row(x, idx[i]), (size_t)x.cols * sizeof(float));
	return LLM_OK;
}

/* ---- lifecycle --------------------------------------------------------- */

static enum llm_status cpu_init(struct llm_backend *be, const struct llm_backend_opts *o)
{
	struct cpu_be *c = calloc(1, sizeof *c);
	if (!c)
		return llm_fail(LLM_ERR_NOMEM, "cpu backend: out of memory");
	enum llm_cpu_isa best = llm_cpu_isa_detect(), isa = o->isa;
	llm_cpu_matmul_vbmi(-1);   /* decided here, before the pool's threads read it */
	if (isa == LLM_ISA_AUTO) {
		const char *env = getenv("LLM_CPU_ISA");
		isa = best;
		if (env && *env) {
			int v = llm_cpu_isa_parse(env);
			if (v == -2) {
				free(c);
				return llm_fail(LLM_ERR_USAGE, "LLM_CPU_ISA: unknown level '%s' "
				                "(auto, scalar, avx2, avx512, avx512bf16)", env);
			}
			if (v != LLM_ISA_AUTO)
				isa = (enum llm_cpu_isa)v;
		}
	}
	if (isa > best) {
		free(c);
		return llm_fail(LLM_ERR_UNSUPPORTED, "cpu backend: this CPU does not support %s (best: %s)",
		                llm_cpu_isa_name(isa), llm_cpu_isa_name(best));
	}
	c->isa = isa;
	int n = o->n_threads;
	if (n <= 0) {
		long k = sysconf(_SC_NPROCESSORS_ONLN);
		n = k > 0 ? (int)k : 1;
	}
	if (n > 256)
		n = 256;
	be->priv = c;
	enum llm_status s = llm_pool_open(&c->pool, n);
	if (s) {
		free(c);
		be->priv = NULL;
		return s;
	}
	be->n_threads = n;
	be->isa = isa;
	return LLM_OK;
}

static void cpu_host_for(struct llm_backend *be, int n, void (*fn)(void *, int, int), void *ctx)
{
	llm_pool_run(cpu(be)->pool, n, fn, ctx);
}

static void cpu_fini(struct llm_backend *be)
{
	struct cpu_be *c = cpu(be);
	if (!c)
		return;
	llm_pool_close(c->pool);
	for (size_t i = 0; i < sizeof c->big / sizeof *c->big; i++)
		if (c->big[i].p)
			munmap(c->big[i].p, c->big[i].n);
	free(c->scratch);
	free(c->seg);
	free(c->xbf);
	free(c->rope_cs);
	free(c->rope_freq);
	free(c);
	be->priv = NULL;
}

const struct llm_backend_ops llm_cpu_ops = {
	.name = "cpu",
	.supports = cpu_supports,
	.init = cpu_init,
	.fini = cpu_fini,
	.alloc = cpu_alloc,
	.release = cpu_release,
	.copy_in = cpu_copy_in,
	.embed = cpu_embed,
	.rmsnorm = cpu_rmsnorm,
	.matmul = cpu_matmul,
	.matmul_n = cpu_matmul_n,
	.rope = cpu_rope,
	.kv_store = cpu_kv_store,
	.attention = cpu_attention,
	.swiglu = cpu_swiglu,
	.add = cpu_add,
	.add_rmsnorm = cpu_add_rmsnorm,
	.rope_store = cpu_rope_store,
	.gather = cpu_gather,
	.chain = cpu_chain,
	.sync = NULL,
	.attention_ex = cpu_attention_ex,
	.add_bias = cpu_add_bias,
	.geglu = cpu_geglu,
	.scale = cpu_scale,
	.softcap = cpu_softcap,
	.host_for = cpu_host_for,
};
