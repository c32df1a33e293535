/* common/base/pool.c: the thread pool (see pool.h).
 *
 * A job is N chunks, fn(ctx, chunk, N), dealt in contiguous parts, one per
 * thread (the caller is thread 0): a thread takes the chunks of its own
 * part in order, front first, then takes what is left of the others' parts
 * from their backs, so a descheduled worker never holds the job up. A
 * chunk covers a fixed range of output rows, computed the same way by any
 * thread: results do not depend on who ran what. A thread's chunks being
 * neighbours, a matmul prefetches the first rows of the next chunk while it
 * finishes one. A part's claim word holds (job generation << 32 | front <<
 * 16 | back), so a worker that wakes late cannot claim a chunk of a newer
 * job with the function and context of an older one. */
#define _GNU_SOURCE
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

struct pool_part { _Alignas(64) _Atomic uint64_t w; };

struct llm_pool {
	int n;                           /* threads including the caller */
	pthread_t *th;
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int n_sleeping;                  /* under mu */
	_Atomic uint32_t gen;            /* bumped once per job */
	struct pool_part *part;          /* (n) gen << 32 | front << 16 | back */
	_Atomic int done;                /* chunks finished */
	_Atomic int stop;
	void (*_Atomic fn)(void *ctx, int chunk, int n_chunk);
	void *_Atomic ctx;
	_Atomic int n_chunk;
};

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* The next chunk of part Q of job G, from its front (FRONT) or its back;
 * -1 when the part is empty or the job is another. */
static int pool_claim(struct llm_pool *p, int q, uint32_t g, int front)
{
	_Atomic uint64_t *w = &p->part[q].w;
	for (;;) {
		uint64_t c = atomic_load(w);
		uint32_t f = (uint32_t)(c >> 16) & 0xffff, b = (uint32_t)c & 0xffff;
		if ((uint32_t)(c >> 32) != g || f >= b)
			return -1;
		uint64_t nc = front ? c + ((uint64_t)1 << 16) : c - 1;
		if (atomic_compare_exchange_weak(w, &c, nc))
			return (int)(front ? f : b - 1);
	}
}

/* Run chunks of job G as thread SELF until none is left: its own part in
 * order, then the others' from their backs. */
static void pool_work(struct llm_pool *p, uint32_t g, int self)
{
	void (*fn)(void *, int, int) = atomic_load(&p->fn);
	void *ctx = atomic_load(&p->ctx);
	int n = atomic_load(&p->n_chunk);
	for (int k = 0; k < p->n; k++) {
		int q = (self + k) % p->n, c;
		while ((c = pool_claim(p, q, g, k == 0)) >= 0) {
			fn(ctx, c, n);
			atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
		}
	}
}

struct worker_arg { struct llm_pool *p; int ith; };

static void *worker_main(void *arg)
{
	struct worker_arg a = *(struct worker_arg *)arg;
	free(arg);
	struct llm_pool *p = a.p;
	uint32_t seen = atomic_load(&p->gen);
	for (;;) {
		/* spin briefly (jobs come back to back inside a forward), then sleep */
		for (int i = 0; i < 2000 && atomic_load_explicit(&p->gen, memory_order_acquire) == seen; i++)
			cpu_relax();
		if (atomic_load_explicit(&p->gen, memory_order_acquire) == seen) {
			pthread_mutex_lock(&p->mu);
			p->n_sleeping++;
			while (atomic_load(&p->gen) == seen && !atomic_load(&p->stop))
				pthread_cond_wait(&p->cv, &p->mu);
			p->n_sleeping--;
			pthread_mutex_unlock(&p->mu);
		}
		if (atomic_load(&p->stop))
			return NULL;
		seen = atomic_load_explicit(&p->gen, memory_order_acquire);
		pool_work(p, seen, a.ith);
	}
}

/* Stop and join the workers (the first N - 1 of them started) and free what
 * pool_init allocated. */
static void pool_stop(struct llm_pool *p)
{
	if (!p->th)
		return;
	pthread_mutex_lock(&p->mu);
	atomic_store(&p->stop, 1);
	atomic_fetch_add(&p->gen, 1);
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	for (int i = 1; i < p->n; i++)
		pthread_join(p->th[i], NULL);
	free(p->th);
	free(p->part);
	pthread_mutex_destroy(&p->mu);
	pthread_cond_destroy(&p->cv);
	p->th = NULL;
}

static enum llm_status pool_init(struct llm_pool *p, int n)
{
	memset(p, 0, sizeof *p);
	p->n = n;
	pthread_mutex_init(&p->mu, NULL);
	pthread_cond_init(&p->cv, NULL);
	p->th = calloc((size_t)n, sizeof *p->th);
	p->part = aligned_alloc(64, (size_t)n * sizeof *p->part);
	if (!p->th || !p->part) {
		free(p->th);
		free(p->part);
		p->th = NULL;
		p->part = NULL;
		return llm_fail(LLM_ERR_NOMEM, "thread pool: out of memory");
	}
	for (int i = 0; i < n; i++)
		atomic_init(&p->part[i].w, 0);
	for (int i = 1; i < n; i++) {
		struct worker_arg *a = malloc(sizeof *a);
		if (a) {
			a->p = p;
			a->ith = i;
		}
		if (!a || pthread_create(&p->th[i], NULL, worker_main, a)) {
			free(a);
			p->n = i;
			pool_stop(p);
			return llm_fail(LLM_ERR_NOMEM, "thread pool: cannot start thread %d", i);
		}
	}
	return LLM_OK;
}

enum llm_status llm_pool_open(struct llm_pool **pp, int n_threads)
{
	*pp = NULL;
	if (n_threads < 1 || n_threads > LLM_POOL_MAX_CHUNKS)
		return llm_fail(LLM_ERR_USAGE, "thread pool: %d threads (1 to %d)", n_threads, LLM_POOL_MAX_CHUNKS);
	struct llm_pool *p = malloc(sizeof *p);
	if (!p)
		return llm_fail(LLM_ERR_NOMEM, "thread pool: out of memory");
	enum llm_status s = pool_init(p, n_threads);
	if (s) {
		free(p);
		return s;
	}
	*pp = p;
	return LLM_OK;
}

int llm_pool_threads(const struct llm_pool *p) { return p->n; }

void llm_pool_close(struct llm_pool *p)
{
	if (!p)
		return;
	pool_stop(p);
	free(p);
}

void llm_pool_run(struct llm_pool *p, int n_chunk, void (*fn)(void *, int, int), void *ctx)
{
	if (n_chunk <= 1 || p->n <= 1) {
		for (int i = 0; i < n_chunk; i++)
			fn(ctx, i, n_chunk);
		return;
	}
	atomic_store(&p->fn, fn);
	atomic_store(&p->ctx, ctx);
	atomic_store(&p->n_chunk, n_chunk);
	atomic_store(&p->done, 0);
	uint32_t g = atomic_load(&p->gen) + 1;
	for (int q = 0; q < p->n; q++) {        /* part q: chunks [q n_chunk / n, (q + 1) n_chunk / n) */
		uint64_t f = (uint64_t)q * (uint64_t)n_chunk / (uint64_t)p->n;
		uint64_t b = (uint64_t)(q + 1) * (uint64_t)n_chunk / (uint64_t)p->n;
		atomic_store(&p->part[q].w, (uint64_t)g << 32 | f << 16 | b);
	}
	atomic_store_explicit(&p->gen, g, memory_order_release);
	pthread_mutex_lock(&p->mu);
	if (p->n_sleeping)
		pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	pool_work(p, g, 0);
	for (int i = 0; atomic_load_explicit(&p->done, memory_order_acquire) < n_chunk; i++) {
		if (i < 4000)
			cpu_relax();
		else
			sched_yield();
	}
}

