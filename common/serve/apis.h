/* common/serve/apis.h: OpenAI's Responses API (POST /v1/responses,
 * api_responses.c) and Anthropic's Messages API (POST /v1/messages and
 * /v1/messages/count_tokens, api_messages.c) as translations (apis.c picks
 * one by kind; api_base.c holds what both use): a body into
 * the chat-completions body that request.c parses (so every value rule,
 * the chat template, tools and structured output are chat's), and one
 * answer out into each API's JSON body or server-sent events.
 *
 * References: OpenAI's API reference for "Create a model response" and its
 * streaming events; Anthropic's "Messages", "Streaming Messages", "Count
 * tokens" and "Errors" pages. What is kept of a request: see llm-serve(1),
 * "The Responses API" and "The Messages API". No state is kept between
 * requests: previous_response_id and store true are refused.
 *
 * The output side knows nothing of the server: it takes one answer (struct
 * llm_api_out, its text valid UTF-8) and appends to a buffer, so the tests
 * and the server share it. */
#ifndef LLM_APIS_H
#define LLM_APIS_H

#include "request.h"
#include "buf.h"
#include "generate.h"
#include "toolcall.h"

struct json_t;

/* BODY (a Responses, Messages or count_tokens body: KIND LLM_API_RESPONSES,
 * LLM_API_MESSAGES or LLM_API_MESSAGES_COUNT) to *CHAT, a new
 * chat-completions body. On failure *CHAT is NULL, PARAM (N bytes) holds
 * the field at fault as the API names it and the message starts with it:
 * LLM_ERR_USAGE, or LLM_ERR_NOMEM. */
enum llm_status llm_api_to_chat(enum llm_api_kind kind, struct json_t *body, struct json_t **chat, char *param,
                                size_t n);
/* The chat field FIELD of a translated body as KIND's API names it
 * ("max_tokens" is "max_output_tokens" in a Responses body); FIELD when
 * the name is the same. */
const char *llm_api_field_name(enum llm_api_kind kind, const char *field);

/* One answer of a Responses or Messages request. */
struct llm_api_out {
	const char *id;             /* the request's id: "resp_..." or "msg_..." */
	const char *model;
	long long created;          /* Unix time */
	int n_prompt, n_gen;        /* tokens */
	const char *text;           /* the content (valid UTF-8; streamed: what the deltas sent) */
	size_t len;
	/* The reasoning hook: text the chat template marks as the model's
	 * thinking, split from the content by the caller (valid UTF-8; NULL:
	 * none). It is a reasoning item (reasoning_text part) before the
	 * message in a response, a thinking block before the text in a
	 * message; streamed through llm_api_stream_reasoning. llm-serve does
	 * not split it yet (server_apis.c). */
	const char *reasoning;
	size_t reasoning_len;
	const struct llm_tool_answer *calls;   /* the tool calls parsed from the answer; NULL: none */
	enum llm_finish finish;     /* LLM_FINISH_NONE: not finished (a stream's start) */
	const char *stop;           /* the stop string that ended it (Messages' stop_sequence); NULL: none */
	const char *error;          /* LLM_FINISH_ERROR: why */
};

/* The whole answer as the API's response body (non-streamed, and the
 * Responses stream's final response.completed). NULL: out of memory. */
struct json_t *llm_responses_body(const struct llm_api_out *o);
struct json_t *llm_messages_body(const struct llm_api_out *o);

/* A stream's state: zeroed before the first call. */
struct llm_api_stream {
	int seq;                    /* Responses: the next sequence_number */
	int begun;                  /* the opening events are out */
	int text_open;              /* a message item (Responses) or text block (Messages) is open */
	int text_at;                /* its index among the items or blocks */
	int reasoning_open;         /* a reasoning item or thinking block is open (its index: 0) */
	int n_items;                /* output items (Responses) or content blocks (Messages) opened */
	int ended;
};

/* Append to B the events of KIND's stream (LLM_API_RESPONSES or
 * LLM_API_MESSAGES): _begin the opening ones; _text DELTA (N bytes of
 * content, valid UTF-8; opens the text first); _end the closing ones for O,
 * the whole answer (O->text all the deltas sent, in order), its tool calls
 * after the text. Out of memory drops events. */
void llm_api_stream_begin(enum llm_api_kind kind, struct llm_api_stream *st, struct llm_buf *b,
                          const struct llm_api_out *o);
void llm_api_stream_text(enum llm_api_kind kind, struct llm_api_stream *st, struct llm_buf *b,
                         const struct llm_api_out *o, const char *delta, size_t n);
/* Reasoning DELTA (N bytes, valid UTF-8), before any text: opens the
 * reasoning item or thinking block first; the first _text (its O->reasoning
 * all the reasoning sent) or _end closes it. */
void llm_api_stream_reasoning(enum llm_api_kind kind, struct llm_api_stream *st, struct llm_buf *b,
                              const struct llm_api_out *o, const char *delta, size_t n);
void llm_api_stream_end(enum llm_api_kind kind, struct llm_api_stream *st, struct llm_buf *b,
                        const struct llm_api_out *o);

/* An error body of the Messages API: {"type": "error", "error": {"type":
 * the type of HTTP STATUS, "message": MSG}}. */
struct json_t *llm_messages_error(unsigned status, const char *msg);

/* api_base.c: what both translations use */
/* O's member K, NULL when absent or null; B's bytes as a new JSON string */
struct json_t *llm_api_field(struct json_t *o, const char *k);
struct json_t *llm_api_str(const struct llm_buf *b);
void llm_api_sse(struct llm_buf *b, const char *event, struct json_t *data);   /* takes DATA */
enum llm_status llm_api_bad(char *param, size_t n, const char *field, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* each translation's own, for apis.c */
enum llm_status llm_responses_to_chat(struct json_t *body, struct json_t *chat, char *param, size_t n);
enum llm_status llm_messages_to_chat(struct json_t *body, int count, struct json_t *chat, char *param, size_t n);
void llm_responses_stream_begin(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o);
void llm_responses_stream_text(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o,
                               const char *delta, size_t n);
void llm_responses_stream_reasoning(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o,
                                    const char *delta, size_t n);
void llm_responses_stream_end(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o);
void llm_messages_stream_begin(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o);
void llm_messages_stream_text(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o,
                              const char *delta, size_t n);
void llm_messages_stream_reasoning(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o,
                                   const char *delta, size_t n);
void llm_messages_stream_end(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o);

#endif
