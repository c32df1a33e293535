/* common/server.c: llm-serve's HTTP layer (see server.h).
 *
 * One mutex (srv->mu) guards every job, the submission queue and the
 * metrics; each job has a condition variable its connection thread waits
 * on, and the engine thread waits on srv->ecv. A job is referenced by its
 * connection (until the response is freed) and by the engine thread (until
 * its last event); whoever drops the last reference frees it.
 *
 * Wire formats: OpenAI completions and chat completions (JSON, or
 * server-sent events ending in "data: [DONE]"), with the generated ids as
 * an extra "token_ids" field of each choice; Hugging Face TGI /generate and
 * /generate_stream. Errors are JSON with the offending field named. */
#define _GNU_SOURCE
#include "server.h"
#include "fileio.h"
#include "tokenizer.h"
#include "jinja.h"
#include "args.h"
#include "request.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include "banned.h"

#define MAX_N LLM_MAX_N            /* choices per request */

enum kind { K_COMPLETION, K_CHAT, K_TGI };

struct ev {                      /* one event of a choice, copied from the engine */
	int32_t token;               /* -1: cancel */
	float logprob;
	int n_top;
	struct llm_logprob *top;
	char *text;
	size_t len;
	enum llm_finish finish;
	double t;                    /* when the engine produced it */
	int index;                   /* its token's index in the choice */
};

struct job;
struct choice {
	struct job *job;
	int index, sched_id, done, sent;   /* sent: events already written (stream) */
	enum llm_finish finish;
	struct ev *ev;
	int n_ev, cap_ev;
	double t_last;
	/* the engine thread's own: events of this step not yet published */
	struct ev *pend;
	int n_pend, cap_pend, touched;
};

struct job {
	struct llm_server *srv;
	pthread_cond_t cv;
	int refs;
	enum kind kind;
	int stream, n, n_done, logprobs, top_logprobs, include_usage, details, full_text;
	char *inputs;                /* TGI return_full_text */
	int32_t *prompt;
	int n_prompt;
	struct llm_sample_params p;
	char *stops[LLM_MAX_STOP];
	struct llm_logit_bias *bias; /* (p.n_bias) */
	struct choice ch[MAX_N];
	int cancelled, cancel_sent, added, failed, http_status;
	char errmsg[256];
	double t_arrival;
	int admitted;
	char id[40];
	long long created;
	int fd;                      /* the client's socket */
	int started, ended;          /* stream: role chunk sent, [DONE] queued */
	char *out;                   /* stream: bytes not yet handed to MHD */
	size_t out_len, out_pos, out_cap;
	struct job *next;            /* submission queue / active list */
};

#define N_BUCKET 14
static const double bucket_le[N_BUCKET] = { 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, INFINITY };

struct histo { uint64_t n[N_BUCKET]; uint64_t count; double sum; };

struct llm_server {
	struct llm_server_opts o;
	char *model_name, *template_src;
	struct MHD_Daemon *d;
	int port;
	pthread_t engine_thread;
	int engine_started;
	pthread_mutex_t mu;
	pthread_cond_t ecv;
	enum llm_server_state state;
	char err[512];
	int stop, in_flight, n_ctx, n_vocab;
	struct job *subq, *subq_tail, *active;
	struct llm_engine *e;
	struct llm_sched *sch;
	struct llm_tokenizer *tk;
	uint64_t next_id;
	/* metrics */
	struct llm_sched_stats st;
	uint64_t req_ok, req_429, req_4xx, req_5xx, req_cancel;
	uint64_t prompt_tokens, gen_tokens;
	struct histo ttft, itl, e2e, queue;
	/* the engine thread's own: choices with pending events */
	struct choice **touched;
	int n_touched, cap_touched;
};

struct conn {                    /* per connection request: the body */
	char *body;
	size_t len, cap;
	int too_large;
};

/* ---- small helpers ----------------------------------------------------- */

static void observe(struct histo *h, double v)
{
	for (int i = 0; i < N_BUCKET; i++)
		if (v <= bucket_le[i])
			h->n[i]++;
	h->count++;
	h->sum += v;
}

static double now_s(void) { return llm_now(); }

/* A JSON string of N bytes, invalid UTF-8 replaced by U+FFFD. */
static json_t *jstr(const char *s, size_t n)
{
	if (llm_is_utf8_text(s, n) || n == 0) {
		json_t *j = json_stringn(s, n);
		if (j)
			return j;
	}
	char *b = malloc(n * 3 + 1);
	if (!b)
		return json_string("");
	size_t w = 0;
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)s[i];
		size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
		if (k && i + k <= n && (k == 1 || llm_is_utf8_text(s + i, k))) {
			if (c) {
				memcpy(b + w, s + i, k);
				w += k;
			}
			i += k;
		} else {
			memcpy(b + w, "\xef\xbf\xbd", 3);
			w += 3;
			i++;
		}
	}
	json_t *j = json_stringn(b, w);
	free(b);
	return j ? j : json_string("");
}

static int client_gone(int fd)
{
	if (fd < 0)
		return 0;
	char c;
	ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

static void job_unref_locked(struct job *j)
{
	if (--j->refs > 0)
		return;
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
	pthread_cond_destroy(&j->cv);
	free(j->inputs);
	free(j->prompt);
	free(j->out);
	free(j);
}

/* ---- the engine thread ------------------------------------------------- */

static void on_admit(void *user)
{
	struct choice *c = user;
	struct job *j = c->job;
	struct llm_server *s = j->srv;
	pthread_mutex_lock(&s->mu);
	if (!j->admitted) {
		j->admitted = 1;
		observe(&s->queue, now_s() - j->t_arrival);
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
	if (++j->n_done == j->n) {
		observe(&s->e2e, now_s() - j->t_arrival);
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
 * decode step. A cancelled job is told to the scheduler by engine_main
 * (llm_sched_cancel); its choices end with the cancel event that follows,
 * after which the scheduler calls no more. */
static int on_token(void *user, const struct llm_token_event *e)
{
	struct choice *c = user;
	struct llm_server *s = c->job->srv;
	if (c->n_pend == c->cap_pend) {
		int cap = c->cap_pend ? 2 * c->cap_pend : 4;
		struct ev *n = realloc(c->pend, (size_t)cap * sizeof *n);
		if (!n)
			return 1;
		c->pend = n;
		c->cap_pend = cap;
	}
	if (!c->touched) {
		if (s->n_touched == s->cap_touched) {
			int cap = s->cap_touched ? 2 * s->cap_touched : 64;
			struct choice **n = realloc(s->touched, (size_t)cap * sizeof *n);
			if (!n)
				return 1;
			s->touched = n;
			s->cap_touched = cap;
		}
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
	if (e->n_top > 0 && (v->top = malloc((size_t)e->n_top * sizeof *v->top))) {
		memcpy(v->top, e->top, (size_t)e->n_top * sizeof *v->top);
		v->n_top = e->n_top;
	}
	if (e->text_len && (v->text = malloc(e->text_len + 1))) {
		memcpy(v->text, e->text, e->text_len);
		v->text[e->text_len] = 0;
		v->len = e->text_len;
	}
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
		for (int i = 0; i < c->n_pend; i++) {
			struct ev *p = &c->pend[i];
			if (c->done) {           /* cancelled meanwhile: dropped */
				free(p->top);
				free(p->text);
				continue;
			}
			if (c->n_ev == c->cap_ev) {
				int cap = c->cap_ev ? 2 * c->cap_ev : 32;
				struct ev *n = realloc(c->ev, (size_t)cap * sizeof *n);
				if (!n) {
					free(p->top);
					free(p->text);
					choice_done_locked(s, c, LLM_FINISH_CANCEL);
					continue;
				}
				c->ev = n;
				c->cap_ev = cap;
			}
			c->ev[c->n_ev++] = *p;
			if (p->token >= 0) {
				s->gen_tokens++;
				if (p->index == 0)
					observe(&s->ttft, p->t - j->t_arrival);
				else
					observe(&s->itl, p->t - c->t_last);
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

static enum llm_status engine_load(struct llm_server *s)
{
	LLM_TRY(llm_engine_open(&s->e, s->o.model, &s->o.eng));
	struct llm_sched_opts so = s->o.sched;
	llm_tokenizer_detok(&so.detok, s->tk);
	so.on_admit = on_admit;
	if (so.n_eos == 0) {
		const int32_t *ids;
		size_t n = llm_tokenizer_eos_ids(s->tk, &ids);
		const struct llm_config *c = &llm_engine_model(s->e)->cfg;
		for (int i = 0; i < c->n_eos && so.n_eos < 16; i++)
			so.eos_ids[so.n_eos++] = c->eos_id[i];
		for (size_t i = 0; i < n && so.n_eos < 16; i++)
			so.eos_ids[so.n_eos++] = ids[i];
	}
	LLM_TRY(llm_sched_open(&s->sch, s->e, &so));
	/* distributed: returns when every rank has its engine (so /health says
	 * ready only then); from here each step is mirrored to the other ranks */
	LLM_TRY(llm_engine_serve_begin(s->e));
	return LLM_OK;
}

static void *engine_main(void *arg)
{
	struct llm_server *s = arg;
	enum llm_status st = engine_load(s);
	pthread_mutex_lock(&s->mu);
	if (st) {
		snprintf(s->err, sizeof s->err, "%s", llm_errmsg());
		s->state = LLM_SERVER_FAILED;
		pthread_mutex_unlock(&s->mu);
		return NULL;
	}
	s->n_ctx = llm_engine_n_ctx(s->e);
	s->n_vocab = llm_engine_model(s->e)->cfg.n_vocab;
	if (s->state == LLM_SERVER_LOADING)
		s->state = LLM_SERVER_READY;
	llm_sched_stats(s->sch, &s->st);
	int pending = 0;
	for (;;) {
		while (!s->stop && !s->subq && pending == 0) {
			int cancel = 0;
			for (struct job *j = s->active; j; j = j->next)
				cancel |= j->cancelled && !j->cancel_sent;
			if (cancel)
				break;
			pthread_cond_wait(&s->ecv, &s->mu);
		}
		if (s->stop)
			break;
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
				struct llm_request rq = { j->prompt, j->n_prompt, p, on_token, &j->ch[c] };
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
				job_unref_locked(j);
			} else {
				pp = &j->next;
			}
		}
	}
	/* stopping (or failed): everything left ends as cancelled */
	for (struct job *j = s->subq, *nx; j; j = nx) {
		nx = j->next;
		fail_job_locked(s, j, 503, "the server is shutting down");
		job_unref_locked(j);
	}
	s->subq = s->subq_tail = NULL;
	for (struct job *j = s->active, *nx; j; j = nx) {
		nx = j->next;
		for (int c = 0; c < j->n; c++)
			choice_done_locked(s, &j->ch[c], LLM_FINISH_CANCEL);
		job_unref_locked(j);
	}
	s->active = NULL;
	pthread_mutex_unlock(&s->mu);
	/* distributed: the other ranks stop (a failure here ends the job anyway) */
	llm_engine_serve_end(s->e);
	return NULL;
}

/* ---- responses --------------------------------------------------------- */

static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *ctype,
                                 char *body, size_t len, const char *retry_after)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", ctype);
	if (retry_after)
		MHD_add_response_header(r, "Retry-After", retry_after);
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *j, const char *retry)
{
	char *body = json_dumps(j, JSON_COMPACT);
	json_decref(j);
	if (!body)
		return MHD_NO;
	size_t n = strlen(body);
	char *b = realloc(body, n + 2);
	if (b) {
		b[n++] = '\n';
		b[n] = 0;
		body = b;
	} else {
		n = strlen(body);
	}
	return send_text(c, status, "application/json", body, n, retry);
}

static enum MHD_Result send_error(struct llm_server *s, struct MHD_Connection *c, enum kind k, unsigned status,
                                  const char *param, const char *fmt, ...) __attribute__((format(printf, 6, 7)));
static enum MHD_Result send_error(struct llm_server *s, struct MHD_Connection *c, enum kind k, unsigned status,
                                  const char *param, const char *fmt, ...)
{
	char msg[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	pthread_mutex_lock(&s->mu);
	if (status == 429)
		s->req_429++;
	else if (status >= 500)
		s->req_5xx++;
	else
		s->req_4xx++;
	pthread_mutex_unlock(&s->mu);
	const char *type = status == 429 ? "rate_limit_exceeded" : status == 401 ? "authentication_error" :
	                   status == 404 ? "not_found_error" : status >= 500 ? "server_error" : "invalid_request_error";
	json_t *j;
	if (k == K_TGI)
		j = json_pack("{s:s, s:s}", "error", msg, "error_type", status == 429 ? "overloaded" : "validation");
	else
		j = json_pack("{s:{s:s, s:s, s:s?, s:i}}", "error", "message", msg, "type", type,
		              "param", param, "code", (int)status);
	return send_json(c, status, j, status == 429 || status == 503 ? "1" : NULL);
}

/* ---- output formatting ------------------------------------------------- */

static const char *openai_finish(enum llm_finish f)
{
	return f == LLM_FINISH_LENGTH ? "length" : f == LLM_FINISH_CANCEL ? "abort" : "stop";
}

static const char *tgi_finish(enum llm_finish f)
{
	return f == LLM_FINISH_LENGTH ? "length" : f == LLM_FINISH_EOS ? "eos_token" :
	       f == LLM_FINISH_STOP ? "stop_sequence" : "abort";
}

/* A token's text as it reads in the output (its leading space kept). */
static json_t *token_str(struct llm_server *s, int32_t id)
{
	char *t = NULL;
	size_t n = 0;
	if (llm_tokenizer_piece(s->tk, id, &t, &n))
		return json_string("");
	json_t *j = jstr(t, n);
	free(t);
	return j;
}

static json_t *token_bytes(struct llm_server *s, int32_t id)
{
	char *t = NULL;
	size_t n = 0;
	json_t *a = json_array();
	if (!llm_tokenizer_piece_bytes(s->tk, id, &t, &n))
		for (size_t i = 0; i < n; i++)
			json_array_append_new(a, json_integer((unsigned char)t[i]));
	free(t);
	return a;
}

/* Log-probs of events [from, to) of C, in the request's format. */
static json_t *logprobs_json(struct llm_server *s, struct job *j, struct choice *c, int from, int to, size_t *offset)
{
	if (!j->logprobs)
		return json_null();
	if (j->kind == K_CHAT) {
		json_t *content = json_array();
		for (int i = from; i < to; i++) {
			struct ev *v = &c->ev[i];
			if (v->token < 0)
				continue;
			json_t *top = json_array();
			for (int k = 0; k < v->n_top; k++)
				json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", token_str(s, v->top[k].id),
				                                     "logprob", (double)v->top[k].logprob,
				                                     "bytes", token_bytes(s, v->top[k].id)));
			json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token", token_str(s, v->token),
			                                         "logprob", (double)v->logprob, "bytes", token_bytes(s, v->token),
			                                         "top_logprobs", top));
		}
		return json_pack("{s:o}", "content", content);
	}
	json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
	for (int i = from; i < to; i++) {
		struct ev *v = &c->ev[i];
		if (v->token < 0)
			continue;
		json_t *ts = token_str(s, v->token);
		json_array_append_new(offs, json_integer((json_int_t)*offset));
		*offset += json_string_length(ts);
		json_array_append_new(toks, ts);
		json_array_append_new(lps, json_real(v->logprob));
		json_t *top = json_object();
		for (int k = 0; k < v->n_top; k++) {
			json_t *ks = token_str(s, v->top[k].id);
			json_object_set_new(top, json_string_value(ks), json_real(v->top[k].logprob));
			json_decref(ks);
		}
		json_array_append_new(tops, top);
	}
	return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops,
	                 "text_offset", offs);
}

static json_t *text_of(struct choice *c, int from, int to)
{
	size_t n = 0;
	for (int i = from; i < to; i++)
		n += c->ev[i].len;
	char *b = malloc(n + 1);
	if (!b)
		return json_string("");
	n = 0;
	for (int i = from; i < to; i++) {
		memcpy(b + n, c->ev[i].text ? c->ev[i].text : "", c->ev[i].len);
		n += c->ev[i].len;
	}
	json_t *j = jstr(b, n);
	free(b);
	return j;
}

static json_t *ids_of(struct choice *c, int from, int to)
{
	json_t *a = json_array();
	for (int i = from; i < to; i++)
		if (c->ev[i].token >= 0)
			json_array_append_new(a, json_integer(c->ev[i].token));
	return a;
}

static int gen_count(const struct job *j)
{
	int n = 0;
	for (int c = 0; c < j->n; c++)
		for (int i = 0; i < j->ch[c].n_ev; i++)
			n += j->ch[c].ev[i].token >= 0;
	return n;
}

static json_t *usage_json(const struct job *j)
{
	int g = gen_count(j);
	return json_pack("{s:i, s:i, s:i}", "prompt_tokens", j->n_prompt, "completion_tokens", g,
	                 "total_tokens", j->n_prompt + g);
}

static json_t *openai_full(struct llm_server *s, struct job *j)
{
	json_t *choices = json_array();
	for (int c = 0; c < j->n; c++) {
		struct choice *ch = &j->ch[c];
		size_t off = 0;
		json_t *o;
		if (j->kind == K_CHAT)
			o = json_pack("{s:i, s:{s:s, s:o}, s:o, s:s, s:o}", "index", c, "message", "role", "assistant",
			              "content", text_of(ch, 0, ch->n_ev), "logprobs", logprobs_json(s, j, ch, 0, ch->n_ev, &off),
			              "finish_reason", openai_finish(ch->finish), "token_ids", ids_of(ch, 0, ch->n_ev));
		else
			o = json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", c, "text", text_of(ch, 0, ch->n_ev),
			              "logprobs", logprobs_json(s, j, ch, 0, ch->n_ev, &off),
			              "finish_reason", openai_finish(ch->finish), "token_ids", ids_of(ch, 0, ch->n_ev));
		json_array_append_new(choices, o);
	}
	return json_pack("{s:s, s:s, s:I, s:s, s:o, s:o}", "id", j->id,
	                 "object", j->kind == K_CHAT ? "chat.completion" : "text_completion",
	                 "created", (json_int_t)j->created, "model", s->model_name, "choices", choices,
	                 "usage", usage_json(j));
}

/* TGI top_n_tokens: the best tokens at event V, best first. */
static json_t *tgi_top(struct llm_server *s, const struct ev *v)
{
	json_t *a = json_array();
	for (int k = 0; k < v->n_top; k++)
		json_array_append_new(a, json_pack("{s:i, s:o, s:f, s:b}", "id", v->top[k].id,
		                                   "text", token_str(s, v->top[k].id), "logprob",
		                                   (double)v->top[k].logprob, "special",
		                                   llm_tokenizer_is_special(s->tk, v->top[k].id)));
	return a;
}

static json_t *tgi_details(struct job *j, struct llm_server *s, int with_tokens)
{
	struct choice *c = &j->ch[0];
	/* seed: the one drawn with, null when greedy (no draw) */
	json_t *d = json_pack("{s:s, s:i, s:o}", "finish_reason", tgi_finish(c->finish),
	                      "generated_tokens", gen_count(j), "seed",
	                      j->p.temperature > 0 ? json_integer((json_int_t)(j->p.seed & INT64_MAX)) : json_null());
	if (with_tokens) {
		json_t *toks = json_array();
		for (int i = 0; i < c->n_ev; i++)
			if (c->ev[i].token >= 0)
				json_array_append_new(toks, json_pack("{s:i, s:o, s:f, s:b}", "id", c->ev[i].token,
				                                      "text", token_str(s, c->ev[i].token),
				                                      "logprob", (double)c->ev[i].logprob,
				                                      "special", llm_tokenizer_is_special(s->tk, c->ev[i].token)));
		json_object_set_new(d, "tokens", toks);
		if (j->p.n_logprobs) {
			json_t *tops = json_array();
			for (int i = 0; i < c->n_ev; i++)
				if (c->ev[i].token >= 0)
					json_array_append_new(tops, tgi_top(s, &c->ev[i]));
			json_object_set_new(d, "top_tokens", tops);
		}
	}
	return d;
}

static json_t *tgi_generated(struct job *j)
{
	json_t *t = text_of(&j->ch[0], 0, j->ch[0].n_ev);
	if (!j->full_text || !j->inputs)
		return t;
	size_t a = strlen(j->inputs), b = json_string_length(t);
	char *x = malloc(a + b + 1);
	if (!x)
		return t;
	memcpy(x, j->inputs, a);
	memcpy(x + a, json_string_value(t), b);
	json_t *r = json_stringn(x, a + b);
	free(x);
	json_decref(t);
	return r ? r : json_string("");
}

/* ---- streaming --------------------------------------------------------- */

static void out_add(struct job *j, const char *s, size_t n)
{
	if (j->out_len + n > j->out_cap) {
		size_t cap = (j->out_len + n) * 2 + 256;
		char *x = realloc(j->out, cap);
		if (!x)
			return;
		j->out = x;
		j->out_cap = cap;
	}
	memcpy(j->out + j->out_len, s, n);
	j->out_len += n;
}

static void out_event(struct job *j, json_t *o, int tgi)
{
	char *b = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (!b)
		return;
	out_add(j, tgi ? "data:" : "data: ", tgi ? 5 : 6);
	out_add(j, b, strlen(b));
	out_add(j, "\n\n", 2);
	free(b);
}

/* Format what the events since the last call add (called with mu held). */
static void stream_format(struct llm_server *s, struct job *j)
{
	int tgi = j->kind == K_TGI;
	if (!j->started && !tgi && j->kind == K_CHAT) {
		for (int c = 0; c < j->n; c++)
			out_event(j, json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:n, s:n}]}", "id", j->id,
			                       "object", "chat.completion.chunk", "created", (json_int_t)j->created,
			                       "model", s->model_name, "choices", "index", c, "delta", "role", "assistant",
			                       "content", "", "logprobs", "finish_reason"), 0);
	}
	j->started = 1;
	for (int c = 0; c < j->n; c++) {
		struct choice *ch = &j->ch[c];
		for (; ch->sent < ch->n_ev; ch->sent++) {
			int i = ch->sent;
			struct ev *v = &ch->ev[i];
			if (v->token < 0)
				continue;      /* a cancel: nothing to send */
			if (tgi) {
				json_t *tok = json_pack("{s:i, s:o, s:f, s:b}", "id", v->token, "text", text_of(ch, i, i + 1),
				                        "logprob", (double)v->logprob, "special",
				                        v->finish == LLM_FINISH_EOS || llm_tokenizer_is_special(s->tk, v->token));
				json_t *o = json_pack("{s:i, s:o, s:n, s:n}", "index", 0, "token", tok, "generated_text", "details");
				if (j->p.n_logprobs)
					json_object_set_new(o, "top_tokens", tgi_top(s, v));
				if (v->finish) {
					json_object_set_new(o, "generated_text", tgi_generated(j));
					json_object_set_new(o, "details", tgi_details(j, s, 0));
				}
				out_event(j, o, 1);
				continue;
			}
			size_t off = 0;
			json_t *ch_o;
			if (j->kind == K_CHAT)
				ch_o = json_pack("{s:i, s:{s:o}, s:o, s:o, s:o}", "index", c, "delta", "content", text_of(ch, i, i + 1),
				                 "logprobs", logprobs_json(s, j, ch, i, i + 1, &off),
				                 "finish_reason", v->finish ? json_string(openai_finish(v->finish)) : json_null(),
				                 "token_ids", ids_of(ch, i, i + 1));
			else
				ch_o = json_pack("{s:i, s:o, s:o, s:o, s:o}", "index", c, "text", text_of(ch, i, i + 1),
				                 "logprobs", logprobs_json(s, j, ch, i, i + 1, &off),
				                 "finish_reason", v->finish ? json_string(openai_finish(v->finish)) : json_null(),
				                 "token_ids", ids_of(ch, i, i + 1));
			json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", j->id,
			                      "object", j->kind == K_CHAT ? "chat.completion.chunk" : "text_completion",
			                      "created", (json_int_t)j->created, "model", s->model_name, "choices", ch_o);
			out_event(j, o, 0);
		}
	}
	if (j->n_done == j->n && !j->ended) {
		j->ended = 1;
		if (j->failed) {
			json_t *o = json_pack("{s:{s:s, s:s, s:i}}", "error", "message", j->errmsg,
			                      "type", "server_error", "code", j->http_status);
			out_event(j, o, tgi);
		}
		if (!tgi) {
			if (j->include_usage)
				out_event(j, json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", j->id,
				                       "object", j->kind == K_CHAT ? "chat.completion.chunk" : "text_completion",
				                       "created", (json_int_t)j->created, "model", s->model_name, "choices",
				                       "usage", usage_json(j)), 0);
			out_add(j, "data: [DONE]\n\n", 14);
		}
	}
}

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	struct job *j = cls;
	struct llm_server *s = j->srv;
	pthread_mutex_lock(&s->mu);
	for (;;) {
		if (j->out_pos < j->out_len) {
			size_t n = j->out_len - j->out_pos < max ? j->out_len - j->out_pos : max;
			memcpy(buf, j->out + j->out_pos, n);
			j->out_pos += n;
			if (j->out_pos == j->out_len)
				j->out_pos = j->out_len = 0;
			pthread_mutex_unlock(&s->mu);
			return (ssize_t)n;
		}
		if (j->ended) {
			pthread_mutex_unlock(&s->mu);
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		stream_format(s, j);
		if (j->out_len)
			continue;
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&j->cv, &s->mu, &ts);
		if (j->n_done < j->n && client_gone(j->fd)) {
			j->cancelled = 1;
			pthread_cond_signal(&s->ecv);
			pthread_mutex_unlock(&s->mu);
			return MHD_CONTENT_READER_END_WITH_ERROR;
		}
	}
}

static void stream_free(void *cls)
{
	struct job *j = cls;
	struct llm_server *s = j->srv;
	pthread_mutex_lock(&s->mu);
	if (j->n_done < j->n) {      /* the client went away mid-stream */
		j->cancelled = 1;
		pthread_cond_signal(&s->ecv);
	}
	s->in_flight -= j->n;
	job_unref_locked(j);
	pthread_mutex_unlock(&s->mu);
}

/* ---- endpoints --------------------------------------------------------- */

static enum MHD_Result do_generate(struct llm_server *s, struct MHD_Connection *conn, enum kind k,
                                   int tgi_stream, const char *body, size_t len)
{
	json_error_t je;
	json_t *o = json_loadb(body, len, 0, &je);
	if (!o)
		return send_error(s, conn, k, 400, NULL, "malformed JSON: line %d: %s", je.line, je.text);
	if (!json_is_object(o)) {
		json_decref(o);
		return send_error(s, conn, k, 400, NULL, "the body must be a JSON object");
	}
	struct job *j = calloc(1, sizeof *j);
	if (!j) {
		json_decref(o);
		return send_error(s, conn, k, 500, NULL, "out of memory");
	}
	pthread_cond_init(&j->cv, NULL);
	j->srv = s;
	j->kind = k;
	j->refs = 1;
	j->t_arrival = now_s();
	j->created = (long long)time(NULL);
	j->fd = -1;
	struct llm_api_env env = { .defaults = LLM_SAMPLE_DEFAULT, .tk = s->tk, .chat_template = s->template_src,
	                           .model_name = s->model_name, .max_n = MAX_N };
	env.defaults.seed = (uint64_t)time(NULL) * 2654435761u + (uint64_t)j->created;
	env.defaults.max_tokens = k == K_COMPLETION ? s->o.default_max_tokens : 0;
	pthread_mutex_lock(&s->mu);
	env.n_ctx = s->n_ctx;
	env.n_vocab = s->n_vocab;
	pthread_mutex_unlock(&s->mu);
	struct llm_api_req rq;
	enum llm_status st = llm_api_req_parse(&rq, k == K_COMPLETION ? LLM_API_COMPLETION : k == K_CHAT ? LLM_API_CHAT :
	                                       LLM_API_TGI, o, &env);
	json_decref(o);
	if (st) {
		pthread_mutex_lock(&s->mu);
		job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		unsigned code = st == LLM_ERR_UNSUPPORTED ? 404 : st == LLM_ERR_NOMEM ? 500 : 400;
		return send_error(s, conn, k, code, rq.param[0] ? rq.param : NULL, "%s", llm_errmsg());
	}
	/* the job takes what the request owns */
	j->prompt = rq.prompt;
	j->n_prompt = rq.n_prompt;
	j->p = rq.p;
	memcpy(j->stops, rq.stops, sizeof j->stops);
	j->bias = rq.bias;
	j->inputs = rq.inputs;
	j->n = rq.n;
	j->stream = rq.stream || tgi_stream;
	j->include_usage = rq.include_usage;
	j->logprobs = rq.logprobs;
	j->details = rq.details;
	j->full_text = rq.full_text;
	/* the chosen tokens' log-probs: TGI's token events carry them; OpenAI's
	 * only when asked for */
	j->p.skip_logprob = k != K_TGI && !j->logprobs;
	for (int c = 0; c < j->n; c++) {
		j->ch[c].job = j;
		j->ch[c].index = c;
	}
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	j->fd = ci ? ci->connect_fd : -1;
	/* admission */
	pthread_mutex_lock(&s->mu);
	if (s->state != LLM_SERVER_READY) {
		job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 503, NULL, "the server is %s", s->state == LLM_SERVER_DRAINING ? "draining" : "not ready");
	}
	if (s->in_flight + j->n > s->o.sched.max_running + s->o.max_queue) {
		int q = s->in_flight - s->o.sched.max_running;
		job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 429, NULL, "the queue is full (%d waiting, --max-queue %d); retry later",
		                  q > 0 ? q : 0, s->o.max_queue);
	}
	s->in_flight += j->n;
	snprintf(j->id, sizeof j->id, "%s-%llu", k == K_CHAT ? "chatcmpl" : "cmpl", (unsigned long long)++s->next_id);
	j->refs = 2;                 /* the connection and the engine */
	if (s->subq_tail)
		s->subq_tail->next = j;
	else
		s->subq = j;
	s->subq_tail = j;
	pthread_cond_signal(&s->ecv);
	if (j->stream) {
		pthread_mutex_unlock(&s->mu);
		struct MHD_Response *resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, j, stream_free);
		if (!resp) {
			stream_free(j);
			return MHD_NO;
		}
		MHD_add_response_header(resp, "Content-Type", "text/event-stream");
		MHD_add_response_header(resp, "Cache-Control", "no-cache");
		enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
		MHD_destroy_response(resp);
		return ret;
	}
	while (j->n_done < j->n) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 100 * 1000 * 1000;
		if (ts.tv_nsec >= 1000000000) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000;
		}
		pthread_cond_timedwait(&j->cv, &s->mu, &ts);
		if (j->n_done < j->n && !j->cancelled && client_gone(j->fd)) {
			j->cancelled = 1;
			pthread_cond_signal(&s->ecv);
		}
	}
	s->in_flight -= j->n;
	json_t *resp = NULL;
	unsigned status = 200;
	char errmsg[sizeof j->errmsg];
	if (j->failed) {
		status = (unsigned)j->http_status;
		snprintf(errmsg, sizeof errmsg, "%s", j->errmsg);
	} else if (j->cancelled) {
		status = 499;
	} else if (k == K_TGI) {
		resp = json_pack("{s:o}", "generated_text", tgi_generated(j));
		if (j->details)
			json_object_set_new(resp, "details", tgi_details(j, s, 1));
	} else {
		resp = openai_full(s, j);
	}
	job_unref_locked(j);
	pthread_mutex_unlock(&s->mu);
	if (status == 499)
		return MHD_NO;           /* nobody is listening */
	if (!resp)
		return send_error(s, conn, k, status, NULL, "%s", errmsg);
	return send_json(conn, status, resp, NULL);
}

static enum MHD_Result do_metrics(struct llm_server *s, struct MHD_Connection *conn)
{
	char *b = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&b, &n);
	if (!f)
		return MHD_NO;
	pthread_mutex_lock(&s->mu);
	struct llm_sched_stats st = s->st;
	fprintf(f, "# HELP llm_requests_running Requests holding a KV sequence.\n# TYPE llm_requests_running gauge\n"
	           "llm_requests_running %d\n", st.running);
	int waiting = s->in_flight - st.running;
	fprintf(f, "# HELP llm_requests_waiting Requests accepted and waiting for a slot.\n# TYPE llm_requests_waiting gauge\n"
	           "llm_requests_waiting %d\n", waiting > 0 ? waiting : 0);
	fprintf(f, "# HELP llm_kv_blocks_used KV blocks held by requests.\n# TYPE llm_kv_blocks_used gauge\n"
	           "llm_kv_blocks_used %lld\n", (long long)st.kv_blocks_used);
	fprintf(f, "# HELP llm_kv_blocks_cached KV blocks held only by the prefix cache.\n# TYPE llm_kv_blocks_cached gauge\n"
	           "llm_kv_blocks_cached %lld\n", (long long)st.kv_blocks_cached);
	fprintf(f, "# HELP llm_kv_blocks_total KV blocks in the pool.\n# TYPE llm_kv_blocks_total gauge\n"
	           "llm_kv_blocks_total %lld\n", (long long)st.kv_blocks_total);
	fprintf(f, "# HELP llm_prompt_tokens_total Prompt tokens of accepted requests.\n# TYPE llm_prompt_tokens_total counter\n"
	           "llm_prompt_tokens_total %llu\n", (unsigned long long)s->prompt_tokens);
	fprintf(f, "# HELP llm_generation_tokens_total Generated tokens.\n# TYPE llm_generation_tokens_total counter\n"
	           "llm_generation_tokens_total %llu\n", (unsigned long long)s->gen_tokens);
	fprintf(f, "# HELP llm_prompt_tokens_computed_total Prompt tokens run through the model (recompute included).\n"
	           "# TYPE llm_prompt_tokens_computed_total counter\nllm_prompt_tokens_computed_total %lld\n",
	        (long long)st.prompt_tokens);
	fprintf(f, "# HELP llm_prefix_cache_hit_tokens_total Prompt tokens taken from the prefix cache.\n"
	           "# TYPE llm_prefix_cache_hit_tokens_total counter\nllm_prefix_cache_hit_tokens_total %lld\n",
	        (long long)st.prefix_hit_tokens);
	fprintf(f, "# HELP llm_preemptions_total Requests preempted for KV blocks (recomputed later).\n"
	           "# TYPE llm_preemptions_total counter\nllm_preemptions_total %lld\n", (long long)st.preemptions);
	fprintf(f, "# HELP llm_steps_total Forward steps.\n# TYPE llm_steps_total counter\nllm_steps_total %lld\n",
	        (long long)st.steps);
	fprintf(f, "# HELP llm_requests_total Requests by outcome.\n# TYPE llm_requests_total counter\n"
	           "llm_requests_total{status=\"ok\"} %llu\nllm_requests_total{status=\"cancelled\"} %llu\n"
	           "llm_requests_total{status=\"rejected_429\"} %llu\nllm_requests_total{status=\"error_4xx\"} %llu\n"
	           "llm_requests_total{status=\"error_5xx\"} %llu\n",
	        (unsigned long long)s->req_ok, (unsigned long long)s->req_cancel, (unsigned long long)s->req_429,
	        (unsigned long long)s->req_4xx, (unsigned long long)s->req_5xx);
	const struct { const char *name, *help; const struct histo *h; } hs[] = {
		{ "llm_time_to_first_token_seconds", "Arrival to the first generated token.", &s->ttft },
		{ "llm_inter_token_latency_seconds", "Gap between consecutive tokens of a request.", &s->itl },
		{ "llm_e2e_request_latency_seconds", "Arrival to the last token.", &s->e2e },
		{ "llm_queue_time_seconds", "Arrival to admission into the running batch.", &s->queue },
	};
	for (size_t i = 0; i < sizeof hs / sizeof *hs; i++) {
		fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", hs[i].name, hs[i].help, hs[i].name);
		for (int k = 0; k < N_BUCKET; k++) {
			if (isinf(bucket_le[k]))
				fprintf(f, "%s_bucket{le=\"+Inf\"} %llu\n", hs[i].name, (unsigned long long)hs[i].h->n[k]);
			else
				fprintf(f, "%s_bucket{le=\"%g\"} %llu\n", hs[i].name, bucket_le[k], (unsigned long long)hs[i].h->n[k]);
		}
		fprintf(f, "%s_sum %.6f\n%s_count %llu\n", hs[i].name, hs[i].h->sum, hs[i].name,
		        (unsigned long long)hs[i].h->count);
	}
	pthread_mutex_unlock(&s->mu);
	fclose(f);
	return send_text(conn, 200, "text/plain; version=0.0.4", b, n, NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls)
{
	(void)version;
	struct llm_server *s = cls;
	struct conn *cc = *con_cls;
	int post = !strcmp(method, "POST");
	if (!cc) {
		cc = calloc(1, sizeof *cc);
		if (!cc)
			return MHD_NO;
		*con_cls = cc;
		const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Content-Length");
		if (post && cl) {
			int64_t v;
			if (!llm_parse_int(cl, 0, INT64_MAX, &v) && (uint64_t)v > s->o.max_body)
				cc->too_large = 1;
		}
		if (cc->too_large)      /* answer before the upload */
			return send_error(s, conn, K_COMPLETION, 413, NULL, "the body of %s bytes exceeds --max-body %zu", cl, s->o.max_body);
		return MHD_YES;
	}
	if (*upload_size) {
		if (!cc->too_large) {
			if (cc->len + *upload_size > s->o.max_body) {
				cc->too_large = 1;
			} else {
				if (cc->len + *upload_size + 1 > cc->cap) {
					size_t cap = (cc->len + *upload_size + 1) * 2;
					char *x = realloc(cc->body, cap);
					if (!x)
						return MHD_NO;
					cc->body = x;
					cc->cap = cap;
				}
				memcpy(cc->body + cc->len, upload, *upload_size);
				cc->len += *upload_size;
			}
		}
		*upload_size = 0;
		return MHD_YES;
	}
	enum kind tgi_k = strncmp(url, "/generate", 9) ? K_COMPLETION : K_TGI;
	if (cc->too_large)
		return send_error(s, conn, tgi_k, 413, NULL, "the body exceeds --max-body %zu bytes", s->o.max_body);
	if (!strcmp(url, "/health")) {
		pthread_mutex_lock(&s->mu);
		enum llm_server_state st = s->state;
		pthread_mutex_unlock(&s->mu);
		const char *name = st == LLM_SERVER_READY ? "ready" : st == LLM_SERVER_LOADING ? "loading" :
		                   st == LLM_SERVER_DRAINING ? "draining" : "failed";
		return send_json(conn, st == LLM_SERVER_READY ? 200 : 503, json_pack("{s:s}", "status", name), NULL);
	}
	if (s->o.api_key) {
		const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
		if (!a || strncmp(a, "Bearer ", 7) || strcmp(a + 7, s->o.api_key))
			return send_error(s, conn, tgi_k, 401, NULL, "missing or wrong API key (Authorization: Bearer KEY)");
	}
	static const struct { const char *url, *method; int what; } routes[] = {
		{ "/v1/completions", "POST", 0 }, { "/v1/chat/completions", "POST", 1 },
		{ "/generate", "POST", 2 }, { "/generate_stream", "POST", 3 },
		{ "/v1/models", "GET", 4 }, { "/metrics", "GET", 5 },
	};
	for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
		if (strcmp(url, routes[i].url))
			continue;
		if (strcmp(method, routes[i].method))
			return send_error(s, conn, tgi_k, 405, NULL, "%s takes %s, not %s", url, routes[i].method, method);
		const char *body = cc->body ? cc->body : "";
		switch (routes[i].what) {
		case 0: return do_generate(s, conn, K_COMPLETION, 0, body, cc->len);
		case 1: return do_generate(s, conn, K_CHAT, 0, body, cc->len);
		case 2: return do_generate(s, conn, K_TGI, 0, body, cc->len);
		case 3: return do_generate(s, conn, K_TGI, 1, body, cc->len);
		case 4: {
			pthread_mutex_lock(&s->mu);
			int n_ctx = s->n_ctx;
			pthread_mutex_unlock(&s->mu);
			return send_json(conn, 200, json_pack("{s:s, s:[{s:s, s:s, s:I, s:s, s:i}]}", "object", "list", "data",
			                                      "id", s->model_name, "object", "model", "created", (json_int_t)0,
			                                      "owned_by", "llm-tools", "max_model_len", n_ctx), NULL);
		}
		default: return do_metrics(s, conn);
		}
	}
	return send_error(s, conn, tgi_k, 404, NULL, "no such endpoint: %s %s", method, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode t)
{
	(void)cls;
	(void)conn;
	(void)t;
	struct conn *cc = *con_cls;
	if (cc) {
		free(cc->body);
		free(cc);
	}
	*con_cls = NULL;
}

/* ---- start / stop ------------------------------------------------------ */

enum llm_status llm_server_start(struct llm_server **out, const struct llm_server_opts *o)
{
	*out = NULL;
	struct llm_server *s = calloc(1, sizeof *s);
	if (!s)
		return llm_fail(LLM_ERR_NOMEM, "server: out of memory");
	s->o = *o;
	pthread_mutex_init(&s->mu, NULL);
	pthread_cond_init(&s->ecv, NULL);
	s->state = LLM_SERVER_LOADING;
	enum llm_status st;
	if (o->chat_template && !(s->template_src = llm_strdup(o->chat_template))) {
		st = llm_fail(LLM_ERR_NOMEM, "server: out of memory");
		goto fail;
	}
	if (o->model_name) {
		s->model_name = llm_strdup(o->model_name);
	} else {
		const char *m = o->model;
		size_t n = strlen(m);
		while (n > 1 && m[n - 1] == '/')
			n--;
		size_t b = n;
		while (b > 0 && m[b - 1] != '/')
			b--;
		s->model_name = strndup(m + b, n - b);
	}
	if ((st = llm_tokenizer_open_model(&s->tk, o->model)))
		goto fail;
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM, .ai_flags = AI_NUMERICSERV };
	struct addrinfo *ai = NULL;
	char port[16];
	snprintf(port, sizeof port, "%d", o->port);
	int gai = getaddrinfo(o->host, port, &hints, &ai);
	if (gai) {
		st = llm_fail(LLM_ERR_USAGE, "--host %s: %s", o->host, gai_strerror(gai));
		goto fail;
	}
	unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL;
	if (ai->ai_family == AF_INET6)
		flags |= MHD_USE_IPv6;
	s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
	                        MHD_OPTION_SOCK_ADDR, ai->ai_addr,
	                        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
	                        MHD_OPTION_CONNECTION_LIMIT, (unsigned)1000,
	                        MHD_OPTION_END);
	freeaddrinfo(ai);
	if (!s->d) {
		st = llm_fail(LLM_ERR_IO, "%s:%d: cannot listen (address in use or not allowed)", o->host, o->port);
		goto fail;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
	s->port = di ? di->port : o->port;
	if (pthread_create(&s->engine_thread, NULL, engine_main, s)) {
		st = llm_fail(LLM_ERR_NOMEM, "server: cannot start the engine thread");
		goto fail;
	}
	s->engine_started = 1;
	*out = s;
	return LLM_OK;
fail:
	llm_server_stop(s);
	return st;
}

int llm_server_port(const struct llm_server *s) { return s->port; }

enum llm_server_state llm_server_state(struct llm_server *s, const char **err)
{
	pthread_mutex_lock(&s->mu);
	enum llm_server_state st = s->state;
	pthread_mutex_unlock(&s->mu);
	if (err)
		*err = s->err;
	return st;
}

void llm_server_drain(struct llm_server *s)
{
	pthread_mutex_lock(&s->mu);
	if (s->state == LLM_SERVER_READY || s->state == LLM_SERVER_LOADING)
		s->state = LLM_SERVER_DRAINING;
	pthread_mutex_unlock(&s->mu);
}

int llm_server_in_flight(struct llm_server *s)
{
	pthread_mutex_lock(&s->mu);
	int n = s->in_flight;
	pthread_mutex_unlock(&s->mu);
	return n;
}

void llm_server_stop(struct llm_server *s)
{
	if (!s)
		return;
	if (s->engine_started) {
		pthread_mutex_lock(&s->mu);
		s->stop = 1;
		pthread_cond_signal(&s->ecv);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->engine_thread, NULL);
	}
	if (s->d)
		MHD_stop_daemon(s->d);
	llm_sched_close(s->sch);
	llm_engine_close(s->e);
	llm_tokenizer_close(s->tk);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->ecv);
	free(s->model_name);
	free(s->touched);
	free(s->template_src);
	free(s);
}
