/* common/checkpoint/partition.h: tensor x pipeline partitioning of a Llama checkpoint:
 * the plan (which rank holds which slice of which tensor), the partitioned
 * checkpoint on disk (written here by llm-repartition, read by every tool
 * through ckpt.h, ckpt_part.c), and the split the distributed forward pass computes with.
 *
 * Guarantees: a plan is checked completely before anything is written (a
 * refusal names the tensor and the sizes); slices are byte copies, so
 * partitioning and merging back (--tp 1 --pp 1) return the original tensor
 * bytes; a partitioned checkpoint opened whole (llm_ckpt_open) shows the same
 * tensors, names, shapes and bytes as the checkpoint it came from.
 * Layout on disk: man/llm-checkpoint.5 ("Partitioned checkpoints").
 *
 * ---- The split (what the distributed forward pass of issue 6 computes) ----
 *
 * T = --tp, P = --pp; rank r = p * T + t for stage p (0 .. P-1) and TP rank t
 * (0 .. T-1), so the T ranks of a stage are consecutive (one node under
 * mpirun's default by-slot mapping). Stage p holds layers [layer0[p],
 * layer0[p+1]); the embedding lives on stage 0, model.norm and lm_head on
 * stage P-1 (with tied embeddings and no lm_head.weight, stage P-1 also holds
 * model.embed_tokens.weight, its lm_head). Config: H heads, K kv heads, D =
 * d_head, F = d_ff, V = n_vocab. Rank t of a stage holds:
 *
 *   q_proj        rows  [t*H/T*D, (t+1)*H/T*D)   its query heads h in [t*H/T, (t+1)*H/T)
 *   k_proj,v_proj rows  T <= K: [t*K/T*D, (t+1)*K/T*D), kv heads [t*K/T, (t+1)*K/T);
 *                       T >  K: [g*D, (g+1)*D) with g = t*K/T (one kv head,
 *                       replicated on T/K ranks). Either way local query head i
 *                       uses local kv head i / (H/K) (T > K: always head 0), as
 *                       in the single-process model.
 *   o_proj        cols  the columns of its query heads (row-parallel)
 *   gate, up      rows  [t*F/T, (t+1)*F/T)
 *   down_proj     cols  [t*F/T, (t+1)*F/T)            (row-parallel)
 *   experts       each expert's gate and up (Mixtral w1, w3) rows, its down (w2)
 *                 cols, [t*E/T, (t+1)*E/T) for E = the experts' d_ff_expert; the
 *                 router (mlp.gate / block_sparse_moe.gate) whole (replicated),
 *                 so every rank routes alike and the expert sum is a partial
 *                 sum, all-reduced as down_proj's (moe.h)
 *   embed_tokens, lm_head rows [v0(t), v0(t+1)), v0(t) = floor(t*V/T)
 *   norms         whole (replicated)
 *   FP8 "<w>_scale_inv"/"<w>_scale": the scale blocks of its slice (block
 *                 rows or columns); replicated when the weight has a single
 *                 block along the split dimension.
 *   Requirements (refused otherwise): T | H; T | K or K | T; T | F; T | E; each
 *   shard boundary on an FP8 block boundary of its weight; P <= n_layer.
 *
 * Forward on rank (p, t), activations x (n_tok, d_model) f32, replicated on
 * the T ranks of a stage:
 *   stage 0:  x[i] = row tok[i] - v0(t) of its embed slice when the token is
 *             in its vocab range, else 0; all-reduce(sum) over the TP group
 *             (exact: one non-zero addend per element).
 *   per layer: xb = rmsnorm(x); q, k, v = xb . W^T with its slices; RoPE per
 *             head as before; the KV cache holds its stage's layers and its
 *             local kv heads only; attention over its local heads; o =
 *             attn . Wo_slice^T is a partial sum (n_tok, d_model):
 *             all-reduce(sum) over TP, then x += o. FFN the same: partial =
 *             (silu(xb.Wg^T) * xb.Wu^T) . Wd_slice^T, all-reduce, x += .
 *   stage boundary: x is the one tensor sent (the residual stream already
 *             holds the layer output: "residual and hidden state fused").
 *             With T > 1, rank t sends only elements [t*N/T, (t+1)*N/T) of
 *             the flat x (N = n_tok * d_model; any T) to rank (p+1)*T + t,
 *             which all-gathers the T pieces inside its stage (model.c
 *             stage_send/stage_recv): T times fewer bytes on the
 *             link between stages.
 *   last stage: xn = rmsnorm(x); logits slice = xn . LM_slice^T (n_tok,
 *             V_t); the T slices go to world rank 0, which puts them in
 *             vocabulary order and samples (a distributed greedy argmax by
 *             llm_comm_argmax would give the same ids: ties to the lowest id,
 *             as the single-process argmax).
 *   The sums of the all-reduce are in another order than the single-process
 *   dot products, so logits agree within f32 rounding, not bit for bit.
 */
#ifndef LLM_PARTITION_H
#define LLM_PARTITION_H

#include "ckpt.h"

/* The record and the reading of partitioned checkpoints (struct
 * llm_partition, llm_partition_load ...) are in ckpt.h, part of the
 * checkpoint layer (ckpt_part.c). */

/* ---- planning and writing: llm-repartition ----------------------------- */

struct llm_part_opts {
	int tp, pp;                   /* >= 1 */
	const int *layers;            /* (pp) layers per stage, or NULL: balanced */
	int dry_run;                  /* check and print the plan on stdout; write nothing */
	struct llm_ckpt_write_opts write;   /* force; max_shard_size for --tp 1 --pp 1; progress
	                                     * (NULL or the tool's; every rank's file counts) */
};

/* Repartition IN (a checkpoint, partitioned or not) into OUT for tp x pp
 * ranks; tp = pp = 1 writes a plain Hugging Face checkpoint (directory,
 * .safetensors file or "-"), otherwise OUT is a directory with one file per
 * rank plus partition.json and the side files. Every check runs before
 * anything is written; OUT appears only when complete. Peak memory is one
 * chunk (8 MB) plus the writer's buffer. Statuses: LLM_ERR_USAGE for a plan
 * the model does not allow (heads, blocks, layers), LLM_ERR_EXISTS, and
 * those of reading and writing. */
enum llm_status llm_repartition(const char *in, const char *out, const struct llm_part_opts *o);

/* Split N into T near-equal consecutive ranges: range t is
 * [floor(t*N/T), floor((t+1)*N/T)). */
void llm_part_range(int64_t n, int tp, int t, int64_t *start, int64_t *len);

/* Contiguous layers per stage minimizing the largest stage cost, where
 * stage 0 also costs FIRST_EXTRA and stage P-1 LAST_EXTRA; every stage gets
 * at least one layer (needs pp <= n_layer). Ties go to the earlier split.
 * LAYER0 (pp + 1) receives the boundaries. */
enum llm_status llm_part_balance(const int64_t *cost, int n_layer, int64_t first_extra,
                                 int64_t last_extra, int pp, int *layer0);

#endif
