/* common/memplan.h: how big the KV cache of a serving engine is, and the
 * memory plan as the tools print it (llm-serve --plan).
 *
 * The engine itself takes a block count (llm_engine_opts.kv_blocks); this
 * is the policy that turns what a user asks for (token positions, bytes, or
 * nothing) into that count for a model, before its weights are loaded. */
#ifndef LLM_MEMPLAN_H
#define LLM_MEMPLAN_H

#include "generate.h"

struct llm_kv_size {
	int64_t tokens;             /* positions asked for (--max-kv-tokens); 0: not asked */
	size_t bytes;               /* bytes asked for (--kv-memory); 0: not asked */
	int full_contexts;          /* neither: this many full contexts ... */
	size_t default_cap;         /* ... in at most this many bytes */
};
#define LLM_KV_DEFAULT_CAP ((size_t)1 << 30)

/* Set O's n_ctx (CTX_SIZE, or the model's max_position_embeddings when 0
 * or larger) and kv_blocks from SZ for model M (O's kv dtype and block size
 * count), and P to the plan of the result. LLM_ERR_RANGE when the cache
 * holds less than one full context, with a message naming what to change
 * ("--kv-memory 1GiB holds 1024 tokens, less than one context of 4096:
 * need ...; or --ctx-size 1024"); P is then the plan of that smaller
 * cache. */
enum llm_status llm_kv_size_opts(const struct llm_model *m, int ctx_size, const struct llm_kv_size *sz,
                                 struct llm_engine_opts *o, struct llm_mem_plan *p);

/* The plan P of model MODEL as one JSON object (the llm-serve --plan
 * output: sizes in bytes, kv_tokens, the longest context that fits and
 * whether one full context does), newly allocated; NULL when out of
 * memory. */
char *llm_mem_plan_json(const char *model, const struct llm_mem_plan *p, int max_running, int fits);

/* The geometry of the whole model of checkpoint directory DIR from its
 * config.json alone (no weights mapped): enough for llm_mem_plan() on a
 * rank that maps only its own share. */
enum llm_status llm_model_geometry(struct llm_model *m, const char *dir);

/* What a tool that runs a model (llm-generate, llm-serve) checks of its -m
 * and --ctx-size before loading anything: MODEL is a path, not the stream
 * "-" (the engine maps the weights and reads the tokenizer files beside
 * them), and CTX_SIZE (0: the model's) is at most the model's context,
 * config.json's max_position_embeddings. LLM_ERR_USAGE with a message
 * naming the flag ("--ctx-size 100000 exceeds the model's context of 512
 * (max_position_embeddings)"); LLM_OK when config.json cannot be read, for
 * opening the model to report. */
enum llm_status llm_model_check_args(const char *model, int64_t ctx_size);

#endif
