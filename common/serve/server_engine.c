/* common/serve/server_engine.c: llm-serve's engine thread (see server_impl.h).
 *
 * It takes submitted jobs into the scheduler (one scheduler request per
 * choice), steps it, and publishes the token events each step produced to
 * their jobs under one hold of the lock; the jobs' lifecycle (references,
 * cancellation, failure, the end of a server) is here. */
#define _GNU_SOURCE
#include "server_impl.h"
#include "tokenizer.h"
#include "grammar.h"
#include "fileio.h"
#include "comm.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

const double llm_srv_bucket_le[N_BUCKET] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, INFINITY };

static void observe(struct histo *h, double v)
{
	const double *le = h->le ? h->le : llm_srv_bucket_le;
	for (int i = 0; i < N_BUCKET; i++)
		if (v <= le[i])
			h->n[i]++;
	h->count++;
	h->sum += v;
}

void llm_srv_job_unref_locked(struct job *j)
{
	if (--j->refs > 0)
		return;
	j->srv->lora_jobs[j->adapter]--;
	for (int c = 0; c < j->n; c++) {
		for (int i = 0; i < j->ch[c].n_ev; i++) {
			free(j->ch[c].ev[i].top);
			free(j->ch[c].ev[i].text);
		}
		free(j->ch[c].ev);
		for (int i = 0; i < j->ch[c].n_pend; i++) {
			free(j->ch[c].pend[i].top);
			free(j->ch[c].pend[i].text);
		}
		free(j->ch[c].pend);
	}
	for (int i = 0; i < LLM_MAX_STOP; i++)
		free(j->stops[i]);
	free(j->bias);
	llm_grammar_unref(j->p.grammar);
	pthread_cond_destroy(&j->cv);
	free(j->inputs);
	free(j->plp);
	for (int i = 0; i < j->n_tools; i++)
		free(j->tool_names[i]);
	free(j->tool_names);
	free(j->prompt);
	llm_buf_free(&j->out);
	free(j);
}

/* ---- the engine thread ------------------------------------------------- */

/* engine_idle: 1 while the engine thread waits with no work; 2 once work
 * was handed to it while it waited (t_beat: then); 0 while it works. */
void llm_srv_wake_locked(struct llm_server *s)
{
	if (s->engine_idle == 1) {
		s->engine_idle = 2;
		s->t_beat = now_s();
	}
	pthread_cond_signal(&s->ecv);
}

int llm_srv_stalled_locked(struct llm_server *s)
{
	return s->state == LLM_SERVER_READY && s->o.stall_timeout > 0 && s->engine_idle != 1
	       && now_s() - s->t_beat > s->o.stall_timeout;
}

static void on_admit(void *user)
{
	struct choice *c = user;
	struct job *j = c->job;
	struct llm_server *s = j->srv;
	pthread_mutex_lock(&s->mu);
	if (!j->admitted) {
		j->admitted = 1;
		j->t_admit = now_s();
		observe(&s->queue, j->t_admit - j->t_arrival);
	}
	pthread_mutex_unlock(&s->mu);
}

static void choice_done_locked(struct llm_server *s, struct choice *c, enum llm_finish f)
{
	if (c->done)
		return;
	c->done = 1;
	c->finish = f;
	struct job *j = c->job;
	s->finished[f == LLM_FINISH_LENGTH ? 1 : f == LLM_FINISH_CANCEL ? 2 : f == LLM_FINISH_ERROR ? 3 : 0]++;
	if (c->n_tok) {
		observe(&s->decode, c->t_last - c->t_first);
		observe(&s->req_gen, c->n_tok);
	}
	if (++j->n_done == j->n) {
		observe(&s->e2e, now_s() - j->t_arrival);
		observe(&s->req_prompt, j->n_prompt);
		if (f == LLM_FINISH_CANCEL || j->cancelled)
			s->req_cancel++;
		else
			s->req_ok++;
	}
	pthread_cond_broadcast(&j->cv);
}

/* The engine's event for choice C. Called by the engine thread without the
 * server lock: the event waits in C's pending list, and publish_locked
 * hands every pending event of a step over under one hold of the lock. A
 * lock per token had the engine wait behind connection threads, which
 * format their SSE chunks under it: 16 streams took 0.7 ms of a 29 ms
 * decode step. A cancelled job is told to the scheduler by llm_srv_engine_main
 * (llm_sched_cancel); its choices end with the cancel event that follows,
 * after which the scheduler calls no more. */
static int on_token(void *user, const struct llm_token_event *e)
{
	struct choice *c = user;
	struct llm_server *s = c->job->srv;
	if (LLM_ARRAY_RESERVE(c->pend, c->cap_pend, (size_t)c->n_pend + 1))
		return 1;
	if (!c->touched) {
		if (LLM_ARRAY_RESERVE(s->touched, s->cap_touched, (size_t)s->n_touched + 1))
			return 1;
		s->touched[s->n_touched++] = c;
		c->touched = 1;
	}
	struct ev *v = &c->pend[c->n_pend++];
	memset(v, 0, sizeof *v);
	v->t = now_s();
	v->index = e->index;
	v->token = e->token;
	v->logprob = e->logprob;
	v->finish = e->finish;
	v->stop_index = e->stop_index;
	if (e->n_top > 0 && (v->top = malloc((size_t)e->n_top * sizeof *v->top))) {
		memcpy(v->top, e->top, (size_t)e->n_top * sizeof *v->top);
		v->n_top = e->n_top;
	}
	size_t el = e->error ? strlen(e->error) : 0;
	if (e->error && (v->text = malloc(el + 1)))   /* FINISH_ERROR: the reason rides in text (len 0) */
		memcpy(v->text, e->error, el + 1);
	else if (e->text_len && (v->text = malloc(e->text_len + 1))) {
		memcpy(v->text, e->text, e->text_len);
		v->text[e->text_len] = 0;
		v->len = e->text_len;
	}
	return 0;
}

/* Choice 0's prompt token INDEX scored (engine thread, without the lock:
 * its first event, published under the lock, comes after). */
static int on_plp(void *user, int index, int32_t token, double lp, int rank, const struct llm_logprob *top, int n_top)
{
	(void)token;
	struct job *j = ((struct choice *)user)->job;
	struct plp *p = &j->plp[index];
	p->lp = (float)lp;
	p->rank = rank;
	p->n_top = n_top;
	memcpy(p->top, top, (size_t)n_top * sizeof *top);
	return 0;
}

/* The pending events of every touched choice become visible (engine
 * thread, under the lock); the jobs hold the engine's reference until
 * their choices are done, which happens only here. */
static void publish_locked(struct llm_server *s)
{
	for (int k = 0; k < s->n_touched; k++) {
		struct choice *c = s->touched[k];
		struct job *j = c->job;
		c->touched = 0;
		if (c->index == 0 && c->n_pend)
			j->plp_ready = 1;
		for (int i = 0; i < c->n_pend; i++) {
			struct ev *p = &c->pend[i];
			if (c->done || p->finish == LLM_FINISH_ERROR) {   /* cancelled meanwhile: dropped */
				if (!c->done) {  /* the sampler refused the logits: 500, the job's other choices cancelled */
					j->failed = j->cancelled = 1;
					j->http_status = 500;
					snprintf(j->errmsg, sizeof j->errmsg, "%s", p->text ? p->text : "request failed");
					choice_done_locked(s, c, LLM_FINISH_ERROR);
				}
				free(p->top);
				free(p->text);
				continue;
			}
			if (LLM_ARRAY_RESERVE(c->ev, c->cap_ev, (size_t)c->n_ev + 1)) {
				free(p->top);
				free(p->text);
				choice_done_locked(s, c, LLM_FINISH_CANCEL);
				continue;
			}
			c->ev[c->n_ev++] = *p;
			if (p->token >= 0) {
				s->gen_tokens++;
				if (p->index == 0) {
					observe(&s->ttft, p->t - j->t_arrival);
					observe(&s->prefill, p->t - (j->admitted ? j->t_admit : j->t_arrival));
					c->t_first = p->t;
				} else {
					observe(&s->itl, p->t - c->t_last);
				}
				c->n_tok++;
				c->t_last = p->t;
			}
			if (p->finish)
				choice_done_locked(s, c, p->finish);
		}
		c->n_pend = 0;
		pthread_cond_broadcast(&j->cv);
	}
	s->n_touched = 0;
}

static void fail_job_locked(struct llm_server *s, struct job *j, int status, const char *msg)
{
	j->failed = 1;
	j->http_status = status;
	snprintf(j->errmsg, sizeof j->errmsg, "%s", msg);
	for (int c = 0; c < j->n; c++)
		choice_done_locked(s, &j->ch[c], LLM_FINISH_CANCEL);
}

/* A lost rank (the communication layer's watchdog, on its thread): the
 * engine thread may be waiting inside a collective that never ends, so
 * the server fails here, without it: /health and new requests 503, every
 * request queued or in flight answered 503 with the message naming the
 * lost rank. llm-serve then ends the process (llm_server_lost_rank). */
static void on_lost_rank(int rank, const char *msg, void *ctx)
{
	struct llm_server *s = ctx;
	pthread_mutex_lock(&s->mu);
	snprintf(s->err, sizeof s->err, "%s", msg);
	s->state = LLM_SERVER_FAILED;
	s->lost_rank = rank;
	for (struct job *j = s->subq; j; j = j->next)
		fail_job_locked(s, j, 503, msg);
	for (struct job *j = s->active; j; j = j->next)
		if (j->n_done < j->n)
			fail_job_locked(s, j, 503, msg);
	pthread_mutex_unlock(&s->mu);
}

static enum llm_status engine_load(struct llm_server *s)
{
	LLM_TRY(llm_engine_open(&s->e, s->o.model, &s->o.eng));
	llm_engine_weights_settle(s->e, 0);   /* the huge-page copy: now, while the server is idle */
	struct llm_sched_opts so = s->o.sched;
	llm_sched_opts_tokenizer(&so, &llm_engine_model(s->e)->cfg, s->tk);
	so.on_admit = on_admit;
	if (so.spec.mode == LLM_SPEC_DRAFT) {   /* the draft: one process, the target's backend and threads */
		struct llm_engine_opts d = s->o.eng;
		d.max_seqs = d.kv_seqs = so.max_running;
		LLM_TRY(llm_sched_draft_open(&s->draft, s->e, so.spec.draft, &d));
		so.draft = s->draft;
	}
	LLM_TRY(llm_sched_open(&s->sch, s->e, &so));
	/* distributed: returns when every rank has its engine (so /health says
	 * ready only then); from here each step is mirrored to the other ranks */
	LLM_TRY(llm_engine_serve_begin(s->e));
	return LLM_OK;
}

/* The engine's adapters, for the connection threads (under the lock). */
static void lora_names_locked(struct llm_server *s)
{
	s->n_lora = 0;
	for (int i = 1; i <= LLM_LORA_SLOTS; i++) {
		const char *n = llm_engine_lora_name(s->e, i), *d = llm_engine_lora_dir(s->e, i);
		snprintf(s->lora_name[i - 1], sizeof s->lora_name[i - 1], "%s", n ? n : "");
		free(s->lora_dir[i - 1]);
		s->lora_dir[i - 1] = d ? llm_strdup(d) : NULL;
		s->n_lora += n != NULL;
	}
}

/* Run the queued loads and unloads (under the lock; a load's files are
 * read already): an unload is refused while a job names the adapter (409),
 * so it never waits and never cuts a request short. */
static void lora_ops_locked(struct llm_server *s)
{
	while (s->loraq) {
		struct lora_op *op = s->loraq;
		s->loraq = op->next;
		int slot = llm_engine_lora_find(s->e, op->name);
		enum llm_status st = LLM_OK;
		op->status = 200;
		if (op->load) {          /* its files were read by the connection thread */
			st = llm_engine_lora_add(s->e, op->name, op->path, &op->lo, &slot);
			if (st)
				op->status = st == LLM_ERR_NOMEM ? 500 : 400;
			else
				snprintf(op->msg, sizeof op->msg, "Success: LoRA adapter '%s' added successfully.", op->name);
		} else if (!slot) {
			op->status = 404;
			snprintf(op->msg, sizeof op->msg, "lora_name: the adapter '%s' is not loaded", op->name);
		} else if (s->lora_jobs[slot] > 0) {
			op->status = 409;
			snprintf(op->msg, sizeof op->msg, "lora_name: the adapter '%s' is in use by %d request%s: unload it "
			         "when they have finished", op->name, s->lora_jobs[slot], s->lora_jobs[slot] == 1 ? "" : "s");
		} else {
			s->lora_name[slot - 1][0] = 0;   /* no new job takes it from here */
			pthread_mutex_unlock(&s->mu);
			st = llm_sched_lora_unload(s->sch, slot);
			pthread_mutex_lock(&s->mu);
			if (st)
				op->status = st == LLM_ERR_EXISTS ? 409 : 500;
			else
				snprintf(op->msg, sizeof op->msg, "Success: LoRA adapter '%s' removed successfully.", op->name);
		}
		if (st)
			snprintf(op->msg, sizeof op->msg, "%s", llm_errmsg());
		lora_names_locked(s);
		op->done = 1;
		pthread_cond_broadcast(&op->cv);
	}
}

void *llm_srv_engine_main(void *arg)
{
	struct llm_server *s = arg;
	struct llm_comm *w = llm_comm_world();
	if (w && w->size > 1)
		llm_comm_on_lost(on_lost_rank, s);
	enum llm_status st = engine_load(s);
	pthread_mutex_lock(&s->mu);
	if (st) {
		snprintf(s->err, sizeof s->err, "%s", llm_errmsg());
		s->state = LLM_SERVER_FAILED;
		pthread_mutex_unlock(&s->mu);
		return NULL;
	}
	lora_names_locked(s);
	s->n_ctx = llm_engine_n_ctx(s->e);
	s->n_vocab = llm_engine_model(s->e)->cfg.n_vocab;
	if (s->state == LLM_SERVER_LOADING)
		s->state = LLM_SERVER_READY;
	llm_sched_stats(s->sch, &s->st);
	s->t_beat = now_s();
	int pending = 0;
	for (;;) {
		while (!s->stop && !s->subq && !s->loraq && pending == 0) {
			int cancel = 0;
			for (struct job *j = s->active; j; j = j->next)
				cancel |= j->cancelled && !j->cancel_sent;
			if (cancel)
				break;
			if (!s->engine_idle)
				s->engine_idle = 1;
			pthread_cond_wait(&s->ecv, &s->mu);
		}
		if (s->engine_idle) {   /* at work again: the stall clock runs from here */
			s->engine_idle = 0;
			s->t_beat = now_s();
		}
		if (s->stop)
			break;
		lora_ops_locked(s);
		struct job *q = s->subq;
		s->subq = s->subq_tail = NULL;
		/* new jobs join the active list (the engine's reference moves there) */
		for (struct job *j = q, *nx; j; j = nx) {
			nx = j->next;
			j->next = s->active;
			s->active = j;
			for (int c = 0; c < j->n && !j->failed; c++) {
				struct llm_sample_params p = j->p;
				if (c > 0)
					p.seed += (uint64_t)c;
				struct llm_request rq = { .prompt = j->prompt, .n_prompt = j->n_prompt, .params = p, .on_token = on_token,
				                          .user = &j->ch[c], .adapter = j->adapter };
				if (c == 0 && j->plp && j->n_prompt >= 2)
					rq.score_from = 1, rq.on_prompt_lp = on_plp, rq.score_top = j->plp_top;
				pthread_mutex_unlock(&s->mu);
				st = llm_sched_add(s->sch, &rq, &j->ch[c].sched_id);
				pthread_mutex_lock(&s->mu);
				publish_locked(s);
				if (st) {
					for (int k = 0; k < c; k++)
						llm_sched_cancel(s->sch, j->ch[k].sched_id);
					fail_job_locked(s, j, st == LLM_ERR_RANGE || st == LLM_ERR_USAGE ? 400 : 500, llm_errmsg());
				}
			}
			if (!j->failed)
				s->prompt_tokens += (uint64_t)j->n_prompt * (uint64_t)j->n;
		}
		for (struct job *j = s->active; j; j = j->next)
			if (j->cancelled && !j->cancel_sent) {
				j->cancel_sent = 1;
				for (int c = 0; c < j->n; c++)
					if (!j->ch[c].done)
						llm_sched_cancel(s->sch, j->ch[c].sched_id);
			}
		pthread_mutex_unlock(&s->mu);
		st = llm_sched_step(s->sch, &pending);
		pthread_mutex_lock(&s->mu);
		s->t_beat = now_s();
		publish_locked(s);
		if (st) {
			snprintf(s->err, sizeof s->err, "%s", llm_errmsg());
			s->state = LLM_SERVER_FAILED;
			break;
		}
		llm_sched_stats(s->sch, &s->st);
		/* drop finished jobs from the active list */
		for (struct job **pp = &s->active; *pp;) {
			struct job *j = *pp;
			if (j->n_done == j->n) {
				*pp = j->next;
				llm_srv_job_unref_locked(j);
			} else {
				pp = &j->next;
			}
		}
	}
	/* stopping (or failed): everything left ends as cancelled */
	for (struct job *j = s->subq, *nx; j; j = nx) {
		nx = j->next;
		fail_job_locked(s, j, 503, "the server is shutting down");
		llm_srv_job_unref_locked(j);
	}
	s->subq = s->subq_tail = NULL;
	for (struct lora_op *op = s->loraq; op; op = op->next) {
		op->done = 1;
		op->status = 503;
		snprintf(op->msg, sizeof op->msg, "the server is shutting down");
		pthread_cond_broadcast(&op->cv);
	}
	s->loraq = NULL;
	for (struct job *j = s->active, *nx; j; j = nx) {
		nx = j->next;
		for (int c = 0; c < j->n; c++)
			choice_done_locked(s, &j->ch[c], LLM_FINISH_CANCEL);
		llm_srv_job_unref_locked(j);
	}
	s->active = NULL;
	pthread_mutex_unlock(&s->mu);
	/* distributed: the other ranks stop (a failure here ends the job anyway) */
	llm_engine_serve_end(s->e);
	return NULL;
}
