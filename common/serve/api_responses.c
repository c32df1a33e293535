/* common/serve/api_responses.c: OpenAI's Responses API as a translation
 * (see apis.h): a /v1/responses body into a chat-completions body, one
 * answer out as a response object or its stream of events.
 *
 * In: input (a string: one user message; or items: messages with string or
 * input_text/output_text parts, function_call and function_call_output
 * items, reasoning items dropped), instructions (a system message first),
 * max_output_tokens, temperature, top_p (and vLLM's sampling extras,
 * chat_template_kwargs and guided_*),
 * function tools and tool_choice, text.format (text, json_object,
 * json_schema). Out: a message item with one output_text part when there
 * is text (or nothing at all), then one function_call item per call;
 * status "incomplete" with reason max_output_tokens at the length limit.
 * A stream's events carry sequence_number from 0, in the order OpenAI
 * sends them: response.created, response.in_progress, then per item
 * output_item.added, (content_part.added, output_text.delta...,
 * output_text.done, content_part.done | function_call_arguments.delta,
 * .done), output_item.done, and response.completed (or
 * response.incomplete, response.failed). */
#define _GNU_SOURCE
#include "apis.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

/* ---- the request -------------------------------------------------------- */

#define BAD(...) llm_api_bad(param, n, __VA_ARGS__)
#define NOMEM() llm_fail(LLM_ERR_NOMEM, "out of memory")


/* Text of a content (a string, or parts of TYPES: "input_text" ...) into B.
 * 0, or -1 with WHY set for a part that is not text. */
static int content_text(json_t *ct, const char *const *types, struct llm_buf *b, const char **why, size_t *bad_at)
{
	if (json_is_string(ct))
		return llm_buf_append(b, json_string_value(ct), json_string_length(ct)) ? -2 : 0;
	if (!json_is_array(ct)) {
		*why = "expected a string or an array of content parts";
		return -1;
	}
	for (size_t j = 0; j < json_array_size(ct); j++) {
		json_t *p = json_array_get(ct, j), *ty = json_object_get(p, "type"), *tx = json_object_get(p, "text");
		int ok = 0;
		for (const char *const *t = types; *t && json_is_string(ty); t++)
			ok |= !strcmp(json_string_value(ty), *t);
		*bad_at = j;
		if (!ok || !json_is_string(tx)) {
			*why = json_is_string(ty) && json_is_string(tx) ? "is not text (text parts only)" :
			       "expected {\"type\": \"input_text\", \"text\": string}";
			return -1;
		}
		if ((j && llm_buf_append_str(b, "\n")) || llm_buf_append(b, json_string_value(tx), json_string_length(tx)))
			return -2;
	}
	return 0;
}


/* Append a message (role, text) to MSGS; -1: out of memory. */
static int add_msg(json_t *msgs, const char *role, const struct llm_buf *text)
{
	json_t *m = json_pack("{s:s, s:o}", "role", role, "content", llm_api_str(text));
	return m && !json_array_append_new(msgs, m) ? 0 : -1;
}

/* input's items into MSGS (after any instructions). */
static enum llm_status input_items(json_t *in, json_t *msgs, char *param, size_t n)
{
	static const char *const text_types[] = { "input_text", "output_text", "text", NULL };
	const char *k = "input";
	json_t *calls = NULL;           /* the assistant message taking function_call items */
	for (size_t i = 0; i < json_array_size(in); i++) {
		json_t *it = json_array_get(in, i), *ty = llm_api_field(it, "type"), *role = llm_api_field(it, "role");
		const char *t = json_is_string(ty) ? json_string_value(ty) : role ? "message" : "";
		struct llm_buf b = { 0 };
		const char *why = NULL;
		size_t at = 0;
		if (!json_is_object(it))
			return BAD(k, "item %zu: expected an object (a message, function_call or function_call_output)", i);
		if (!strcmp(t, "message")) {
			const char *r = json_is_string(role) ? json_string_value(role) : "";
			if (strcmp(r, "user") && strcmp(r, "assistant") && strcmp(r, "system") && strcmp(r, "developer"))
				return BAD(k, "item %zu: role: expected user, assistant, system or developer", i);
			int rc = content_text(llm_api_field(it, "content"), text_types, &b, &why, &at);
			if (!rc && add_msg(msgs, !strcmp(r, "developer") ? "system" : r, &b))
				rc = -2;
			llm_buf_free(&b);
			if (rc == -1 && json_is_array(llm_api_field(it, "content")))
				return BAD(k, "item %zu: content part %zu: %s", i, at, why);
			if (rc == -1)
				return BAD(k, "item %zu: content: %s", i, why);
			if (rc)
				return NOMEM();
			calls = !strcmp(r, "assistant") ? json_array_get(msgs, json_array_size(msgs) - 1) : NULL;
		} else if (!strcmp(t, "function_call")) {
			json_t *id = llm_api_field(it, "call_id"), *nm = llm_api_field(it, "name"), *args = llm_api_field(it, "arguments");
			if (!json_is_string(id) || !json_is_string(nm) || !json_is_string(args))
				return BAD(k, "item %zu: expected {\"type\": \"function_call\", \"call_id\": string, \"name\": "
				           "string, \"arguments\": string}", i);
			if (!calls) {
				calls = json_pack("{s:s, s:s}", "role", "assistant", "content", "");
				if (!calls || json_array_append_new(msgs, calls))
					return NOMEM();
			}
			json_t *tc = json_object_get(calls, "tool_calls");
			if (!tc && (!(tc = json_array()) || json_object_set_new(calls, "tool_calls", tc)))
				return NOMEM();
			if (json_array_append_new(tc, json_pack("{s:O, s:s, s:{s:O, s:O}}", "id", id, "type", "function",
			                                        "function", "name", nm, "arguments", args)))
				return NOMEM();
		} else if (!strcmp(t, "function_call_output")) {
			json_t *id = llm_api_field(it, "call_id");
			int rc = content_text(llm_api_field(it, "output"), text_types, &b, &why, &at);
			if (!json_is_string(id) || rc == -1) {
				llm_buf_free(&b);
				return BAD(k, "item %zu: expected {\"type\": \"function_call_output\", \"call_id\": string, "
				           "\"output\": string}", i);
			}
			json_t *m = rc ? NULL : json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content",
			                                  llm_api_str(&b));
			llm_buf_free(&b);
			if (!m || json_array_append_new(msgs, m))
				return NOMEM();
			calls = NULL;
		} else if (!strcmp(t, "reasoning")) {
			continue;                /* a model's own thoughts of an earlier turn: not rendered again */
		} else {
			return BAD(k, "item %zu: type '%s' is not supported (message, function_call, function_call_output)",
			           i, t);
		}
	}
	return LLM_OK;
}

/* tools: function tools {"type": "function", "name", "description",
 * "parameters", "strict"} as chat's {"type": "function", "function": {...}}. */
static enum llm_status tools(json_t *body, json_t *chat, char *param, size_t n)
{
	json_t *ts = llm_api_field(body, "tools"), *tc = llm_api_field(body, "tool_choice");
	if (ts) {
		if (!json_is_array(ts))
			return BAD("tools", "expected an array");
		json_t *out = json_array();
		if (!out || json_object_set_new(chat, "tools", out))
			return NOMEM();
		for (size_t i = 0; i < json_array_size(ts); i++) {
			json_t *t = json_array_get(ts, i), *ty = json_object_get(t, "type"), *nm = json_object_get(t, "name");
			if (!json_is_string(ty) || strcmp(json_string_value(ty), "function"))
				return BAD("tools", "tools[%zu]: type '%s' is not supported (function tools only)", i,
				           json_is_string(ty) ? json_string_value(ty) : "(none)");
			if (!json_is_string(nm))
				return BAD("tools", "tools[%zu]: expected {\"type\": \"function\", \"name\": string, \"parameters\": "
				           "a JSON Schema object}", i);
			json_t *fn = json_pack("{s:O}", "name", nm);
			if (!fn)
				return NOMEM();
			const char *keys[] = { "description", "parameters" };
			for (size_t k = 0; k < 2; k++)
				if (llm_api_field(t, keys[k]))
					json_object_set(fn, keys[k], llm_api_field(t, keys[k]));
			if (json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn)))
				return NOMEM();
		}
	}
	if (json_is_string(tc)) {
		json_object_set(chat, "tool_choice", tc);
	} else if (tc) {
		json_t *ty = json_object_get(tc, "type"), *nm = json_object_get(tc, "name");
		if (!json_is_object(tc) || !json_is_string(ty) || strcmp(json_string_value(ty), "function") ||
		    !json_is_string(nm))
			return BAD("tool_choice", "expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", "
			           "\"name\": ...}");
		if (json_object_set_new(chat, "tool_choice", json_pack("{s:s, s:{s:O}}", "type", "function", "function",
		                                                       "name", nm)))
			return NOMEM();
	}
	return LLM_OK;
}

/* text.format: text (the default), json_object, or json_schema {"name",
 * "schema", "strict"} as chat's response_format. */
static enum llm_status text_format(json_t *body, json_t *chat, char *param, size_t n)
{
	json_t *tx = llm_api_field(body, "text"), *f = llm_api_field(tx, "format");
	if (tx && !json_is_object(tx))
		return BAD("text", "expected an object");
	if (!f)
		return LLM_OK;
	json_t *ty = json_object_get(f, "type");
	const char *t = json_is_string(ty) ? json_string_value(ty) : "";
	json_t *rf = NULL;
	if (!strcmp(t, "text"))
		return LLM_OK;
	if (!strcmp(t, "json_object"))
		rf = json_pack("{s:s}", "type", "json_object");
	else if (!strcmp(t, "json_schema") && llm_api_field(f, "schema"))
		rf = json_pack("{s:s, s:{s:O}}", "type", "json_schema", "json_schema", "schema", llm_api_field(f, "schema"));
	else if (!strcmp(t, "json_schema"))
		return BAD("text.format", "expected {\"type\": \"json_schema\", \"name\": ..., \"schema\": {...}}");
	else
		return BAD("text.format", "expected {\"type\": \"text\", \"json_object\" or \"json_schema\"}");
	return !rf || json_object_set_new(chat, "response_format", rf) ? NOMEM() : LLM_OK;
}

enum llm_status llm_responses_to_chat(json_t *body, json_t *chat, char *param, size_t n)
{
	/* what would need a response kept by the server, or is not done */
	json_t *v;
	if (llm_api_field(body, "previous_response_id"))
		return BAD("previous_response_id", "not supported: llm-serve keeps no responses; send the whole "
		           "conversation in input");
	if (llm_api_field(body, "conversation"))
		return BAD("conversation", "not supported: llm-serve keeps no conversations; send them in input");
	if ((v = llm_api_field(body, "store")) && !json_is_false(v))
		return BAD("store", "only false: llm-serve keeps no responses");
	if ((v = llm_api_field(body, "background")) && !json_is_false(v))
		return BAD("background", "only false");
	if (llm_api_field(body, "prompt"))
		return BAD("prompt", "not supported: stored prompt templates are kept by OpenAI only");
	if ((v = llm_api_field(body, "top_logprobs")) && !(json_is_integer(v) && json_integer_value(v) == 0))
		return BAD("top_logprobs", "not supported");
	static const char *const pass[] = { "model", "temperature", "top_p", "stream", "top_k", "min_p", "seed",
	                                    "repetition_penalty", "frequency_penalty", "presence_penalty",
	                                    "chat_template_kwargs", "guided_json", "guided_regex", "guided_choice",
	                                    "guided_grammar" };
	for (size_t i = 0; i < sizeof pass / sizeof *pass; i++)
		if ((v = llm_api_field(body, pass[i])) && json_object_set(chat, pass[i], v))
			return NOMEM();
	if ((v = llm_api_field(body, "max_output_tokens")) && json_object_set(chat, "max_tokens", v))
		return NOMEM();
	json_t *msgs = json_array();
	if (!msgs || json_object_set_new(chat, "messages", msgs))
		return NOMEM();
	json_t *ins = llm_api_field(body, "instructions"), *in = llm_api_field(body, "input");
	if (ins && !json_is_string(ins))
		return BAD("instructions", "expected a string");
	if (ins && json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "system", "content", ins)))
		return NOMEM();
	if (json_is_string(in)) {
		if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", "user", "content", in)))
			return NOMEM();
	} else if (json_is_array(in) && json_array_size(in)) {
		LLM_TRY(input_items(in, msgs, param, n));
	} else {
		return BAD("input", "expected a string or a non-empty array of items");
	}
	LLM_TRY(tools(body, chat, param, n));
	return text_format(body, chat, param, n);
}

/* ---- the answer --------------------------------------------------------- */

static json_t *usage(const struct llm_api_out *o)
{
	return json_pack("{s:i, s:{s:i}, s:i, s:{s:i}, s:i}", "input_tokens", o->n_prompt, "input_tokens_details",
	                 "cached_tokens", 0, "output_tokens", o->n_gen, "output_tokens_details", "reasoning_tokens", 0,
	                 "total_tokens", o->n_prompt + o->n_gen);
}

static json_t *text_part(const char *text, size_t len)
{
	return json_pack("{s:s, s:s%, s:[], s:[]}", "type", "output_text", "text", text ? text : "", len, "annotations",
	                 "logprobs");
}

static json_t *message_item(const struct llm_api_out *o, int done)
{
	char id[80];
	snprintf(id, sizeof id, "msg_%s", o->id);
	return json_pack("{s:s, s:s, s:s, s:s, s:o}", "id", id, "type", "message", "status",
	                 done ? "completed" : "in_progress", "role", "assistant", "content",
	                 done ? json_pack("[o]", text_part(o->text, o->len)) : json_array());
}

static json_t *call_item(const struct llm_api_out *o, int k, int done)
{
	char id[80], cid[80];
	snprintf(id, sizeof id, "fc_%s_%d", o->id, k);
	snprintf(cid, sizeof cid, "call_%s_%d", o->id, k);
	return json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "id", id, "type", "function_call", "status",
	                 done ? "completed" : "in_progress", "call_id", cid, "name", o->calls->calls[k].name,
	                 "arguments", done ? o->calls->calls[k].arguments : "");
}

/* a message item: when there is text, or there is nothing else */
static int has_message(const struct llm_api_out *o)
{
	return o->len || ((!o->calls || !o->calls->n) && !o->reasoning_len);
}

static json_t *reasoning_part(const char *text, size_t len)
{
	return json_pack("{s:s, s:s%}", "type", "reasoning_text", "text", text ? text : "", len);
}

static json_t *reasoning_item(const struct llm_api_out *o, int done)
{
	char id[80];
	snprintf(id, sizeof id, "rs_%s", o->id);
	return json_pack("{s:s, s:s, s:s, s:[], s:o}", "id", id, "type", "reasoning", "status",
	                 done ? "completed" : "in_progress", "summary", "content",
	                 done ? json_pack("[o]", reasoning_part(o->reasoning, o->reasoning_len)) : json_array());
}

json_t *llm_responses_body(const struct llm_api_out *o)
{
	int done = o->finish != LLM_FINISH_NONE;
	const char *status = !done ? "in_progress" : o->finish == LLM_FINISH_ERROR ? "failed" :
	                     o->finish == LLM_FINISH_LENGTH ? "incomplete" : "completed";
	json_t *out = json_array();
	if (done && o->reasoning && o->reasoning_len)
		json_array_append_new(out, reasoning_item(o, 1));
	if (done && has_message(o))
		json_array_append_new(out, message_item(o, 1));
	for (int k = 0; done && o->calls && k < o->calls->n; k++)
		json_array_append_new(out, call_item(o, k, 1));
	json_t *r = json_pack("{s:s, s:s, s:I, s:s, s:n, s:n, s:s, s:o, s:b, s:o}", "id", o->id, "object", "response",
	                      "created_at", (json_int_t)o->created, "status", status, "error", "incomplete_details",
	                      "model", o->model, "output", out, "parallel_tool_calls", 1, "usage",
	                      done ? usage(o) : json_null());
	if (r && o->finish == LLM_FINISH_LENGTH)
		json_object_set_new(r, "incomplete_details", json_pack("{s:s}", "reason", "max_output_tokens"));
	if (r && o->finish == LLM_FINISH_ERROR)
		json_object_set_new(r, "error", json_pack("{s:s, s:s}", "code", "server_error", "message",
		                                          o->error ? o->error : "the request failed"));
	return r;
}

/* One event: TYPE, its sequence number, then FIELDS' members (taken). */
static void ev(struct llm_api_stream *st, struct llm_buf *b, const char *type, json_t *fields)
{
	json_t *e = json_pack("{s:s, s:i}", "type", type, "sequence_number", st->seq++);
	if (e && fields)
		json_object_update(e, fields);
	json_decref(fields);
	llm_api_sse(b, type, e);
}

void llm_responses_stream_begin(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o)
{
	if (st->begun)
		return;
	st->begun = 1;
	struct llm_api_out start = *o;
	start.finish = LLM_FINISH_NONE;
	ev(st, b, "response.created", json_pack("{s:o}", "response", llm_responses_body(&start)));
	ev(st, b, "response.in_progress", json_pack("{s:o}", "response", llm_responses_body(&start)));
}

/* The reasoning item closed with O's reasoning (all its deltas). */
static void close_reasoning(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o)
{
	char id[80];
	snprintf(id, sizeof id, "rs_%s", o->id);
	st->reasoning_open = 0;
	ev(st, b, "response.reasoning_text.done", json_pack("{s:s, s:i, s:i, s:s%}", "item_id", id, "output_index", 0,
	                                                    "content_index", 0, "text", o->reasoning ? o->reasoning : "",
	                                                    o->reasoning_len));
	ev(st, b, "response.content_part.done", json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", 0,
	                                                  "content_index", 0, "part",
	                                                  reasoning_part(o->reasoning, o->reasoning_len)));
	ev(st, b, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", 0, "item", reasoning_item(o, 1)));
}

void llm_responses_stream_reasoning(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o,
                                    const char *delta, size_t n)
{
	if (!n || st->text_open || (st->n_items && !st->reasoning_open))
		return;                  /* reasoning comes first, or not at all */
	llm_responses_stream_begin(st, b, o);
	char id[80];
	snprintf(id, sizeof id, "rs_%s", o->id);
	if (!st->reasoning_open) {
		st->reasoning_open = 1;
		ev(st, b, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", 0, "item",
		                                                  reasoning_item(o, 0)));
		ev(st, b, "response.content_part.added", json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index", 0,
		                                                   "content_index", 0, "part", reasoning_part("", 0)));
		st->n_items++;
	}
	ev(st, b, "response.reasoning_text.delta", json_pack("{s:s, s:i, s:i, s:s%}", "item_id", id, "output_index", 0,
	                                                     "content_index", 0, "delta", delta, n));
}

static void open_text(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o)
{
	char id[80];
	snprintf(id, sizeof id, "msg_%s", o->id);
	if (st->reasoning_open)
		close_reasoning(st, b, o);
	st->text_open = 1;
	st->text_at = st->n_items;
	ev(st, b, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", st->n_items,
	                                                  "item", message_item(o, 0)));
	ev(st, b, "response.content_part.added", json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index",
	                                                   st->n_items, "content_index", 0, "part", text_part("", 0)));
	st->n_items++;
}

void llm_responses_stream_text(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o,
                               const char *delta, size_t n)
{
	if (!n)
		return;
	llm_responses_stream_begin(st, b, o);
	if (!st->text_open)
		open_text(st, b, o);
	char id[80];
	snprintf(id, sizeof id, "msg_%s", o->id);
	ev(st, b, "response.output_text.delta", json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", id, "output_index",
	                                                  st->text_at, "content_index", 0, "delta", delta, n,
	                                                  "logprobs"));
}

void llm_responses_stream_end(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o)
{
	if (st->ended)
		return;
	llm_responses_stream_begin(st, b, o);
	st->ended = 1;
	char id[80];
	snprintf(id, sizeof id, "msg_%s", o->id);
	if (o->finish == LLM_FINISH_ERROR) {
		ev(st, b, "response.failed", json_pack("{s:o}", "response", llm_responses_body(o)));
		return;
	}
	if (!st->text_open && has_message(o))
		open_text(st, b, o);
	if (st->reasoning_open)
		close_reasoning(st, b, o);
	if (st->text_open) {
		int at = st->text_at;
		ev(st, b, "response.output_text.done", json_pack("{s:s, s:i, s:i, s:s%, s:[]}", "item_id", id,
		                                                 "output_index", at, "content_index", 0, "text",
		                                                 o->text ? o->text : "", o->len, "logprobs"));
		ev(st, b, "response.content_part.done", json_pack("{s:s, s:i, s:i, s:o}", "item_id", id, "output_index",
		                                                  at, "content_index", 0, "part", text_part(o->text, o->len)));
		ev(st, b, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", at, "item",
		                                                 message_item(o, 1)));
	}
	for (int k = 0; o->calls && k < o->calls->n; k++) {
		int at = st->n_items++;
		char fid[80];
		snprintf(fid, sizeof fid, "fc_%s_%d", o->id, k);
		ev(st, b, "response.output_item.added", json_pack("{s:i, s:o}", "output_index", at, "item",
		                                                  call_item(o, k, 0)));
		ev(st, b, "response.function_call_arguments.delta", json_pack("{s:s, s:i, s:s}", "item_id", fid,
		                                                              "output_index", at, "delta",
		                                                              o->calls->calls[k].arguments));
		ev(st, b, "response.function_call_arguments.done", json_pack("{s:s, s:i, s:s, s:s}", "item_id", fid,
		                                                             "output_index", at, "name",
		                                                             o->calls->calls[k].name, "arguments",
		                                                             o->calls->calls[k].arguments));
		ev(st, b, "response.output_item.done", json_pack("{s:i, s:o}", "output_index", at, "item",
		                                                 call_item(o, k, 1)));
	}
	ev(st, b, o->finish == LLM_FINISH_LENGTH ? "response.incomplete" : "response.completed",
	   json_pack("{s:o}", "response", llm_responses_body(o)));
}
