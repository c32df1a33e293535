/* common/jobs/score.c: log-likelihood scoring and perplexity as requests of the
 * one scheduler (scheduler.h): prefill-only requests that score their
 * prompt tokens, so scoring shares steps with everything else, runs many
 * items at once and, distributed, is followed by the other ranks like any
 * step.
 *
 * Scores are natural-log probabilities of the raw model distribution
 * (llm_logprob: log-softmax in f64 over the logits row), summed in token
 * order, so a result does not depend on what it was batched with. */
#include "score.h"
#include "tokenizer.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

static int on_cont(void *user, int index, int32_t token, double logprob, int is_argmax)
{
	(void)index;
	(void)token;
	struct llm_score_result *r = user;
	r->logprob += logprob;
	r->is_greedy &= is_argmax;
	r->n_scored++;
	return 0;
}

enum llm_status llm_sched_score_context(struct llm_sched *s, const int32_t *ctx, int n_ctx, int *parent)
{
	*parent = -1;
	if (n_ctx < 1)
		return llm_fail(LLM_ERR_USAGE, "score: empty context");
	if (n_ctx < 2)
		return LLM_OK;
	/* the parent computes the context but its last token, once */
	struct llm_request rq = { .prompt = ctx, .n_prompt = n_ctx, .params = LLM_SAMPLE_DEFAULT, .prefill_only = 1,
	                          .adapter = llm_engine_lora_default(llm_sched_engine(s)) };
	rq.params.temperature = 0;
	return llm_sched_add(s, &rq, parent);
}

enum llm_status llm_sched_score_conts(struct llm_sched *s, int parent, const int32_t *ctx, int n_ctx,
                                      const int32_t *const *cont, const int *n_cont, int n,
                                      struct llm_score_result *res)
{
	int max = 0;
	for (int k = 0; k < n; k++) {
		if (n_cont[k] < 1)
			return llm_fail(LLM_ERR_USAGE, "score: continuation %d is empty", k);
		max = n_cont[k] > max ? n_cont[k] : max;
		res[k] = (struct llm_score_result){ .is_greedy = 1 };
	}
	int32_t *p = malloc(((size_t)n_ctx + (size_t)max) * sizeof *p);
	if (!p)
		return llm_fail(LLM_ERR_NOMEM, "score: out of memory");
	memcpy(p, ctx, (size_t)n_ctx * sizeof *p);
	/* each continuation forks the parent's context and feeds ctx[-1],
	 * cont[0 .. m-2], whose logits score cont[0 .. m-1] */
	enum llm_status st = LLM_OK;
	for (int k = 0; !st && k < n; k++) {
		memcpy(p + n_ctx, cont[k], (size_t)n_cont[k] * sizeof *p);
		struct llm_request rq = { .prompt = p, .n_prompt = n_ctx + n_cont[k], .params = LLM_SAMPLE_DEFAULT,
		                          .prefill_only = 1, .score_from = n_ctx, .on_score = on_cont, .user = &res[k],
		                          .parent = parent, .n_shared = parent >= 0 ? n_ctx - 1 : 0,
		                          .adapter = llm_engine_lora_default(llm_sched_engine(s)) };
		rq.params.temperature = 0;
		st = llm_sched_add(s, &rq, NULL);
		if (st)
			llm_fail_prefix(st, "score: continuation %d", k);
	}
	free(p);
	return st;
}

enum llm_status llm_sched_score(struct llm_sched *s, const int32_t *ctx, int n_ctx,
                                const int32_t *const *cont, const int *n_cont, int n,
                                struct llm_score_result *res)
{
	int parent;
	for (int k = 0; k < n; k++)
		if (n_cont[k] < 1)
			return llm_fail(LLM_ERR_USAGE, "score: continuation %d is empty", k);
	LLM_TRY(llm_sched_score_context(s, ctx, n_ctx, &parent));
	return llm_sched_score_conts(s, parent, ctx, n_ctx, cont, n_cont, n, res);
}

/* The requests that score a whole file run as one scheduler's batch. */
static enum llm_status run_alone(struct llm_engine *e, struct llm_sched **s)
{
	struct llm_mem_plan p;
	llm_engine_plan(e, &p);
	struct llm_sched_opts o = { .max_running = p.max_seqs, .max_batch_tokens = p.max_batch_tokens };
	return llm_sched_open(s, e, &o);
}

enum llm_status llm_score(struct llm_engine *e, const int32_t *ctx, int n_ctx,
                          const int32_t *const *cont, const int *n_cont, int n,
                          double *logprob, int *is_greedy)
{
	struct llm_score_result *r = calloc((size_t)(n > 0 ? n : 1), sizeof *r);
	if (!r)
		return llm_fail(LLM_ERR_NOMEM, "score: out of memory");
	struct llm_sched *s = NULL;
	enum llm_status st = run_alone(e, &s);
	if (!st)
		st = llm_sched_score(s, ctx, n_ctx, cont, n_cont, n, r);
	if (!st)
		st = llm_sched_run(s);
	for (int k = 0; !st && k < n; k++) {
		logprob[k] = r[k].logprob;
		if (is_greedy)
			is_greedy[k] = r[k].is_greedy;
	}
	llm_sched_close(s);
	free(r);
	return st;
}

/* ---- perplexity ---------------------------------------------------------- */

struct ppl_chunk {
	double lp;                  /* sum of the chunk's log-probs, in order */
	float *logprobs;            /* prompt index i's goes to logprobs[base + i] (NULL: nowhere) */
	int64_t base;
};

static int on_ppl(void *user, int index, int32_t token, double logprob, int is_argmax)
{
	(void)token;
	(void)is_argmax;
	struct ppl_chunk *c = user;
	c->lp += logprob;
	if (c->logprobs)
		c->logprobs[c->base + index] = (float)logprob;
	return 0;
}

enum llm_status llm_perplexity(struct llm_engine *e, const int32_t *ids, int64_t n, int chunk,
                               int32_t bos, double *nll, int64_t *count, float *logprobs)
{
	int max_ctx = llm_engine_n_ctx(e);
	*nll = 0;
	*count = 0;
	int lead = bos >= 0;
	if (chunk < 1 || chunk + lead > max_ctx)
		return llm_fail(LLM_ERR_RANGE, "perplexity: chunk of %d tokens%s does not fit the context of %d",
		                chunk, lead ? " + BOS" : "", max_ctx);
	int64_t n_chunk = (n + chunk - 1) / chunk;
	struct ppl_chunk *ch = calloc((size_t)(n_chunk > 0 ? n_chunk : 1), sizeof *ch);
	int32_t *in = malloc(((size_t)chunk + 1) * sizeof *in);
	struct llm_sched *s = NULL;
	enum llm_status st = !ch || !in ? llm_fail(LLM_ERR_NOMEM, "perplexity: out of memory") : run_alone(e, &s);
	for (int64_t c = 0; !st && c < n_chunk; c++) {
		int64_t c0 = c * chunk;
		int m = n - c0 < chunk ? (int)(n - c0) : chunk;
		/* with BOS: [BOS] + chunk, every chunk token scored; without, the
		 * chunk alone and its first token not scored */
		struct llm_request rq = { .prompt = lead ? in : ids + c0, .n_prompt = m + lead,
		                          .params = LLM_SAMPLE_DEFAULT, .prefill_only = 1, .score_from = 1,
		                          .on_score = on_ppl, .user = &ch[c], .adapter = llm_engine_lora_default(e) };
		rq.params.temperature = 0;
		if (logprobs) {
			ch[c].logprobs = logprobs;
			ch[c].base = c0 - lead;
			if (!lead)
				logprobs[c0] = NAN;
		}
		if (lead) {
			in[0] = bos;
			memcpy(in + 1, ids + c0, (size_t)m * sizeof *in);
		}
		if (rq.n_prompt < 2)
			continue;            /* one token alone: nothing to score */
		*count += m - !lead;
		st = llm_sched_add(s, &rq, NULL);
		if (st)
			llm_fail_prefix(st, "perplexity: chunk %lld", (long long)c);
	}
	if (!st)
		st = llm_sched_run(s);
	double total = 0;
	for (int64_t c = 0; !st && c < n_chunk; c++)
		total -= ch[c].lp;
	*nll = total;
	llm_sched_close(s);
	free(in);
	free(ch);
	return st;
}

enum llm_status llm_perplexity_text(struct llm_engine *e, const struct llm_tokenizer *tk, const char *origin,
                                    const char *text, size_t len, int window, struct llm_ppl_result *r)
{
	int32_t *ids;
	size_t n;
	memset(r, 0, sizeof *r);
	enum llm_status s = llm_tokenizer_encode(tk, text, len, false, &ids, &n);
	if (s)
		return llm_fail_prefix(s, "%s", origin);
	int32_t bos = llm_tokenizer_bos(tk);
	r->window = window ? window : llm_engine_n_ctx(e);
	int chunk = bos >= 0 ? r->window - 1 : r->window;
	if (chunk < 1)
		s = llm_fail(LLM_ERR_USAGE, "--ctx-size %d leaves no room for a token", r->window);
	else
		s = llm_perplexity(e, ids, (int64_t)n, chunk, bos, &r->nll, &r->tokens, NULL);
	r->ppl = r->tokens ? exp(r->nll / (double)r->tokens) : NAN;
	free(ids);
	return s;
}

void llm_ppl_result_line(const struct llm_ppl_result *r, const char *origin, int json, char *out, size_t n)
{
	if (json)
		snprintf(out, n, "{\"file\":\"%s\",\"tokens\":%lld,\"window\":%d,\"nll\":%.6f,\"ppl\":%.6f}", origin,
		         (long long)r->tokens, r->window, r->nll, r->ppl);
	else
		snprintf(out, n, "%s: %lld tokens in windows of %d: nll %.6f, perplexity %.4f", origin,
		         (long long)r->tokens, r->window, r->nll, r->ppl);
}
