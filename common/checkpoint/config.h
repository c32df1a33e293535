/* common/checkpoint/config.h: the model configuration, parsed from a Hugging Face
 * config.json (config.c). Below the model: the checkpoint tools
 * (partition.c, lora.c) read it without the forward pass.
 *
 * Supported (anything else is refused by llm_config_parse with the field
 * named): the model families of family.h whose row is marked supported
 * (model_type llama, mistral, qwen2, qwen3, gemma2; or, without a
 * model_type, their architectures[0]), each with its own activation
 * (hidden_act / hidden_activation), no attention or MLP bias beyond the
 * family's, grouped-query attention (num_key_value_heads dividing
 * num_attention_heads), any head_dim, tied or untied embeddings,
 * rope_scaling null or of a type the family allows (default, linear,
 * llama3, yarn). A mixture of experts (mixtral, qwen3_moe): struct
 * llm_moe_config. */
#ifndef LLM_CONFIG_H
#define LLM_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"
#include "family.h"

#define LLM_MAX_EOS 8
#define LLM_MAX_LAYERS 4096

/* A mixture-of-experts FFN (n_expert 0: every layer is dense), of a family
 * whose moe trait is set (family.h). Mixtral: every layer routes each token
 * to num_experts_per_tok of num_local_experts experts of intermediate_size,
 * the top-k router weights renormalised to sum to 1 (the softmax over the
 * top-k logits). Qwen3-MoE: num_experts experts of moe_intermediate_size,
 * renormalised when norm_topk_prob is true; layer l is dense (the
 * intermediate_size MLP) when it is in mlp_only_layers or (l + 1) is not a
 * multiple of decoder_sparse_step. router_aux_loss_coef, router_jitter_noise
 * and output_router_logits only matter to training and are ignored. */
enum llm_moe_names {
	LLM_MOE_NAMES_MIXTRAL,      /* block_sparse_moe.gate, .experts.E.w1 (gate) / w3 (up) / w2 (down) */
	LLM_MOE_NAMES_QWEN3,        /* mlp.gate, mlp.experts.E.gate_proj / up_proj / down_proj */
};
struct llm_moe_config {
	int n_expert;               /* num_local_experts / num_experts */
	int n_expert_used;          /* num_experts_per_tok: the top k */
	int d_ff_expert;            /* an expert's FFN width: moe_intermediate_size, else intermediate_size */
	int norm_topk;              /* 1: the top-k weights divided by their sum (Mixtral always) */
	enum llm_moe_names names;
	unsigned char dense[LLM_MAX_LAYERS / 8];   /* bit l: layer l has the dense FFN (d_ff) */
};

struct llm_config {
	int n_layer, n_head, n_kv_head;
	int d_model, d_head, d_ff, n_vocab;
	int max_ctx;                /* max_position_embeddings */
	float rms_eps, rope_theta;
	int tied;                   /* tie_word_embeddings */
	const struct llm_family *fam;   /* the family's traits (family.h); never NULL */
	int window;                 /* sliding_window where the family has one and it is
	                               below max_position_embeddings; 0: none */
	unsigned char sliding[LLM_MAX_LAYERS / 8];   /* bit l: layer l has the window (the family's rule) */
	float attn_softcap;         /* attn_logit_softcapping; 0: none */
	float final_softcap;        /* final_logit_softcapping; 0: none */
	float query_scalar;         /* query_pre_attn_scalar (family.h query_scalar), else d_head */
	float embed_scale;          /* sqrt(hidden_size) in f32 (embed_scale), else 1 */
	enum llm_rope_kind rope_kind;   /* rope_scaling's type (LLM_ROPE_DEFAULT: none) */
	float rope_factor;          /* linear, llama3, yarn: factor; else 1 */
	float rope_low_freq, rope_high_freq;   /* llama3 */
	int rope_orig_ctx;          /* llama3, yarn: original_max_position_embeddings */
	float rope_beta_fast, rope_beta_slow;  /* yarn */
	int rope_truncate;          /* yarn: the correction range rounded outwards (truncate) */
	float rope_attn_factor;     /* yarn: cos and sin scaled by it (attention_factor); else 1 */
	int32_t bos_id;             /* -1: none */
	int n_eos;
	int32_t eos_id[LLM_MAX_EOS];
	struct llm_moe_config moe;
};

/* Whether layer L's FFN is a mixture of experts. */
static inline int llm_moe_layer(const struct llm_config *c, int l)
{
	return c->moe.n_expert > 0 && !(c->moe.dense[l / 8] >> (l % 8) & 1);
}

/* Parse and check config.json (JSON of LEN bytes; PATH names it in errors). */
enum llm_status llm_config_parse(struct llm_config *c, const char *json, size_t len, const char *path);

/* The sliding window of LAYER (its keys at positions > query - window); 0:
 * the layer attends to every earlier position. */
int llm_config_window(const struct llm_config *c, int layer);
/* The window when every layer has it (Mistral's; Qwen2's with
 * max_window_layers 0): then no layer reads a key behind it and the KV
 * cache may release those blocks. 0 when some layer is global (Gemma 2). */
int llm_config_window_all(const struct llm_config *c);
/* What the attention divides q . k by: sqrt(query_scalar) over the square of
 * the YaRN attention factor (q and k each carry it; 1 otherwise). */
float llm_config_attn_div(const struct llm_config *c);

#endif
