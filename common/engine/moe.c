/* common/engine/moe.c: the mixture-of-experts FFN (moe.h): routing on the
 * host, each chosen expert's gate, up and down as backend matmuls over the
 * rows routed to it, the weighted sum on the host in a fixed order. */
#include "moe.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

size_t llm_moe_scratch_floats(const struct llm_config *c, int max_tok)
{
	const struct llm_moe_config *e = &c->moe;
	if (e->n_expert == 0)
		return 0;
	size_t t = (size_t)max_tok;
	return t * ((size_t)e->n_expert + 3 * (size_t)c->d_model + 2 * (size_t)e->d_ff_expert +
	            (size_t)e->n_expert_used);
}

enum llm_status llm_moe_scratch_init(struct llm_moe_scratch *s, const struct llm_config *c, float *p,
                                     int max_tok)
{
	const struct llm_moe_config *e = &c->moe;
	memset(s, 0, sizeof *s);
	if (e->n_expert == 0)
		return LLM_OK;
	size_t t = (size_t)max_tok, tk = t * (size_t)e->n_expert_used;
	s->max_tok = max_tok;
	s->logit = p; p += t * (size_t)e->n_expert;
	s->xe = p;    p += t * (size_t)c->d_model;
	s->ye = p;    p += t * (size_t)c->d_model;
	s->acc = p;   p += t * (size_t)c->d_model;
	s->ge = p;    p += t * (size_t)e->d_ff_expert;
	s->ue = p;    p += t * (size_t)e->d_ff_expert;
	s->wt = p;
	s->sel = malloc(tk * sizeof *s->sel);
	s->rows = malloc(tk * sizeof *s->rows);
	s->rw = malloc(tk * sizeof *s->rw);
	s->start = malloc(((size_t)e->n_expert + 1) * sizeof *s->start);
	if (!s->sel || !s->rows || !s->rw || !s->start) {
		llm_moe_scratch_free(s);
		return llm_fail(LLM_ERR_NOMEM, "scratch: out of memory for the experts' routing");
	}
	return LLM_OK;
}

void llm_moe_scratch_free(struct llm_moe_scratch *s)
{
	free(s->sel);
	free(s->rows);
	free(s->rw);
	free(s->start);
	memset(s, 0, sizeof *s);
}

/* Row T's top K experts by softmax probability of LOGIT (n_expert) into
 * SEL, their weights into WT: the probabilities in double (max subtracted),
 * then divided by the top k's sum when NORM. Equal probabilities: the lower
 * index first (a strict > keeps the first seen). */
static void route(const float *logit, int n_expert, int k, int norm, int32_t *sel, float *wt)
{
	double mx = logit[0], sum = 0, top = 0;
	for (int e = 1; e < n_expert; e++)
		if (logit[e] > mx)
			mx = logit[e];
	for (int e = 0; e < n_expert; e++)
		sum += exp((double)logit[e] - mx);
	for (int j = 0; j < k; j++) {
		int best = -1;
		for (int e = 0; e < n_expert; e++) {
			int taken = 0;
			for (int i = 0; i < j; i++)
				taken |= sel[i] == e;
			if (!taken && (best < 0 || logit[e] > logit[best]))
				best = e;
		}
		sel[j] = best;
		top += exp((double)logit[best] - mx) / sum;
	}
	for (int j = 0; j < k; j++) {
		double p = exp((double)logit[sel[j]] - mx) / sum;
		wt[j] = (float)(norm ? p / top : p);
	}
}

enum llm_status llm_moe_ffn(struct llm_backend *be, const struct llm_moe_config *mc,
                            const struct llm_moe_weights *w, struct llm_moe_scratch *s, struct llm_view x,
                            const struct llm_moe_hook *hook)
{
	const struct llm_backend_ops *op = be->ops;
	int64_t n = x.rows, dm = x.cols;
	int E = mc->n_expert, k = mc->n_expert_used;
	if (n > s->max_tok || x.dtype != LLM_DTYPE_F32)
		return llm_fail(LLM_ERR_INTERNAL, "moe: %lld rows for a scratch of %d", (long long)n, s->max_tok);
	LLM_TRY(op->matmul(be, llm_view_f32(s->logit, n, E), x, &w->router));
	if (op->sync)
		LLM_TRY(op->sync(be));
	/* route every row, then list each expert's rows (ascending) by counting */
	memset(s->start, 0, ((size_t)E + 1) * sizeof *s->start);
	for (int64_t t = 0; t < n; t++) {
		int32_t *sel = s->sel + t * k;
		route(s->logit + t * E, E, k, mc->norm_topk, sel, s->wt + t * k);
		for (int j = 0; j < k; j++)
			s->start[sel[j] + 1]++;
	}
	for (int e = 0; e < E; e++)
		s->start[e + 1] += s->start[e];
	for (int64_t t = 0; t < n; t++)
		for (int j = 0; j < k; j++) {
			int e = s->sel[t * k + j];
			int32_t at = s->start[e]++;          /* start[e] moves to the end of e's rows */
			s->rows[at] = (int32_t)t;
			s->rw[at] = s->wt[t * k + j];
		}
	for (int e = E; e > 0; e--)                  /* and back */
		s->start[e] = s->start[e - 1];
	s->start[0] = 0;
	memset(s->acc, 0, (size_t)(n * dm) * sizeof(float));
	for (int e = 0; e < E; e++) {
		int32_t a = s->start[e], ne = s->start[e + 1] - a;
		if (ne == 0)
			continue;                            /* an expert no row chose: its weights stay unread */
		const struct llm_weight *g = &w->expert[3 * e], *u = g + 1, *d = g + 2;
		struct llm_view xe = llm_view_f32(s->xe, ne, dm), ye = llm_view_f32(s->ye, ne, dm);
		struct llm_view ge = llm_view_f32(s->ge, ne, g->rows), ue = llm_view_f32(s->ue, ne, u->rows);
		LLM_TRY(op->gather(be, xe, x, s->rows + a));
		if (op->matmul_n) {
			struct llm_view ys[2] = { ge, ue };
			const struct llm_weight *ws[2] = { g, u };
			LLM_TRY(op->matmul_n(be, 2, ys, xe, ws));
		} else {
			LLM_TRY(op->matmul(be, ge, xe, g));
			LLM_TRY(op->matmul(be, ue, xe, u));
		}
		if (hook) {
			if (op->sync)
				LLM_TRY(op->sync(be));
			hook->fn(hook->ctx, e, 0, ge, xe, s->rows + a, ne);
			hook->fn(hook->ctx, e, 1, ue, xe, s->rows + a, ne);
		}
		LLM_TRY(op->swiglu(be, ge, ge, ue));
		LLM_TRY(op->matmul(be, ye, ge, d));
		if (op->sync)
			LLM_TRY(op->sync(be));
		if (hook)
			hook->fn(hook->ctx, e, 2, ye, ge, s->rows + a, ne);
		/* each row's contributions in ascending expert order, from zero */
		for (int32_t i = 0; i < ne; i++) {
			float *acc = s->acc + (int64_t)s->rows[a + i] * dm, wt = s->rw[a + i];
			const float *y = s->ye + (int64_t)i * dm;
			for (int64_t c = 0; c < dm; c++)
				acc[c] += wt * y[c];
		}
	}
	for (int64_t t = 0; t < n; t++)
		memcpy((float *)x.data + t * x.stride, s->acc + t * dm, (size_t)dm * sizeof(float));
	return LLM_OK;
}
