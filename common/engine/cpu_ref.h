/* common/engine/cpu_ref.h: a plain reference of every op of struct llm_backend_ops
 * (backend.h), for the op tests.
 *
 * The optimised CPU backend (backend_cpu.c, cpu_matmul.c) and the CUDA
 * backend are tested against these functions, so they are written to be
 * obviously right, not fast: scalar C, one thread, no SIMD, no table or
 * helper shared with the optimised code (E4M3, F16 and BF16 are decoded
 * here from their bit layouts, the KV cache is addressed from the layout
 * kvcache.h documents). Every reduction (sums of squares, dot products,
 * softmax sums, weighted sums) runs in double, in index order, and each
 * output element is rounded to f32 once, so the reference is the exact
 * result of its definition to within about 2^-24 relative: what a test
 * measures against it is the optimised op's own error.
 *
 * Definitions (Llama as in Hugging Face transformers' modeling_llama.py;
 * llama2.c run.c computes the same): see each function. Dtype rules: inputs
 * are taken as given (f32 activations, weights dequantized exactly as
 * ckpt.h defines them); the reference rounds to a narrower type only where
 * the op's definition stores one (a BF16 KV cache), or where the caller asks
 * it to model a kernel that does (llm_ref_matmul's BF16_IN).
 *
 * All views are host memory, f32 (LLM_ERR_UNSUPPORTED otherwise); shapes
 * that do not agree give LLM_ERR_INTERNAL, out-of-range token ids
 * LLM_ERR_RANGE. Nothing is allocated; nothing is printed. */
#ifndef LLM_CPU_REF_H
#define LLM_CPU_REF_H

#include "backend.h"
#include "kvcache.h"

/* Element (r, c) of W as f32: F32 as stored, F16 and BF16 decoded (exact),
 * E4M3 as its code's value times the scale of its block,
 * scale[(r / block_rows) * scale_cols + c / block_cols], the product
 * rounded to f32 once (ckpt.h). */
float llm_ref_weight_at(const struct llm_weight *w, int64_t r, int64_t c);

/* x rounded to bf16, nearest, ties to even (NaN stays a quiet NaN), as f32. */
float llm_ref_round_bf16(float x);

/* out row i = row tok[i] of EMB (n_vocab, d_model), dequantized:
 * nn.Embedding. Exact. LLM_ERR_RANGE for an id outside [0, emb->rows). */
enum llm_status llm_ref_embed(struct llm_view out, const int32_t *tok, const struct llm_weight *emb);

/* out[i] = w[i] * x[i] / sqrt(mean_j(x[j]^2) + eps), per row: LlamaRMSNorm.
 * The mean, root and products in double, one rounding. OUT may be X. */
enum llm_status llm_ref_rmsnorm(struct llm_view out, struct llm_view x, const struct llm_weight *w,
                                float eps);

/* x += y (f32 additions, exact IEEE rounding: the residual stream is f32),
 * then out = rmsnorm(x); row by row, so OUT may be Y (the model's use). */
enum llm_status llm_ref_add_rmsnorm(struct llm_view out, struct llm_view x, struct llm_view y,
                                    const struct llm_weight *w, float eps);

/* y (n_tok, w->rows) = x (n_tok, w->cols) . W^T: nn.Linear without bias.
 * Products and sum in double, in column order. BF16_IN 0: x and W as
 * given. BF16_IN 1: x and each dequantized element of W (for E4M3: the f32
 * code * scale) are first rounded to bf16, as the kernels that multiply
 * bf16 do (the avx512bf16 CPU level for BF16 and E4M3 weights, the CUDA
 * tensor-core E4M3 tiles, cuBLAS BF16); only their summation order and f32
 * accumulation then differ from this reference. */
enum llm_status llm_ref_matmul(struct llm_view y, struct llm_view x, const struct llm_weight *w,
                               int bf16_in);

/* In place on x (n_tok, n_head * d_head): Hugging Face rotate_half. For
 * each head and j < d_head / 2, the pair (x[j], x[j + d_head/2]) is rotated
 * by the angle a = pos[t] * inv_freq[j] computed as an f32 product (the
 * float32 matmul of LlamaRotaryEmbedding.forward; at deep positions its
 * rounding is part of the definition), then cos a and sin a and the
 * rotation in double, one rounding per output. */
enum llm_status llm_ref_rope(struct llm_view x, const int32_t *pos, int n_head, int d_head,
                             const float *inv_freq);

/* Row t of k and v (n_tok, n_kv_head * d_head) into LAYER of the cache at
 * position b->pos[t] of sequence b->seq[t]: block
 * kv->seq[seq].blk[pos / block_size], slot pos % block_size (kvcache.h),
 * the blocks already reserved (llm_kv_prepare). A BF16 cache stores each
 * element rounded to bf16, nearest even (the cache's dtype defines it). */
enum llm_status llm_ref_kv_store(struct llm_kv *kv, int layer, const struct llm_batch *b,
                                 struct llm_view k, struct llm_view v);

/* rope(q, b->pos, n_head), rope(k, b->pos, n_kv_head), kv_store(k, v). */
enum llm_status llm_ref_rope_store(struct llm_view q, struct llm_view k, struct llm_view v,
                                   struct llm_kv *kv, int layer, const struct llm_batch *b, int n_head,
                                   int n_kv_head, int d_head, const float *inv_freq);

/* Causal self-attention of token t over positions 0..b->pos[t] of its own
 * sequence in LAYER of the paged cache (LlamaAttention, eager): head h
 * reads KV head h / (n_head / n_kv_head) (repeat_kv, grouped-query
 * attention); scores q . k_p / sqrt(d_head), softmax over p (max
 * subtracted), out = sum_p softmax_p v_p; all in double from the stored
 * keys and values (bf16 ones decoded exactly). */
enum llm_status llm_ref_attention(struct llm_view out, struct llm_view q, const struct llm_kv *kv,
                                  int layer, const struct llm_batch *b, int n_head);

/* llm_ref_attention with O's scoring (backend.h, struct llm_attn_opts):
 * scores q . k_p / div, then tanh(s / softcap) * softcap where softcap > 0,
 * over the positions pos - window + 1 .. pos where window > 0. */
enum llm_status llm_ref_attention_ex(struct llm_view out, struct llm_view q, const struct llm_kv *kv,
                                     int layer, const struct llm_batch *b, int n_head,
                                     const struct llm_attn_opts *o);

/* out = gelu_tanh(gate) * up, gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2 / pi)
 * (g + 0.044715 g^3))) (gelu_pytorch_tanh, Gemma's MLP). In double, one
 * rounding. */
enum llm_status llm_ref_geglu(struct llm_view out, struct llm_view gate, struct llm_view up);

/* x = tanh(x / cap) * cap, in double, one rounding. */
enum llm_status llm_ref_softcap(struct llm_view x, float cap);

/* out = silu(gate) * up, silu(g) = g / (1 + e^-g): LlamaMLP's act_fn
 * (SiLU) times up_proj. In double, one rounding. OUT may be GATE or UP. */
enum llm_status llm_ref_swiglu(struct llm_view out, struct llm_view gate, struct llm_view up);

/* x += y: f32 additions (exact IEEE rounding). */
enum llm_status llm_ref_add(struct llm_view x, struct llm_view y);

/* out row i = x row idx[i], for i < out.rows, in order of i (so OUT may be
 * X when idx[i] >= i). Exact. */
enum llm_status llm_ref_gather(struct llm_view out, struct llm_view x, const int32_t *idx);

/* a[i] = e^(a[i] - max) / sum_j e^(a[j] - max) in place, n >= 1, in double:
 * torch.softmax (the attention probabilities; the sampler's). */
void llm_ref_softmax(float *a, int64_t n);

#endif
