/* common/serve/request.c: API request bodies to generation requests (see
 * request.h), one set of value rules for llm-serve's three APIs and
 * llm-generate's JSONL lines.
 *
 * A field that is absent or null keeps its default. Every failure goes
 * through bad(), which records the field in r->param and leaves the message
 * "FIELD: reason" with llm_fail. */
#define _GNU_SOURCE
#include "request.h"
#include "tokenizer.h"
#include "jinja.h"
#include "fileio.h"
#include "buf.h"
#include "guide.h"
#include "toolcall.h"
#include "reasoning.h"
#include "apis.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

struct parse {
	struct llm_api_req *r;
	const struct llm_api_env *env;
	enum llm_api_kind kind;
	enum llm_status st;         /* of the first failure */
	const char *max_key;        /* the field max_tokens came from */
	int max_given;              /* 1: the body set it */
	json_t *suffix;             /* completions: a non-empty suffix (fill in the middle) */
	const char *const *fim;     /* the tokenizer's prefix, suffix and middle tokens */
};

/* Fill-in-the-middle tokens, in the spellings tokenizers use: prefix,
 * suffix, middle; the prompt becomes prefix + prompt + suffix token +
 * suffix + middle (the PSM order these models are trained on). */
static const char *const fim_tokens[][3] = {
	{ "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>" },
	{ "<fim_prefix>", "<fim_suffix>", "<fim_middle>" },
};

static int bad_st(struct parse *c, enum llm_status st, const char *field, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static int bad_st(struct parse *c, enum llm_status st, const char *field, const char *fmt, ...)
{
	char m[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	snprintf(c->r->param, sizeof c->r->param, "%s", field);
	c->st = llm_fail(st, "%s: %s", field, m);
	return -1;
}
#define bad(c, field, ...) bad_st(c, LLM_ERR_USAGE, field, __VA_ARGS__)

/* A failure of a part below (tokenizer, template) is the request's fault,
 * unless memory ran out: only "model" gives LLM_ERR_UNSUPPORTED. */
static enum llm_status usage(enum llm_status s) { return s == LLM_ERR_NOMEM ? s : LLM_ERR_USAGE; }

static json_t *field(json_t *o, const char *k)
{
	json_t *v = o ? json_object_get(o, k) : NULL;
	return v && !json_is_null(v) ? v : NULL;
}

/* A number field in [LO, HI] ((LO, HI] when OPEN): 1 set, 0 absent, -1 bad. */
static int get_num(struct parse *c, json_t *o, const char *k, double lo, double hi, int open, float *out)
{
	json_t *v = field(o, k);
	if (!v)
		return 0;
	if (!json_is_number(v))
		return bad(c, k, "expected a number, got %s", json_is_string(v) ? "a string" : "another type");
	double d = json_number_value(v);
	if (!((open ? d > lo : d >= lo) && d <= hi))
		return bad(c, k, "%g is out of range %c%g, %g]", d, open ? '(' : '[', lo, hi);
	*out = (float)d;
	return 1;
}

static int get_int(struct parse *c, json_t *o, const char *k, long long lo, long long hi, long long *out)
{
	json_t *v = field(o, k);
	if (!v)
		return 0;
	if (!json_is_integer(v))
		return bad(c, k, "expected an integer");
	long long d = json_integer_value(v);
	if (d < lo || d > hi)
		return bad(c, k, "%lld is out of range [%lld, %lld]", d, lo, hi);
	*out = d;
	return 1;
}

static int get_int32(struct parse *c, json_t *o, const char *k, long long lo, long long hi, int *out)
{
	long long v;
	int r = get_int(c, o, k, lo, hi, &v);
	if (r > 0)
		*out = (int)v;
	return r;
}

static int get_bool(struct parse *c, json_t *o, const char *k, int *out)
{
	json_t *v = field(o, k);
	if (!v)
		return 0;
	if (!json_is_boolean(v))
		return bad(c, k, "expected true or false");
	*out = json_is_true(v);
	return 1;
}

/* A field this code does not implement: refused when it asks for anything
 * but the default, rather than quietly ignored. */
static int refuse_unless(struct parse *c, json_t *o, const char *k, int is_default, const char *what)
{
	if (!field(o, k) || is_default)
		return 0;
	return bad(c, k, "not supported%s%s", what ? ": " : "", what ? what : "");
}

/* Fields of the OpenAI and vLLM request bodies that this code does not
 * implement and that would change the answer: each is refused unless it
 * asks for what happens without it. Fields that change nothing in the
 * answer (user, metadata, store, service_tier, prediction,
 * parallel_tool_calls) are taken and ignored. */
enum dflt { D_ABSENT, D_FALSE, D_TRUE, D_ZERO, D_EMPTY, D_NONE_AUTO, D_TEXT };
static const struct unimpl {
	const char *k;
	enum dflt d;
	unsigned kinds;              /* 1 << enum llm_api_kind */
	const char *what;
} unimpl[] = {
#define K_OAI ((1u << LLM_API_COMPLETION) | (1u << LLM_API_CHAT) | (1u << LLM_API_JSONL))
#define K_CHAT (1u << LLM_API_CHAT)
	{ "use_beam_search", D_FALSE, K_OAI, "no beam search" },
	{ "include_stop_str_in_output", D_FALSE, K_OAI, NULL },
	{ "truncate_prompt_tokens", D_ABSENT, K_OAI, NULL },
	{ "allowed_token_ids", D_ABSENT, K_OAI, NULL },
	{ "bad_words", D_EMPTY, K_OAI, NULL },
	{ "logits_processors", D_EMPTY, K_OAI, NULL },
	{ "structured_outputs", D_ABSENT, K_OAI, "use guided_json, guided_regex, guided_choice or guided_grammar" },
	{ "guided_decoding_backend", D_ABSENT, K_OAI, "one grammar engine" },
	{ "guided_whitespace_pattern", D_ABSENT, K_OAI, "JSON is written compact" },
	/* chat in llm-serve: its answers carry no tool calls, so tools are
	 * refused there (llm-generate's JSONL lines render them into the
	 * prompt, as documented in llm-generate(1)) */
	{ "functions", D_EMPTY, K_CHAT, "function calling is not implemented" },
	{ "function_call", D_NONE_AUTO, K_CHAT, "function calling is not implemented" },
	{ "add_generation_prompt", D_TRUE, K_CHAT, NULL },
	{ "continue_final_message", D_FALSE, K_CHAT, NULL },
	{ "chat_template", D_ABSENT, K_CHAT, "the server's template is used (llm-serve --chat-template)" },
	{ "audio", D_ABSENT, K_CHAT, "text output only" },
	{ "modalities", D_TEXT, K_CHAT, "text output only" },
	{ "reasoning_effort", D_ABSENT, K_CHAT, NULL },
	{ "web_search_options", D_ABSENT, K_CHAT, NULL },
#undef K_OAI
#undef K_CHAT
};

static int is_dflt(json_t *v, enum dflt d)
{
	switch (d) {
	case D_ABSENT: return 0;
	case D_FALSE: return json_is_false(v);
	case D_TRUE: return json_is_true(v);
	case D_ZERO: return json_is_integer(v) && json_integer_value(v) == 0;
	case D_EMPTY: return json_is_array(v) && json_array_size(v) == 0;
	case D_NONE_AUTO: return json_is_string(v) && (!strcmp(json_string_value(v), "none") ||
	                                               !strcmp(json_string_value(v), "auto"));
	case D_TEXT: return json_is_array(v) && json_array_size(v) == 1 && json_is_string(json_array_get(v, 0)) &&
	                    !strcmp(json_string_value(json_array_get(v, 0)), "text");
	}
	return 0;
}

static int refuse_unimplemented(struct parse *c, json_t *o)
{
	for (size_t i = 0; i < sizeof unimpl / sizeof *unimpl; i++)
		if ((unimpl[i].kinds & (1u << c->kind)) &&
		    refuse_unless(c, o, unimpl[i].k, is_dflt(field(o, unimpl[i].k), unimpl[i].d), unimpl[i].what))
			return -1;
	return 0;
}

/* stop: a string or an array of non-empty strings, at most LLM_MAX_STOP
 * (vLLM takes any number; the sampler holds LLM_MAX_STOP, so more are
 * refused rather than cut). */
static int get_stop(struct parse *c, json_t *o)
{
	const char *k = "stop";
	json_t *v = field(o, k);
	if (!v)
		return 0;
	size_t n = 1;
	if (json_is_array(v))
		n = json_array_size(v);
	else if (!json_is_string(v))
		return bad(c, k, "expected a string or an array of strings");
	if (n > LLM_MAX_STOP)
		return bad(c, k, "%zu stop strings, at most %d", n, LLM_MAX_STOP);
	struct llm_api_req *r = c->r;
	r->p.n_stop = 0;
	for (size_t i = 0; i < n; i++) {
		json_t *x = json_is_array(v) ? json_array_get(v, i) : v;
		if (!json_is_string(x) || json_string_length(x) == 0)
			return bad(c, k, "expected non-empty strings");
		if (!(r->stops[i] = llm_strdup(json_string_value(x))))
			return bad_st(c, LLM_ERR_NOMEM, k, "out of memory");
		r->p.stop[r->p.n_stop++] = r->stops[i];
	}
	return 1;
}

/* seed, one rule in every kind: an integer is taken modulo 2^64, so -1 is
 * 2^64 - 1 (the negative integers name the seeds from 2^63 up, which a
 * JSON parser reads as too big). TGI clients send floats too (Python's
 * random(), in [0, 1)): /generate takes any number, an integral one in the
 * 64-bit signed range as that integer, any other as the 64 bits of its
 * IEEE-754 double, so equal values give equal seeds. */
static int get_seed(struct parse *c, json_t *o, uint64_t *out)
{
	json_t *v = field(o, "seed");
	if (!v)
		return 0;
	if (json_is_integer(v)) {
		*out = (uint64_t)json_integer_value(v);
		return 1;
	}
	if (c->kind != LLM_API_TGI || !json_is_real(v))
		return bad(c, "seed", c->kind == LLM_API_TGI ? "expected a number" : "expected an integer");
	double d = json_real_value(v);
	if (d >= -9223372036854775808.0 && d < 9223372036854775808.0 && d == (double)(int64_t)d)
		*out = (uint64_t)(int64_t)d;
	else
		memcpy(out, &d, sizeof *out);
	return 1;
}

/* The sampling fields every kind has (TGI's in "parameters"). */
static int sampling(struct parse *c, json_t *o)
{
	struct llm_api_req *r = c->r;
	struct llm_sample_params *p = &r->p;
	long long v;
	json_t *x;
	enum llm_status s;
	if (get_num(c, o, "temperature", 0, 100, 0, &p->temperature) < 0 ||
	    get_num(c, o, "top_p", 0, 1, 1, &p->top_p) < 0 ||
	    get_num(c, o, "min_p", 0, 1, 0, &p->min_p) < 0 ||
	    get_num(c, o, "repetition_penalty", 0, 100, 1, &p->repetition_penalty) < 0 ||
	    get_num(c, o, "frequency_penalty", -2, 2, 0, &p->frequency_penalty) < 0 ||
	    get_num(c, o, "presence_penalty", -2, 2, 0, &p->presence_penalty) < 0)
		return -1;
	int r1 = get_int(c, o, "top_k", -1, 1 << 30, &v);   /* -1 and 0: off */
	if (r1 < 0)
		return -1;
	if (r1)
		p->top_k = v > 0 ? (int)v : 0;
	if (get_seed(c, o, &p->seed) < 0)
		return -1;
	if (get_int32(c, o, "min_tokens", 0, INT32_MAX, &p->min_tokens) < 0 || get_bool(c, o, "ignore_eos", &p->ignore_eos) < 0 ||
	    get_stop(c, o) < 0)
		return -1;
	if ((x = field(o, "stop_token_ids")) &&
	    (s = llm_json_stop_ids(x, c->env->n_vocab, p->stop_ids, &p->n_stop_ids)))
		return bad_st(c, usage(s), "stop_token_ids", "%s", llm_errmsg());
	if ((x = field(o, "logit_bias"))) {
		if ((s = llm_json_logit_bias(x, c->env->n_vocab, &r->bias, &p->n_bias)))
			return bad_st(c, usage(s), "logit_bias", "%s", llm_errmsg());
		p->bias = r->bias;
	}
	return 0;
}

/* Grammar text TEXT (S: how making it went) compiled as the request's
 * grammar, replacing the default; errors name field K. */
static int set_grammar(struct parse *c, const char *k, struct llm_buf *text, enum llm_status s)
{
	struct llm_grammar *g = NULL;
	if (!s)
		s = llm_grammar_compile_cached(&g, text->p ? text->p : "", text->len, c->env->gvocab, c->env->gbudget);
	llm_buf_free(text);
	if (s)
		return bad_st(c, usage(s), k, "%s", llm_errmsg());
	llm_grammar_unref(c->r->p.grammar);
	c->r->p.grammar = g;
	return 0;
}

/* A schema given as an object, or as its JSON text (guided_json, TGI). */
static enum llm_status schema_text(json_t *v, struct llm_buf *b)
{
	if (json_is_object(v) || json_is_boolean(v))
		return llm_guide_json_schema(v, b);
	if (!json_is_string(v))
		return llm_fail(LLM_ERR_USAGE, "expected a JSON schema (an object, or its text)");
	json_error_t e;
	json_t *s = json_loads(json_string_value(v), JSON_DECODE_ANY, &e);
	if (!s)
		return llm_fail(LLM_ERR_USAGE, "the schema's text is not JSON: %s", e.text);
	enum llm_status st = llm_guide_json_schema(s, b);
	json_decref(s);
	return st;
}

/* Structured output (request.h): one field of these at most. */
static int guided(struct parse *c, json_t *o)
{
	static const char *const keys[] = { "response_format", "guided_json", "guided_regex", "guided_choice", "guided_grammar" };
	const char *k = NULL;
	for (size_t i = 0; i < sizeof keys / sizeof *keys; i++) {
		json_t *v = field(o, keys[i]), *t = json_object_get(v, "type");
		if (!v || (i == 0 && json_is_string(t) && !strcmp(json_string_value(t), "text")))
			continue;
		if (k)
			return bad(c, keys[i], "only one of response_format, guided_json, guided_regex, guided_choice and "
			           "guided_grammar may be given (and %s is)", k);
		k = keys[i];
	}
	if (!k)
		return 0;
	if (!c->env->gvocab)
		return bad(c, k, "structured output needs the model's tokenizer files");
	json_t *v = field(o, k);
	struct llm_buf b = { 0 };
	enum llm_status s = LLM_OK;
	if (!strcmp(k, "response_format")) {
		json_t *t = json_object_get(v, "type"), *js = json_object_get(v, "json_schema");
		const char *ts = json_is_string(t) ? json_string_value(t) : NULL;
		if (!json_is_object(v) || !ts)
			return bad(c, k, "expected {\"type\": \"text\", \"json_object\" or \"json_schema\"}");
		if (!strcmp(ts, "json_object"))
			s = llm_guide_json_object(&b);
		else if (!strcmp(ts, "json_schema") && json_is_object(js) && json_object_get(js, "schema"))
			s = schema_text(json_object_get(js, "schema"), &b);
		else if (!strcmp(ts, "json_schema"))
			return bad(c, k, "expected \"json_schema\": {\"name\": ..., \"schema\": {...}}");
		else if (!strcmp(ts, "json") && json_object_get(v, "value"))   /* TGI's chat form */
			s = schema_text(json_object_get(v, "value"), &b);
		else if (!strcmp(ts, "regex") && json_is_string(json_object_get(v, "value")))
			s = llm_guide_regex(json_string_value(json_object_get(v, "value")),
			                    json_string_length(json_object_get(v, "value")), &b);
		else if (!strcmp(ts, "json") || !strcmp(ts, "regex"))
			return bad(c, k, "expected {\"type\": \"%s\", \"value\": %s} (TGI's form)", ts,
			           ts[0] == 'j' ? "a JSON Schema" : "a regular expression");
		else
			return bad(c, k, "type '%s' is not supported (text, json_object, json_schema; TGI's json and regex)", ts);
	} else if (!strcmp(k, "guided_json")) {
		s = schema_text(v, &b);
	} else if (!strcmp(k, "guided_regex")) {
		if (!json_is_string(v))
			return bad(c, k, "expected a string");
		s = llm_guide_regex(json_string_value(v), json_string_length(v), &b);
	} else if (!strcmp(k, "guided_choice")) {
		size_t n = json_is_array(v) ? json_array_size(v) : 0;
		const char **ch = n ? malloc(n * sizeof *ch) : NULL;
		if (!n)
			return bad(c, k, "expected a non-empty array of strings");
		if (!ch)
			return bad_st(c, LLM_ERR_NOMEM, k, "out of memory");
		for (size_t i = 0; i < n; i++)
			if (!(ch[i] = json_string_value(json_array_get(v, i)))) {
				free(ch);
				return bad(c, k, "expected a non-empty array of strings");
			}
		s = llm_guide_choice(ch, n, &b);
		free(ch);
	} else {
		if (!json_is_string(v))
			return bad(c, k, "expected grammar text (a string)");
		s = llm_buf_append(&b, json_string_value(v), json_string_length(v));
	}
	return set_grammar(c, k, &b, s);
}

/* TGI's parameters.grammar: {"type": "json", "value": schema} or {"type": "regex", "value": "..."}. */
static int tgi_grammar(struct parse *c, json_t *o)
{
	const char *k = "grammar";
	json_t *v = field(o, k), *t = json_object_get(v, "type"), *val = json_object_get(v, "value");
	if (!v)
		return 0;
	const char *ts = json_is_string(t) ? json_string_value(t) : "";
	if (!json_is_object(v) || !val || (strcmp(ts, "json") && strcmp(ts, "regex")))
		return bad(c, k, "expected {\"type\": \"json\" or \"regex\", \"value\": ...}");
	if (!c->env->gvocab)
		return bad(c, k, "structured output needs the model's tokenizer files");
	struct llm_buf b = { 0 };
	if (!strcmp(ts, "regex") && !json_is_string(val))
		return bad(c, k, "value: expected a string");
	enum llm_status s = !strcmp(ts, "json") ? schema_text(val, &b) :
	                    llm_guide_regex(json_string_value(val), json_string_length(val), &b);
	return set_grammar(c, k, &b, s);
}

/* Field K naming the model or one of ENV's LoRA adapters: R->adapter. */
static int model(struct parse *c, json_t *o, const char *k)
{
	const struct llm_api_env *env = c->env;
	json_t *m = field(o, k);
	c->r->adapter = env->adapter;
	if (!m)
		return 0;
	if (!json_is_string(m))
		return bad(c, k, "expected a string");
	const char *name = json_string_value(m);
	for (int i = 0; i < env->n_adapters; i++)
		if (env->adapters[i] && !strcmp(env->adapters[i], name)) {
			c->r->adapter = i + 1;
			return 0;
		}
	int tgi = !strcmp(k, "adapter_id");   /* names an adapter, whatever model_name is */
	int base = tgi ? env->model_name && !strcmp(name, env->model_name)
	               : !env->model_name || env->any_model || !strcmp(name, env->model_name);
	if (base) {
		c->r->adapter = 0;
		return 0;
	}
	char list[512] = "";
	size_t n = 0;
	for (int i = 0; i < env->n_adapters && n < sizeof list; i++)
		if (env->adapters[i])
			n += (size_t)snprintf(list + n, sizeof list - n, "%s'%s'", n ? ", " : "", env->adapters[i]);
	if (n >= sizeof list)
		memcpy(list + sizeof list - 4, "...", 4);
	if (tgi)
		return bad_st(c, LLM_ERR_UNSUPPORTED, k, "the adapter '%s' does not exist (%s%s)", name,
		              n ? "this server has " : "this server has no LoRA adapters", list);
	return bad_st(c, LLM_ERR_UNSUPPORTED, k, "the model '%s' does not exist (this server has '%s'%s%s)", name,
	              env->model_name, n ? " and the LoRA adapters " : "", list);
}

/* The OpenAI fields beyond sampling (completion, chat, JSONL). */
static int openai(struct parse *c, json_t *o)
{
	struct llm_api_req *r = c->r;
	if (model(c, o, "model") < 0)
		return -1;
	if (get_int32(c, o, "n", 1, c->env->max_n > 0 ? c->env->max_n : 1, &r->n) < 0)
		return -1;
	if (c->kind != LLM_API_JSONL) {
		if (get_bool(c, o, "stream", &r->stream) < 0)
			return -1;
		json_t *so = field(o, "stream_options");
		if (so && !json_is_object(so))
			return bad(c, "stream_options", "expected an object");
		if (so && get_bool(c, so, "include_usage", &r->include_usage) < 0)
			return -1;
	}
	if (get_bool(c, o, "echo", &r->echo) < 0)
		return -1;
	if (r->echo && c->kind != LLM_API_COMPLETION)
		return bad(c, "echo", "%s", c->kind == LLM_API_CHAT ? "not supported in chat (a completions field)"
		                                                     : "not a JSONL field (llm-generate --echo)");
	if (field(o, "prompt_logprobs") && c->kind == LLM_API_JSONL)
		return bad(c, "prompt_logprobs", "not a JSONL field (llm-generate --score scores prompts)");
	if (get_int32(c, o, "prompt_logprobs", 0, LLM_MAX_LOGPROBS, &r->prompt_logprobs) < 0)
		return -1;
	json_t *bo = field(o, "best_of"), *sf = field(o, "suffix");
	if (json_is_string(sf) && json_string_length(sf)) {
		for (size_t i = 0; c->env->tk && i < sizeof fim_tokens / sizeof *fim_tokens && !c->fim; i++)
			if (llm_tokenizer_find(c->env->tk, fim_tokens[i][0]) >= 0 &&
			    llm_tokenizer_find(c->env->tk, fim_tokens[i][1]) >= 0 &&
			    llm_tokenizer_find(c->env->tk, fim_tokens[i][2]) >= 0)
				c->fim = fim_tokens[i];
		if (!c->fim)
			return bad(c, "suffix", "this model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, "
			           "<|fim_middle|> or <fim_...>)");
		if (c->kind == LLM_API_CHAT)
			return bad(c, "suffix", "not a chat field");
		c->suffix = sf;
	}
	r->best_of = r->n;
	if (bo && c->kind == LLM_API_COMPLETION) {
		if (get_int32(c, o, "best_of", r->n, c->env->max_n > 0 ? c->env->max_n : 1, &r->best_of) < 0)
			return -1;
		if (r->best_of > r->n && r->stream)
			return bad(c, "best_of", "%d > n: not with stream (the best are known at the end)", r->best_of);
		bo = NULL;
	}
	if (refuse_unimplemented(c, o) ||
	    refuse_unless(c, o, "best_of", !bo || (json_is_integer(bo) && json_integer_value(bo) == r->n),
	                  "only best_of = n") ||
	    (sf && !json_is_string(sf) ? bad(c, "suffix", "expected a string") : 0) || guided(c, o))
		return -1;
	return 0;
}

/* log-probs: the completion form (an integer: the top N), the chat form
 * (logprobs true, top_logprobs N) or, in JSONL, either; TGI's top_n_tokens. */
static int logprobs(struct parse *c, json_t *o)
{
	struct llm_api_req *r = c->r;
	struct llm_sample_params *p = &r->p;
	json_t *lp = field(o, "logprobs");
	if (c->kind == LLM_API_TGI)
		return get_int32(c, o, "top_n_tokens", 0, LLM_MAX_LOGPROBS, &p->n_logprobs) < 0 ? -1 : 0;
	if (lp && json_is_integer(lp) && c->kind != LLM_API_CHAT) {
		if (get_int32(c, o, "logprobs", 0, LLM_MAX_LOGPROBS, &p->n_logprobs) < 0)
			return -1;
		r->logprobs = 1;
	} else if (lp && json_is_boolean(lp) && c->kind != LLM_API_COMPLETION) {
		r->logprobs = json_is_true(lp);
		if (!r->logprobs)
			p->n_logprobs = 0;
	} else if (lp) {
		return c->kind == LLM_API_COMPLETION ? bad(c, "logprobs", "expected an integer in [0, %d]", LLM_MAX_LOGPROBS) :
		       c->kind == LLM_API_CHAT ? bad(c, "logprobs", "expected true or false") :
		       bad(c, "logprobs", "expected true, false or an integer in [0, %d]", LLM_MAX_LOGPROBS);
	}
	if (c->kind == LLM_API_COMPLETION)
		return 0;
	int top = get_int32(c, o, "top_logprobs", 0, LLM_MAX_LOGPROBS, &p->n_logprobs);
	if (top < 0)
		return -1;
	if (c->kind == LLM_API_CHAT && top && p->n_logprobs && !r->logprobs)
		return bad(c, "top_logprobs", "needs logprobs: true");
	/* llm-generate prints log-probs with their top list: logprobs true asks
	 * for one entry */
	if (c->kind == LLM_API_JSONL && r->logprobs && !p->n_logprobs && !top)
		p->n_logprobs = 1;
	return 0;
}

static int set_ids(struct parse *c, const char *k, json_t *arr)
{
	struct llm_api_req *r = c->r;
	size_t n = json_array_size(arr);
	int nv = c->env->n_vocab;
	if (!(r->prompt = malloc((n + 1) * sizeof *r->prompt)))
		return bad_st(c, LLM_ERR_NOMEM, k, "out of memory");
	for (size_t i = 0; i < n; i++) {
		json_t *x = json_array_get(arr, i);
		json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
		if (id < 0 || id > INT32_MAX || (nv > 0 && id >= nv)) {
			char range[40] = "";
			if (nv > 0)
				snprintf(range, sizeof range, " in [0, %d)", nv);
			return bad(c, k, "element %zu is not a token id%s%s", i, range,
			           json_is_string(x) ? " (one prompt per request)" : "");
		}
		r->prompt[i] = (int32_t)id;
	}
	r->n_prompt = (int)n;
	if (!n)
		return bad(c, k, "empty");
	return 0;
}

/* FIT: the prompt must fit the context (not truncated after), so a text
 * too long for it by its byte length alone is refused before encoding; the
 * context is the server's, or the longest the model has. */
static int tokenize(struct parse *c, const char *k, const char *text, size_t len, int special, int fit)
{
	struct llm_api_req *r = c->r;
	if (!c->env->tk)
		return bad(c, k, "the model has no tokenizer files: only token ids can be given");
	int ctx = c->env->n_ctx > 0 ? c->env->n_ctx : llm_tokenizer_model_ctx(c->env->tk);
	size_t most = ctx > 0 ? llm_tokenizer_max_bytes(c->env->tk, ctx - 1) : SIZE_MAX;
	if (fit && len > most)
		return bad(c, k, "%zu bytes exceed the context of %d tokens (%d tokens hold %zu bytes at most)", len, ctx,
		           ctx - 1, most);
	size_t n;
	enum llm_status s = llm_tokenizer_encode(c->env->tk, text, len, special, &r->prompt, &n);
	if (s)
		return bad_st(c, usage(s), k, "%s", llm_errmsg());
	if (n > INT32_MAX)
		return bad(c, k, "%zu tokens", n);
	r->n_prompt = (int)n;
	if (!n)
		return bad(c, k, "empty after tokenization");
	return 0;
}

/* The tool-call grammar of tool_choice "required" or a named function:
 * the answer is one call, in the template's format F, to one of the N
 * functions FNS (objects {"name", "parameters"}), its arguments valid for
 * that function's parameter schema (whose "#" is that schema, as in
 * response_format). Errors name the tool, as field "tools". */
static int tool_grammar(struct parse *c, enum llm_tool_format f, json_t *const *fns, size_t n)
{
	if (c->r->p.grammar)
		return bad(c, "tool_choice", "a call is forced by a grammar: not with response_format or guided_*");
	const char **names = malloc((n + 1) * sizeof *names);
	const json_t **params = malloc((n + 1) * sizeof *params);
	struct llm_buf b = { 0 };
	enum llm_status s = names && params ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; !s && i < n; i++) {
		names[i] = json_string_value(json_object_get(fns[i], "name"));
		params[i] = json_object_get(fns[i], "parameters");
	}
	if (!s)
		s = llm_guide_tool_call(names, (const struct json_t *const *)params, n,
		                        f == LLM_TOOL_LLAMA3 ? "parameters" : "arguments",
		                        f == LLM_TOOL_HERMES ? "<tool_call>\n" : "", f == LLM_TOOL_HERMES ? "\n</tool_call>" : "", &b);
	free(names);
	free(params);
	if (s) {
		llm_buf_free(&b);
		return bad_st(c, usage(s), "tools", "%s", llm_errmsg());
	}
	return set_grammar(c, "tools", &b, LLM_OK);
}

/* Whether P (a tool's parameters) is an object schema: an object whose
 * "type", if given, is "object". */
static int object_schema(const json_t *p)
{
	const json_t *t = json_object_get(p, "type");
	return json_is_object(p) && (!t || (json_is_string(t) && !strcmp(json_string_value(t), "object")));
}

/* tools and tool_choice (chat): the functions' names kept for the answer's
 * parse, and for "required" or a named function a grammar that makes the
 * answer a call. "none": the tools are rendered (the template may show
 * them) but the answer is not parsed. */
static int tool_choice(struct parse *c, json_t *o, json_t *tools)
{
	struct llm_api_req *r = c->r;
	json_t *tc = field(o, "tool_choice");
	size_t n = json_is_array(tools) ? json_array_size(tools) : 0;
	const char *mode = json_is_string(tc) ? json_string_value(tc) : tc ? "named" : n ? "auto" : "none";
	if (tc && !json_is_string(tc) && !json_is_object(tc))
		return bad(c, "tool_choice", "expected \"none\", \"auto\", \"required\" or {\"type\": \"function\", \"function\": {\"name\": ...}}");
	if (strcmp(mode, "none") && strcmp(mode, "auto") && strcmp(mode, "required") && strcmp(mode, "named"))
		return bad(c, "tool_choice", "'%s' is not none, auto or required", mode);
	if (!n) {
		if (strcmp(mode, "none") && strcmp(mode, "auto"))
			return bad(c, "tool_choice", "%s needs tools", mode);
		return 0;
	}
	json_t **fns = malloc(n * sizeof *fns);
	if (!fns || !(r->tool_names = calloc(n, sizeof *r->tool_names))) {
		free(fns);
		return bad_st(c, LLM_ERR_NOMEM, "tools", "out of memory");
	}
	for (size_t i = 0; i < n; i++) {
		json_t *t = json_array_get(tools, i), *fn = json_object_get(t, "function");
		json_t *ty = json_object_get(t, "type"), *nm = json_object_get(fn, "name"), *pa = json_object_get(fn, "parameters");
		if (!json_is_object(t) || !json_is_string(ty) || strcmp(json_string_value(ty), "function") || !json_is_string(nm) ||
		    (pa && !json_is_object(pa))) {
			free(fns);
			return bad(c, "tools", "tools[%zu]: expected {\"type\": \"function\", \"function\": {\"name\": string, "
			           "\"parameters\": a JSON Schema object}}", i);
		}
		const char *name = json_string_value(nm);
		int rv = 0;
		if (!name[0])
			rv = bad(c, "tools", "tools[%zu]: the function's name is empty", i);
		for (size_t k = 0; !rv && k < i; k++)
			if (!strcmp(r->tool_names[k], name))
				rv = bad(c, "tools", "tools[%zu] ('%s'): the name is tools[%zu]'s too (names must differ)", i, name, k);
		if (!rv && pa && !object_schema(pa))
			rv = bad(c, "tools", "tools[%zu] ('%s'): parameters: expected an object schema (\"type\": \"object\")", i, name);
		if (rv) {
			free(fns);
			return rv;
		}
		fns[i] = fn;
		if (!(r->tool_names[r->n_tools++] = llm_strdup(json_string_value(nm)))) {
			free(fns);
			return bad_st(c, LLM_ERR_NOMEM, "tools", "out of memory");
		}
	}
	const char *tsrc = c->env->chat_template ? c->env->chat_template : llm_tokenizer_chat_template(c->env->tk);
	enum llm_tool_format f = llm_tool_format_of(tsrc);
	int rv = 0;
	if (!strcmp(mode, "none")) {
		rv = 0;
	} else if (f == LLM_TOOL_NONE && c->kind == LLM_API_JSONL && !strcmp(mode, "auto")) {
		rv = 0;                  /* JSONL: rendered for the prompt, as before; no format to parse */
	} else if (f == LLM_TOOL_NONE) {
		rv = bad(c, "tools", "this model's chat template has no tool-call format (hermes <tool_call> blocks or "
		         "Llama 3 JSON); tool_choice \"none\" renders the tools without parsing the answer");
	} else {
		r->tool_format = (int)f;
		if (!strcmp(mode, "named")) {
			json_t *fn = json_object_get(tc, "function"), *nm = json_object_get(fn, "name");
			size_t i = 0;
			while (json_is_string(nm) && i < n && strcmp(r->tool_names[i], json_string_value(nm)))
				i++;
			if (!json_is_string(nm) || strcmp(json_string_value(json_object_get(tc, "type")), "function"))
				rv = bad(c, "tool_choice", "expected {\"type\": \"function\", \"function\": {\"name\": ...}}");
			else if (i == n)
				rv = bad(c, "tool_choice", "function '%s' is not among the tools", json_string_value(nm));
			else if (!c->env->gvocab)
				rv = bad(c, "tool_choice", "a named function needs the model's tokenizer files");
			else
				rv = tool_grammar(c, f, &fns[i], 1);
		} else if (!strcmp(mode, "required")) {
			rv = !c->env->gvocab ? bad(c, "tool_choice", "required needs the model's tokenizer files")
			                     : tool_grammar(c, f, fns, n);
		}
	}
	free(fns);
	return rv;
}

/* One message's content: a string, null, absent (an assistant turn that
 * made tool calls: the openai client's runTools and the AI SDK send null,
 * others leave it out) or text parts. */
enum llm_status llm_api_chat_messages(json_t *msgs, json_t **out)
{
	*out = NULL;
	if (!json_is_array(msgs) || json_array_size(msgs) == 0)
		return llm_fail(LLM_ERR_USAGE, "messages: expected a non-empty array of messages");
	json_t *a = json_array();
	if (!a)
		return llm_fail(LLM_ERR_NOMEM, "messages: out of memory");
	for (size_t i = 0; i < json_array_size(msgs); i++) {
		json_t *m = json_array_get(msgs, i), *ct = json_object_get(m, "content"), *role = json_object_get(m, "role");
		int assistant = json_is_string(role) && !strcmp(json_string_value(role), "assistant");
		if (!json_is_object(m) || !json_is_string(role) ||
		    !(json_is_string(ct) || json_is_array(ct) || json_is_null(ct) || (!ct && assistant))) {
			json_decref(a);
			return llm_fail(LLM_ERR_USAGE, "messages: message %zu: expected {\"role\": string, \"content\": string}", i);
		}
		/* content parts: text only (an image or audio part would be
		 * dropped by the template, changing the question) */
		for (size_t j = 0; json_is_array(ct) && j < json_array_size(ct); j++) {
			json_t *part = json_array_get(ct, j), *ty = json_object_get(part, "type");
			const char *why = NULL;
			if (!json_is_object(part) || !json_is_string(ty) ||
			    (!strcmp(json_string_value(ty), "text") && !json_is_string(json_object_get(part, "text"))))
				why = "expected {\"type\": \"text\", \"text\": string}";
			else if (strcmp(json_string_value(ty), "text")) {
				json_decref(a);
				return llm_fail(LLM_ERR_USAGE, "messages: message %zu: content part %zu: type '%s' is not supported "
				                "(text only)", i, j, json_string_value(ty));
			}
			if (why) {
				json_decref(a);
				return llm_fail(LLM_ERR_USAGE, "messages: message %zu: content part %zu: %s", i, j, why);
			}
		}
		/* null or absent content is rendered as "", as vLLM and llama.cpp's
		 * server do: a template may test it as a string ('</think>' in
		 * content), and "" is what the turn said besides its calls */
		json_t *c = ct && !json_is_null(ct) ? json_incref(m) : json_copy(m);
		if (c && (!ct || json_is_null(ct)) && json_object_set_new(c, "content", json_string(""))) {
			json_decref(c);
			c = NULL;
		}
		if (!c || json_array_append_new(a, c)) {
			json_decref(a);
			return llm_fail(LLM_ERR_NOMEM, "messages: out of memory");
		}
	}
	*out = a;
	return LLM_OK;
}

/* messages through the chat template (with chat_template_kwargs, and tools
 * in llm-generate's lines), then tokenized without special tokens: the
 * template places BOS itself. */
static int chat(struct parse *c, json_t *o)
{
	const char *k = "messages";
	json_t *msgs = NULL;
	enum llm_status ms = llm_api_chat_messages(field(o, k), &msgs);
	if (ms)   /* the message starts with "messages: " */
		return bad_st(c, ms, k, "%s", llm_errmsg() + strlen("messages: "));
	json_t *kw = field(o, "chat_template_kwargs"), *tools = field(o, "tools");
	int rv = kw && !json_is_object(kw) ? bad(c, "chat_template_kwargs", "expected an object") :
	         tools && !json_is_array(tools) ? bad(c, "tools", "expected an array") :
	         !c->env->tk ? bad(c, k, "the model has no tokenizer files") :
	         !c->env->chat_template && !llm_tokenizer_chat_template(c->env->tk) ?
	         bad(c, k, "this model has no chat template (give one with --chat-template FILE)") : tool_choice(c, o, tools);
	if (rv < 0) {
		json_decref(msgs);
		return -1;
	}
	json_t *req = json_pack("{s:o, s:b}", "messages", msgs, "add_generation_prompt", 1);   /* takes msgs */
	if (req && kw)
		json_object_set(req, "chat_template_kwargs", kw);
	if (req && tools && json_array_size(tools))
		json_object_set(req, "tools", tools);
	char *rs = req ? json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	json_decref(req);
	char *text = NULL;
	size_t len;
	if (!rs)
		return bad_st(c, LLM_ERR_NOMEM, k, "out of memory");
	enum llm_status s = llm_chat_render(c->env->tk, c->env->chat_template, rs, &text, &len);
	free(rs);
	if (s)
		return bad_st(c, usage(s), k, "chat template: %s", llm_errmsg());
	if (llm_reasoning_of(c->env->chat_template ? c->env->chat_template : llm_tokenizer_chat_template(c->env->tk)))
		c->r->reasoning = llm_reasoning_prompt_open(text, len) ? 2 : 1;
	int r = tokenize(c, k, text, len, 0, 1);
	free(text);
	return r;
}

/* The completion prompt: a string, one string in an array, or token ids. */
static int completion_prompt(struct parse *c, json_t *pr)
{
	const char *k = "prompt";
	if (json_is_array(pr) && json_array_size(pr) == 1 && json_is_string(json_array_get(pr, 0)))
		pr = json_array_get(pr, 0);
	if (json_is_string(pr) && c->suffix) {
		struct llm_buf b = { 0 };
		int bad_mem = llm_buf_append(&b, c->fim[0], strlen(c->fim[0])) ||
		              llm_buf_append(&b, json_string_value(pr), json_string_length(pr)) ||
		              llm_buf_append(&b, c->fim[1], strlen(c->fim[1])) ||
		              llm_buf_append(&b, json_string_value(c->suffix), json_string_length(c->suffix)) ||
		              llm_buf_append(&b, c->fim[2], strlen(c->fim[2]));
		int r = bad_mem ? bad_st(c, LLM_ERR_NOMEM, k, "out of memory") : tokenize(c, k, b.p, b.len, 1, 1);
		llm_buf_free(&b);
		return r;
	}
	if (c->suffix)
		return bad(c, "suffix", "goes with a text prompt");
	if (json_is_string(pr))
		return tokenize(c, k, json_string_value(pr), json_string_length(pr), 1, 1);
	if (json_is_array(pr) && json_array_size(pr) > 0)
		return set_ids(c, k, pr);
	return bad(c, k, "expected a string or a non-empty array of token ids");
}

/* max_tokens after the prompt: the context rule, min_tokens within it,
 * then the sampler's own check. */
static int limits(struct parse *c)
{
	struct llm_api_req *r = c->r;
	struct llm_sample_params *p = &r->p;
	const char *k = c->max_key;
	int n_ctx = c->env->n_ctx;
	if (n_ctx > 0 && r->n_prompt > 0) {
		long long v = p->max_tokens;
		if (!c->max_given && v == 0)   /* up to the context */
			v = n_ctx - r->n_prompt;
		if (r->n_prompt >= n_ctx || r->n_prompt + v > n_ctx)
			return bad(c, k, "prompt of %d tokens + %s %lld exceeds the context of %d tokens", r->n_prompt, k, v, n_ctx);
		p->max_tokens = (int)v;
	}
	if (p->max_tokens > 0 && p->min_tokens > p->max_tokens)
		return bad(c, "min_tokens", "%d exceeds %s %d", p->min_tokens, k, p->max_tokens);
	enum llm_status s = llm_sample_params_check(p);
	if (s) {
		/* the message starts with the field ("top_k: -1 is negative") */
		const char *m = llm_errmsg(), *colon = strchr(m, ':');
		size_t n = colon ? (size_t)(colon - m) : 0;
		snprintf(r->param, sizeof r->param, "%.*s", (int)(n < sizeof r->param ? n : 0), m);
		c->st = s;
		return -1;
	}
	return 0;
}

static int parse(struct parse *c, json_t *body)
{
	struct llm_api_req *r = c->r;
	enum llm_api_kind kind = c->kind;
	if (!body)
		return limits(c);
	if (!json_is_object(body))
		return bad(c, "body", "expected a JSON object");
	json_t *o = body;
	if (kind == LLM_API_TGI) {
		json_t *in = json_object_get(body, "inputs");
		if (!json_is_string(in))
			return bad(c, "inputs", "expected a string");
		o = json_object_get(body, "parameters");
		if (o && !json_is_null(o) && !json_is_object(o))
			return bad(c, "parameters", "expected an object");
		if (json_is_null(o))
			o = NULL;
		int sample = 0;
		if (get_bool(c, o, "do_sample", &sample) < 0 || sampling(c, o) < 0)
			return -1;
		/* TGI samples when asked to or given a temperature above 0 */
		json_t *t = field(o, "temperature");
		if (!sample && !(t && json_number_value(t) > 0))
			r->p.temperature = 0;
		json_t *bo = field(o, "best_of"), *tp = field(o, "typical_p");
		if (get_bool(c, o, "details", &r->details) < 0 || get_bool(c, o, "return_full_text", &r->full_text) < 0 ||
		    get_bool(c, o, "decoder_input_details", &r->prefill_details) < 0 || logprobs(c, o) < 0 ||
		    refuse_unless(c, o, "best_of", json_is_integer(bo) && json_integer_value(bo) == 1, "only 1") ||
		    refuse_unless(c, o, "typical_p", json_is_number(tp) && json_number_value(tp) == 1, NULL) ||
		    refuse_unless(c, o, "watermark", json_is_false(field(o, "watermark")), NULL) ||
		    tgi_grammar(c, o) || model(c, o, "adapter_id") < 0)
			return -1;
		long long trunc = 0;
		if (get_int(c, o, "truncate", 1, INT32_MAX, &trunc) < 0)
			return -1;
		if (tokenize(c, "inputs", json_string_value(in), json_string_length(in), 1, trunc == 0))
			return -1;
		if (trunc > 0 && r->n_prompt > trunc) {   /* keep the last TRUNC tokens */
			memmove(r->prompt, r->prompt + (r->n_prompt - trunc), (size_t)trunc * sizeof *r->prompt);
			r->n_prompt = (int)trunc;
		}
		if (r->full_text && !(r->inputs = llm_strdup(json_string_value(in))))
			return bad_st(c, LLM_ERR_NOMEM, "inputs", "out of memory");
		c->max_key = "max_new_tokens";
		r->p.max_tokens = 20;   /* TGI's default */
	} else {
		if (openai(c, o) < 0 || sampling(c, o) < 0 || logprobs(c, o) < 0)
			return -1;
		json_t *pr = field(o, "prompt"), *pid = field(o, "prompt_ids"), *msg = field(o, "messages");
		if (kind == LLM_API_JSONL && pid) {   /* token ids as they are */
			if (!json_is_array(pid))
				return bad(c, "prompt_ids", "expected an array of token ids");
			if (set_ids(c, "prompt_ids", pid) < 0)
				return -1;
		} else if (kind == LLM_API_COMPLETION || (kind == LLM_API_JSONL && pr)) {
			if (completion_prompt(c, pr) < 0)
				return -1;
		} else if (kind == LLM_API_CHAT || (kind == LLM_API_JSONL && msg)) {
			if (chat(c, o) < 0)
				return -1;
		} else {
			return bad(c, "prompt", "needs \"prompt\" (a string), \"prompt_ids\" or \"messages\" (arrays)");
		}
		if (kind != LLM_API_COMPLETION && field(o, "max_completion_tokens"))
			c->max_key = "max_completion_tokens";
	}
	long long v;
	int given = get_int(c, o, c->max_key, 1, INT32_MAX, &v);
	if (given < 0)
		return -1;
	if (given)
		r->p.max_tokens = (int)v;
	c->max_given = given;
	return limits(c);
}

/* The Responses and Messages APIs: BODY translated into a chat body
 * (apis.h), parsed as chat, a failure's field named as the API names it. */
static enum llm_status translated(struct llm_api_req *r, enum llm_api_kind kind, json_t *body,
                                  const struct llm_api_env *env)
{
	json_t *chat;
	char param[sizeof r->param];
	enum llm_status s = llm_api_to_chat(kind, body, &chat, param, sizeof param);
	if (s) {
		memset(r, 0, sizeof *r);
		memcpy(r->param, param, sizeof param);
		return s;
	}
	s = llm_api_req_parse(r, LLM_API_CHAT, chat, env);
	json_decref(chat);
	const char *name = s && r->param[0] ? llm_api_field_name(kind, r->param) : r->param;
	size_t n = strlen(r->param);
	if (name != r->param && !strncmp(llm_errmsg(), r->param, n) && llm_errmsg()[n] == ':') {
		char m[600];
		snprintf(m, sizeof m, "%s", llm_errmsg() + n);
		llm_fail(s, "%s%s", name, m);
		snprintf(r->param, sizeof r->param, "%s", name);
	}
	return s;
}

enum llm_status llm_api_req_parse(struct llm_api_req *r, enum llm_api_kind kind, json_t *body,
                                  const struct llm_api_env *env)
{
	if (kind == LLM_API_RESPONSES || kind == LLM_API_MESSAGES || kind == LLM_API_MESSAGES_COUNT)
		return translated(r, kind, body, env);
	memset(r, 0, sizeof *r);
	r->p = env->defaults;
	llm_grammar_ref(r->p.grammar);
	r->n = 1;
	r->prompt_logprobs = -1;
	r->adapter = env->adapter;
	struct parse c = { r, env, kind, LLM_OK, "max_tokens", 0, NULL, NULL };
	if (parse(&c, body) < 0) {
		char param[sizeof r->param];
		memcpy(param, r->param, sizeof param);
		llm_api_req_free(r);
		memcpy(r->param, param, sizeof param);
		return c.st ? c.st : LLM_ERR_INTERNAL;
	}
	return LLM_OK;
}

enum llm_status llm_api_req_prompt_text(struct llm_api_req *r, const struct llm_api_env *env, const char *field_name,
                                        const char *text, size_t len, int special)
{
	struct parse c = { r, env, LLM_API_JSONL, LLM_OK, "max_tokens", 0, NULL, NULL };
	free(r->prompt);
	r->prompt = NULL;
	r->n_prompt = 0;
	if (tokenize(&c, field_name, text, len, special, 1) < 0 || limits(&c) < 0)
		return c.st ? c.st : LLM_ERR_INTERNAL;
	return LLM_OK;
}

void llm_api_req_free(struct llm_api_req *r)
{
	if (!r)
		return;
	free(r->prompt);
	for (int i = 0; i < LLM_MAX_STOP; i++)
		free(r->stops[i]);
	free(r->bias);
	free(r->inputs);
	for (int i = 0; i < r->n_tools; i++)
		free(r->tool_names[i]);
	free(r->tool_names);
	llm_grammar_unref(r->p.grammar);
	memset(r, 0, sizeof *r);
}

enum llm_status llm_api_env_guide(struct llm_api_env *env, const char *json_schema, const char *grammar)
{
	struct llm_gvocab *v = NULL;
	env->gvocab = NULL;
	env->defaults.grammar = NULL;
	if (env->tk)
		LLM_TRY(llm_gvocab_tokenizer(&v, env->tk, llm_tokenizer_n_vocab(env->tk)));
	env->gvocab = v;
	const char *path = json_schema ? json_schema : grammar;
	if (!path)
		return LLM_OK;
	if (json_schema && grammar)
		return llm_fail(LLM_ERR_USAGE, "--json-schema and --grammar: give one of them");
	if (!v)
		return llm_fail(LLM_ERR_USAGE, "%s: structured output needs the model's tokenizer files", path);
	char *text = NULL;
	size_t len;
	struct llm_buf b = { 0 };
	LLM_TRY(llm_read_file(path, &text, &len));   /* its message names the file */
	enum llm_status s = LLM_OK;
	if (json_schema) {
		json_error_t e;
		json_t *o = json_loadb(text, len, JSON_DECODE_ANY, &e);
		s = o ? llm_guide_json_schema(o, &b) : llm_fail(LLM_ERR_USAGE, "line %d: not JSON: %s", e.line, e.text);
		json_decref(o);
	} else {
		s = llm_buf_append(&b, text, len);
	}
	if (!s)
		s = llm_grammar_compile(&env->defaults.grammar, b.p ? b.p : "", b.len, v);
	free(text);
	llm_buf_free(&b);
	if (s)
		llm_fail_prefix(s, "%s", path);
	return s;
}

void llm_api_env_guide_free(struct llm_api_env *env)
{
	llm_grammar_unref(env->defaults.grammar);
	llm_gvocab_free(env->gvocab);
	env->defaults.grammar = NULL;
	env->gvocab = NULL;
	free(env->own_lora);
	env->own_lora = NULL;
	env->adapters = NULL;
	env->n_adapters = 0;
}
