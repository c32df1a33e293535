/* common/checkpoint/config.h: the model configuration, parsed from a Hugging Face
 * config.json (config.c). Below the model: the checkpoint tools
 * (partition.c, lora.c) read it without the forward pass.
 *
 * Supported (anything else is refused by llm_config_parse with the field
 * named): model_type "llama", "mistral" (no sliding window) or "mixtral"
 * (a mixture of experts: struct llm_moe_config), hidden_act
 * "silu", no attention or MLP bias, grouped-query attention
 * (num_key_value_heads dividing num_attention_heads), any head_dim, tied or
 * untied embeddings, rope_scaling null or of type "llama3" or "default". */
#ifndef LLM_CONFIG_H
#define LLM_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"

#define LLM_MAX_EOS 8
#define LLM_MAX_LAYERS 4096

/* A mixture-of-experts FFN (n_expert 0: every layer is dense). Mixtral
 * (model_type "mixtral"): every layer routes each token to n_expert_used
 * of num_local_experts experts of intermediate_size, with the top-k router
 * weights renormalised to sum to 1 (softmax over the top-k logits).
 * The router_aux_loss and jitter fields only matter to training and are
 * ignored. */
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
	int rope_llama3;            /* rope_scaling type llama3 */
	float rope_factor, rope_low_freq, rope_high_freq;
	int rope_orig_ctx;
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

#endif
