/* common/serve/server.c: llm-serve's HTTP layer (see server.h; the engine thread
 * and the response bodies are server_engine.c and server_format.c, their
 * shared state server_impl.h): routing, request bodies parsed by
 * request.c, admission and the queue limit, waiting for or streaming a
 * job's events, /metrics, start and stop.
 *
 * Wire formats: OpenAI completions and chat completions (JSON, or
 * server-sent events ending in "data: [DONE]"), with the generated ids as
 * an extra "token_ids" field of each choice; Hugging Face TGI /generate and
 * /generate_stream; OpenAI's Responses and Anthropic's Messages APIs
 * (apis.h, server_apis.c). Errors are JSON with the offending field named,
 * in the shape of the route's API. */
#define _GNU_SOURCE
#include "server_http.h"
#include "fileio.h"
#include "tokenizer.h"
#include "args.h"
#include "request.h"
#include "guide.h"
#include "comm.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <microhttpd.h>
#include <netdb.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include "banned.h"

struct conn {                    /* per connection request: the body */
	struct llm_buf body;
	int too_large;
};

/* ---- small helpers ----------------------------------------------------- */

/* MS milliseconds from now on the realtime clock (pthread_cond_timedwait's). */
static struct timespec deadline_ms(long ms)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_nsec += ms % 1000 * 1000000;
	ts.tv_sec += ms / 1000 + ts.tv_nsec / 1000000000;
	ts.tv_nsec %= 1000000000;
	return ts;
}

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
static int key_eq(const char *got, const char *key);
static int key_ok(const char *auth, const char *key)
{
	if (!auth || strncasecmp(auth, "Bearer ", 7))
		return 0;
	const char *got = auth + 7;
	while (*got == ' ')
		got++;
	return key_eq(got, key);
}

/* GOT (NULL: none) is KEY, in a time that depends only on the lengths. */
static int key_eq(const char *got, const char *key)
{
	if (!got)
		return 0;
	size_t n = strlen(got), m = strlen(key);
	volatile unsigned char d = n != m;
	for (size_t i = 0; i < m; i++)
		d |= (unsigned char)(key[i] ^ (i < n ? got[i] : 0));
	return d == 0;
}

/* ---- connections: the limits, shedding, the request deadline ----------- */

/* libmicrohttpd refuses a connection over its own limit by closing it
 * unanswered, and has no notion of which open connection matters less than
 * a new one. So its limit is set above ours (llm_server_socket_limit), and
 * ours is kept here: every connection is a link from its opening
 * (MHD_CONNECTION_NOTIFY_STARTED) to its close. A link is busy from the
 * moment its whole request is in until its answer has been sent; the others
 * are delivering a request, or idle after an answer. At --max-connections
 * (or --max-conn-per-client among one address's links) a new connection
 * sheds a link that is not busy: one idle after an answer first (the
 * longest idle), else the one that has been longest at its request (the
 * slowest); when every link is busy the new one is answered 503 with
 * Retry-After. A link not busy for --request-timeout is closed too. A link
 * is closed by writing its answer (if any) straight to the socket, which
 * its thread is only reading, and shutting the socket: its thread sees the
 * end and libmicrohttpd closes it. */
struct link {
	struct link *prev, *next;
	int fd;
	struct sockaddr_storage peer;
	double t_phase;              /* when it opened, or its last answer was sent */
	int answered;                /* answers sent on it */
	int busy;                    /* a whole request in hand, until its answer is sent */
	int shed;                    /* closed by the server: no longer counted */
};

unsigned llm_server_socket_limit(unsigned max_connections)
{
	unsigned m = max_connections ? max_connections : 1000u;
	return m + m / 4 + 64;
}

static int same_host(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return 0;
	if (a->ss_family == AF_INET)
		return ((const struct sockaddr_in *)(const void *)a)->sin_addr.s_addr ==
		       ((const struct sockaddr_in *)(const void *)b)->sin_addr.s_addr;
	if (a->ss_family == AF_INET6)
		return !memcmp(&((const struct sockaddr_in6 *)(const void *)a)->sin6_addr,
		               &((const struct sockaddr_in6 *)(const void *)b)->sin6_addr, sizeof(struct in6_addr));
	return 0;
}

static unsigned port_of(const struct sockaddr_storage *a)
{
	return a->ss_family == AF_INET ? ((const struct sockaddr_in *)(const void *)a)->sin_port :
	       a->ss_family == AF_INET6 ? ((const struct sockaddr_in6 *)(const void *)a)->sin6_port : 0;
}

static struct link *link_of(struct MHD_Connection *c)
{
	const union MHD_ConnectionInfo *i = MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
	return i ? i->socket_context : NULL;
}

/* Close L (under cmu), STATUS's answer of MSG written first (0: none). The
 * answer goes into the socket's buffer or not at all (never waited for):
 * the connection ends either way. L's descriptor is still its connection's
 * (libmicrohttpd tells its close, which unlinks L under cmu, before
 * closing it); the peer is checked all the same. */
static void shed_locked(struct llm_server *s, struct link *l, unsigned status, const char *msg)
{
	struct sockaddr_storage p;
	socklen_t n = sizeof p;
	if (!l->shed)
		s->n_links--;
	l->shed = 1;
	if (l->fd < 0 || getpeername(l->fd, (struct sockaddr *)&p, &n) || !same_host(&p, &l->peer)
	    || port_of(&p) != port_of(&l->peer))
		return;
	if (status) {
		json_t *j = json_pack("{s:{s:s, s:s, s:n, s:i}}", "error", "message", msg, "type",
		                      status == 408 ? "invalid_request_error" : "server_error", "param", "code", (int)status);
		char *body = j ? json_dumps(j, JSON_COMPACT) : NULL;
		json_decref(j);
		char head[256];
		int hn = snprintf(head, sizeof head, "HTTP/1.1 %u %s\r\nContent-Type: application/json\r\n%s"
		                  "Connection: close\r\nContent-Length: %zu\r\n\r\n", status,
		                  status == 408 ? "Request Timeout" : "Service Unavailable",
		                  status == 503 ? "Retry-After: 1\r\n" : "", body ? strlen(body) + 1 : 0);
		if (body && hn > 0 && (size_t)hn < sizeof head) {
			struct llm_buf b = { 0 };
			if (!llm_buf_append(&b, head, (size_t)hn) && !llm_buf_append(&b, body, strlen(body))
			    && !llm_buf_append(&b, "\n", 1))
				(void)!send(l->fd, b.p, b.len, MSG_DONTWAIT | MSG_NOSIGNAL);
			llm_buf_free(&b);
		}
		free(body);
	}
	shutdown(l->fd, SHUT_RDWR);
}

/* The link to shed for a new connection (under cmu), among those of HOST
 * (NULL: every address): idle after an answer, the longest idle, first;
 * else the longest at its request; NULL when every one is busy. */
static struct link *victim_locked(struct llm_server *s, const struct sockaddr_storage *host)
{
	struct link *v = NULL;
	for (struct link *l = s->links; l; l = l->next) {
		if (l->busy || l->shed || (host && !same_host(&l->peer, host)))
			continue;
		int idle = l->answered > 0, vidle = v && v->answered > 0;
		if (!v || idle > vidle || (idle == vidle && l->t_phase < v->t_phase))
			v = l;
	}
	return v;
}

static void on_connection(void *cls, struct MHD_Connection *c, void **ctx, enum MHD_ConnectionNotificationCode code)
{
	struct llm_server *s = cls;
	struct link *l = *ctx;
	if (code == MHD_CONNECTION_NOTIFY_CLOSED) {
		if (!l)
			return;
		pthread_mutex_lock(&s->cmu);
		if (l->prev)
			l->prev->next = l->next;
		else
			s->links = l->next;
		if (l->next)
			l->next->prev = l->prev;
		if (!l->shed)
			s->n_links--;
		pthread_mutex_unlock(&s->cmu);
		free(l);
		*ctx = NULL;
		return;
	}
	if (code != MHD_CONNECTION_NOTIFY_STARTED || !(l = calloc(1, sizeof *l)))
		return;                  /* no memory: the connection goes uncounted */
	*ctx = l;
	const union MHD_ConnectionInfo *fi = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
	const union MHD_ConnectionInfo *ai = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
	l->fd = fi ? fi->connect_fd : -1;
	if (ai && ai->client_addr)
		memcpy(&l->peer, ai->client_addr, ai->client_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) :
		       ai->client_addr->sa_family == AF_INET ? sizeof(struct sockaddr_in) : 0);
	l->t_phase = now_s();
	unsigned max = s->o.max_connections ? s->o.max_connections : 1000u, per = 0;
	pthread_mutex_lock(&s->cmu);
	for (struct link *k = s->links; k && s->o.max_conn_per_client; k = k->next)
		per += !k->shed && same_host(&k->peer, &l->peer);
	int over_ip = s->o.max_conn_per_client && per >= s->o.max_conn_per_client, over = over_ip || s->n_links >= max;
	struct link *v = over ? victim_locked(s, over_ip ? &l->peer : NULL) : NULL;
	l->next = s->links;
	if (s->links)
		s->links->prev = l;
	s->links = l;
	s->n_links++;
	char msg[200];
	if (v) {                     /* an idle one closes silently: its client sees a closed keep-alive */
		snprintf(msg, sizeof msg, "the server is at %s %u: this connection, which had not sent a whole request, was "
		         "closed for a newer one; retry", over_ip ? "--max-conn-per-client" : "--max-connections",
		         over_ip ? s->o.max_conn_per_client : max);
		shed_locked(s, v, v->answered ? 0 : 503, msg);
		s->shed_limit++;
	} else if (over) {
		snprintf(msg, sizeof msg, "the server is at %s %u, each at work on a request; retry later",
		         over_ip ? "--max-conn-per-client" : "--max-connections", over_ip ? s->o.max_conn_per_client : max);
		shed_locked(s, l, 503, msg);
		s->refused_limit++;
	}
	pthread_mutex_unlock(&s->cmu);
}

/* The whole request is in: its connection is busy until the answer is sent
 * (on_completed). 0 when the server shed it meanwhile: answer nothing. */
static int link_busy(struct llm_server *s, struct MHD_Connection *c)
{
	struct link *l = link_of(c);
	if (!l)
		return 1;
	pthread_mutex_lock(&s->cmu);
	int ok = !l->shed;
	l->busy = ok;
	pthread_mutex_unlock(&s->cmu);
	return ok;
}

/* --request-timeout: links that are not busy, closed past it (408 to one
 * that never had an answer; one idle after an answer closes silently). */
static void *watch_main(void *arg)
{
	struct llm_server *s = arg;
	pthread_mutex_lock(&s->cmu);
	while (!s->watch_stop) {
		struct timespec ts = deadline_ms(250);
		pthread_cond_timedwait(&s->wcv, &s->cmu, &ts);
		double now = now_s();
		char msg[160];
		snprintf(msg, sizeof msg, "no whole request (head and body) within --request-timeout %g s", s->o.request_timeout);
		for (struct link *l = s->links; l; l = l->next)
			if (!l->busy && !l->shed && now - l->t_phase > s->o.request_timeout) {
				shed_locked(s, l, l->answered ? 0 : 408, msg);
				s->shed_deadline++;
			}
	}
	pthread_mutex_unlock(&s->cmu);
	return NULL;
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
	if (k == K_MESSAGES || k == K_COUNT)   /* Anthropic's shape */
		j = llm_messages_error(status, msg);
	else if (k == K_TGI)
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
		if (j->kind == K_RESPONSES || j->kind == K_MESSAGES)
			llm_srv_api_stream(s, j);
		else
			llm_srv_stream_format(s, j);
		if (j->out.len)
			continue;
		if (!waited) {            /* the engine's time is not the client's */
			waited = 1;
			idle_timeout(sr->conn, 0);
		}
		struct timespec ts = deadline_ms(100);
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

/* ---- OpenAI bodies, formatted without the lock ------------------------- */

struct body {                    /* a finished job's OpenAI body, part by part */
	struct llm_server *s;
	struct job *j;               /* (a reference) */
	char *model;
	int part, order[MAX_N];
	struct llm_buf buf;
	size_t pos;
};

static void body_free(void *cls)
{
	struct body *b = cls;
	pthread_mutex_lock(&b->s->mu);
	llm_srv_job_unref_locked(b->j);
	pthread_mutex_unlock(&b->s->mu);
	llm_buf_free(&b->buf);
	free(b->model);
	free(b);
}

static ssize_t body_read(void *cls, uint64_t pos, char *out, size_t max)
{
	(void)pos;
	struct body *b = cls;
	while (b->pos == b->buf.len) {
		b->buf.len = b->pos = 0;
		int r = llm_srv_openai_part(b->s, b->j, b->model, b->part++, b->order, &b->buf);
		if (r <= 0)
			return r ? MHD_CONTENT_READER_END_WITH_ERROR : MHD_CONTENT_READER_END_OF_STREAM;
	}
	size_t n = b->buf.len - b->pos < max ? b->buf.len - b->pos : max;
	memcpy(out, b->buf.p + b->pos, n);
	b->pos += n;
	return (ssize_t)n;
}

/* Bodies of more log-prob entries and tokens than this are sent as they
 * are formatted (chunked), never whole in memory; about 50 bytes each. */
#define STREAM_ENTRIES 16384

/* Finished job J's OpenAI body (J's reference and MODEL are taken):
 * formatted without the lock, so a large one holds back neither the engine
 * nor other clients; whole with a Content-Length when small, else part by
 * part as the client reads it (a choice at a time). */
static enum MHD_Result send_openai(struct llm_server *s, struct MHD_Connection *conn, struct job *j, char *model)
{
	struct body *b = calloc(1, sizeof *b);
	if (!b || !model) {
		free(b);
		free(model);
		pthread_mutex_lock(&s->mu);
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, K_COMPLETION, 500, NULL, "out of memory");
	}
	*b = (struct body){ .s = s, .j = j, .model = model };
	int64_t cost = 0, k = j->logprobs ? 1 + j->p.n_logprobs : 0;
	for (int c = 0; c < j->n; c++)
		cost += (int64_t)j->ch[c].n_ev * (1 + k);
	cost += (int64_t)j->n_ret * j->n_prompt * ((j->echo ? 1 + k : 0) + (j->prompt_lp >= 0 ? 1 + j->prompt_lp : 0));
	if (cost > STREAM_ENTRIES) {
		struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 65536, body_read, b, body_free);
		if (!r) {
			body_free(b);
			return MHD_NO;
		}
		MHD_add_response_header(r, "Content-Type", "application/json");
		enum MHD_Result ret = MHD_queue_response(conn, 200, r);
		MHD_destroy_response(r);
		return ret;
	}
	struct llm_buf whole = { 0 };
	int r;
	while ((r = llm_srv_openai_part(s, j, model, b->part++, b->order, &whole)) > 0)
		;
	body_free(b);
	if (r < 0 || !whole.p) {
		llm_buf_free(&whole);
		return send_error(s, conn, K_COMPLETION, 500, NULL, "out of memory");
	}
	return send_text(conn, 200, "application/json", whole.p, whole.len, NULL, NULL);
}

/* ---- endpoints --------------------------------------------------------- */

/* The log-prob entries job J may be answered with, which bound its work
 * and its body: per choice (n, or best_of when larger: each is sampled
 * with its alternatives), every token given with a log-prob counts 1 +
 * its alternatives: the generated ones (max_tokens, or the context left
 * when it has none), and the prompt's once for echo with logprobs, once
 * for prompt_logprobs, once for TGI's decoder_input_details. *FIELD: the
 * request field of the largest share, for the error. */
static int64_t logprob_entries(const struct job *j, int n_ctx, const char **field)
{
	int64_t gen = j->p.max_tokens > 0 ? j->p.max_tokens : (int64_t)n_ctx - j->n_prompt, np = j->n_prompt;
	int lp = j->kind == K_TGI ? j->details || j->stream : j->logprobs;
	int64_t g = lp && gen > 0 ? gen * (1 + j->p.n_logprobs) : 0;
	int64_t e = j->echo && j->logprobs ? np * (1 + j->p.n_logprobs) : 0;
	int64_t p = j->prompt_lp >= 0 ? np * (1 + j->prompt_lp) : 0, d = j->prefill ? np : 0;
	*field = p >= g && p >= e && p >= d ? "prompt_logprobs" : e >= g && e >= d ? "echo" : d >= g ? "decoder_input_details" :
	         j->kind == K_TGI ? "top_n_tokens" : j->kind == K_CHAT ? "top_logprobs" : "logprobs";
	return (g + e + p + d) * j->n;
}

static enum MHD_Result do_generate(struct llm_server *s, struct MHD_Connection *conn, enum kind k,
                                   int tgi_stream, int tgi_array, const char *body, size_t len)
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
	static const enum llm_api_kind api[] = { [K_COMPLETION] = LLM_API_COMPLETION, [K_CHAT] = LLM_API_CHAT,
		[K_TGI] = LLM_API_TGI, [K_RESPONSES] = LLM_API_RESPONSES, [K_MESSAGES] = LLM_API_MESSAGES,
		[K_COUNT] = LLM_API_MESSAGES_COUNT };
	char lnames[LLM_LORA_SLOTS][LLM_LORA_NAME_MAX];   /* the adapters' names as parsed against */
	const char *lptr[LLM_LORA_SLOTS];
	pthread_mutex_lock(&s->mu);
	env.n_ctx = s->n_ctx;
	env.n_vocab = s->n_vocab;
	/* a server that can have no adapter serves every name with its one
	 * model; one that can (--lora, --allow-runtime-lora) refuses a name it
	 * does not know, so a misspelt adapter never gets the base model */
	env.any_model = !s->n_lora && !s->o.allow_runtime_lora;
	if (s->n_lora) {
		memcpy(lnames, s->lora_name, sizeof lnames);
		for (int i = 0; i < LLM_LORA_SLOTS; i++)
			lptr[i] = lnames[i][0] ? lnames[i] : NULL;
		env.adapters = lptr;
		env.n_adapters = LLM_LORA_SLOTS;
	}
	pthread_mutex_unlock(&s->mu);
	struct llm_api_req rq;
	enum llm_status st = llm_api_req_parse(&rq, api[k], o, &env);
	json_decref(o);
	if (st) {
		pthread_mutex_lock(&s->mu);
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		unsigned code = st == LLM_ERR_UNSUPPORTED ? 404 : st == LLM_ERR_NOMEM ? 500 : 400;
		return send_error(s, conn, k, code, rq.param[0] ? rq.param : NULL, "%s", llm_errmsg());
	}
	if (k == K_COUNT) {          /* count_tokens: the prompt's length is the answer */
		pthread_mutex_lock(&s->mu);
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		int n = rq.n_prompt;
		llm_api_req_free(&rq);
		return send_json(conn, 200, json_pack("{s:i}", "input_tokens", n), NULL, NULL);
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
	j->reasoning = rq.reasoning;
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
	const char *lpf;
	int64_t lpe = logprob_entries(j, env.n_ctx, &lpf);
	if (s->o.max_logprob_entries > 0 && lpe > s->o.max_logprob_entries) {
		int n = j->n;
		pthread_mutex_lock(&s->mu);
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 400, lpf, "%s: this request may be answered with %lld log-prob entries (%d "
		                  "choice%s), over --max-logprob-entries %lld: ask for fewer choices (n, best_of), tokens "
		                  "(max_tokens) or log-probs (logprobs, prompt_logprobs, echo)", lpf, (long long)lpe, n,
		                  n == 1 ? "" : "s", (long long)s->o.max_logprob_entries);
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
		char why[sizeof s->err + 32];
		snprintf(why, sizeof why, "%s%s", s->state == LLM_SERVER_DRAINING ? "draining" : s->lost_rank >= 0 ?
		         "failed: " : "not ready", s->lost_rank >= 0 ? s->err : "");
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 503, NULL, "the server is %s", why);
	}
	if (rq.adapter && strcmp(s->lora_name[rq.adapter - 1], lnames[rq.adapter - 1])) {   /* unloaded meanwhile */
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 404, k == K_TGI ? "adapter_id" : "model", "the LoRA adapter '%s' has been "
		                  "unloaded", lnames[rq.adapter - 1]);
	}
	if (j->n > s->o.sched.max_running + s->o.max_queue) {   /* never, however long it waits */
		int n = j->n;
		const char *f = rq.best_of > rq.n ? "best_of" : "n";   /* the field that asked for them */
		llm_srv_job_unref_locked(j);
		pthread_mutex_unlock(&s->mu);
		return send_error(s, conn, k, 400, f, "%s: %d choices can never be admitted: --max-running %d + --max-queue %d "
		                  "hold %d", f, n, s->o.sched.max_running, s->o.max_queue, s->o.sched.max_running + s->o.max_queue);
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
	snprintf(j->id, sizeof j->id, "%s%llu", k == K_CHAT ? "chatcmpl-" : k == K_RESPONSES ? "resp_" :
	         k == K_MESSAGES ? "msg_" : "cmpl-", (unsigned long long)++s->next_id);
	j->refs = 2;                 /* the connection and the engine */
	if (s->subq_tail)
		s->subq_tail->next = j;
	else
		s->subq = j;
	s->subq_tail = j;
	llm_srv_wake_locked(s);
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
		struct timespec ts = deadline_ms(100);
		pthread_cond_timedwait(&j->cv, &s->mu, &ts);
		if (j->n_done < j->n && !j->cancelled && client_gone(j->fd)) {
			j->cancelled = 1;
			pthread_cond_signal(&s->ecv);
		}
	}
	s->in_flight -= j->n;
	json_t *resp = NULL;
	unsigned status = 200;
	int openai = 0;
	char *model = NULL;
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
		if (tgi_array)           /* TGI's POST / and /invocations: a list of one, as api-inference answers */
			resp = json_pack("[o]", resp);
	} else if (k == K_RESPONSES || k == K_MESSAGES) {
		resp = llm_srv_api_full(s, j);
	} else {                     /* formatted below, without the lock (the reference keeps the job) */
		openai = 1;
		model = llm_strdup(j->adapter ? s->lora_name[j->adapter - 1] : s->model_name);
	}
	if (!openai || status == 499)
		llm_srv_job_unref_locked(j);
	pthread_mutex_unlock(&s->mu);
	if (status == 499) {
		free(model);
		return MHD_NO;           /* nobody is listening */
	}
	idle_timeout(conn, s->o.timeout);
	if (openai)
		return send_openai(s, conn, j, model);
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
	/* a gauge: llm_kv_blocks (a name ending in _total is a counter's, as
	 * promtool says); llm_kv_blocks_total, its name before, is kept for one
	 * release (llm-serve(1), METRICS) */
	fprintf(f, "# HELP llm_kv_blocks KV blocks in the pool.\n# TYPE llm_kv_blocks gauge\n"
	           "llm_kv_blocks %lld\n", (long long)st.kv_blocks_total);
	fprintf(f, "# HELP llm_kv_blocks_total Deprecated: llm_kv_blocks (this name goes in the next release).\n"
	           "# TYPE llm_kv_blocks_total gauge\nllm_kv_blocks_total %lld\n", (long long)st.kv_blocks_total);
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
	pthread_mutex_lock(&s->cmu);
	fprintf(f, "# HELP llm_connections_open Open connections counted against --max-connections.\n"
	           "# TYPE llm_connections_open gauge\nllm_connections_open %u\n", s->n_links);
	fprintf(f, "# HELP llm_connections_closed_total Connections the server closed before a whole request: shed for a "
	           "newer one at a limit, past --request-timeout, or refused at a limit with every one busy.\n"
	           "# TYPE llm_connections_closed_total counter\nllm_connections_closed_total{reason=\"shed\"} %llu\n"
	           "llm_connections_closed_total{reason=\"request_timeout\"} %llu\n"
	           "llm_connections_closed_total{reason=\"refused\"} %llu\n", (unsigned long long)s->shed_limit,
	        (unsigned long long)s->shed_deadline, (unsigned long long)s->refused_limit);
	pthread_mutex_unlock(&s->cmu);
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
		if (cc->too_large && !link_busy(s, conn))
			return MHD_NO;
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
	if (!link_busy(s, conn))   /* shed while its request came in */
		return MHD_NO;
	/* the error shape of the URL's API */
	enum kind tgi_k = !strncmp(url, "/generate", 9) || !strcmp(url, "/") ? K_TGI :
	                  !strncmp(url, "/v1/messages", 12) ? K_MESSAGES : K_COMPLETION;
	if (cc->too_large)
		return send_error(s, conn, tgi_k, 413, NULL, "the body exceeds --max-body %zu bytes", s->o.max_body);
	if (!strcmp(url, "/health") || !strcmp(url, "/ping")) {   /* /ping: SageMaker's health check */
		if (!method_ok(method, "GET"))
			return send_error_allow(s, conn, tgi_k, 405, allow_of("GET"), NULL, "%s takes GET or HEAD, not %s", url, method);
		/* an engine that holds the lock this long is stalled too */
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 2;
		int stalled = 1;
		enum llm_server_state st = LLM_SERVER_READY;
		if (!pthread_mutex_timedlock(&s->mu, &ts)) {
			st = s->state;
			stalled = llm_srv_stalled_locked(s);
			pthread_mutex_unlock(&s->mu);
		}
		const char *name = stalled ? "stalled" : st == LLM_SERVER_READY ? "ready" : st == LLM_SERVER_LOADING ? "loading" :
		                   st == LLM_SERVER_DRAINING ? "draining" : "failed";
		return send_json(conn, st == LLM_SERVER_READY && !stalled ? 200 : 503, json_pack("{s:s}", "status", name), NULL, NULL);
	}
	if (s->o.api_key) {
		/* Anthropic's clients send the key as x-api-key */
		const char *a = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Authorization");
		const char *x = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "x-api-key");
		if (!key_ok(a, s->o.api_key) && !key_eq(x, s->o.api_key))
			return send_error(s, conn, tgi_k, 401, NULL, "missing or wrong API key (Authorization: Bearer KEY, or "
			                  "x-api-key: KEY)");
	}
	static const struct { const char *url, *method; int what; } routes[] = {
		{ "/v1/completions", "POST", 0 }, { "/v1/chat/completions", "POST", 1 },
		{ "/generate", "POST", 2 }, { "/generate_stream", "POST", 3 },
		{ "/v1/models", "GET", 4 }, { "/metrics", "GET", 5 },
		{ "/tokenize", "POST", 6 }, { "/detokenize", "POST", 7 }, { "/info", "GET", 8 },
		{ "/v1/embeddings", "POST", 9 },
		{ "/v1/load_lora_adapter", "POST", 10 }, { "/v1/unload_lora_adapter", "POST", 11 },
		{ "/", "POST", 12 }, { "/invocations", "POST", 13 },
		{ "/v1/responses", "POST", 15 }, { "/v1/messages", "POST", 16 }, { "/v1/messages/count_tokens", "POST", 17 },
	};
	for (size_t i = 0; i < sizeof routes / sizeof *routes; i++) {
		if (strcmp(url, routes[i].url))
			continue;
		if (!method_ok(method, routes[i].method))
			return send_error_allow(s, conn, tgi_k, 405, allow_of(routes[i].method), NULL, "%s takes %s, not %s", url,
			                        allow_of(routes[i].method), method);
		const char *body = cc->body.p ? cc->body.p : "";
		switch (routes[i].what) {
		case 0: return do_generate(s, conn, K_COMPLETION, 0, 0, body, cc->body.len);
		case 1: return do_generate(s, conn, K_CHAT, 0, 0, body, cc->body.len);
		case 2: return do_generate(s, conn, K_TGI, 0, 0, body, cc->body.len);
		case 3: return do_generate(s, conn, K_TGI, 1, 0, body, cc->body.len);
		case 4: {
			pthread_mutex_lock(&s->mu);
			json_t *m = llm_srv_models(s);
			pthread_mutex_unlock(&s->mu);
			return send_json(conn, 200, m, NULL, NULL);
		}
		case 10: case 11: return do_lora(s, conn, routes[i].what == 10, body, cc->body.len);
		case 12: case 13: {
			/* TGI's POST / (generate, or generate_stream by "stream"); SageMaker's
			 * /invocations: that TGI body, or an OpenAI chat body when it has
			 * "messages" (a completions one when it has "prompt"), as TGI's
			 * SageMaker route takes them */
			json_t *o = json_loadb(body, cc->body.len, 0, NULL);
			enum kind k = routes[i].what == 12 ? K_TGI : json_object_get(o, "messages") ? K_CHAT :
			              json_object_get(o, "prompt") ? K_COMPLETION : K_TGI;
			int stream = k == K_TGI && json_is_true(json_object_get(o, "stream"));
			json_decref(o);
			return do_generate(s, conn, k, stream, k == K_TGI, body, cc->body.len);
		}
		case 5: return do_metrics(s, conn);
		case 6: case 7: return do_tokens(s, conn, routes[i].what == 6, body, cc->body.len);
		case 8: return send_json(conn, 200, llm_srv_info(s), NULL, NULL);
		case 15: return do_generate(s, conn, K_RESPONSES, 0, 0, body, cc->body.len);
		case 16: return do_generate(s, conn, K_MESSAGES, 0, 0, body, cc->body.len);
		case 17: return do_generate(s, conn, K_COUNT, 0, 0, body, cc->body.len);
		default:
			return send_error(s, conn, K_COMPLETION, 400, "model", "%s computes no embeddings: pooling a generative "
			                  "model's hidden states gives no trained embedding (llm-serve(1))", s->model_name);
		}
	}
	return send_error(s, conn, tgi_k, 404, NULL, "no such endpoint: %s %s", method, url);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode t)
{
	(void)t;
	struct llm_server *s = cls;
	struct link *l = link_of(conn);
	if (l) {                     /* idle (or at its next request) from now */
		pthread_mutex_lock(&s->cmu);
		l->answered += l->busy;
		l->busy = 0;
		l->t_phase = now_s();
		pthread_mutex_unlock(&s->cmu);
	}
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
	pthread_mutex_init(&s->cmu, NULL);
	pthread_cond_init(&s->wcv, NULL);
	s->state = LLM_SERVER_LOADING;
	s->lost_rank = -1;
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
	 * seconds, one that delivers no whole request after
	 * o->request_timeout (watch_main); o->max_connections and
	 * o->max_conn_per_client are kept by on_connection, which sheds or
	 * refuses with 503, so libmicrohttpd's own limit (a close without an
	 * answer) sits above them */
	if (o->request_timeout > 0) {
		if (pthread_create(&s->watch_thread, NULL, watch_main, s)) {
			freeaddrinfo(ai);
			st = llm_fail(LLM_ERR_NOMEM, "server: cannot start the connection watch thread");
			goto fail;
		}
		s->watch_started = 1;
	}
	s->d = MHD_start_daemon(flags, (uint16_t)o->port, NULL, NULL, on_request, s,
	                        MHD_OPTION_SOCK_ADDR, ai->ai_addr,
	                        MHD_OPTION_NOTIFY_COMPLETED, on_completed, s,
	                        MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
	                        MHD_OPTION_CONNECTION_LIMIT, llm_server_socket_limit(o->max_connections),
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
	pthread_setname_np(s->engine_thread, "llm-engine");   /* top -H, and tests that stop it */
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

int llm_server_lost_rank(struct llm_server *s)
{
	pthread_mutex_lock(&s->mu);
	int r = s->lost_rank;
	pthread_mutex_unlock(&s->mu);
	return r;
}

void llm_server_stop(struct llm_server *s)
{
	if (!s)
		return;
	llm_comm_on_lost(NULL, NULL);   /* a lost rank from here on: the default (this rank ends) */
	if (s->lost_rank >= 0) {        /* the engine thread may never return: left as it is */
		MHD_stop_daemon(s->d);
		return;
	}
	if (s->engine_started) {
		pthread_mutex_lock(&s->mu);
		s->stop = 1;
		pthread_cond_signal(&s->ecv);
		pthread_mutex_unlock(&s->mu);
		pthread_join(s->engine_thread, NULL);
	}
	if (s->watch_started) {
		pthread_mutex_lock(&s->cmu);
		s->watch_stop = 1;
		pthread_cond_signal(&s->wcv);
		pthread_mutex_unlock(&s->cmu);
		pthread_join(s->watch_thread, NULL);
	}
	if (s->d)
		MHD_stop_daemon(s->d);   /* its connections' closes use cmu */
	llm_sched_close(s->sch);
	llm_engine_close(s->e);
	llm_engine_close(s->draft);
	llm_tokenizer_close(s->tk);
	llm_gvocab_free(s->gvocab);
	pthread_mutex_destroy(&s->mu);
	pthread_cond_destroy(&s->ecv);
	pthread_mutex_destroy(&s->cmu);
	pthread_cond_destroy(&s->wcv);
	free(s->model_name);
	for (int i = 0; i < LLM_LORA_SLOTS; i++)
		free(s->lora_dir[i]);
	free(s->touched);
	free(s->template_src);
	free(s);
}

/* ---- the tool's checks and limits --------------------------------------- */

const char *llm_server_key_flaw(const char *key)
{
	size_t n = strlen(key), i = 0;
	while (i < n && (key[i] == ' ' || key[i] == '\t'))
		i++;
	if (i == n)
		return "is blank (spaces or tabs only)";
	if (i > 0 || key[n - 1] == ' ' || key[n - 1] == '\t')
		return "has a space or tab at an end (no Authorization header can carry it)";
	return NULL;
}

enum llm_status llm_server_key_file(const char *path, char **key)
{
	char *b;
	size_t len, n = 0;
	*key = NULL;
	LLM_TRY(llm_read_file(path, &b, &len));
	while (n < len && b[n] != '\n' && b[n] != '\0')
		n++;
	if (n > 0 && b[n - 1] == '\r')
		n--;
	b[n] = '\0';
	const char *why = !n ? "the first line is empty (it holds the key)" : llm_server_key_flaw(b);
	if (why) {
		enum llm_status s = llm_fail(LLM_ERR_USAGE, "%s: %s%s", path, n ? "the key on the first line " : "", why);
		free(b);
		return s;
	}
	*key = b;
	return LLM_OK;
}

void llm_server_fd_limit(unsigned max_connections)
{
	struct rlimit nf;
	rlim_t need = (rlim_t)llm_server_socket_limit(max_connections) + 64;
	if (getrlimit(RLIMIT_NOFILE, &nf) || nf.rlim_cur == RLIM_INFINITY || nf.rlim_cur >= need)
		return;
	nf.rlim_cur = nf.rlim_max;
	setrlimit(RLIMIT_NOFILE, &nf);
	if (nf.rlim_max != RLIM_INFINITY && nf.rlim_max < need)
		llm_warn("--max-connections %u: only %llu file descriptors (ulimit -Hn); connections past them are refused",
		         max_connections, (unsigned long long)nf.rlim_max);
}
