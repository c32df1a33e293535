/* common/jobs/bench.c: llm-bench's load generator and model throughput test
 * (see bench.h). HTTP goes through libcurl: one easy handle per client,
 * reused across that client's requests so its connection is kept alive.
 * The streamed body is split into SSE events in the write callback, so a
 * token is timed when the bytes that complete its event arrive. */
#define _GNU_SOURCE
#include "bench.h"
#include "buf.h"
#include "generate.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "banned.h"

/* ---- HTTP through libcurl ---------------------------------------------- */

struct url { char host[256], port[8], prefix[512]; };

static enum llm_status parse_url(const char *u, struct url *x)
{
	memset(x, 0, sizeof *x);
	if (strncmp(u, "http://", 7))
		return llm_fail(LLM_ERR_USAGE, "%s: only http:// URLs are supported", u);
	const char *h = u + 7, *slash = strchr(h, '/'), *end = slash ? slash : h + strlen(h);
	const char *colon = memchr(h, ':', (size_t)(end - h));
	size_t hl = (size_t)((colon ? colon : end) - h);
	if (hl == 0 || hl >= sizeof x->host)
		return llm_fail(LLM_ERR_USAGE, "%s: no host", u);
	memcpy(x->host, h, hl);
	if (colon) {
		size_t pl = (size_t)(end - colon - 1);
		if (pl == 0 || pl >= sizeof x->port)
			return llm_fail(LLM_ERR_USAGE, "%s: bad port", u);
		memcpy(x->port, colon + 1, pl);
	} else {
		snprintf(x->port, sizeof x->port, "80");
	}
	snprintf(x->prefix, sizeof x->prefix, "%s", slash ? slash : "");
	size_t n = strlen(x->prefix);
	while (n > 0 && x->prefix[n - 1] == '/')
		x->prefix[--n] = 0;
	if (n >= 3 && !strcmp(x->prefix + n - 3, "/v1"))
		x->prefix[n - 3] = 0;       /* accept .../v1 as the base too */
	return LLM_OK;
}

static pthread_once_t curl_once = PTHREAD_ONCE_INIT;
static CURLcode curl_init_rc = CURLE_FAILED_INIT;

static void curl_init(void)
{
	curl_init_rc = curl_global_init(CURL_GLOBAL_DEFAULT);
}

/* curl_global_init, once per process (it is never cleaned up: the handles
 * of any thread may still use it). */
static enum llm_status http_global(void)
{
	pthread_once(&curl_once, curl_init);
	return curl_init_rc == CURLE_OK ? LLM_OK
	                                : llm_fail(LLM_ERR_IO, "libcurl: %s", curl_easy_strerror(curl_init_rc));
}

/* A client: one easy handle with its request headers, used by one thread at
 * a time for request after request (libcurl keeps the connection open). */
struct http {
	CURL *h;
	struct curl_slist *hdr;
	char err[CURL_ERROR_SIZE];  /* libcurl's message on the last failure */
};

static void http_close(struct http *c)
{
	if (c->h)
		curl_easy_cleanup(c->h);
	curl_slist_free_all(c->hdr);
	c->h = NULL;
	c->hdr = NULL;
}

static enum llm_status http_open(struct http *c, const char *api_key)
{
	memset(c, 0, sizeof *c);
	LLM_TRY(http_global());
	c->h = curl_easy_init();
	/* an empty Expect: sends a large body at once, without waiting for 100 Continue */
	struct curl_slist *a = curl_slist_append(NULL, "Content-Type: application/json");
	struct curl_slist *b = a ? curl_slist_append(a, "Expect:") : NULL;
	c->hdr = b ? b : a;
	int ok = c->h && b;
	if (ok && api_key) {
		size_t n = strlen(api_key) + 32;
		char *line = malloc(n);
		struct curl_slist *k = NULL;
		if (line) {
			snprintf(line, n, "Authorization: Bearer %s", api_key);
			k = curl_slist_append(c->hdr, line);   /* copies LINE */
			free(line);
		}
		ok = k != NULL;
	}
	if (!ok) {
		http_close(c);
		return llm_fail(LLM_ERR_NOMEM, "libcurl: out of memory");
	}
	curl_easy_setopt(c->h, CURLOPT_NOSIGNAL, 1L);        /* threads: timeouts without SIGALRM */
	curl_easy_setopt(c->h, CURLOPT_PROTOCOLS_STR, "http");
	curl_easy_setopt(c->h, CURLOPT_HTTPHEADER, c->hdr);
	curl_easy_setopt(c->h, CURLOPT_ERRORBUFFER, c->err);
	return LLM_OK;
}

/* POST BODY (GET when BODY is NULL) to PATH under U; the response body goes
 * to ON_BODY as it arrives (returning other than its size aborts). Returns
 * the HTTP status, or -1 when no response came (connection refused, a
 * timeout before the status line); c->err then says why. TIMEOUT bounds
 * the whole request, in seconds. */
static long http_request(struct http *c, const struct url *u, const char *path, const char *body,
                         double timeout, size_t (*on_body)(char *, size_t, size_t, void *), void *user)
{
	char url[sizeof u->host + sizeof u->port + sizeof u->prefix + 64];
	if ((size_t)snprintf(url, sizeof url, "http://%s:%s%s%s", u->host, u->port, u->prefix, path) >= sizeof url) {
		snprintf(c->err, sizeof c->err, "URL too long");
		return -1;
	}
	long ms = (long)(timeout * 1e3);
	c->err[0] = 0;
	curl_easy_setopt(c->h, CURLOPT_URL, url);
	if (body) {
		curl_easy_setopt(c->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)strlen(body));
		curl_easy_setopt(c->h, CURLOPT_POSTFIELDS, body);
	} else {
		curl_easy_setopt(c->h, CURLOPT_HTTPGET, 1L);
	}
	curl_easy_setopt(c->h, CURLOPT_TIMEOUT_MS, ms > 0 ? ms : 1L);   /* 0 would be no limit */
	curl_easy_setopt(c->h, CURLOPT_WRITEFUNCTION, on_body);
	curl_easy_setopt(c->h, CURLOPT_WRITEDATA, user);
	CURLcode rc = curl_easy_perform(c->h);
	long status = 0;
	curl_easy_getinfo(c->h, CURLINFO_RESPONSE_CODE, &status);
	if (rc != CURLE_OK && !c->err[0])
		snprintf(c->err, sizeof c->err, "%s", curl_easy_strerror(rc));
	return status > 0 ? status : -1;
}

/* ---- one streamed completion ------------------------------------------- */

struct req {
	const struct llm_bench_serve_opts *o;
	const struct url *u;
	const struct llm_bench_prompt *p;
	const char *model;
	struct pool *pool;          /* the run's idle clients (open loop) */
	double t_send, t_first, t_last, t_end;
	long status;
	int tokens, done, bad_json;
	double *gaps;               /* (tokens) inter-token gaps, s */
	int n_gaps;
	size_t cap_gaps;
	struct llm_buf sse;         /* the SSE text not yet split into events */
};

static void gap_add(struct req *q, double g)
{
	if (LLM_ARRAY_RESERVE(q->gaps, q->cap_gaps, (size_t)q->n_gaps + 1))
		return;
	q->gaps[q->n_gaps++] = g;
}

/* One "data: " event that arrived at time T. */
static void on_event(struct req *q, const char *data, size_t n, double t)
{
	if (n == 6 && !memcmp(data, "[DONE]", 6)) {
		q->done = 1;
		return;
	}
	json_t *o = json_loadb(data, n, 0, NULL);
	if (!o) {
		q->bad_json++;
		return;
	}
	int k = 0;
	json_t *ch = json_object_get(o, "choices");
	for (size_t i = 0; i < json_array_size(ch); i++)
		k += (int)json_array_size(json_object_get(json_array_get(ch, i), "token_ids"));
	json_decref(o);
	if (k == 0)
		return;
	if (q->tokens == 0)
		q->t_first = t;
	else
		gap_add(q, t - q->t_last);
	for (int i = 1; i < k; i++)
		gap_add(q, 0);
	q->t_last = t;
	q->tokens += k;
}

/* libcurl's write callback for a stream: every event that these bytes
 * complete (text up to a blank line) is timed at their arrival. */
static size_t on_sse(char *b, size_t size, size_t nmemb, void *user)
{
	struct req *q = user;
	double t = llm_now();
	size_t n = size * nmemb;
	if (llm_buf_append(&q->sse, b, n))
		return 0;
	char *e;
	while ((e = strstr(q->sse.p, "\n\n"))) {
		*e = 0;
		for (char *l = q->sse.p; l && *l;) {
			char *nl = strchr(l, '\n');
			if (nl)
				*nl = 0;
			if (!strncmp(l, "data: ", 6))
				on_event(q, l + 6, strlen(l + 6), t);
			l = nl ? nl + 1 : NULL;
		}
		size_t used = (size_t)(e + 2 - q->sse.p);
		memmove(q->sse.p, q->sse.p + used, q->sse.len - used + 1);
		q->sse.len -= used;
	}
	return n;
}

/* Send Q on client C (NULL: no client could be made, the request fails). */
static void run_req(struct req *q, struct http *c)
{
	json_t *b = json_pack("{s:s, s:i, s:f, s:f, s:b, s:b}", "model", q->model, "max_tokens", q->p->output_len,
	                      "temperature", q->o->temperature, "top_p", q->o->top_p > 0 ? q->o->top_p : 1.0, "stream", 1,
	                      "ignore_eos", 1);
	if (q->p->text) {
		json_object_set_new(b, "prompt", json_string(q->p->text));
	} else {
		json_t *a = json_array();
		for (int i = 0; i < q->p->n_ids; i++)
			json_array_append_new(a, json_integer(q->p->ids[i]));
		json_object_set_new(b, "prompt", a);
	}
	char *body = json_dumps(b, JSON_COMPACT);
	json_decref(b);
	q->t_send = llm_now();
	q->status = body && c ? http_request(c, q->u, "/v1/completions", body, q->o->timeout, on_sse, q) : -1;
	q->t_end = llm_now();
	free(body);
	llm_buf_free(&q->sse);
}

/* ---- runs -------------------------------------------------------------- */

static size_t on_whole(char *b, size_t size, size_t nmemb, void *user)
{
	return llm_buf_append(user, b, size * nmemb) ? 0 : size * nmemb;
}

enum llm_status llm_bench_serve_model(const struct llm_bench_serve_opts *o, char **name)
{
	struct url u;
	LLM_TRY(parse_url(o->url, &u));
	*name = NULL;
	if (o->model) {
		*name = strdup(o->model);
		return *name ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	struct http c;
	LLM_TRY(http_open(&c, o->api_key));
	struct llm_buf body = { 0 };
	long st = http_request(&c, &u, "/v1/models", NULL, 10, on_whole, &body);
	enum llm_status rc = LLM_OK;
	if (st != 200) {
		rc = st < 0 ? llm_fail(LLM_ERR_IO, "%s: cannot connect (%s)", o->url, c.err)
		            : llm_fail(LLM_ERR_IO, "%s/v1/models: HTTP %ld", o->url, st);
		goto out;
	}
	json_t *j = body.p ? json_loads(body.p, 0, NULL) : NULL;
	const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
	if (id)
		*name = strdup(id);
	json_decref(j);
	if (!*name)
		rc = llm_fail(LLM_ERR_FORMAT, "%s/v1/models: no model id", o->url);
out:
	llm_buf_free(&body);
	http_close(&c);
	return rc;
}

static int cmp_d(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return x < y ? -1 : x > y;
}

/* Nearest-rank percentiles 50, 90, 99 of V (N values, sorted here), in ms. */
static void pct(double *v, int n, double out[3])
{
	static const double q[3] = { 0.50, 0.90, 0.99 };
	if (n == 0) {
		out[0] = out[1] = out[2] = NAN;
		return;
	}
	qsort(v, (size_t)n, sizeof *v, cmp_d);
	for (int i = 0; i < 3; i++) {
		int k = (int)ceil(q[i] * n) - 1;
		out[i] = 1e3 * v[k < 0 ? 0 : k >= n ? n - 1 : k];
	}
}

/* A run's clients: a closed-loop worker keeps one for all its requests; an
 * open-loop request takes an idle one (or opens one) and gives it back, so
 * a later request reuses its connection. */
struct pool {
	pthread_mutex_t mu;
	pthread_cond_t cv;          /* signalled when a request or a thread ends */
	int n_done, n_exit;         /* requests finished, threads finished */
	int next, n;                /* closed loop: the next of N requests */
	struct req *q;
	double t_stop;
	const char *api_key;
	struct http **idle;         /* (n) clients not in use: one per request at most */
	int n_idle;
};

/* An idle client, or a new one; NULL when none can be made. */
static struct http *client_get(struct pool *p)
{
	struct http *c = NULL;
	pthread_mutex_lock(&p->mu);
	if (p->n_idle > 0)
		c = p->idle[--p->n_idle];
	pthread_mutex_unlock(&p->mu);
	if (!c && (c = malloc(sizeof *c)) && http_open(c, p->api_key)) {
		free(c);
		c = NULL;
	}
	return c;
}

static void client_put(struct pool *p, struct http *c)
{
	if (!c)
		return;
	pthread_mutex_lock(&p->mu);
	p->idle[p->n_idle++] = c;
	pthread_mutex_unlock(&p->mu);
}

/* Count a finished request (and the end of its thread when EXIT). */
static void pool_count(struct pool *p, int request, int exit)
{
	pthread_mutex_lock(&p->mu);
	p->n_done += request;
	p->n_exit += exit;
	pthread_cond_signal(&p->cv);
	pthread_mutex_unlock(&p->mu);
}

/* Progress: copy the count of finished requests in and tick. */
static void pool_tick(struct pool *p, struct llm_progress *pg)
{
	if (!pg || !pg->out)
		return;
	pthread_mutex_lock(&p->mu);
	pg->items = (uint64_t)p->n_done;
	pthread_mutex_unlock(&p->mu);
	llm_progress_tick(pg);
}

/* Wait until N_THREADS threads have ended, ticking PG (0.25 s at most apart
 * while it has a stream); the threads are then joined at once. */
static void pool_wait(struct pool *p, int n_threads, struct llm_progress *pg)
{
	pthread_mutex_lock(&p->mu);
	while (p->n_exit < n_threads) {
		if (pg && pg->out) {
			struct timespec ts;
			clock_gettime(CLOCK_REALTIME, &ts);
			ts.tv_nsec += 250000000;
			if (ts.tv_nsec >= 1000000000) {
				ts.tv_sec++;
				ts.tv_nsec -= 1000000000;
			}
			pthread_cond_timedwait(&p->cv, &p->mu, &ts);
			pg->items = (uint64_t)p->n_done;
			pthread_mutex_unlock(&p->mu);
			llm_progress_tick(pg);
			pthread_mutex_lock(&p->mu);
		} else {
			pthread_cond_wait(&p->cv, &p->mu);
		}
	}
	pthread_mutex_unlock(&p->mu);
}

static void *conc_worker(void *arg)
{
	struct pool *p = arg;
	struct http *c = client_get(p);
	for (;;) {
		pthread_mutex_lock(&p->mu);
		int i = p->next < p->n && (p->t_stop == 0 || llm_now() < p->t_stop) ? p->next++ : -1;
		pthread_mutex_unlock(&p->mu);
		if (i < 0)
			break;
		run_req(&p->q[i], c);
		pool_count(p, 1, 0);
	}
	client_put(p, c);
	pool_count(p, 0, 1);
	return NULL;
}

static void *open_req(void *arg)
{
	struct req *q = arg;
	struct http *c = client_get(q->pool);
	run_req(q, c);
	client_put(q->pool, c);
	pool_count(q->pool, 1, 1);
	return NULL;
}

/* The server's speculative-decoding counters (vLLM's names, every label
 * set summed): drafted and accepted tokens; both -1 when /metrics cannot be
 * read or has neither. */
static void spec_counts(const struct llm_bench_serve_opts *o, const struct url *u, double c[2])
{
	static const char *name[2] = { "vllm:spec_decode_num_draft_tokens_total", "vllm:spec_decode_num_accepted_tokens_total" };
	c[0] = c[1] = -1;
	struct http h;
	if (http_open(&h, o->api_key))
		return;
	struct llm_buf body = { 0 };
	if (http_request(&h, u, "/metrics", NULL, 10, on_whole, &body) == 200 && body.p && !llm_buf_append(&body, "", 1)) {
		for (char *save = NULL, *l = strtok_r(body.p, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
			for (int k = 0; k < 2; k++) {
				size_t n = strlen(name[k]);
				const char *v = strrchr(l, ' ');
				if (!strncmp(l, name[k], n) && (l[n] == ' ' || l[n] == '{') && v)
					c[k] = (c[k] < 0 ? 0 : c[k]) + strtod(v + 1, NULL);
			}
	}
	llm_buf_free(&body);
	http_close(&h);
}

enum llm_status llm_bench_serve_run(const struct llm_bench_serve_opts *o, double rate, int concurrency,
                                    struct llm_bench_serve_result *r)
{
	memset(r, 0, sizeof *r);
	r->rate = rate;
	r->concurrency = concurrency;
	struct url u;
	LLM_TRY(parse_url(o->url, &u));
	if (o->n_prompts < 1 || o->n_requests < 1)
		return llm_fail(LLM_ERR_USAGE, "bench: no prompts or requests");
	LLM_TRY(http_global());
	char *model = NULL;
	LLM_TRY(llm_bench_serve_model(o, &model));
	double spec0[2], spec1[2];
	spec_counts(o, &u, spec0);
	int n = o->n_requests;
	struct req *q = calloc((size_t)n, sizeof *q);
	pthread_t *th = calloc((size_t)n, sizeof *th);
	char *started = calloc((size_t)n, 1);
	struct pool p = { .n = n, .q = q, .api_key = o->api_key, .idle = calloc((size_t)n, sizeof *p.idle) };
	if (!q || !th || !started || !p.idle) {
		free(q);
		free(th);
		free(started);
		free(p.idle);
		free(model);
		return llm_fail(LLM_ERR_NOMEM, "bench: out of memory");
	}
	pthread_mutex_init(&p.mu, NULL);
	pthread_cond_init(&p.cv, NULL);
	struct llm_progress *pg = o->progress;
	if (pg) {
		pg->items = 0;
		pg->n_items = (uint64_t)n;
		pg->n_bytes = 0;
		pg->noun = "requests";
		if (concurrency > 0)
			snprintf(pg->note, sizeof pg->note, "concurrency %d", concurrency);
		else
			snprintf(pg->note, sizeof pg->note, "rate %g req/s", rate);
	}
	int n_started = 0;
	for (int i = 0; i < n; i++) {
		q[i].o = o;
		q[i].u = &u;
		q[i].p = &o->prompts[i % o->n_prompts];
		q[i].model = model;
		q[i].pool = &p;
	}
	double t0 = llm_now();
	if (concurrency > 0) {
		p.t_stop = o->duration > 0 ? t0 + o->duration : 0;
		int nt = concurrency < n ? concurrency : n;
		for (int i = 0; i < nt; i++)
			n_started += started[i] = !pthread_create(&th[i], NULL, conc_worker, &p);
		pool_wait(&p, n_started, pg);
		for (int i = 0; i < nt; i++)
			if (started[i])
				pthread_join(th[i], NULL);
		for (int i = 0; i < n; i++)
			started[i] = q[i].t_send > 0;
	} else {
		/* open loop: exponential gaps (xorshift), whatever the server does */
		uint64_t x = o->seed * 0x9E3779B97F4A7C15ull + 1;
		double next = t0;
		for (int i = 0; i < n; i++) {
			if (o->duration > 0 && next - t0 > o->duration)
				break;
			double wait;
			while ((wait = next - llm_now()) > 0) {    /* in slices of 0.25 s when ticking */
				if (pg && pg->out && wait > 0.25)
					wait = 0.25;
				struct timespec ts = { (time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9) };
				nanosleep(&ts, NULL);
				pool_tick(&p, pg);
			}
			n_started += started[i] = !pthread_create(&th[i], NULL, open_req, &q[i]);
			if (isfinite(rate) && rate > 0) {
				x ^= x << 13;
				x ^= x >> 7;
				x ^= x << 17;
				double uu = ((double)(x >> 11) + 0.5) / 9007199254740992.0;
				next += -log(uu) / rate;
			}
		}
		pool_wait(&p, n_started, pg);
		for (int i = 0; i < n; i++)
			if (started[i])
				pthread_join(th[i], NULL);
	}
	for (int i = 0; i < p.n_idle; i++) {
		http_close(p.idle[i]);
		free(p.idle[i]);
	}
	free(p.idle);
	pthread_cond_destroy(&p.cv);
	pthread_mutex_destroy(&p.mu);
	/* statistics */
	double *ttft = calloc((size_t)n, sizeof(double)), *tpot = calloc((size_t)n, sizeof(double));
	double *e2e = calloc((size_t)n, sizeof(double));
	int64_t n_itl = 0;
	for (int i = 0; i < n; i++)
		n_itl += q[i].n_gaps;
	double *itl = calloc((size_t)n_itl + 1, sizeof(double));
	int nt = 0, np = 0, good = 0;
	double t_first = INFINITY, t_last = 0;
	n_itl = 0;
	for (int i = 0; i < n && ttft && tpot && e2e && itl; i++) {
		struct req *x = &q[i];
		if (!started[i])
			continue;
		r->sent++;
		if (x->t_send < t_first)
			t_first = x->t_send;
		if (x->t_end > t_last)
			t_last = x->t_end;
		if (x->status == 429) {
			r->rejected++;
			continue;
		}
		if (x->status != 200 || !x->done || x->bad_json || x->tokens != x->p->output_len) {
			r->wrong++;
			continue;
		}
		r->completed++;
		r->out_tokens += x->tokens;
		double tt = x->t_first - x->t_send, e = x->t_end - x->t_send;
		double tp = x->tokens > 1 ? (e - tt) / (x->tokens - 1) : 0;
		ttft[nt++] = tt;
		e2e[np] = e;
		tpot[np++] = tp;
		memcpy(itl + n_itl, x->gaps, (size_t)x->n_gaps * sizeof(double));
		n_itl += x->n_gaps;
		if (1e3 * tt <= o->slo_ttft_ms && 1e3 * tp <= o->slo_itl_ms)
			good++;
	}
	r->wall = t_last > t_first ? t_last - t_first : 0;
	if (r->wall > 0) {
		r->req_s = r->completed / r->wall;
		r->out_tok_s = (double)r->out_tokens / r->wall;
		r->goodput = good / r->wall;
	}
	if (ttft && tpot && e2e && itl) {
		pct(ttft, nt, r->ttft);
		pct(tpot, np, r->tpot);
		pct(e2e, np, r->e2e);
		pct(itl, (int)n_itl, r->itl);
	}
	r->itl_median_ms = r->itl[0];
	spec_counts(o, &u, spec1);
	r->spec_accept = spec0[0] >= 0 && spec1[0] > spec0[0] && spec1[1] >= 0
	                 ? 100.0 * (spec1[1] - (spec0[1] > 0 ? spec0[1] : 0)) / (spec1[0] - spec0[0]) : NAN;
	for (int i = 0; i < n; i++)
		free(q[i].gaps);
	free(ttft);
	free(tpot);
	free(e2e);
	free(itl);
	free(q);
	free(th);
	free(started);
	free(model);
	return LLM_OK;
}

/* ---- output ------------------------------------------------------------ */

static const char *cols[] = { "rate", "conc", "sent", "done", "429", "#wrong", "req/s", "out tok/s", "goodput",
	"ttft_p50", "ttft_p90", "ttft_p99", "itl_p50", "itl_p90", "itl_p99", "tpot_p50", "tpot_p90", "tpot_p99",
	"e2e_p50", "e2e_p90", "e2e_p99", "accept" };
static const char *units[] = { "(req/s)", "", "", "", "", "", "(req/s)", "(tok/s)", "(req/s)",
	"(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(%)" };
#define N_COLS (int)(sizeof cols / sizeof *cols)

void llm_bench_serve_header(FILE *out, enum llm_bench_format f)
{
	if (f == LLM_BENCH_JSONL)
		return;
	for (int i = 0; i < N_COLS; i++)
		fprintf(out, f == LLM_BENCH_CSV ? "%s%s" : "%s%9s", i ? (f == LLM_BENCH_CSV ? "," : " ") : "", cols[i]);
	fputc('\n', out);
	for (int i = 0; i < N_COLS; i++)
		fprintf(out, f == LLM_BENCH_CSV ? "%s%s" : "%s%9s", i ? (f == LLM_BENCH_CSV ? "," : " ") : "", units[i]);
	fputc('\n', out);
}

void llm_bench_serve_row(FILE *out, enum llm_bench_format f, const struct llm_bench_serve_result *r)
{
	double v[] = { r->rate, r->concurrency, r->sent, r->completed, r->rejected, r->wrong, r->req_s, r->out_tok_s,
		r->goodput, r->ttft[0], r->ttft[1], r->ttft[2], r->itl[0], r->itl[1], r->itl[2], r->tpot[0], r->tpot[1],
		r->tpot[2], r->e2e[0], r->e2e[1], r->e2e[2], r->spec_accept };
	if (f == LLM_BENCH_JSONL) {
		static const char *keys[] = { "rate", "concurrency", "sent", "completed", "rejected", "wrong", "req_s",
			"out_tok_s", "goodput", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms",
			"itl_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms",
			"spec_accept_pct" };
		fputc('{', out);
		for (int i = 0; i < N_COLS; i++) {
			if (isfinite(v[i]))
				fprintf(out, "%s\"%s\": %.6g", i ? ", " : "", keys[i], v[i]);
			else
				fprintf(out, "%s\"%s\": null", i ? ", " : "", keys[i]);
		}
		fputs("}\n", out);
		return;
	}
	for (int i = 0; i < N_COLS; i++) {
		const char *sep = i ? (f == LLM_BENCH_CSV ? "," : " ") : "";
		if (i == 0 && isinf(v[i]))
			fprintf(out, f == LLM_BENCH_CSV ? "%sinf" : "%s%9s", sep, "inf");
		else if (i >= 1 && i <= 5)
			fprintf(out, f == LLM_BENCH_CSV ? "%s%.0f" : "%s%9.0f", sep, v[i]);
		else
			fprintf(out, f == LLM_BENCH_CSV ? "%s%.4g" : "%s%9.4g", sep, v[i]);
	}
	fputc('\n', out);
}

int llm_bench_serve_realtime(const struct llm_bench_serve_result *r, int n, double slo_ttft_ms, double slo_itl_ms)
{
	int best = -1;
	for (int i = 0; i < n; i++)
		if (r[i].rate > 0 && isfinite(r[i].rate) && llm_bench_serve_keeps_up(&r[i]) && !r[i].wrong &&
		    r[i].ttft[2] <= slo_ttft_ms && r[i].itl[2] <= slo_itl_ms && (best < 0 || r[i].rate > r[best].rate))
			best = i;
	return best;
}

int llm_bench_serve_keeps_up(const struct llm_bench_serve_result *r)
{
	return !r->rejected && r->completed == r->sent && (isinf(r->rate) || r->req_s >= 0.8 * r->rate);
}

enum llm_status llm_bench_serve_plot(const char *path, const struct llm_bench_serve_result *r, int n,
                                     const char *title, double realtime)
{
	char dat[1200], gp[1200];
	snprintf(dat, sizeof dat, "%s.dat", path);
	snprintf(gp, sizeof gp, "%s.gp", path);
	FILE *f = fopen(dat, "w");
	if (!f)
		return llm_fail(LLM_ERR_IO, "%s: cannot write", dat);
	fprintf(f, "# rate req_s out_tok_s ttft_p50 ttft_p99 itl_p50 itl_p99 e2e_p50 e2e_p99 (ms)\n");
	for (int i = 0; i < n; i++)
		fprintf(f, "%g %g %g %g %g %g %g %g %g\n", r[i].rate, r[i].req_s, r[i].out_tok_s, r[i].ttft[0],
		        r[i].ttft[2], r[i].itl[0], r[i].itl[2], r[i].e2e[0], r[i].e2e[2]);
	fclose(f);
	const char *ext = strrchr(path, '.');
	int png = ext && !strcmp(ext, ".png");
	f = fopen(gp, "w");
	if (!f)
		return llm_fail(LLM_ERR_IO, "%s: cannot write", gp);
	fprintf(f, "set terminal %s size 1100,480\nset output '%s'\n", png ? "png" : "svg", path);
	if (realtime > 0)   /* the knee: the highest rate that met the SLO */
		fprintf(f, "set arrow from %g, graph 0 to %g, graph 1 nohead dt 2 lc rgb 'red'\n"
		           "set label 'real-time up to %g req/s' at %g, graph 0.95 right offset -0.5,0 tc rgb 'red'\n",
		        realtime, realtime, realtime, realtime);
	fprintf(f, "set multiplot layout 1,2 title \"%s\"\nset grid\nset key top left\n"
	           "set xlabel 'arrival rate (req/s)'\nset ylabel 'latency (ms)'\nset logscale y\n"
	           "plot '%s' u 1:4 w lp t 'TTFT p50', '' u 1:5 w lp t 'TTFT p99', '' u 1:6 w lp t 'ITL p50', "
	           "'' u 1:7 w lp t 'ITL p99', '' u 1:8 w lp t 'e2e p50', '' u 1:9 w lp t 'e2e p99'\n"
	           "unset logscale y\nset ylabel 'throughput'\n"
	           "plot '%s' u 1:3 w lp t 'output tok/s', '' u 1:($2*100) w lp t 'completed req/s x100'\n"
	           "unset multiplot\n",
	        title, dat, dat);
	fclose(f);
	char cmd[2600];
	snprintf(cmd, sizeof cmd, "gnuplot '%s' 2>&1", gp);
	FILE *p = popen(cmd, "r");
	if (!p)
		return llm_fail(LLM_ERR_IO, "gnuplot: cannot run");
	char line[512], first[512] = "";
	while (fgets(line, sizeof line, p))
		if (!first[0])
			snprintf(first, sizeof first, "%s", line);
	int rc = pclose(p);
	if (rc != 0) {
		size_t l = strlen(first);
		if (l && first[l - 1] == '\n')
			first[l - 1] = 0;
		return llm_fail(LLM_ERR_IO, "%s: gnuplot failed (exit %d)%s%s", path, rc, first[0] ? ": " : "", first);
	}
	return LLM_OK;
}

/* ---- model throughput -------------------------------------------------- */

static double sd_of(const double *v, int n, double mean)
{
	double s = 0;
	for (int i = 0; i < n; i++)
		s += (v[i] - mean) * (v[i] - mean);
	return n > 1 ? sqrt(s / (n - 1)) : 0;
}

enum llm_status llm_bench_model(const char *ckpt, const struct llm_bench_model_opts *o,
                                struct llm_bench_model_result *r, int *n_r)
{
	*n_r = 0;
	int b = o->batch > 0 ? o->batch : 1, reps = o->reps > 0 ? o->reps : 1;
	struct llm_engine_opts eo = LLM_ENGINE_OPTS_DEFAULT;
	eo.backend = o->backend;
	eo.n_threads = o->n_threads;
	eo.weight_pages = (enum llm_weight_pages)o->weight_pages;
	eo.lm_head = (enum llm_lm_head)o->lm_head;
	if (o->kv_dtype)
		eo.kv_dtype = (enum llm_dtype)o->kv_dtype;
	int d = o->n_depth > 0 ? o->n_depth : 0;
	eo.max_seqs = d ? 2 * b : b;
	eo.max_batch_tokens = o->n_prompt > b ? o->n_prompt : b;
	if (d > eo.max_batch_tokens)
		eo.max_batch_tokens = d;
	eo.max_logits = b;
	eo.n_ctx = d + (o->n_prompt > o->n_gen + 1 ? o->n_prompt : o->n_gen + 1) + 1;
	/* every sequence holds a whole context: the default pool (4096
	 * positions a sequence) is too small past that depth; with a depth,
	 * B context sequences and B forks of them, each fork's own blocks
	 * its test's positions and a copy of a shared last block */
	int bs = eo.kv_block_size > 0 ? eo.kv_block_size : 16;
	eo.kv_blocks = (int64_t)b * ((eo.n_ctx + bs - 1) / bs + 1);
	if (d)
		eo.kv_blocks += (int64_t)b * ((eo.n_ctx - d + bs - 1) / bs + 2);
	struct llm_engine *e;
	LLM_TRY(llm_engine_open(&e, ckpt, &eo));
	llm_engine_weights_settle(e, 1);   /* no timed step beside the huge-page copy */
	if (llm_engine_n_ctx(e) < eo.n_ctx - 1) {
		int have = llm_engine_n_ctx(e);
		llm_engine_close(e);
		return llm_fail(LLM_ERR_USAGE, "%s: -d %d and the tests need %d positions, the model's context is %d",
		                ckpt, d, eo.n_ctx - 1, have);
	}
	struct llm_kv *kv = llm_engine_kv(e);
	int nv = llm_engine_model(e)->cfg.n_vocab;
	int nmax = eo.max_batch_tokens;
	int32_t *tok = malloc((size_t)nmax * sizeof *tok), *pos = malloc((size_t)nmax * sizeof *pos);
	int32_t *seq = malloc((size_t)nmax * sizeof *seq), *seqs = malloc((size_t)b * sizeof *seqs);
	int32_t *ctx = malloc((size_t)b * sizeof *ctx);
	int8_t *want = malloc((size_t)nmax);
	double *t = malloc((size_t)reps * sizeof *t);
	enum llm_status st = LLM_OK;
	uint64_t x = 88172645463325252ull;
	int n_ctx_seq = 0;
	if (!tok || !pos || !seq || !seqs || !ctx || !want || !t) {
		st = llm_fail(LLM_ERR_NOMEM, "bench: out of memory");
		goto out;
	}
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, (int32_t)(x % (uint64_t)nv))
	/* the context the tests start after: one untimed prefill of D random
	 * tokens per sequence, once; every run forks these (llm_kv_seq_fork:
	 * the blocks are shared, its first write copies a shared last block)
	 * rather than prefilling again, so -r N at a deep context costs one
	 * prefill, not 2 (N + 1) */
	for (int i = 0; i < b && d && !st; i++) {
		st = llm_kv_seq_new(kv, &ctx[i]);
		if (st)
			break;
		n_ctx_seq++;
		for (int j = 0; j < d; j++) {
			tok[j] = RND();
			pos[j] = j;
			seq[j] = ctx[i];
			want[j] = 0;
		}
		want[d - 1] = 1;
		const float *lg;
		int n_out;
		struct llm_batch bt = { d, tok, pos, seq, want, NULL };
		st = llm_engine_forward(e, &bt, &lg, &n_out);
	}
	struct llm_progress *pg = o->progress;
	if (pg) {             /* runs of this call: a warm-up and the repetitions of each test */
		pg->items = 0;
		pg->n_items = (uint64_t)((o->n_prompt > 0) + (o->n_gen > 0)) * (uint64_t)(reps + 1);
		pg->n_bytes = 0;
		pg->noun = "runs";
	}
	for (int test = 0; test < 2 && !st; test++) {
		int n = test == 0 ? o->n_prompt : o->n_gen;
		if (n <= 0)
			continue;
		struct llm_bench_model_result *res = &r[(*n_r)++];
		memset(res, 0, sizeof *res);
		char at[24] = "";
		if (d)
			snprintf(at, sizeof at, " @ d%d", d);
		if (test == 0)
			snprintf(res->test, sizeof res->test, "pp%d%s", n, at);
		else
			snprintf(res->test, sizeof res->test, "tg%d x%d%s", n, b, at);
		if (pg)
			snprintf(pg->note, sizeof pg->note, "%s %s", o->backend ? o->backend : "auto", res->test);
		for (int k = 0; k < reps + 1 && !st; k++) {     /* one warm-up run */
			int ns = test == 0 ? 1 : b, made;
			for (made = 0; made < ns; made++) {
				st = d ? llm_kv_seq_fork(kv, ctx[made], d, &seqs[made]) : llm_kv_seq_new(kv, &seqs[made]);
				if (st)
					break;
			}
			if (st) {
				for (int i = 0; i < made; i++)
					llm_kv_seq_free(kv, seqs[i]);
				break;
			}
			const float *lg;
			int n_out;
			double t0 = llm_now();
			if (test == 0) {
				for (int i = 0; i < n; i++) {
					tok[i] = RND();
					pos[i] = d + i;
					seq[i] = seqs[0];
				}
				struct llm_batch bt = { n, tok, pos, seq, NULL, NULL };
				st = llm_engine_forward(e, &bt, &lg, &n_out);
				if (!st && !isfinite(lg[0]))
					res->wrong++;
			} else {
				for (int s = 0; s < n && !st; s++) {
					for (int i = 0; i < b; i++) {
						tok[i] = RND();
						pos[i] = d + s;
						seq[i] = seqs[i];
						want[i] = 1;
					}
					struct llm_batch bt = { b, tok, pos, seq, want, NULL };
					st = llm_engine_forward(e, &bt, &lg, &n_out);
					if (!st && !isfinite(lg[(size_t)(n_out - 1) * (size_t)nv]))
						res->wrong++;
					llm_progress_tick(pg);      /* a clock read until a line is due */
				}
			}
			double dt = llm_now() - t0;
			for (int i = 0; i < ns; i++)
				llm_kv_seq_free(kv, seqs[i]);
			if (k > 0)
				t[k - 1] = (double)(test == 0 ? n : n * b) / dt;
			if (pg) {
				pg->items++;
				llm_progress_tick(pg);
			}
		}
		double m = 0;
		for (int k = 0; k < reps; k++)
			m += t[k];
		res->mean = m / reps;
		res->sd = sd_of(t, reps, res->mean);
	}
#undef RND
out:
	for (int i = 0; i < n_ctx_seq; i++)
		llm_kv_seq_free(kv, ctx[i]);
	free(ctx);
	free(tok);
	free(pos);
	free(seq);
	free(seqs);
	free(want);
	free(t);
	llm_engine_close(e);
	return st;
}
