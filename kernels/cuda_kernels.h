/* kernels/cuda_kernels.h: the CUDA launchers, callable from C.
 *
 * Every launcher is extern "C" in a .cu file of kernels/, queues its kernels on
 * STREAM and returns the launch status (cudaGetLastError()); nothing here
 * synchronizes. Pointers are device pointers unless a comment says otherwise.
 * Shapes and semantics are those of the op of the same name in
 * common/engine/backend.h; the CPU backend (common/engine/backend_cpu.c, cpu_matmul.c,
 * cpu_attention.c) is the reference each one is tested against
 * (tests/test_cuda.c).
 *
 * Activations on the interface are f32 row-major with a row stride in
 * elements (>= cols), as struct llm_view. Weights are struct llm_cuda_mat:
 * the device copy of a struct llm_weight (common/checkpoint/ckpt.h). */
#ifndef LLM_CUDA_KERNELS_H
#define LLM_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>
#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A weight matrix in device memory; same meaning as struct llm_weight.
 * For E4M3, element (r, c) = e4m3(code[r * cols + c]) *
 * scale[(r / block_rows) * scale_cols + c / block_cols]. dtype is an
 * enum llm_dtype value (F32, F16, BF16, E4M3). */
struct llm_cuda_mat {
	int dtype;
	int64_t rows, cols;
	const void *data;            /* (rows, cols) */
	const float *scale;          /* E4M3: (scale_rows, scale_cols) */
	int64_t scale_rows, scale_cols;
	int64_t block_rows, block_cols;
};

/* ---- matrix products (gemm_fp8.cu) -------------------------------------- */

/* Tile configurations of the fused FP8 GEMM (kernels/tune_table.h). */
enum llm_cuda_gemm_cfg {
	LLM_GEMM_GEMV = 0,       /* one warp per weight row, f32 activations, M <= 8 */
	LLM_GEMM_MMA_16x64,      /* mma.sync tiles: block M x N, 4 warps */
	LLM_GEMM_MMA_64x128,
	LLM_GEMM_MMA_128x128,    /* 8 warps */
	LLM_GEMM_GENERIC,        /* SIMT f32 fallback: any dtype, shape, block size */
	LLM_GEMM_CFG_COUNT
};
const char *llm_cuda_gemm_cfg_name(enum llm_cuda_gemm_cfg c);

/* Whether configuration C can run W with M activation rows (alignment of
 * cols and block_cols, GEMV's M limit). GENERIC runs everything. */
int llm_cuda_gemm_cfg_ok(enum llm_cuda_gemm_cfg c, const struct llm_cuda_mat *w, int64_t m);
/* The configuration kernels/tune_table.h names for W and M (GENERIC when no
 * row fits). */
enum llm_cuda_gemm_cfg llm_cuda_gemm_pick(const struct llm_cuda_mat *w, int64_t m);

/* y (m, w.rows; f32, row stride ys) = x . W^T for an E4M3 weight; with
 * ADD, y += x . W^T from the epilogue (each element's f32 sum, then one
 * add: the bits of the product into a buffer, then llm_cuda_add).
 * GEMV and GENERIC read x as f32 (x32, row stride xs); the MMA tiles read
 * the bf16 copy xbf (m, w.cols) contiguous (llm_cuda_f32_to_bf16 below).
 * Numerics of the MMA tiles: x rounded to bf16, each weight element
 * dequantized exactly and multiplied by its block scale in f32, then rounded
 * to bf16 (one rounding), products accumulated in f32 by the tensor cores. */
cudaError_t llm_cuda_gemm_e4m3(enum llm_cuda_gemm_cfg cfg, float *y, int64_t ys,
                               const float *x32, int64_t xs, const uint16_t *xbf,
                               int64_t m, const struct llm_cuda_mat *w, int add, cudaStream_t stream);
/* Any dtype, f32 accumulation in the CPU's order per lane (the fallback);
 * ADD as above. */
cudaError_t llm_cuda_matmul_generic(float *y, int64_t ys, const float *x, int64_t xs, int64_t m,
                                    const struct llm_cuda_mat *w, int add, cudaStream_t stream);
/* dst (rows, cols) contiguous bf16 = src (rows, cols; stride ss) f32, round to nearest even. */
cudaError_t llm_cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t ss, int64_t rows,
                                 int64_t cols, cudaStream_t stream);
/* dst (rows, cols) bf16 = the dequantized E4M3 weight (the cuBLAS baseline). */
cudaError_t llm_cuda_e4m3_to_bf16(uint16_t *dst, const struct llm_cuda_mat *w, cudaStream_t stream);

/* ---- row ops (rmsnorm.cu, rope.cu, swiglu.cu, add.cu, gather.cu, embed.cu) */

/* out[i] = x[i] * (1 / sqrt(mean(x[i]^2) + eps)) * w; w (1, cols) any dtype.
 * OUT may equal X. */
cudaError_t llm_cuda_rmsnorm(float *out, int64_t os, const float *x, int64_t xs,
                             int64_t rows, int64_t cols, const struct llm_cuda_mat *w,
                             float eps, cudaStream_t stream);
/* Fused residual: x += y, then out = rmsnorm(x) (one pass over x). */
cudaError_t llm_cuda_add_rmsnorm_f32(float *out, int64_t os, float *x, int64_t xs,
                                 const float *y, int64_t ys, int64_t rows, int64_t cols,
                                 const struct llm_cuda_mat *w, float eps, cudaStream_t stream);
/* In place, HF rotate_half pairs (j, j + d_head/2) by pos[t] * inv_freq[j];
 * pos (rows), inv_freq (d_head / 2) device. */
cudaError_t llm_cuda_rope(float *x, int64_t xs, int64_t rows, const int32_t *pos,
                          int n_head, int d_head, const float *inv_freq, cudaStream_t stream);
/* out = silu(gate) * up; out may equal gate or up. */
cudaError_t llm_cuda_swiglu(float *out, int64_t os, const float *gate, int64_t gs,
                            const float *up, int64_t us, int64_t rows, int64_t cols,
                            cudaStream_t stream);
/* x += y */
cudaError_t llm_cuda_add(float *x, int64_t xs, const float *y, int64_t ys, int64_t rows,
                         int64_t cols, cudaStream_t stream);
/* out row i = x row idx[i]; idx (rows) device. Rows must not overlap unless
 * idx[i] == i (the CPU's memmove semantics for the forward's use). */
cudaError_t llm_cuda_gather(float *out, int64_t os, const float *x, int64_t xs,
                            const int32_t *idx, int64_t rows, int64_t cols, cudaStream_t stream);
/* out row i = row tok[i] of emb (ids checked on the host first). */
cudaError_t llm_cuda_embed(float *out, int64_t os, const int32_t *tok, int64_t rows,
                           const struct llm_cuda_mat *emb, cudaStream_t stream);

/* ---- paged attention (attn_paged.cu) ------------------------------------- */

/* Where the batch's tokens live in the paged cache: for token t, its
 * sequence's block table starts at tab + tab_off[t] and it attends to
 * positions 0..pos[t]. All device arrays of n_tok (tab: the concatenated
 * block tables of the batch's sequences). */
struct llm_cuda_kvmeta {
	int n_tok;
	const int32_t *pos;          /* (n_tok) */
	const int32_t *tab_off;      /* (n_tok) */
	const int32_t *tab;          /* block ids */
};

/* The cache geometry (common/engine/kvcache.h): k, v (n_layer, n_block, n_kv_head,
 * block_size, d_head) of f32, bf16 (bf16 = 1) or E4M3 (fp8 = 1). */
struct llm_cuda_kvgeom {
	void *k, *v;
	float *ks, *vs;           /* fp8: (n_layer, n_block, n_kv_head, block_size) scales; else NULL */
	int64_t n_block;
	int block_size, kv_dim, n_kv_head, d_head, bf16, fp8;
};

/* Write rows of k, v (n_tok, kv_dim) of LAYER at each token's position. */
cudaError_t llm_cuda_kv_store(const struct llm_cuda_kvgeom *g, int layer,
                              const struct llm_cuda_kvmeta *m, const float *k, int64_t ks,
                              const float *v, int64_t vs, cudaStream_t stream);
/* The fused rope_store op: rope on q (n_tok, n_head * d_head) and k (n_tok,
 * kv_dim) in place by m->pos (inv_freq (d_head / 2) device; d_head even),
 * then k and v stored as llm_cuda_kv_store stores them: the same bits as
 * llm_cuda_rope twice and llm_cuda_kv_store, in one launch. */
cudaError_t llm_cuda_rope_store(const struct llm_cuda_kvgeom *g, int layer, const struct llm_cuda_kvmeta *m,
                                float *q, int64_t qs, float *k, int64_t ks, const float *v, int64_t vs,
                                int n_head, const float *inv_freq, cudaStream_t stream);
/* out (n_tok, n_head * d_head) = causal softmax(q k^T / sqrt(d_head)) v over
 * the token's sequence, GQA (head h reads kv head h / (n_head / n_kv_head)),
 * online softmax in f32. d_head <= 256. */
cudaError_t llm_cuda_attention(float *out, int64_t os, const float *q, int64_t qs,
                               const struct llm_cuda_kvgeom *g, int layer,
                               const struct llm_cuda_kvmeta *m, int n_head, cudaStream_t stream);

/* ---- sampling (sample.cu) ------------------------------------------------ */

/* ids[r] = argmax of logits row r (n_vocab; ties: the lowest id), after the
 * repetition penalty over the ids marked in seen (rows, n_vocab) bytes, or
 * NULL for none (penalty 1: off). */
cudaError_t llm_cuda_argmax_f32(int32_t *ids, const float *logits, int64_t ls, int64_t rows,
                            int64_t n_vocab, const uint8_t *seen, float rep_penalty,
                            cudaStream_t stream);

/* The sampler (sample.cu): llm_sampler_sample of common/engine/sampler.c per row,
 * on the device (backend.h's sample op). Per-row parameters, with the
 * lists of struct llm_sample_row packed in AUX (int32 device array) at
 * the offsets given: bias ids then their values as f32 bits (2 n_bias),
 * hold ids (n_hold), seen ids then their output counts (2 n_seen). */
struct llm_cuda_sample_row {
	float temperature, top_p, min_p, rep, freq, pres;
	int top_k, n_bias, n_hold, n_seen, want_logprob;
	int64_t bias, hold, seen;    /* offsets into aux */
	double u;                    /* the request's draw, temperature > 0 */
};
struct llm_cuda_sample_out {
	int32_t id;                  /* < 0: -1 - the first non-finite logit's id */
	float logprob;               /* NaN when not wanted; the bad value when id < 0 */
};
/* Bytes of device work space for ROWS x N_VOCAB (0: too large: the
 * elements must fit an int, the sort's count). */
size_t llm_cuda_sample_work(int64_t rows, int64_t n_vocab);
/* out (rows) = the sampler's choice per row of LOGITS (rows, n_vocab; row
 * stride ls). ANY_SAMPLED 0: every row is greedy (no sort). WORK holds
 * llm_cuda_sample_work(rows, n_vocab) bytes. */
cudaError_t llm_cuda_sample(struct llm_cuda_sample_out *out, const float *logits, int64_t ls,
                            int64_t rows, int64_t n_vocab, const struct llm_cuda_sample_row *prm,
                            const int32_t *aux, int any_sampled, void *work, size_t work_bytes,
                            cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif
