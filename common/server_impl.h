/* common/server_impl.h: what the three parts of llm-serve's server share;
 * not a public header (server.c, server_engine.c and server_format.c
 * include it).
 *
 *   server_engine.c  the engine thread: jobs submitted to the scheduler,
 *                    its token events published to the jobs, the job
 *                    lifecycle (references, cancel, failure), the metrics'
 *                    histograms;
 *   server_format.c  response bodies: OpenAI and TGI JSON, log-probs, the
 *                    SSE events of a stream;
 *   server.c         HTTP (libmicrohttpd): routing, request bodies through
 *                    request.c, admission, waiting and streaming, metrics
 *                    text, start and stop.
 *
 * Locking: one mutex (srv->mu) guards every job, the submission queue and
 * the metrics; each job has a condition variable its connection thread
 * waits on, and the engine thread waits on srv->ecv. A job is referenced
 * by its connection (until the response is freed) and by the engine thread
 * (until its last event); whoever drops the last reference frees it
 * (llm_srv_job_unref_locked). */
#ifndef LLM_SERVER_IMPL_H
#define LLM_SERVER_IMPL_H

#include "buf.h"
#include "server.h"
#include "request.h"

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

struct MHD_Daemon;

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
	int n_ev;
	size_t cap_ev;
	double t_last;
	/* the engine thread's own: events of this step not yet published */
	struct ev *pend;
	int n_pend, touched;
	size_t cap_pend;
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
	struct llm_buf out;          /* stream: bytes not yet handed to MHD, from out_pos */
	size_t out_pos;
	struct job *next;            /* submission queue / active list */
};

#define N_BUCKET 14
extern const double llm_srv_bucket_le[N_BUCKET];   /* the histograms' upper bounds (s) */

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
	struct llm_gvocab *gvocab;  /* tk's token bytes, for the requests' grammars */
	uint64_t next_id;
	/* metrics */
	struct llm_sched_stats st;
	uint64_t req_ok, req_429, req_4xx, req_5xx, req_cancel;
	uint64_t prompt_tokens, gen_tokens;
	struct histo ttft, itl, e2e, queue;
	/* the engine thread's own: choices with pending events */
	struct choice **touched;
	int n_touched;
	size_t cap_touched;
};

static inline double now_s(void) { return llm_now(); }

/* server_engine.c */
/* Drop one reference to J (under srv->mu); the last frees it. */
void llm_srv_job_unref_locked(struct job *j);
/* The engine thread: loads the engine, then runs the scheduler over the
 * submitted jobs until srv->stop (pthread_create's ARG: the server). */
void *llm_srv_engine_main(void *arg);

/* server_format.c (under srv->mu: they read the jobs' events) */
json_t *llm_srv_openai_full(struct llm_server *s, struct job *j);
json_t *llm_srv_tgi_details(struct job *j, struct llm_server *s, int with_tokens);
json_t *llm_srv_tgi_generated(struct job *j);
/* Append to j->out the SSE events of J's new events (and the end). */
void llm_srv_stream_format(struct llm_server *s, struct job *j);

#endif
