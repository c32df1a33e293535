/* common/serve/server_impl.h: what the three parts of llm-serve's server share;
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
#include "lora.h"

#include <jansson.h>
#include <pthread.h>
#include <stdint.h>

struct MHD_Daemon;

#define MAX_N LLM_MAX_N            /* choices per request */
#define LLM_SERVE_GRAMMAR_SECONDS 10   /* a request's grammar compile (llm-serve(1) LIMITS) */

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
	size_t tool_sent;            /* stream with tools: bytes of the text sent as content */
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
	struct llm_buf out;          /* stream: bytes not yet handed to MHD, from out_pos */
	size_t out_pos;
	struct job *next;            /* submission queue / active list */
};

/* A LoRA adapter load or unload, done by the engine thread between steps
 * (it owns the engine and the scheduler); the connection thread waits. */
struct lora_op {
	int load;                    /* 1: load NAME from PATH; 0: unload NAME */
	char name[LLM_LORA_NAME_MAX];
	char *path;                  /* (owned) */
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
/* server_api.c: vLLM's /tokenize and /detokenize bodies (O) to *OUT, or a
 * usage error with *PARAM the field (NULL: none); TGI's /info; the metrics
 * under vLLM's names (under srv->mu) */
enum llm_status llm_srv_tokenize(struct llm_server *s, json_t *o, json_t **out, const char **param);
enum llm_status llm_srv_detokenize(struct llm_server *s, json_t *o, json_t **out, const char **param);
json_t *llm_srv_info(struct llm_server *s);
void llm_srv_metrics_vllm(struct llm_server *s, FILE *f);
/* A histogram's Prometheus lines, with the label L ("": none). */
void llm_srv_histo_text(FILE *f, const char *name, const char *help, const struct histo *h, const char *l);
/* POST /v1/load_lora_adapter (LOAD) or /v1/unload_lora_adapter: body O
 * checked, the operation queued for the engine thread and waited for;
 * *STATUS and *MSG (N bytes) the answer, *PARAM the field at fault. */
void llm_srv_lora_op(struct llm_server *s, json_t *o, int load, unsigned *status, char *msg, size_t n,
                     const char **param);
/* /v1/models's data: the model, then each adapter with "parent" the model
 * (under srv->mu). */
json_t *llm_srv_models(struct llm_server *s);

#endif
