/* common/serve/server_format.c: llm-serve's response bodies (see server_impl.h):
 * OpenAI completions and chat completions (JSON, or server-sent event
 * chunks ending in "data: [DONE]") with the generated ids as an extra
 * "token_ids" field of each choice, and Hugging Face TGI /generate and
 * /generate_stream; log-probs in each API's form. Text that is not valid
 * UTF-8 is sent with U+FFFD in its place. */
#define _GNU_SOURCE
#include "server_http.h"
#include "fileio.h"
#include "tokenizer.h"
#include "buf.h"
#include "toolcall.h"
#include "reasoning.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

/* A JSON string of N bytes, invalid UTF-8 replaced by U+FFFD. */
static json_t *jstr(const char *s, size_t n)
{
	if (llm_is_utf8_text(s, n) || n == 0) {
		json_t *j = json_stringn(s, n);
		if (j)
			return j;
	}
	char *b = malloc(n * 3 + 1);
	if (!b)
		return json_string("");
	size_t w = 0;
	for (size_t i = 0; i < n;) {
		unsigned char c = (unsigned char)s[i];
		size_t k = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
		if (k && i + k <= n && (k == 1 || llm_is_utf8_text(s + i, k))) {
			if (c) {
				memcpy(b + w, s + i, k);
				w += k;
			}
			i += k;
		} else {
			memcpy(b + w, "\xef\xbf\xbd", 3);
			w += 3;
			i++;
		}
	}
	json_t *j = json_stringn(b, w);
	free(b);
	return j ? j : json_string("");
}

/* ---- output formatting ------------------------------------------------- */

static const char *openai_finish(enum llm_finish f)
{
	return f == LLM_FINISH_LENGTH ? "length" : f == LLM_FINISH_CANCEL ? "abort" : "stop";
}

static const char *tgi_finish(enum llm_finish f)
{
	return f == LLM_FINISH_LENGTH ? "length" : f == LLM_FINISH_EOS ? "eos_token" :
	       f == LLM_FINISH_STOP ? "stop_sequence" : "abort";
}

/* A token's text as it reads in the output (its leading space kept). */
static json_t *token_str(struct llm_server *s, int32_t id)
{
	char *t = NULL;
	size_t n = 0;
	if (llm_tokenizer_piece(s->tk, id, &t, &n))
		return json_string("");
	json_t *j = jstr(t, n);
	free(t);
	return j;
}

static json_t *token_bytes(struct llm_server *s, int32_t id)
{
	char *t = NULL;
	size_t n = 0;
	json_t *a = json_array();
	if (!llm_tokenizer_piece_bytes(s->tk, id, &t, &n))
		for (size_t i = 0; i < n; i++)
			json_array_append_new(a, json_integer((unsigned char)t[i]));
	free(t);
	return a;
}

/* The prompt as echo gives it: its ids decoded, special tokens left out
 * (a streaming decode, so the text is decode(prompt)); OFFS (n_prompt, may
 * be NULL) gets where each token's text starts in it. */
static json_t *prompt_text(struct llm_server *s, struct job *j, size_t *offs)
{
	struct llm_buf b = { 0 };
	struct llm_detok_stream ds;
	const char *t;
	size_t n;
	if (s->tk)
		llm_detok_stream_init(&ds, s->tk, true);
	for (int i = 0; i < j->n_prompt; i++) {
		if (offs)
			offs[i] = b.len;
		if (s->tk && !llm_detok_stream_push(&ds, j->prompt[i], &t, &n))
			(void)llm_buf_append(&b, t, n);
	}
	if (s->tk && !llm_detok_stream_flush(&ds, &t, &n))
		(void)llm_buf_append(&b, t, n);
	if (s->tk)
		llm_detok_stream_free(&ds);
	json_t *r = jstr(b.p ? b.p : "", b.len);
	llm_buf_free(&b);
	return r;
}

/* Prompt token I's scored entry (NULL: none, as for the first). */
static const struct plp *plp_at(const struct job *j, int i)
{
	return j->plp && !isnan(j->plp[i].lp) ? &j->plp[i] : NULL;
}

/* Echo with log-probs: the prompt's entries of the completion form. */
static void echo_logprobs(struct llm_server *s, struct job *j, json_t *toks, json_t *lps, json_t *tops, json_t *offs,
                          size_t *offset)
{
	size_t *at = malloc((size_t)j->n_prompt * sizeof *at);
	json_t *text = prompt_text(s, j, at);
	for (int i = 0; i < j->n_prompt; i++) {
		const struct plp *p = plp_at(j, i);
		json_array_append_new(offs, json_integer((json_int_t)(*offset + (at ? at[i] : 0))));
		json_array_append_new(toks, token_str(s, j->prompt[i]));
		json_array_append_new(lps, p ? json_real(p->lp) : json_null());
		json_t *top = p ? json_object() : json_null();
		for (int k = 0; p && k < p->n_top && k < j->p.n_logprobs; k++) {
			json_t *ks = token_str(s, p->top[k].id);
			json_object_set_new(top, json_string_value(ks), json_real(p->top[k].logprob));
			json_decref(ks);
		}
		json_array_append_new(tops, top);
	}
	*offset += json_string_length(text);   /* the completion's text_offset continue after the prompt's */
	json_decref(text);
	free(at);
}

/* vLLM's prompt_logprobs: null for the first token, then per token an
 * object keyed by id (as a string) holding the token and the best ones:
 * logprob, rank, decoded_token. NULL when not asked for. */
static json_t *prompt_logprobs_json(struct llm_server *s, struct job *j)
{
	if (j->prompt_lp < 0 || !j->plp)
		return NULL;
	json_t *a = json_array();
	for (int i = 0; i < j->n_prompt; i++) {
		const struct plp *p = plp_at(j, i);
		if (!p) {
			json_array_append_new(a, json_null());
			continue;
		}
		json_t *d = json_object();
		char key[16];
		snprintf(key, sizeof key, "%d", j->prompt[i]);
		json_object_set_new(d, key, json_pack("{s:f, s:i, s:o}", "logprob", (double)p->lp, "rank", p->rank,
		                                      "decoded_token", token_str(s, j->prompt[i])));
		for (int k = 0; k < p->n_top && k < j->prompt_lp; k++) {
			snprintf(key, sizeof key, "%d", p->top[k].id);
			if (!json_object_get(d, key))
				json_object_set_new(d, key, json_pack("{s:f, s:i, s:o}", "logprob", (double)p->top[k].logprob,
				                                      "rank", k + 1, "decoded_token", token_str(s, p->top[k].id)));
		}
		json_array_append_new(a, d);
	}
	return a;
}

/* Log-probs of events [from, to) of C, in the request's format; ECHO: the
 * prompt's entries first (completions). */
static json_t *logprobs_json(struct llm_server *s, struct job *j, struct choice *c, int from, int to, size_t *offset,
                             int echo)
{
	if (!j->logprobs)
		return json_null();
	if (j->kind == K_CHAT) {
		json_t *content = json_array();
		for (int i = from; i < to; i++) {
			struct ev *v = &c->ev[i];
			if (v->token < 0)
				continue;
			json_t *top = json_array();
			for (int k = 0; k < v->n_top; k++)
				json_array_append_new(top, json_pack("{s:o, s:f, s:o}", "token", token_str(s, v->top[k].id),
				                                     "logprob", (double)v->top[k].logprob,
				                                     "bytes", token_bytes(s, v->top[k].id)));
			json_array_append_new(content, json_pack("{s:o, s:f, s:o, s:o}", "token", token_str(s, v->token),
			                                         "logprob", (double)v->logprob, "bytes", token_bytes(s, v->token),
			                                         "top_logprobs", top));
		}
		return json_pack("{s:o}", "content", content);
	}
	json_t *toks = json_array(), *lps = json_array(), *tops = json_array(), *offs = json_array();
	if (echo)
		echo_logprobs(s, j, toks, lps, tops, offs, offset);
	for (int i = from; i < to; i++) {
		struct ev *v = &c->ev[i];
		if (v->token < 0)
			continue;
		json_t *ts = token_str(s, v->token);
		json_array_append_new(offs, json_integer((json_int_t)*offset));
		*offset += json_string_length(ts);
		json_array_append_new(toks, ts);
		json_array_append_new(lps, json_real(v->logprob));
		json_t *top = json_object();
		for (int k = 0; k < v->n_top; k++) {
			json_t *ks = token_str(s, v->top[k].id);
			json_object_set_new(top, json_string_value(ks), json_real(v->top[k].logprob));
			json_decref(ks);
		}
		json_array_append_new(tops, top);
	}
	return json_pack("{s:o, s:o, s:o, s:o}", "tokens", toks, "token_logprobs", lps, "top_logprobs", tops,
	                 "text_offset", offs);
}

/* The bytes of events [from, to) of C (malloc'd, NUL-terminated; NULL: out
 * of memory), *LEN of them. */
static char *raw_text(const struct choice *c, int from, int to, size_t *len)
{
	size_t n = 0;
	for (int i = from; i < to; i++)
		n += c->ev[i].len;
	char *b = malloc(n + 1);
	if (!b)
		return NULL;
	n = 0;
	for (int i = from; i < to; i++) {
		memcpy(b + n, c->ev[i].text ? c->ev[i].text : "", c->ev[i].len);
		n += c->ev[i].len;
	}
	b[n] = 0;
	*len = n;
	return b;
}

static json_t *text_of(struct choice *c, int from, int to)
{
	size_t n;
	char *b = raw_text(c, from, to, &n);
	if (!b)
		return json_string("");
	json_t *j = jstr(b, n);
	free(b);
	return j;
}

static json_t *ids_of(struct choice *c, int from, int to)
{
	json_t *a = json_array();
	for (int i = from; i < to; i++)
		if (c->ev[i].token >= 0)
			json_array_append_new(a, json_integer(c->ev[i].token));
	return a;
}

static int gen_count(const struct job *j)
{
	int n = 0;
	for (int c = 0; c < j->n; c++)
		for (int i = 0; i < j->ch[c].n_ev; i++)
			n += j->ch[c].ev[i].token >= 0;
	return n;
}

/* Completions with echo: the prompt's text, then the choice's. */
static json_t *echo_text(struct llm_server *s, struct job *j, struct choice *ch)
{
	json_t *a = prompt_text(s, j, NULL), *b = text_of(ch, 0, ch->n_ev);
	size_t na = json_string_length(a), nb = json_string_length(b);
	char *x = malloc(na + nb + 1);
	json_t *r = NULL;
	if (x) {
		memcpy(x, json_string_value(a), na);
		memcpy(x + na, json_string_value(b), nb);
		r = json_stringn(x, na + nb);
		free(x);
	}
	json_decref(a), json_decref(b);
	return r ? r : json_string("");
}

static json_t *usage_json(const struct job *j)
{
	int g = gen_count(j);
	return json_pack("{s:i, s:i, s:i}", "prompt_tokens", j->n_prompt, "completion_tokens", g,
	                 "total_tokens", j->n_prompt + g);
}

/* The calls of A as OpenAI tool_calls (with an index each when STREAM). */
static json_t *tool_calls_json(const struct job *j, int choice, const struct llm_tool_answer *a, int stream)
{
	json_t *arr = json_array();
	for (int k = 0; k < a->n; k++) {
		char id[80];
		snprintf(id, sizeof id, "call_%s_%d_%d", j->id, choice, k);
		json_t *o = json_pack("{s:s, s:s, s:{s:s, s:s}}", "id", id, "type", "function", "function", "name",
		                      a->calls[k].name, "arguments", a->calls[k].arguments);
		if (stream)
			json_object_set_new(o, "index", json_integer(k));
		json_array_append_new(arr, o);
	}
	return arr;
}

/* Chat with tools: the content T (LEN bytes) parsed; 0 when it holds no call. */
static int parse_tools(const struct job *j, const char *t, size_t len, struct llm_tool_answer *a)
{
	int got = j->tool_fmt && !llm_tool_parse((enum llm_tool_format)j->tool_fmt, t, len,
	                                         (const char *const *)j->tool_names, j->n_tools, a) && a->n > 0;
	if (!got)
		llm_tool_answer_free(a);
	return got;
}

/* T (LEN bytes, the answer so far; DONE: whole) split into reasoning and
 * content when the job's template reasons; otherwise all content. */
static void split_answer(const struct job *j, const char *t, size_t len, int done, struct llm_reasoning_split *sp)
{
	if (j->reasoning)
		llm_reasoning_split(t, len, j->reasoning == 2, done, sp);
	else
		*sp = (struct llm_reasoning_split){ .c_end = len };
}

/* Choice C's chat message (role, content, reasoning_content when the
 * template reasons, tool_calls when the content holds calls) and its
 * finish_reason in *FINISH. NULL: out of memory. */
static json_t *chat_message(const struct job *j, int c, const struct choice *ch, const char **finish)
{
	size_t len;
	char *t = raw_text(ch, 0, ch->n_ev, &len);
	if (!t)
		return NULL;
	struct llm_reasoning_split sp;
	split_answer(j, t, len, 1, &sp);
	const char *ct = t + sp.c_begin;
	size_t clen = sp.c_end - sp.c_begin;
	struct llm_tool_answer ta = { 0 };
	json_t *m = json_pack("{s:s}", "role", "assistant");
	*finish = openai_finish(ch->finish);
	if (parse_tools(j, ct, clen, &ta)) {   /* the answer is tool calls */
		json_object_set_new(m, "content", ta.content_len ? jstr(ta.content, ta.content_len) : json_null());
		json_object_set_new(m, "tool_calls", tool_calls_json(j, c, &ta, 0));
		*finish = ch->finish == LLM_FINISH_LENGTH ? "length" : "tool_calls";
		llm_tool_answer_free(&ta);
	} else {   /* a block that never closed leaves no content: null, as for calls */
		json_object_set_new(m, "content", sp.has_reasoning && !clen ? json_null() : jstr(ct, clen));
	}
	if (j->reasoning)
		json_object_set_new(m, "reasoning_content", sp.has_reasoning ? jstr(t + sp.r_begin, sp.r_end - sp.r_begin)
		                                                             : json_null());
	free(t);
	return m;
}

/* The cumulative log-prob of choice C's tokens (best_of's ranking). */
static double cum_logprob(const struct choice *c)
{
	double t = 0;
	for (int i = 0; i < c->n_ev; i++)
		if (c->ev[i].token >= 0)
			t += c->ev[i].logprob;
	return t;
}

/* The name a response carries: the adapter the request named, else the
 * model's (the job holds its adapter's slot, so the name is there). */
static const char *job_model(const struct llm_server *s, const struct job *j)
{
	return j->adapter ? s->lora_name[j->adapter - 1] : s->model_name;
}

/* best_of: the choices by cumulative log-prob, highest first (stable),
 * into ORDER (j->n); else in order. */
static void best_order(const struct job *j, int *order)
{
	for (int c = 0; c < j->n; c++) {
		int k = c;
		double v = j->n_ret < j->n ? cum_logprob(&j->ch[c]) : 0;
		while (k > 0 && v > (j->n_ret < j->n ? cum_logprob(&j->ch[order[k - 1]]) : 0))
			order[k] = order[k - 1], k--;
		order[k] = c;
	}
}

/* Returned choice C (the job's choice CH) of the OpenAI body. */
static json_t *choice_json(struct llm_server *s, struct job *j, int c, struct choice *ch)
{
	size_t off = 0;
	json_t *o;
	if (j->kind == K_CHAT) {
		const char *finish = NULL;
		json_t *m = chat_message(j, c, ch, &finish);
		o = json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", c, "message", m ? m : json_object(), "logprobs",
		              logprobs_json(s, j, ch, 0, ch->n_ev, &off, 0), "finish_reason",
		              finish ? finish : openai_finish(ch->finish), "token_ids", ids_of(ch, 0, ch->n_ev));
	}
	else
		o = json_pack("{s:i, s:o, s:o, s:s, s:o}", "index", c,
		              "text", j->echo ? echo_text(s, j, ch) : text_of(ch, 0, ch->n_ev),
		              "logprobs", logprobs_json(s, j, ch, 0, ch->n_ev, &off, j->echo),
		              "finish_reason", openai_finish(ch->finish), "token_ids", ids_of(ch, 0, ch->n_ev));
	json_t *pl = j->kind == K_CHAT || !o ? NULL : prompt_logprobs_json(s, j);
	if (pl)
		json_object_set_new(o, "prompt_logprobs", pl);
	return o;
}

static json_t *openai_head(const struct job *j, const char *model)
{
	return json_pack("{s:s, s:s, s:I, s:s}", "id", j->id, "object", j->kind == K_CHAT ? "chat.completion" :
	                 "text_completion", "created", (json_int_t)j->created, "model", model);
}

json_t *llm_srv_openai_full(struct llm_server *s, struct job *j)
{
	json_t *choices = json_array();
	int order[MAX_N];
	best_order(j, order);
	for (int c = 0; c < j->n_ret; c++)
		json_array_append_new(choices, choice_json(s, j, c, &j->ch[order[c]]));
	json_t *r = openai_head(j, job_model(s, j));
	json_object_set_new(r, "choices", choices);
	json_object_set_new(r, "usage", usage_json(j));
	json_t *pl = j->kind == K_CHAT ? prompt_logprobs_json(s, j) : NULL;
	if (pl)
		json_object_set_new(r, "prompt_logprobs", pl);
	return r;
}

/* J's dumped to OUT (compact, as the whole body is); 0: out of memory. */
static int dump_to(json_t *o, struct llm_buf *out, int drop_close)
{
	char *t = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	if (!t)
		return 0;
	size_t n = strlen(t) - (drop_close && *t ? 1 : 0);
	int ok = !llm_buf_append(out, t, n);
	free(t);
	return ok;
}

int llm_srv_openai_part(struct llm_server *s, struct job *j, const char *model, int part, int *order,
                        struct llm_buf *out)
{
	if (part == 0) {             /* {"id":...,"model":"..." then the choices' array */
		best_order(j, order);
		return dump_to(openai_head(j, model), out, 1) && !llm_buf_append(out, ",\"choices\":[", 12) ? 1 : -1;
	}
	if (part <= j->n_ret)
		return (part == 1 || !llm_buf_append(out, ",", 1)) &&
		       dump_to(choice_json(s, j, part - 1, &j->ch[order[part - 1]]), out, 0) ? 1 : -1;
	if (part > j->n_ret + 1)
		return 0;
	json_t *pl = j->kind == K_CHAT ? prompt_logprobs_json(s, j) : NULL;
	int ok = !llm_buf_append(out, "],\"usage\":", 10) && dump_to(usage_json(j), out, 0);
	if (ok && pl)
		ok = !llm_buf_append(out, ",\"prompt_logprobs\":", 19) && dump_to(pl, out, 0);
	else
		json_decref(pl);
	return ok && !llm_buf_append(out, "}\n", 2) ? 1 : -1;
}

/* TGI top_n_tokens: the best tokens at event V, best first. */
static json_t *tgi_top(struct llm_server *s, const struct ev *v)
{
	json_t *a = json_array();
	for (int k = 0; k < v->n_top; k++)
		json_array_append_new(a, json_pack("{s:i, s:o, s:f, s:b}", "id", v->top[k].id,
		                                   "text", token_str(s, v->top[k].id), "logprob",
		                                   (double)v->top[k].logprob, "special",
		                                   llm_tokenizer_is_special(s->tk, v->top[k].id)));
	return a;
}

json_t *llm_srv_tgi_details(struct job *j, struct llm_server *s, int with_tokens)
{
	struct choice *c = &j->ch[0];
	/* seed: the one drawn with, null when greedy (no draw) */
	json_t *d = json_pack("{s:s, s:i, s:o}", "finish_reason", tgi_finish(c->finish),
	                      "generated_tokens", gen_count(j), "seed",
	                      j->p.temperature > 0 ? json_integer((json_int_t)(j->p.seed & INT64_MAX)) : json_null());
	if (with_tokens && j->prefill) {   /* decoder_input_details: the prompt's tokens, the first unscored */
		json_t *pre = json_array();
		for (int i = 0; i < j->n_prompt; i++) {
			const struct plp *p = plp_at(j, i);
			json_array_append_new(pre, json_pack("{s:i, s:o, s:o}", "id", j->prompt[i], "text",
			                                     token_str(s, j->prompt[i]), "logprob",
			                                     p ? json_real(p->lp) : json_null()));
		}
		json_object_set_new(d, "prefill", pre);
	}
	if (with_tokens) {
		json_t *toks = json_array();
		for (int i = 0; i < c->n_ev; i++)
			if (c->ev[i].token >= 0)
				json_array_append_new(toks, json_pack("{s:i, s:o, s:f, s:b}", "id", c->ev[i].token,
				                                      "text", token_str(s, c->ev[i].token),
				                                      "logprob", (double)c->ev[i].logprob,
				                                      "special", llm_tokenizer_is_special(s->tk, c->ev[i].token)));
		json_object_set_new(d, "tokens", toks);
		if (j->p.n_logprobs) {
			json_t *tops = json_array();
			for (int i = 0; i < c->n_ev; i++)
				if (c->ev[i].token >= 0)
					json_array_append_new(tops, tgi_top(s, &c->ev[i]));
			json_object_set_new(d, "top_tokens", tops);
		}
	}
	return d;
}

json_t *llm_srv_tgi_generated(struct job *j)
{
	json_t *t = text_of(&j->ch[0], 0, j->ch[0].n_ev);
	if (!j->full_text || !j->inputs)
		return t;
	size_t a = strlen(j->inputs), b = json_string_length(t);
	char *x = malloc(a + b + 1);
	if (!x)
		return t;
	memcpy(x, j->inputs, a);
	memcpy(x + a, json_string_value(t), b);
	json_t *r = json_stringn(x, a + b);
	free(x);
	json_decref(t);
	return r ? r : json_string("");
}

/* ---- streaming --------------------------------------------------------- */

/* Out of memory drops the piece. */
static void out_add(struct job *j, const char *s, size_t n)
{
	(void)llm_buf_append(&j->out, s, n);
}

static void out_event(struct job *j, json_t *o, int tgi)
{
	char *b = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	if (!b)
		return;
	out_add(j, tgi ? "data:" : "data: ", tgi ? 5 : 6);
	out_add(j, b, strlen(b));
	out_add(j, "\n\n", 2);
	free(b);
}

/* Chat with tools or reasoning, streamed: event I of choice C as a chunk
 * whose delta holds the reasoning and the content that the answer so far
 * settles (content only as far as it can no longer become part of a call);
 * at the end the calls (or the text held back, when there were none).
 * NULL: out of memory. */
static json_t *chat_stream_chunk(struct llm_server *s, struct job *j, int c, int i)
{
	struct choice *ch = &j->ch[c];
	struct ev *v = &ch->ev[i];
	size_t len, off = 0;
	char *t = raw_text(ch, 0, i + 1, &len);
	if (!t)
		return NULL;
	json_t *delta = json_object();
	const char *finish = v->finish ? openai_finish(v->finish) : NULL;
	struct llm_reasoning_split sp;
	split_answer(j, t, len, v->finish != 0, &sp);
	if (ch->reason_sent < sp.r_begin)
		ch->reason_sent = sp.r_begin;
	if (sp.r_end > ch->reason_sent) {
		json_object_set_new(delta, "reasoning_content", jstr(t + ch->reason_sent, sp.r_end - ch->reason_sent));
		ch->reason_sent = sp.r_end;
	}
	const char *ct = t + sp.c_begin;
	size_t clen = sp.c_end - sp.c_begin;
	if (ch->tool_sent < sp.c_begin)
		ch->tool_sent = sp.c_begin;
	struct llm_tool_answer ta = { 0 };
	if (v->finish && parse_tools(j, ct, clen, &ta)) {
		json_object_set_new(delta, "tool_calls", tool_calls_json(j, c, &ta, 1));
		finish = v->finish == LLM_FINISH_LENGTH ? "length" : "tool_calls";
		llm_tool_answer_free(&ta);
		ch->tool_sent = len;
	} else {
		size_t safe = sp.c_begin + (v->finish || !j->tool_fmt ? clen :
		              llm_tool_safe_prefix((enum llm_tool_format)j->tool_fmt, ct, clen));
		if (safe > ch->tool_sent || !json_object_size(delta))
			json_object_set_new(delta, "content", jstr(t + ch->tool_sent, safe > ch->tool_sent ? safe - ch->tool_sent : 0));
		if (safe > ch->tool_sent)
			ch->tool_sent = safe;
	}
	free(t);
	return json_pack("{s:i, s:o, s:o, s:o, s:o}", "index", c, "delta", delta, "logprobs",
	                 logprobs_json(s, j, ch, i, i + 1, &off, 0), "finish_reason", finish ? json_string(finish) : json_null(),
	                 "token_ids", ids_of(ch, i, i + 1));
}

/* Format what the events since the last call add (called with mu held). */
void llm_srv_stream_format(struct llm_server *s, struct job *j)
{
	int tgi = j->kind == K_TGI;
	if (!j->started && !tgi && j->kind == K_CHAT) {
		for (int c = 0; c < j->n; c++)
			out_event(j, json_pack("{s:s, s:s, s:I, s:s, s:[{s:i, s:{s:s, s:s}, s:n, s:n}]}", "id", j->id,
			                       "object", "chat.completion.chunk", "created", (json_int_t)j->created,
			                       "model", job_model(s, j), "choices", "index", c, "delta", "role", "assistant",
			                       "content", "", "logprobs", "finish_reason"), 0);
	}
	j->started = 1;
	for (int c = 0; c < j->n; c++) {
		struct choice *ch = &j->ch[c];
		if (!tgi && ch->sent == 0 && ch->n_ev && (j->echo || j->prompt_lp >= 0)) {
			if (!j->plp_ready)
				continue;      /* the prompt's chunk waits for choice 0's scores */
			/* the first chunk: the prompt (echo) and its log-probs */
			size_t off = 0;
			json_t *ch_o = json_pack("{s:i, s:n, s:n}", "index", c, "logprobs", "finish_reason");
			if (j->kind != K_CHAT)
				json_object_set_new(ch_o, "text", j->echo ? prompt_text(s, j, NULL) : json_string(""));
			else
				json_object_set_new(ch_o, "delta", json_pack("{s:s}", "content", ""));
			if (j->echo && j->logprobs)
				json_object_set_new(ch_o, "logprobs", logprobs_json(s, j, ch, 0, 0, &off, 1));
			json_t *pl = prompt_logprobs_json(s, j);
			if (pl)
				json_object_set_new(ch_o, "prompt_logprobs", pl);
			out_event(j, json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", j->id, "object",
			                       j->kind == K_CHAT ? "chat.completion.chunk" : "text_completion",
			                       "created", (json_int_t)j->created, "model", job_model(s, j), "choices", ch_o), 0);
		}
		for (; ch->sent < ch->n_ev; ch->sent++) {
			int i = ch->sent;
			struct ev *v = &ch->ev[i];
			if (v->token < 0)
				continue;      /* a cancel: nothing to send */
			if (tgi) {
				json_t *tok = json_pack("{s:i, s:o, s:f, s:b}", "id", v->token, "text", text_of(ch, i, i + 1),
				                        "logprob", (double)v->logprob, "special",
				                        v->finish == LLM_FINISH_EOS || llm_tokenizer_is_special(s->tk, v->token));
				json_t *o = json_pack("{s:i, s:o, s:n, s:n}", "index", 0, "token", tok, "generated_text", "details");
				if (j->p.n_logprobs)
					json_object_set_new(o, "top_tokens", tgi_top(s, v));
				if (v->finish) {
					json_object_set_new(o, "generated_text", llm_srv_tgi_generated(j));
					json_object_set_new(o, "details", llm_srv_tgi_details(j, s, 0));
				}
				out_event(j, o, 1);
				continue;
			}
			size_t off = 0;
			json_t *ch_o;
			if (j->kind == K_CHAT && (j->tool_fmt || j->reasoning)) {
				ch_o = chat_stream_chunk(s, j, c, i);
				if (!ch_o)
					continue;
			} else if (j->kind == K_CHAT)
				ch_o = json_pack("{s:i, s:{s:o}, s:o, s:o, s:o}", "index", c, "delta", "content", text_of(ch, i, i + 1),
				                 "logprobs", logprobs_json(s, j, ch, i, i + 1, &off, 0),
				                 "finish_reason", v->finish ? json_string(openai_finish(v->finish)) : json_null(),
				                 "token_ids", ids_of(ch, i, i + 1));
			else
				ch_o = json_pack("{s:i, s:o, s:o, s:o, s:o}", "index", c, "text", text_of(ch, i, i + 1),
				                 "logprobs", logprobs_json(s, j, ch, i, i + 1, &off, 0),
				                 "finish_reason", v->finish ? json_string(openai_finish(v->finish)) : json_null(),
				                 "token_ids", ids_of(ch, i, i + 1));
			json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:[o]}", "id", j->id,
			                      "object", j->kind == K_CHAT ? "chat.completion.chunk" : "text_completion",
			                      "created", (json_int_t)j->created, "model", job_model(s, j), "choices", ch_o);
			out_event(j, o, 0);
		}
	}
	if (j->n_done == j->n && !j->ended) {
		j->ended = 1;
		if (j->failed) {
			json_t *o = json_pack("{s:{s:s, s:s, s:i}}", "error", "message", j->errmsg,
			                      "type", "server_error", "code", j->http_status);
			out_event(j, o, tgi);
		}
		if (!tgi) {
			if (j->include_usage)
				out_event(j, json_pack("{s:s, s:s, s:I, s:s, s:[], s:o}", "id", j->id,
				                       "object", j->kind == K_CHAT ? "chat.completion.chunk" : "text_completion",
				                       "created", (json_int_t)j->created, "model", job_model(s, j), "choices",
				                       "usage", usage_json(j)), 0);
			out_add(j, "data: [DONE]\n\n", 14);
		}
	}
}

json_t *llm_srv_jstr(const char *s, size_t n) { return jstr(s, n); }
char *llm_srv_raw_text(const struct choice *c, int from, int to, size_t *len) { return raw_text(c, from, to, len); }
void llm_srv_split_answer(const struct job *j, const char *t, size_t len, int done, struct llm_reasoning_split *sp)
{
	split_answer(j, t, len, done, sp);
}

int llm_srv_parse_tools(struct job *j, const struct choice *c, struct llm_tool_answer *a)
{
	size_t len;
	char *t = raw_text(c, 0, c->n_ev, &len);
	if (!t)
		return 0;
	struct llm_reasoning_split sp;   /* calls are parsed in the content after any reasoning */
	split_answer(j, t, len, 1, &sp);
	int got = parse_tools(j, t + sp.c_begin, sp.c_end - sp.c_begin, a);
	free(t);
	return got;
}
