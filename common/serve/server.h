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
	unsigned max_connections;    /* open connections at most; 0: 1000. At the limit a new
	                              * connection sheds one that holds no whole request (the
	                              * longest idle after an answer, else the longest at its
	                              * request), or is answered 503 with Retry-After when
	                              * every one is at work */
	unsigned max_conn_per_client;/* open connections from one IP address; 0: no limit
	                              * (at it, the same, among that address's connections) */
	double request_timeout;      /* seconds a connection has to deliver a whole request
	                              * (head and body) from its opening or its previous
	                              * answer; then it is closed (408 when it never had an
	                              * answer). 0: no limit */
	int64_t max_logprob_entries; /* log-prob entries one request may be answered with
	                              * (server.c, logprob_entries); more is 400; 0: no limit */
	double stall_timeout;        /* /health answers 503 "stalled" when the engine has had
	                              * work this long without finishing a step; 0: never */
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
/* Distributed: the rank whose loss failed the server (LLM_SERVER_FAILED;
 * every request was answered 503 naming it), else -1. The engine thread
 * may then wait forever inside MPI for that rank: end the process
 * (llm_server_stop then only closes the listening socket and leaves the
 * rest, engine thread included, to the end of the process). */
int llm_server_lost_rank(struct llm_server *s);
/* Stop taking requests (new ones get 503, /health 503); running ones go on. */
void llm_server_drain(struct llm_server *s);
/* Sockets the server may hold with MAX_CONNECTIONS (its limit, 0: 1000):
 * connections over it are taken for a moment to be shed or refused with
 * 503, so the file descriptors needed are this plus the process's own. */
unsigned llm_server_socket_limit(unsigned max_connections);
/* Raise the soft limit on open files to the hard one when MAX_CONNECTIONS
 * (their sockets and the process's own) need it; a warning when even the
 * hard one is short. */
void llm_server_fd_limit(unsigned max_connections);
/* Why KEY cannot be an API key (NULL: it can): blank, or a space or tab at
 * either end, which no Authorization header can carry (its value's ends
 * are trimmed), so no client could ever match it. */
const char *llm_server_key_flaw(const char *key);
/* The API key on the first line of file PATH into *KEY (the caller frees
 * it): an unreadable file, an empty first line or a flawed key is an error
 * naming PATH. */
enum llm_status llm_server_key_file(const char *path, char **key);
/* Requests accepted and not yet answered. */
int llm_server_in_flight(struct llm_server *s);
/* Cancel what is left, stop the threads, close everything. */
void llm_server_stop(struct llm_server *s);

#endif
