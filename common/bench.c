/* common/bench.c: llm-bench's load generator and model throughput test
 * (see bench.h). The HTTP client is a plain HTTP/1.1 client on a socket
 * (one connection per request, Connection: close), enough for loopback and
 * for any server speaking chunked or close-delimited bodies. */
#define _GNU_SOURCE
#include "bench.h"
#include "generate.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
#include "banned.h"

/* ---- a minimal HTTP client --------------------------------------------- */

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

static int http_connect(const struct url *u, double timeout)
{
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM }, *ai, *p;
	if (getaddrinfo(u->host, u->port, &hints, &ai))
		return -1;
	int fd = -1;
	for (p = ai; p; p = p->ai_next) {
		fd = socket(p->ai_family, p->ai_socktype, p->ai_protocol);
		if (fd < 0)
			continue;
		struct timeval tv = { (time_t)timeout, (suseconds_t)((timeout - (double)(time_t)timeout) * 1e6) };
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
		setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
		if (connect(fd, p->ai_addr, p->ai_addrlen) == 0)
			break;
		close(fd);
		fd = -1;
	}
	freeaddrinfo(ai);
	return fd;
}

static int send_all(int fd, const char *b, size_t n)
{
	while (n) {
		ssize_t w = send(fd, b, n, MSG_NOSIGNAL);
		if (w <= 0) {
			if (w < 0 && errno == EINTR)
				continue;
			return -1;
		}
		b += w;
		n -= (size_t)w;
	}
	return 0;
}

/* A response being read: headers, then the body (de-chunked) handed to
 * on_body as it arrives. */
struct resp {
	int status, chunked, headers_done;
	char *raw;                  /* bytes received, not yet consumed */
	size_t raw_len, raw_cap;
	int64_t chunk_left;         /* bytes left in the current chunk; -1: need a size line */
	int body_done;
	void (*on_body)(void *, const char *, size_t);
	void *user;
};

static int raw_add(struct resp *r, const char *b, size_t n)
{
	if (r->raw_len + n + 1 > r->raw_cap) {
		size_t cap = (r->raw_len + n + 1) * 2;
		char *x = realloc(r->raw, cap);
		if (!x)
			return -1;
		r->raw = x;
		r->raw_cap = cap;
	}
	memcpy(r->raw + r->raw_len, b, n);
	r->raw_len += n;
	r->raw[r->raw_len] = 0;
	return 0;
}

static void raw_drop(struct resp *r, size_t n)
{
	memmove(r->raw, r->raw + n, r->raw_len - n + 1);
	r->raw_len -= n;
}

/* Consume what can be consumed of r->raw. */
static void resp_feed(struct resp *r)
{
	if (!r->headers_done) {
		char *e = strstr(r->raw, "\r\n\r\n");
		if (!e)
			return;
		*e = 0;
		int maj, min;
		if (sscanf(r->raw, "HTTP/%d.%d %d", &maj, &min, &r->status) != 3)
			r->status = -1;
		for (char *l = strstr(r->raw, "\r\n"); l; l = strstr(l + 2, "\r\n"))
			if (!strncasecmp(l + 2, "Transfer-Encoding:", 18) && strcasestr(l + 2, "chunked"))
				r->chunked = 1;
		r->headers_done = 1;
		r->chunk_left = -1;
		raw_drop(r, (size_t)(e + 4 - r->raw));
	}
	if (!r->chunked) {
		if (r->raw_len)
			r->on_body(r->user, r->raw, r->raw_len);
		raw_drop(r, r->raw_len);
		return;
	}
	while (!r->body_done) {
		if (r->chunk_left < 0) {
			char *nl = strstr(r->raw, "\r\n");
			if (!nl)
				return;
			r->chunk_left = strtoll(r->raw, NULL, 16);
			raw_drop(r, (size_t)(nl + 2 - r->raw));
			if (r->chunk_left == 0) {
				r->body_done = 1;
				return;
			}
		}
		if (r->raw_len == 0)
			return;
		size_t take = r->raw_len < (size_t)r->chunk_left ? r->raw_len : (size_t)r->chunk_left;
		r->on_body(r->user, r->raw, take);
		raw_drop(r, take);
		r->chunk_left -= (int64_t)take;
		if (r->chunk_left == 0) {
			if (r->raw_len < 2)
				return;         /* wait for the CRLF after the chunk */
			raw_drop(r, 2);
			r->chunk_left = -1;
		}
	}
}

/* POST (or GET when BODY is NULL) PATH; the body goes to ON_BODY. Returns
 * the HTTP status, or -1 when the connection failed. */
static int http_request(const struct url *u, const char *api_key, const char *path, const char *body,
                        double timeout, void (*on_body)(void *, const char *, size_t), void *user)
{
	int fd = http_connect(u, timeout);
	if (fd < 0)
		return -1;
	char head[2048];
	int hn = snprintf(head, sizeof head,
	                  "%s %s%s HTTP/1.1\r\nHost: %s:%s\r\nConnection: close\r\nAccept: */*\r\n%s%s%s"
	                  "Content-Type: application/json\r\nContent-Length: %zu\r\n\r\n",
	                  body ? "POST" : "GET", u->prefix, path, u->host, u->port,
	                  api_key ? "Authorization: Bearer " : "", api_key ? api_key : "", api_key ? "\r\n" : "",
	                  body ? strlen(body) : 0);
	struct resp r = { .on_body = on_body, .user = user };
	int status = -1;
	if (hn > 0 && (size_t)hn < sizeof head && !send_all(fd, head, (size_t)hn) &&
	    (!body || !send_all(fd, body, strlen(body)))) {
		char buf[16384];
		for (;;) {
			ssize_t n = recv(fd, buf, sizeof buf, 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0)
				break;
			if (raw_add(&r, buf, (size_t)n))
				break;
			resp_feed(&r);
			if (r.body_done)
				break;
		}
		if (r.headers_done)
			status = r.status;
	}
	close(fd);
	free(r.raw);
	return status;
}

/* ---- one streamed completion ------------------------------------------- */

struct req {
	const struct llm_bench_serve_opts *o;
	const struct url *u;
	const struct llm_bench_prompt *p;
	const char *model;
	double t_send, t_first, t_last, t_end;
	int status, tokens, done, bad_json;
	double *gaps;               /* (tokens) inter-token gaps, s */
	int n_gaps, cap_gaps;
	char *line;                 /* the SSE text not yet split into events */
	size_t len, cap;
};

static void gap_add(struct req *q, double g)
{
	if (q->n_gaps == q->cap_gaps) {
		int cap = q->cap_gaps ? 2 * q->cap_gaps : 64;
		double *x = realloc(q->gaps, (size_t)cap * sizeof *x);
		if (!x)
			return;
		q->gaps = x;
		q->cap_gaps = cap;
	}
	q->gaps[q->n_gaps++] = g;
}

static void on_event(struct req *q, const char *data, size_t n)
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
	double t = llm_now();
	if (q->tokens == 0)
		q->t_first = t;
	else
		gap_add(q, t - q->t_last);
	for (int i = 1; i < k; i++)
		gap_add(q, 0);
	q->t_last = t;
	q->tokens += k;
}

static void on_body(void *user, const char *b, size_t n)
{
	struct req *q = user;
	if (q->len + n + 1 > q->cap) {
		size_t cap = (q->len + n + 1) * 2;
		char *x = realloc(q->line, cap);
		if (!x)
			return;
		q->line = x;
		q->cap = cap;
	}
	memcpy(q->line + q->len, b, n);
	q->len += n;
	q->line[q->len] = 0;
	char *e;
	while ((e = strstr(q->line, "\n\n"))) {
		*e = 0;
		for (char *l = q->line; l && *l;) {
			char *nl = strchr(l, '\n');
			if (nl)
				*nl = 0;
			if (!strncmp(l, "data: ", 6))
				on_event(q, l + 6, strlen(l + 6));
			l = nl ? nl + 1 : NULL;
		}
		size_t used = (size_t)(e + 2 - q->line);
		memmove(q->line, q->line + used, q->len - used + 1);
		q->len -= used;
	}
}

static void *run_req(void *arg)
{
	struct req *q = arg;
	json_t *b = json_pack("{s:s, s:i, s:f, s:b, s:b}", "model", q->model, "max_tokens", q->p->output_len,
	                      "temperature", 0.0, "stream", 1, "ignore_eos", 1);
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
	q->status = body ? http_request(q->u, q->o->api_key, "/v1/completions", body, q->o->timeout, on_body, q) : -1;
	q->t_end = llm_now();
	free(body);
	free(q->line);
	q->line = NULL;
	return NULL;
}

/* ---- runs -------------------------------------------------------------- */

static void on_models(void *user, const char *b, size_t n)
{
	struct req *q = user;
	on_body(q, b, n);
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
	struct req q = { 0 };
	int st = http_request(&u, o->api_key, "/v1/models", NULL, 10, on_models, &q);
	if (st != 200) {
		free(q.line);
		return st < 0 ? llm_fail(LLM_ERR_IO, "%s: cannot connect", o->url)
		              : llm_fail(LLM_ERR_IO, "%s/v1/models: HTTP %d", o->url, st);
	}
	json_t *j = q.line ? json_loads(q.line, 0, NULL) : NULL;
	free(q.line);
	const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
	if (id)
		*name = strdup(id);
	json_decref(j);
	return *name ? LLM_OK : llm_fail(LLM_ERR_FORMAT, "%s/v1/models: no model id", o->url);
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

struct pool { pthread_mutex_t mu; int next, n; struct req *q; double t_stop; };

static void *conc_worker(void *arg)
{
	struct pool *p = arg;
	for (;;) {
		pthread_mutex_lock(&p->mu);
		int i = p->next < p->n && (p->t_stop == 0 || llm_now() < p->t_stop) ? p->next++ : -1;
		pthread_mutex_unlock(&p->mu);
		if (i < 0)
			return NULL;
		run_req(&p->q[i]);
	}
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
	char *model = NULL;
	LLM_TRY(llm_bench_serve_model(o, &model));
	int n = o->n_requests;
	struct req *q = calloc((size_t)n, sizeof *q);
	pthread_t *th = calloc((size_t)n, sizeof *th);
	char *started = calloc((size_t)n, 1);
	if (!q || !th || !started) {
		free(q);
		free(th);
		free(started);
		free(model);
		return llm_fail(LLM_ERR_NOMEM, "bench: out of memory");
	}
	for (int i = 0; i < n; i++) {
		q[i].o = o;
		q[i].u = &u;
		q[i].p = &o->prompts[i % o->n_prompts];
		q[i].model = model;
	}
	double t0 = llm_now();
	if (concurrency > 0) {
		struct pool p = { .next = 0, .n = n, .q = q, .t_stop = o->duration > 0 ? t0 + o->duration : 0 };
		pthread_mutex_init(&p.mu, NULL);
		int nt = concurrency < n ? concurrency : n;
		for (int i = 0; i < nt; i++)
			started[i] = !pthread_create(&th[i], NULL, conc_worker, &p);
		for (int i = 0; i < nt; i++)
			if (started[i])
				pthread_join(th[i], NULL);
		pthread_mutex_destroy(&p.mu);
		for (int i = 0; i < n; i++)
			started[i] = q[i].t_send > 0;
	} else {
		/* open loop: exponential gaps (xorshift), whatever the server does */
		uint64_t x = o->seed * 0x9E3779B97F4A7C15ull + 1;
		double next = t0;
		for (int i = 0; i < n; i++) {
			if (o->duration > 0 && next - t0 > o->duration)
				break;
			double wait = next - llm_now();
			if (wait > 0) {
				struct timespec ts = { (time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9) };
				nanosleep(&ts, NULL);
			}
			started[i] = !pthread_create(&th[i], NULL, run_req, &q[i]);
			if (isfinite(rate) && rate > 0) {
				x ^= x << 13;
				x ^= x >> 7;
				x ^= x << 17;
				double uu = ((double)(x >> 11) + 0.5) / 9007199254740992.0;
				next += -log(uu) / rate;
			}
		}
		for (int i = 0; i < n; i++)
			if (started[i])
				pthread_join(th[i], NULL);
	}
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
	"e2e_p50", "e2e_p90", "e2e_p99" };
static const char *units[] = { "(req/s)", "", "", "", "", "", "(req/s)", "(tok/s)", "(req/s)",
	"(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)", "(ms)" };
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
		r->tpot[2], r->e2e[0], r->e2e[1], r->e2e[2] };
	if (f == LLM_BENCH_JSONL) {
		static const char *keys[] = { "rate", "concurrency", "sent", "completed", "rejected", "wrong", "req_s",
			"out_tok_s", "goodput", "ttft_p50_ms", "ttft_p90_ms", "ttft_p99_ms", "itl_p50_ms", "itl_p90_ms",
			"itl_p99_ms", "tpot_p50_ms", "tpot_p90_ms", "tpot_p99_ms", "e2e_p50_ms", "e2e_p90_ms", "e2e_p99_ms" };
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

enum llm_status llm_bench_serve_plot(const char *path, const struct llm_bench_serve_result *r, int n,
                                     const char *title)
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
	fprintf(f, "set terminal %s size 1100,480\nset output '%s'\n"
	           "set multiplot layout 1,2 title \"%s\"\nset grid\nset key top left\n"
	           "set xlabel 'arrival rate (req/s)'\nset ylabel 'latency (ms)'\nset logscale y\n"
	           "plot '%s' u 1:4 w lp t 'TTFT p50', '' u 1:5 w lp t 'TTFT p99', '' u 1:6 w lp t 'ITL p50', "
	           "'' u 1:7 w lp t 'ITL p99', '' u 1:8 w lp t 'e2e p50', '' u 1:9 w lp t 'e2e p99'\n"
	           "unset logscale y\nset ylabel 'throughput'\n"
	           "plot '%s' u 1:3 w lp t 'output tok/s', '' u 1:($2*100) w lp t 'completed req/s x100'\n"
	           "unset multiplot\n",
	        png ? "png" : "svg", path, title, dat, dat);
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
	if (o->kv_dtype)
		eo.kv_dtype = (enum llm_dtype)o->kv_dtype;
	int d = o->n_depth > 0 ? o->n_depth : 0;
	eo.max_seqs = b;
	eo.max_batch_tokens = o->n_prompt > b ? o->n_prompt : b;
	if (d > eo.max_batch_tokens)
		eo.max_batch_tokens = d;
	eo.max_logits = b;
	eo.n_ctx = d + (o->n_prompt > o->n_gen + 1 ? o->n_prompt : o->n_gen + 1) + 1;
	struct llm_engine *e;
	LLM_TRY(llm_engine_open(&e, ckpt, &eo));
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
	int8_t *want = malloc((size_t)nmax);
	double *t = malloc((size_t)reps * sizeof *t);
	enum llm_status st = LLM_OK;
	uint64_t x = 88172645463325252ull;
	if (!tok || !pos || !seq || !seqs || !want || !t) {
		st = llm_fail(LLM_ERR_NOMEM, "bench: out of memory");
		goto out;
	}
#define RND() (x ^= x << 13, x ^= x >> 7, x ^= x << 17, (int32_t)(x % (uint64_t)nv))
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
		for (int k = 0; k < reps + 1 && !st; k++) {     /* one warm-up run */
			int ns = test == 0 ? 1 : b;
			for (int i = 0; i < ns && !st; i++)
				st = llm_kv_seq_new(kv, &seqs[i]);
			if (st)
				break;
			const float *lg;
			int n_out;
			/* the context the test starts after: one untimed prefill per sequence */
			for (int i = 0; i < ns && d && !st; i++) {
				for (int j = 0; j < d; j++) {
					tok[j] = RND();
					pos[j] = j;
					seq[j] = seqs[i];
					want[j] = 0;
				}
				want[d - 1] = 1;
				struct llm_batch bt = { d, tok, pos, seq, want };
				st = llm_engine_forward(e, &bt, &lg, &n_out);
			}
			if (st)
				break;
			double t0 = llm_now();
			if (test == 0) {
				for (int i = 0; i < n; i++) {
					tok[i] = RND();
					pos[i] = d + i;
					seq[i] = seqs[0];
				}
				struct llm_batch bt = { n, tok, pos, seq, NULL };
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
					struct llm_batch bt = { b, tok, pos, seq, want };
					st = llm_engine_forward(e, &bt, &lg, &n_out);
					if (!st && !isfinite(lg[(size_t)(n_out - 1) * (size_t)nv]))
						res->wrong++;
				}
			}
			double dt = llm_now() - t0;
			for (int i = 0; i < ns; i++)
				llm_kv_seq_free(kv, seqs[i]);
			if (k > 0)
				t[k - 1] = (double)(test == 0 ? n : n * b) / dt;
		}
		double m = 0;
		for (int k = 0; k < reps; k++)
			m += t[k];
		res->mean = m / reps;
		res->sd = sd_of(t, reps, res->mean);
	}
#undef RND
out:
	free(tok);
	free(pos);
	free(seq);
	free(seqs);
	free(want);
	free(t);
	llm_engine_close(e);
	return st;
}
