/* common/engine/comm_nccl.c: the communication layer over NCCL, for GPU ranks:
 * every buffer is device memory of the communicator's CUDA device. Built
 * only in CUDA builds where the Makefile finds nccl.h (the CUDA toolkit's,
 * or Debian's libnccl-dev): -DLLM_NCCL.
 *
 * Bootstrap: llm_comm_nccl_open takes a communicator of host ranks (MPI
 * under mpirun, or the single process): its rank 0 makes the ncclUniqueId
 * and broadcasts it over that communicator (llm_comm_bcast, host memory);
 * a process with no such communicator makes its own and is a one-rank
 * communicator. NCCL ranks are the boot communicator's ranks.
 *
 * Guarantees (comm.h): each call is enqueued on the communicator's own
 * stream and waited for before it returns, so the interface stays blocking;
 * work a caller queued on another stream (a backend's) must be finished
 * first (be->ops->sync). While waiting, NCCL's asynchronous errors are
 * polled (ncclCommGetAsyncError, as NCCL documents for failure detection):
 * a failed collective aborts the communicator and returns LLM_ERR_COMM
 * naming the rank and the call, never a hang on this rank. The all-reduce
 * gives the same bits on every rank (each element is reduced once, then
 * copied); between runs, while NCCL picks the same algorithm for the same
 * size and topology (NCCL_ALGO pins it).
 *
 * Collectives NCCL lacks are built from the ones it has: the all-gather of
 * unequal parts is one broadcast per rank in one NCCL group (the same
 * bytes as MPI_Allgatherv); the argmax all-gathers the (value, index)
 * pairs and picks on the host (largest value, lowest index on ties, as
 * MPI_MAXLOC). Point-to-point messages carry no tag: those of one pair
 * match in the order they are posted (the engine's protocol posts them in
 * the same order on both sides). The reference for the semantics is the
 * MPI standard, as for comm_mpi.c. */
#ifdef LLM_NCCL
#define _GNU_SOURCE
#include "comm.h"

#include <cuda_runtime_api.h>
#include <nccl.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct nccl_priv {
	ncclComm_t comm;
	cudaStream_t stream;   /* every call of this communicator, in order */
	int device;
	float *one;            /* (1) f32 device scratch: the barrier's all-reduce */
};

static struct nccl_priv *priv_of(const struct llm_comm *c)
{
	return c->priv;
}

static enum llm_status nccl_err(const struct llm_comm *c, ncclComm_t comm, ncclResult_t rc, const char *call)
{
	if (rc == ncclSuccess)
		return LLM_OK;
	const char *why = ncclGetLastError(comm);
	return llm_fail(LLM_ERR_COMM, "rank %d of %d: %s: %s%s%s", c->world_rank, c->world_size, call,
	                ncclGetErrorString(rc), why && *why ? ": " : "", why ? why : "");
}

static enum llm_status cuda_err(const struct llm_comm *c, cudaError_t e, const char *call)
{
	if (e == cudaSuccess)
		return LLM_OK;
	return llm_fail(LLM_ERR_CUDA, "rank %d of %d: %s: %s", c->world_rank, c->world_size, call,
	                cudaGetErrorString(e));
}

#define NCCL_TRY(c, call) LLM_TRY(nccl_err((c), priv_of(c)->comm, (call), #call))
#define CUDA_TRY(c, call) LLM_TRY(cuda_err((c), (call), #call))

/* Wait for everything queued on the stream, polling NCCL's asynchronous
 * error: spin first (collectives of a step come back to back), then nap
 * from 2 us, doubling to 100 us. */
static enum llm_status finish(struct llm_comm *c, const char *what)
{
	struct nccl_priv *p = priv_of(c);
	for (long tries = 0, nap = 2000; ; ) {
		cudaError_t e = cudaStreamQuery(p->stream);
		if (e == cudaSuccess)
			return LLM_OK;
		if (e != cudaErrorNotReady)
			return cuda_err(c, e, what);
		ncclResult_t a = ncclSuccess;
		ncclResult_t rc = ncclCommGetAsyncError(p->comm, &a);
		if (rc == ncclSuccess && a != ncclSuccess && a != ncclInProgress) {
			enum llm_status s = nccl_err(c, p->comm, a, what);
			ncclCommAbort(p->comm);
			p->comm = NULL;
			return s;
		}
		if (rc != ncclSuccess)
			return nccl_err(c, p->comm, rc, "ncclCommGetAsyncError");
		if (++tries < 2000)
			continue;
		struct timespec ts = { 0, nap };
		nanosleep(&ts, NULL);
		if (nap < 100000)
			nap *= 2;
	}
}

/* Make the calling thread use the communicator's device; refuse a
 * communicator an earlier failure aborted. */
static enum llm_status enter(struct llm_comm *c)
{
	struct nccl_priv *p = priv_of(c);
	if (!p->comm)
		return llm_fail(LLM_ERR_COMM, "rank %d of %d: the NCCL communicator was aborted by an earlier error",
		                c->world_rank, c->world_size);
	return cuda_err(c, cudaSetDevice(p->device), "cudaSetDevice");
}

static void priv_free(struct nccl_priv *p)
{
	if (!p)
		return;
	cudaSetDevice(p->device);
	if (p->comm)
		ncclCommDestroy(p->comm);
	if (p->stream)
		cudaStreamDestroy(p->stream);
	cudaFree(p->one);
	free(p);
}

/* A struct llm_comm around COMM (owned from here on, destroyed on
 * failure), on DEVICE; world rank and size from BASE. */
static enum llm_status wrap(const struct llm_comm *base, ncclComm_t comm, int device, struct llm_comm **out)
{
	struct llm_comm *n = calloc(1, sizeof *n);
	struct nccl_priv *p = calloc(1, sizeof *p);
	if (!n || !p) {
		free(n), free(p);
		ncclCommDestroy(comm);
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	p->comm = comm;
	p->device = device;
	*n = (struct llm_comm){ &llm_comm_nccl_ops, 0, 0, base->world_rank, base->world_size, p, { 0 } };
	enum llm_status s = cuda_err(n, cudaStreamCreateWithFlags(&p->stream, cudaStreamNonBlocking),
	                             "cudaStreamCreateWithFlags");
	if (!s)
		s = cuda_err(n, cudaMalloc((void **)&p->one, sizeof *p->one), "cudaMalloc");
	if (!s)
		s = nccl_err(n, comm, ncclCommUserRank(comm, &n->rank), "ncclCommUserRank");
	if (!s)
		s = nccl_err(n, comm, ncclCommCount(comm, &n->size), "ncclCommCount");
	if (s) {
		priv_free(p);
		free(n);
		return s;
	}
	*out = n;
	return LLM_OK;
}

enum llm_status llm_comm_nccl_open(struct llm_comm *boot, int device, struct llm_comm **out)
{
	*out = NULL;
	struct llm_comm base = { .rank = 0, .size = 1, .world_rank = 0, .world_size = 1 };
	if (boot)
		base = (struct llm_comm){ NULL, boot->rank, boot->size, boot->world_rank, boot->world_size, NULL, { 0 } };
	int n_dev = 0;
	if (cudaGetDeviceCount(&n_dev) != cudaSuccess) {
		(void)cudaGetLastError();
		n_dev = 0;
	}
	if (n_dev == 0)
		return llm_fail(LLM_ERR_UNSUPPORTED, "rank %d of %d: NCCL communicator: no CUDA device",
		                base.world_rank, base.world_size);
	if (device < 0 || device >= n_dev)
		return llm_fail(LLM_ERR_USAGE, "rank %d of %d: NCCL communicator on CUDA device %d: this process sees %d",
		                base.world_rank, base.world_size, device, n_dev);
	LLM_TRY(cuda_err(&base, cudaSetDevice(device), "cudaSetDevice"));
	/* rank 0's id, with whether it could make one, so that no rank waits
	 * for an id that never comes */
	struct { int32_t ok; ncclUniqueId id; } boot_msg;
	memset(&boot_msg, 0, sizeof boot_msg);
	enum llm_status s = LLM_OK;
	if (base.rank == 0) {
		s = nccl_err(&base, NULL, ncclGetUniqueId(&boot_msg.id), "ncclGetUniqueId");
		boot_msg.ok = !s;
	}
	if (boot && boot->size > 1) {
		LLM_TRY(llm_comm_bcast(boot, &boot_msg, sizeof boot_msg, 0));
		if (!boot_msg.ok && base.rank != 0)
			return llm_fail(LLM_ERR_COMM, "rank %d of %d: rank 0 could not make the NCCL unique id",
			                base.world_rank, base.world_size);
	}
	if (s)
		return s;
	ncclComm_t comm = NULL;
	LLM_TRY(nccl_err(&base, NULL, ncclCommInitRank(&comm, base.size, boot_msg.id, base.rank), "ncclCommInitRank"));
	return wrap(&base, comm, device, out);
}

/* ---- the operations ---------------------------------------------------- */

static enum llm_status nccl_split(struct llm_comm *c, int color, int key, struct llm_comm **out)
{
	LLM_TRY(enter(c));
	ncclComm_t m = NULL;
	NCCL_TRY(c, ncclCommSplit(priv_of(c)->comm, color, key, &m, NULL));
	return wrap(c, m, priv_of(c)->device, out);
}

static enum llm_status nccl_allreduce(struct llm_comm *c, float *buf, size_t n)
{
	struct nccl_priv *p = priv_of(c);
	LLM_TRY(enter(c));
	NCCL_TRY(c, ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum, p->comm, p->stream));
	return finish(c, "ncclAllReduce");
}

/* Every rank's pairs to every rank, then the pick on the host, in rank
 * order: rank r's pair wins over the best so far when its value is larger,
 * or equal with a lower index. */
static enum llm_status nccl_argmax(struct llm_comm *c, float *val, int32_t *idx, size_t n)
{
	struct nccl_priv *p = priv_of(c);
	if (!n)
		return LLM_OK;
	LLM_TRY(enter(c));
	size_t all = (size_t)c->size * n;
	float *dv = NULL, *hv = malloc(all * sizeof *hv);          /* (size, n) f32 */
	int32_t *di = NULL, *hi = malloc(all * sizeof *hi);         /* (size, n) i32 */
	enum llm_status s = hv && hi ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "out of memory");
	if (!s)
		s = cuda_err(c, cudaMalloc((void **)&dv, all * sizeof *dv), "cudaMalloc");
	if (!s)
		s = cuda_err(c, cudaMalloc((void **)&di, all * sizeof *di), "cudaMalloc");
	if (!s)
		s = nccl_err(c, p->comm, ncclGroupStart(), "ncclGroupStart");
	if (!s) {
		ncclResult_t a = ncclAllGather(val, dv, n, ncclFloat32, p->comm, p->stream);
		ncclResult_t b = ncclAllGather(idx, di, n, ncclInt32, p->comm, p->stream);
		ncclResult_t e = ncclGroupEnd();
		s = nccl_err(c, p->comm, a ? a : b ? b : e, "ncclAllGather (argmax pairs)");
	}
	if (!s)
		s = finish(c, "ncclAllGather (argmax pairs)");
	if (!s)
		s = cuda_err(c, cudaMemcpy(hv, dv, all * sizeof *hv, cudaMemcpyDeviceToHost), "cudaMemcpy");
	if (!s)
		s = cuda_err(c, cudaMemcpy(hi, di, all * sizeof *hi, cudaMemcpyDeviceToHost), "cudaMemcpy");
	for (size_t i = 0; !s && i < n; i++)
		for (int r = 1; r < c->size; r++) {
			float v = hv[(size_t)r * n + i];
			int32_t k = hi[(size_t)r * n + i];
			if (v > hv[i] || (v == hv[i] && k < hi[i]))
				hv[i] = v, hi[i] = k;
		}
	if (!s)
		s = cuda_err(c, cudaMemcpy(val, hv, n * sizeof *hv, cudaMemcpyHostToDevice), "cudaMemcpy");
	if (!s)
		s = cuda_err(c, cudaMemcpy(idx, hi, n * sizeof *hi, cudaMemcpyHostToDevice), "cudaMemcpy");
	cudaFree(dv);
	cudaFree(di);
	free(hv);
	free(hi);
	return s;
}

/* In place when SEND is this rank's part of RECV (NCCL's own rule). */
static enum llm_status nccl_allgather(struct llm_comm *c, const void *send, size_t n, void *recv)
{
	struct nccl_priv *p = priv_of(c);
	LLM_TRY(enter(c));
	NCCL_TRY(c, ncclAllGather(send, recv, n, ncclInt8, p->comm, p->stream));
	return finish(c, "ncclAllGather");
}

/* One broadcast per rank, rank r's part from r, in one group: NCCL runs
 * them together; the root of each copies SEND into place unless it is
 * there already. */
static enum llm_status nccl_allgatherv(struct llm_comm *c, const void *send, size_t n, void *recv,
                                       const size_t *counts)
{
	struct nccl_priv *p = priv_of(c);
	(void)n;
	LLM_TRY(enter(c));
	NCCL_TRY(c, ncclGroupStart());
	ncclResult_t first = ncclSuccess;
	size_t at = 0;
	for (int r = 0; r < c->size; r++) {
		char *part = (char *)recv + at;
		ncclResult_t rc = ncclBroadcast(r == c->rank ? send : part, part, counts[r], ncclInt8, r, p->comm,
		                                p->stream);
		if (first == ncclSuccess)
			first = rc;
		at += counts[r];
	}
	ncclResult_t e = ncclGroupEnd();
	NCCL_TRY(c, first ? first : e);
	return finish(c, "ncclBroadcast (all-gather of parts)");
}

static enum llm_status nccl_bcast(struct llm_comm *c, void *buf, size_t n, int root)
{
	struct nccl_priv *p = priv_of(c);
	LLM_TRY(enter(c));
	NCCL_TRY(c, ncclBroadcast(buf, buf, n, ncclInt8, root, p->comm, p->stream));
	return finish(c, "ncclBroadcast");
}

static enum llm_status nccl_send(struct llm_comm *c, const void *buf, size_t n, int dst, int tag)
{
	struct nccl_priv *p = priv_of(c);
	(void)tag;
	LLM_TRY(enter(c));
	NCCL_TRY(c, ncclSend(buf, n, ncclInt8, dst, p->comm, p->stream));
	return finish(c, "ncclSend");
}

static enum llm_status nccl_recv(struct llm_comm *c, void *buf, size_t n, int src, int tag)
{
	struct nccl_priv *p = priv_of(c);
	(void)tag;
	LLM_TRY(enter(c));
	NCCL_TRY(c, ncclRecv(buf, n, ncclInt8, src, p->comm, p->stream));
	return finish(c, "ncclRecv");
}

static enum llm_status nccl_barrier(struct llm_comm *c)
{
	struct nccl_priv *p = priv_of(c);
	LLM_TRY(enter(c));
	NCCL_TRY(c, ncclAllReduce(p->one, p->one, 1, ncclFloat32, ncclSum, p->comm, p->stream));
	return finish(c, "ncclAllReduce (barrier)");
}

/* NCCL's own abort (its kernels stop), then the job's: the world's abort
 * under MPI, else exit. */
static void nccl_abort(struct llm_comm *c, int code)
{
	struct nccl_priv *p = priv_of(c);
	if (p->comm)
		ncclCommAbort(p->comm);
	p->comm = NULL;
	struct llm_comm *w = llm_comm_world();
	if (w && w != c)
		w->ops->abort(w, code);
	exit(code ? code : 1);
}

static void nccl_free(struct llm_comm *c)
{
	priv_free(c->priv);
	free(c);
}

static enum llm_status nccl_finalize(struct llm_comm *c)
{
	nccl_free(c);
	return LLM_OK;
}

const struct llm_comm_ops llm_comm_nccl_ops = {
	.name = "nccl",
	.split = nccl_split,
	.allreduce_sum_f32 = nccl_allreduce,
	.argmax_f32 = nccl_argmax,
	.allgather = nccl_allgather,
	.allgatherv = nccl_allgatherv,
	.bcast = nccl_bcast,
	.send = nccl_send,
	.recv = nccl_recv,
	.barrier = nccl_barrier,
	.abort = nccl_abort,
	.free = nccl_free,
	.finalize = nccl_finalize,
};
#else
typedef int llm_comm_nccl_not_built;   /* this build has no NCCL (CUDA=0, or no nccl.h found) */
#endif
