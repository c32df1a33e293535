/* common/score.c: log-likelihood scoring and perplexity over the engine
 * (see generate.h): teacher-forced steps through llm_engine_forward() and
 * the llm_engine_kv_* operations, so a distributed engine's other ranks
 * follow them like any other step (rank 0 alone computes the results).
 *
 * Scores are natural-log probabilities of the raw model distribution
 * (llm_logprob: log-softmax in f64 over the logits row). */
#include "generate.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

/* The arrays of one step; sized from the engine's plan. */
struct feeder {
	struct llm_engine *e;
	int n_vocab, max_tok, max_rows;
	int32_t *tok, *pos, *seq;   /* (max_tok) */
	int8_t *want;               /* (max_tok) a logit row for the token */
};

static enum llm_status feeder_init(struct feeder *f, struct llm_engine *e)
{
	struct llm_mem_plan p;
	llm_engine_plan(e, &p);
	memset(f, 0, sizeof *f);
	f->e = e;
	f->n_vocab = llm_engine_model(e)->cfg.n_vocab;
	f->max_tok = p.max_batch_tokens;
	f->max_rows = (int)(p.logits_bytes / ((size_t)f->n_vocab * sizeof(float)));
	size_t n = (size_t)f->max_tok;
	f->tok = malloc(n * sizeof *f->tok);
	f->pos = malloc(n * sizeof *f->pos);
	f->seq = malloc(n * sizeof *f->seq);
	f->want = malloc(n);
	if (!f->tok || !f->pos || !f->seq || !f->want)
		return llm_fail(LLM_ERR_NOMEM, "score: out of memory");
	return LLM_OK;
}

static void feeder_free(struct feeder *f)
{
	free(f->tok);
	free(f->pos);
	free(f->seq);
	free(f->want);
}

/* Feed TOK[0..n) to SEQ from its current length; for each token i with a
 * TARGET (NULL: none), LP gets log p(target[i]) and GREEDY is cleared when
 * target[i] was not the argmax (ties: the lowest id wins, as greedy
 * sampling picks); LPS (may be NULL) gets each log-prob. */
static enum llm_status feed(struct feeder *f, int seq, const int32_t *tok, int n,
                            const int32_t *target, double *lp, int *greedy, float *lps)
{
	struct llm_kv *kv = llm_engine_kv(f->e);
	int chunk = target ? f->max_rows : f->max_tok;
	size_t nv = (size_t)f->n_vocab;
	for (int i0 = 0; i0 < n; i0 += chunk) {
		int m = n - i0 < chunk ? n - i0 : chunk;
		int32_t p0 = llm_kv_seq_len(kv, seq);
		for (int j = 0; j < m; j++) {
			f->tok[j] = tok[i0 + j];
			f->pos[j] = p0 + j;
			f->seq[j] = seq;
			f->want[j] = target != NULL;
		}
		LLM_TRY(llm_engine_kv_reserve(f->e, seq, m));
		struct llm_batch b = { m, f->tok, f->pos, f->seq, f->want };
		const float *logits;
		int n_out;
		LLM_TRY(llm_engine_forward(f->e, &b, &logits, &n_out));
		for (int j = 0; target && j < n_out; j++) {   /* logits: rank 0 only */
			const float *l = logits + (size_t)j * nv;
			int32_t t = target[i0 + j];
			double v = llm_logprob(l, (int)nv, t);
			*lp += v;
			if (lps)
				lps[i0 + j] = (float)v;
			if (greedy)
				for (size_t k = 0; k < nv; k++)
					if (l[k] > l[t] || (l[k] == l[t] && (int32_t)k < t)) {
						*greedy = 0;
						break;
					}
		}
	}
	return LLM_OK;
}

enum llm_status llm_score(struct llm_engine *e, const int32_t *ctx, int n_ctx,
                          const int32_t *const *cont, const int *n_cont, int n,
                          double *logprob, int *is_greedy)
{
	const struct llm_config *c = &llm_engine_model(e)->cfg;
	int max_ctx = llm_engine_n_ctx(e);
	if (n_ctx < 1)
		return llm_fail(LLM_ERR_USAGE, "score: empty context");
	for (int i = 0; i < n_ctx; i++)
		if (ctx[i] < 0 || ctx[i] >= c->n_vocab)
			return llm_fail(LLM_ERR_RANGE, "score: context token %d: id %d is not in the vocabulary", i, ctx[i]);
	for (int k = 0; k < n; k++) {
		if (n_cont[k] < 1)
			return llm_fail(LLM_ERR_USAGE, "score: continuation %d is empty", k);
		if ((int64_t)n_ctx + n_cont[k] - 1 > max_ctx)
			return llm_fail(LLM_ERR_RANGE, "score: context + continuation %d: %d tokens exceed the context of %d",
			                k, n_ctx + n_cont[k], max_ctx);
		for (int i = 0; i < n_cont[k]; i++)
			if (cont[k][i] < 0 || cont[k][i] >= c->n_vocab)
				return llm_fail(LLM_ERR_RANGE, "score: continuation %d token %d: id %d is not in the vocabulary",
				                k, i, cont[k][i]);
	}
	struct feeder f;
	enum llm_status s = feeder_init(&f, e);
	int base = -1;
	if (!s)
		s = llm_engine_kv_new(e, &base);
	/* the context except its last token, once; the last one goes with each
	 * continuation so its logits score the continuation's first token */
	if (!s && n_ctx > 1)
		s = feed(&f, base, ctx, n_ctx - 1, NULL, NULL, NULL, NULL);
	for (int k = 0; !s && k < n; k++) {
		int fork;
		if ((s = llm_engine_kv_fork(e, base, n_ctx - 1, &fork)))
			break;
		/* inputs: ctx[-1], cont[0..m-2]; targets: cont[0..m-1] */
		int m = n_cont[k];
		int32_t *in = malloc((size_t)m * sizeof *in);
		if (!in) {
			llm_engine_kv_free(e, fork);
			s = llm_fail(LLM_ERR_NOMEM, "score: out of memory");
			break;
		}
		in[0] = ctx[n_ctx - 1];
		memcpy(in + 1, cont[k], (size_t)(m - 1) * sizeof *in);
		double lp = 0;
		int g = 1;
		s = feed(&f, fork, in, m, cont[k], &lp, &g, NULL);
		free(in);
		llm_engine_kv_free(e, fork);
		logprob[k] = lp;
		if (is_greedy)
			is_greedy[k] = g;
	}
	llm_engine_kv_free(e, base);
	feeder_free(&f);
	return s;
}

enum llm_status llm_perplexity(struct llm_engine *e, const int32_t *ids, int64_t n, int chunk,
                               int32_t bos, double *nll, int64_t *count, float *logprobs)
{
	const struct llm_config *c = &llm_engine_model(e)->cfg;
	int max_ctx = llm_engine_n_ctx(e);
	*nll = 0;
	*count = 0;
	int lead = bos >= 0;
	if (chunk < 1 || chunk + lead > max_ctx)
		return llm_fail(LLM_ERR_RANGE, "perplexity: chunk of %d tokens%s does not fit the context of %d",
		                chunk, lead ? " + BOS" : "", max_ctx);
	for (int64_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= c->n_vocab)
			return llm_fail(LLM_ERR_RANGE, "perplexity: token %lld: id %d is not in the vocabulary",
			                (long long)i, ids[i]);
	struct feeder f;
	enum llm_status s = feeder_init(&f, e);
	int32_t *in = malloc(((size_t)chunk + 1) * sizeof *in);
	if (!s && !in)
		s = llm_fail(LLM_ERR_NOMEM, "perplexity: out of memory");
	double total = 0;
	for (int64_t c0 = 0; !s && c0 < n; c0 += chunk) {
		int m = n - c0 < chunk ? (int)(n - c0) : chunk;
		int seq;
		if ((s = llm_engine_kv_new(e, &seq)))
			break;
		double lp = 0;
		if (lead) {       /* inputs [BOS] + chunk[0..m-2], targets chunk[0..m-1] */
			in[0] = bos;
			memcpy(in + 1, ids + c0, (size_t)(m - 1) * sizeof *in);
			s = feed(&f, seq, in, m, ids + c0, &lp, NULL, logprobs ? logprobs + c0 : NULL);
			*count += m;
		} else {          /* inputs chunk[0..m-2], targets chunk[1..m-1] */
			if (logprobs)
				logprobs[c0] = NAN;
			if (m > 1)
				s = feed(&f, seq, ids + c0, m - 1, ids + c0 + 1, &lp, NULL,
				         logprobs ? logprobs + c0 + 1 : NULL);
			*count += m - 1;
		}
		llm_engine_kv_free(e, seq);
		total -= lp;
	}
	free(in);
	feeder_free(&f);
	*nll = total;
	return s;
}
