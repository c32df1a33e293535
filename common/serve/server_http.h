/* common/serve/server_http.h: the HTTP side of llm-serve: what server.c
 * (routing, admission, waiting and streaming, metrics text, start and stop)
 * calls in server_format.c (response bodies and SSE events) and
 * server_api.c (the smaller endpoints). Not a public header. It sits above
 * the jobs and the engine thread (server_impl.h), which know nothing of
 * it. */
#ifndef LLM_SERVER_HTTP_H
#define LLM_SERVER_HTTP_H

#include "server_impl.h"
#include "reasoning.h"

#include <jansson.h>
#include <stdio.h>

/* server_format.c (under srv->mu: they read the jobs' events) */
json_t *llm_srv_openai_full(struct llm_server *s, struct job *j);
/* The same body in parts appended to OUT, for an answer sent as it is
 * formatted: part 0 the head (best_of's ranking into ORDER, MAX_N), parts
 * 1 .. n_ret a choice each, then the tail (usage, and a newline): 1; 0
 * past the last part; -1 out of memory. MODEL: the name it carries. Without the
 * lock: a job whose choices are all done is not written any more, and the
 * connection's reference keeps it. */
int llm_srv_openai_part(struct llm_server *s, struct job *j, const char *model, int part, int *order,
                        struct llm_buf *out);
json_t *llm_srv_tgi_details(struct job *j, struct llm_server *s, int with_tokens);
json_t *llm_srv_tgi_generated(struct job *j);
/* Append to j->out the SSE events of J's new events (and the end). */
void llm_srv_stream_format(struct llm_server *s, struct job *j);
/* server_apis.c: the Responses and Messages APIs' body of J, and its
 * stream's new events appended to j->out (apis.h) */
json_t *llm_srv_api_full(struct llm_server *s, struct job *j);
void llm_srv_api_stream(struct llm_server *s, struct job *j);
/* server_format.c's, for server_apis.c: text as a JSON string (invalid
 * UTF-8 as U+FFFD), a choice's bytes of events [from, to), its answer
 * parsed into tool calls (0: none) */
json_t *llm_srv_jstr(const char *s, size_t n);
char *llm_srv_raw_text(const struct choice *c, int from, int to, size_t *len);
int llm_srv_parse_tools(struct job *j, const struct choice *c, struct llm_tool_answer *a);
/* The answer T (LEN bytes; DONE: whole) split into reasoning and content
 * when J's template reasons (reasoning.h); else all content. */
void llm_srv_split_answer(const struct job *j, const char *t, size_t len, int done, struct llm_reasoning_split *sp);
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
