/* common/base/pool.h: the thread pool the engine's parallel loops run on (the
 * CPU backend's ops and the LoRA trainer).
 *
 * A job is N chunks: fn(ctx, chunk, N) runs once for every chunk < N, on
 * the caller and the pool's threads, and llm_pool_run returns when all are
 * done. Which thread runs a chunk is not fixed (an idle thread takes what
 * is left of a descheduled one's share), so a chunk's result must depend
 * only on (chunk, N): a function that splits its rows by chunk computes
 * the same bits at any thread count and under any scheduling. Two calls of
 * one chunk never overlap, so per-chunk scratch (indexed by chunk) is safe.
 *
 * Waiting: a worker spins briefly between jobs (jobs come back to back
 * inside a forward pass), then sleeps on a condition variable; the caller,
 * once its share is done, spins briefly, then yields the CPU until the
 * others finish. So the pool does not hold cores away from another CPU
 * job when it is idle or contended. */
#ifndef LLM_POOL_H
#define LLM_POOL_H

#include "status.h"

#define LLM_POOL_MAX_CHUNKS 65535   /* chunks of one job, and threads of a pool */

struct llm_pool;

/* Start a pool of N_THREADS threads counting the caller (N_THREADS - 1
 * workers; 1: none, every job runs on the caller). LLM_ERR_USAGE when
 * N_THREADS is not in [1, LLM_POOL_MAX_CHUNKS], LLM_ERR_NOMEM when memory
 * or a thread cannot be had (nothing is left running). */
enum llm_status llm_pool_open(struct llm_pool **p, int n_threads);

/* Threads including the caller. */
int llm_pool_threads(const struct llm_pool *p);

/* Run FN(CTX, i, N_CHUNK) for every i < N_CHUNK (at most
 * LLM_POOL_MAX_CHUNKS); on the calling thread alone when N_CHUNK <= 1 or
 * the pool has one thread. One job at a time: the calls of a pool must
 * come from one thread. */
void llm_pool_run(struct llm_pool *p, int n_chunk, void (*fn)(void *ctx, int chunk, int n_chunk), void *ctx);

/* Stop and join the workers and free P (NULL: nothing). */
void llm_pool_close(struct llm_pool *p);

#endif
