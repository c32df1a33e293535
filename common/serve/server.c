/* common/serve/server.c: llm-serve's HTTP layer (see server.h; the engine thread
 * and the response bodies are server_engine.c and server_format.c, their
 * shared state server_impl.h): routing, request bodies parsed by
 * request.c, admission and the queue limit, waiting for or streaming a
 * job's events, /metrics, start and stop.
 *
 * Wire formats: OpenAI completions and chat completions (JSON, or
 * server-sent events ending in "data: [DONE]"), with the generated ids as
 * an extra "token_ids" field of each choice; Hugging Face TGI /generate and
 * /generate_stream. Errors are JSON with the offending field named. */
#define _GNU_SOURCE
#include "server_impl.h"
#include "fileio.h"
#include "tokenizer.h"
#include "args.h"
#include "request.h"
#include "guide.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include "banned.h"

struct conn {                    /* per connection request: the body */
	struct llm_buf body;
	int too_large;
};

/* ---- small helpers ----------------------------------------------------- */

static int client_gone(int fd)
{
	if (fd < 0)
		return 0;
	char c;
	ssize_t r = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
	return r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* A grammar compile's cancel test (struct llm_grammar_budget): its client left. */
static int compile_gone(void *arg) { return client_gone(*(const int *)arg); }

/* The idle timeout (--timeout) is for the client's pace, not the engine's:
 * it is off while a request waits for the engine, and set again (which
 * restarts its clock) when there is something to send. */
static void idle_timeout(struct MHD_Connection *c, unsigned seconds)
{
	MHD_set_connection_option(c, MHD_CONNECTION_OPTION_TIMEOUT, seconds);
}

/* A route of METHOD takes it; a GET route takes HEAD too (libmicrohttpd
 * sends the headers only). */
static int method_ok(const char *method, const char *route_method)
{
	return !strcmp(method, route_method) || (!strcmp(route_method, "GET") && !strcmp(method, "HEAD"));
}

/* The Allow header of a route of METHOD. */
static const char *allow_of(const char *route_method) { return strcmp(route_method, "GET") ? route_method : "GET, HEAD"; }

/* AUTH (the Authorization header, NULL when absent) carries KEY: the
 * scheme "Bearer" in any case, spaces, then the key. The comparison takes
 * the same time wherever the first difference is (it depends only on
 * the lengths), so the key cannot be guessed byte by byte from the answers'
 * timing. */
static int key_ok(const char *auth, const char *key)
{
	if (!auth || strncasecmp(auth, "Bearer ", 7))
		return 0;
	const char *got = auth + 7;
	while (*got == ' ')
		got++;
	size_t n = strlen(got), m = strlen(key);
	volatile unsigned char d = n != m;
	for (size_t i = 0; i < m; i++)
		d |= (unsigned char)(key[i] ^ (i < n ? got[i] : 0));
	return d == 0;
}

/* ---- responses --------------------------------------------------------- */

/* HNAME: an extra header (NULL: none), HVAL its value */
static enum MHD_Result send_text(struct MHD_Connection *c, unsigned status, const char *ctype,
                                 char *body, size_t len, const char *hname, const char *hval)
{
	struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
	if (!r) {
		free(body);
		return MHD_NO;
	}
	MHD_add_response_header(r, "Content-Type", ctype);
	if (hname)
		MHD_add_response_header(r, hname, hval);
	enum MHD_Result ret = MHD_queue_response(c, status, r);
	MHD_destroy_response(r);
	return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status, json_t *j, const char *hname,
                                 const char *hval)
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
	return send_text(c, status, "application/json", body, n, hname, hval);
}

/* An error answer; 429 and 503 carry Retry-After, 405 an Allow header of
 * ALLOW (the route's methods). */
static enum MHD_Result send_error_allow(struct llm_server *s, struct MHD_Connection *c, enum kind k, unsigned status,
                                        const char *allow, const char *param, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));
static enum MHD_Result send_error_allow(struct llm_server *s, struct MHD_Connection *c, enum kind k, unsigned status,
                                        const char *allow, const char *param, const char *fmt, ...)
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
	if (status == 405)
		return send_json(c, status, j, "Allow", allow);
	return send_json(c, status, j, status == 429 || status == 503 ? "Retry-After" : NULL, "1");
}
#define send_error(s, c, k, status, ...) send_error_allow(s, c, k, status, NULL, __VA_ARGS__)

/* ---- streaming --------------------------------------------------------- */

struct stream {                  /* a streamed response's reader */
	struct job *j;
	struct MHD_Connection *conn;
};

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
	(void)pos;
	struct stream *sr = cls;
	struct job *j = sr->j;
	struct llm_server *s = j->srv;
	pthread_mutex_lock(&s->mu);
	for (int waited = 0;;) {
		if (j->out_pos < j->out.len) {
			size_t n = j->out.len - j->out_pos < max ? j->out.len - j->out_pos : max;
			memcpy(buf, j->out.p + j->out_pos, n);
			j->out_pos += n;
			if (j->out_pos == j->out.len)
				j->out_pos = j->out.len = 0;
			pthread_mutex_unlock(&s->mu);
			if (waited)
				idle_timeout(sr->conn, s->o.timeout);
			return (ssize_t)n;
		}
		if (j->ended) {
			pthread_mutex_unlock(&s->mu);
			if (waited)
				idle_timeout(sr->conn, s->o.timeout);
			return MHD_CONTENT_READER_END_OF_STREAM;
		}
		llm_srv_stream_format(s, j);
		if (j->out.len)
			continue;
		if (!waited) {            /* the engine's time is not the client's */
			waited = 1;
			idle_timeout(sr->conn, 0);
		}
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

static void stream_end(struct job *j)
{
	struct llm_server *s = j->srv;
	pthread_mutex_lock(&s->mu);
	if (j->n_done < j->n) {      /* the client went away mid-stream */
		j->cancelled = 1;
		pthread_cond_signal(&s->ecv);
	}
	s->in_flight -= j->n;
	llm_srv_job_unref_locked(j);
	pthread_mutex_unlock(&s->mu);
}

static void stream_free(void *cls)
{
	struct stream *sr = cls;
	struct job *j = sr->j;
	free(sr);
	stream_end(j);
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
	const union MHD_ConnectionInfo *ci = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
	j->fd = ci ? ci->connect_fd : -1;
	/* a grammar compiles here, on the connection's thread before the job is
	 * queued (never on the engine's), within its budget: LLM_SERVE_GRAMMAR_SECONDS,
	 * and given up when the client leaves */
	struct llm_grammar_budget gb = { .deadline = now_s() + LLM_SERVE_GRAMMAR_SECONDS, .cancel = compile_gone,
	                                 .arg = &j->fd };
	struct llm_api_env env = { .defaults = LLM_SAMPLE_DEFAULT, .tk = s->tk, .chat_template = s->template_src,
	                           .model_name = s->model_name, .max_n = MAX_N, .gvocab = s->gvocab, .gbudget = &gb };
	env.defaults.seed = (uint64_t)time(NULL) * 2654435761u + (uint64_t)j->created;
	env.defaults.max_tokens = k == K_COMPLETION ? s->o.default_max_tokens : 0;
	char lnames[LLM_LORA_SLOTS][LLM_LORA_NAME_MAX];   /* the adapters' names as parsed against */
	const char *lptr[LLM_LORA_SLOTS];
	pthread_mutex_lock(&s->mu);
	env.n_ctx = s->n_ctx;
	env.n_vocab = s->n_vocab;
	if (s->n_lora) {
		memcpy(lnames, s->lora_name, sizeof lnames);
		for (int i = 0; i < LLM_LORA_SLOTS; i++)
			lptr[i] = lnames[i][0] ? lnames[i] : NULL;
		env.adapters = lptr;
		env.n_adapters = LLM_LORA_SLOTS;
	}
	pthread_mutex_unlock(&s->mu);
	struct llm_api_req rq;
	enum llm_status st = llm_api_req_parse(&rq, k == K_COMPLETION ? LLM_API_COMPLETION : k == K_CHAT ? LLM_API_CHAT :
	                                       LLM_API_TGI, o, &env);
	json_decref(o);
	if (st) {
		pthread_mutex_lock(&s->mu);
		llm_srv_job_unref_locked(j);
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
	j->n = rq.best_of > rq.n ? rq.best_of : rq.n;
	j->n_ret = rq.n;
	j->stream = rq.stream || tgi_stream;
	j->include_usage = rq.include_usage;
	j->logprobs = rq.logprobs;
	j->details = rq.details;
	j->full_text = rq.full_text;
	j->echo = rq.echo;
	j->tool_fmt = rq.tool_format;
	j->tool_names = rq.tool_names;
	j->n_tools = rq.n_tools;
	j->prompt_lp = rq.prompt_logprobs;
	j->prefill = rq.prefill_details && rq.details;
	if (tgi_stream && rq.prefill_details) {
		pthread_mutex_lock(&s->mu);
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 400, "decoder_input_details", "decoder_input_details: not with streaming");
	}
	/* the prompt's log-probs: scored by choice 0's request */
	int want = (j->echo && j->logprobs) || j->prompt_lp >= 0 || j->prefill;
	j->plp_top = j->prompt_lp > 0 ? j->prompt_lp : 0;
	if (j->echo && j->logprobs && j->p.n_logprobs > j->plp_top)
		j->plp_top = j->p.n_logprobs;
	if (want && !(j->plp = calloc((size_t)j->n_prompt, sizeof *j->plp))) {
		pthread_mutex_lock(&s->mu);
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 500, NULL, "out of memory");
	}
	for (int i = 0; j->plp && i < j->n_prompt; i++)
		j->plp[i].lp = NAN;
	j->plp_ready = !j->plp || j->n_prompt < 2;
	/* the chosen tokens' log-probs: TGI's token events carry them; OpenAI's
	 * only when asked for */
	j->p.skip_logprob = k != K_TGI && !j->logprobs && j->n_ret == j->n;
	for (int c = 0; c < j->n; c++) {
		j->ch[c].job = j;
		j->ch[c].index = c;
	}
	/* admission */
	pthread_mutex_lock(&s->mu);
	if (s->state != LLM_SERVER_READY) {
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 503, NULL, "the server is %s", s->state == LLM_SERVER_DRAINING ? "draining" : "not ready");
	}
	if (rq.adapter && strcmp(s->lora_name[rq.adapter - 1], lnames[rq.adapter - 1])) {   /* unloaded meanwhile */
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 404, k == K_TGI ? "adapter_id" : "model", "the LoRA adapter '%s' has been "
		                  "unloaded", lnames[rq.adapter - 1]);
	}
	if (j->n > s->o.sched.max_running + s->o.max_queue) {   /* never, however long it waits */
		int n = j->n;
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 400, "n", "n: %d choices can never be admitted: --max-running %d + --max-queue %d "
		                  "hold %d", n, s->o.sched.max_running, s->o.max_queue, s->o.sched.max_running + s->o.max_queue);
	}
	if (s->in_flight + j->n > s->o.sched.max_running + s->o.max_queue) {
		int q = s->in_flight - s->o.sched.max_running;
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 429, NULL, "the queue is full (%d waiting, --max-queue %d); retry later",
		                  q > 0 ? q : 0, s->o.max_queue);
	}
	s->in_flight += j->n;
	j->adapter = rq.adapter;
	s->lora_jobs[j->adapter]++;  /* until the job is freed (llm_srv_job_unref_locked) */
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
		struct stream *sr = malloc(sizeof *sr);
		struct MHD_Response *resp = NULL;
		if (sr) {
			*sr = (struct stream){ .j = j, .conn = conn };
			resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, sr, stream_free);
		}
		if (!resp) {
			free(sr);
			stream_end(j);
			return MHD_NO;
		}
		MHD_add_response_header(resp, "Content-Type", "text/event-stream");
		MHD_add_response_header(resp, "Cache-Control", "no-cache");
		enum MHD_Result ret = MHD_queue_response(conn, MHD_HTTP_OK, resp);
		MHD_destroy_response(resp);
		return ret;
	}
	pthread_mutex_unlock(&s->mu);
	idle_timeout(conn, 0);       /* the engine's time is not the client's */
	pthread_mutex_lock(&s->mu);
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
		resp = json_pack("{s:o}", "generated_text", llm_srv_tgi_generated(j));
		if (j->details)
			json_object_set_new(resp, "details", llm_srv_tgi_details(j, s, 1));
	} else {
		resp = llm_srv_openai_full(s, j);
	}
	llm_srv_job_unref_locked(j);
	pthread_mutex_unlock(&s->mu);
	if (status == 499)
		return MHD_NO;           /* nobody is listening */
	idle_timeout(conn, s->o.timeout);
	if (!resp)
		return send_error(s, conn, k, status, NULL, "%s", errmsg);
	return send_json(conn, status, resp, NULL, NULL);
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
	fprintf(f, "# HELP llm_spec_draft_tokens_total Drafted tokens verified (speculative decoding).\n"
	           "# TYPE llm_spec_draft_tokens_total counter\nllm_spec_draft_tokens_total %lld\n", (long long)st.spec_draft_tokens);
	fprintf(f, "# HELP llm_spec_accepted_tokens_total Drafted tokens equal to the model's token (accepted).\n"
	           "# TYPE llm_spec_accepted_tokens_total counter\nllm_spec_accepted_tokens_total %lld\n",
	        (long long)st.spec_accepted_tokens);
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
	for (size_t i = 0; i < sizeof hs / sizeof *hs; i++)
		llm_srv_histo_text(f, hs[i].name, hs[i].help, hs[i].h, "");
	llm_srv_metrics_vllm(s, f);
	pthread_mutex_unlock(&s->mu);
	fclose(f);
	return send_text(conn, 200, "text/plain; version=0.0.4", b, n, NULL, NULL);
}

/* /tokenize (TOK) or /detokenize: server_api.c */
static enum MHD_Result do_tokens(struct llm_server *s, struct MHD_Connection *conn, int tok, const char *body, size_t len)
{
	json_error_t je;
	json_t *o = json_loadb(body, len, 0, &je), *out = NULL;
	if (!o)
		return send_error(s, conn, K_COMPLETION, 400, NULL, "malformed JSON: line %d: %s", je.line, je.text);
	const char *param = NULL;
	enum llm_status st = !json_is_object(o) ? llm_fail(LLM_ERR_USAGE, "the body must be a JSON object")
	                     : tok ? llm_srv_tokenize(s, o, &out, &param) : llm_srv_detokenize(s, o, &out, &param);
	if (st) {   /* param points into O: the answer first */
		enum MHD_Result r = send_error(s, conn, K_COMPLETION, st == LLM_ERR_NOMEM ? 500 : 400, param, "%s", llm_errmsg());
		json_decref(o);
		return r;
	}
	json_decref(o);
	return send_json(conn, 200, out, NULL, NULL);
}

/* /v1/load_lora_adapter (LOAD) or /v1/unload_lora_adapter: server_api.c */
static enum MHD_Result do_lora(struct llm_server *s, struct MHD_Connection *conn, int load, const char *body, size_t len)
{
	if (!s->o.allow_runtime_lora)
		return send_error(s, conn, K_COMPLETION, 403, NULL, "%s LoRA adapters at run time is off: start llm-serve "
		                  "with --allow-runtime-lora", load ? "loading" : "unloading");
	json_error_t je;
	json_t *o = json_loadb(body, len, 0, &je);
	if (!o)
		return send_error(s, conn, K_COMPLETION, 400, NULL, "malformed JSON: line %d: %s", je.line, je.text);
	unsigned status;
	char msg[600];
	const char *param = NULL;
	llm_srv_lora_op(s, o, load, &status, msg, sizeof msg, &param);
	if (status != 200) {   /* param points into O: the answer first */
		enum MHD_Result r = send_error(s, conn, K_COMPLETION, status, param, "%s", msg);
		json_decref(o);
		return r;
	}
	json_decref(o);
	size_t n = strlen(msg);
	char *b = malloc(n + 2);
	if (!b)
		return MHD_NO;
	memcpy(b, msg, n);
	b[n++] = '\n';
	b[n] = 0;
	return send_text(conn, 200, "text/plain; charset=utf-8", b, n, NULL, NULL);
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
			if (cc->body.len + *upload_size > s->o.max_body)
				cc->too_large = 1;
			else if (llm_buf_append(&cc->body, upload, *upload_size))
				return MHD_NO;
		}
		*upload_size = 0;
		return MHD_YES;
	}
	enum kind tgi_k = strncmp(url, "/generate", 9) ? K_COMPLETION : K_TGI;
	if (cc->too_large)
		return send_error(s, conn, tgi_k, 413, NULL, "the body exceeds --max-body %zu bytes", s->o.max_body);
	if (!strcmp(url, "/health")) {
		if (!method_ok(method, "GET"))
			return send_error_allow(s, conn, tgi_k, 405, allow_of("GET"), NULL, "%s takes GET or HEAD, not %s", url, method);
		pthread_mutex_lock(&s->mu);
		enum llm_server_state st = s->state;
		pthread_mutex_unlock(&s->mu);
		const char *name = st == LLM_SERVER_READY ? "ready" : st == LLM_SERVER_LOADING ? "loading" :
		                   st == LLM_SERVER_DRAINING ? "draining" : "failed";
		return send_json(conn, st == LLM_SERVER_READY ? 200 : 503, json_pack("{s:s}", "status", name), NULL, NULL);
	}
	if (s->o.api_key) {
		const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
		if (!key_ok(a, s->o.api_key))
			return send_error(s, conn, tgi_k, 401, NULL, "missing or wrong API key (Authorization: Bearer KEY)");
	}
	static const struct { const char *url, *method; int what; } routes[] = {
		{ "/v1/completions", "POST", 0 }, { "/v1/chat/completions", "POST", 1 },
		{ "/generate", "POST", 2 }, { "/generate_stream", "POST", 3 },
		{ "/v1/models", "GET", 4 }, { "/metrics", "GET", 5 },
		{ "/tokenize", "POST", 6 }, { "/detokenize", "POST", 7 }, { "/info", "GET", 8 },
		{ "/v1/embeddings", "POST", 9 },
		{ "/v1/load_lora_adapter", "POST", 10 }, { "/v1/unload_lora_adapter", "POST", 11 },
	};
	for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
		if (strcmp(url, routes[i].url))
			continue;
		if (!method_ok(method, routes[i].method))
			return send_error_allow(s, conn, tgi_k, 405, allow_of(routes[i].method), NULL, "%s takes %s, not %s", url,
			                        allow_of(routes[i].method), method);
		const char *body = cc->body.p ? cc->body.p : "";
		switch (routes[i].what) {
		case 0: return do_generate(s, conn, K_COMPLETION, 0, body, cc->body.len);
		case 1: return do_generate(s, conn, K_CHAT, 0, body, cc->body.len);
		case 2: return do_generate(s, conn, K_TGI, 0, body, cc->body.len);
		case 3: return do_generate(s, conn, K_TGI, 1, body, cc->body.len);
		case 4: {
			pthread_mutex_lock(&s->mu);
			json_t *m = llm_srv_models(s);
			pthread_mutex_unlock(&s->mu);
			return send_json(conn, 200, m, NULL, NULL);
		}
		case 10: case 11: return do_lora(s, conn, routes[i].what == 10, body, cc->body.len);
		case 5: return do_metrics(s, conn);
		case 6: case 7: return do_tokens(s, conn, routes[i].what == 6, body, cc->body.len);
		case 8: return send_json(conn, 200, llm_srv_info(s), NULL, NULL);
		default:
			return send_error(s, conn, K_COMPLETION, 400, "model", "%s computes no embeddings: pooling a generative "
			                  "model's hidden states gives no trained embedding (llm-serve(1))", s->model_name);
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
		llm_buf_free(&cc->body);
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
	s->req_prompt.le = s->req_gen.le = llm_srv_tokens_le;
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
	if ((st = llm_tokenizer_open_model(&s->tk, o->model)) ||
	    (st = llm_gvocab_tokenizer(&s->gvocab, s->tk, llm_tokenizer_n_vocab(s->tk))))
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
	/* connection manners: an idle connection (a request that stalls, a
	 * TLS ClientHello sent to plain HTTP) is closed after o->timeout
	 * seconds; one address holds at most o->max_conn_per_client
	 * connections (more are closed at accept), so one client cannot take
	 * all o->max_connections */
	s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
	                        MHD_OPTION_SOCK_ADDR, ai->ai_addr,
	                        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
	                        MHD_OPTION_CONNECTION_LIMIT, o->max_connections ? o->max_connections : 1000u,
	                        MHD_OPTION_PER_IP_CONNECTION_LIMIT, o->max_conn_per_client,
	                        MHD_OPTION_CONNECTION_TIMEOUT, o->timeout,
	                        MHD_OPTION_END);
	freeaddrinfo(ai);
	if (!s->d) {
		st = llm_fail(LLM_ERR_IO, "%s:%d: cannot listen (address in use or not allowed)", o->host, o->port);
		goto fail;
	}
	const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
	s->port = di ? di->port : o->port;
	if (pthread_create(&s->engine_thread, NULL, llm_srv_engine_main, s)) {
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
	llm_engine_close(s->draft);
	llm_tokenizer_close(s->tk);
	llm_gvocab_free(s->gvocab);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->ecv);
	free(s->model_name);
	for (int i = 0; i < LLM_LORA_SLOTS; i++)
		free(s->lora_dir[i]);
	free(s->touched);
	free(s->template_src);
	free(s);
}
