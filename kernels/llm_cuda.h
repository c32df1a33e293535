/* kernels/llm_cuda.h: what the CUDA backend offers beyond struct
 * llm_backend_ops (common/engine/backend.h). Only in builds with LLM_CUDA.
 *
 * The backend ("cuda", "cuda:N") keeps everything on one device and one
 * stream: alloc/release are cudaMalloc/cudaFree (zeroed, like the CPU's),
 * copy_in is host (or device) to device, ops take device views (f32), and
 * sync waits for the stream. Two exceptions the forward pass relies on:
 * - weights (struct llm_weight) point into the host mapping of the
 *   checkpoint; the backend uploads each one on first use (or at
 *   llm_cuda_weight_preload()) through two pinned staging buffers, and keys
 *   it by its host address: a weight must not change while the backend is
 *   open (call llm_cuda_weights_drop() before reusing its memory);
 * - matmul may write its output to host memory (the logits): it then
 *   computes into a device buffer, copies back and waits.
 * Token ids, positions, gather indices, inv_freq and the KV block tables
 * are host arrays on the interface; each op uploads what changed since the
 * previous op (a few hundred bytes per step). */
#ifndef LLM_CUDA_H
#define LLM_CUDA_H

#include <stdio.h>
#include "backend.h"

/* Visible CUDA devices; 0 when there is no device or no driver. */
int llm_cuda_device_count(void);

/* Copy N bytes from device memory SRC (of this backend) to host DST, after
 * everything queued before; waits. */
enum llm_status llm_cuda_copy_out(struct llm_backend *be, void *dst, const void *src, size_t n);

/* Upload W now (start-up), instead of at its first use. */
enum llm_status llm_cuda_weight_preload(struct llm_backend *be, const struct llm_weight *w);
/* Free every uploaded weight. */
void llm_cuda_weights_drop(struct llm_backend *be);
/* Bytes of device memory the uploaded weights take. */
size_t llm_cuda_weight_bytes(struct llm_backend *be);

/* Run every E4M3 matmul with configuration CFG (an enum
 * llm_cuda_gemm_cfg; where it cannot run the weight, the table's choice),
 * or -1: the table (kernels/tune_table.h). For tests and benchmarks. */
void llm_cuda_gemm_force(struct llm_backend *be, int cfg);

/* CUDA graphs for decode steps (graph_begin/graph_end of backend.h; on
 * unless $LLM_CUDA_GRAPHS=0): ON 0 or 1 turns them off or on (every graph
 * recorded so far is dropped); the counts of steps captured, replayed, and
 * run again op by op because the record could not serve them. */
void llm_cuda_graphs(struct llm_backend *be, int on);
void llm_cuda_graph_stats(struct llm_backend *be, long *captured, long *replayed, long *redone);

/* Fused residual add and RMSNorm, one pass over x: x += y, then
 * out = rmsnorm(x) * w. Same result as ops->add then ops->rmsnorm; offered
 * for an interface op to come (backend.h has them separate today). */
enum llm_status llm_cuda_add_rmsnorm(struct llm_backend *be, struct llm_view out, struct llm_view x,
                                     struct llm_view y, const struct llm_weight *w, float eps);

/* Greedy sampling on the device: ids[r] (host, logits.rows) = argmax of
 * device row r of LOGITS after the repetition penalty over the ids with
 * SEEN[r * cols + i] != 0 (device bytes, or NULL); ties to the lowest id,
 * as common/engine/sampler.c at temperature 0. */
enum llm_status llm_cuda_argmax(struct llm_backend *be, int32_t *ids, struct llm_view logits,
                                const uint8_t *seen, float repetition_penalty);

/* ---- llm-bench gemm -------------------------------------------------------
 * The fused FP8 GEMM against cuBLAS BF16 (cublasGemmEx, f32 accumulation)
 * on the same (dequantized) weights: for each shape and each M, the median
 * time of ITERS event-timed runs after WARMUP, rotating over enough weight
 * copies to exceed twice the L2 cache. Activations are random normal-ish,
 * weights random E4M3 codes with 128 x 128 block scales. Every row counts
 * the output elements where the two disagree beyond
 * 1e-2 * |ref| + 1e-3 * max|ref| (both use the same bf16 weight values, so
 * only the summation order differs). */
struct llm_gemm_shape {
	const char *name;            /* "8B.q", "70B.down" ... */
	int64_t n, k;                /* weight (d_out, d_in) */
};

struct llm_gemm_bench_opts {
	int device;
	const struct llm_gemm_shape *shapes;   /* NULL: llm_gemm_shapes_llama31 */
	size_t n_shapes;
	const int64_t *m;            /* NULL: 1, 2, 4, 8, 16, 32, ..., 8192 */
	size_t n_m;
	int warmup, iters;           /* 0: 5 and 50 */
	int cfg;                     /* -1: the tile table's choice; else one enum llm_cuda_gemm_cfg */
};

struct llm_gemm_bench_row {
	const char *shape;
	int64_t m, n, k;
	int cfg;                     /* enum llm_cuda_gemm_cfg that ran */
	double us_fp8, us_bf16;      /* medians, microseconds */
	double speedup;              /* us_bf16 / us_fp8 */
	double tflops_fp8, gbs_fp8;  /* 2 m n k / t; weight + activation + output bytes / t */
	int64_t n_wrong;
};

/* Linear shapes of Llama 3.1 8B and 70B as the forward runs them (q, k/v,
 * o, gate/up, down, lm_head). */
extern const struct llm_gemm_shape llm_gemm_shapes_llama31[];
extern const size_t llm_gemm_n_shapes_llama31;

/* Run the benchmark; *ROWS (malloc'd, caller frees) gets n_shapes * n_m
 * rows. The device name goes to DEVICE (NAME_LEN bytes) when not NULL.
 * LLM_ERR_UNSUPPORTED without a device, LLM_ERR_CUDA on a CUDA error. */
enum llm_status llm_cuda_bench_gemm(const struct llm_gemm_bench_opts *o, struct llm_gemm_bench_row **rows,
                                    size_t *n_rows, char *device, size_t name_len);

/* The offline sweep behind kernels/tune_table.h: times every configuration
 * that can run each (shape, M) and writes a complete tune_table.h to OUT,
 * naming the device. */
enum llm_status llm_cuda_gemm_sweep(const struct llm_gemm_bench_opts *o, FILE *out);

#endif
