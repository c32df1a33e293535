/* common/serve/api_messages.c: Anthropic's Messages API as a translation
 * (see apis.h): a /v1/messages (or /v1/messages/count_tokens) body into a
 * chat-completions body, one answer out as a message or its stream of
 * events, and the error body.
 *
 * In: system (a string or text blocks: a system message first), messages
 * (user and assistant; content a string or blocks: text, tool_use in an
 * assistant turn as its tool_calls, tool_result in a user turn as tool
 * messages before the turn's text; thinking blocks dropped), max_tokens
 * (required, not for count_tokens), stop_sequences, temperature, top_p,
 * top_k, tools ({"name", "description", "input_schema"}) and tool_choice
 * (auto, any, tool, none). Out: a text block when there is text (or
 * nothing at all), then a tool_use block per call; stop_reason end_turn,
 * max_tokens, stop_sequence (with the string) or tool_use. A stream:
 * message_start, ping, then per block content_block_start,
 * content_block_delta (text_delta, input_json_delta)..., content_block_stop,
 * and message_delta (stop_reason, usage), message_stop. */
#define _GNU_SOURCE
#include "apis.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

#define BAD(...) llm_api_bad(param, n, __VA_ARGS__)
#define NOMEM() llm_fail(LLM_ERR_NOMEM, "out of memory")


/* A block's "type" ("" when it has none). */
static const char *type_of(json_t *blk)
{
	json_t *t = json_object_get(blk, "type");
	return json_is_string(t) ? json_string_value(t) : "";
}

/* The text of CT (a string, or text blocks joined by newlines) into B:
 * 0, -1 (a block at *AT is not text), -2 (out of memory). */
static int text_of(json_t *ct, struct llm_buf *b, size_t *at)
{
	if (json_is_string(ct))
		return llm_buf_append(b, json_string_value(ct), json_string_length(ct)) ? -2 : 0;
	if (!json_is_array(ct))
		return -1;
	for (size_t j = 0; j < json_array_size(ct); j++) {
		json_t *blk = json_array_get(ct, j), *tx = json_object_get(blk, "text");
		*at = j;
		if (strcmp(type_of(blk), "text") || !json_is_string(tx))
			return -1;
		if ((j && llm_buf_append_str(b, "\n")) || llm_buf_append(b, json_string_value(tx), json_string_length(tx)))
			return -2;
	}
	return 0;
}


/* Message I (ROLE, its content blocks CT) into MSGS. */
static enum llm_status blocks(json_t *msgs, size_t i, const char *role, json_t *ct, char *param, size_t n)
{
	const char *k = "messages";
	int asst = !strcmp(role, "assistant");
	struct llm_buf text = { 0 };
	json_t *calls = NULL;
	enum llm_status s = LLM_OK;
	for (size_t j = 0; j < json_array_size(ct) && !s; j++) {
		json_t *blk = json_array_get(ct, j);
		const char *t = type_of(blk);
		if (!json_is_object(blk)) {
			s = BAD(k, "message %zu: block %zu: expected an object", i, j);
		} else if (!strcmp(t, "text")) {
			json_t *tx = json_object_get(blk, "text");
			if (!json_is_string(tx))
				s = BAD(k, "message %zu: block %zu: expected {\"type\": \"text\", \"text\": string}", i, j);
			else if ((text.len && llm_buf_append_str(&text, "\n")) ||
			         llm_buf_append(&text, json_string_value(tx), json_string_length(tx)))
				s = NOMEM();
		} else if (!strcmp(t, "tool_use") && asst) {
			json_t *id = llm_api_field(blk, "id"), *nm = llm_api_field(blk, "name"), *in = llm_api_field(blk, "input");
			char *args = json_is_object(in) ? json_dumps(in, JSON_COMPACT) : NULL;
			if (!json_is_string(id) || !json_is_string(nm) || !json_is_object(in))
				s = BAD(k, "message %zu: block %zu: expected {\"type\": \"tool_use\", \"id\": string, \"name\": "
				        "string, \"input\": object}", i, j);
			else if (!args || (!calls && !(calls = json_array())) ||
			         json_array_append_new(calls, json_pack("{s:O, s:s, s:{s:O, s:s}}", "id", id, "type", "function",
			                                                "function", "name", nm, "arguments", args)))
				s = NOMEM();
			free(args);
		} else if (!strcmp(t, "tool_result") && !asst) {
			/* a tool's answer: a tool message, before the turn's text */
			json_t *id = llm_api_field(blk, "tool_use_id"), *c = llm_api_field(blk, "content");
			struct llm_buf r = { 0 };
			size_t at = 0;
			int rc = c ? text_of(c, &r, &at) : 0;
			json_t *m = NULL;
			if (!json_is_string(id) || rc == -1)
				s = BAD(k, "message %zu: block %zu: expected {\"type\": \"tool_result\", \"tool_use_id\": string, "
				        "\"content\": a string or text blocks}", i, j);
			else if (rc || !(m = json_pack("{s:s, s:O, s:o}", "role", "tool", "tool_call_id", id, "content",
			                               llm_api_str(&r))) || json_array_append_new(msgs, m))
				s = NOMEM();
			llm_buf_free(&r);
		} else if (!strcmp(t, "thinking") || !strcmp(t, "redacted_thinking")) {
			continue;            /* an earlier turn's thoughts: not rendered again */
		} else {
			s = BAD(k, "message %zu: block %zu: type '%s' is not supported in a%s %s turn (text, %s)", i, j, t,
			        asst ? "n" : "", role, asst ? "tool_use" : "tool_result");
		}
	}
	/* the turn itself: its text (a user turn of tool results only has none) */
	if (!s && (text.len || asst || !json_array_size(ct))) {
		json_t *m = json_pack("{s:s, s:o}", "role", role, "content", llm_api_str(&text));
		if (!m || (calls && json_object_set(m, "tool_calls", calls)) || json_array_append_new(msgs, m))
			s = NOMEM();
	}
	json_decref(calls);
	llm_buf_free(&text);
	return s;
}

/* tools {"name", "description", "input_schema"} and tool_choice. */
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
			json_t *t = json_array_get(ts, i), *nm = json_object_get(t, "name"), *sc = llm_api_field(t, "input_schema");
			const char *ty = type_of(t);
			if (ty[0] && strcmp(ty, "custom"))
				return BAD("tools", "tools[%zu]: type '%s' is not supported (client tools only: name, "
				           "description, input_schema)", i, ty);
			if (!json_is_string(nm) || (sc && !json_is_object(sc)))
				return BAD("tools", "tools[%zu]: expected {\"name\": string, \"input_schema\": a JSON Schema "
				           "object}", i);
			json_t *fn = json_pack("{s:O}", "name", nm);
			if (!fn)
				return NOMEM();
			if (llm_api_field(t, "description"))
				json_object_set(fn, "description", llm_api_field(t, "description"));
			if (sc)
				json_object_set(fn, "parameters", sc);
			if (json_array_append_new(out, json_pack("{s:s, s:o}", "type", "function", "function", fn)))
				return NOMEM();
		}
	}
	if (!tc)
		return LLM_OK;
	const char *t = type_of(tc);
	json_t *nm = json_object_get(tc, "name"), *v = NULL;
	if (!strcmp(t, "auto") || !strcmp(t, "none"))
		v = json_string(t);
	else if (!strcmp(t, "any"))
		v = json_string("required");
	else if (!strcmp(t, "tool") && json_is_string(nm))
		v = json_pack("{s:s, s:{s:O}}", "type", "function", "function", "name", nm);
	else
		return BAD("tool_choice", "expected {\"type\": \"auto\", \"any\", \"none\" or \"tool\" (with \"name\")}");
	return !v || json_object_set_new(chat, "tool_choice", v) ? NOMEM() : LLM_OK;
}

enum llm_status llm_messages_to_chat(json_t *body, int count, json_t *chat, char *param, size_t n)
{
	json_t *v;
	/* vLLM's extras too: the template's variables (enable_thinking), guided_* */
	static const char *const pass[] = { "model", "chat_template_kwargs", "temperature", "top_p", "top_k", "stream",
	                                    "guided_json", "guided_regex", "guided_choice", "guided_grammar" };
	for (size_t i = 0; i < sizeof pass / sizeof *pass; i++)   /* count_tokens: what changes the prompt */
		if ((!count || i < 2) && (v = llm_api_field(body, pass[i])) && json_object_set(chat, pass[i], v))
			return NOMEM();
	if (!count) {
		if (!(v = llm_api_field(body, "max_tokens")))
			return BAD("max_tokens", "required");
		if (json_object_set(chat, "max_tokens", v))
			return NOMEM();
		if ((v = llm_api_field(body, "stop_sequences"))) {
			if (!json_is_array(v))
				return BAD("stop_sequences", "expected an array of strings");
			if (json_array_size(v) && json_object_set(chat, "stop", v))
				return NOMEM();
		}
	}
	json_t *msgs = json_array();
	if (!msgs || json_object_set_new(chat, "messages", msgs))
		return NOMEM();
	json_t *sys = llm_api_field(body, "system"), *in = llm_api_field(body, "messages");
	if (sys) {
		struct llm_buf b = { 0 };
		size_t at = 0;
		int rc = text_of(sys, &b, &at);
		json_t *m = rc ? NULL : json_pack("{s:s, s:o}", "role", "system", "content", llm_api_str(&b));
		llm_buf_free(&b);
		if (rc == -1)
			return BAD("system", "expected a string or an array of text blocks");
		if (!m || json_array_append_new(msgs, m))
			return NOMEM();
	}
	if (!json_is_array(in) || !json_array_size(in))
		return BAD("messages", "expected a non-empty array of messages");
	for (size_t i = 0; i < json_array_size(in); i++) {
		json_t *m = json_array_get(in, i), *role = json_object_get(m, "role"), *ct = json_object_get(m, "content");
		const char *r = json_is_string(role) ? json_string_value(role) : "";
		if (!json_is_object(m) || (strcmp(r, "user") && strcmp(r, "assistant")))
			return BAD("messages", "message %zu: expected {\"role\": \"user\" or \"assistant\", \"content\": ...}", i);
		if (json_is_string(ct)) {
			if (json_array_append_new(msgs, json_pack("{s:s, s:O}", "role", r, "content", ct)))
				return NOMEM();
		} else if (json_is_array(ct)) {
			LLM_TRY(blocks(msgs, i, r, ct, param, n));
		} else {
			return BAD("messages", "message %zu: content: expected a string or an array of blocks", i);
		}
	}
	return tools(body, chat, param, n);
}

/* ---- the answer --------------------------------------------------------- */

static const char *stop_reason(const struct llm_api_out *o)
{
	return o->calls && o->calls->n && o->finish != LLM_FINISH_LENGTH ? "tool_use" :
	       o->finish == LLM_FINISH_LENGTH ? "max_tokens" : o->stop ? "stop_sequence" : "end_turn";
}

static json_t *tool_block(const struct llm_api_out *o, int k, int done)
{
	char id[80];
	snprintf(id, sizeof id, "toolu_%s_%d", o->id, k);
	json_t *in = done ? json_loads(o->calls->calls[k].arguments, 0, NULL) : NULL;
	return json_pack("{s:s, s:s, s:s, s:o}", "type", "tool_use", "id", id, "name", o->calls->calls[k].name,
	                 "input", in ? in : json_object());
}

static int has_text(const struct llm_api_out *o)
{
	return o->len || ((!o->calls || !o->calls->n) && !o->reasoning_len);
}

json_t *llm_messages_body(const struct llm_api_out *o)
{
	int done = o->finish != LLM_FINISH_NONE;
	json_t *content = json_array();
	if (done && o->reasoning && o->reasoning_len)
		json_array_append_new(content, json_pack("{s:s, s:s%, s:s}", "type", "thinking", "thinking", o->reasoning,
		                                         o->reasoning_len, "signature", ""));
	if (done && has_text(o))
		json_array_append_new(content, json_pack("{s:s, s:s%}", "type", "text", "text", o->text ? o->text : "",
		                                         o->len));
	for (int k = 0; done && o->calls && k < o->calls->n; k++)
		json_array_append_new(content, tool_block(o, k, 1));
	return json_pack("{s:s, s:s, s:s, s:s, s:o, s:o, s:o, s:{s:i, s:i}}", "id", o->id, "type", "message", "role",
	                 "assistant", "model", o->model, "content", content, "stop_reason",
	                 done ? json_string(stop_reason(o)) : json_null(), "stop_sequence",
	                 done && o->stop && !strcmp(stop_reason(o), "stop_sequence") ? json_string(o->stop) : json_null(),
	                 "usage", "input_tokens", o->n_prompt, "output_tokens", o->n_gen);
}

json_t *llm_messages_error(unsigned status, const char *msg)
{
	const char *t = status == 401 ? "authentication_error" : status == 403 ? "permission_error" :
	                status == 404 ? "not_found_error" : status == 413 ? "request_too_large" :
	                status == 429 ? "rate_limit_error" : status == 503 ? "overloaded_error" :
	                status >= 500 ? "api_error" : "invalid_request_error";
	return json_pack("{s:s, s:{s:s, s:s}}", "type", "error", "error", "type", t, "message", msg);
}

void llm_messages_stream_begin(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o)
{
	if (st->begun)
		return;
	st->begun = 1;
	struct llm_api_out start = *o;
	start.finish = LLM_FINISH_NONE;
	start.n_gen = 0;
	llm_api_sse(b, "message_start", json_pack("{s:s, s:o}", "type", "message_start", "message",
	                                          llm_messages_body(&start)));
	llm_api_sse(b, "ping", json_pack("{s:s}", "type", "ping"));
}

static void block_stop(struct llm_buf *b, int index);

void llm_messages_stream_reasoning(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o,
                                   const char *delta, size_t n)
{
	if (!n || st->text_open || (st->n_items && !st->reasoning_open))
		return;                  /* thinking comes first, or not at all */
	llm_messages_stream_begin(st, b, o);
	if (!st->reasoning_open) {
		st->reasoning_open = 1;
		llm_api_sse(b, "content_block_start", json_pack("{s:s, s:i, s:{s:s, s:s, s:s}}", "type", "content_block_start",
		                                                "index", 0, "content_block", "type", "thinking", "thinking", "",
		                                                "signature", ""));
		st->n_items++;
	}
	llm_api_sse(b, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type", "content_block_delta",
	                                                "index", 0, "delta", "type", "thinking_delta", "thinking", delta, n));
}

static void open_text(struct llm_api_stream *st, struct llm_buf *b)
{
	if (st->reasoning_open) {
		st->reasoning_open = 0;
		block_stop(b, 0);
	}
	st->text_open = 1;
	st->text_at = st->n_items;
	llm_api_sse(b, "content_block_start", json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_start",
	                                                "index", st->n_items, "content_block", "type", "text", "text", ""));
	st->n_items++;
}

static void block_stop(struct llm_buf *b, int index)
{
	llm_api_sse(b, "content_block_stop", json_pack("{s:s, s:i}", "type", "content_block_stop", "index", index));
}

void llm_messages_stream_text(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o,
                              const char *delta, size_t n)
{
	if (!n)
		return;
	llm_messages_stream_begin(st, b, o);
	if (!st->text_open)
		open_text(st, b);
	llm_api_sse(b, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s%}}", "type", "content_block_delta",
	                                                "index", st->text_at, "delta", "type", "text_delta",
	                                                "text", delta, n));
}

void llm_messages_stream_end(struct llm_api_stream *st, struct llm_buf *b, const struct llm_api_out *o)
{
	if (st->ended)
		return;
	llm_messages_stream_begin(st, b, o);
	st->ended = 1;
	if (o->finish == LLM_FINISH_ERROR) {
		llm_api_sse(b, "error", llm_messages_error(500, o->error ? o->error : "the request failed"));
		return;
	}
	if (!st->text_open && has_text(o))
		open_text(st, b);
	if (st->reasoning_open) {
		st->reasoning_open = 0;
		block_stop(b, 0);
	}
	if (st->text_open)
		block_stop(b, st->text_at);
	for (int k = 0; o->calls && k < o->calls->n; k++) {
		int at = st->n_items++;
		llm_api_sse(b, "content_block_start", json_pack("{s:s, s:i, s:o}", "type", "content_block_start", "index", at,
		                                                "content_block", tool_block(o, k, 0)));
		llm_api_sse(b, "content_block_delta", json_pack("{s:s, s:i, s:{s:s, s:s}}", "type", "content_block_delta",
		                                                "index", at, "delta", "type", "input_json_delta",
		                                                "partial_json", o->calls->calls[k].arguments));
		block_stop(b, at);
	}
	const char *sr = stop_reason(o);
	llm_api_sse(b, "message_delta", json_pack("{s:s, s:{s:s, s:o}, s:{s:i, s:i}}", "type", "message_delta", "delta",
	                                          "stop_reason", sr, "stop_sequence",
	                                          o->stop && !strcmp(sr, "stop_sequence") ? json_string(o->stop) : json_null(),
	                                          "usage", "input_tokens", o->n_prompt, "output_tokens", o->n_gen));
	llm_api_sse(b, "message_stop", json_pack("{s:s}", "type", "message_stop"));
}
