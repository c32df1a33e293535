/* common/jobs/eval.h: the evaluation job of llm-generate --eval and --score:
 * multiple-choice items (a context and its endings) scored by
 * log-likelihood through the one scheduler, as lm-eval's HellaSwag task
 * scores them, with accuracy and the whole time measured (eval.c).
 *
 * Guarantees:
 * - Reading and tokenising run in threads started by llm_eval_start, so
 *   the caller opens the engine meanwhile; llm_eval_run joins them.
 * - Each item's context is computed once: its endings fork its KV blocks
 *   (llm_sched_score). The numbers do not depend on the batching (batch
 *   invariance of the kernels), and results come out in input order.
 * - --eval: items are sorted by tokens and cut into batches by a dynamic
 *   program (llm_eval_plan); each batch is queued whole, the next one when
 *   the current has less than one step's tokens left to compute.
 * - Normalised scores divide by the ending's Unicode code points.
 * - Bad items are one error naming the line, or skipped and counted.
 * - Documents (opts.documents: --perplexity --jsonl): a line is a text,
 *   cut into windows as llm_perplexity_text cuts a file ([BOS] + window - 1
 *   tokens, every one scored; without BOS, window tokens and the first not
 *   scored), each window a sequence; the documents are sorted and batched
 *   by the same DP, and a document's numbers equal those of
 *   llm_perplexity_text on its text alone. */
#ifndef LLM_EVAL_H
#define LLM_EVAL_H

#include "score.h"

#include <signal.h>
#include <stdint.h>

struct llm_eval_opts {
	int hellaswag;              /* lm-eval's HellaSwag preprocessing of the release's fields */
	int skip_bad;               /* skip bad items (counted) instead of failing */
	int labels;                 /* read "label"; predictions and accuracy (--eval) */
	int sort;                   /* sort and batch by the DP (--eval); else batches in input order,
	                             * each of as many items as max_seqs sequences hold */
	int theta;                  /* a batch's tokens at least this (the last batch may be smaller) */
	int step_tokens;            /* the scheduler's tokens per step (the DP's cost unit) */
	int max_seqs;               /* sequences of a batch at most (the scheduler's running requests) */
	int threads;                /* tokenising threads (0: the online CPUs, at most 8) */
	int documents;              /* lines are documents {"text": ...} for perplexity */
};

struct llm_eval_item {          /* one line: a context and its endings */
	int line;                   /* 1-based line of the input */
	int label;                  /* -1: none */
	int32_t *ctx;               /* (n_ctx) the context's tokens, BOS included */
	int n_ctx, n;
	int32_t **end;              /* (n) each ending's tokens: those of encode(context +
	                             * ending) after the context's */
	int *n_end;                 /* (n) */
	int *chars;                 /* (n) each ending's length in Unicode code points */
	struct llm_score_result *res;   /* (n) */
	int64_t tokens;             /* tokens computed: n_ctx - 1 + sum n_end */
	int doc;                    /* a document: its windows are the endings; with n_ctx 1 the
	                             * context is BOS, with n_ctx 0 each window is its own context
	                             * (its first token not scored) */
};

struct llm_eval;

/* Read FILE ("-": stdin) in a thread and tokenise its lines with TK in
 * opts->threads threads; returns at once (only allocation fails here). */
enum llm_status llm_eval_start(struct llm_eval **ev, const char *file, const struct llm_tokenizer *tk,
                               const struct llm_eval_opts *o);
/* Documents: the window of positions each document is cut into (the
 * engine's context or less), before llm_eval_run. */
void llm_eval_window(struct llm_eval *ev, int window);
/* Wait for the items (a bad one's error names the line, unless skip_bad),
 * plan the batches and run them on S, handing each item's JSON line
 * (llm_eval_item_json) to PUT in input order as soon as it and those
 * before it are scored. *STOP (may be NULL) nonzero between steps returns
 * at once, the rest unscored (closing S drops them). *N_DONE: items
 * handed to PUT. */
enum llm_status llm_eval_run(struct llm_eval *ev, struct llm_sched *s, const volatile sig_atomic_t *stop,
                             void (*put)(void *user, const char *json), void *user, size_t *n_done);
/* Items read (good ones; 0 before llm_eval_run has joined the readers). */
size_t llm_eval_count(const struct llm_eval *ev);
/* The closing summary of a run on engine E: JSON one object {"summary":
 * true, ...}; else one human line. No newline. A distributed engine of P > 1
 * pipeline stages adds the pipeline bubble of its steps, as the schedule
 * implies it (micro-batches of equal tokens; per step of M micro-batches,
 * each stage idles P - 1 of M + P - 1 slots): (P - 1) steps / (micro +
 * (P - 1) steps), over the whole run (the engine counts steps and
 * micro-batches, not idle time). */
void llm_eval_summary(struct llm_eval *ev, struct llm_engine *e, int json, char *out, size_t n);
void llm_eval_free(struct llm_eval *ev);

/* An item as one JSON line (no newline): a document: index, tokens
 * (scored), windows, nll, ppl (null when no token was scored); else index (line - 1), logprobs,
 * normalized (per code point of the ending), greedy, tokens (each
 * ending's), context_tokens, pred, pred_norm; with a label also label,
 * correct, correct_norm. Malloc'd; NULL when out of memory. */
char *llm_eval_item_json(const struct llm_eval_item *it);

/* The batches of N items of TOKENS[i] tokens and SEQS[i] sequences, in
 * the order ORDER (sorted by tokens): *N_BATCH cuts, END[b] the end
 * (exclusive) of batch b in ORDER. Minimises the sum over batches of
 * ceil(T_b / STEP) + 1 (steps to carry a batch's T_b tokens, plus the one
 * its endings wait for its contexts) subject to T_b >= THETA (or the
 * batch holds all the rest) and its sequences <= MAX_SEQS (or it is one
 * item). END holds N entries. */
enum llm_status llm_eval_plan(const int64_t *tokens, const int *seqs, const size_t *order, size_t n,
                              int64_t theta, int step, int max_seqs, size_t *end, size_t *n_batch);

/* The Unicode code points of UTF-8 text S (LEN bytes): the bytes that do
 * not continue a sequence (10xxxxxx). */
int64_t llm_utf8_chars(const char *s, size_t len);

#endif
