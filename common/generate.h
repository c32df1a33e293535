/* common/generate.h: the inference engine a tool drives: batched generation
 * with per-request sampling and streaming, scoring, perplexity.
 *
 * An engine owns the model (mmap'd checkpoint), a backend with its thread
 * pool, the paged KV cache and the activation buffers, all sized at open
 * (llm_engine_plan() reports the sizes). Requests are queued with
 * llm_engine_submit() and advanced by llm_engine_step(): one forward pass
 * over at most max_batch_tokens tokens, decode tokens of running requests
 * first, then prefill chunks of the others (admission in submission order,
 * when a sequence slot and KV blocks for the whole request are free). Each
 * generated token is reported through the request's callback.
 *
 * Batch invariance: a request's tokens and log-probs do not depend on the
 * other requests (kernels with fixed reduction order, per-request RNG), so
 * greedy output for a prompt is the same alone or among others.
 *
 * A scheduler of its own (the server's Dynamic SplitFuse) can skip
 * submit/step and drive llm_engine_forward() directly with the engine's
 * cache (llm_engine_kv()). The library never prints; errors are statuses
 * with llm_errmsg(). An engine is used from one thread at a time.
 *
 * Distributed runs (mpirun -np T*P over a checkpoint partitioned by
 * llm-repartition --tp T --pp P; partition.h): when the communicator has
 * more than one rank, open maps this rank's file and every call below that
 * computes is collective: each rank makes the same calls with the same
 * requests in the same order (the tool broadcasts its input), so every
 * rank's engine plans the same steps. Logits reach world rank 0 only; rank
 * 0 samples, and the tokens and finished requests it decides (and its
 * cancellations) are broadcast each step, so every rank's cache and
 * requests advance identically. Callbacks run on rank 0 only; results of
 * llm_score, llm_perplexity and llm_engine_forward's logits are valid on
 * rank 0 only. Distributed ranks compute on the CPU backend ("auto" means
 * cpu there). Greedy tokens equal the single-process run; logits agree
 * within f32 rounding (the all-reduce sums in another order). */
#ifndef LLM_GENERATE_H
#define LLM_GENERATE_H

#include "model.h"
#include "sampler.h"
#include "detok.h"

enum llm_finish {
	LLM_FINISH_NONE = 0,   /* the request goes on */
	LLM_FINISH_LENGTH,     /* max_tokens or the context reached */
	LLM_FINISH_STOP,       /* a stop id or stop string */
	LLM_FINISH_EOS,        /* the model's end-of-sequence id */
	LLM_FINISH_CANCEL,     /* llm_engine_cancel() or the callback said stop */
};
const char *llm_finish_name(enum llm_finish f);   /* "length", "stop", ... */

/* Where the CPU reads the weights from. */
enum llm_weight_pages {
	LLM_WEIGHTS_AUTO,           /* HUGE on the cpu backend where the kernel has THP, else MAP */
	LLM_WEIGHTS_MAP,            /* in place in the checkpoint's file mapping: no copy */
	LLM_WEIGHTS_HUGE,           /* copied into transparent huge pages (llm_model_copy_weights) */
};
/* "auto", "map" or "huge"; -1 for anything else. */
int llm_weight_pages_parse(const char *s);

struct llm_engine_opts {
	const char *backend;        /* "auto", "cpu", "cuda[:N]" */
	int n_threads;              /* 0: every CPU */
	enum llm_cpu_isa isa;       /* LLM_ISA_AUTO: best, or $LLM_CPU_ISA */
	enum llm_dtype kv_dtype;    /* LLM_DTYPE_F32 or LLM_DTYPE_BF16 */
	int kv_block_size;          /* positions per KV block */
	int64_t kv_blocks;          /* 0: max_seqs x min(n_ctx, 4096) positions */
	int max_seqs;               /* sequences in flight */
	int n_ctx;                  /* 0: max_position_embeddings */
	int max_batch_tokens;       /* tokens per forward step (the step budget) */
	int max_logits;             /* 0: max(max_seqs, 64), at most max_batch_tokens */
	struct llm_detok detok;     /* optional */
	int n_eos;                  /* 0: eos_token_id of config.json */
	int32_t eos_ids[16];        /* ids that finish with LLM_FINISH_EOS */
	struct llm_comm *comm;      /* the ranks of a distributed run; NULL: llm_comm_world()
	                               (NULL before llm_comm_init: one process) */
	const char *lora_dir;       /* a PEFT LoRA adapter to apply (lora.h); NULL: none */
	enum llm_weight_pages weight_pages;
};
#define LLM_ENGINE_OPTS_DEFAULT { .backend = "auto", .isa = LLM_ISA_AUTO, \
	.kv_dtype = LLM_DTYPE_F32, .kv_block_size = 16, .max_seqs = 8, .max_batch_tokens = 512 }

/* Memory the engine holds besides code (weights mapped or, copied into huge
 * pages, the same bytes). */
struct llm_mem_plan {
	size_t weight_bytes;        /* every weight and scale of the checkpoint in use */
	size_t kv_bytes_per_token;  /* K+V of one position, all layers */
	int64_t kv_blocks;
	int kv_block_size;
	size_t kv_bytes;            /* the whole pool */
	size_t scratch_bytes;       /* activations for max_batch_tokens */
	size_t logits_bytes;        /* max_logits x n_vocab f32 */
	size_t total;
	int n_ctx, max_seqs, max_batch_tokens;
};

struct llm_engine;

/* Open the checkpoint at PATH and build everything; O may be NULL. */
enum llm_status llm_engine_open(struct llm_engine **e, const char *path,
                                const struct llm_engine_opts *o);
void llm_engine_close(struct llm_engine *e);
/* What open would allocate for model M with options O (for --dry-run). */
void llm_mem_plan(const struct llm_model *m, const struct llm_engine_opts *o, struct llm_mem_plan *p);
void llm_engine_plan(const struct llm_engine *e, struct llm_mem_plan *p);
struct llm_model *llm_engine_model(struct llm_engine *e);
struct llm_backend *llm_engine_backend(struct llm_engine *e);
struct llm_kv *llm_engine_kv(struct llm_engine *e);
int llm_engine_n_ctx(const struct llm_engine *e);

/* ---- generation -------------------------------------------------------- */

struct llm_token_event {
	int req;                    /* id from llm_engine_submit() */
	int index;                  /* 0-based index of the token in the output */
	int32_t token;              /* -1 on a cancel event */
	float logprob;              /* log p(token), raw model distribution */
	int n_top;
	const struct llm_logprob *top;   /* n_top best tokens, best first */
	const char *text;           /* with a detokenizer: text now final (stop */
	size_t text_len;            /*  strings and their possible starts held back) */
	enum llm_finish finish;     /* set on the request's last event */
	int stop_index;             /* FINISH_STOP: the stop id (< n_stop_ids) or
	                               n_stop_ids + the stop string index; else -1 */
};

struct llm_request {
	const int32_t *prompt;      /* copied at submit; at least one token */
	int n_prompt;
	struct llm_sample_params params;   /* stop strings copied at submit */
	/* Called for each generated token (a stop id or EOS token included, with
	 * finish set and no text). Return nonzero to cancel the request: no
	 * further events. May be NULL. */
	int (*on_token)(void *user, const struct llm_token_event *ev);
	void *user;
};

/* Queue a request; *ID identifies it in events. Checks now: params, token
 * ids in the vocabulary (LLM_ERR_RANGE), prompt within the context
 * (LLM_ERR_RANGE "prompt of N tokens exceeds the context of M"), stop
 * strings without a detokenizer (LLM_ERR_USAGE). */
enum llm_status llm_engine_submit(struct llm_engine *e, const struct llm_request *r, int *id);
/* One forward step; *N_PENDING (may be NULL) gets the requests not finished. */
enum llm_status llm_engine_step(struct llm_engine *e, int *n_pending);
/* Step until every request has finished. */
enum llm_status llm_engine_run(struct llm_engine *e);
/* Finish request ID with LLM_FINISH_CANCEL at the next step (an event with
 * token -1). Unknown or finished ids are ignored. */
void llm_engine_cancel(struct llm_engine *e, int id);

/* ---- low level: one step of a scheduler of one's own ------------------- */

/* Forward B through the engine's cache (sequence ids from
 * llm_kv_seq_new(llm_engine_kv(e), ...)); *LOGITS points at n_out rows of
 * n_vocab floats, valid until the next call. At most max_batch_tokens
 * tokens and max_logits logit rows. Sequences used here must not be those of
 * submitted requests. */
enum llm_status llm_engine_forward(struct llm_engine *e, const struct llm_batch *b,
                                   const float **logits, int *n_out);

/* ---- distributed serving: a scheduler of one's own over ranks ---------- */

/* The KV operations of a scheduler of one's own (scheduler.c) on the
 * engine's cache, the llm_kv_* calls of the same names. On rank 0 of a
 * distributed engine that is serving (llm_engine_serve_begin) each one that
 * succeeds is also journaled, and the next llm_engine_forward() broadcasts
 * the journal with its batch: the other ranks (llm_engine_serve_worker)
 * replay it on their own caches (their layers and kv heads), so block
 * tables stay identical on every rank. */
enum llm_status llm_engine_kv_new(struct llm_engine *e, int *seq);
enum llm_status llm_engine_kv_fork(struct llm_engine *e, int src, int32_t n, int *dst);
void llm_engine_kv_free(struct llm_engine *e, int seq);
enum llm_status llm_engine_kv_reserve(struct llm_engine *e, int seq, int32_t n);

/* Traffic of serving, as seen by this rank: steps followed (or led), KV
 * operations and batch tokens in them, bytes broadcast by rank 0 (step
 * headers and payloads: 16 B per KV operation, 13 B per token). */
struct llm_serve_stats {
	int64_t steps, kv_ops, tokens;
	uint64_t bytes;
};

/* Rank 0 of a distributed engine: start serving. Collective with the other
 * ranks' llm_engine_serve_worker(): returns when every rank has opened its
 * engine. From then on every llm_engine_forward() first broadcasts a step
 * (the KV journal, then the batch: tokens, positions, sequences, logit
 * flags, and rank 0's free block count as a check), and the llm_engine_kv_*
 * calls are journaled. A single process: nothing to do, LLM_OK. The
 * communicator is then used by the thread that drives the engine (the
 * server's engine thread), never by two threads at once. */
enum llm_status llm_engine_serve_begin(struct llm_engine *e);
/* Rank 0: end the workers (a STOP step); serving ends. LLM_OK when not
 * serving. */
enum llm_status llm_engine_serve_end(struct llm_engine *e);
/* Ranks other than 0: follow rank 0's steps (replay the KV operations, run
 * the forward pass, whose logits stay on rank 0) until its STOP. A cache
 * that is not in step with rank 0's after a replay is LLM_ERR_INTERNAL
 * (a bug); the caller then ends the job (llm_comm_abort). */
enum llm_status llm_engine_serve_worker(struct llm_engine *e);
void llm_engine_serve_stats(const struct llm_engine *e, struct llm_serve_stats *st);

/* ---- scoring ----------------------------------------------------------- */

/* Log-likelihood of N continuations after one context (lm-eval style).
 * CTX (n_ctx >= 1 tokens) runs once; each continuation forks its cache
 * (blocks shared by reference count, nothing recomputed) and LOGPROB[i] =
 * sum_j log p(cont[i][j] | ctx, cont[i][<j]); IS_GREEDY[i] (may be NULL) is
 * 1 when every continuation token was the argmax. Needs two free sequence
 * slots: call it on an engine with no requests in flight. */
enum llm_status llm_score(struct llm_engine *e, const int32_t *ctx, int n_ctx,
                          const int32_t *const *cont, const int *n_cont, int n,
                          double *logprob, int *is_greedy);

/* Teacher-forced negative log-likelihood of IDS (N text tokens, without BOS)
 * in the scheme of llama.cpp's perplexity and ../shared/reference
 * perplexity.json: the tokens are cut into consecutive chunks of at most
 * CHUNK; each chunk runs as [BOS] + chunk from position 0 in a fresh
 * sequence, and every chunk token is scored (the first from BOS alone).
 * With BOS < 0 a chunk runs alone and its first token is not scored.
 * *NLL = -sum of natural-log probabilities, *COUNT = tokens scored,
 * LOGPROBS (N floats, may be NULL) per token (NAN where not scored). */
enum llm_status llm_perplexity(struct llm_engine *e, const int32_t *ids, int64_t n, int chunk,
                               int32_t bos, double *nll, int64_t *count, float *logprobs);

#endif
