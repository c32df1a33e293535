/* common/engine/comm.c: the communication layer's front (argument checks, byte
 * counters, messages that name the rank), the single-process
 * implementation, and the tensor x pipeline grid. MPI lives in comm_mpi.c
 * (built when the Makefile finds mpicc: -DLLM_MPI). */
#define _GNU_SOURCE
#include "comm.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct llm_comm *g_world;

struct llm_comm *llm_comm_world(void)
{
	return g_world;
}

/* ---- single process: every collective is the identity ------------------ */

static enum llm_status single_split(struct llm_comm *c, int color, int key, struct llm_comm **out)
{
	(void)color, (void)key;
	struct llm_comm *n = calloc(1, sizeof *n);
	if (!n)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	*n = (struct llm_comm){ c->ops, 0, 1, c->world_rank, c->world_size, NULL, { 0 } };
	*out = n;
	return LLM_OK;
}

static enum llm_status single_allreduce(struct llm_comm *c, float *buf, size_t n)
{
	(void)c, (void)buf, (void)n;
	return LLM_OK;
}

static enum llm_status single_argmax(struct llm_comm *c, float *val, int32_t *idx, size_t n)
{
	(void)c, (void)val, (void)idx, (void)n;
	return LLM_OK;
}

static enum llm_status single_allgather(struct llm_comm *c, const void *send, size_t n, void *recv)
{
	(void)c;
	if (n && send != recv)
		memmove(recv, send, n);
	return LLM_OK;
}

static enum llm_status single_allgatherv(struct llm_comm *c, const void *send, size_t n, void *recv,
                                         const size_t *counts)
{
	(void)counts;
	return single_allgather(c, send, n, recv);
}

static enum llm_status single_bcast(struct llm_comm *c, void *buf, size_t n, int root)
{
	(void)c, (void)buf, (void)n, (void)root;
	return LLM_OK;
}

static enum llm_status single_p2p(struct llm_comm *c, void *buf, size_t n, int peer, int tag)
{
	(void)c, (void)buf, (void)n, (void)tag;
	return llm_fail(LLM_ERR_INTERNAL, "point-to-point message to rank %d in a one-rank communicator", peer);
}

static enum llm_status single_send(struct llm_comm *c, const void *buf, size_t n, int dst, int tag)
{
	return single_p2p(c, (void *)buf, n, dst, tag);
}

static enum llm_status single_barrier(struct llm_comm *c)
{
	(void)c;
	return LLM_OK;
}

static void single_abort(struct llm_comm *c, int code)
{
	(void)c;
	exit(code);
}

static void single_free(struct llm_comm *c)
{
	free(c);
}

static enum llm_status single_finalize(struct llm_comm *c)
{
	free(c);
	return LLM_OK;
}

const struct llm_comm_ops llm_comm_single_ops = {
	.name = "single",
	.split = single_split,
	.allreduce_sum_f32 = single_allreduce,
	.argmax_f32 = single_argmax,
	.allgather = single_allgather,
	.allgatherv = single_allgatherv,
	.bcast = single_bcast,
	.send = single_send,
	.recv = single_p2p,
	.barrier = single_barrier,
	.abort = single_abort,
	.free = single_free,
	.finalize = single_finalize,
};

/* ---- the world ---------------------------------------------------------- */

static int env_int(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? (int)strtol(v, NULL, 10) : -1;
}

enum llm_status llm_comm_init(struct llm_comm **world, int *argc, char ***argv)
{
	*world = NULL;
	if (g_world)
		return llm_fail(LLM_ERR_INTERNAL, "llm_comm_init called twice");
	const char *force = getenv("LLM_COMM");
	int size = env_int("OMPI_COMM_WORLD_SIZE");
	if (size < 0)
		size = env_int("PMI_SIZE");
	int launched = size >= 0 || getenv("PMIX_RANK");
	if (force && strcmp(force, "single") && strcmp(force, "mpi"))
		return llm_fail(LLM_ERR_USAGE, "LLM_COMM=%s: not single or mpi", force);
	int want_mpi = force ? !strcmp(force, "mpi") : launched;
	if (want_mpi) {
#ifdef LLM_MPI
		LLM_TRY(llm_comm_mpi_init(world, argc, argv));
		g_world = *world;
		return LLM_OK;
#else
		if (size > 1 || (force && !strcmp(force, "mpi")))
			return llm_fail(LLM_ERR_UNSUPPORTED, "built without MPI support, but launched as one of %d ranks "
			                "(install libopenmpi-dev and rebuild)", size > 1 ? size : 0);
#endif
	}
	(void)argc, (void)argv;
	struct llm_comm *c = calloc(1, sizeof *c);
	if (!c)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	*c = (struct llm_comm){ &llm_comm_single_ops, 0, 1, 0, 1, NULL, { 0 } };
	*world = g_world = c;
	return LLM_OK;
}

void llm_comm_on_lost(void (*fn)(int rank, const char *msg, void *ctx), void *ctx)
{
#ifdef LLM_MPI
	llm_comm_mpi_on_lost(fn, ctx);
#else
	(void)fn, (void)ctx;
#endif
}

enum llm_status llm_comm_finalize(struct llm_comm *world)
{
	if (!world)
		return LLM_OK;
	if (world == g_world)
		g_world = NULL;
	return world->ops->finalize(world);
}

/* ---- the front: checks, counters, rank-naming messages ----------------- */

#define CHECK_PEER(c, peer, what) do { if ((peer) < 0 || (peer) >= (c)->size || (peer) == (c)->rank) \
	return llm_fail(LLM_ERR_INTERNAL, "rank %d of %d: %s rank %d of a %d-rank communicator", \
	                (c)->world_rank, (c)->world_size, (what), (peer), (c)->size); } while (0)

/* Prefix the implementation's message with the rank (once). */
static enum llm_status ranked(const struct llm_comm *c, enum llm_status s)
{
	if (s && strncmp(llm_errmsg(), "rank ", 5))
		return llm_fail_prefix(s, "rank %d of %d", c->world_rank, c->world_size);
	return s;
}

enum llm_status llm_comm_split(struct llm_comm *c, int color, int key, struct llm_comm **out)
{
	*out = NULL;
	if (color < 0)
		return llm_fail(LLM_ERR_INTERNAL, "llm_comm_split: color %d is negative", color);
	return ranked(c, c->ops->split(c, color, key, out));
}

void llm_comm_free(struct llm_comm *c)
{
	if (c && c != g_world)
		c->ops->free(c);
}

enum llm_status llm_comm_allreduce_sum_f32(struct llm_comm *c, float *buf, size_t n)
{
	c->stats.coll += n * sizeof(float);
	c->stats.n_coll++;
	return ranked(c, c->ops->allreduce_sum_f32(c, buf, n));
}

enum llm_status llm_comm_argmax_f32(struct llm_comm *c, float *val, int32_t *idx, size_t n)
{
	c->stats.coll += n * (sizeof(float) + sizeof(int32_t));
	c->stats.n_coll++;
	return ranked(c, c->ops->argmax_f32(c, val, idx, n));
}

enum llm_status llm_comm_allgather(struct llm_comm *c, const void *send, size_t n, void *recv)
{
	c->stats.coll += n;
	c->stats.n_coll++;
	return ranked(c, c->ops->allgather(c, send, n, recv));
}

enum llm_status llm_comm_allgatherv(struct llm_comm *c, const void *send, void *recv, const size_t *counts)
{
	c->stats.coll += counts[c->rank];
	c->stats.n_coll++;
	return ranked(c, c->ops->allgatherv(c, send, counts[c->rank], recv, counts));
}

/* A broadcast through OP (bcast, or bcast_idle), with the checks and counts */
static enum llm_status bcast_with(struct llm_comm *c, void *buf, size_t n, int root,
                                  enum llm_status (*op)(struct llm_comm *, void *, size_t, int))
{
	if (root < 0 || root >= c->size)
		return llm_fail(LLM_ERR_INTERNAL, "rank %d of %d: broadcast from rank %d of a %d-rank communicator",
		                c->world_rank, c->world_size, root, c->size);
	if (c->rank == root)
		c->stats.coll += n;
	c->stats.n_coll++;
	return ranked(c, op(c, buf, n, root));
}

enum llm_status llm_comm_bcast(struct llm_comm *c, void *buf, size_t n, int root)
{
	return bcast_with(c, buf, n, root, c->ops->bcast);
}

enum llm_status llm_comm_bcast_idle(struct llm_comm *c, void *buf, size_t n, int root)
{
	return bcast_with(c, buf, n, root, c->ops->bcast_idle ? c->ops->bcast_idle : c->ops->bcast);
}

enum llm_status llm_comm_send(struct llm_comm *c, const void *buf, size_t n, int dst, int tag)
{
	CHECK_PEER(c, dst, "send to");
	c->stats.sent += n;
	c->stats.n_send++;
	return ranked(c, c->ops->send(c, buf, n, dst, tag));
}

enum llm_status llm_comm_recv(struct llm_comm *c, void *buf, size_t n, int src, int tag)
{
	CHECK_PEER(c, src, "receive from");
	c->stats.recvd += n;
	c->stats.n_recv++;
	return ranked(c, c->ops->recv(c, buf, n, src, tag));
}

enum llm_status llm_comm_barrier(struct llm_comm *c)
{
	return ranked(c, c->ops->barrier(c));
}

static _Noreturn void vabort(struct llm_comm *c, int code, const char *fmt, va_list ap)
{
	char msg[2048];
	vsnprintf(msg, sizeof msg, fmt, ap);
	if (c)
		fprintf(stderr, "%s: rank %d of %d: %s\n", llm_progname(), c->world_rank, c->world_size, msg);
	else
		fprintf(stderr, "%s: %s\n", llm_progname(), msg);
	fflush(stderr);
	if (c)
		c->ops->abort(c, code);
	exit(code);
}

void llm_comm_abort(struct llm_comm *c, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vabort(c, code, fmt, ap);
}

void llm_comm_die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vabort(g_world, 1, fmt, ap);
}

/* ---- grid --------------------------------------------------------------- */

enum llm_status llm_grid_init(struct llm_grid *g, struct llm_comm *world, int tp, int pp)
{
	memset(g, 0, sizeof *g);
	if (tp < 1 || pp < 1 || (int64_t)tp * pp != world->size)
		return llm_fail(LLM_ERR_USAGE, "tp %d x pp %d needs %lld ranks, but %d %s launched (mpirun -np %lld)",
		                tp, pp, (long long)tp * pp, world->size, world->size == 1 ? "was" : "were",
		                (long long)tp * pp);
	g->world = world;
	g->n_tp = tp, g->n_pp = pp;
	g->stage = world->rank / tp, g->tp_rank = world->rank % tp;
	enum llm_status s = llm_comm_split(world, g->stage, g->tp_rank, &g->tp);
	if (!s)
		s = llm_comm_split(world, g->tp_rank, g->stage, &g->pp);
	if (s) {
		llm_grid_free(g);
		return s;
	}
	g->prev = g->stage > 0 ? g->stage - 1 : -1;
	g->next = g->stage + 1 < pp ? g->stage + 1 : -1;
	return LLM_OK;
}

void llm_grid_free(struct llm_grid *g)
{
	llm_comm_free(g->tp);
	llm_comm_free(g->pp);
	memset(g, 0, sizeof *g);
}

void llm_comm_slice(int64_t n, int size, int t, int64_t *start, int64_t *len)
{
	int64_t a = n * t / size, b = n * (t + 1) / size;
	*start = a;
	*len = b - a;
}

/* The all-gather of unequal parts with the slices' byte counts (on the
 * stack up to 64 ranks: nothing allocated in a step) */
enum llm_status llm_comm_allgather_slices(struct llm_comm *c, float *x, int64_t n)
{
	size_t stack[64] = { 0 }, *counts = c->size <= 64 ? stack : malloc((size_t)c->size * sizeof *counts);
	if (!counts)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	int64_t a = 0, len;
	for (int r = 0; r < c->size; r++) {
		llm_comm_slice(n, c->size, r, &a, &len);
		counts[r] = (size_t)len * sizeof(float);
	}
	llm_comm_slice(n, c->size, c->rank, &a, &len);
	enum llm_status s = llm_comm_allgatherv(c, x + a, x, counts);
	if (counts != stack)
		free(counts);
	return s;
}

enum llm_status llm_comm_first_failing(struct llm_comm *c, int failed, int *first)
{
	*first = failed ? 0 : -1;
	if (!c || c->size < 2)
		return LLM_OK;
	float *f = calloc((size_t)c->size, sizeof *f);
	if (!f)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	f[c->rank] = failed ? 1.0f : 0.0f;
	enum llm_status s = llm_comm_allreduce_sum_f32(c, f, (size_t)c->size);
	*first = -1;
	for (int r = c->size - 1; !s && r >= 0; r--)
		if (f[r] > 0)
			*first = r;
	free(f);
	return s;
}
