/* common/engine/generate.h: the inference engine every tool drives: the model
 * (mmap'd checkpoint), a backend with its thread pool, the paged KV cache
 * and the activation buffers, all sized at open (llm_engine_plan() reports
 * the sizes), and one forward step at a time (llm_engine_forward()).
 *
 * Requests are not the engine's: the scheduler (scheduler.h: continuous
 * batching with Dynamic SplitFuse, preemption, prefix caching) queues them,
 * plans each step over the engine's cache and samples; llm-serve and
 * llm-generate both drive it, scoring and perplexity too (score.h).
 *
 * Batch invariance: a sequence's logits do not depend on the other
 * sequences of a step (kernels with fixed reduction order), so greedy
 * output for a prompt is the same alone or among others.
 *
 * Distributed runs (mpirun -np T*P over a checkpoint partitioned by
 * llm-repartition --tp T --pp P; partition.h): open maps this rank's file.
 * One protocol serves every tool: rank 0 alone reads the input, plans and
 * samples; after llm_engine_serve_begin() each llm_engine_forward() of rank
 * 0 broadcasts the step (the KV operations made since the last one through
 * llm_engine_kv_*, then the batch), and the other ranks, in
 * llm_engine_serve_worker(), replay the KV operations on their caches and
 * run the same forward; logits reach rank 0 only. Distributed ranks compute
 * on the CPU backend ("auto" means cpu there). Greedy tokens equal the
 * single-process run; logits agree within f32 rounding (the all-reduce sums
 * in another order). The library never prints; errors are statuses with
 * llm_errmsg(). An engine is used from one thread at a time. */
#ifndef LLM_GENERATE_H
#define LLM_GENERATE_H

#include "model.h"
#include "sampler.h"

enum llm_finish {
	LLM_FINISH_NONE = 0,   /* the request goes on */
	LLM_FINISH_LENGTH,     /* max_tokens or the context reached */
	LLM_FINISH_STOP,       /* a stop id or stop string */
	LLM_FINISH_EOS,        /* the model's end-of-sequence id */
	LLM_FINISH_CANCEL,     /* llm_sched_cancel() or the callback said stop */
	LLM_FINISH_ERROR,      /* the request failed (non-finite logits): the event's error says why */
};
const char *llm_finish_name(enum llm_finish f);   /* "length", "stop", ... */

/* Where the CPU reads the weights from. */
enum llm_weight_pages {
	LLM_WEIGHTS_AUTO,           /* HUGE on the cpu backend where the kernel has THP (the copy read in
	                               the background: llm_engine_weights_settle), else MAP */
	LLM_WEIGHTS_MAP,            /* in place in the checkpoint's file mapping: no copy */
	LLM_WEIGHTS_HUGE,           /* copied into transparent huge pages (llm_model_copy_weights) */
};
/* "auto", "map" or "huge"; -1 for anything else. */
int llm_weight_pages_parse(const char *s);
/* The lm_head's dtype in memory (llm_model_fp8_head). */
enum llm_lm_head {
	LLM_HEAD_AUTO,              /* FP8 on the cpu backend when the checkpoint holds FP8 weights (a
	                               BF16 head of an FP8 file, as the peers write it), else FILE */
	LLM_HEAD_FILE,              /* as the checkpoint stores it */
	LLM_HEAD_FP8,               /* FP8 E4M3, one scale per row, quantized at load when plain */
};
/* The tools' --lm-head: "auto", "file" or "fp8" into *H; LLM_ERR_USAGE
 * naming the flag and its value. */
enum llm_status llm_lm_head_parse(const char *s, enum llm_lm_head *h);
/* The tools' --kv-dtype (f32, bf16 or fp8) and --weight-pages (auto, map
 * or huge) into *KV and *WP; LLM_ERR_USAGE naming the flag and its value. */
enum llm_status llm_engine_flags_parse(const char *kv_dtype, const char *weight_pages, enum llm_dtype *kv,
                                       enum llm_weight_pages *wp);

struct llm_engine_opts {
	const char *backend;        /* "auto", "cpu", "cuda[:N]" */
	int n_threads;              /* 0: every CPU */
	enum llm_cpu_isa isa;       /* LLM_ISA_AUTO: best, or $LLM_CPU_ISA */
	enum llm_dtype kv_dtype;    /* LLM_DTYPE_F32, LLM_DTYPE_BF16 or LLM_DTYPE_E4M3 (fp8) */
	int kv_block_size;          /* positions per KV block */
	int64_t kv_blocks;          /* 0: kv_seqs x min(n_ctx, 4096) positions (memplan.h sizes it from
	                               the memory or the prompts) */
	int kv_seqs;                /* 0 (or over max_seqs): max_seqs */
	int max_seqs;               /* sequences in flight */
	int n_ctx;                  /* 0: max_position_embeddings */
	int max_batch_tokens;       /* tokens per forward step (the step budget) */
	int max_logits;             /* 0: max(max_seqs, 64), at most max_batch_tokens */
	struct llm_comm *comm;      /* the ranks of a distributed run; NULL: llm_comm_world()
	                               (NULL before llm_comm_init: one process) */
	const char *const *lora;    /* (n_lora) PEFT LoRA adapters loaded at open (lora.h), each
	                               "NAME=DIR" or "DIR" (named by DIR's base name), into slots
	                               1 .. n_lora in order; a batch token picks one (llm_batch.adapter) */
	int n_lora;
	int lora_runtime;           /* adapters may be loaded later (llm_engine_lora_load): with
	                               n_lora, backend "auto" means cpu */
	enum llm_weight_pages weight_pages;
	enum llm_lm_head lm_head;   /* the lm_head in memory (AUTO: decided at open by the backend) */
	int check_weights;          /* 1: refuse weights holding NaN or Inf (llm_ckpt_check_finite) at open */
	int kv_keep;                /* under a sliding window: positions held behind it besides
	                               (llm_kv_set_keep; a draft model's roll-back depth); 0 */
};
#define LLM_ENGINE_OPTS_DEFAULT { .backend = "auto", .isa = LLM_ISA_AUTO, \
	.kv_dtype = LLM_DTYPE_BF16, .kv_block_size = 16, .max_seqs = 8, .max_batch_tokens = 512 }

/* Memory the engine holds besides code (weights mapped or, copied into huge
 * pages, the same bytes). */
struct llm_mem_plan {
	size_t weight_bytes;        /* every weight and scale of the checkpoint in use */
	int n_expert, n_expert_used;   /* a mixture of experts: experts a layer, chosen a token (else 0) */
	size_t expert_bytes;        /* of weight_bytes, the experts' (a token reads n_expert_used of
	                               n_expert of them; the routers are not counted here) */
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

/* ---- LoRA adapters ------------------------------------------------------ */

/* Load the PEFT adapter in DIR as NAME into a free slot (1 ..
 * LLM_LORA_SLOTS; *SLOT may be NULL). Refused with the reason: a name
 * already in use (LLM_ERR_EXISTS) or empty, longer than 63 bytes or with
 * '=' or a control byte (LLM_ERR_USAGE), every slot taken (LLM_ERR_RANGE),
 * a backend other than cpu or a distributed engine (LLM_ERR_UNSUPPORTED),
 * and whatever llm_lora_load refuses (a tensor of another shape or rank
 * than the model's, naming it). Nothing changes on failure. */
enum llm_status llm_engine_lora_load(struct llm_engine *e, const char *name, const char *dir, int *slot);
/* The same with the adapter's files already read (llm_lora_load with the
 * engine's config, by another thread: the engine's thread never waits on a
 * file): on success the engine takes *LO (left zeroed); on failure it is
 * the caller's still. */
enum llm_status llm_engine_lora_add(struct llm_engine *e, const char *name, const char *dir, struct llm_lora *lo,
                                    int *slot);
/* Free slot SLOT's adapter (its name too). The caller makes sure no
 * request uses it any more (llm_sched_lora_unload checks its own). */
void llm_engine_lora_unload(struct llm_engine *e, int slot);
/* What scoring and perplexity (score.h) run with: the first adapter
 * loaded at open (slot 1, while it is loaded; as one --lora applies to
 * everything), else 0, the base. */
int llm_engine_lora_default(const struct llm_engine *e);
/* The slot of adapter NAME, or 0 when none has that name. */
int llm_engine_lora_find(const struct llm_engine *e, const char *name);
/* Slot SLOT's name and directory (NULL for the base or a free slot), and
 * its rank (0 then). */
const char *llm_engine_lora_name(const struct llm_engine *e, int slot);
const char *llm_engine_lora_dir(const struct llm_engine *e, int slot);
int llm_engine_lora_rank(const struct llm_engine *e, int slot);

/* ---- requests (the scheduler's, scheduler.h) ---------------------------- */

struct llm_token_event {
	int req;                    /* id from llm_sched_add() */
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
	const char *error;          /* FINISH_ERROR (token -1): the one-line reason; else NULL */
};

struct llm_request {
	const int32_t *prompt;      /* copied by llm_sched_add(); at least one token */
	int n_prompt;
	struct llm_sample_params params;   /* stop strings copied too */
	/* Called for each generated token (a stop id or EOS token included, with
	 * finish set and no text). Return nonzero to cancel the request: no
	 * further events. May be NULL. */
	int (*on_token)(void *user, const struct llm_token_event *ev);
	void *user;
	/* Scoring (log-likelihood, perplexity): with score_from >= 1, the
	 * log-prob of each prompt token from index score_from on, from the
	 * logits of the position before it, goes to on_score once, in order
	 * (IS_ARGMAX: the token was the greedy choice, the lowest id among
	 * equals). A nonzero return cancels the request. */
	int score_from;
	int (*on_score)(void *user, int index, int32_t token, double logprob, int is_argmax);
	/* Prompt log-probs (echo, prompt_logprobs, decoder_input_details):
	 * with score_from >= 1 and on_prompt_lp given instead of on_score,
	 * each scored prompt token's log-prob, its RANK among the vocabulary
	 * by logit (1: the greedy choice; equal logits rank by id) and the
	 * score_top (at most LLM_MAX_LOGPROBS) best tokens, best first. */
	int score_top;
	int (*on_prompt_lp)(void *user, int index, int32_t token, double logprob, int rank,
	                    const struct llm_logprob *top, int n_top);
	/* Nothing is generated: the prompt but its last token is computed (the
	 * last one is only scored), then one event with token -1 and finish
	 * LLM_FINISH_LENGTH ends the request. Needs 2 prompt tokens or more. */
	int prefill_only;
	/* n_shared > 0: the first n_shared prompt tokens are those of request
	 * PARENT (an id of the same scheduler, given earlier): this request
	 * waits until the parent has computed them and forks its KV blocks
	 * instead of computing them again (the parent's sequence is kept for
	 * its children after it ends). n_shared must leave a token to compute
	 * and, when scoring, stop before score_from. */
	int parent, n_shared;
	/* The engine's LoRA slot the request runs with (llm_engine_lora_find);
	 * 0: the base. A child (n_shared) has its parent's. */
	int adapter;
};

/* ---- one step --------------------------------------------------------- */

/* Forward B through the engine's cache (sequences from llm_engine_kv_new()
 * and friends); *LOGITS points at n_out rows of n_vocab floats, valid until
 * the next call. At most max_batch_tokens tokens and max_logits logit rows.
 * On rank 0 of a distributed engine after llm_engine_serve_begin() the
 * step goes to every rank first. */
enum llm_status llm_engine_forward(struct llm_engine *e, const struct llm_batch *b,
                                   const float **logits, int *n_out);
/* With weight_pages AUTO on the CPU, the huge-page copy of the weights
 * (LLM_WEIGHTS_HUGE) is read on a thread of its own after the first
 * forward, so the first token does not wait for it; steps read the file
 * mapping until a later forward finds it done and moves to it (the same
 * bytes: results do not change). This starts it now if it has not
 * started (a server, idle before its first request), and with WAIT waits
 * for it and moves to it (a benchmark, so no timed step runs beside it). */
void llm_engine_weights_settle(struct llm_engine *e, int wait);
/* Run FN(CTX, i, N) for every i < N on the backend's host threads (the
 * CPU backend's pool; elsewhere a loop on the caller): work that splits by
 * rows between forwards, such as sampling. FN's result for i must not
 * depend on which thread runs it. */
void llm_engine_host_for(struct llm_engine *e, int n, void (*fn)(void *ctx, int i, int n), void *ctx);
/* Whether the engine can sample where the logits are: its backend has a
 * sample op (backend.h; the CUDA backend), the run is one process and
 * $LLM_CUDA_SAMPLE is not 0. */
int llm_engine_can_sample(const struct llm_engine *e);
/* Forward B as llm_engine_forward, but leave the logits in the backend's
 * memory and sample each of the n_out rows there with ROWS[i] (sampler.h;
 * the planner made one per row): IDS and LOGPROB get the backend's sample
 * op's results (ids < 0: a row with non-finite logits). LLM_ERR_UNSUPPORTED
 * where llm_engine_can_sample is false. */
enum llm_status llm_engine_forward_sample(struct llm_engine *e, const struct llm_batch *b,
                                          const struct llm_sample_row *rows, int32_t *ids, float *logprob,
                                          int *n_out);

/* ---- the step protocol of distributed runs ----------------------------- */

/* The KV operations of a step's planner (scheduler.c, score.c) on the
 * engine's cache, the llm_kv_* calls of the same names. On rank 0 of a
 * distributed engine that is leading (llm_engine_serve_begin) each one that
 * succeeds is also journaled, and the next llm_engine_forward() broadcasts
 * the journal with its batch: the other ranks (llm_engine_serve_worker)
 * replay it on their own caches (their layers and kv heads), so block
 * tables stay identical on every rank. */
enum llm_status llm_engine_kv_new(struct llm_engine *e, int *seq);
enum llm_status llm_engine_kv_fork(struct llm_engine *e, int src, int32_t n, int *dst);
void llm_engine_kv_free(struct llm_engine *e, int seq);
enum llm_status llm_engine_kv_reserve(struct llm_engine *e, int seq, int32_t n);
/* Forget positions >= N of SEQ (llm_kv_seq_truncate): speculative decoding's
 * rejected drafts. */
void llm_engine_kv_truncate(struct llm_engine *e, int seq, int32_t n);

/* Traffic of the step protocol, as seen by this rank: steps followed (or led), KV
 * operations and batch tokens in them, bytes broadcast by rank 0 (step
 * headers and payloads: 16 B per KV operation, 13 B per token). */
struct llm_serve_stats {
	int64_t steps, kv_ops, tokens;
	uint64_t bytes;
};

/* Rank 0 of a distributed engine: start leading the other ranks (every
 * tool: llm-serve's engine thread, llm-generate's modes). Collective with the other
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
/* Distributed: every rank's traffic, gathered (collective: every rank
 * calls it) and, on rank 0, appended to OUT as lines of text: per rank the
 * steps, micro-batches and bytes per token over each link, the steps each
 * rank led or followed, and with pipeline stages the boundary's bytes
 * against unfused and unsliced sends. One process (without LLM_DIST=always):
 * nothing. */
struct llm_buf;
enum llm_status llm_engine_traffic(struct llm_engine *e, struct llm_buf *out);

/* A tool over ranks (every rank runs the tool with the same flags): rank
 * 0 reads the input and knows O's max_seqs, kv_seqs and kv_blocks then; it calls
 * llm_engine_lead_open, which sends them to the other ranks, opens the
 * engine on every rank and starts leading. The other ranks call
 * llm_engine_follow with the same O (its sizes replaced by rank 0's): it
 * opens, follows rank 0's steps until llm_engine_lead_close, appends the
 * traffic report to TRAFFIC when not NULL (llm_engine_traffic, collective:
 * rank 0 passes TRAFFIC too or neither does), and closes. When opening
 * fails anywhere, *FIRST is the lowest failing rank: that rank's status
 * and message are its own, the others' LLM_ERR_COMM ("rank N failed to
 * open"), so a tool reports it once (from rank FIRST). One process: the
 * lead calls are llm_engine_open / llm_engine_close. */
enum llm_status llm_engine_lead_open(struct llm_engine **e, const char *path, const struct llm_engine_opts *o,
                                     int *first);
enum llm_status llm_engine_lead_close(struct llm_engine *e, struct llm_buf *traffic);
enum llm_status llm_engine_follow(const char *path, const struct llm_engine_opts *o, struct llm_buf *traffic,
                                  int *first);

#endif
