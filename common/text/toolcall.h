/* common/text/toolcall.h: tool calls in a chat answer (toolcall.c): which
 * format the chat template teaches the model, and the answer parsed into
 * the calls of OpenAI's tool_calls and the content around them.
 *
 * Formats:
 *   hermes  <tool_call>{"name": ..., "arguments": {...}}</tool_call>, any
 *           number, text around them content (Qwen2.5/Qwen3, Hermes; the
 *           template holds "<tool_call>");
 *   llama3  the answer is one or more JSON objects {"name": ...,
 *           "parameters": {...}} separated by ';', optionally after
 *           <|python_tag|> (Llama 3.1/3.2; the template holds
 *           "<|python_tag|>" or teaches "parameters").
 *
 * Guarantees:
 * - A call counts only when its JSON is whole, names a function of the
 *   request (when names are given) and its arguments are an object; an
 *   answer with a malformed or unknown call is all content, as if no call
 *   was made, so nothing the model wrote is lost.
 * - llm_tool_safe_prefix never marks as content a byte that the whole
 *   answer could turn into part of a call, so a stream can send content
 *   early and the calls at the end. */
#ifndef LLM_TOOLCALL_H
#define LLM_TOOLCALL_H

#include "status.h"

#include <stddef.h>

enum llm_tool_format { LLM_TOOL_NONE, LLM_TOOL_HERMES, LLM_TOOL_LLAMA3 };

/* The format TEMPLATE_SRC (a Jinja chat template; NULL: none) teaches. */
enum llm_tool_format llm_tool_format_of(const char *template_src);
const char *llm_tool_format_name(enum llm_tool_format f);

struct llm_tool_call {
	char *name;
	char *arguments;            /* a JSON object, compact */
};

struct llm_tool_answer {
	struct llm_tool_call *calls;   /* (n) in the answer's order */
	int n;
	char *content;              /* the text outside the calls, trimmed; "" when none */
	size_t content_len;
};

/* Parse TEXT (LEN bytes, the whole answer) in format F; calls only to the
 * N_NAMES functions NAMES (NULL: any name). LLM_ERR_NOMEM only. */
enum llm_status llm_tool_parse(enum llm_tool_format f, const char *text, size_t len, const char *const *names,
                               int n_names, struct llm_tool_answer *out);
void llm_tool_answer_free(struct llm_tool_answer *a);

/* Of the answer so far (TEXT, LEN bytes), how many leading bytes are
 * content whatever follows: those before anything that may start a call. */
size_t llm_tool_safe_prefix(enum llm_tool_format f, const char *text, size_t len);

#endif
