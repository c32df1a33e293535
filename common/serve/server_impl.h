/* common/serve/server_impl.h: llm-serve's jobs and its engine thread: the
 * server's state, the jobs with their choices and events, the metrics'
 * histograms, and the functions of server_engine.c. Not a public header:
 * server_engine.c implements it, and the HTTP side (server_http.h: server.c,
 * server_format.c, server_api.c) includes it. Calls go one way: the HTTP
 * side submits jobs, reads their events and calls the engine thread's
 * functions; the engine thread calls nothing of the HTTP side.
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
#include "lora.h"
#include "apis.h"

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

struct MHD_Daemon;

#define MAX_N LLM_MAX_N            /* choices per request */
#define LLM_SERVE_GRAMMAR_SECONDS 10   /* a request's grammar compile (llm-serve(1) LIMITS) */

enum kind { K_COMPLETION, K_CHAT, K_TGI, K_RESPONSES, K_MESSAGES, K_COUNT /* messages/count_tokens */ };

struct ev {                      /* one event of a choice, copied from the engine */
	int32_t token;               /* -1: cancel */
	float logprob;
	int n_top;
	struct llm_logprob *top;
	char *text;
	size_t len;
	enum llm_finish finish;
	int stop_index;              /* FINISH_STOP: the stop id's index, or n_stop_ids + the string's */
	double t;                    /* when the engine produced it */
	int index;                   /* its token's index in the choice */
};

struct plp {                     /* a prompt token's log-prob (echo, prompt_logprobs, TGI prefill) */
	float lp;                    /* NAN: not scored (the first token, or cancelled before) */
	int rank, n_top;
	struct llm_logprob top[LLM_MAX_LOGPROBS];
};
struct job;
struct choice {
	struct job *job;
	int index, sched_id, done, sent;   /* sent: events already written (stream) */
	enum llm_finish finish;
	struct ev *ev;
	int n_ev;
	size_t cap_ev;
	double t_last, t_first;
	size_t tool_sent;            /* stream with tools or reasoning (or of server_apis.c): where the
	                              * content not yet sent starts in the text */
	size_t reason_sent;          /* stream with reasoning: where the reasoning not yet sent starts */
	int n_tok;                   /* tokens generated */
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
	int n_ret;                   /* choices answered: the n of best_of by cumulative log-prob */
	int stream, n, n_done, logprobs, top_logprobs, include_usage, details, full_text;
	char *inputs;                /* TGI return_full_text */
	int echo, prompt_lp, prefill;   /* completions echo; vLLM prompt_logprobs (-1: none); TGI
	                                 * decoder_input_details */
	struct plp *plp;             /* (n_prompt) choice 0's prompt scored, when one of those asks;
	                              * written by the engine thread before choice 0's first event */
	int plp_top;                 /* best tokens per prompt position */
	int plp_ready;               /* choice 0 has an event (its prompt is scored) */
	int tool_fmt;                /* chat with tools: enum llm_tool_format; 0: answers not parsed */
	int reasoning;               /* chat: llm_api_req.reasoning (0: no <think> split) */
	char **tool_names;           /* (n_tools) owned */
	int n_tools;
	int32_t *prompt;
	int n_prompt;
	struct llm_sample_params p;
	char *stops[LLM_MAX_STOP];
	struct llm_logit_bias *bias; /* (p.n_bias) */
	struct choice ch[MAX_N];
	int cancelled, cancel_sent, added, failed, http_status;
	char errmsg[256];
	double t_arrival, t_admit;
	int admitted;
	char id[40];
	long long created;
	int fd;                      /* the client's socket */
	int started, ended;          /* stream: role chunk sent, [DONE] queued */
	int adapter;                 /* LoRA slot (counted in srv->lora_jobs); 0: the base */
	struct llm_api_stream as;    /* stream of the Responses or Messages API: its state */
	struct llm_buf out;          /* stream: bytes not yet handed to MHD, from out_pos */
	size_t out_pos;
	struct job *next;            /* submission queue / active list */
};

/* A LoRA adapter load or unload, done by the engine thread between steps
 * (it owns the engine and the scheduler); the connection thread waits. A
 * load's files are read by the connection thread first (LO): the engine
 * thread only installs it, so a slow or hostile file (a FIFO) never holds
 * the steps. */
struct lora_op {
	int load;                    /* 1: load NAME from PATH (read into LO); 0: unload NAME */
	char name[LLM_LORA_NAME_MAX];
	char *path;                  /* (owned) */
	struct llm_lora lo;          /* (owned until the engine takes it) */
	int done;
	unsigned status;             /* HTTP status of the answer */
	char msg[600];
	pthread_cond_t cv;
	struct lora_op *next;
};

#define N_BUCKET 14
extern const double llm_srv_bucket_le[N_BUCKET];   /* the histograms' upper bounds (s) */
extern const double llm_srv_tokens_le[N_BUCKET];   /* the same for token counts */

struct histo { uint64_t n[N_BUCKET]; uint64_t count; double sum; const double *le; /* NULL: llm_srv_bucket_le */ };

struct link;                     /* an open connection (server.c) */

struct llm_server {
	struct llm_server_opts o;
	/* connections (server.c), under cmu: every open one, those counted
	 * against the limits; the thread that enforces --request-timeout */
	pthread_mutex_t cmu;
	pthread_cond_t wcv;
	struct link *links;
	unsigned n_links;
	uint64_t shed_limit, shed_deadline, refused_limit;   /* connections shed or refused, by reason */
	pthread_t watch_thread;
	int watch_started, watch_stop;
	/* the engine's heartbeat (under mu): when it last finished a step or
	 * took work, and whether it waits with none (then it is not stalled) */
	double t_beat;
	int engine_idle;
	char *model_name, *template_src;
	struct MHD_Daemon *d;
	int port;
	pthread_t engine_thread;
	int engine_started;
	pthread_mutex_t mu;
	pthread_cond_t ecv;
	enum llm_server_state state;
	char err[512];
	int lost_rank;               /* distributed: the rank the watchdog lost (FAILED), else -1 */
	int stop, in_flight, n_ctx, n_vocab;
	struct job *subq, *subq_tail, *active;
	/* LoRA adapters by slot - 1, as the engine thread loaded them: name
	 * ("": free), directory; jobs naming each (a job holds its slot until
	 * it is freed, so an unload cannot pull an adapter from under it) */
	char lora_name[LLM_LORA_SLOTS][LLM_LORA_NAME_MAX];
	char *lora_dir[LLM_LORA_SLOTS];
	int lora_jobs[LLM_LORA_SLOTS + 1];
	int n_lora;                  /* adapters loaded */
	struct lora_op *loraq;       /* loads and unloads for the engine thread */
	struct llm_engine *e;
	struct llm_engine *draft;    /* --speculate draft: the draft model's engine; NULL: none */
	struct llm_sched *sch;
	struct llm_tokenizer *tk;
	struct llm_gvocab *gvocab;  /* tk's token bytes, for the requests' grammars */
	uint64_t next_id;
	/* metrics */
	struct llm_sched_stats st;
	uint64_t req_ok, req_429, req_4xx, req_5xx, req_cancel;
	uint64_t prompt_tokens, gen_tokens;
	struct histo ttft, itl, e2e, queue;
	struct histo prefill, decode, req_prompt, req_gen;   /* admission to first token, first to last;
	                                                      * tokens of a request's prompt, of a sequence */
	uint64_t finished[4];        /* sequences ended: stop (EOS too), length, abort, error */
	/* the engine thread's own: choices with pending events */
	struct choice **touched;
	int n_touched;
	size_t cap_touched;
};

static inline double now_s(void) { return llm_now(); }

/* server_engine.c */
/* Hand the engine thread work (under srv->mu): wake it, and start the
 * stall clock if it was waiting with none. */
void llm_srv_wake_locked(struct llm_server *s);
/* Whether the engine has had work for longer than --stall-timeout without
 * finishing a step (under srv->mu). */
int llm_srv_stalled_locked(struct llm_server *s);
/* Drop one reference to J (under srv->mu); the last frees it. */
void llm_srv_job_unref_locked(struct job *j);
/* The engine thread: loads the engine, then runs the scheduler over the
 * submitted jobs until srv->stop (pthread_create's ARG: the server). */
void *llm_srv_engine_main(void *arg);

#endif
