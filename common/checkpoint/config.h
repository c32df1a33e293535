/* common/checkpoint/config.h: the model configuration, parsed from a Hugging Face
 * config.json (config.c). Below the model: the checkpoint tools
 * (partition.c, lora.c) read it without the forward pass.
 *
 * Supported (anything else is refused by llm_config_parse with the field
 * named): model_type "llama" or "mistral" (no sliding window), hidden_act
 * "silu", no attention or MLP bias, grouped-query attention
 * (num_key_value_heads dividing num_attention_heads), any head_dim, tied or
 * untied embeddings, rope_scaling null or of type "llama3" or "default". */
#ifndef LLM_CONFIG_H
#define LLM_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"

#define LLM_MAX_EOS 8

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
};

/* Parse and check config.json (JSON of LEN bytes; PATH names it in errors). */
enum llm_status llm_config_parse(struct llm_config *c, const char *json, size_t len, const char *path);

#endif
