/* common/serve/memplan.h: how big the KV cache of a serving engine is, and the
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
	/* neither: room for n_seq sequences of seq_tokens positions, in at
	 * most LLM_KV_MEM_FRACTION of the memory free after the weights,
	 * activations and logits (the KV budget). A model windowed on every
	 * layer counts a sequence at what it holds at once (struct
	 * llm_kv_fit's most), for NEED too. */
	int n_seq;
	int64_t seq_tokens;         /* 0: n_ctx; at most n_ctx */
	int64_t need;               /* the cache must hold one sequence of this many positions (0: n_ctx; at most n_ctx) */
	const char *need_what;      /* what NEED is, for messages ("the longest request"); NULL: one context */
	size_t assume;              /* the free memory, pretended (--assume-memory); 0: measured (llm_mem_free) */
	const char *backend;        /* whose memory is measured: "auto", "cpu", "cuda[:N]"; NULL: "auto" */
};
/* --kv-memory and --max-kv-tokens, the same in every tool that takes them
 * (DEFAULT: what neither gives, for --help). */
#define LLM_KV_MEMORY_OPT(dest, DEFAULT) \
	LLM_SIZE(0, "kv-memory", "SIZE", dest, "KV cache size (e.g. 512MiB); default: " DEFAULT)
#define LLM_MAX_KV_TOKENS_OPT(dest) \
	LLM_INT(0, "max-kv-tokens", "N", dest, "KV cache size in token positions (instead of --kv-memory)", 0, INT32_MAX)
/* The usage error of both flags, the same in every tool. */
#define LLM_KV_SIZE_TWICE "--kv-memory and --max-kv-tokens are two ways to say one thing; give one"

/* The share of the free memory the KV cache takes by default: the rest is
 * head room for the process (code, thread stacks, the HTTP buffers, the
 * allocator) and the machine (the page cache, other processes). */
#define LLM_KV_MEM_FRACTION 0.9

/* What the sizing saw and what the cache holds, for the plan and messages. */
struct llm_kv_fit {
	int measured;               /* the default sizing: the fields below up to budget are set */
	size_t available;           /* free memory (bytes) */
	const char *source;         /* where AVAILABLE came from: "MemAvailable", "cudaMemGetInfo", "--assume-memory" */
	size_t budget;              /* LLM_KV_MEM_FRACTION x (available - weights - activations - logits); 0 when negative */
	int64_t budget_seqs;        /* sequences of NEED positions the budget holds (no n_seq cap; each
	                               HOLD positions at once) */
	int64_t need;               /* positions of the sequence asked about (sz->need, or n_ctx) */
	int window;                 /* the sliding window of every layer (llm_config_window_all); 0: none */
	int64_t most;               /* with WINDOW: the positions a sequence holds at once, at most (the
	                               window, max_batch_tokens and two blocks); 0: no window */
	int64_t hold;               /* positions the sequence of NEED holds at once: NEED, at most MOST */
	int64_t seqs;               /* sequences of NEED positions the cache as sized holds at once */
	size_t short_bytes;         /* KV bytes missing for one sequence of NEED (HOLD positions); 0 when it fits */
};

/* The memory free for the engine on BACKEND ("auto", "cpu", "cuda[:N]"):
 * MemAvailable of /proc/meminfo on the CPU; on CUDA (a CUDA build, and
 * "auto" when a device answers) the device's free memory
 * (cudaMemGetInfo). *SOURCE names which. LLM_ERR_IO when it cannot be
 * read; LLM_ERR_USAGE for "cuda" in a build without CUDA. */
enum llm_status llm_mem_free(const char *backend, size_t *bytes, const char **source);

/* Set O's n_ctx (CTX_SIZE, or the model's max_position_embeddings when 0
 * or larger) and kv_blocks from SZ for model M (O's kv dtype, block size,
 * max_batch_tokens and max_logits count), P to the plan of the result and
 * FIT (may be NULL) to what the sizing saw. LLM_ERR_RANGE when the cache
 * holds less than one sequence of SZ's need, with a message naming what to
 * change ("--kv-memory 1GiB holds 1024 tokens, less than one context of
 * 4096: need ...; or --ctx-size 1024"; the default: the memory, the budget
 * and the bytes short); P is then the plan of that smaller cache (its
 * kv_blocks may be 0), never a padded one. LLM_ERR_IO when the free memory
 * cannot be read (the default sizing only). */
enum llm_status llm_kv_size_opts(const struct llm_model *m, int ctx_size, const struct llm_kv_size *sz,
                                 struct llm_engine_opts *o, struct llm_mem_plan *p, struct llm_kv_fit *fit);

/* The plan P of model MODEL as one JSON object (the llm-serve --plan
 * output: sizes in bytes, kv_tokens, the longest context that fits, how
 * many sequences of n_ctx fit, the memory seen and the bytes short, and
 * whether one full context fits), newly allocated; NULL when out of
 * memory. */
char *llm_mem_plan_json(const char *model, const struct llm_mem_plan *p, const struct llm_kv_fit *fit,
                        int max_running, int fits);

/* llm-generate's KV sizing: TOKENS (--max-kv-tokens) or BYTES
 * (--kv-memory), else from the prompts: O's kv_seqs (else max_seqs)
 * sequences of min(n_ctx, max(4096, NEED)) positions each, within the KV
 * budget. The cache must hold one sequence of NEED (the longest prompt
 * with its max_tokens; 0: unknown, the engine's default pool then, and one
 * position with TOKENS or BYTES); else LLM_ERR_RANGE naming the flag and
 * the size needed, or the memory and the bytes short. Opens the model at
 * PATH to count (mapped, or its config.json alone when partitioned: the
 * weights are not counted then) and sets O's kv_blocks. */
enum llm_status llm_kv_size_generate(const char *path, int64_t tokens, size_t bytes, int64_t need,
                                     struct llm_engine_opts *o);

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
