/* common/score.h: log-likelihood scoring (lm-eval style multiple choice)
 * and perplexity, as prefill-only requests of the scheduler (score.c).
 *
 * A context is computed once: its continuations fork its KV blocks (the
 * scheduler's parent/child requests) and each scores its own tokens. */
#ifndef LLM_SCORE_H
#define LLM_SCORE_H

#include "scheduler.h"

#include <signal.h>

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

/* ---- llm-generate --score's items --------------------------------------- */

struct llm_score_item {         /* one line {"context": ..., "continuations": [...]} */
	int line;                   /* 1-based line of the input */
	int32_t *ctx;               /* (n_ctx) the context's tokens, BOS included */
	int n_ctx, n;
	int32_t **cont;             /* (n) each continuation's tokens: those of
	                             * encode(context + continuation) after the context's */
	int *n_cont;                /* (n) */
	size_t *bytes;              /* (n) each continuation's length in UTF-8 bytes */
	struct llm_score_result *res;   /* (n) */
};

/* The items of BUF (LEN bytes, modified: one JSON object per non-empty
 * line), tokenized by TK. Errors name the line and the field. Free with
 * llm_score_items_free. */
enum llm_status llm_score_items_read(char *buf, size_t len, const struct llm_tokenizer *tk,
                                     struct llm_score_item **items, size_t *n);
/* Queue every item on S (llm_sched_score); errors name the line. */
enum llm_status llm_score_items_queue(struct llm_sched *s, struct llm_score_item *items, size_t n);
/* Run S until the N queued ITEMS are scored: after each step PUT gets, in
 * input order, each item whose continuations and those of every item before
 * it are all scored, as one JSON line (llm_score_item_json). When *STOP
 * (may be NULL; a signal handler's flag) turns nonzero between steps it
 * returns at once, the rest unscored and still queued (closing S drops
 * them). *N_DONE: the items handed to PUT. LLM_ERR_NOMEM. */
enum llm_status llm_score_items_run(struct llm_sched *s, struct llm_score_item *items, size_t n,
                                    const volatile sig_atomic_t *stop,
                                    void (*put)(void *user, const char *json), void *user, size_t *n_done);
/* A scored item as one JSON line (no newline): index (line - 1), logprobs,
 * normalized (per byte of the continuation), greedy, tokens. Malloc'd. */
char *llm_score_item_json(const struct llm_score_item *it);
void llm_score_items_free(struct llm_score_item *items, size_t n);

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
