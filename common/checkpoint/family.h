/* common/checkpoint/family.h: the model families, one table (family.c) of
 * what each changes against Llama. Below config.c, so the checkpoint tools
 * (llm-quantize --random, partition.c, lora.c) see the same table as the
 * forward pass (model.c), which reads the traits where they matter: there is
 * one forward, not one per family.
 *
 * A family is named by config.json's model_type (and, where model_type is
 * absent, by architectures[0]). Every trait is a difference from
 * LlamaForCausalLM; each one's Hugging Face meaning:
 *   qkv_bias       q_proj, k_proj, v_proj carry a bias (.bias, one per output)
 *   qk_norm        q and k are RMS-normalised per head (self_attn.q_norm /
 *                  k_norm, d_head weights) after the projection, before RoPE
 *   norm_plus_one  every RMSNorm multiplies by (1 + w), w as stored
 *   act            the MLP's gate activation: silu (SwiGLU) or the tanh
 *                  approximation of GELU (GeGLU, gelu_pytorch_tanh)
 *   embed_scale    the embedding is multiplied by sqrt(hidden_size), rounded to
 *                  the activation dtype (f32 here)
 *   attn_softcap   scores = tanh(scores / cap) * cap before the mask and
 *                  softmax (config attn_logit_softcapping; null: none)
 *   final_softcap  logits = tanh(logits / cap) * cap (final_logit_softcapping)
 *   window         sliding-window attention (a query at position i sees keys
 *                  at positions > i - sliding_window): on no layer, on every
 *                  layer (when config.json sets sliding_window below the
 *                  context), on the even-numbered layers, the odd ones
 *                  global, or (Qwen2's and Qwen3's use_sliding_window) on the layers from
 *                  max_window_layers on (config.c config_window says whose
 *                  rule it is); config.c turns the rule into a bit a layer
 *   query_scalar   scores scaled by query_pre_attn_scalar^-0.5, not d_head^-0.5
 *   sandwich       four norms a layer: input_layernorm, post_attention_layernorm
 *                  on the attention output before the residual add,
 *                  pre_feedforward_layernorm, post_feedforward_layernorm on the
 *                  MLP output before the residual add (Llama's
 *                  post_attention_layernorm is the pre-MLP norm)
 *   rope           the rope_scaling types config.json may name
 *   moe            a mixture-of-experts MLP (router, top-k experts)
 *   supported      0: the engine cannot run this family yet (config.c refuses
 *                  it with one line naming it) */
#ifndef LLM_FAMILY_H
#define LLM_FAMILY_H

#include <stddef.h>

enum llm_act { LLM_ACT_SILU, LLM_ACT_GELU_TANH };

enum llm_window {
	LLM_WINDOW_NONE,           /* every layer global */
	LLM_WINDOW_ALL,            /* every layer, when config.json sets sliding_window */
	LLM_WINDOW_EVEN,           /* layers 0, 2, 4, ... sliding, the odd ones global */
	LLM_WINDOW_FROM,           /* with use_sliding_window true: layers max_window_layers
	                              and up sliding, those below global (or as layer_types says) */
};

enum llm_moe {
	LLM_MOE_NONE,
	LLM_MOE_TOPK_RENORM,       /* top-k of the router's softmax, renormalised (Mixtral) */
	LLM_MOE_TOPK_CONFIG,       /* renormalised when config.json's norm_topk_prob is true (Qwen3-MoE) */
};

/* rope_scaling types, as bits of llm_family.rope */
enum llm_rope_kind {
	LLM_ROPE_DEFAULT = 1 << 0, /* none, or "default" */
	LLM_ROPE_LINEAR = 1 << 1,  /* positions divided by factor */
	LLM_ROPE_LLAMA3 = 1 << 2,  /* Llama 3.1's band scaling */
	LLM_ROPE_YARN = 1 << 3,    /* YaRN: interpolation ramp and attention factor */
};

struct llm_family {
	const char *model_type;    /* config.json model_type */
	const char *arch;          /* config.json architectures[0] */
	enum llm_act act;
	unsigned qkv_bias : 1, qk_norm : 1, norm_plus_one : 1, embed_scale : 1;
	unsigned attn_softcap : 1, final_softcap : 1, query_scalar : 1, sandwich : 1;
	enum llm_window window;
	unsigned rope;             /* LLM_ROPE_* bits allowed */
	enum llm_moe moe;
	unsigned supported : 1;
};

/* The family of MODEL_TYPE, or where it is NULL, of architecture ARCH (either
 * may be NULL); NULL when the table has neither. Neither given: llama. */
const struct llm_family *llm_family_find(const char *model_type, const char *arch);
/* The table: N_OUT gets its rows (man pages and --help list them from it). */
const struct llm_family *llm_family_table(int *n_out);
/* The model_types the engine runs, ", "-separated into BUF (for messages). */
const char *llm_family_list(char *buf, size_t size);
/* The name of rope_scaling type bit K ("default", "linear", "llama3", "yarn"). */
const char *llm_rope_kind_name(enum llm_rope_kind k);

#endif
