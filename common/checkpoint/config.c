/* common/checkpoint/config.c: parse and check a config.json (Hugging Face
 * LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config, Gemma2Config,
 * MixtralConfig, Qwen3MoeConfig fields)
 * into struct llm_config, its family's traits from family.c. Anything the
 * engine does not support is refused here, with the field named (config.h). */
#include "config.h"

#include <jansson.h>
#include <math.h>
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

/* The mixture-of-experts fields of a family with the moe trait (config.h,
 * struct llm_moe_config); nothing for a dense family. */
static enum llm_status moe_check(struct llm_config *c, json_t *root, const char *path)
{
	struct llm_moe_config *e = &c->moe;
	int qwen = c->fam->moe == LLM_MOE_TOPK_CONFIG;
	if (c->fam->moe == LLM_MOE_NONE)
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

/* The sliding window and the layers it applies to, by the family's rule
 * (family.h window). Mistral's (every layer) and Gemma 2's (the even layers,
 * 4096 unless set) from sliding_window. Qwen2's and Qwen3's as Hugging
 * Face transformers' Qwen2Config and Qwen3Config set it (the same rule in
 * configuration_qwen2.py and configuration_qwen3.py: the
 * sliding_window is dropped unless use_sliding_window is true, default 4096,
 * and the layer types derived from it are "sliding_attention" for layer
 * indices i >= max_window_layers, default 28, "full_attention" below; a
 * config.json layer_types list, where written, names each layer's type
 * instead). A window at or past the context is none: no key ever leaves it. */
static enum llm_status config_window(struct llm_config *c, json_t *root, const char *path)
{
	const struct llm_family *f = c->fam;
	json_t *v = json_object_get(root, "sliding_window"), *use = json_object_get(root, "use_sliding_window");
	if (v && !json_is_null(v) && !json_is_integer(v))
		return llm_fail(LLM_ERR_FORMAT, "%s: sliding_window: not an integer", path);
	if (use && !json_is_null(use) && !json_is_boolean(use))
		return llm_fail(LLM_ERR_FORMAT, "%s: use_sliding_window: not a boolean", path);
	int set = v && !json_is_null(v);
	if (f->window == LLM_WINDOW_NONE) {
		if (json_is_true(use))
			return llm_fail(LLM_ERR_UNSUPPORTED, "%s: use_sliding_window: true is not supported for %s",
			                path, f->model_type);
		if (set && json_integer_value(v) < c->max_ctx && !use)
			return llm_fail(LLM_ERR_UNSUPPORTED, "%s: sliding_window: %lld is not supported for %s "
			                "(null or >= max_position_embeddings)", path, (long long)json_integer_value(v),
			                f->model_type);
		return LLM_OK;
	}
	if (f->window == LLM_WINDOW_FROM && (!json_is_true(use) || (v && json_is_null(v))))
		return LLM_OK;      /* the config class drops the window, or it is null */
	json_int_t w = set ? json_integer_value(v) : f->window == LLM_WINDOW_ALL ? 0 : 4096;
	if (w < 0 || (set && w == 0))
		return llm_fail(LLM_ERR_FORMAT, "%s: sliding_window: %lld is not a window", path, (long long)w);
	int from = 0;
	if (f->window == LLM_WINDOW_FROM)
		LLM_TRY(get_int(root, path, "max_window_layers", 0, 0, INT32_MAX, 28, &from));
	json_t *types = f->window == LLM_WINDOW_FROM ? json_object_get(root, "layer_types") : NULL;
	if (types && !json_is_null(types) && (!json_is_array(types) || (int)json_array_size(types) != c->n_layer))
		return llm_fail(LLM_ERR_FORMAT, "%s: layer_types: not an array of %d layer types", path, c->n_layer);
	int any = 0;
	for (int l = 0; l < c->n_layer; l++) {
		int on = f->window == LLM_WINDOW_EVEN ? l % 2 == 0 : l >= from;
		if (types && !json_is_null(types)) {
			const char *t = json_string_value(json_array_get(types, (size_t)l));
			if (!t || (strcmp(t, "sliding_attention") && strcmp(t, "full_attention")))
				return llm_fail(LLM_ERR_FORMAT, "%s: layer_types[%d]: not \"sliding_attention\" or "
				                "\"full_attention\"", path, l);
			on = !strcmp(t, "sliding_attention");
		}
		if (on)
			c->sliding[l / 8] |= (unsigned char)(1u << (l % 8));
		any |= on;
	}
	c->window = any && w < c->max_ctx ? (int)w : 0;
	return LLM_OK;
}

/* The family from model_type, else architectures[0]; one line naming
 * either when the table lacks it or the engine does not run it. */
static enum llm_status config_family(struct llm_config *c, json_t *root, const char *path)
{
	char list[256];
	const char *mt = json_string_value(json_object_get(root, "model_type"));
	const char *arch = json_string_value(json_array_get(json_object_get(root, "architectures"), 0));
	const struct llm_family *f = llm_family_find(mt, mt ? NULL : arch);
	const char *key = mt ? "model_type" : "architectures", *name = mt ? mt : arch;
	if (!f)
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: %s: '%s' is not supported (model_type %s)", path, key, name,
		                llm_family_list(list, sizeof list));
	if (!f->supported)
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: %s: '%s' is not supported: %s (model_type %s)", path, key,
		                name, f->moe ? "a mixture of experts" : "not run by this engine",
		                llm_family_list(list, sizeof list));
	c->fam = f;
	return LLM_OK;
}

/* rope_scaling V (an object or null) into C, of a type the family allows */
static enum llm_status config_rope(struct llm_config *c, json_t *v, const char *path)
{
	c->rope_kind = LLM_ROPE_DEFAULT;
	c->rope_factor = 1.0f;
	c->rope_attn_factor = 1.0f;
	if (!v || json_is_null(v))
		return LLM_OK;
	if (!json_is_object(v))
		return llm_fail(LLM_ERR_FORMAT, "%s: rope_scaling: not an object", path);
	json_t *ty = json_object_get(v, "rope_type");
	if (!ty)
		ty = json_object_get(v, "type");
	const char *t = json_string_value(ty);
	if (!t)
		return llm_fail(LLM_ERR_FORMAT, "%s: rope_scaling.rope_type: missing", path);
	char p2[512];
	snprintf(p2, sizeof p2, "%s: rope_scaling", path);
	for (int k = LLM_ROPE_DEFAULT; k <= LLM_ROPE_YARN; k <<= 1)
		if (!strcmp(t, llm_rope_kind_name((enum llm_rope_kind)k)))
			c->rope_kind = (enum llm_rope_kind)k;
	if (strcmp(t, llm_rope_kind_name(c->rope_kind)) || !(c->fam->rope & c->rope_kind)) {
		char allowed[128] = "";
		for (int k = LLM_ROPE_DEFAULT; k <= LLM_ROPE_YARN; k <<= 1)
			if (c->fam->rope & (unsigned)k)
				snprintf(allowed + strlen(allowed), sizeof allowed - strlen(allowed), "%s%s",
				         allowed[0] ? ", " : "", llm_rope_kind_name((enum llm_rope_kind)k));
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: rope_scaling.rope_type: '%s' is not supported for %s (%s)",
		                path, t, c->fam->model_type, allowed);
	}
	switch (c->rope_kind) {
	case LLM_ROPE_DEFAULT:
		break;
	case LLM_ROPE_LINEAR:
		LLM_TRY(get_float(v, p2, "factor", 1.0, 1.0, 1e6, &c->rope_factor));
		break;
	case LLM_ROPE_LLAMA3:
		LLM_TRY(get_float(v, p2, "factor", 8.0, 1.0, 1e6, &c->rope_factor));
		LLM_TRY(get_float(v, p2, "low_freq_factor", 1.0, 1e-6, 1e6, &c->rope_low_freq));
		LLM_TRY(get_float(v, p2, "high_freq_factor", 4.0, 1e-6, 1e6, &c->rope_high_freq));
		LLM_TRY(get_int(v, p2, "original_max_position_embeddings", 0, 1, 1 << 24, 8192, &c->rope_orig_ctx));
		if (!(c->rope_high_freq > c->rope_low_freq))
			return llm_fail(LLM_ERR_FORMAT, "%s: high_freq_factor must exceed low_freq_factor", p2);
		break;
	case LLM_ROPE_YARN: {
		/* Hugging Face _compute_yarn_parameters: the attention factor is
		 * attention_factor, else mscale(factor, mscale) / mscale(factor,
		 * mscale_all_dim) where both are set, else 0.1 ln(factor) + 1 */
		float ms = 0, ms_all = 0;
		LLM_TRY(get_float(v, p2, "factor", 1.0, 1.0, 1e6, &c->rope_factor));
		LLM_TRY(get_int(v, p2, "original_max_position_embeddings", 0, 1, 1 << 24, c->max_ctx, &c->rope_orig_ctx));
		LLM_TRY(get_float(v, p2, "beta_fast", 32.0, 1e-6, 1e6, &c->rope_beta_fast));
		LLM_TRY(get_float(v, p2, "beta_slow", 1.0, 1e-6, 1e6, &c->rope_beta_slow));
		LLM_TRY(get_float(v, p2, "mscale", 0.0, 0.0, 1e6, &ms));
		LLM_TRY(get_float(v, p2, "mscale_all_dim", 0.0, 0.0, 1e6, &ms_all));
		json_t *tr = json_object_get(v, "truncate");
		c->rope_truncate = !tr || !json_is_false(tr);
		double f = c->rope_factor;
#define MSCALE(m) (f <= 1 ? 1.0 : 0.1 * (m) * log(f) + 1.0)
		double af = ms && ms_all ? MSCALE(ms) / MSCALE(ms_all) : MSCALE(1.0);
#undef MSCALE
		LLM_TRY(get_float(v, p2, "attention_factor", af, 1e-6, 1e6, &c->rope_attn_factor));
		break;
	}
	}
	return LLM_OK;
}

/* The gate activation's name (hidden_act, or Gemma's hidden_activation)
 * must be the family's. */
static enum llm_status config_act(const struct llm_config *c, json_t *root, const char *path)
{
	const char *key = "hidden_act", *act = json_string_value(json_object_get(root, key));
	if (c->fam->act == LLM_ACT_GELU_TANH && json_string_value(json_object_get(root, "hidden_activation")))
		act = json_string_value(json_object_get(root, key = "hidden_activation"));
	const char *want = c->fam->act == LLM_ACT_SILU ? "silu" : "gelu_pytorch_tanh";
	if (act && strcmp(act, want))
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: %s: '%s' is not supported for %s (%s)", path, key, act,
		                c->fam->model_type, want);
	return LLM_OK;
}

/* A softcap: absent, the family's default DEF; null or 0, none */
static enum llm_status get_cap(json_t *root, const char *path, const char *key, double def, float *out)
{
	json_t *v = json_object_get(root, key);
	if (v && json_is_null(v)) {
		*out = 0;
		return LLM_OK;
	}
	return get_float(root, path, key, def, 0.0, 1e6, out);
}

static enum llm_status config_check(struct llm_config *c, json_t *root, const char *path)
{
	json_t *v;
	LLM_TRY(config_family(c, root, path));
	const struct llm_family *f = c->fam;
	LLM_TRY(config_act(c, root, path));
	if (!f->qkv_bias && json_is_true(json_object_get(root, "attention_bias")))
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
	/* Gemma2Config's defaults: tied embeddings, both softcaps, a scalar of 256 */
	if (f->sandwich && !v)
		c->tied = 1;
	c->query_scalar = (float)c->d_head;
	if (f->query_scalar)
		LLM_TRY(get_float(root, path, "query_pre_attn_scalar", 256.0, 1e-6, 1e9, &c->query_scalar));
	if (f->attn_softcap)
		LLM_TRY(get_cap(root, path, "attn_logit_softcapping", 50.0, &c->attn_softcap));
	if (f->final_softcap)
		LLM_TRY(get_cap(root, path, "final_logit_softcapping", 30.0, &c->final_softcap));
	c->embed_scale = f->embed_scale ? sqrtf((float)c->d_model) : 1.0f;
	LLM_TRY(config_window(c, root, path));
	LLM_TRY(config_rope(c, json_object_get(root, "rope_scaling"), path));
	LLM_TRY(moe_check(c, root, path));
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

int llm_config_window(const struct llm_config *c, int layer)
{
	return c->sliding[layer / 8] >> (layer % 8) & 1 ? c->window : 0;
}

int llm_config_window_all(const struct llm_config *c)
{
	for (int l = 0; l < c->n_layer; l++)
		if (!llm_config_window(c, l))
			return 0;
	return c->window;
}

float llm_config_attn_div(const struct llm_config *c)
{
	return sqrtf(c->query_scalar) / (c->rope_attn_factor * c->rope_attn_factor);
}
