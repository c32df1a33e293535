/* common/engine/comm_mpi.c: the communication layer over MPI (OpenMPI from Debian),
 * for CPU ranks. Built only with -DLLM_MPI (the Makefile adds it, with
 * mpicc --showme:compile / --showme:link, when mpicc is found).
 *
 * Errors: communicators return errors (MPI_ERRORS_RETURN) and they become
 * LLM_ERR_COMM messages naming the rank and the MPI call. A rank that exits
 * before llm_comm_finalize runs the exit hook, which names the rank and
 * calls MPI_Abort, so mpirun ends every other rank instead of leaving them
 * blocked in a collective; a rank killed by a signal is reported and the job
 * ended by mpirun itself. Payloads above INT_MAX elements go in chunks.
 *
 * A lost rank (killed, its node gone) is noticed by the watchdog, not by
 * MPI: Open MPI 4 has no way to report a dead peer to the others (a
 * collective waiting for it waits forever, unless mpirun ends the job,
 * which it does by default). The watchdog is a thread of each rank (with
 * MPI_THREAD_MULTIPLE) that sends every other rank a heartbeat each second
 * on MPI_COMM_WORLD (which nothing else sends on: the ranks' own traffic
 * goes through a duplicate) and listens for theirs; a rank silent for
 * LLM_COMM_TIMEOUT seconds (default 10) is lost: the watchdog names it on
 * stderr and ends this rank with status 1, or hands it to the hook a
 * server set (llm_comm_on_lost). A rank leaving normally says goodbye
 * first (llm_comm_finalize), so it is never taken for lost.
 *
 * Start-up: the watchdog starts as soon as MPI_Init_thread returns, before
 * any collective of this file (it needs none: no communicator of its own),
 * so a rank lost after the others' MPI_Init is named like any other. A
 * rank lost inside MPI_Init leaves the others waiting there, where no MPI
 * call can be made: a plain thread, armed before MPI_Init_thread, ends this
 * rank with status 1 and a line saying so when MPI_Init has not returned
 * within 3 x LLM_COMM_TIMEOUT seconds (at least 30; none when the timeout
 * is 0). */
#ifdef LLM_MPI
#define _GNU_SOURCE
#include "comm.h"
#include "args.h"

#include <errno.h>
#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <unistd.h>
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

static void watchdog_stop(void);

static enum llm_status mpi_finalize(struct llm_comm *c)
{
	watchdog_stop();
	mpi_free(c);
	int rc = MPI_Finalize();
	return rc == MPI_SUCCESS ? LLM_OK : llm_fail(LLM_ERR_COMM, "rank %d of %d: MPI_Finalize failed", g_rank, g_size);
}

/* ---- the watchdog: heartbeats between every pair of ranks -------------- */

enum { HB_ALIVE = 1, HB_BYE = 2, HB_TAG = 7 };

static struct {
	pthread_t th;
	int running;
	atomic_int stop;
	MPI_Comm comm;               /* the world, for heartbeats only */
	double timeout, period;      /* seconds */
	pthread_mutex_t mu;          /* guards on_lost */
	void (*on_lost)(int rank, const char *msg, void *ctx);
	void *ctx;
} g_wd = { .mu = PTHREAD_MUTEX_INITIALIZER };

static const int hb_alive = HB_ALIVE, hb_bye = HB_BYE;

/* Rank LOST fell silent: the hook's, or name it and end this rank. */
static void lost(int rank, double silent)
{
	char msg[300];
	snprintf(msg, sizeof msg, "rank %d of %d: lost rank %d: no heartbeat from it for %.0f s (killed, or its node or "
	         "network gone)", g_rank, g_size, rank, silent);
	pthread_mutex_lock(&g_wd.mu);     /* held through FN: llm_comm_on_lost(NULL) waits for it */
	if (g_wd.on_lost) {
		g_wd.on_lost(rank, msg, g_wd.ctx);
		pthread_mutex_unlock(&g_wd.mu);
		return;
	}
	pthread_mutex_unlock(&g_wd.mu);
	fflush(stdout);            /* what rank 0 has written so far stays written */
	fprintf(stderr, "%s: %s\n", llm_progname(), msg);
	fflush(stderr);
	_exit(1);                  /* not exit: the main thread is inside MPI, waiting for the lost rank */
}

static void nap(double s)
{
	struct timespec ts = { (time_t)s, (long)((s - (double)(time_t)s) * 1e9) };
	nanosleep(&ts, NULL);
}

static void *watchdog(void *arg)
{
	(void)arg;
	int n = g_size;
	double *seen = calloc((size_t)n, sizeof *seen);
	int *in = calloc((size_t)n, sizeof *in), *bye = calloc((size_t)n, sizeof *bye);
	MPI_Request *rr = malloc((size_t)n * sizeof *rr), *sr = malloc((size_t)n * sizeof *sr);
	if (!seen || !in || !bye || !rr || !sr) {
		fprintf(stderr, "%s: rank %d of %d: out of memory for the watchdog; a lost rank is not watched for\n",
		        llm_progname(), g_rank, g_size);
		goto out;
	}
	double now = llm_now(), next = now;
	for (int r = 0; r < n; r++) {
		seen[r] = now;
		rr[r] = sr[r] = MPI_REQUEST_NULL;
		if (r != g_rank)
			MPI_Irecv(&in[r], 1, MPI_INT, r, HB_TAG, g_wd.comm, &rr[r]);
	}
	for (double last = now; !atomic_load(&g_wd.stop); last = now) {
		now = llm_now();
		/* this thread was not run for a while (the job stopped with
		 * SIGSTOP and continued, the machine starved): the others may
		 * have been stopped too, so their silence is counted afresh */
		if (now - last > 2 * g_wd.period)
			for (int r = 0; r < n; r++)
				seen[r] = now;
		for (int r = 0; r < n; r++) {
			int done = 0;
			if (rr[r] == MPI_REQUEST_NULL)
				continue;
			MPI_Test(&rr[r], &done, MPI_STATUS_IGNORE);
			if (!done)
				continue;
			seen[r] = now;
			if (in[r] == HB_BYE)
				bye[r] = 1;       /* rr[r] stays null: it has stopped */
			else
				MPI_Irecv(&in[r], 1, MPI_INT, r, HB_TAG, g_wd.comm, &rr[r]);
		}
		if (now >= next) {
			for (int r = 0; r < n; r++) {
				int done = 1;
				if (r == g_rank)
					continue;
				if (sr[r] != MPI_REQUEST_NULL)
					MPI_Test(&sr[r], &done, MPI_STATUS_IGNORE);
				if (done)          /* one heartbeat in flight per peer at most */
					MPI_Isend(&hb_alive, 1, MPI_INT, r, HB_TAG, g_wd.comm, &sr[r]);
			}
			next = now + g_wd.period;
		}
		for (int r = 0; r < n; r++)
			if (r != g_rank && !bye[r] && now - seen[r] > g_wd.timeout) {
				lost(r, now - seen[r]);
				goto out;    /* the hook's owner ends the process */
			}
		nap(0.05);
	}
	/* stopping: goodbye to every rank still listening, then the receives
	 * cancelled; a send that does not complete within a period is left */
	MPI_Request *br = malloc((size_t)n * sizeof *br);
	for (int r = 0; br && r < n; r++) {
		br[r] = MPI_REQUEST_NULL;
		if (r != g_rank && !bye[r])
			MPI_Isend(&hb_bye, 1, MPI_INT, r, HB_TAG, g_wd.comm, &br[r]);
	}
	for (double end = llm_now() + g_wd.period; ; nap(0.01)) {
		int done = 0;
		if (br)
			MPI_Testall(n, br, &done, MPI_STATUSES_IGNORE);
		if (!br || done || llm_now() > end)
			break;
	}
	for (int r = 0; r < n; r++) {
		if (rr[r] != MPI_REQUEST_NULL) {
			MPI_Cancel(&rr[r]);
			MPI_Request_free(&rr[r]);
		}
		if (sr[r] != MPI_REQUEST_NULL)
			MPI_Request_free(&sr[r]);
		if (br && br[r] != MPI_REQUEST_NULL)
			MPI_Request_free(&br[r]);
	}
	free(br);
out:
	free(seen), free(in), free(bye), free(rr), free(sr);
	return NULL;
}

/* LLM_COMM_TIMEOUT: seconds of silence after which a rank is lost; 0: no
 * watchdog. */
static enum llm_status comm_timeout(int64_t *t)
{
	const char *v = getenv("LLM_COMM_TIMEOUT");
	*t = 10;
	if (v && *v && llm_parse_int(v, 0, 86400, t))
		return llm_fail(LLM_ERR_USAGE, "LLM_COMM_TIMEOUT=%s: not a number of seconds from 0 to 86400", v);
	return LLM_OK;
}

/* Start the watchdog (after MPI_Init_thread; no collective). */
static enum llm_status watchdog_start(int64_t t)
{
	if (t == 0 || g_size < 2)
		return LLM_OK;
	g_wd.timeout = (double)t;
	g_wd.period = t >= 4 ? 1.0 : (double)t / 4;
	g_wd.comm = MPI_COMM_WORLD;
	atomic_store(&g_wd.stop, 0);
	if (pthread_create(&g_wd.th, NULL, watchdog, NULL))
		return llm_fail(LLM_ERR_COMM, "rank %d of %d: cannot start the watchdog thread", g_rank, g_size);
	g_wd.running = 1;
	return LLM_OK;
}

static void watchdog_stop(void)
{
	if (!g_wd.running)
		return;
	atomic_store(&g_wd.stop, 1);
	pthread_join(g_wd.th, NULL);
	g_wd.running = 0;
}

/* ---- the start-up guard: MPI_Init with a bound ------------------------ */

static struct {
	pthread_t th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int done;
	double bound;                /* seconds */
} g_start = { .mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER };

static void *start_guard(void *arg)
{
	(void)arg;
	struct timespec end;
	clock_gettime(CLOCK_REALTIME, &end);
	end.tv_sec += (time_t)g_start.bound;
	pthread_mutex_lock(&g_start.mu);
	while (!g_start.done)
		if (pthread_cond_timedwait(&g_start.cv, &g_start.mu, &end) == ETIMEDOUT && !g_start.done) {
			const char *r = getenv("OMPI_COMM_WORLD_RANK"), *n = getenv("OMPI_COMM_WORLD_SIZE");
			fprintf(stderr, "%s: rank %s of %s: MPI_Init did not return within %.0f s (a rank lost while "
			        "starting, or the launcher stalled); ending this rank\n", llm_progname(), r ? r : "?",
			        n ? n : "?", g_start.bound);
			fflush(stderr);
			_exit(1);          /* the main thread is inside MPI_Init */
		}
	pthread_mutex_unlock(&g_start.mu);
	return NULL;
}

/* MPI_Init_thread, ended by the guard past its bound (T: LLM_COMM_TIMEOUT,
 * 0 for no guard). */
static int init_guarded(int *argc, char ***argv, int64_t t, int *provided)
{
	int guard = 0;
	if (t > 0) {
		g_start.bound = 3.0 * (double)t < 30.0 ? 30.0 : 3.0 * (double)t;
		g_start.done = 0;
		guard = !pthread_create(&g_start.th, NULL, start_guard, NULL);
	}
	int rc = MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, provided);
	if (guard) {
		pthread_mutex_lock(&g_start.mu);
		g_start.done = 1;
		pthread_cond_signal(&g_start.cv);
		pthread_mutex_unlock(&g_start.mu);
		pthread_join(g_start.th, NULL);
	}
	return rc;
}

void llm_comm_mpi_on_lost(void (*fn)(int rank, const char *msg, void *ctx), void *ctx)
{
	pthread_mutex_lock(&g_wd.mu);
	g_wd.on_lost = fn;
	g_wd.ctx = ctx;
	pthread_mutex_unlock(&g_wd.mu);
}

enum llm_status llm_comm_mpi_init(struct llm_comm **world, int *argc, char ***argv)
{
	int provided = 0, init = 0;
	int64_t t;
	LLM_TRY(comm_timeout(&t));
	MPI_Initialized(&init);
	if (!init && init_guarded(argc, argv, t, &provided) != MPI_SUCCESS)
		return llm_fail(LLM_ERR_COMM, "MPI_Init_thread failed");
	MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	/* a write to a lost peer's TCP socket would end this rank by SIGPIPE,
	 * before the watchdog could name the peer: EPIPE instead */
	signal(SIGPIPE, SIG_IGN);
	MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
	MPI_Comm_size(MPI_COMM_WORLD, &g_size);
	atexit(exit_hook);
	/* the watchdog's thread calls MPI beside the main thread: without
	 * MPI_THREAD_MULTIPLE a lost rank is left to the launcher. It runs
	 * before the first collective, so a rank lost from here on is named */
	if (init)
		MPI_Query_thread(&provided);
	if (provided >= MPI_THREAD_MULTIPLE)
		LLM_TRY(watchdog_start(t));
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
