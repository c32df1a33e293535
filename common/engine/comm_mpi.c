/* common/engine/comm_mpi.c: the communication layer over MPI (OpenMPI from Debian),
 * for CPU ranks. Built only with -DLLM_MPI (the Makefile adds it, with
 * mpicc --showme:compile / --showme:link, when mpicc is found).
 *
 * Errors: communicators return errors (MPI_ERRORS_RETURN) and they become
 * LLM_ERR_COMM messages naming the rank and the MPI call. A rank that exits
 * before llm_comm_finalize runs the exit hook, which names the rank and
 * calls MPI_Abort, so mpirun ends every other rank instead of leaving them
 * blocked in a collective; a rank killed by a signal is reported and the job
 * ended by mpirun itself. Payloads above INT_MAX elements go in chunks. */
#ifdef LLM_MPI
#define _GNU_SOURCE
#include "comm.h"

#include <limits.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_CHUNK ((size_t)1 << 30)

struct mpi_priv {
	MPI_Comm comm;
};

static MPI_Comm comm_of(const struct llm_comm *c)
{
	return ((const struct mpi_priv *)c->priv)->comm;
}

static enum llm_status mpi_err(const struct llm_comm *c, int rc, const char *call)
{
	if (rc == MPI_SUCCESS)
		return LLM_OK;
	char msg[MPI_MAX_ERROR_STRING];
	int len = 0;
	if (MPI_Error_string(rc, msg, &len) != MPI_SUCCESS)
		snprintf(msg, sizeof msg, "error %d", rc);
	return llm_fail(LLM_ERR_COMM, "rank %d of %d: %s: %s", c->world_rank, c->world_size, call, msg);
}

static enum llm_status wrap(struct llm_comm *c, MPI_Comm m, struct llm_comm **out)
{
	struct llm_comm *n = calloc(1, sizeof *n);
	struct mpi_priv *p = calloc(1, sizeof *p);
	if (!n || !p) {
		free(n), free(p);
		MPI_Comm_free(&m);
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	MPI_Comm_set_errhandler(m, MPI_ERRORS_RETURN);
	p->comm = m;
	*n = (struct llm_comm){ &llm_comm_mpi_ops, 0, 0, c ? c->world_rank : 0, c ? c->world_size : 0, p, { 0 } };
	MPI_Comm_rank(m, &n->rank);
	MPI_Comm_size(m, &n->size);
	*out = n;
	return LLM_OK;
}

static enum llm_status mpi_split(struct llm_comm *c, int color, int key, struct llm_comm **out)
{
	MPI_Comm m;
	LLM_TRY(mpi_err(c, MPI_Comm_split(comm_of(c), color, key, &m), "MPI_Comm_split"));
	return wrap(c, m, out);
}

static enum llm_status mpi_allreduce(struct llm_comm *c, float *buf, size_t n)
{
	for (size_t off = 0; off < n; off += MAX_CHUNK) {
		int k = (int)(n - off < MAX_CHUNK ? n - off : MAX_CHUNK);
		LLM_TRY(mpi_err(c, MPI_Allreduce(MPI_IN_PLACE, buf + off, k, MPI_FLOAT, MPI_SUM, comm_of(c)),
		                "MPI_Allreduce"));
	}
	return LLM_OK;
}

/* MPI_MAXLOC on (float, int) pairs: the lowest index wins a tie, as the
 * standard defines it. */
static enum llm_status mpi_argmax(struct llm_comm *c, float *val, int32_t *idx, size_t n)
{
	struct { float v; int i; } *pr = malloc((n ? n : 1) * sizeof *pr);
	if (!pr)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < n; i++)
		pr[i].v = val[i], pr[i].i = idx[i];
	enum llm_status s = n > INT_MAX ? llm_fail(LLM_ERR_RANGE, "argmax over %zu pairs", n) :
	                    mpi_err(c, MPI_Allreduce(MPI_IN_PLACE, pr, (int)n, MPI_FLOAT_INT, MPI_MAXLOC, comm_of(c)),
	                            "MPI_Allreduce(MAXLOC)");
	for (size_t i = 0; !s && i < n; i++)
		val[i] = pr[i].v, idx[i] = pr[i].i;
	free(pr);
	return s;
}

static enum llm_status mpi_allgatherv(struct llm_comm *c, const void *send, size_t n, void *recv,
                                      const size_t *counts)
{
	int *cnt = malloc((size_t)c->size * sizeof *cnt), *disp = malloc((size_t)c->size * sizeof *disp);
	enum llm_status s = LLM_OK;
	size_t at = 0;
	if (!cnt || !disp)
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (int r = 0; !s && r < c->size; r++) {
		if (counts[r] > INT_MAX || at > INT_MAX)
			s = llm_fail(LLM_ERR_RANGE, "rank %d of %d: all-gather of more than %d bytes", c->world_rank,
			             c->world_size, INT_MAX);
		cnt[r] = (int)counts[r];
		disp[r] = (int)at;
		at += counts[r];
	}
	if (!s) {
		/* MPI_IN_PLACE when the caller already put its part in place */
		const void *sb = send == (const char *)recv + disp[c->rank] ? MPI_IN_PLACE : send;
		s = mpi_err(c, MPI_Allgatherv(sb, (int)n, MPI_BYTE, recv, cnt, disp, MPI_BYTE, comm_of(c)), "MPI_Allgatherv");
	}
	free(cnt), free(disp);
	return s;
}

static enum llm_status mpi_allgather(struct llm_comm *c, const void *send, size_t n, void *recv)
{
	if (n > INT_MAX)
		return llm_fail(LLM_ERR_RANGE, "rank %d of %d: all-gather of %zu bytes per rank", c->world_rank,
		                c->world_size, n);
	const void *sb = send == (const char *)recv + (size_t)c->rank * n ? MPI_IN_PLACE : send;
	return mpi_err(c, MPI_Allgather(sb, (int)n, MPI_BYTE, recv, (int)n, MPI_BYTE, comm_of(c)), "MPI_Allgather");
}

static enum llm_status mpi_bcast(struct llm_comm *c, void *buf, size_t n, int root)
{
	for (size_t off = 0; off < n; off += MAX_CHUNK) {
		int k = (int)(n - off < MAX_CHUNK ? n - off : MAX_CHUNK);
		LLM_TRY(mpi_err(c, MPI_Bcast((char *)buf + off, k, MPI_BYTE, root, comm_of(c)), "MPI_Bcast"));
	}
	return LLM_OK;
}

/* A nonblocking broadcast, tested with growing sleeps (spins for the first
 * ~50 us, then naps of up to 1 ms): an idle server's workers sleep instead
 * of spinning inside MPI_Bcast (measured 96% of a core per idle worker). */
static enum llm_status mpi_bcast_idle(struct llm_comm *c, void *buf, size_t n, int root)
{
	for (size_t off = 0; off < n; off += MAX_CHUNK) {
		int k = (int)(n - off < MAX_CHUNK ? n - off : MAX_CHUNK), done = 0;
		MPI_Request rq;
		LLM_TRY(mpi_err(c, MPI_Ibcast((char *)buf + off, k, MPI_BYTE, root, comm_of(c), &rq), "MPI_Ibcast"));
		for (long tries = 0, nap = 16000; ; ) {
			LLM_TRY(mpi_err(c, MPI_Test(&rq, &done, MPI_STATUS_IGNORE), "MPI_Test"));
			if (done)
				break;
			if (++tries < 200)          /* spin first: steps come back to back */
				continue;
			struct timespec ts = { 0, nap };
			nanosleep(&ts, NULL);
			if (nap < 1000000)          /* 16 us, doubling to 1 ms */
				nap *= 2;
		}
	}
	return LLM_OK;
}

static enum llm_status mpi_send(struct llm_comm *c, const void *buf, size_t n, int dst, int tag)
{
	size_t off = 0;
	do {
		int k = (int)(n - off < MAX_CHUNK ? n - off : MAX_CHUNK);
		LLM_TRY(mpi_err(c, MPI_Send((const char *)buf + off, k, MPI_BYTE, dst, tag, comm_of(c)), "MPI_Send"));
		off += (size_t)k;
	} while (off < n);
	return LLM_OK;
}

static enum llm_status mpi_recv(struct llm_comm *c, void *buf, size_t n, int src, int tag)
{
	size_t off = 0;
	do {
		int k = (int)(n - off < MAX_CHUNK ? n - off : MAX_CHUNK), got = 0;
		MPI_Status st;
		LLM_TRY(mpi_err(c, MPI_Recv((char *)buf + off, k, MPI_BYTE, src, tag, comm_of(c), &st), "MPI_Recv"));
		MPI_Get_count(&st, MPI_BYTE, &got);
		if (got != k)
			return llm_fail(LLM_ERR_COMM, "rank %d of %d: expected %d bytes from rank %d (tag %d), got %d",
			                c->world_rank, c->world_size, k, src, tag, got);
		off += (size_t)k;
	} while (off < n);
	return LLM_OK;
}

static enum llm_status mpi_barrier(struct llm_comm *c)
{
	return mpi_err(c, MPI_Barrier(comm_of(c)), "MPI_Barrier");
}

static void mpi_abort(struct llm_comm *c, int code)
{
	(void)c;
	MPI_Abort(MPI_COMM_WORLD, code ? code : 1);
	exit(code ? code : 1);
}

static void mpi_free(struct llm_comm *c)
{
	struct mpi_priv *p = c->priv;
	int fin = 0;
	MPI_Finalized(&fin);
	if (!fin)
		MPI_Comm_free(&p->comm);
	free(p);
	free(c);
}

static int g_rank = -1, g_size = 0;

/* A rank leaving early (llm_die, exit, return from main) takes the job
 * down, naming itself, instead of leaving the others blocked. */
static void exit_hook(void)
{
	int init = 0, fin = 0;
	MPI_Initialized(&init);
	MPI_Finalized(&fin);
	if (!init || fin)
		return;
	fprintf(stderr, "%s: rank %d of %d exited before the job finished; ending all ranks\n", llm_progname(),
	        g_rank, g_size);
	fflush(stderr);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

static enum llm_status mpi_finalize(struct llm_comm *c)
{
	mpi_free(c);
	int rc = MPI_Finalize();
	return rc == MPI_SUCCESS ? LLM_OK : llm_fail(LLM_ERR_COMM, "rank %d of %d: MPI_Finalize failed", g_rank, g_size);
}

enum llm_status llm_comm_mpi_init(struct llm_comm **world, int *argc, char ***argv)
{
	int provided = 0, init = 0;
	MPI_Initialized(&init);
	if (!init && MPI_Init_thread(argc, argv, MPI_THREAD_SERIALIZED, &provided) != MPI_SUCCESS)
		return llm_fail(LLM_ERR_COMM, "MPI_Init_thread failed");
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
	MPI_Comm_size(MPI_COMM_WORLD, &g_size);
	atexit(exit_hook);
	MPI_Comm dup;
	if (MPI_Comm_dup(MPI_COMM_WORLD, &dup) != MPI_SUCCESS)
		return llm_fail(LLM_ERR_COMM, "rank %d of %d: MPI_Comm_dup failed", g_rank, g_size);
	struct llm_comm base = { .world_rank = g_rank, .world_size = g_size };
	return wrap(&base, dup, world);
}

const struct llm_comm_ops llm_comm_mpi_ops = {
	.name = "mpi",
	.split = mpi_split,
	.allreduce_sum_f32 = mpi_allreduce,
	.argmax_f32 = mpi_argmax,
	.allgather = mpi_allgather,
	.allgatherv = mpi_allgatherv,
	.bcast = mpi_bcast,
	.bcast_idle = mpi_bcast_idle,
	.send = mpi_send,
	.recv = mpi_recv,
	.barrier = mpi_barrier,
	.abort = mpi_abort,
	.free = mpi_free,
	.finalize = mpi_finalize,
};
#else
typedef int llm_comm_mpi_not_built;   /* this build has no MPI (no mpicc found) */
#endif
