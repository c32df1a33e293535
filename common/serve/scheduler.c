/* common/serve/scheduler.c: Dynamic SplitFuse continuous batching with preemption
 * (recompute) and prefix caching over llm_engine_forward() (see scheduler.h).
 *
 * Invariants: live requests are kept in arrival order (ids increase);
 * admission is strictly first come first served, so every running request
 * is older than every waiting one; preemption takes the youngest running
 * request, which keeps that order, and the oldest request always gets the
 * blocks it needs (everyone younger can be preempted), so the scheduler
 * cannot deadlock. A running request has ids[0..n_ids) of which the first
 * n_cached are in its KV sequence; it feeds the rest, and the row of
 * ids[n_ids - 1] gives the logits of its next token. Decoding is the case
 * n_ids - n_cached == 1, prefill or recompute the case > 1. A prefill-only
 * request (scoring) feeds ids[0 .. n_prompt - 1) and samples nothing; its
 * logit rows are those of the prompt tokens it scores.
 *
 * Forks: a request with n_shared > 0 is admitted only once its parent (an
 * older request, so admission order is kept) has those positions cached,
 * and forks them. A parent that ends keeps its sequence while children
 * still have to fork it (hold); a child that cannot fork any more (its
 * parent cancelled or preempted away for good) computes the prefix
 * itself.
 *
 * Speculation (spec.h): a decoding request's drafts sit in ids[n_ids ..
 * n_ids + n_draft) for one step, fed after ids[n_ids - 1] with a logit row
 * each; take_token() accepts a row's token and moves on while it equals
 * the draft, and after the step the positions past the last accepted
 * token are truncated, so between steps n_cached == n_ids - 1 again.
 *
 * Every change to the cache goes through llm_engine_kv_* (generate.h), so a
 * distributed engine can mirror it to the other ranks with the next step;
 * the scheduler itself runs on rank 0 only and is the same either way. */
#include "scheduler.h"
#include "reqout.h"
#include "buf.h"
#include "pool.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

enum sreq_state { SREQ_WAITING, SREQ_RUNNING, SREQ_DONE };

struct sreq {
	int id;
	enum sreq_state state;
	int32_t *ids;               /* (n_prompt + max_new) prompt, then output */
	int n_prompt, n_ids, n_cached;
	int seq;                    /* -1 when it holds none */
	int admitted, registered, in_batch, cancel;
	int prefill_only;           /* scoring: nothing is sampled */
	int score_from, scored;     /* score prompt ids [score_from, n_prompt); scored: the next one due */
	int (*on_score)(void *, int, int32_t, double, int);
	int score_top;
	int (*on_prompt_lp)(void *, int, int32_t, double, int, const struct llm_logprob *, int);
	int parent, n_shared;       /* n_shared > 0: fork the parent's first n_shared positions */
	int hold;                   /* children still to fork this request's sequence */
	int adapter;                /* the engine's LoRA slot; 0: the base */
	int n_draft;                /* this step's drafted ids, in ids[n_ids ..]: still to verify */
	int spec_stop;              /* a draft was refused this step: its later rows are void */
	int dseq, n_dcached;        /* draft model: its KV sequence (-1: none), ids[0..n_dcached) in it */
	int n_dq;                   /* draft model: ids[n_ids .. n_ids + n_dq) drafted this step */
	int n_dwant;                /* draft_pass: tokens it drafts for this request */
	float *q;                   /* (spec.n_draft, n_vocab) the draft's distribution of each */
	struct llm_sampler ds;      /* the draft's sampler (draft model only; ds.n_vocab 0: none) */
	struct llm_reqout out;      /* sampling, stops, text, events */
};

struct pentry {                 /* a prefix-cache entry */
	int seq;                    /* -1: empty */
	int32_t *ids;               /* (n) the prefix, whole blocks */
	int n;
	int adapter;                /* the LoRA slot that computed it: its KV is that adapter's */
	uint64_t last_use;
};

struct llm_sched {
	struct llm_engine *e;
	struct llm_kv *kv;
	struct llm_sched_opts o;
	int n_vocab, n_ctx, max_rows;
	struct sreq **reqs;         /* live requests, arrival order */
	int n_reqs, next_id;
	size_t cap_reqs;
	struct pentry *pc;          /* (prefix_entries) */
	uint64_t clock;
	int32_t *b_tok, *b_pos, *b_seq, *b_adapter;   /* (max_batch_tokens) */
	int8_t *b_logits;
	struct sreq **b_req;        /* (max_rows) the request of each logit row */
	int32_t *b_rowpos;          /* (max_rows) the position of each logit row */
	struct llm_sample_row *b_srow;   /* (max_rows) each row's draw, when the backend samples */
	int32_t *b_sid;             /* (max_rows) the ids it chose */
	float *b_slp;               /* (max_rows) and their log-probs */
	struct llm_sample_out *b_so;   /* (max_rows) the host's draws made before the rows are handled */
	int8_t *b_drawn;            /* (max_rows) 1: b_so holds row's draw; 0: none made */
	int32_t *b_plain;           /* (max_rows) the rows drawn apart this step */
	struct sreq **pf;           /* (max_running) a step's prefilling requests */
	int32_t *d_tok, *d_pos, *d_seq, *d_adapter;   /* (d_budget) the draft engine's batch */
	int8_t *d_logits;
	struct sreq **d_req;        /* (d_rows) the request of each draft logit row */
	int d_budget, d_rows;
	int32_t *cnt;               /* (n_block) scratch of stats */
	double ctx_cost;            /* a prompt token at context c costs 1 + c / ctx_cost tokens */
	struct llm_sched_stats st;
};

/* ---- open / close ------------------------------------------------------ */

/* The context at which a prompt token's attention costs as much as its
 * weight matmuls. Per layer a token multiplies by d_model (dq + 2 dkv) +
 * dq d_model + 3 d_model d_ff weights and, per position of context, by
 * 2 n_head d_head keys and values; attention runs about 4 times slower a
 * multiply-add than the weight matmuls (CPU, SmolLM2-135M FP8: a 32-token
 * chunk took 27 ms at context 0, 53 ms at 1000 and 98 ms at 2000, 1 us per
 * token-position against 0.85 ms per token; the formula gives 768
 * positions, the timings 850). */
#define ATTN_COST 4.0
static double ctx_cost(const struct llm_config *c)
{
	double dq = (double)c->n_head * c->d_head, dkv = (double)c->n_kv_head * c->d_head;
	/* a mixture of experts: a token's FFN is its chosen experts' */
	double ff = c->moe.n_expert ? (double)c->moe.n_expert_used * c->moe.d_ff_expert : c->d_ff;
	double w = (double)c->d_model * (dq + 2 * dkv) + dq * c->d_model + 3.0 * c->d_model * ff;
	return w / (ATTN_COST * 2.0 * dq);
}

enum llm_status llm_sched_open(struct llm_sched **out, struct llm_engine *e, const struct llm_sched_opts *o)
{
	*out = NULL;
	struct llm_mem_plan plan;
	llm_engine_plan(e, &plan);
	const struct llm_config *c = &llm_engine_model(e)->cfg;
	if (o->max_running < 1 || o->max_batch_tokens < 1 || o->prefix_entries < 0)
		return llm_fail(LLM_ERR_USAGE, "scheduler: max_running and max_batch_tokens must be >= 1");
	if (o->max_batch_tokens > plan.max_batch_tokens)
		return llm_fail(LLM_ERR_USAGE, "scheduler: a step of %d tokens exceeds the engine's %d",
		                o->max_batch_tokens, plan.max_batch_tokens);
	if (o->max_running + o->prefix_entries > plan.max_seqs)
		return llm_fail(LLM_ERR_USAGE, "scheduler: %d running + %d prefix entries exceed the engine's %d sequences",
		                o->max_running, o->prefix_entries, plan.max_seqs);
	if (o->spec.mode == LLM_SPEC_DRAFT && (!o->draft || llm_engine_model(o->draft)->cfg.n_vocab != c->n_vocab))
		return llm_fail(LLM_ERR_USAGE, "scheduler: --speculate draft needs a draft engine of the same vocabulary");
	struct llm_sched *s = calloc(1, sizeof *s);
	if (!s)
		return llm_fail(LLM_ERR_NOMEM, "scheduler: out of memory");
	s->e = e;
	s->kv = llm_engine_kv(e);
	s->o = *o;
	if (s->o.n_eos == 0) {
		s->o.n_eos = c->n_eos;
		memcpy(s->o.eos_ids, c->eos_id, sizeof c->eos_id);
	}
	s->n_vocab = c->n_vocab;
	s->n_ctx = llm_engine_n_ctx(e);
	s->ctx_cost = ctx_cost(c);
	s->max_rows = (int)(plan.logits_bytes / ((size_t)c->n_vocab * sizeof(float)));
	size_t nb = (size_t)o->max_batch_tokens;
	s->b_tok = malloc(nb * sizeof(int32_t));
	s->b_pos = malloc(nb * sizeof(int32_t));
	s->b_seq = malloc(nb * sizeof(int32_t));
	s->b_adapter = malloc(nb * sizeof(int32_t));
	s->b_logits = malloc(nb);
	s->b_req = malloc(((size_t)s->max_rows + 1) * sizeof *s->b_req);
	s->b_rowpos = malloc(((size_t)s->max_rows + 1) * sizeof *s->b_rowpos);
	s->b_srow = malloc(((size_t)s->max_rows + 1) * sizeof *s->b_srow);
	s->b_sid = malloc(((size_t)s->max_rows + 1) * sizeof *s->b_sid);
	s->b_slp = malloc(((size_t)s->max_rows + 1) * sizeof *s->b_slp);
	s->b_so = malloc(((size_t)s->max_rows + 1) * sizeof *s->b_so);
	s->b_drawn = malloc((size_t)s->max_rows + 1);
	s->b_plain = malloc(((size_t)s->max_rows + 1) * sizeof *s->b_plain);
	s->pf = malloc((size_t)s->o.max_running * sizeof *s->pf);
	s->pc = calloc((size_t)o->prefix_entries + 1, sizeof *s->pc);
	s->cnt = calloc((size_t)s->kv->n_block, sizeof *s->cnt);
	if (!s->b_tok || !s->b_pos || !s->b_seq || !s->b_adapter || !s->b_logits || !s->b_req || !s->b_rowpos || !s->pf || !s->pc
	    || !s->cnt || !s->b_srow || !s->b_sid || !s->b_slp || !s->b_so || !s->b_drawn || !s->b_plain) {
		llm_sched_close(s);
		return llm_fail(LLM_ERR_NOMEM, "scheduler: out of memory");
	}
	if (o->spec.mode == LLM_SPEC_DRAFT) {
		struct llm_mem_plan dp;
		llm_engine_plan(o->draft, &dp);
		s->d_budget = dp.max_batch_tokens;
		s->d_rows = (int)(dp.logits_bytes / ((size_t)c->n_vocab * sizeof(float)));
		size_t db = (size_t)s->d_budget;
		s->d_tok = malloc(db * sizeof(int32_t));
		s->d_pos = malloc(db * sizeof(int32_t));
		s->d_seq = malloc(db * sizeof(int32_t));
		s->d_adapter = calloc(db, sizeof(int32_t));
		s->d_logits = malloc(db);
		s->d_req = malloc(((size_t)s->d_rows + 1) * sizeof *s->d_req);
		if (!s->d_tok || !s->d_pos || !s->d_seq || !s->d_adapter || !s->d_logits || !s->d_req || s->d_rows < 1) {
			llm_sched_close(s);
			return llm_fail(LLM_ERR_NOMEM, "scheduler: out of memory for the draft's batch");
		}
	}
	for (int i = 0; i < o->prefix_entries; i++)
		s->pc[i].seq = -1;
	*out = s;
	return LLM_OK;
}

/* R's draft-model sequence goes (it is rebuilt from its ids when needed). */
static void draft_release(struct llm_sched *s, struct sreq *r)
{
	if (r->dseq >= 0)
		llm_engine_kv_free(s->o.draft, r->dseq);
	r->dseq = -1;
	r->n_dcached = 0;
}

static void req_release_seq(struct llm_sched *s, struct sreq *r)
{
	draft_release(s, r);
	if (r->seq >= 0)
		llm_engine_kv_free(s->e, r->seq);
	r->seq = -1;
	r->n_cached = 0;
}

static void req_free(struct llm_sched *s, struct sreq *r)
{
	if (!r)
		return;
	req_release_seq(s, r);
	llm_reqout_free(&r->out);
	if (r->ds.n_vocab)
		llm_sampler_free(&r->ds);
	free(r->q);
	free(r->ids);
	free(r);
}

static void pentry_drop(struct llm_sched *s, struct pentry *p)
{
	if (p->seq >= 0)
		llm_engine_kv_free(s->e, p->seq);
	free(p->ids);
	p->ids = NULL;
	p->seq = -1;
	p->n = 0;
}

void llm_sched_prefix_clear(struct llm_sched *s)
{
	for (int i = 0; i < s->o.prefix_entries; i++)
		pentry_drop(s, &s->pc[i]);
}

void llm_sched_close(struct llm_sched *s)
{
	if (!s)
		return;
	for (int i = 0; i < s->n_reqs; i++)
		req_free(s, s->reqs[i]);
	if (s->pc)
		llm_sched_prefix_clear(s);
	free(s->reqs);
	free(s->pc);
	free(s->cnt);
	free(s->b_tok);
	free(s->b_pos);
	free(s->b_seq);
	free(s->b_adapter);
	free(s->b_logits);
	free(s->b_req);
	free(s->b_rowpos);
	free(s->b_srow);
	free(s->b_sid);
	free(s->b_slp);
	free(s->b_so);
	free(s->b_drawn);
	free(s->b_plain);
	free(s->pf);
	free(s->d_tok);
	free(s->d_pos);
	free(s->d_seq);
	free(s->d_adapter);
	free(s->d_logits);
	free(s->d_req);
	free(s);
}

/* ---- requests ---------------------------------------------------------- */

/* Blocks a sequence of N_POS positions holds at once: one per block_size
 * positions, or under a sliding window (kvcache.h) at most the window, a
 * step's tokens and two partly used blocks */
static int64_t blocks_for(const struct llm_sched *s, int64_t n_pos)
{
	int64_t bs = s->kv->block_size, most = (int64_t)s->kv->window + s->o.max_batch_tokens + 2 * bs;
	if (s->kv->window && n_pos > most)
		n_pos = most;
	return (n_pos + bs - 1) / bs;
}

static int lcp(const int32_t *a, int na, const int32_t *b, int nb)
{
	int n = na < nb ? na : nb, i = 0;
	while (i < n && a[i] == b[i])
		i++;
	return i;
}

/* The live request ID (ids increase along the list), or NULL. */
static struct sreq *find(struct llm_sched *s, int id)
{
	int lo = 0, hi = s->n_reqs - 1;
	while (lo <= hi) {
		int m = (lo + hi) / 2;
		if (s->reqs[m]->id == id)
			return s->reqs[m];
		if (s->reqs[m]->id < id)
			lo = m + 1;
		else
			hi = m - 1;
	}
	return NULL;
}

/* Where R's feeding ends: every id, or a prefill-only prompt but its last. */
static int feed_end(const struct sreq *r)
{
	return r->prefill_only ? r->n_prompt - 1 : r->n_ids;
}

static int is_decode(const struct sreq *r)
{
	return !r->prefill_only && r->n_ids - r->n_cached == 1;
}

/* Whether position P of R needs a logit row: the next token's (sampling),
 * or a prompt token still to score. */
static int need_row(const struct sreq *r, int p)
{
	if (!r->prefill_only && p >= r->n_ids - 1 && p < r->n_ids + r->n_draft)
		return 1;
	return r->score_from > 0 && p + 1 >= r->scored && p + 1 < r->n_prompt;
}

/* One child of P will not fork it (it did, or gave up, or ended): when
 * none is left and P has ended, its sequence goes. */
static void unhold(struct llm_sched *s, struct sreq *p)
{
	if (p && p->hold > 0 && --p->hold == 0 && p->state == SREQ_DONE)
		req_release_seq(s, p);
}

/* R no longer waits for its parent. */
static void drop_parent(struct llm_sched *s, struct sreq *r)
{
	if (r->n_shared > 0) {
		r->n_shared = 0;
		unhold(s, find(s, r->parent));
	}
}

enum llm_status llm_sched_add(struct llm_sched *s, const struct llm_request *rq, int *id)
{
	if (id)
		*id = -1;
	LLM_TRY(llm_sample_params_check(&rq->params));
	if (!rq->prompt || rq->n_prompt < 1)
		return llm_fail(LLM_ERR_USAGE, "prompt: empty");
	int mt = rq->params.max_tokens;
	if (rq->prefill_only) {
		/* the last prompt token is only scored: n_prompt - 1 positions */
		if (rq->n_prompt < 2)
			return llm_fail(LLM_ERR_USAGE, "prompt: a prefill-only request needs 2 tokens or more");
		if (rq->n_prompt - 1 > s->n_ctx)
			return llm_fail(LLM_ERR_RANGE, "prompt of %d tokens (%d positions) exceeds the context of %d",
			                rq->n_prompt, rq->n_prompt - 1, s->n_ctx);
		mt = 0;
	} else if (rq->n_prompt >= s->n_ctx || (int64_t)rq->n_prompt + mt > s->n_ctx) {
		return llm_fail(LLM_ERR_RANGE, "prompt of %d tokens + max_tokens %d exceeds the context of %d",
		                rq->n_prompt, mt, s->n_ctx);
	}
	if (rq->score_from < 0 || rq->score_from >= rq->n_prompt || (rq->score_from && !rq->on_score == !rq->on_prompt_lp))
		return llm_fail(LLM_ERR_USAGE, "score_from: %d is not a prompt index from 1 (with one callback)", rq->score_from);
	if (rq->score_top < 0 || rq->score_top > LLM_MAX_LOGPROBS)
		return llm_fail(LLM_ERR_USAGE, "score_top: %d is outside [0, %d]", rq->score_top, LLM_MAX_LOGPROBS);
	struct sreq *par = NULL;
	if (rq->n_shared > 0) {
		int end = rq->prefill_only ? rq->n_prompt - 1 : rq->n_prompt;
		if (rq->n_shared >= end || (rq->score_from && rq->n_shared > rq->score_from - 1))
			return llm_fail(LLM_ERR_USAGE, "n_shared: %d leaves nothing to compute before the scored tokens",
			                rq->n_shared);
		par = find(s, rq->parent);
		if (par && lcp(par->ids, par->n_prompt, rq->prompt, rq->n_shared) < rq->n_shared)
			return llm_fail(LLM_ERR_USAGE, "parent: request %d's prompt does not start with the %d shared tokens",
			                rq->parent, rq->n_shared);
		if (par && par->adapter != rq->adapter)
			return llm_fail(LLM_ERR_USAGE, "parent: request %d runs another LoRA adapter", rq->parent);
		if (par && par->state == SREQ_DONE && par->seq < 0)
			par = NULL;          /* ended and gone: compute the prefix */
	}
	if (rq->adapter < 0 || (rq->adapter && !llm_engine_lora_name(s->e, rq->adapter)))
		return llm_fail(LLM_ERR_RANGE, "adapter: LoRA slot %d holds no adapter", rq->adapter);
	for (int i = 0; i < rq->n_prompt; i++)
		if (rq->prompt[i] < 0 || rq->prompt[i] >= s->n_vocab)
			return llm_fail(LLM_ERR_RANGE, "prompt: token %d: id %d is not in the vocabulary [0, %d)",
			                i, rq->prompt[i], s->n_vocab);
	if (rq->params.n_stop > 0 && !s->o.detok.push)
		return llm_fail(LLM_ERR_USAGE, "stop: stop strings need a detokenizer");
	int max_new = rq->prefill_only ? 0 : mt > 0 ? mt : s->n_ctx - rq->n_prompt;
	int64_t need = blocks_for(s, (int64_t)rq->n_prompt + max_new - rq->prefill_only);
	if (need > s->kv->n_block)
		return llm_fail(LLM_ERR_RANGE, "prompt of %d tokens + max_tokens %d need %lld KV blocks, the cache has %lld",
		                rq->n_prompt, max_new, (long long)need, (long long)s->kv->n_block);
	struct sreq *r = calloc(1, sizeof *r);
	if (!r)
		return llm_fail(LLM_ERR_NOMEM, "request: out of memory");
	enum llm_status st;
	r->seq = r->dseq = -1;
	r->ids = malloc(((size_t)rq->n_prompt + (size_t)max_new) * sizeof(int32_t));
	if (!r->ids) {
		st = llm_fail(LLM_ERR_NOMEM, "request: out of memory");
		goto fail;
	}
	memcpy(r->ids, rq->prompt, (size_t)rq->n_prompt * sizeof(int32_t));
	r->n_prompt = r->n_ids = rq->n_prompt;
	r->prefill_only = rq->prefill_only != 0;
	r->score_from = r->scored = rq->score_from;
	r->on_score = rq->on_score;
	r->on_prompt_lp = rq->on_prompt_lp;
	r->score_top = rq->score_top;
	r->adapter = rq->adapter;
	if (par) {
		r->parent = par->id;
		r->n_shared = rq->n_shared;
	}
	if ((st = llm_reqout_init(&r->out, s->next_id, rq, s->n_vocab, max_new, &s->o.detok, s->o.eos_ids, s->o.n_eos)))
		goto fail;
	if (s->o.spec.mode == LLM_SPEC_DRAFT && !r->prefill_only) {
		/* the draft samples with the request's settings but penalties,
		 * min_tokens and grammar (q may be any distribution the draft
		 * drew from: the rule keeps p), from its own stream */
		struct llm_sample_params dp = rq->params;
		dp.repetition_penalty = 1.0f;
		dp.frequency_penalty = dp.presence_penalty = 0;
		dp.min_tokens = 0;
		dp.grammar = NULL;
		dp.n_logprobs = 0;
		dp.skip_logprob = 1;
		dp.seed = rq->params.seed ^ 0x9e3779b97f4a7c15ull;
		r->q = malloc((size_t)s->o.spec.n_draft * (size_t)s->n_vocab * sizeof *r->q);
		if (!r->q) {
			st = llm_fail(LLM_ERR_NOMEM, "request: out of memory");
			goto fail;
		}
		if ((st = llm_sampler_init(&r->ds, &dp, s->n_vocab)))
			goto fail;
	}
	if (LLM_ARRAY_RESERVE(s->reqs, s->cap_reqs, (size_t)s->n_reqs + 1)) {
		st = llm_fail(LLM_ERR_NOMEM, "request: out of memory");
		goto fail;
	}
	r->id = s->next_id++;
	r->state = SREQ_WAITING;
	s->reqs[s->n_reqs++] = r;
	if (par)
		par->hold++;
	if (id)
		*id = r->id;
	return LLM_OK;
fail:
	req_free(s, r);
	return st;
}

void llm_sched_cancel(struct llm_sched *s, int id)
{
	for (int i = 0; i < s->n_reqs; i++)
		if (s->reqs[i]->id == id && s->reqs[i]->state != SREQ_DONE)
			s->reqs[i]->cancel = 1;
}

static void finish(struct llm_sched *s, struct sreq *r)
{
	draft_release(s, r);
	if (!r->hold)
		req_release_seq(s, r);
	drop_parent(s, r);
	r->state = SREQ_DONE;
}

/* ---- prefix cache ------------------------------------------------------ */

/* Evict the least recently used entry; 0 when there was none. */
static int pc_evict(struct llm_sched *s)
{
	struct pentry *v = NULL;
	for (int i = 0; i < s->o.prefix_entries; i++)
		if (s->pc[i].seq >= 0 && (!v || s->pc[i].last_use < v->last_use))
			v = &s->pc[i];
	if (!v)
		return 0;
	pentry_drop(s, v);
	return 1;
}

/* Whether R may be admitted as far as its parent goes: none, or the
 * parent has the shared positions cached (or never will: R gives up on it
 * and computes them). */
static int parent_ready(struct llm_sched *s, struct sreq *r)
{
	if (r->n_shared <= 0)
		return 1;
	struct sreq *p = find(s, r->parent);
	if (p && p->seq >= 0 && p->n_cached >= r->n_shared)
		return 1;
	if (!p || p->state == SREQ_DONE)
		drop_parent(s, r);
	return r->n_shared <= 0;
}

/* Give R a sequence: a fork of its parent's shared positions, or of the
 * longest cached prefix of its ids (whole blocks, leaving at least one id
 * to feed and every position to score), or a fresh one. */
static enum llm_status attach_seq(struct llm_sched *s, struct sreq *r)
{
	struct sreq *par = r->n_shared > 0 ? find(s, r->parent) : NULL;
	if (par && par->seq >= 0 && !llm_kv_can_fork(s->kv, par->seq, r->n_shared))
		drop_parent(s, r);              /* the window released what it shares: compute it */
	if (r->n_shared > 0) {
		struct sreq *p = find(s, r->parent);
		LLM_TRY(llm_engine_kv_fork(s->e, p->seq, r->n_shared, &r->seq));
		r->n_cached = r->n_shared;
		s->st.prefix_hit_tokens += r->n_shared;
		drop_parent(s, r);
		return LLM_OK;
	}
	int bs = s->kv->block_size, best = 0, limit = feed_end(r) - 1;
	if (r->score_from > 0 && r->scored - 1 < limit)
		limit = r->scored - 1;
	struct pentry *src = NULL;
	for (int i = 0; i < s->o.prefix_entries; i++) {
		struct pentry *p = &s->pc[i];
		if (p->seq < 0 || p->adapter != r->adapter)   /* another adapter's KV differs */
			continue;
		int m = lcp(p->ids, p->n, r->ids, limit) / bs * bs;
		if (m > best && llm_kv_can_fork(s->kv, p->seq, m)) {
			best = m;
			src = p;
		}
	}
	for (;;) {
		enum llm_status st = src ? llm_engine_kv_fork(s->e, src->seq, best, &r->seq)
		                         : llm_engine_kv_new(s->e, &r->seq);
		if (st == LLM_OK)
			break;
		/* no slot: give one up from the cache (not the entry we fork) */
		struct pentry *v = NULL;
		for (int i = 0; i < s->o.prefix_entries; i++)
			if (s->pc[i].seq >= 0 && &s->pc[i] != src && (!v || s->pc[i].last_use < v->last_use))
				v = &s->pc[i];
		if (!v)
			return st;
		pentry_drop(s, v);
	}
	if (src) {
		src->last_use = ++s->clock;
		r->n_cached = best;
		s->st.prefix_hit_tokens += best;
	} else {
		r->n_cached = 0;
	}
	return LLM_OK;
}

/* Keep the whole blocks of R's prompt, now in its cache, for later requests. */
static void pc_register(struct llm_sched *s, struct sreq *r)
{
	int bs = s->kv->block_size, n = (r->n_cached < r->n_prompt ? r->n_cached : r->n_prompt) / bs * bs;
	r->registered = 1;
	if (s->o.prefix_entries == 0 || n < bs)
		return;
	struct pentry *slot = NULL;
	for (int i = 0; i < s->o.prefix_entries; i++) {
		struct pentry *p = &s->pc[i];
		if (p->seq >= 0 && p->adapter == r->adapter && lcp(p->ids, p->n, r->ids, n) >= n) {
			p->last_use = ++s->clock;    /* already cached */
			return;
		}
		if (p->seq < 0 && !slot)
			slot = p;
	}
	if (!slot) {
		pc_evict(s);
		for (int i = 0; i < s->o.prefix_entries && !slot; i++)
			if (s->pc[i].seq < 0)
				slot = &s->pc[i];
	}
	if (!slot)
		return;
	slot->ids = malloc((size_t)n * sizeof(int32_t));
	if (!slot->ids)
		return;
	if (llm_engine_kv_fork(s->e, r->seq, n, &slot->seq)) {
		free(slot->ids);
		slot->ids = NULL;
		slot->seq = -1;
		return;
	}
	memcpy(slot->ids, r->ids, (size_t)n * sizeof(int32_t));
	slot->n = n;
	slot->adapter = r->adapter;
	slot->last_use = ++s->clock;
}

/* R took TOK (-1: none), ending with FIN (LLM_FINISH_NONE: it goes on). */
static void took(struct llm_sched *s, struct sreq *r, int32_t tok, enum llm_finish fin)
{
	s->st.gen_tokens += tok >= 0;
	if (fin)
		finish(s, r);
	else
		r->ids[r->n_ids++] = tok;
}

/* Sample R's next token from LOGITS; with a draft in ids[n_ids], the draft
 * is accepted when the token equals it (its row is then the next one's),
 * else the drafts left are void. */
static enum llm_status take_token(struct llm_sched *s, struct sreq *r, const float *logits)
{
	int32_t tok, draft = r->n_draft > 0 ? r->ids[r->n_ids] : -1;
	enum llm_finish fin;
	/* a draft model's token: the rejection rule against its q (the
	 * drafts verified so far this step index it) */
	const float *q = r->n_draft > 0 && r->n_dq > 0 ? r->q + (size_t)(r->n_dq - r->n_draft) * (size_t)s->n_vocab : NULL;
	LLM_TRY(llm_reqout_verify(&r->out, logits, q, draft, &tok, &fin));
	if (r->n_draft > 0) {
		s->st.spec_accepted_tokens += tok == draft;
		r->n_draft = tok == draft && !fin ? r->n_draft - 1 : 0;
		r->spec_stop = r->n_draft == 0;
	}
	took(s, r, tok, fin);
	return LLM_OK;
}

/* R's next token from a draw made apart (SO: draw_rows), handled as
 * take_token handles its own (no draft: see draw_rows). */
static enum llm_status drawn_token(struct llm_sched *s, struct sreq *r, const struct llm_sample_out *so)
{
	int32_t tok;
	enum llm_finish fin;
	LLM_TRY(llm_reqout_drawn(&r->out, so, &tok, &fin));
	took(s, r, tok, fin);
	return LLM_OK;
}

struct draw_job {
	struct llm_sched *s;
	const float *logits;
	int n;                      /* rows in s->b_plain */
};

static void draw_task(void *ctx, int c, int nc)
{
	struct draw_job *j = ctx;
	struct llm_sched *s = j->s;
	for (int k = c; k < j->n; k += nc) {
		int i = s->b_plain[k];
		const float *l = j->logits + (size_t)i * (size_t)s->n_vocab;
		s->b_drawn[i] = llm_reqout_draw(&s->b_req[i]->out, l, &s->b_so[i]) == LLM_OK;
	}
}

/* The plain draws of this step's ROWS (host logits LOGITS), made before
 * the rows are handled and in parallel on the engine's host threads: a
 * row that is its request's one draw this step (no drafts to verify, not
 * a prompt row) and whose request has no grammar. Each draw touches only
 * its request's sampler (its own random stream), so the tokens are those
 * of the rows drawn one after another; the handling that follows (stops,
 * text, events) stays in row order on this thread. A sampling step costs
 * a sort of the candidates per row (~2 ms on a 49152-token vocabulary at
 * temperature 1), which on one thread left the other cores idle between
 * forwards. A draw that fails (non-finite logits) is left to take_token,
 * which fails the same way and reports it. */
static void draw_rows(struct llm_sched *s, int rows, const float *logits)
{
	int n = 0;
	for (int i = 0; i < rows; i++) {
		struct sreq *r = s->b_req[i];
		s->b_drawn[i] = 0;
		if (r->state == SREQ_RUNNING && !r->prefill_only && s->b_rowpos[i] == r->n_ids - 1 && r->n_draft == 0
		    && !r->spec_stop && llm_reqout_drawable(&r->out))
			s->b_plain[n++] = i;
	}
	struct draw_job j = { s, logits, n };
	llm_engine_host_for(s->e, n < LLM_POOL_MAX_CHUNKS ? n : LLM_POOL_MAX_CHUNKS, draw_task, &j);
}

/* R's next token as the backend's sample op chose it (ID, LOGPROB), handled
 * as take_token handles a draw of its own (no draft: see device_rows). */
static enum llm_status put_token(struct llm_sched *s, struct sreq *r, int32_t id, float logprob)
{
	int32_t tok;
	enum llm_finish fin;
	LLM_TRY(llm_reqout_put(&r->out, id, logprob, &tok, &fin));
	took(s, r, tok, fin);
	return LLM_OK;
}

/* Whether the backend samples the ROWS logit rows of this step where the
 * logits are (llm_engine_forward_sample): each row the one plain draw of
 * its request (no prompt log-probs, no drafts to verify, no grammar, no
 * top log-probs), so that only ids come back; else every row's logits
 * come back and are sampled here, as before. */
static int device_rows(struct llm_sched *s, int rows)
{
	if (rows < 1 || !llm_engine_can_sample(s->e))
		return 0;
	for (int i = 0; i < rows; i++) {
		const struct sreq *r = s->b_req[i];
		if (r->state == SREQ_DONE || r->prefill_only || s->b_rowpos[i] != r->n_ids - 1 || r->n_draft > 0
		    || r->spec_stop || !llm_reqout_row_ok(&r->out))
			return 0;
	}
	return 1;
}

/* The log-prob of prompt id P + 1 of R from LOGITS (the row of position
 * P), to its callback. */
static void score_row(struct llm_sched *s, struct sreq *r, int p, const float *logits)
{
	int32_t t = r->ids[p + 1];
	double lp = llm_logprob(logits, s->n_vocab, t);
	int argmax = 1, above = 0, stop;
	for (int k = 0; k < s->n_vocab && (argmax || r->on_prompt_lp); k++)
		if (logits[k] > logits[t] || (logits[k] == logits[t] && k < t))
			argmax = 0, above++;
	r->scored = p + 2;
	if (r->out.quiet)
		return;
	if (r->on_prompt_lp) {
		struct llm_logprob top[LLM_MAX_LOGPROBS];
		int n_top = r->score_top ? llm_top_logprobs(logits, s->n_vocab, r->score_top, top) : 0;
		stop = r->on_prompt_lp(r->out.user, p + 1, t, lp, above + 1, top, n_top);
	} else {
		stop = r->on_score(r->out.user, p + 1, t, lp, argmax);
	}
	if (stop) {
		r->out.quiet = 1;        /* the callback cancels: no more events */
		r->cancel = 1;
	}
}

/* ---- one step ---------------------------------------------------------- */

static void reap(struct llm_sched *s)
{
	int k = 0;
	for (int i = 0; i < s->n_reqs; i++) {
		if (s->reqs[i]->state == SREQ_DONE && !s->reqs[i]->hold)
			req_free(s, s->reqs[i]);
		else
			s->reqs[k++] = s->reqs[i];
	}
	s->n_reqs = k;
}

static void preempt(struct llm_sched *s, struct sreq *r)
{
	req_release_seq(s, r);
	r->n_draft = 0;
	r->state = SREQ_WAITING;
	s->st.preemptions++;
}

/* Give up the sequence of an ended parent still held for its children
 * (they will compute its positions themselves); 0 when there was none. Held
 * blocks are a cache: they must never keep the oldest request from its
 * blocks. */
static int release_held(struct llm_sched *s)
{
	for (int i = 0; i < s->n_reqs; i++) {
		struct sreq *p = s->reqs[i];
		if (p->state == SREQ_DONE && p->hold > 0 && p->seq >= 0) {
			req_release_seq(s, p);
			return 1;
		}
	}
	return 0;
}

/* Make NEED blocks free for R: evict cache entries and held parents, then
 * preempt running requests younger than R that are not in this step's
 * batch, youngest first. 0 on success. */
static int make_room(struct llm_sched *s, const struct sreq *r, int64_t need)
{
	while (s->kv->n_free < need) {
		if (pc_evict(s) || release_held(s))
			continue;
		struct sreq *v = NULL;
		for (int i = s->n_reqs - 1; i >= 0 && !v; i--) {
			struct sreq *q = s->reqs[i];
			if (q == r)
				return -1;          /* only older ones are left */
			if (q->state == SREQ_RUNNING && !q->in_batch)
				v = q;
		}
		if (!v)
			return -1;
		preempt(s, v);
	}
	return 0;
}

/* Append ids[n_cached .. n_cached + take) of R to the batch (n_cached is
 * advanced when the step has run). */
static void put(struct llm_sched *s, struct sreq *r, int take, int *n, int *rows)
{
	for (int j = 0; j < take; j++) {
		int p = r->n_cached + j;
		s->b_tok[*n] = r->ids[p];
		s->b_pos[*n] = p;
		s->b_seq[*n] = r->seq;
		s->b_adapter[*n] = r->adapter;
		s->b_logits[*n] = (int8_t)need_row(r, p);
		if (s->b_logits[*n]) {
			s->b_rowpos[*rows] = p;
			s->b_req[(*rows)++] = r;
		}
		(*n)++;
	}
	r->in_batch = take;
}

/* Reserve the blocks of TAKE more positions of R now, so the next request
 * of the plan sees what is left; shrink TAKE to what fits after make_room.
 * Returns the new take. */
static int reserve(struct llm_sched *s, struct sreq *r, int take)
{
	int64_t need = llm_kv_blocks_needed(s->kv, r->seq, take);
	if (need > s->kv->n_free)
		make_room(s, r, need);
	while (take > 0 && llm_kv_blocks_needed(s->kv, r->seq, take) > s->kv->n_free) {
		int bs = s->kv->block_size;
		take = take > bs ? take - bs : take - 1;
	}
	if (take > 0 && llm_engine_kv_reserve(s->e, r->seq, take))
		take = 0;
	return take;
}

/* What T prompt tokens at positions C .. C + T - 1 cost, in tokens at
 * context 0: T + (T C + T (T - 1) / 2) / K. */
static double chunk_cost(int64_t c, int64_t t, double k)
{
	return (double)t + ((double)t * (double)c + (double)t * (double)(t - 1) / 2.0) / k;
}

/* The most of TAKE prompt tokens from position C that cost at most AVAIL;
 * at least one, so a prompt always moves. */
static int chunk_take(int64_t c, int take, double avail, double k)
{
	if (take < 1 || chunk_cost(c, take, k) <= avail)
		return take;
	/* t^2 / 2k + t (1 + (c - 1/2) / k) = avail, its positive root */
	double b = 1.0 + ((double)c - 0.5) / k, a = 0.5 / k;
	int t = (int)((-b + sqrt(b * b + 4.0 * a * avail)) / (2.0 * a));
	if (t > take)
		t = take;
	while (t > 1 && chunk_cost(c, t, k) > avail)
		t--;
	while (t < take && chunk_cost(c, t + 1, k) <= avail)
		t++;
	return t < 1 ? 1 : t;
}

/* The most of TAKE ids of R from n_cached whose logit rows fit in AVAIL. */
static int rows_fit(const struct sreq *r, int take, int avail)
{
	int t = 0;
	for (int used = 0; t < take; t++) {
		used += need_row(r, r->n_cached + t);
		if (used > avail)
			break;
	}
	return t;
}

/* Draft up to ROOM tokens after R's next one into ids[n_ids ..] (spec.h),
 * as many as max_tokens leaves room for and as the pool's free blocks
 * hold (drafts never evict or preempt), and reserve their positions
 * (the next token's are reserved). Returns how many. */
static int draft(struct llm_sched *s, struct sreq *r, int room)
{
	const struct llm_spec_opts *sp = &s->o.spec;
	int k = sp->n_draft, left = r->out.max_new - r->out.n_gen - 1;
	r->n_draft = 0;
	k = k < room ? k : room;
	k = k < left ? k : left;
	if (sp->mode == LLM_SPEC_OFF || r->prefill_only || k < 1)
		return 0;
	if (sp->mode == LLM_SPEC_DRAFT)
		k = k < r->n_dq ? k : r->n_dq;   /* draft_pass put them in ids[n_ids ..] */
	else
		k = llm_spec_ngram(r->ids, r->n_ids, sp->ngram, k, r->ids + r->n_ids);
	while (k > 0 && llm_kv_blocks_needed(s->kv, r->seq, 1 + k) > s->kv->n_free)
		k--;
	if (k > 0 && llm_engine_kv_reserve(s->e, r->seq, 1 + k))
		k = 0;
	r->n_draft = k;
	r->n_dq = sp->mode == LLM_SPEC_DRAFT ? k : 0;   /* take_token indexes r->q by it */
	s->st.spec_draft_tokens += k;
	return k;
}

/* One forward of the draft engine over the batch gathered in s->d_*
 * (*N tokens, *ROWS logit rows); row i drafts the next token of
 * s->d_req[i]: q from its draft sampler's distribution, x drawn from it. */
static enum llm_status draft_flush(struct llm_sched *s, int *n, int *rows)
{
	if (*n == 0)
		return LLM_OK;
	struct llm_batch b = { *n, s->d_tok, s->d_pos, s->d_seq, s->d_logits, s->d_adapter };
	const float *logits;
	int n_out;
	LLM_TRY(llm_engine_forward(s->o.draft, &b, &logits, &n_out));
	if (n_out != *rows)
		return llm_fail(LLM_ERR_INTERNAL, "scheduler: the draft gave %d logit rows, planned %d", n_out, *rows);
	size_t nv = (size_t)s->n_vocab;
	for (int i = 0; i < *rows; i++) {
		struct sreq *r = s->d_req[i];
		const float *l = logits + (size_t)i * nv;
		float *q = r->q + (size_t)r->n_dq * nv;
		struct llm_sample_out so;
		if (llm_sampler_dist(&r->ds, l, q) || llm_sampler_sample(&r->ds, l, &so))
			continue;            /* a draft's broken logits: no more drafts for it this step */
		r->ids[r->n_ids + r->n_dq++] = so.token;
	}
	*n = *rows = 0;
	return LLM_OK;
}

/* Queue position P of R (token T) in the draft's batch, with a logit row
 * when ROW; flushes first when the batch is full. */
static enum llm_status draft_put(struct llm_sched *s, struct sreq *r, int p, int32_t t, int row, int *n, int *rows)
{
	if (*n == s->d_budget || (row && *rows == s->d_rows))
		LLM_TRY(draft_flush(s, n, rows));
	s->d_tok[*n] = t;
	s->d_pos[*n] = p;
	s->d_seq[*n] = r->dseq;
	s->d_logits[*n] = (int8_t)row;
	if (row)
		s->d_req[(*rows)++] = r;
	(*n)++;
	r->n_dcached = p + 1;
	return LLM_OK;
}

/* Draft-model speculation, before a step is planned: cut every request's
 * draft sequence back to its accepted ids (what the last step kept), then
 * for each decoding request catch its draft sequence up with ids[0 ..
 * n_ids) (the whole prompt the first time) and draft up to n_draft tokens
 * into ids[n_ids ..], one batched draft forward per drafted position. A
 * request the draft cannot serve (no sequence or KV left, its context
 * full) just drafts nothing. */
static enum llm_status draft_pass(struct llm_sched *s)
{
	struct llm_engine *d = s->o.draft;
	int dctx = llm_engine_n_ctx(d), n = 0, rows = 0, kmax = 0;
	for (int i = 0; i < s->n_reqs; i++) {
		struct sreq *r = s->reqs[i];
		r->n_dq = 0;
		if (r->dseq >= 0 && r->n_dcached > r->n_ids - 1) {
			llm_engine_kv_truncate(d, r->dseq, r->n_ids - 1);
			r->n_dcached = r->n_ids - 1;
		}
		if (r->state != SREQ_RUNNING || r->prefill_only || !is_decode(r) || !r->q)
			continue;
		/* drafts fed: the k - 1 before the last, at positions up to n_ids + k - 2 */
		int k = s->o.spec.n_draft, left = r->out.max_new - r->out.n_gen - 1, room = dctx - r->n_ids + 1;
		k = k < left ? k : left;
		k = k < room ? k : room;
		if (k < 1)
			continue;
		if (r->dseq < 0 && llm_engine_kv_new(d, &r->dseq)) {
			r->dseq = -1;
			continue;
		}
		if (llm_engine_kv_reserve(d, r->dseq, r->n_ids - r->n_dcached + k - 1))
			continue;
		r->n_dwant = k;
		kmax = k > kmax ? k : kmax;
		for (int p = r->n_dcached; p < r->n_ids; p++)
			LLM_TRY(draft_put(s, r, p, r->ids[p], p == r->n_ids - 1, &n, &rows));
	}
	LLM_TRY(draft_flush(s, &n, &rows));
	for (int j = 1; j < kmax; j++) {
		for (int i = 0; i < s->n_reqs; i++) {
			struct sreq *r = s->reqs[i];
			if (r->n_dwant > j && r->n_dq == j)
				LLM_TRY(draft_put(s, r, r->n_ids + j - 1, r->ids[r->n_ids + j - 1], 1, &n, &rows));
		}
		LLM_TRY(draft_flush(s, &n, &rows));
	}
	for (int i = 0; i < s->n_reqs; i++)
		s->reqs[i]->n_dwant = 0;
	return LLM_OK;
}

static int plan_step(struct llm_sched *s, int *n_rows)
{
	int budget = s->o.max_batch_tokens, n = 0, rows = 0, running = 0;
	for (int i = 0; i < s->n_reqs; i++) {
		s->reqs[i]->in_batch = 0;
		running += s->reqs[i]->state == SREQ_RUNNING;
	}
	/* admission, first come first served */
	for (int i = 0; i < s->n_reqs && running < s->o.max_running; i++) {
		struct sreq *r = s->reqs[i];
		if (r->state != SREQ_WAITING)
			continue;
		int64_t want = blocks_for(s, r->n_ids) + 1;
		if (running > 0 && want > s->kv->n_free)
			break;
		if (!parent_ready(s, r) || attach_seq(s, r))
			break;
		r->state = SREQ_RUNNING;
		running++;
		if (!r->admitted && s->o.on_admit)
			s->o.on_admit(r->out.user);
		r->admitted = 1;
	}
	/* decode tokens first, one per running request, each with its drafts
	 * (speculation) in what the decodes leave of the budget and rows */
	int spare = 0;
	for (int i = 0; i < s->n_reqs && s->o.spec.mode; i++)
		spare += s->reqs[i]->state == SREQ_RUNNING && is_decode(s->reqs[i]);
	spare = (budget < s->max_rows ? budget : s->max_rows) - spare;
	for (int i = 0; i < s->n_reqs && n < budget && rows < s->max_rows; i++) {
		struct sreq *r = s->reqs[i];
		if (r->state != SREQ_RUNNING || !is_decode(r))
			continue;
		if (reserve(s, r, 1) < 1) {
			preempt(s, r);       /* it is the youngest left */
			continue;
		}
		int k = s->o.spec.mode && spare > 0 ? draft(s, r, spare) : 0;
		spare -= k;
		put(s, r, 1 + k, &n, &rows);
	}
	/* then prompt chunks (prefill, or recompute after a preemption), the
	 * fewest ids left first (ties: arrival order): a short prompt that
	 * arrives while a long one is being prefilled gets its first token
	 * within a step or two instead of after the whole long prompt (which
	 * still takes whatever budget the short ones leave, every step) */
	int n_pf = 0;
	for (int i = 0; i < s->n_reqs && n_pf < s->o.max_running; i++) {
		struct sreq *r = s->reqs[i];
		if (r->state != SREQ_RUNNING || r->in_batch || is_decode(r) || feed_end(r) - r->n_cached < 1)
			continue;
		int k = n_pf++;
		for (; k > 0 && feed_end(s->pf[k - 1]) - s->pf[k - 1]->n_cached > feed_end(r) - r->n_cached; k--)
			s->pf[k] = s->pf[k - 1];
		s->pf[k] = r;
	}
	/* When the step carries decodes, a chunk's tokens are weighted by
	 * their context (chunk_take), so a step deep into a long prompt costs
	 * about what one at its start does: without it, at budget 32 on
	 * SmolLM2-135M, steps went from 27 ms to 98 ms over a 2048-token prompt
	 * and the decodes sharing them saw it. A step of prompt chunks alone
	 * keeps no one's inter-token latency, so it takes the whole budget in
	 * tokens: weighted, a 64K-deep chunk shrank to 3 or 4 tokens, and each
	 * K/V block read by attention served 3 or 4 query rows instead of 32
	 * (a one-prompt prefill's attention grew 6.1x from 16K to 64K). */
	double used = n, k = n > 0 ? s->ctx_cost : INFINITY;
	for (int i = 0; i < n_pf && n < budget && used < budget; i++) {
		struct sreq *r = s->pf[i];
		if (r->state != SREQ_RUNNING)
			continue;            /* preempted to make room for an earlier one */
		int left = feed_end(r) - r->n_cached, take = left < budget - n ? left : budget - n;
		take = chunk_take(r->n_cached, take, budget - used, k);
		take = rows_fit(r, take, s->max_rows - rows);
		if (take > 0)
			take = reserve(s, r, take);
		if (take > 0) {
			used += chunk_cost(r->n_cached, take, k);
			put(s, r, take, &n, &rows);
		}
	}
	*n_rows = rows;
	return n;
}

enum llm_status llm_sched_step(struct llm_sched *s, int *n_pending)
{
	for (int i = 0; i < s->n_reqs; i++) {
		struct sreq *r = s->reqs[i];
		if (r->cancel && r->state != SREQ_DONE) {
			llm_reqout_cancelled(&r->out);
			finish(s, r);
		}
	}
	reap(s);
	if (s->o.spec.mode == LLM_SPEC_DRAFT)
		LLM_TRY(draft_pass(s));
	int rows, n = plan_step(s, &rows);
	s->st.last_step_tokens = n;
	if (n > 0) {
		struct llm_batch b = { n, s->b_tok, s->b_pos, s->b_seq, s->b_logits, s->b_adapter };
		const float *logits = NULL;
		int n_out, dev = device_rows(s, rows);
		if (dev) {              /* each request's draw (its random number) taken in row order */
			for (int i = 0; i < rows; i++)
				llm_reqout_row(&s->b_req[i]->out, &s->b_srow[i]);
			LLM_TRY(llm_engine_forward_sample(s->e, &b, s->b_srow, s->b_sid, s->b_slp, &n_out));
		} else {
			LLM_TRY(llm_engine_forward(s->e, &b, &logits, &n_out));
		}
		if (n_out != rows)
			return llm_fail(LLM_ERR_INTERNAL, "scheduler: %d logit rows, planned %d", n_out, rows);
		s->st.steps++;
		for (int i = 0; i < s->n_reqs; i++) {
			struct sreq *r = s->reqs[i];
			if (!r->in_batch)
				continue;
			if (!is_decode(r))
				s->st.prompt_tokens += r->in_batch;
			r->n_cached += r->in_batch;
			if (!r->registered && r->n_cached >= (r->prefill_only ? r->n_prompt - 1 : r->n_prompt))
				pc_register(s, r);
		}
		size_t nv = (size_t)s->n_vocab;
		if (!dev)
			draw_rows(s, rows, logits);
		for (int i = 0; i < rows; i++) {
			struct sreq *r = s->b_req[i];
			if (r->state == SREQ_DONE)
				continue;
			if (dev) {
				LLM_TRY(put_token(s, r, s->b_sid[i], s->b_slp[i]));
				continue;
			}
			const float *l = logits + (size_t)i * nv;
			if (r->prefill_only || s->b_rowpos[i] < r->n_prompt - 1)
				score_row(s, r, s->b_rowpos[i], l);
			else if (s->b_drawn[i])
				LLM_TRY(drawn_token(s, r, &s->b_so[i]));
			else if (s->b_rowpos[i] == r->n_ids - 1 && !r->spec_stop)
				LLM_TRY(take_token(s, r, l));
		}
		/* speculation: forget the positions after the last accepted token */
		for (int i = 0; i < s->n_reqs; i++) {
			struct sreq *r = s->reqs[i];
			if (r->state == SREQ_RUNNING && !r->prefill_only && r->n_cached > r->n_ids - 1) {
				llm_engine_kv_truncate(s->e, r->seq, r->n_ids - 1);
				r->n_cached = r->n_ids - 1;
			}
			r->n_draft = r->spec_stop = r->n_dq = 0;
		}
		/* prefill-only requests end when their prompt is in */
		for (int i = 0; i < s->n_reqs; i++) {
			struct sreq *r = s->reqs[i];
			if (r->in_batch && r->prefill_only && r->state == SREQ_RUNNING && r->n_cached >= r->n_prompt - 1) {
				llm_reqout_end(&r->out, r->cancel ? LLM_FINISH_CANCEL : LLM_FINISH_LENGTH);
				finish(s, r);
			}
		}
		reap(s);
	} else if (s->n_reqs > 0) {
		/* nothing could start (no sequence slot): give up the prefix
		 * cache and try again; without one it is a bug */
		int had = 0;
		while (pc_evict(s) || release_held(s))
			had = 1;
		if (!had)
			return llm_fail(LLM_ERR_INTERNAL, "scheduler: %d requests but nothing to run", s->n_reqs);
	}
	if (n_pending)
		*n_pending = s->n_reqs;
	return LLM_OK;
}

enum llm_status llm_sched_run(struct llm_sched *s)
{
	int pending = s->n_reqs;
	while (pending > 0)
		LLM_TRY(llm_sched_step(s, &pending));
	return LLM_OK;
}

void llm_sched_opts_tokenizer(struct llm_sched_opts *o, const struct llm_config *c,
                              const struct llm_tokenizer *tk)
{
	llm_tokenizer_detok(&o->detok, tk);
	if (o->n_eos)
		return;
	const int32_t *ids;
	size_t n = llm_tokenizer_eos_ids(tk, &ids);
	int cap = (int)(sizeof o->eos_ids / sizeof *o->eos_ids);
	for (int i = 0; i < c->n_eos + (int)n && o->n_eos < cap; i++) {
		int32_t id = i < c->n_eos ? c->eos_id[i] : ids[i - c->n_eos];
		int dup = 0;
		for (int k = 0; k < o->n_eos; k++)
			dup |= o->eos_ids[k] == id;
		if (!dup)
			o->eos_ids[o->n_eos++] = id;
	}
}

void llm_sched_stats(const struct llm_sched *s, struct llm_sched_stats *st)
{
	*st = s->st;
	st->running = st->waiting = 0;
	for (int i = 0; i < s->n_reqs; i++) {
		st->running += s->reqs[i]->state == SREQ_RUNNING;
		st->waiting += s->reqs[i]->state == SREQ_WAITING;
	}
	const struct llm_kv *kv = s->kv;
	st->kv_blocks_total = kv->n_block;
	int64_t alloc = kv->n_block - kv->n_free, cached = 0, only_cache = 0;
	/* count each block's references from cache entries */
	for (int i = 0; i < s->o.prefix_entries; i++) {
		const struct pentry *p = &s->pc[i];
		if (p->seq < 0)
			continue;
		const struct llm_kv_seq *q = &kv->seq[p->seq];
		for (int b = 0; b < q->n_blk; b++)   /* -1: released behind a sliding window */
			if (q->blk[b] >= 0 && s->cnt[q->blk[b]]++ == 0)
				cached++;
	}
	for (int i = 0; i < s->o.prefix_entries; i++) {
		const struct pentry *p = &s->pc[i];
		if (p->seq < 0)
			continue;
		const struct llm_kv_seq *q = &kv->seq[p->seq];
		for (int b = 0; b < q->n_blk; b++) {
			int32_t k = q->blk[b];
			if (k >= 0 && s->cnt[k]) {
				only_cache += kv->ref[k] == s->cnt[k];
				s->cnt[k] = 0;
			}
		}
	}
	st->kv_blocks_cached = cached;
	st->kv_blocks_used = alloc - only_cache;
}

struct llm_engine *llm_sched_engine(const struct llm_sched *s)
{
	return s->e;
}

int llm_sched_lora_users(const struct llm_sched *s, int slot)
{
	int n = 0;
	for (int i = 0; i < s->n_reqs; i++)
		n += s->reqs[i]->adapter == slot && s->reqs[i]->state != SREQ_DONE;
	return n;
}

enum llm_status llm_sched_lora_unload(struct llm_sched *s, int slot)
{
	const char *name = llm_engine_lora_name(s->e, slot);
	if (!name)
		return llm_fail(LLM_ERR_RANGE, "LoRA slot %d holds no adapter", slot);
	int n = llm_sched_lora_users(s, slot);
	if (n)
		return llm_fail(LLM_ERR_EXISTS, "adapter '%s' is in use by %d request%s: unload it when they have "
		                "finished", name, n, n == 1 ? "" : "s");
	/* its prefix-cache entries go (the slot may hold another adapter
	 * later); a finished request holding its sequence for children of its
	 * own adapter has none left to serve once they are done */
	for (int i = 0; i < s->o.prefix_entries; i++)
		if (s->pc[i].seq >= 0 && s->pc[i].adapter == slot)
			pentry_drop(s, &s->pc[i]);
	for (int i = 0; i < s->n_reqs; i++)
		if (s->reqs[i]->adapter == slot)
			req_release_seq(s, s->reqs[i]);
	llm_engine_lora_unload(s->e, slot);
	return LLM_OK;
}

void llm_sched_summary(const struct llm_sched *s, char *out, size_t n)
{
	int k = snprintf(out, n, "%lld steps; %lld prompt tokens computed, %lld taken from the prefix cache; %lld generated; "
	                 "%lld preemptions", (long long)s->st.steps, (long long)s->st.prompt_tokens,
	                 (long long)s->st.prefix_hit_tokens, (long long)s->st.gen_tokens, (long long)s->st.preemptions);
	if (s->o.spec.mode && k > 0 && (size_t)k < n)
		snprintf(out + k, n - (size_t)k, "; speculation: %lld of %lld drafted tokens accepted (%.1f%%)",
		         (long long)s->st.spec_accepted_tokens, (long long)s->st.spec_draft_tokens,
		         s->st.spec_draft_tokens ? 100.0 * (double)s->st.spec_accepted_tokens / (double)s->st.spec_draft_tokens : 0.0);
}

enum llm_status llm_sched_draft_open(struct llm_engine **d, struct llm_engine *e, const char *path,
                                     const struct llm_engine_opts *o)
{
	*d = NULL;
	/* the target's backend, threads, KV dtype and sequences; no adapters
	 * (they belong to the target), a logit row per sequence, its own
	 * context and a KV pool sized by it */
	struct llm_engine_opts od = *o;
	od.lora = NULL;
	od.n_lora = od.lora_runtime = 0;
	od.max_logits = o->max_seqs;
	od.n_ctx = 0;
	od.kv_blocks = 0;
	/* under a sliding window, the blocks a rejected draft's roll-back
	 * reads again stay: draft_pass decodes drafts one position a step, up
	 * to LLM_SPEC_MAX_DRAFT - 1 past where the next pass starts again */
	od.kv_keep = LLM_SPEC_MAX_DRAFT;
	struct llm_engine *x;
	LLM_TRY(llm_engine_open(&x, path, &od));
	int nd = llm_engine_model(x)->cfg.n_vocab, nt = llm_engine_model(e)->cfg.n_vocab;
	if (nd != nt) {
		llm_engine_close(x);
		return llm_fail(LLM_ERR_FORMAT, "--draft %s: n_vocab %d differs from the model's %d", path, nd, nt);
	}
	*d = x;
	return LLM_OK;
}
