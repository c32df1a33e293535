/* common/serve/scheduler.h: the one scheduler of requests: continuous batching with
 * Dynamic SplitFuse over the engine's paged KV cache, with preemption and
 * prefix caching. llm-serve's engine thread and llm-generate's batches both
 * drive it; it drives llm_engine_forward().
 *
 * Every step carries at most max_batch_tokens tokens: first one decode token
 * of each running request (admission order), then chunks of prompts that
 * are still prefilling, the fewest tokens left first, until the budget is
 * spent (a short prompt does not wait behind a long one). A long prompt is thus
 * cut into chunks that share steps with decodes, so steps stay uniform and
 * the running requests' inter-token latency stays bounded (a budget larger
 * than any prompt turns chunking off). A prompt token counts 1 + c / K
 * tokens of the budget at context c, K being the context at which its
 * attention costs what its weight matmuls do (derived from the config),
 * so chunks deep into a long prompt are smaller and cost what early ones
 * do.
 *
 * KV blocks are taken on demand, one step at a time. When a decode token
 * finds the pool empty, prefix-cache entries are evicted first (least
 * recently used), then the youngest running request is preempted: its
 * blocks are freed and it goes back to the front of the queue, to be
 * recomputed from its prompt and the tokens it had produced (its sampler
 * state is kept, so its output does not change). The oldest request can
 * always progress, since a request whose prompt + max_tokens do not fit the
 * whole pool is refused at llm_sched_add(): no deadlock, no crash.
 *
 * Prefix caching: when a prompt has been prefilled, its whole blocks are
 * kept (a forked sequence sharing them, see llm_kv_seq_fork()); a later
 * request whose prompt starts with the same tokens, run with the same LoRA
 * adapter (or both with none: another adapter's keys and values differ),
 * forks those blocks and prefills only the rest. Batch invariance of the
 * kernels makes the result identical to recomputing.
 *
 * LoRA adapters: each request names the engine's slot it runs with
 * (llm_request.adapter); a step mixes requests of any adapters and the
 * base, each token carrying its slot (llm_batch.adapter).
 *
 * Events and finishing rules are those of generate.h (llm_token_event,
 * llm_finish): stop ids, stop strings on the detokenized text, EOS,
 * max_tokens or the context. A request whose logits are not finite (NaN or
 * Inf weights) ends alone with LLM_FINISH_ERROR and the reason in its last
 * event; the others go on. One thread owns a scheduler and its engine.
 *
 * Admission follows vLLM's rule: a prompt must be shorter than the
 * context, and prompt + max_tokens must fit it; max_tokens 0 means up to
 * the context (n_ctx - prompt tokens).
 *
 * Speculative decoding (spec.h, opts.spec): a decoding request feeds its
 * last token and up to n_draft drafted ones in one chunk of the step (they
 * count against max_batch_tokens and the logit rows, after the plain
 * decode tokens' share and before prompt chunks; drafts take only free KV
 * blocks, never preempt), its rows are sampled in order while the token
 * equals the draft, and the positions after the first differing token are
 * truncated (blocks emptied go back to the pool). Outputs are those of
 * plain decoding (spec.h says why). With a draft model (LLM_SPEC_DRAFT,
 * opts.draft) each step begins with the draft engine's own forwards over
 * the decoding requests: its KV sequence per request catches up with the
 * request's ids (the prompt on the first step), then K tokens one at a
 * time; after the target's step its sequence is cut back to the accepted
 * ids. Rows are verified by the rejection rule (spec.h).
 *
 * Distributed engines (generate.h): the scheduler runs on rank 0 only; its
 * cache operations go through llm_engine_kv_*, which a leading engine
 * (llm_engine_serve_begin) mirrors to the other ranks with each step. */
#ifndef LLM_SCHED_H
#define LLM_SCHED_H

#include "generate.h"
#include "detok.h"
#include "tokenizer.h"
#include "spec.h"

struct llm_sched_opts {
	int max_running;            /* requests holding a sequence at once */
	int max_batch_tokens;       /* tokens per step (at most the engine's) */
	int prefix_entries;         /* prefix-cache entries; 0: off */
	struct llm_detok detok;     /* optional; needed for stop strings and text */
	int n_eos;                  /* 0: the model's eos ids */
	int32_t eos_ids[16];
	/* Called (may be NULL) when a request first gets a sequence, with its
	 * user pointer: the end of its queue time. */
	void (*on_admit)(void *user);
	struct llm_spec_opts spec;  /* speculative decoding; zero: off */
	struct llm_engine *draft;   /* spec.mode LLM_SPEC_DRAFT: the draft model's engine
	                             * (llm_sched_draft_open), borrowed; it needs max_running
	                             * sequences and a logit row per request */
};

struct llm_sched_stats {
	int running, waiting;       /* requests with a sequence / queued */
	int64_t kv_blocks_total;
	int64_t kv_blocks_used;     /* held by requests (not only by the prefix cache) */
	int64_t kv_blocks_cached;   /* held by prefix-cache entries */
	int64_t steps, preemptions;
	int64_t prompt_tokens;      /* prompt tokens computed (recompute included) */
	int64_t prefix_hit_tokens;  /* prompt tokens taken from the prefix cache */
	int64_t gen_tokens;
	int last_step_tokens;
	int64_t spec_draft_tokens;     /* drafted tokens fed for verification */
	int64_t spec_accepted_tokens;  /* of those, the ones the target's token equalled */
};

struct llm_sched;

/* E stays owned by the caller and must outlive the scheduler; it must have
 * at least max_running + prefix_entries sequence slots (engine max_seqs). */
enum llm_status llm_sched_open(struct llm_sched **s, struct llm_engine *e, const struct llm_sched_opts *o);
void llm_sched_close(struct llm_sched *s);
/* Queue a request (copied). LLM_ERR_RANGE when the prompt plus max_tokens
 * exceed the context ("prompt of N tokens + max_tokens M exceeds the
 * context of C") or the whole KV pool; LLM_ERR_USAGE for bad parameters. */
enum llm_status llm_sched_add(struct llm_sched *s, const struct llm_request *r, int *id);
/* Finish ID with LLM_FINISH_CANCEL at the next step (one event, token -1);
 * its blocks are freed then. Unknown ids are ignored. */
void llm_sched_cancel(struct llm_sched *s, int id);
/* One step; *N_PENDING (may be NULL) gets the requests not finished. A
 * step with nothing to do returns at once. */
enum llm_status llm_sched_step(struct llm_sched *s, int *n_pending);
/* Step until every request has finished. */
enum llm_status llm_sched_run(struct llm_sched *s);
void llm_sched_stats(const struct llm_sched *s, struct llm_sched_stats *st);
/* O's detokenizer over TK (special tokens left out) and, when O names no
 * EOS ids, the end-of-sequence ids of config C and of TK together (as
 * config.json, tokenizer_config.json and generation_config.json name
 * them). */
void llm_sched_opts_tokenizer(struct llm_sched_opts *o, const struct llm_config *c,
                              const struct llm_tokenizer *tk);
/* The counters of llm_sched_stats as one line of text for -v. */
void llm_sched_summary(const struct llm_sched *s, char *out, size_t n);
/* Open the draft model of spec.draft (PATH) for target engine E with O
 * (the target's backend, threads and KV dtype; max_seqs: the scheduler's
 * max_running, max_batch_tokens its step) less adapters, with a logit row
 * per sequence and the draft's own context: LLM_ERR_FORMAT when its vocabulary differs
 * ("--draft PATH: n_vocab A differs from the model's B"), else
 * llm_engine_open's statuses. Close it with llm_engine_close after the
 * scheduler. */
enum llm_status llm_sched_draft_open(struct llm_engine **d, struct llm_engine *e, const char *path,
                                     const struct llm_engine_opts *o);
/* Drop every prefix-cache entry (their blocks return to the pool). */
void llm_sched_prefix_clear(struct llm_sched *s);
/* The engine S drives. */
struct llm_engine *llm_sched_engine(const struct llm_sched *s);
/* Requests not finished that run with LoRA slot SLOT. */
int llm_sched_lora_users(const struct llm_sched *s, int slot);
/* Unload slot SLOT's adapter (llm_engine_lora_unload) after dropping its
 * prefix-cache entries. Refused while a request not finished uses it
 * (LLM_ERR_EXISTS, "adapter 'NAME' is in use by N requests"): an unload
 * never waits and never cuts a request short. LLM_ERR_RANGE for an empty
 * slot. */
enum llm_status llm_sched_lora_unload(struct llm_sched *s, int slot);

#endif
