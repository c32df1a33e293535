/* common/engine/comm.h: the communication layer of distributed runs: one interface,
 * three implementations (single process, MPI for CPU ranks, NCCL for GPU
 * ranks bootstrapped over MPI: comm_nccl.c), never a home-made transport.
 *
 * Guarantees: every call either completes on every rank of the communicator
 * or the job ends: a rank that fails calls llm_comm_abort (or exits, or
 * crashes) and the whole job comes down with a message naming the rank,
 * never a hang; a rank killed or cut off is ended by the launcher, or
 * else found lost by the others' watchdogs within LLM_COMM_TIMEOUT seconds
 * (llm_comm_on_lost; a rank lost inside MPI_Init ends the others after
 * 3 x LLM_COMM_TIMEOUT seconds, at least 30: comm_mpi.c). Collectives are deterministic: the same inputs give the same
 * bits on every rank (MPI's reductions are in a fixed order for a fixed
 * communicator size). Byte counters per communicator let the engine report
 * what crossed each link (-v).
 *
 * Launch: mpirun -np T*P bin/llm-generate ...; llm_comm_init sees the MPI
 * launcher's environment (OMPI_COMM_WORLD_SIZE, PMI_SIZE, PMIX_RANK) and
 * starts MPI; otherwise, or with LLM_COMM=single, it is a one-rank world.
 * The reference for the semantics is the MPI standard (MPI_Allreduce,
 * MPI_Allgather(v), MPI_Bcast, MPI_Send/Recv, MPI_Comm_split, MPI_Abort). */
#ifndef LLM_COMM_H
#define LLM_COMM_H

#include "status.h"

struct llm_comm;

/* Traffic through one communicator, as seen by this rank. */
struct llm_comm_stats {
	uint64_t sent, recvd;        /* point-to-point payload bytes */
	uint64_t coll;               /* payload bytes this rank handed to collectives */
	uint64_t n_send, n_recv, n_coll;
};

struct llm_comm_ops {
	const char *name;            /* "single", "mpi", "nccl" */
	enum llm_status (*split)(struct llm_comm *c, int color, int key, struct llm_comm **out);
	/* in place, buf (n) f32 summed over the ranks */
	enum llm_status (*allreduce_sum_f32)(struct llm_comm *c, float *buf, size_t n);
	/* in place, (n) pairs (value, index): the largest value, lowest index on ties */
	enum llm_status (*argmax_f32)(struct llm_comm *c, float *val, int32_t *idx, size_t n);
	/* recv (size * n bytes) = the n bytes of every rank in rank order */
	enum llm_status (*allgather)(struct llm_comm *c, const void *send, size_t n, void *recv);
	/* recv = counts[r] bytes of each rank r, in rank order; n = counts[rank] */
	enum llm_status (*allgatherv)(struct llm_comm *c, const void *send, size_t n, void *recv,
	                              const size_t *counts);
	enum llm_status (*bcast)(struct llm_comm *c, void *buf, size_t n, int root);
	/* bcast for a message that may be long in coming (a server's next
	 * step): the receivers wait without holding a core; NULL: bcast */
	enum llm_status (*bcast_idle)(struct llm_comm *c, void *buf, size_t n, int root);
	enum llm_status (*send)(struct llm_comm *c, const void *buf, size_t n, int dst, int tag);
	enum llm_status (*recv)(struct llm_comm *c, void *buf, size_t n, int src, int tag);
	enum llm_status (*barrier)(struct llm_comm *c);
	void (*abort)(struct llm_comm *c, int code);          /* does not return */
	void (*free)(struct llm_comm *c);
	enum llm_status (*finalize)(struct llm_comm *c);     /* world only */
};

struct llm_comm {
	const struct llm_comm_ops *ops;
	int rank, size;              /* in this communicator */
	int world_rank, world_size;  /* of this process in the job */
	void *priv;                  /* the implementation's handle */
	struct llm_comm_stats stats;
};

/* The world: MPI when launched by an MPI launcher (and built with MPI),
 * else a single process. Call once, first thing in main (before threads);
 * ARGC/ARGV may be NULL. Under MPI it registers an exit hook: a rank that
 * exits before llm_comm_finalize (llm_die, exit(1)) aborts the job naming
 * itself, so the other ranks never wait for it. A build without MPI
 * launched with more than one rank fails with LLM_ERR_UNSUPPORTED ("built
 * without MPI support"). */
enum llm_status llm_comm_init(struct llm_comm **world, int *argc, char ***argv);
/* Finalize the world and free it (other communicators first). */
enum llm_status llm_comm_finalize(struct llm_comm *world);
/* The world of this process (NULL before llm_comm_init). */
struct llm_comm *llm_comm_world(void);

/* Ranks with the same COLOR form a new communicator, ordered by KEY.
 * Collective over C. */
enum llm_status llm_comm_split(struct llm_comm *c, int color, int key, struct llm_comm **out);
void llm_comm_free(struct llm_comm *c);

enum llm_status llm_comm_allreduce_sum_f32(struct llm_comm *c, float *buf, size_t n);
enum llm_status llm_comm_argmax_f32(struct llm_comm *c, float *val, int32_t *idx, size_t n);
enum llm_status llm_comm_allgather(struct llm_comm *c, const void *send, size_t n, void *recv);
enum llm_status llm_comm_allgatherv(struct llm_comm *c, const void *send, void *recv, const size_t *counts);
enum llm_status llm_comm_bcast(struct llm_comm *c, void *buf, size_t n, int root);
/* The same, for a message that may be long in coming: a waiting rank polls
 * with sleeps of up to 1 ms instead of spinning. Every rank must call this
 * one (it does not match llm_comm_bcast). */
enum llm_status llm_comm_bcast_idle(struct llm_comm *c, void *buf, size_t n, int root);
/* Blocking point-to-point; TAG >= 0 tells messages of one pair apart. */
enum llm_status llm_comm_send(struct llm_comm *c, const void *buf, size_t n, int dst, int tag);
enum llm_status llm_comm_recv(struct llm_comm *c, void *buf, size_t n, int src, int tag);
enum llm_status llm_comm_barrier(struct llm_comm *c);

/* The pipeline boundary's slices (partition.h, "stage boundary"): of N
 * elements over SIZE ranks, rank T's is [*START, *START + *LEN) =
 * [T*N/SIZE, (T+1)*N/SIZE) (llm_part_range splits the same way). */
void llm_comm_slice(int64_t n, int size, int t, int64_t *start, int64_t *len);
/* The boundary's all-gather, in place: X (N) f32, of which each rank of C
 * holds its own slice; afterwards every rank holds all N. Host memory, or
 * device memory on a NCCL communicator. Collective over C. */
enum llm_status llm_comm_allgather_slices(struct llm_comm *c, float *x, int64_t n);

/* Collective: whether any rank FAILED (nonzero); *FIRST gets the lowest
 * failing rank, or -1 when none did. */
enum llm_status llm_comm_first_failing(struct llm_comm *c, int failed, int *first);

/* A lost rank: a rank that has not been heard from for LLM_COMM_TIMEOUT
 * seconds (default 10; killed, or its node or network gone) while this
 * one runs. Under MPI a watchdog thread of every rank exchanges heartbeats
 * with the others (comm_mpi.c); when one falls silent it prints "PROG: rank
 * R of N: lost rank L: ..." on stderr and ends this process with status 1
 * (_exit: the main thread may be waiting for L inside MPI). With FN set it
 * calls FN(L, MSG, CTX) on the watchdog's thread instead (MSG without
 * "PROG: "), once, and FN's owner ends the process (a server answers its
 * clients first). FN NULL restores the default. Nothing in a single
 * process, or where MPI lacks MPI_THREAD_MULTIPLE (then the launcher alone
 * handles a lost rank). */
void llm_comm_on_lost(void (*fn)(int rank, const char *msg, void *ctx), void *ctx);

/* Print "PROG: rank R of N: message" on stderr and end the whole job with
 * CODE (MPI_Abort; exit in a single process). */
_Noreturn void llm_comm_abort(struct llm_comm *c, int code, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* For tools: llm_comm_abort on the world with exit code 1 (or llm_die
 * before llm_comm_init). */
_Noreturn void llm_comm_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* ---- the tensor x pipeline grid --------------------------------------- */

/* Rank r = stage * tp + tp_rank (partition.h). */
struct llm_grid {
	struct llm_comm *world;
	struct llm_comm *tp;         /* the T ranks of this stage, by tp_rank */
	struct llm_comm *pp;         /* the P ranks with this tp_rank, by stage */
	int n_tp, n_pp, tp_rank, stage;
	int prev, next;              /* pp ranks of the neighbouring stages, -1 at the ends */
};
/* Build the grid over WORLD (collective). LLM_ERR_USAGE when world size is
 * not TP * PP, naming both. */
enum llm_status llm_grid_init(struct llm_grid *g, struct llm_comm *world, int tp, int pp);
void llm_grid_free(struct llm_grid *g);

/* ---- implementations --------------------------------------------------- */

extern const struct llm_comm_ops llm_comm_single_ops;
#ifdef LLM_MPI
extern const struct llm_comm_ops llm_comm_mpi_ops;        /* comm_mpi.c */
enum llm_status llm_comm_mpi_init(struct llm_comm **world, int *argc, char ***argv);
void llm_comm_mpi_on_lost(void (*fn)(int rank, const char *msg, void *ctx), void *ctx);
#endif
#ifdef LLM_NCCL
/* common/engine/comm_nccl.c (CUDA builds with NCCL; linked into libllm_cuda.so,
 * reached through the CUDA backend's comm_open): a NCCL communicator over the
 * ranks of BOOT (MPI under mpirun: rank 0's ncclUniqueId is broadcast over
 * it), or, with BOOT NULL, a one-rank communicator with its own id; on
 * CUDA device DEVICE. Every buffer its operations take is device memory
 * of that device; each call waits for its own stream, so the caller
 * finishes work queued on other streams first. Collective over BOOT.
 * LLM_ERR_UNSUPPORTED without a device, LLM_ERR_USAGE for a device the
 * process does not see, LLM_ERR_COMM naming the NCCL call otherwise. */
extern const struct llm_comm_ops llm_comm_nccl_ops;
enum llm_status llm_comm_nccl_open(struct llm_comm *boot, int device, struct llm_comm **out);
#endif

#endif
