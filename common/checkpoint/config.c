/* common/checkpoint/config.c: parse and check a Llama-family config.json (Hugging Face
 * LlamaConfig / MistralConfig / MixtralConfig fields) into struct llm_config. Anything the
 * engine does not support is refused here, with the field named (config.h). */
#include "config.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include "banned.h"

static enum llm_status get_int(json_t *root, const char *path, const char *key, int required,
                               int64_t min, int64_t max, int def, int *out)
{
	json_t *v = json_object_get(root, key);
	if (!v || json_is_null(v)) {
		if (required)
			return llm_fail(LLM_ERR_FORMAT, "%s: %s: missing", path, key);
		*out = def;
		return LLM_OK;
	}
	if (!json_is_integer(v))
		return llm_fail(LLM_ERR_FORMAT, "%s: %s: not an integer", path, key);
	json_int_t i = json_integer_value(v);
	if (i < min || i > max)
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: %s: %lld is outside [%lld, %lld]", path, key,
		                (long long)i, (long long)min, (long long)max);
	*out = (int)i;
	return LLM_OK;
}

static enum llm_status get_float(json_t *root, const char *path, const char *key, double def,
                                 double min, double max, float *out)
{
	json_t *v = json_object_get(root, key);
	if (!v || json_is_null(v)) {
		*out = (float)def;
		return LLM_OK;
	}
	if (!json_is_number(v))
		return llm_fail(LLM_ERR_FORMAT, "%s: %s: not a number", path, key);
	double d = json_number_value(v);
	if (!(d >= min && d <= max))
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: %s: %g is outside [%g, %g]", path, key, d, min, max);
	*out = (float)d;
	return LLM_OK;
}

/* The mixture-of-experts fields of model_type MT (config.h, struct
 * llm_moe_config); nothing for a dense family. */
static enum llm_status moe_check(struct llm_config *c, json_t *root, const char *path, const char *mt)
{
	struct llm_moe_config *e = &c->moe;
	int qwen = !strcmp(mt, "qwen3_moe");
	if (!qwen && strcmp(mt, "mixtral"))
		return LLM_OK;
	e->names = qwen ? LLM_MOE_NAMES_QWEN3 : LLM_MOE_NAMES_MIXTRAL;
	/* absent fields take the defaults of MixtralConfig / Qwen3MoeConfig */
	LLM_TRY(get_int(root, path, qwen ? "num_experts" : "num_local_experts", 0, 1, 1 << 16, qwen ? 128 : 8,
	                &e->n_expert));
	LLM_TRY(get_int(root, path, "num_experts_per_tok", 0, 1, 1 << 16, qwen ? 8 : 2, &e->n_expert_used));
	if (e->n_expert_used > e->n_expert)
		return llm_fail(LLM_ERR_FORMAT, "%s: num_experts_per_tok: %d is more than the %d experts",
		                path, e->n_expert_used, e->n_expert);
	e->norm_topk = 1;
	e->d_ff_expert = c->d_ff;
	if (!qwen)
		return LLM_OK;
	LLM_TRY(get_int(root, path, "moe_intermediate_size", 0, 1, 1 << 22, 768, &e->d_ff_expert));
	json_t *v = json_object_get(root, "norm_topk_prob");
	if (v && !json_is_null(v) && !json_is_boolean(v))
		return llm_fail(LLM_ERR_FORMAT, "%s: norm_topk_prob: not a boolean", path);
	e->norm_topk = json_is_true(v);       /* Qwen3MoeConfig's default: false */
	int step;
	LLM_TRY(get_int(root, path, "decoder_sparse_step", 0, 1, LLM_MAX_LAYERS, 1, &step));
	for (int l = 0; l < c->n_layer; l++)
		if ((l + 1) % step)
			e->dense[l / 8] |= (unsigned char)(1u << (l % 8));
	v = json_object_get(root, "mlp_only_layers");
	if (v && !json_is_null(v) && !json_is_array(v))
		return llm_fail(LLM_ERR_FORMAT, "%s: mlp_only_layers: not an array", path);
	size_t i;
	json_t *x;
	json_array_foreach(v, i, x) {
		if (!json_is_integer(x) || json_integer_value(x) < 0 || json_integer_value(x) >= c->n_layer)
			return llm_fail(LLM_ERR_FORMAT, "%s: mlp_only_layers[%zu]: not a layer index below %d",
			                path, i, c->n_layer);
		int l = (int)json_integer_value(x);
		e->dense[l / 8] |= (unsigned char)(1u << (l % 8));
	}
	return LLM_OK;
}

static enum llm_status config_check(struct llm_config *c, json_t *root, const char *path)
{
	json_t *v;
	const char *mt = json_string_value(json_object_get(root, "model_type"));
	if (mt && strcmp(mt, "llama") && strcmp(mt, "mistral") && strcmp(mt, "mixtral"))
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: model_type: '%s' is not supported (llama, mistral, mixtral)",
		                path, mt);
	const char *act = json_string_value(json_object_get(root, "hidden_act"));
	if (act && strcmp(act, "silu"))
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: hidden_act: '%s' is not supported (silu)", path, act);
	if (json_is_true(json_object_get(root, "attention_bias")))
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: attention_bias: true is not supported", path);
	if (json_is_true(json_object_get(root, "mlp_bias")))
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: mlp_bias: true is not supported", path);
	LLM_TRY(get_int(root, path, "hidden_size", 1, 1, 1 << 20, 0, &c->d_model));
	LLM_TRY(get_int(root, path, "intermediate_size", 1, 1, 1 << 22, 0, &c->d_ff));
	LLM_TRY(get_int(root, path, "num_hidden_layers", 1, 1, 4096, 0, &c->n_layer));
	LLM_TRY(get_int(root, path, "num_attention_heads", 1, 1, 4096, 0, &c->n_head));
	LLM_TRY(get_int(root, path, "num_key_value_heads", 0, 1, 4096, c->n_head, &c->n_kv_head));
	LLM_TRY(get_int(root, path, "vocab_size", 1, 1, 1 << 24, 0, &c->n_vocab));
	LLM_TRY(get_int(root, path, "max_position_embeddings", 0, 1, 1 << 24, 2048, &c->max_ctx));
	if (c->d_model % c->n_head && !json_object_get(root, "head_dim"))
		return llm_fail(LLM_ERR_FORMAT, "%s: num_attention_heads: %d does not divide hidden_size %d",
		                path, c->n_head, c->d_model);
	LLM_TRY(get_int(root, path, "head_dim", 0, 2, 1024, c->d_model / c->n_head, &c->d_head));
	if (c->d_head % 2)
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: head_dim: %d is odd", path, c->d_head);
	if (c->n_head % c->n_kv_head)
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: num_key_value_heads: %d does not divide num_attention_heads %d",
		                path, c->n_kv_head, c->n_head);
	LLM_TRY(get_float(root, path, "rms_norm_eps", 1e-6, 0.0, 1.0, &c->rms_eps));
	LLM_TRY(get_float(root, path, "rope_theta", 10000.0, 1.0, 1e12, &c->rope_theta));
	v = json_object_get(root, "tie_word_embeddings");
	c->tied = v && json_is_true(v);
	if (v && !json_is_boolean(v))
		return llm_fail(LLM_ERR_FORMAT, "%s: tie_word_embeddings: not a boolean", path);
	v = json_object_get(root, "sliding_window");
	if (v && !json_is_null(v)) {
		if (!json_is_integer(v))
			return llm_fail(LLM_ERR_FORMAT, "%s: sliding_window: not an integer", path);
		if (json_integer_value(v) < c->max_ctx)
			return llm_fail(LLM_ERR_UNSUPPORTED, "%s: sliding_window: %lld is not supported "
			                "(sliding-window attention; null or >= max_position_embeddings)",
			                path, (long long)json_integer_value(v));
	}
	v = json_object_get(root, "rope_scaling");
	c->rope_factor = 1.0f;
	if (v && !json_is_null(v)) {
		if (!json_is_object(v))
			return llm_fail(LLM_ERR_FORMAT, "%s: rope_scaling: not an object", path);
		json_t *ty = json_object_get(v, "rope_type");
		if (!ty)
			ty = json_object_get(v, "type");
		const char *t = json_string_value(ty);
		if (!t)
			return llm_fail(LLM_ERR_FORMAT, "%s: rope_scaling.rope_type: missing", path);
		if (!strcmp(t, "llama3")) {
			char p2[512];
			snprintf(p2, sizeof p2, "%s: rope_scaling", path);
			c->rope_llama3 = 1;
			LLM_TRY(get_float(v, p2, "factor", 8.0, 1.0, 1e6, &c->rope_factor));
			LLM_TRY(get_float(v, p2, "low_freq_factor", 1.0, 1e-6, 1e6, &c->rope_low_freq));
			LLM_TRY(get_float(v, p2, "high_freq_factor", 4.0, 1e-6, 1e6, &c->rope_high_freq));
			LLM_TRY(get_int(v, p2, "original_max_position_embeddings", 0, 1, 1 << 24, 8192,
			                &c->rope_orig_ctx));
			if (!(c->rope_high_freq > c->rope_low_freq))
				return llm_fail(LLM_ERR_FORMAT, "%s: high_freq_factor must exceed low_freq_factor", p2);
		} else if (strcmp(t, "default")) {
			return llm_fail(LLM_ERR_UNSUPPORTED, "%s: rope_scaling.rope_type: '%s' is not supported (llama3)",
			                path, t);
		}
	}
	if (mt)
		LLM_TRY(moe_check(c, root, path, mt));
	c->bos_id = -1;
	v = json_object_get(root, "bos_token_id");
	if (json_is_integer(v))
		c->bos_id = (int32_t)json_integer_value(v);
	v = json_object_get(root, "eos_token_id");
	if (json_is_integer(v)) {
		c->eos_id[c->n_eos++] = (int32_t)json_integer_value(v);
	} else if (json_is_array(v)) {
		size_t i;
		json_t *e;
		json_array_foreach(v, i, e)
			if (json_is_integer(e) && c->n_eos < LLM_MAX_EOS)
				c->eos_id[c->n_eos++] = (int32_t)json_integer_value(e);
	}
	return LLM_OK;
}

enum llm_status llm_config_parse(struct llm_config *c, const char *json, size_t len, const char *path)
{
	memset(c, 0, sizeof *c);
	json_error_t err;
	json_t *root = json_loadb(json, len, 0, &err);
	if (!root)
		return llm_fail(LLM_ERR_FORMAT, "%s: line %d: %s", path, err.line, err.text);
	enum llm_status s = json_is_object(root) ? config_check(c, root, path)
	                    : llm_fail(LLM_ERR_FORMAT, "%s: not a JSON object", path);
	json_decref(root);
	return s;
}
