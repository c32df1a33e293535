/* common/jobs/score.h: log-likelihood scoring (lm-eval style multiple choice)
 * and perplexity, as prefill-only requests of the scheduler (score.c).
 *
 * A context is computed once: its continuations fork its KV blocks (the
 * scheduler's parent/child requests) and each scores its own tokens. */
#ifndef LLM_SCORE_H
#define LLM_SCORE_H

#include "scheduler.h"

struct llm_tokenizer;

struct llm_score_result {       /* one continuation */
	double logprob;             /* sum_j log p(cont[j] | ctx, cont[<j]) */
	int is_greedy;              /* every continuation token was the argmax */
	int n_scored;               /* tokens scored (the continuation's) */
};

/* Queue on S the scoring of N continuations (each >= 1 token) after one
 * context (>= 1 token): RES[i] is filled as the requests run
 * (llm_sched_step / llm_sched_run) and must stay valid until then. Any
 * number of items can be queued before running: they share steps. */
enum llm_status llm_sched_score(struct llm_sched *s, const int32_t *ctx, int n_ctx,
                                const int32_t *const *cont, const int *n_cont, int n,
                                struct llm_score_result *res);
/* The two halves of llm_sched_score, so that many contexts are queued
 * before their continuations (the scheduler admits in order and a
 * continuation waits for its context: queued item by item, one context
 * starts per step). *PARENT: the context's request, -1 for a context of
 * one token (nothing to share). */
enum llm_status llm_sched_score_context(struct llm_sched *s, const int32_t *ctx, int n_ctx, int *parent);
enum llm_status llm_sched_score_conts(struct llm_sched *s, int parent, const int32_t *ctx, int n_ctx,
                                      const int32_t *const *cont, const int *n_cont, int n,
                                      struct llm_score_result *res);

/* One item on engine E alone (a scheduler of E's sizes, run to the end):
 * LOGPROB[i] and IS_GREEDY[i] (may be NULL) of continuation i. */
enum llm_status llm_score(struct llm_engine *e, const int32_t *ctx, int n_ctx,
                          const int32_t *const *cont, const int *n_cont, int n,
                          double *logprob, int *is_greedy);

/* Teacher-forced negative log-likelihood of IDS (N text tokens, without BOS)
 * in the scheme of llama.cpp's perplexity and ../shared/reference
 * perplexity.json: the tokens are cut into consecutive chunks of at most
 * CHUNK; each chunk runs as [BOS] + chunk from position 0 in a fresh
 * sequence, and every chunk token is scored (the first from BOS alone).
 * With BOS < 0 a chunk runs alone and its first token is not scored.
 * The chunks run together, as many at once as E has sequences.
 * *NLL = -sum of natural-log probabilities, *COUNT = tokens scored,
 * LOGPROBS (N floats, may be NULL) per token (NAN where not scored). */
enum llm_status llm_perplexity(struct llm_engine *e, const int32_t *ids, int64_t n, int chunk,
                               int32_t bos, double *nll, int64_t *count, float *logprobs);

/* Perplexity of TEXT (LEN bytes, tokenized without special tokens) in
 * windows of WINDOW positions (0: the engine's context), each [BOS] +
 * window - 1 tokens when the tokenizer has a BOS (llama-perplexity's
 * scheme), else WINDOW tokens; ORIGIN names TEXT in errors and in the
 * result line. */
struct llm_ppl_result {
	double nll, ppl;
	int64_t tokens;
	int window;
};
enum llm_status llm_perplexity_text(struct llm_engine *e, const struct llm_tokenizer *tk, const char *origin,
                                    const char *text, size_t len, int window, struct llm_ppl_result *r);
/* R as llm-generate --perplexity prints it: one JSON object (JSON) or a
 * sentence, no newline. */
void llm_ppl_result_line(const struct llm_ppl_result *r, const char *origin, int json, char *out, size_t n);

#endif
