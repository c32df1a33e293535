/* common/memplan.c: KV cache sizing and the printed memory plan, and the
 * checks of -m and --ctx-size before a model is loaded (see memplan.h). */
#define _GNU_SOURCE
#include "memplan.h"
#include "fileio.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

/* B bytes for people: MiB from 1 GiB up, else KiB. */
static void human(size_t b, char *out, size_t n)
{
	if (b >= (1u << 30))
		snprintf(out, n, "%.0fMiB", (double)b / (1 << 20) + 0.5);
	else
		snprintf(out, n, "%.0fKiB", (double)b / 1024 + 0.5);
}

enum llm_status llm_kv_size_opts(const struct llm_model *m, int ctx_size, const struct llm_kv_size *sz,
                                 struct llm_engine_opts *o, struct llm_mem_plan *p)
{
	int n_ctx = ctx_size > 0 && ctx_size < m->cfg.max_ctx ? ctx_size : m->cfg.max_ctx;
	o->n_ctx = n_ctx;
	o->kv_blocks = 1;
	llm_mem_plan(m, o, p);       /* the bytes of a position under O */
	size_t per_tok = p->kv_bytes_per_token, bs = (size_t)p->kv_block_size;
	int64_t blocks;
	const char *knob;
	char have[64], need[64];
	if (sz->tokens > 0) {
		blocks = (sz->tokens + (int64_t)bs - 1) / (int64_t)bs;
		knob = "--max-kv-tokens";
		snprintf(have, sizeof have, "%lld", (long long)sz->tokens);
		snprintf(need, sizeof need, "%d", n_ctx);
	} else if (sz->bytes > 0) {
		blocks = (int64_t)(sz->bytes / (per_tok * bs));
		knob = "--kv-memory";
		human(sz->bytes, have, sizeof have);
		human(per_tok * (size_t)n_ctx + per_tok * bs, need, sizeof need);
	} else {
		int64_t full = (int64_t)sz->full_contexts * ((n_ctx + (int64_t)bs - 1) / (int64_t)bs);
		int64_t cap = (int64_t)(sz->default_cap / (per_tok * bs));
		blocks = full < cap ? full : cap;
		knob = "--kv-memory";
		human(sz->default_cap, have, sizeof have);
		snprintf(have + strlen(have), sizeof have - strlen(have), " (the default)");
		human(per_tok * (size_t)n_ctx + per_tok * bs, need, sizeof need);
	}
	if (blocks < 1)
		blocks = 1;
	o->kv_blocks = blocks;
	llm_mem_plan(m, o, p);
	if (blocks * (int64_t)bs < n_ctx)
		return llm_fail(LLM_ERR_RANGE, "%s %s holds %lld tokens, less than one context of %d: need %s %s, or --ctx-size %lld",
		                knob, have, (long long)(blocks * (int64_t)bs), n_ctx, knob, need,
		                (long long)(blocks * (int64_t)bs));
	return LLM_OK;
}

char *llm_mem_plan_json(const char *model, const struct llm_mem_plan *p, int max_running, int fits)
{
	int64_t kv_tokens = p->kv_blocks * p->kv_block_size;
	char *out = NULL;
	if (asprintf(&out, "{\"model\": \"%s\", \"weight_bytes\": %zu, \"kv_bytes_per_token\": %zu, \"kv_block_size\": %d, "
	             "\"kv_blocks\": %lld, \"kv_bytes\": %zu, \"kv_tokens\": %lld, \"activation_bytes\": %zu, "
	             "\"logits_bytes\": %zu, \"total_bytes\": %zu, \"n_ctx\": %d, \"max_running\": %d, "
	             "\"max_batch_tokens\": %d, \"max_context_that_fits\": %lld, \"fits\": %s}",
	             model, p->weight_bytes, p->kv_bytes_per_token, p->kv_block_size, (long long)p->kv_blocks,
	             p->kv_bytes, (long long)kv_tokens, p->scratch_bytes, p->logits_bytes, p->total, p->n_ctx,
	             max_running, p->max_batch_tokens, (long long)(kv_tokens < p->n_ctx ? kv_tokens : p->n_ctx),
	             fits ? "true" : "false") < 0)
		return NULL;
	return out;
}

enum llm_status llm_model_geometry(struct llm_model *m, const char *dir)
{
	char *path = llm_path_join(dir, "config.json"), *json = NULL;
	size_t len;
	enum llm_status s = path ? llm_read_file(path, &json, &len) : llm_fail(LLM_ERR_NOMEM, "out of memory");
	if (!s)
		s = llm_config_parse(&m->cfg, json, len, path);
	if (!s) {
		m->layer_begin = 0;
		m->layer_end = m->cfg.n_layer;
		m->n_kv_head_loc = m->cfg.n_kv_head;
	}
	free(json);
	free(path);
	return s;
}

enum llm_status llm_model_check_args(const char *model, int64_t ctx_size)
{
	if (!strcmp(model, "-"))
		return llm_fail(LLM_ERR_USAGE, "-m -: %s reads a checkpoint from a path, not a stream "
		                "(llm-quantize, llm-repartition, llm-finetune and llm-bench read one)", llm_progname());
	if (ctx_size <= 0)
		return LLM_OK;
	struct llm_ckpt ck;
	struct llm_config c;
	if (llm_ckpt_open_lazy(&ck, model))
		return LLM_OK;
	const struct llm_aux *cj = llm_ckpt_aux(&ck, "config.json");
	enum llm_status s = LLM_OK;
	if (cj && !llm_config_parse(&c, cj->data, cj->len, "config.json") && ctx_size > c.max_ctx)
		s = llm_fail(LLM_ERR_USAGE, "--ctx-size %lld exceeds the model's context of %d (max_position_embeddings)",
		             (long long)ctx_size, c.max_ctx);
	llm_ckpt_close(&ck);
	return s;
}
