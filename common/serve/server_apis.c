/* common/serve/server_apis.c: llm-serve's answers of the Responses and
 * Messages APIs (see server_http.h): a job's choice gathered into one
 * answer (struct llm_api_out: its text, its tool calls parsed as chat's
 * are, how it finished, the stop string that ended it) and handed to
 * apis.h for the body or the stream's events.
 *
 * A stream sends the text as it comes, except what may still become a tool
 * call (llm_tool_safe_prefix, as chat's streams do); at the end the calls
 * follow as their own items or blocks, or, when there were none, the text
 * held back. Reasoning (a <think> block, when the chat template reasons:
 * reasoning.h, as chat's reasoning_content) is split from the content: a
 * reasoning item or thinking block before the text (o.reasoning, apis.h),
 * streamed as it comes before the text's deltas; tool calls are parsed in
 * the content after it. */
#define _GNU_SOURCE
#include "server_http.h"
#include "toolcall.h"

#include <stdlib.h>
#include <string.h>
#include "banned.h"

static enum llm_api_kind api_of(const struct job *j)
{
	return j->kind == K_RESPONSES ? LLM_API_RESPONSES : LLM_API_MESSAGES;
}

/* The fields of J's answer that do not depend on its text. */
static struct llm_api_out out_of(const struct llm_server *s, const struct job *j)
{
	const struct choice *c = &j->ch[0];
	struct llm_api_out o = { .id = j->id, .created = j->created, .n_prompt = j->n_prompt, .finish = c->finish,
	                         .model = j->adapter ? s->lora_name[j->adapter - 1] : s->model_name };
	for (int i = 0; i < c->n_ev; i++) {
		const struct ev *v = &c->ev[i];
		o.n_gen += v->token >= 0;
		if (v->finish == LLM_FINISH_STOP && v->stop_index >= j->p.n_stop_ids &&
		    v->stop_index < j->p.n_stop_ids + j->p.n_stop)
			o.stop = j->p.stop[v->stop_index - j->p.n_stop_ids];
	}
	if (j->failed) {
		o.finish = LLM_FINISH_ERROR;
		o.error = j->errmsg;
	}
	return o;
}

json_t *llm_srv_api_full(struct llm_server *s, struct job *j)
{
	struct choice *c = &j->ch[0];
	struct llm_api_out o = out_of(s, j);
	struct llm_tool_answer ta = { 0 };
	size_t len = 0;
	char *t = llm_srv_raw_text(c, 0, c->n_ev, &len);
	struct llm_reasoning_split sp = { .c_end = t ? len : 0 };
	if (t)
		llm_srv_split_answer(j, t, len, 1, &sp);
	int calls = llm_srv_parse_tools(j, c, &ta);
	json_t *text = calls ? llm_srv_jstr(ta.content, ta.content_len) :
	               llm_srv_jstr(t ? t + sp.c_begin : "", t ? sp.c_end - sp.c_begin : 0);
	json_t *reasoning = sp.has_reasoning ? llm_srv_jstr(t + sp.r_begin, sp.r_end - sp.r_begin) : NULL;
	o.text = json_string_value(text);
	o.len = json_string_length(text);
	o.reasoning = reasoning ? json_string_value(reasoning) : NULL;
	o.reasoning_len = reasoning ? json_string_length(reasoning) : 0;
	o.calls = calls ? &ta : NULL;
	json_t *r = j->kind == K_RESPONSES ? llm_responses_body(&o) : llm_messages_body(&o);
	json_decref(text);
	json_decref(reasoning);
	free(t);
	if (calls)
		llm_tool_answer_free(&ta);
	return r;
}

void llm_srv_api_stream(struct llm_server *s, struct job *j)
{
	enum llm_api_kind api = api_of(j);
	struct choice *c = &j->ch[0];
	struct llm_api_out o = out_of(s, j);
	llm_api_stream_begin(api, &j->as, &j->out, &o);
	int done = j->n_done == j->n && !j->ended;
	if (c->sent == c->n_ev && !done)
		return;
	size_t len = 0;
	if (!j->tool_fmt && !j->reasoning && !done) { /* no tools, no reasoning: each event's text as it comes */
		char *d = llm_srv_raw_text(c, c->sent, c->n_ev, &len);
		if (!d)
			return;              /* out of memory: the next call tries again */
		json_t *dj = llm_srv_jstr(d, len);
		llm_api_stream_text(api, &j->as, &j->out, &o, json_string_value(dj), json_string_length(dj));
		json_decref(dj);
		free(d);
		c->tool_sent += len;
		c->sent = c->n_ev;
		return;
	}
	char *t = llm_srv_raw_text(c, 0, c->n_ev, &len);
	if (!t)
		return;                  /* out of memory: the next call tries again */
	/* the reasoning (a prefix of the final one) first, then the content
	 * that can no longer become part of a call */
	struct llm_reasoning_split sp;
	llm_srv_split_answer(j, t, len, done, &sp);
	if (c->reason_sent < sp.r_begin)
		c->reason_sent = sp.r_begin;
	json_t *rs = NULL;
	if (sp.r_end > c->reason_sent) {
		json_t *d = llm_srv_jstr(t + c->reason_sent, sp.r_end - c->reason_sent);
		llm_api_stream_reasoning(api, &j->as, &j->out, &o, json_string_value(d), json_string_length(d));
		json_decref(d);
		c->reason_sent = sp.r_end;
	}
	if (sp.has_reasoning) {      /* all the reasoning sent: what closing its item or block says */
		rs = llm_srv_jstr(t + sp.r_begin, c->reason_sent - sp.r_begin);
		o.reasoning = json_string_value(rs);
		o.reasoning_len = json_string_length(rs);
	}
	if (c->tool_sent < sp.c_begin)
		c->tool_sent = sp.c_begin;
	const char *ct = t + sp.c_begin;
	size_t clen = sp.c_end - sp.c_begin;
	struct llm_tool_answer ta = { 0 };
	int calls = done && !j->failed && llm_srv_parse_tools(j, c, &ta);
	size_t safe = calls ? c->tool_sent : sp.c_begin + (done || !j->tool_fmt ? clen :
	              llm_tool_safe_prefix((enum llm_tool_format)j->tool_fmt, ct, clen));
	if (safe > c->tool_sent) {
		json_t *d = llm_srv_jstr(t + c->tool_sent, safe - c->tool_sent);
		llm_api_stream_text(api, &j->as, &j->out, &o, json_string_value(d), json_string_length(d));
		json_decref(d);
		c->tool_sent = safe;
	}
	c->sent = c->n_ev;
	if (done) {
		j->ended = 1;
		json_t *sent = llm_srv_jstr(t + sp.c_begin, c->tool_sent - sp.c_begin);
		o.text = json_string_value(sent);
		o.len = json_string_length(sent);
		o.calls = calls ? &ta : NULL;
		llm_api_stream_end(api, &j->as, &j->out, &o);
		json_decref(sent);
	}
	json_decref(rs);
	if (calls)
		llm_tool_answer_free(&ta);
	free(t);
}
