/* common/checkpoint/family.c: the table of model families (family.h says
 * what each column means). One row a family; the forward pass (model.c)
 * reads these traits, so adding a dense family that only recombines them is
 * a row here. The mixture-of-experts rows run their MLP in moe.c (moe.h). */
#include "family.h"

#include <stdio.h>
#include <string.h>
#include "banned.h"

#define ROPE_ALL (LLM_ROPE_DEFAULT | LLM_ROPE_LINEAR | LLM_ROPE_LLAMA3 | LLM_ROPE_YARN)

static const struct llm_family families[] = {
	/* model_type   architectures[0]       act                 what changes */
	{ "llama",     "LlamaForCausalLM",    LLM_ACT_SILU,       .rope = ROPE_ALL, .supported = 1 },
	{ "mistral",   "MistralForCausalLM",  LLM_ACT_SILU,       .window = LLM_WINDOW_ALL, .rope = ROPE_ALL,
	               .supported = 1 },
	{ "qwen2",     "Qwen2ForCausalLM",    LLM_ACT_SILU,       .qkv_bias = 1, .window = LLM_WINDOW_FROM,
	               .rope = ROPE_ALL, .supported = 1 },
	{ "qwen3",     "Qwen3ForCausalLM",    LLM_ACT_SILU,       .qk_norm = 1, .window = LLM_WINDOW_FROM,
	               .rope = ROPE_ALL, .supported = 1 },
	{ "gemma2",    "Gemma2ForCausalLM",   LLM_ACT_GELU_TANH,  .norm_plus_one = 1, .embed_scale = 1,
	               .attn_softcap = 1, .final_softcap = 1, .window = LLM_WINDOW_EVEN, .query_scalar = 1,
	               .sandwich = 1, .rope = LLM_ROPE_DEFAULT | LLM_ROPE_LINEAR, .supported = 1 },
	/* mixtures of experts (moe.h) */
	{ "mixtral",   "MixtralForCausalLM",  LLM_ACT_SILU,       .window = LLM_WINDOW_ALL, .rope = ROPE_ALL,
	               .moe = LLM_MOE_TOPK_RENORM, .supported = 1 },
	{ "qwen3_moe", "Qwen3MoeForCausalLM", LLM_ACT_SILU,       .qk_norm = 1, .rope = ROPE_ALL,
	               .moe = LLM_MOE_TOPK_CONFIG, .supported = 1 },
};

#define N_FAMILIES ((int)(sizeof families / sizeof *families))

const struct llm_family *llm_family_find(const char *model_type, const char *arch)
{
	if (!model_type && !arch)
		return &families[0];
	for (int i = 0; i < N_FAMILIES; i++)
		if (model_type ? !strcmp(model_type, families[i].model_type) : !strcmp(arch, families[i].arch))
			return &families[i];
	return NULL;
}

const struct llm_family *llm_family_table(int *n_out)
{
	*n_out = N_FAMILIES;
	return families;
}

const char *llm_family_list(char *buf, size_t size)
{
	size_t at = 0;
	buf[0] = '\0';
	for (int i = 0; i < N_FAMILIES; i++) {
		if (!families[i].supported)
			continue;
		int n = snprintf(buf + at, size - at, "%s%s", at ? ", " : "", families[i].model_type);
		if (n < 0 || (size_t)n >= size - at)
			break;
		at += (size_t)n;
	}
	return buf;
}

const char *llm_rope_kind_name(enum llm_rope_kind k)
{
	switch (k) {
	case LLM_ROPE_DEFAULT: return "default";
	case LLM_ROPE_LINEAR: return "linear";
	case LLM_ROPE_LLAMA3: return "llama3";
	case LLM_ROPE_YARN: return "yarn";
	}
	return "?";
}
