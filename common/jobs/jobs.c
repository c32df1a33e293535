/* common/jobs/jobs.c: offline generation jobs (see jobs.h). */
#include "jobs.h"
#include "lora.h"
#include "tokenizer.h"
#include "fileio.h"
#include "grammar.h"
#include "toolcall.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "banned.h"

void llm_job_free(struct llm_job *j)
{
	free(j->prompt);
	free(j->ids);
	free(j->logprob);
	free(j->top);
	llm_buf_free(&j->text);
	for (int i = 0; i < LLM_MAX_STOP; i++)
		free(j->stop_own[i]);
	free(j->bias_own);
	for (int i = 0; i < j->n_tools; i++)
		free(j->tool_names[i]);
	free(j->tool_names);
	llm_grammar_unref(j->p.grammar);
	memset(j, 0, sizeof *j);
}

void llm_jobs_free(struct llm_job *jobs, size_t n)
{
	for (size_t i = 0; jobs && i < n; i++)
		llm_job_free(&jobs[i]);
	free(jobs);
}

/* J takes what R owns. */
static void take(struct llm_job *j, struct llm_api_req *r)
{
	j->prompt = r->prompt;
	j->n_prompt = (size_t)r->n_prompt;
	j->p = r->p;
	memcpy(j->stop_own, r->stops, sizeof j->stop_own);
	j->bias_own = r->bias;
	j->tool_fmt = r->tool_format;
	j->tool_names = r->tool_names;
	j->n_tools = r->n_tools;
	j->adapter = r->adapter;
	free(r->inputs);
}

/* The job of one line: a JSON object's fields, or the line as prompt text. */
static enum llm_status read_line(struct llm_job *j, char *p, const struct llm_api_env *env)
{
	struct llm_api_req r;
	if (*p != '{') {
		if (!env->tk)
			return llm_fail(LLM_ERR_USAGE, "a text prompt needs the tokenizer files (prompt_ids work without)");
		LLM_TRY(llm_api_req_parse(&r, LLM_API_JSONL, NULL, env));
		enum llm_status s = llm_api_req_prompt_text(&r, env, "prompt", p, strlen(p), 1);
		if (s) {
			llm_api_req_free(&r);
			return s;
		}
		take(j, &r);
		return LLM_OK;
	}
	json_error_t e;
	json_t *o = json_loads(p, 0, &e);
	if (!json_is_object(o)) {
		json_decref(o);
		return llm_fail(LLM_ERR_USAGE, "not a JSON object: %s", e.text);
	}
	enum llm_status s = llm_api_req_parse(&r, LLM_API_JSONL, o, env);
	json_decref(o);
	if (!s)
		take(j, &r);
	return s;
}

enum llm_status llm_jobs_read(char *buf, size_t len, const struct llm_api_env *env, int clock_seed,
                              struct llm_job **jobs, size_t *n_jobs)
{
	struct llm_job *js = NULL;
	size_t n = 0, cap = 0;
	enum llm_status s = LLM_OK;
	int line = 0;
	for (char *at = buf, *p; !s && (p = llm_next_line(&at, buf + len)); ) {
		line++;
		if (!*p)
			continue;
		if ((s = LLM_ARRAY_RESERVE(js, cap, n + 1)))
			break;
		struct llm_api_env le = *env;
		if (clock_seed)
			le.defaults.seed = (uint64_t)time(NULL) ^ ((uint64_t)line << 32);
		memset(&js[n], 0, sizeof js[n]);
		if ((s = read_line(&js[n++], p, &le)))
			llm_fail_prefix(s, "stdin: line %d", line);
	}
	if (!s && !n)
		s = llm_fail(LLM_ERR_USAGE, "stdin: no prompts");
	if (s) {
		llm_jobs_free(js, n);
		return s;
	}
	*jobs = js;
	*n_jobs = n;
	return LLM_OK;
}

enum llm_status llm_job_text(struct llm_job *j, const char *text, int chat, const char *system,
                             const struct llm_api_env *env)
{
	memset(j, 0, sizeof *j);
	struct llm_api_req r;
	enum llm_status s;
	if (chat) {
		json_t *msgs = json_array();
		if (system)
			json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", system));
		json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", text));
		json_t *o = json_pack("{s:o}", "messages", msgs);
		if (!o)
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		s = llm_api_req_parse(&r, LLM_API_JSONL, o, env);
		json_decref(o);
	} else {
		LLM_TRY(llm_api_req_parse(&r, LLM_API_JSONL, NULL, env));
		s = llm_api_req_prompt_text(&r, env, "prompt", text, strlen(text), 1);
		if (s)
			llm_api_req_free(&r);
	}
	if (!s)
		take(j, &r);
	return s;
}

enum llm_status llm_jobs_env_lora(struct llm_api_env *env, const char *const *specs, int n, const char *model)
{
	if (n <= 0)
		return LLM_OK;
	/* one block: N name pointers, N names, the model's base name */
	size_t len = strlen(model);
	char *b = malloc((size_t)n * (sizeof(char *) + LLM_LORA_NAME_MAX) + len + 1);
	if (!b)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	const char **names = (const char **)(void *)b;
	char *nm = b + (size_t)n * sizeof(char *), *base = nm + (size_t)n * LLM_LORA_NAME_MAX;
	for (int i = 0; i < n; i++) {
		const char *dir;
		enum llm_status s = llm_lora_spec_split(specs[i], nm + (size_t)i * LLM_LORA_NAME_MAX, LLM_LORA_NAME_MAX, &dir);
		if (s) {
			free(b);
			return llm_fail_prefix(s, "--lora");
		}
		names[i] = nm + (size_t)i * LLM_LORA_NAME_MAX;
	}
	while (len > 1 && model[len - 1] == '/')
		len--;
	size_t at = len;
	while (at > 0 && model[at - 1] != '/')
		at--;
	memcpy(base, model + at, len - at);
	base[len - at] = 0;
	free(env->own_lora);
	env->own_lora = b;
	env->adapters = names;
	env->n_adapters = n;
	env->adapter = 1;
	env->model_name = base;
	return LLM_OK;
}

/* The scheduler's event for job USER: kept (ids, log-probs, text, finish). */
static int on_token(void *user, const struct llm_token_event *ev)
{
	struct llm_job *j = user;
	double now = llm_now();
	if (j->echo && j->on_event) {
		struct llm_token_event e0 = { .req = ev->req, .token = -1, .text = j->text.p, .text_len = j->text.len,
		                              .stop_index = -1 };
		j->on_event(j->user, j, &e0);
	}
	j->echo = 0;
	if (j->on_event)
		j->on_event(j->user, j, ev);
	if (ev->token >= 0) {
		if (!j->n)
			j->t_first = now;
		size_t k = (size_t)j->p.n_logprobs;
		if (LLM_ARRAY_RESERVE(j->ids, j->cap_ids, j->n + 1) || LLM_ARRAY_RESERVE(j->logprob, j->cap_lp, j->n + 1)
		    || (k && LLM_ARRAY_RESERVE(j->top, j->cap_top, (j->n + 1) * k)))
			return 1;
		j->ids[j->n] = ev->token;
		j->logprob[j->n] = ev->logprob;
		for (size_t i = 0; i < k; i++)
			j->top[j->n * k + i] = (int)i < ev->n_top ? ev->top[i] : (struct llm_logprob){ -1, -INFINITY };
		j->n++;
	}
	if (ev->text_len && llm_buf_append(&j->text, ev->text, ev->text_len))
		return 1;
	if (ev->finish) {
		j->finish = ev->finish;
		j->t_end = now;
		if (ev->error)
			snprintf(j->error, sizeof j->error, "%s", ev->error);
	}
	return 0;
}

int64_t llm_jobs_kv_need(const struct llm_job *jobs, size_t n)
{
	int64_t most = 0;
	for (size_t i = 0; i < n; i++) {
		int64_t need = jobs[i].p.max_tokens > 0 ? (int64_t)jobs[i].n_prompt + jobs[i].p.max_tokens : INT64_MAX;
		most = need > most ? need : most;
	}
	return most;
}

enum llm_status llm_jobs_echo(struct llm_job *jobs, size_t n, const struct llm_tokenizer *tk)
{
	if (!tk)
		return llm_fail(LLM_ERR_USAGE, "echo: the prompt's text needs the tokenizer files");
	for (size_t i = 0; i < n; i++) {
		struct llm_job *j = &jobs[i];
		int32_t *ids = malloc((j->n_prompt + 1) * sizeof *ids);
		size_t m = 0, len;
		char *t = NULL;
		if (!ids)
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		for (size_t k = 0; k < j->n_prompt; k++)
			if (llm_tokenizer_token(tk, j->prompt[k]))
				ids[m++] = j->prompt[k];
		enum llm_status st = llm_tokenizer_decode(tk, ids, m, true, &t, &len);
		free(ids);
		if (!st && llm_buf_append(&j->text, t, len))
			st = llm_fail(LLM_ERR_NOMEM, "out of memory");
		free(t);
		LLM_TRY(st);
		j->echo = 1;
	}
	return LLM_OK;
}

enum llm_status llm_jobs_run(struct llm_sched *s, struct llm_job *jobs, size_t n, int numbered,
                             struct llm_jobs_out *o)
{
	for (size_t i = 0; i < n; i++) {
		struct llm_job *j = &jobs[i];
		struct llm_request r = { .prompt = j->prompt, .n_prompt = (int)j->n_prompt, .params = j->p,
		                         .on_token = on_token, .user = j, .adapter = j->adapter };
		j->t_submit = llm_now();
		enum llm_status st = llm_sched_add(s, &r, &j->id);
		if (st)
			return numbered ? llm_fail_prefix(st, "prompt %zu", i + 1) : st;
	}
	size_t next = 0;          /* jobs[0, next) finished and handed on */
	int pending = 1, stopped = 0;
	o->n_done = 0;
	while (pending > 0) {
		if (o->stop && *o->stop && !stopped) {
			stopped = 1;
			for (size_t i = 0; i < n; i++)
				if (!jobs[i].finish)
					llm_sched_cancel(s, jobs[i].id), jobs[i].id = -1;   /* -1: cancelled here */
		}
		LLM_TRY(llm_sched_step(s, &pending));
		for (; !stopped && next < n && jobs[next].finish; next++, o->n_done++) {
			if (jobs[next].finish == LLM_FINISH_ERROR)   /* the jobs before it are handed on */
				return numbered ? llm_fail(LLM_ERR_RANGE, "prompt %zu: %s", next + 1, jobs[next].error)
				                : llm_fail(LLM_ERR_RANGE, "%s", jobs[next].error);
			if (o->done)
				o->done(o->user, next);
		}
	}
	for (size_t i = next; i < n && stopped; i++) {
		if (jobs[i].id == -1)
			jobs[i].finish = LLM_FINISH_NONE;   /* the cancel event set CANCEL: no result */
		else if (o->gaps && o->done && jobs[i].finish != LLM_FINISH_ERROR)
			o->done(o->user, i), o->n_done++;
	}
	return LLM_OK;
}

char *llm_job_json(const struct llm_job *j, size_t index)
{
	json_t *o = json_object(), *pids = json_array(), *ids = json_array();
	for (size_t i = 0; i < j->n_prompt; i++)
		json_array_append_new(pids, json_integer(j->prompt[i]));
	for (size_t i = 0; i < j->n; i++)
		json_array_append_new(ids, json_integer(j->ids[i]));
	json_object_set_new(o, "index", json_integer((json_int_t)index));
	json_object_set_new(o, "text", json_stringn(j->text.p ? j->text.p : "", j->text.len));
	json_object_set_new(o, "prompt_ids", pids);
	json_object_set_new(o, "ids", ids);
	json_object_set_new(o, "finish_reason", json_string(llm_finish_name(j->finish)));
	struct llm_tool_answer ta;
	if (j->tool_fmt && !llm_tool_parse((enum llm_tool_format)j->tool_fmt, j->text.p ? j->text.p : "", j->text.len,
	                                   (const char *const *)j->tool_names, j->n_tools, &ta)) {
		if (ta.n) {   /* the answer is tool calls: OpenAI's shape, and the text around them */
			json_t *calls = json_array();
			for (int k = 0; k < ta.n; k++)
				json_array_append_new(calls, json_pack("{s:s, s:{s:s, s:s}}", "type", "function", "function", "name",
				                                       ta.calls[k].name, "arguments", ta.calls[k].arguments));
			json_object_set_new(o, "tool_calls", calls);
			json_object_set_new(o, "content", json_stringn(ta.content, ta.content_len));
			if (j->finish != LLM_FINISH_LENGTH)
				json_object_set_new(o, "finish_reason", json_string("tool_calls"));
		}
		llm_tool_answer_free(&ta);
	}
	if (j->p.n_logprobs) {
		json_t *lp = json_array(), *tops = json_array();
		for (size_t i = 0; i < j->n; i++) {
			json_array_append_new(lp, json_real(j->logprob[i]));
			json_t *t = json_array();
			for (int k = 0; k < j->p.n_logprobs; k++) {
				const struct llm_logprob *e = &j->top[i * (size_t)j->p.n_logprobs + k];
				if (e->id >= 0)
					json_array_append_new(t, json_pack("{s:i, s:f}", "id", e->id, "logprob", e->logprob));
			}
			json_array_append_new(tops, t);
		}
		json_object_set_new(o, "logprobs", lp);
		json_object_set_new(o, "top_logprobs", tops);
	}
	double ttft = j->t_first > 0 ? j->t_first - j->t_submit : 0, gen = j->t_end - j->t_first;
	json_object_set_new(o, "timings", json_pack("{s:f, s:f, s:f, s:i, s:i}", "ttft_ms", ttft * 1e3,
	                    "prompt_tok_s", ttft > 0 ? j->n_prompt / ttft : 0.0,
	                    "gen_tok_s", gen > 0 && j->n > 1 ? (j->n - 1) / gen : 0.0,
	                    "prompt_tokens", (int)j->n_prompt, "tokens", (int)j->n));
	char *s = json_dumps(o, JSON_COMPACT);
	json_decref(o);
	return s;
}

void llm_job_summary(const struct llm_job *j, size_t index, char *out, size_t n)
{
	double ttft = j->t_first - j->t_submit, gen = j->t_end - j->t_first;
	snprintf(out, n, "prompt %zu: %zu prompt tokens, %.1f tok/s; %zu generated, %.1f tok/s; first token %.1f ms; %s",
	         index + 1, j->n_prompt, ttft > 0 ? j->n_prompt / ttft : 0.0, j->n,
	         gen > 0 && j->n > 1 ? (j->n - 1) / gen : 0.0, ttft * 1e3, llm_finish_name(j->finish));
}
