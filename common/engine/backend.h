/* common/engine/backend.h: the compute interface the forward pass is written in.
 *
 * One table of ops per backend (STYLE.md section 3). The CPU backend
 * (backend_cpu.c) is the reference: every other backend is tested against it
 * op by op; it and the CUDA backend are in turn tested against the plain
 * scalar definitions of cpu_ref.h. Every op takes the backend first and
 * returns a status. Activations
 * are row-major views; weights are struct llm_weight (ckpt.h), read in place
 * from the checkpoint mapping or its huge-page copy (llm_model_copy_weights;
 * FP8 is dequantized inside the kernels, a block at a time; no dequantized
 * copy of a matrix ever exists).
 *
 * Batch invariance: every op computes each output row from its own input row
 * with a reduction order that does not depend on n_tok, on the other rows or
 * on the thread count. A backend must keep that property. */
#ifndef LLM_BACKEND_H
#define LLM_BACKEND_H

#include <stdbool.h>
#include "status.h"
#include "dtype.h"
#include "ckpt.h"

struct llm_kv;
struct llm_batch;
struct llm_sample_row;
struct llm_comm;

enum llm_op {
	LLM_OP_EMBED, LLM_OP_RMSNORM, LLM_OP_MATMUL, LLM_OP_ROPE,
	LLM_OP_KV_STORE, LLM_OP_ATTN, LLM_OP_SWIGLU, LLM_OP_ADD,
	LLM_OP_GATHER, LLM_OP_COUNT
};

/* A 2-D activation: rows x cols elements of dtype, row i at data + i*stride. */
struct llm_view {
	void *data;
	enum llm_dtype dtype;       /* the CPU backend computes in F32 */
	int64_t rows, cols;
	int64_t stride;             /* elements between rows (>= cols) */
};

static inline struct llm_view llm_view_f32(float *p, int64_t rows, int64_t cols)
{
	struct llm_view v = { p, LLM_DTYPE_F32, rows, cols, cols };
	return v;
}

/* Instruction-set levels of the CPU backend, lowest first. */
enum llm_cpu_isa {
	LLM_ISA_AUTO = -1,
	LLM_ISA_SCALAR = 0,   /* portable C: the reference */
	LLM_ISA_AVX2,         /* AVX2 + FMA + F16C */
	LLM_ISA_AVX512,       /* AVX-512 F/BW/VL */
	LLM_ISA_AVX512BF16,   /* + AVX512_BF16 dot products for BF16 and E4M3
	                         weights (activations, and E4M3 code * scale,
	                         rounded to BF16 in those matmuls) */
	LLM_ISA_COUNT
};
const char *llm_cpu_isa_name(enum llm_cpu_isa isa);
/* "auto", "scalar", "avx2", "avx512", "avx512bf16"; -2 when unknown. */
int llm_cpu_isa_parse(const char *s);
/* The best level this CPU runs. */
enum llm_cpu_isa llm_cpu_isa_detect(void);
/* The best level this CPU runs, capped by $LLM_CPU_ISA where it names a
 * lower one; *BAD (may be NULL) set to 1 when it names no level. */
enum llm_cpu_isa llm_cpu_isa_capped(int *bad);

struct llm_backend_opts {
	int n_threads;            /* 0: every online CPU */
	enum llm_cpu_isa isa;     /* LLM_ISA_AUTO: best available, or $LLM_CPU_ISA */
	int device;               /* cuda:N */
};
#define LLM_BACKEND_OPTS_DEFAULT { 0, LLM_ISA_AUTO, 0 }

struct llm_backend;

/* How attention_ex scores: s = q . k / div; with softcap > 0, s =
 * tanh(s / softcap) * softcap; with window > 0, a query at position i sees
 * the keys at positions i - window + 1 .. i only (Hugging Face's sliding
 * window: key position > i - window). */
struct llm_attn_opts {
	float div;                  /* sqrtf(d_head) for Llama */
	float softcap;              /* 0: none */
	int window;                 /* 0: every earlier position */
};

struct llm_backend_ops {
	const char *name;                                    /* "cpu", "cuda" */
	bool (*supports)(enum llm_op op, enum llm_dtype w, enum llm_dtype act);
	enum llm_status (*init)(struct llm_backend *be, const struct llm_backend_opts *o);
	void            (*fini)(struct llm_backend *be);
	enum llm_status (*alloc)(struct llm_backend *be, size_t nbytes, void **p);
	void            (*release)(struct llm_backend *be, void *p);
	enum llm_status (*copy_in)(struct llm_backend *be, void *dst, const void *src, size_t n);
	/* out (n_tok, d_model) = rows tok[i] of emb (n_vocab, d_model) */
	enum llm_status (*embed)(struct llm_backend *be, struct llm_view out,
	                         const int32_t *tok, const struct llm_weight *emb);
	/* out[i] = x[i] * (1 / sqrt(mean(x[i]^2) + eps)) * w; w is 1 x cols */
	enum llm_status (*rmsnorm)(struct llm_backend *be, struct llm_view out,
	                           struct llm_view x, const struct llm_weight *w, float eps);
	/* y (n_tok, w->rows) = x (n_tok, w->cols) . W^T */
	enum llm_status (*matmul)(struct llm_backend *be, struct llm_view y,
	                          struct llm_view x, const struct llm_weight *w);
	/* y[i] = x . w[i]^T for i < n (1..4) in one dispatch, each y[i] equal
	 * to what matmul gives; NULL: the model calls matmul n times */
	enum llm_status (*matmul_n)(struct llm_backend *be, int n, const struct llm_view *y,
	                            struct llm_view x, const struct llm_weight *const *w);
	/* In place on x (n_tok, n_head * d_head), Hugging Face rotate_half pairs
	 * (j, j + d_head/2) rotated by pos[i] * inv_freq[j]; inv_freq (d_head/2). */
	enum llm_status (*rope)(struct llm_backend *be, struct llm_view x, const int32_t *pos,
	                        int n_head, int d_head, const float *inv_freq);
	/* Write k, v (n_tok, n_kv_head * d_head) of LAYER at each token's
	 * (seq, pos) in the paged cache (blocks already reserved). */
	enum llm_status (*kv_store)(struct llm_backend *be, struct llm_kv *kv, int layer,
	                            const struct llm_batch *b, struct llm_view k, struct llm_view v);
	/* Causal attention of q (n_tok, n_head * d_head) over the token's own
	 * sequence, positions 0..pos, read through the block table. */
	enum llm_status (*attention)(struct llm_backend *be, struct llm_view out, struct llm_view q,
	                             struct llm_kv *kv, int layer, const struct llm_batch *b,
	                             int n_head);
	/* out = silu(gate) * up, elementwise */
	enum llm_status (*swiglu)(struct llm_backend *be, struct llm_view out,
	                          struct llm_view gate, struct llm_view up);
	/* x += y */
	enum llm_status (*add)(struct llm_backend *be, struct llm_view x, struct llm_view y);
	/* Fused forms, each equal bit for bit to the ops it replaces, in one
	 * dispatch; NULL: the model calls those ops.
	 * add_rmsnorm: add(x, y) then rmsnorm(out, x, w, eps); OUT may be Y.
	 * rope_store: rope(q, b->pos, n_head), rope(k, b->pos, n_kv_head),
	 * then kv_store(kv, layer, b, k, v).
	 * matmul_add: matmul(y, a, w) then add(x, y), with no y: x (n_tok,
	 * w->rows) += a (n_tok, w->cols) . W^T from the matmul's epilogue
	 * (CUDA: each element's f32 sum, then one add); X and A must not
	 * overlap. */
	enum llm_status (*add_rmsnorm)(struct llm_backend *be, struct llm_view out, struct llm_view x,
	                               struct llm_view y, const struct llm_weight *w, float eps);
	enum llm_status (*rope_store)(struct llm_backend *be, struct llm_view q, struct llm_view k,
	                              struct llm_view v, struct llm_kv *kv, int layer,
	                              const struct llm_batch *b, int n_head, int n_kv_head, int d_head,
	                              const float *inv_freq);
	enum llm_status (*matmul_add)(struct llm_backend *be, struct llm_view x, struct llm_view a,
	                              const struct llm_weight *w);
	/* out row i = x row idx[i], for i < out.rows */
	enum llm_status (*gather)(struct llm_backend *be, struct llm_view out, struct llm_view x,
	                          const int32_t *idx);
	/* Optional (NULL: the caller copies the logits back and samples them
	 * with common/engine/sampler.c). Sampling where the logits are: ids[r] (host,
	 * logits.rows) = the token llm_sampler_sample would choose from row r
	 * of LOGITS (this backend's memory, (rows, n_vocab) f32) with the
	 * parameters, state and draw of ROWS[r] (sampler.h); logprob[r] (host)
	 * its log-softmax in the raw row (NaN when not wanted). A row with a
	 * NaN or infinite logit chooses nothing: ids[r] = -1 - the first such
	 * id, logprob[r] its value. LLM_ERR_RANGE for an id of ROWS outside
	 * the vocabulary. */
	enum llm_status (*sample)(struct llm_backend *be, struct llm_view logits,
	                          const struct llm_sample_row *rows, int32_t *ids, float *logprob);
	/* Optional, both or neither (NULL: every step runs op by op). The op
	 * calls from graph_begin to graph_end are one step of shape KEY: the
	 * same ops with the same sizes whenever KEY recurs (the model's decode
	 * steps, KEY its token count), writing their output OUT. graph_begin
	 * returns 1 when the backend records the step or replays its record
	 * (CUDA graphs), 0 when the ops run as usual. Recorded or replayed, the
	 * results are the same bits; graph_end launches the record and waits.
	 * *REDO = 1: the step could not be recorded or replayed after all
	 * (its host inputs differ in shape from the record's): nothing ran,
	 * run the same ops again. FAILED: an op of the step failed; *REDO = 1
	 * then too when the failure may be the recording's own (the record is
	 * dropped and the size is not recorded again). */
	int (*graph_begin)(struct llm_backend *be, int64_t key, const void *out);
	enum llm_status (*graph_end)(struct llm_backend *be, int failed, int *redo);
	/* Optional (NULL: nothing to do). From chain(be, 1) to chain(be, 0)
	 * the caller promises: nothing writes the output of an rmsnorm,
	 * add_rmsnorm, attention or swiglu before the matmul or matmul_n that
	 * takes it (the same view) as x. The backend may then prepare that
	 * matmul's input while the output is written (the CPU backend rounds
	 * it to bf16 on the threads that wrote each row, instead of on one
	 * thread after). Results do not change. The inference forward sets
	 * it; no other caller needs to. */
	void (*chain)(struct llm_backend *be, int on);
	/* Optional (NULL: distributed runs exchange host memory, the CPU
	 * backend's). A communicator over the ranks of BOOT (collective over
	 * BOOT, which bootstraps it) whose operations take this backend's
	 * memory: CUDA, NCCL on the backend's device (comm.h,
	 * llm_comm_nccl_open). The caller frees it with llm_comm_free and
	 * finishes the backend's queued work (sync) before each call. */
	enum llm_status (*comm_open)(struct llm_backend *be, struct llm_comm *boot, struct llm_comm **out);
	enum llm_status (*sync)(struct llm_backend *be);   /* NULL: always synchronous */
	/* The model families' ops (family.h), optional: where one is NULL, a
	 * model of a family that needs it is refused by
	 * llm_model_check_backend, naming the op, before any compute.
	 * attention_ex: attention with O's score divisor, softcap and window
	 * (struct llm_attn_opts); with div sqrtf(d_head), no cap and no window,
	 * the same bits as attention.
	 * add_bias: x[i] += w, w an F32 vector (1, x.cols), every row.
	 * geglu: out = gelu_tanh(gate) * up, elementwise, gelu_tanh(g) =
	 * 0.5 g (1 + tanh(sqrt(2 / pi) (g + 0.044715 g^3))).
	 * scale: x *= s. softcap: x = tanh(x / cap) * cap, elementwise. */
	enum llm_status (*attention_ex)(struct llm_backend *be, struct llm_view out, struct llm_view q,
	                                struct llm_kv *kv, int layer, const struct llm_batch *b, int n_head,
	                                const struct llm_attn_opts *o);
	enum llm_status (*add_bias)(struct llm_backend *be, struct llm_view x, const struct llm_weight *w);
	enum llm_status (*geglu)(struct llm_backend *be, struct llm_view out, struct llm_view gate,
	                         struct llm_view up);
	enum llm_status (*scale)(struct llm_backend *be, struct llm_view x, float s);
	enum llm_status (*softcap)(struct llm_backend *be, struct llm_view x, float cap);
	/* Optional (NULL: the caller's loop). Run FN(CTX, i, N) once for every
	 * i < N on the host threads the backend owns (the CPU backend's pool),
	 * as llm_pool_run does: host work of a step that splits by rows, such
	 * as sampling the logits that came back. */
	void (*host_for)(struct llm_backend *be, int n, void (*fn)(void *ctx, int i, int n), void *ctx);
};

struct llm_backend {
	const struct llm_backend_ops *ops;
	void *priv;                 /* the backend's own state */
	int n_threads;              /* threads in use (CPU) */
	enum llm_cpu_isa isa;       /* CPU: the level in use */
};

extern const struct llm_backend_ops llm_cpu_ops;
#ifdef LLM_CUDA
/* kernels/cuda_ops.c, in libllm_cuda.so: llm_backend_open loads it (backend.c) */
extern const struct llm_backend_ops llm_cuda_ops;
#endif

/* Open a backend by spec: "auto" (cuda:0 if built with CUDA and a device is
 * present, else cpu), "cpu", "cuda" or "cuda:N". O may be NULL (defaults).
 * Without CUDA support "cuda" fails with LLM_ERR_UNSUPPORTED "built without
 * CUDA support", and so does it, naming libllm_cuda.so, when that library
 * cannot be loaded; nothing falls back silently. *BE is owned by the caller and
 * released with llm_backend_close(). */
enum llm_status llm_backend_open(const char *spec, const struct llm_backend_opts *o,
                                 struct llm_backend **be);
void llm_backend_close(struct llm_backend *be);
/* CUDA devices visible (0 without CUDA support, driver or device; loads
 * libllm_cuda.so only when the driver is there), and device DEV's free
 * memory (cudaMemGetInfo, through that library). */
int llm_backend_cuda_devices(void);
enum llm_status llm_backend_cuda_mem_free(int dev, size_t *bytes);
/* LLM_ERR_UNSUPPORTED naming the op and dtype when the backend lacks it. */
enum llm_status llm_backend_require(struct llm_backend *be, enum llm_op op,
                                    enum llm_dtype w, enum llm_dtype act);
const char *llm_op_name(enum llm_op op);

/* ---- CPU kernels, exposed for the op tests ---------------------------- */

/* y[t * y_stride + r] = sum_c x[t * x_stride + c] * W[r, c] for t < n_tok and
 * r in [r0, r1), with the kernel of level ISA (falls back to the best lower
 * level that handles w->dtype). Single-threaded. */
void llm_cpu_matmul_rows(enum llm_cpu_isa isa, float *y, int64_t y_stride,
                         const float *x, int64_t x_stride, int64_t n_tok,
                         const struct llm_weight *w, int64_t r0, int64_t r1);
/* At level LLM_ISA_AVX512BF16 (BF16 and E4M3 weights) the kernels read x
 * rounded to bf16: llm_cpu_x_to_bf16 rounds (nearest even) n_tok rows once,
 * llm_cpu_matmul_rows_bf16x multiplies them (same results as
 * llm_cpu_matmul_rows at that level, which rounds internally). */
void llm_cpu_x_to_bf16(uint16_t *dst, int64_t dst_stride, const float *x, int64_t x_stride,
                       int64_t n_tok, int64_t cols);
void llm_cpu_matmul_rows_bf16x(float *y, int64_t y_stride, const uint16_t *xb, int64_t xb_stride,
                               int64_t n_tok, const struct llm_weight *w, int64_t r0, int64_t r1);
/* E4M3 weights at level LLM_ISA_AVX512BF16 take AVX512_VBMI byte permutes
 * where the CPU has them, with the same results. ON 1 or 0 forces them on
 * (if present) or off, -1 asks; returns whether they are used. */
int llm_cpu_matmul_vbmi(int on);
/* The level that llm_cpu_matmul_rows(ISA, ...) really uses for dtype T. */
enum llm_cpu_isa llm_cpu_matmul_isa(enum llm_cpu_isa isa, enum llm_dtype t);
/* Row r of W dequantized to f32 (cols floats). */
void llm_weight_row_f32(const struct llm_weight *w, int64_t r, float *out);
/* Dot product of n floats at level ISA (attention scores). */
float llm_cpu_dot(enum llm_cpu_isa isa, const float *a, const float *b, int64_t n);
/* e^x within 2 ulp, the same bits at every ISA (inputs clamped to [-87, 88]). */
float llm_cpu_exp(float x);
/* Softmax of a[0..n) in place (max subtracted, llm_cpu_exp, the sum in 16
 * lanes then a fixed tree: the same bits at every ISA); returns the sum. */
float llm_cpu_softmax(enum llm_cpu_isa isa, float *a, int64_t n);
/* o[i] = (g[i] * (1 / (1 + llm_cpu_exp(-g[i])))) * u[i]: SwiGLU. */
void llm_cpu_silu_mul(enum llm_cpu_isa isa, float *o, const float *g, const float *u, int64_t n);
/* Attention over N_POS cached positions, rows K_STRIDE / V_STRIDE elements
 * apart, of dtype DT, for NH heads that share them (1 to 4; their q and out
 * rows D apart, their scores ATT_STRIDE apart): att[p] = llm_cpu_dot(isa,
 * q, k_p, d) / scale bit for bit, and out[i] = fmaf(att[p], v_p[i], out[i])
 * (AVX-512) or out[i] + att[p] * v_p[i] with the product rounded (AVX2) for
 * p in order, each head as if alone; the weighted sum for the columns [C0,
 * C1) of each head's D (C0 and C1 multiples of 8 below AVX-512), each
 * column's bits whatever the range. An E4M3 row p reads as
 * llm_cpu_e4m3_rows gives it: element i is e4m3(code_i) * K_SCALE[p *
 * K_SCALE_STRIDE] (V_SCALE for values; both unused for F32 and BF16), so
 * the bits are those of the f32 rows it would decode to. Each key and
 * value row is read once for the NH heads. False (nothing done) where
 * llm_cpu_attn_reads(isa, dt, d) is false, where the caller decodes the
 * rows to f32 or runs per-position loops. */
bool llm_cpu_attn_reads(enum llm_cpu_isa isa, enum llm_dtype dt, int d);
bool llm_cpu_attn_scores(enum llm_cpu_isa isa, float *att, size_t att_stride, const float *q, int nh,
                         const void *k, enum llm_dtype dt, int64_t k_stride, const float *k_scale,
                         size_t k_scale_stride, int n_pos, int d, float scale);
bool llm_cpu_attn_wsum(enum llm_cpu_isa isa, float *out, int nh, const float *att, size_t att_stride,
                       const void *v, enum llm_dtype dt, int64_t v_stride, const float *v_scale,
                       size_t v_scale_stride, int n_pos, int d, int c0, int c1);
/* N_ROWS rows of an E4M3 cache (codes SRC_STRIDE bytes apart, D each; one
 * scale per row, SCALE_STRIDE floats apart) to f32 DST (n_rows, d):
 * llm_e4m3_to_f32(code) * scale, the same bits at every ISA. */
void llm_cpu_e4m3_rows(enum llm_cpu_isa isa, float *dst, const uint8_t *src, size_t src_stride,
                       const float *scale, size_t scale_stride, int n_rows, int d);

/* N BF16 elements to f32 DST (exact: each widened and shifted up 16) */
void llm_cpu_bf16_rows(enum llm_cpu_isa isa, float *dst, const uint16_t *src, size_t n);

#endif
