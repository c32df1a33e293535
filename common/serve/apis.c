/* common/serve/apis.c: the Responses and Messages APIs by kind (apis.h):
 * a body to its chat-completions body, a chat field's name in the API, and
 * a stream's events, each handed to api_responses.c or api_messages.c,
 * which know nothing of each other or of this file. */
#define _GNU_SOURCE
#include "apis.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

enum llm_status llm_api_to_chat(enum llm_api_kind kind, json_t *body, json_t **chat, char *param, size_t n)
{
	*chat = NULL;
	param[0] = 0;
	if (!json_is_object(body))
		return llm_api_bad(param, n, "body", "expected a JSON object");
	json_t *c = json_object();
	if (!c)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	enum llm_status s = kind == LLM_API_RESPONSES ? llm_responses_to_chat(body, c, param, n) :
	                    kind == LLM_API_MESSAGES || kind == LLM_API_MESSAGES_COUNT ?
	                    llm_messages_to_chat(body, kind == LLM_API_MESSAGES_COUNT, c, param, n) :
	                    llm_fail(LLM_ERR_INTERNAL, "llm_api_to_chat: kind %d", (int)kind);
	if (s) {
		json_decref(c);
		return s;
	}
	*chat = c;
	return LLM_OK;
}

const char *llm_api_field_name(enum llm_api_kind kind, const char *field)
{
	static const char *const map[][3] = {   /* kind's letter, chat's name, the API's */
		{ "r", "messages", "input" }, { "r", "max_tokens", "max_output_tokens" }, { "r", "response_format", "text.format" },
		{ "m", "stop", "stop_sequences" },
	};
	char k = kind == LLM_API_RESPONSES ? 'r' : 'm';
	for (size_t i = 0; i < sizeof map / sizeof *map; i++)
		if (map[i][0][0] == k && !strcmp(map[i][1], field))
			return map[i][2];
	return field;
}

void llm_api_stream_begin(enum llm_api_kind kind, struct llm_api_stream *st, struct llm_buf *b,
                          const struct llm_api_out *o)
{
	if (kind == LLM_API_RESPONSES)
		llm_responses_stream_begin(st, b, o);
	else
		llm_messages_stream_begin(st, b, o);
}

void llm_api_stream_text(enum llm_api_kind kind, struct llm_api_stream *st, struct llm_buf *b,
                         const struct llm_api_out *o, const char *delta, size_t n)
{
	if (kind == LLM_API_RESPONSES)
		llm_responses_stream_text(st, b, o, delta, n);
	else
		llm_messages_stream_text(st, b, o, delta, n);
}

void llm_api_stream_reasoning(enum llm_api_kind kind, struct llm_api_stream *st, struct llm_buf *b,
                              const struct llm_api_out *o, const char *delta, size_t n)
{
	if (kind == LLM_API_RESPONSES)
		llm_responses_stream_reasoning(st, b, o, delta, n);
	else
		llm_messages_stream_reasoning(st, b, o, delta, n);
}

void llm_api_stream_end(enum llm_api_kind kind, struct llm_api_stream *st, struct llm_buf *b,
                        const struct llm_api_out *o)
{
	if (kind == LLM_API_RESPONSES)
		llm_responses_stream_end(st, b, o);
	else
		llm_messages_stream_end(st, b, o);
}
