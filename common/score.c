/* common/score.c: log-likelihood scoring and perplexity as requests of the
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
#include "buf.h"
#include "fileio.h"

#include <jansson.h>
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

enum llm_status llm_sched_score(struct llm_sched *s, const int32_t *ctx, int n_ctx,
                                const int32_t *const *cont, const int *n_cont, int n,
                                struct llm_score_result *res)
{
	if (n_ctx < 1)
		return llm_fail(LLM_ERR_USAGE, "score: empty context");
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
	/* the parent computes the context but its last token, once; each
	 * continuation forks it and feeds ctx[-1], cont[0 .. m-2], whose
	 * logits score cont[0 .. m-1] */
	enum llm_status st = LLM_OK;
	int parent = -1;
	if (n_ctx > 1) {
		struct llm_request rq = { .prompt = p, .n_prompt = n_ctx, .params = LLM_SAMPLE_DEFAULT, .prefill_only = 1 };
		rq.params.temperature = 0;
		st = llm_sched_add(s, &rq, &parent);
	}
	for (int k = 0; !st && k < n; k++) {
		memcpy(p + n_ctx, cont[k], (size_t)n_cont[k] * sizeof *p);
		struct llm_request rq = { .prompt = p, .n_prompt = n_ctx + n_cont[k], .params = LLM_SAMPLE_DEFAULT,
		                          .prefill_only = 1, .score_from = n_ctx, .on_score = on_cont, .user = &res[k],
		                          .parent = parent, .n_shared = parent >= 0 ? n_ctx - 1 : 0 };
		rq.params.temperature = 0;
		st = llm_sched_add(s, &rq, NULL);
		if (st)
			llm_fail_prefix(st, "score: continuation %d", k);
	}
	free(p);
	return st;
}

/* ---- items of llm-generate --score ---------------------------------------- */

static void item_free(struct llm_score_item *it)
{
	for (int k = 0; it->cont && k < it->n; k++)
		free(it->cont[k]);
	free(it->cont);
	free(it->n_cont);
	free(it->bytes);
	free(it->res);
	free(it->ctx);
}

void llm_score_items_free(struct llm_score_item *items, size_t n)
{
	for (size_t i = 0; items && i < n; i++)
		item_free(&items[i]);
	free(items);
}

/* The continuation's tokens are those of encode(context + continuation)
 * after the context's own tokens, as evaluation harnesses cut them. */
static enum llm_status item_read(struct llm_score_item *it, json_t *o, const struct llm_tokenizer *tk)
{
	json_t *ctx = json_object_get(o, "context"), *conts = json_object_get(o, "continuations");
	if (!json_is_string(ctx) || !json_is_array(conts) || !json_array_size(conts))
		return llm_fail(LLM_ERR_USAGE, "needs \"context\" (a string) and \"continuations\" (a non-empty array of strings)");
	size_t nc = json_array_size(conts), n_ctx;
	it->n = (int)nc;
	it->cont = calloc(nc, sizeof *it->cont);
	it->n_cont = calloc(nc, sizeof *it->n_cont);
	it->bytes = calloc(nc, sizeof *it->bytes);
	it->res = calloc(nc, sizeof *it->res);
	if (!it->cont || !it->n_cont || !it->bytes || !it->res)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	LLM_TRY(llm_tokenizer_encode(tk, json_string_value(ctx), json_string_length(ctx), true, &it->ctx, &n_ctx));
	it->n_ctx = (int)n_ctx;
	for (size_t i = 0; i < nc; i++) {
		json_t *c = json_array_get(conts, i);
		if (!json_is_string(c))
			return llm_fail(LLM_ERR_USAGE, "continuations[%zu] is not a string", i);
		struct llm_buf whole = { 0 };
		int32_t *wids = NULL;
		size_t nw;
		enum llm_status s = llm_buf_append(&whole, json_string_value(ctx), json_string_length(ctx));
		if (!s)
			s = llm_buf_append(&whole, json_string_value(c), json_string_length(c));
		if (!s)
			s = llm_tokenizer_encode(tk, whole.p, whole.len, true, &wids, &nw);
		llm_buf_free(&whole);
		if (!s && nw <= n_ctx)
			s = llm_fail(LLM_ERR_USAGE, "continuations[%zu] adds no token", i);
		if (!s && !(it->cont[i] = malloc((nw - n_ctx) * sizeof **it->cont)))
			s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		if (!s) {
			it->n_cont[i] = (int)(nw - n_ctx);
			memcpy(it->cont[i], wids + n_ctx, (nw - n_ctx) * sizeof **it->cont);
			it->bytes[i] = json_string_length(c);
		}
		free(wids);
		if (s)
			return s;
	}
	return LLM_OK;
}

enum llm_status llm_score_items_read(char *buf, size_t len, const struct llm_tokenizer *tk,
                                     struct llm_score_item **items, size_t *n_items)
{
	struct llm_score_item *v = NULL;
	size_t n = 0, cap = 0;
	enum llm_status s = LLM_OK;
	int line = 0;
	for (char *at = buf, *p; !s && (p = llm_next_line(&at, buf + len)); ) {
		line++;
		if (!*p)
			continue;
		if ((s = LLM_ARRAY_RESERVE(v, cap, n + 1)))
			break;
		struct llm_score_item *it = &v[n++];
		memset(it, 0, sizeof *it);
		it->line = line;
		json_error_t je;
		json_t *o = json_loads(p, 0, &je);
		s = o ? item_read(it, o, tk) : llm_fail(LLM_ERR_USAGE, "needs \"context\" (a string) and \"continuations\" "
		                                        "(a non-empty array of strings): %s", je.text);
		json_decref(o);
		if (s)
			llm_fail_prefix(s, "stdin: line %d", line);
	}
	if (s) {
		llm_score_items_free(v, n);
		return s;
	}
	*items = v;
	*n_items = n;
	return LLM_OK;
}

enum llm_status llm_score_items_queue(struct llm_sched *s, struct llm_score_item *items, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct llm_score_item *it = &items[i];
		enum llm_status st = llm_sched_score(s, it->ctx, it->n_ctx, (const int32_t *const *)it->cont, it->n_cont,
		                                     it->n, it->res);
		if (st)
			return llm_fail_prefix(st, "stdin: line %d", it->line);
	}
	return LLM_OK;
}

static int item_scored(const struct llm_score_item *it)
{
	for (int k = 0; k < it->n; k++)
		if (it->res[k].n_scored < it->n_cont[k])
			return 0;
	return 1;
}

enum llm_status llm_score_items_run(struct llm_sched *s, struct llm_score_item *items, size_t n,
                                    const volatile sig_atomic_t *stop,
                                    void (*put)(void *user, const char *json), void *user, size_t *n_done)
{
	int pending = 1;
	*n_done = 0;
	while (*n_done < n) {
		if (stop && *stop)
			return LLM_OK;
		if (pending)
			LLM_TRY(llm_sched_step(s, &pending));
		for (; *n_done < n && item_scored(&items[*n_done]); ++*n_done) {
			char *js = llm_score_item_json(&items[*n_done]);
			if (!js)
				return llm_fail(LLM_ERR_NOMEM, "score: out of memory");
			put(user, js);
			free(js);
		}
		if (!pending && *n_done < n)   /* cannot happen: every request scores all its tokens */
			return llm_fail(LLM_ERR_INTERNAL, "score: line %d: the scheduler finished it unscored", items[*n_done].line);
	}
	return LLM_OK;
}

char *llm_score_item_json(const struct llm_score_item *it)
{
	json_t *r = json_object(), *a = json_array(), *an = json_array(), *g = json_array(), *nt = json_array();
	for (int i = 0; i < it->n; i++) {
		double lp = it->res[i].logprob;
		json_array_append_new(a, json_real(lp));
		json_array_append_new(an, json_real(it->bytes[i] ? lp / (double)it->bytes[i] : lp));
		json_array_append_new(g, json_boolean(it->res[i].is_greedy));
		json_array_append_new(nt, json_integer(it->n_cont[i]));
	}
	json_object_set_new(r, "index", json_integer(it->line - 1));
	json_object_set_new(r, "logprobs", a);
	json_object_set_new(r, "normalized", an);
	json_object_set_new(r, "greedy", g);
	json_object_set_new(r, "tokens", nt);
	char *js = json_dumps(r, JSON_COMPACT);
	json_decref(r);
	return js;
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
		                          .on_score = on_ppl, .user = &ch[c] };
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
