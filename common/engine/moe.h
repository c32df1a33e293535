/* common/engine/moe.h: the mixture-of-experts FFN of Mixtral and Qwen3-MoE,
 * written in the backend's ops (moe.c).
 *
 * Per token x (a row of the FFN's input, the post-attention norm's output):
 *   p = softmax(router . x) over the n_expert experts (in double),
 *   the top k = n_expert_used experts by p (equal p: the lower index first),
 *   w_j = p_j / sum of the top k's p (norm_topk: Mixtral always, Qwen3-MoE
 *   when norm_topk_prob) or p_j,
 *   y = sum_j w_j * down_j(silu(gate_j(x)) * up_j(x)),
 * as Hugging Face MixtralSparseMoeBlock and Qwen3MoeSparseMoeBlock compute
 * it. Each expert runs once per step over the rows routed to it (gathered),
 * and an expert no row chose is not touched: its weights are never read.
 *
 * Batch invariance: a row's matmuls are its own (backend.h), and its k
 * contributions are added in ascending expert index, starting from zero,
 * whatever else is in the batch: a token gives the same bits alone or in
 * any batch. The routing and the weighted sum run on the host: the backend's
 * memory must be host memory (the cpu backend; llm_model_check_backend
 * refuses others). Tensor parallel: each rank holds a slice of every expert's
 * FFN columns (gate and up rows, down columns) and the whole router, so
 * every rank routes alike and y is a partial sum, all-reduced as the dense
 * FFN's down_proj is. */
#ifndef LLM_MOE_H
#define LLM_MOE_H

#include "status.h"
#include "config.h"
#include "ckpt.h"
#include "backend.h"

/* A layer's experts; router.data NULL: a dense layer (no experts). */
struct llm_moe_weights {
	struct llm_weight router;   /* (n_expert, d_model) */
	struct llm_weight *expert;  /* (n_expert, 3): expert e's gate (d_ff_e, d_model) at 3e,
	                               up (d_ff_e, d_model) at 3e + 1, down (d_model, d_ff_e) at 3e + 2;
	                               d_ff_e is this rank's slice of d_ff_expert */
};

/* The MoE FFN's activations for batches of up to max_tok rows. */
struct llm_moe_scratch {
	int max_tok;
	float *logit;               /* (max_tok, n_expert) router logits */
	float *xe, *ye;             /* (max_tok, d_model) an expert's input rows, its output rows */
	float *ge, *ue;             /* (max_tok, d_ff_expert) its gate and up */
	float *acc;                 /* (max_tok, d_model) the weighted sum */
	float *wt;                  /* (max_tok, n_expert_used) the chosen experts' weights */
	int32_t *sel;               /* (max_tok, n_expert_used) the chosen experts, by weight */
	int32_t *rows;              /* (max_tok * n_expert_used) the rows of expert 0, then of expert 1, ... */
	float *rw;                  /* (max_tok * n_expert_used) their weights */
	int32_t *start;             /* (n_expert + 1) expert e's rows at rows[start[e] .. start[e + 1]) */
};

/* Floats of backend memory the scratch of C takes (0 for a dense model). */
size_t llm_moe_scratch_floats(const struct llm_config *c, int max_tok);
/* Point S at P (llm_moe_scratch_floats(c, max_tok) floats of backend
 * memory, owned by the caller) and allocate its host index arrays.
 * Nothing to do for a dense model. LLM_ERR_NOMEM. */
enum llm_status llm_moe_scratch_init(struct llm_moe_scratch *s, const struct llm_config *c, float *p,
                                     int max_tok);
void llm_moe_scratch_free(struct llm_moe_scratch *s);

/* What the FFN calls right after each matmul of an expert (PROJ 0 gate,
 * 1 up, 2 down): Y += a term of X, both that expert's gathered rows, which
 * are the rows ROWS (N, ascending) of the FFN's input. The LoRA adapters of
 * the experts (model.c), which so change only the rows routed to them. */
struct llm_moe_hook {
	void (*fn)(void *ctx, int expert, int proj, struct llm_view y, struct llm_view x, const int32_t *rows,
	           int64_t n);
	void *ctx;
};

/* X (n, d_model) = the MoE FFN of layer weights W over the rows of X
 * (n <= s->max_tok), in place. HOOK may be NULL. */
enum llm_status llm_moe_ffn(struct llm_backend *be, const struct llm_moe_config *mc,
                            const struct llm_moe_weights *w, struct llm_moe_scratch *s, struct llm_view x,
                            const struct llm_moe_hook *hook);

#endif
