/* common/serve/server.h: the HTTP server of llm-serve: OpenAI and TGI wire
 * formats over the continuous-batching scheduler (scheduler.h), Prometheus
 * metrics, admission control and draining.
 *
 * Threads: libmicrohttpd runs one thread per connection; they parse and
 * validate requests, tokenize, and hand them to the single engine thread
 * through a mutex/condvar queue. The engine thread owns the engine and the
 * scheduler; it loads the model after the listener is up (so /health says
 * 503 while loading), then steps the scheduler while work is pending,
 * delivering events to the connection threads, which write JSON responses
 * or server-sent events. A connection whose client goes away cancels its
 * requests (their KV blocks are freed at the next step).
 *
 * Endpoints: POST /v1/completions, POST /v1/chat/completions, POST
 * /v1/responses, POST /v1/messages (and /v1/messages/count_tokens), GET
 * /v1/models, POST /generate, POST /generate_stream, GET /health, GET
 * /metrics, and those of server_api.c. No request can name a file. The library never prints or exits;
 * failures are statuses with llm_errmsg().
 *
 * Distributed (mpirun -np T*P over a partitioned checkpoint): the server
 * runs on world rank 0; the engine thread mirrors every step to the other
 * ranks, which run llm_engine_serve_worker() (generate.h), and stops them
 * when it ends. */
#ifndef LLM_SERVER_H
#define LLM_SERVER_H

#include "scheduler.h"

struct llm_server_opts {
	const char *model;           /* checkpoint directory or .safetensors */
	const char *host;            /* "127.0.0.1" */
	int port;                    /* 0: any free port (see llm_server_port) */
	const char *api_key;         /* NULL: none; else "Authorization: Bearer KEY" */
	const char *chat_template;   /* NULL: the tokenizer's; else the template text */
	const char *model_name;      /* the name in /v1/models and responses */
	int max_queue;               /* requests waiting beyond the running ones; more get 429 */
	size_t max_body;             /* larger request bodies get 413 */
	int default_max_tokens;      /* /v1/completions without max_tokens (OpenAI: 16) */
	unsigned timeout;            /* seconds a connection may sit idle (nothing read or
	                              * written) before it is closed; 0: never. Not counted
	                              * while its request waits for the engine */
	unsigned max_connections;    /* open connections at most; 0: 1000 */
	unsigned max_conn_per_client;/* open connections from one IP address; 0: no limit */
	int allow_runtime_lora;      /* POST /v1/load_lora_adapter and /v1/unload_lora_adapter
	                              * work (else 403); eng.lora holds those of the start */
	struct llm_engine_opts eng;  /* max_seqs >= sched.max_running + sched.prefix_entries */
	struct llm_sched_opts sched; /* detok, on_admit and eos are filled in by the server */
};

enum llm_server_state { LLM_SERVER_LOADING, LLM_SERVER_READY, LLM_SERVER_DRAINING,
                        LLM_SERVER_FAILED };

struct llm_server;

/* Bind and start listening, then load the model in the engine thread.
 * Binding errors are returned here; load errors show in llm_server_state(). */
enum llm_status llm_server_start(struct llm_server **s, const struct llm_server_opts *o);
int llm_server_port(const struct llm_server *s);
/* The state; for LLM_SERVER_FAILED, *ERR (may be NULL) gets the message. */
enum llm_server_state llm_server_state(struct llm_server *s, const char **err);
/* Stop taking requests (new ones get 503, /health 503); running ones go on. */
void llm_server_drain(struct llm_server *s);
/* Requests accepted and not yet answered. */
int llm_server_in_flight(struct llm_server *s);
/* Cancel what is left, stop the threads, close everything. */
void llm_server_stop(struct llm_server *s);

#endif
