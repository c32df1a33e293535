/* tests/test_request.c: request.c, the one parser of llm-serve's OpenAI and
 * TGI bodies and llm-generate's JSONL lines, fed JSON strings (no server,
 * no model: the stories260K tokenizer only).
 *
 * Every field: its types, its range, its default, and the error text,
 * which names the field and is the same in every kind of body that has
 * the field; the rules where the two tools used to differ (temperature
 * above 2, more than LLM_MAX_STOP stop strings, top_k -1, max_tokens 0,
 * echo / best_of / n in a JSONL line). */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "llm.h"
#include "apis.h"

static struct llm_tokenizer *tk;
static const char *tmpl = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}"
                          "{% if add_generation_prompt %}<assistant>{% endif %}";

static const char *kind_name[] = { "completion", "chat", "tgi", "jsonl", "responses", "messages", "count_tokens" };

static struct llm_api_env env_of(int n_ctx, int max_n)
{
	struct llm_api_env e = { .defaults = LLM_SAMPLE_DEFAULT, .tk = tk, .chat_template = tmpl,
	                         .n_vocab = 512, .n_ctx = n_ctx, .max_n = max_n };
	e.defaults.seed = 99;
	return e;
}

/* Parse BODY; on a parse error of the JSON itself the test fails. */
static enum llm_status parse_env(enum llm_api_kind k, const char *body, const struct llm_api_env *env,
                                 struct llm_api_req *r)
{
	json_error_t je;
	json_t *o = json_loads(body, 0, &je);
	if (!o) {
		check(0, "test body is JSON: %s: %s", body, je.text);
		memset(r, 0, sizeof *r);
		return LLM_ERR_INTERNAL;
	}
	enum llm_status s = llm_api_req_parse(r, k, o, env);
	json_decref(o);
	return s;
}

static enum llm_status parse(enum llm_api_kind k, const char *body, struct llm_api_req *r)
{
	struct llm_api_env e = env_of(0, LLM_MAX_N);
	return parse_env(k, body, &e, r);
}

/* BODY must be refused with LLM_ERR_USAGE (or WANT_ST), R->param PARAM and
 * the message MSG exactly. */
static void refused_st(enum llm_api_kind k, const char *body, enum llm_status want_st, const char *param,
                       const char *msg)
{
	struct llm_api_req r;
	enum llm_status s = parse(k, body, &r);
	int ok = s == want_st && !strcmp(r.param, param) && !strcmp(llm_errmsg(), msg);
	if (!check(ok, "%s %s: refused: %s", kind_name[k], body, msg))
		check_diag("status %d, param '%s', message '%s'", s, r.param, s ? llm_errmsg() : "");
	if (!s)
		llm_api_req_free(&r);
}

static void refused(enum llm_api_kind k, const char *body, const char *param, const char *msg)
{
	refused_st(k, body, LLM_ERR_USAGE, param, msg);
}

/* BODY for kind K: the sampling FIELDS (a JSON fragment "\"k\": v, ...")
 * where kind K puts them, with a prompt. */
static void body_of(char *out, size_t n, enum llm_api_kind k, const char *fields)
{
	const char *sep = *fields ? ", " : "";
	switch (k) {
	case LLM_API_COMPLETION:
	case LLM_API_JSONL:
		snprintf(out, n, "{\"prompt\": \"Once upon a time\"%s%s}", sep, fields);
		break;
	case LLM_API_CHAT:
		snprintf(out, n, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]%s%s}", sep, fields);
		break;
	case LLM_API_TGI:
		snprintf(out, n, "{\"inputs\": \"Once upon a time\", \"parameters\": {%s}}", fields);
		break;
	case LLM_API_RESPONSES:
		snprintf(out, n, "{\"input\": \"hi\"%s%s}", sep, fields);
		break;
	case LLM_API_MESSAGES:
	case LLM_API_MESSAGES_COUNT:
		snprintf(out, n, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 9%s%s}", sep,
		         fields);
		break;
	}
}

/* The sampling rules: one behaviour and one message in every kind. */
static void sampling_rules(void)
{
	static const struct { const char *fields, *param, *msg; } bad[] = {
		{ "\"temperature\": 101", "temperature", "temperature: 101 is out of range [0, 100]" },
		{ "\"temperature\": -0.5", "temperature", "temperature: -0.5 is out of range [0, 100]" },
		{ "\"temperature\": \"hot\"", "temperature", "temperature: expected a number, got a string" },
		{ "\"top_p\": 0", "top_p", "top_p: 0 is out of range (0, 1]" },
		{ "\"top_p\": 1.5", "top_p", "top_p: 1.5 is out of range (0, 1]" },
		{ "\"top_k\": -2", "top_k", "top_k: -2 is out of range [-1, 1073741824]" },
		{ "\"top_k\": 2.5", "top_k", "top_k: expected an integer" },
		{ "\"min_p\": 1.1", "min_p", "min_p: 1.1 is out of range [0, 1]" },
		{ "\"repetition_penalty\": 0", "repetition_penalty", "repetition_penalty: 0 is out of range (0, 100]" },
		{ "\"frequency_penalty\": 2.5", "frequency_penalty", "frequency_penalty: 2.5 is out of range [-2, 2]" },
		{ "\"presence_penalty\": -3", "presence_penalty", "presence_penalty: -3 is out of range [-2, 2]" },
		{ "\"seed\": \"7\"", "seed", "seed: expected an integer" },
		{ "\"min_tokens\": -1", "min_tokens", "min_tokens: -1 is out of range [0, 2147483647]" },
		{ "\"ignore_eos\": 1", "ignore_eos", "ignore_eos: expected true or false" },
		{ "\"stop\": 5", "stop", "stop: expected a string or an array of strings" },
		{ "\"stop\": [\"a\", \"\"]", "stop", "stop: expected non-empty strings" },
		{ "\"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\",\"9\"]", "stop", "stop: 9 stop strings, at most 8" },
		{ "\"stop_token_ids\": [512]", "stop_token_ids", "stop_token_ids: element 0 is not a token id in [0, 512)" },
		{ "\"stop_token_ids\": 3", "stop_token_ids", "stop_token_ids: expected an array of token ids" },
		{ "\"logit_bias\": {\"x\": 1}", "logit_bias", "logit_bias: key 'x' is not a token id in [0, 512)" },
		{ "\"logit_bias\": {\"400\": 101}", "logit_bias", "logit_bias: token 400: expected a number in [-100, 100]" },
		{ "\"min_tokens\": 9, \"max_tokens\": 8, \"max_new_tokens\": 8", "min_tokens", NULL },
	};
	char body[512];
	for (int k = 0; k <= LLM_API_JSONL; k++)
		for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
			body_of(body, sizeof body, (enum llm_api_kind)k, bad[i].fields);
			char msg[200];
			if (!bad[i].msg)   /* the limit is named as the kind names it */
				snprintf(msg, sizeof msg, "min_tokens: 9 exceeds %s 8", k == LLM_API_TGI ? "max_new_tokens" : "max_tokens");
			else               /* TGI's seed may be any number */
				snprintf(msg, sizeof msg, "%s", !strcmp(bad[i].param, "seed") && k == LLM_API_TGI ?
				         "seed: expected a number" : bad[i].msg);
			refused((enum llm_api_kind)k, body, bad[i].param, msg);
		}
	/* accepted everywhere, with one meaning */
	for (int k = 0; k <= LLM_API_JSONL; k++) {
		struct llm_api_req r;
		body_of(body, sizeof body, (enum llm_api_kind)k,
		        "\"temperature\": 7, \"top_p\": 0.5, \"top_k\": -1, \"min_p\": 0.1, \"repetition_penalty\": 1.5, "
		        "\"frequency_penalty\": -2, \"presence_penalty\": 2, \"seed\": -5, \"min_tokens\": 2, "
		        "\"ignore_eos\": true, \"stop\": [\"1\",\"2\",\"3\",\"4\",\"5\",\"6\",\"7\",\"8\"], "
		        "\"stop_token_ids\": [5, 511], \"logit_bias\": {\"400\": -100, \"3\": 2.5}");
		enum llm_status s = parse((enum llm_api_kind)k, body, &r);
		const struct llm_sample_params *p = &r.p;
		int ok = !s && p->temperature == 7 && p->top_p == 0.5f && p->top_k == 0 && p->min_p == 0.1f &&
		         p->repetition_penalty == 1.5f && p->frequency_penalty == -2 && p->presence_penalty == 2 &&
		         p->seed == (uint64_t)-5 && p->min_tokens == 2 && p->ignore_eos == 1 && p->n_stop == 8 &&
		         !strcmp(p->stop[7], "8") && p->n_stop_ids == 2 && p->stop_ids[1] == 511 && p->n_bias == 2;
		for (int i = 0; ok && i < p->n_bias; i++)
			ok = (p->bias[i].id == 400 && p->bias[i].bias == -100) || (p->bias[i].id == 3 && p->bias[i].bias == 2.5f);
		if (!check(ok, "%s: every sampling field in range is taken (temperature 7, 8 stop strings, top_k -1: off, "
		           "a negative seed)", kind_name[k]))
			check_diag("%s", s ? llm_errmsg() : "wrong values");
		if (!s)
			llm_api_req_free(&r);
		/* a single stop string, and top_k 0 */
		body_of(body, sizeof body, (enum llm_api_kind)k, "\"stop\": \"end\", \"top_k\": 0");
		s = parse((enum llm_api_kind)k, body, &r);
		check(!s && r.p.n_stop == 1 && !strcmp(r.p.stop[0], "end") && r.p.top_k == 0, "%s: stop as one string",
		      kind_name[k]);
		if (!s)
			llm_api_req_free(&r);
	}
}

/* The seed, one rule everywhere: an integer modulo 2^64 (-1 is 2^64 - 1);
 * /generate also takes other numbers (TGI clients send random() floats):
 * an integral value as that integer, another as its IEEE-754 bits. */
static void seed_rule(void)
{
	static const struct { const char *json; uint64_t want; } any[] = {
		{ "0", 0 }, { "7", 7 }, { "9223372036854775807", 9223372036854775807ull },
		{ "-1", 18446744073709551615ull }, { "-3", 18446744073709551613ull },
		{ "-9223372036854775808", 9223372036854775808ull },
	};
	static const struct { const char *json; uint64_t want; } tgi[] = {
		{ "0.5", 0x3fe0000000000000ull }, { "0.25", 0x3fd0000000000000ull },
		{ "0.7364712141640124", 0x3fe7912c1468f47eull }, { "3.0", 3 }, { "-1.0", 18446744073709551615ull },
		{ "1e19", 0x43e158e460913d00ull }, { "-2.5", 0xc004000000000000ull },
	};
	char body[256], f[128];
	struct llm_api_req r;
	enum llm_status s;
	for (int k = 0; k <= LLM_API_JSONL; k++) {
		for (size_t i = 0; i < sizeof any / sizeof *any; i++) {
			snprintf(f, sizeof f, "\"seed\": %s", any[i].json);
			body_of(body, sizeof body, (enum llm_api_kind)k, f);
			s = parse((enum llm_api_kind)k, body, &r);
			if (!check(!s && r.p.seed == any[i].want, "%s: seed %s is %llu", kind_name[k], any[i].json,
			           (unsigned long long)any[i].want))
				check_diag("%s", s ? llm_errmsg() : "another seed");
			if (!s)
				llm_api_req_free(&r);
		}
		for (size_t i = 0; i < sizeof tgi / sizeof *tgi; i++) {
			snprintf(f, sizeof f, "\"seed\": %s", tgi[i].json);
			body_of(body, sizeof body, (enum llm_api_kind)k, f);
			if (k != LLM_API_TGI) {
				refused((enum llm_api_kind)k, body, "seed", "seed: expected an integer");
				continue;
			}
			s = parse(LLM_API_TGI, body, &r);
			if (!check(!s && r.p.seed == tgi[i].want, "tgi: seed %s is %#llx", tgi[i].json,
			           (unsigned long long)tgi[i].want))
				check_diag("%s", s ? llm_errmsg() : "another seed");
			if (!s)
				llm_api_req_free(&r);
		}
	}
}

/* Defaults: absent and null fields keep the environment's. */
static void defaults(void)
{
	struct llm_api_env e = env_of(0, LLM_MAX_N);
	e.defaults.temperature = 0.8f;
	e.defaults.top_k = 40;
	e.defaults.max_tokens = 128;
	const char *stops[] = { "flag" };
	e.defaults.stop[0] = stops[0];
	e.defaults.n_stop = 1;
	struct llm_api_req r;
	enum llm_status s = parse_env(LLM_API_JSONL, "{\"prompt\": \"a\", \"temperature\": null, \"stop\": null}", &e, &r);
	check(!s && r.p.temperature == 0.8f && r.p.top_k == 40 && r.p.max_tokens == 128 && r.p.seed == 99 &&
	      r.p.n_stop == 1 && r.p.stop[0] == stops[0] && r.n == 1, "jsonl: absent and null fields keep the defaults");
	if (!s)
		llm_api_req_free(&r);
	s = parse_env(LLM_API_JSONL, "{\"prompt\": \"a\", \"stop\": [\"x\"]}", &e, &r);
	check(!s && r.p.n_stop == 1 && !strcmp(r.p.stop[0], "x") && r.stops[0] == r.p.stop[0],
	      "jsonl: a line's stop replaces the flag's (and is owned)");
	if (!s)
		llm_api_req_free(&r);
	/* no body: the defaults alone, checked */
	e.defaults.min_tokens = 200;
	s = llm_api_req_parse(&r, LLM_API_JSONL, NULL, &e);
	check(s == LLM_ERR_USAGE && !strcmp(llm_errmsg(), "min_tokens: 200 exceeds max_tokens 128"),
	      "no body: the defaults are checked (min_tokens above max_tokens)");
	e.defaults.min_tokens = 0;
	s = llm_api_req_parse(&r, LLM_API_JSONL, NULL, &e);
	int ok = !s;
	if (!s)
		s = llm_api_req_prompt_text(&r, &e, "prompt", "Once upon a time", 16, 1);
	int32_t *ids;
	size_t n;
	llm_tokenizer_encode(tk, "Once upon a time", 16, true, &ids, &n);
	check(ok && !s && r.n_prompt == (int)n && !memcmp(r.prompt, ids, n * sizeof *ids),
	      "a text prompt (a plain line): tokenized with BOS");
	free(ids);
	llm_api_req_free(&r);
	s = llm_api_req_parse(&r, LLM_API_JSONL, NULL, &e);
	enum llm_status s2 = llm_api_req_prompt_text(&r, &e, "prompt", "", 0, 0);
	check(!s && s2 == LLM_ERR_USAGE && !strcmp(llm_errmsg(), "prompt: empty after tokenization"),
	      "an empty text prompt is refused (as vLLM)");
	llm_api_req_free(&r);
	/* TGI: max_new_tokens 20 and greedy unless asked to sample */
	s = parse(LLM_API_TGI, "{\"inputs\": \"a\"}", &r);
	check(!s && r.p.max_tokens == 20 && r.p.temperature == 0 && r.n == 1, "tgi: 20 new tokens, greedy by default");
	llm_api_req_free(&r);
	s = parse(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"do_sample\": true}}", &r);
	check(!s && r.p.temperature == 1, "tgi: do_sample samples at temperature 1");
	llm_api_req_free(&r);
	s = parse(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"temperature\": 0.5, \"seed\": 3}}", &r);
	check(!s && r.p.temperature == 0.5f && r.p.seed == 3, "tgi: a temperature above 0 samples");
	llm_api_req_free(&r);
	s = parse(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": null}", &r);
	check(!s, "tgi: parameters null");
	llm_api_req_free(&r);
}

/* The prompt forms of each kind. */
static void prompts(void)
{
	struct llm_api_req r;
	int32_t *ids;
	size_t n;
	llm_tokenizer_encode(tk, "Once upon a time", 16, true, &ids, &n);
	const char *same[] = { "{\"prompt\": \"Once upon a time\"}", "{\"prompt\": [\"Once upon a time\"]}" };
	for (int i = 0; i < 2; i++)
		for (int k = 0; k <= LLM_API_JSONL; k += LLM_API_JSONL) {
			enum llm_status s = parse((enum llm_api_kind)k, same[i], &r);
			check(!s && r.n_prompt == (int)n && !memcmp(r.prompt, ids, n * sizeof *ids), "%s %s: tokenized with BOS",
			      kind_name[k], same[i]);
			if (!s)
				llm_api_req_free(&r);
		}
	enum llm_status s = parse(LLM_API_TGI, "{\"inputs\": \"Once upon a time\"}", &r);
	check(!s && r.n_prompt == (int)n && !memcmp(r.prompt, ids, n * sizeof *ids) && !r.inputs,
	      "tgi inputs: tokenized with BOS");
	llm_api_req_free(&r);
	s = parse(LLM_API_TGI, "{\"inputs\": \"Once upon a time\", \"parameters\": {\"truncate\": 2, \"return_full_text\": true, "
	          "\"details\": true}}", &r);
	check(!s && r.n_prompt == 2 && r.prompt[0] == ids[n - 2] && r.prompt[1] == ids[n - 1] && r.full_text && r.details &&
	      r.inputs && !strcmp(r.inputs, "Once upon a time"), "tgi truncate: the last tokens; return_full_text keeps inputs");
	llm_api_req_free(&r);
	free(ids);
	s = parse(LLM_API_COMPLETION, "{\"prompt\": [1, 2, 511]}", &r);
	check(!s && r.n_prompt == 3 && r.prompt[2] == 511, "completion: token ids as they are");
	llm_api_req_free(&r);
	s = parse(LLM_API_JSONL, "{\"prompt_ids\": [1, 2, 511], \"prompt\": \"ignored\"}", &r);
	check(!s && r.n_prompt == 3 && r.prompt[2] == 511, "jsonl: prompt_ids first, as they are");
	llm_api_req_free(&r);
	refused(LLM_API_COMPLETION, "{\"prompt\": [1, 512]}", "prompt", "prompt: element 1 is not a token id in [0, 512)");
	refused(LLM_API_COMPLETION, "{\"prompt\": [\"a\", \"b\"]}", "prompt",
	        "prompt: element 0 is not a token id in [0, 512) (one prompt per request)");
	refused(LLM_API_COMPLETION, "{\"prompt\": []}", "prompt", "prompt: expected a string or a non-empty array of token ids");
	refused(LLM_API_COMPLETION, "{}", "prompt", "prompt: expected a string or a non-empty array of token ids");
	refused(LLM_API_JSONL, "{\"prompt\": 5}", "prompt", "prompt: expected a string or a non-empty array of token ids");
	refused(LLM_API_JSONL, "{\"prompt_ids\": []}", "prompt_ids", "prompt_ids: empty");
	refused(LLM_API_JSONL, "{\"prompt_ids\": [-1]}", "prompt_ids", "prompt_ids: element 0 is not a token id in [0, 512)");
	refused(LLM_API_JSONL, "{\"prompt_ids\": \"1 2\"}", "prompt_ids", "prompt_ids: expected an array of token ids");
	refused(LLM_API_JSONL, "{\"max_tokens\": 3}", "prompt",
	        "prompt: needs \"prompt\" (a string), \"prompt_ids\" or \"messages\" (arrays)");
	refused(LLM_API_TGI, "{\"inputs\": 5}", "inputs", "inputs: expected a string");
	refused(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": 3}", "parameters", "parameters: expected an object");
	refused(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"truncate\": 0}}", "truncate",
	        "truncate: 0 is out of range [1, 2147483647]");
	refused(LLM_API_COMPLETION, "[1]", "body", "body: expected a JSON object");
	/* chat: the template's text, tokenized without special tokens */
	const char *want = "<system>Be brief<user>Tell me a story<assistant>";
	llm_tokenizer_encode(tk, want, strlen(want), false, &ids, &n);
	const char *msgs = "\"messages\": [{\"role\": \"system\", \"content\": \"Be brief\"}, "
	                   "{\"role\": \"user\", \"content\": \"Tell me a story\"}]";
	char body[400];
	for (int k = LLM_API_CHAT; k <= LLM_API_JSONL; k += LLM_API_JSONL - LLM_API_CHAT) {
		snprintf(body, sizeof body, "{%s}", msgs);
		s = parse((enum llm_api_kind)k, body, &r);
		check(!s && r.n_prompt == (int)n && !memcmp(r.prompt, ids, n * sizeof *ids),
		      "%s messages: the template's text, no BOS added", kind_name[k]);
		if (!s)
			llm_api_req_free(&r);
		refused((enum llm_api_kind)k, "{\"messages\": [{\"content\": \"hi\"}]}", "messages",
		        "messages: message 0: expected {\"role\": string, \"content\": string}");
		refused((enum llm_api_kind)k, "{\"messages\": [], \"prompt_ids\": null}", "messages",
		        "messages: expected a non-empty array of messages");
		snprintf(body, sizeof body, "{%s, \"chat_template_kwargs\": 1}", msgs);
		refused((enum llm_api_kind)k, body, "chat_template_kwargs", "chat_template_kwargs: expected an object");
		snprintf(body, sizeof body, "{%s, \"tools\": {}}", msgs);
		refused((enum llm_api_kind)k, body, "tools", "tools: expected an array");
	}
	free(ids);
	/* chat_template_kwargs reach the template, in both kinds */
	struct llm_api_env e = env_of(0, 1);
	e.chat_template = "{{ greeting }}";
	llm_tokenizer_encode(tk, "Hello there", 11, false, &ids, &n);
	for (int k = LLM_API_CHAT; k <= LLM_API_JSONL; k += LLM_API_JSONL - LLM_API_CHAT) {
		s = parse_env((enum llm_api_kind)k, "{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], "
		              "\"chat_template_kwargs\": {\"greeting\": \"Hello there\"}}", &e, &r);
		check(!s && r.n_prompt == (int)n && !memcmp(r.prompt, ids, n * sizeof *ids),
		      "%s: chat_template_kwargs reach the template", kind_name[k]);
		if (!s)
			llm_api_req_free(&r);
	}
	free(ids);
	/* no tokenizer: token ids only */
	e = env_of(0, 1);
	e.tk = NULL;
	s = parse_env(LLM_API_JSONL, "{\"prompt_ids\": [1, 2]}", &e, &r);
	check(!s && r.n_prompt == 2, "no tokenizer: prompt_ids still work");
	llm_api_req_free(&r);
	s = parse_env(LLM_API_JSONL, "{\"prompt\": \"a\"}", &e, &r);
	check(s == LLM_ERR_USAGE && !strcmp(r.param, "prompt") &&
	      !strcmp(llm_errmsg(), "prompt: the model has no tokenizer files: only token ids can be given"),
	      "no tokenizer: a text prompt is refused naming the field");
}

/* max_tokens, its names per kind and the context. */
static void lengths(void)
{
	static const struct { int kind; const char *body, *param, *msg; } bad[] = {
		{ LLM_API_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": 0}", "max_tokens", "max_tokens: 0 is out of range [1, 2147483647]" },
		{ LLM_API_JSONL, "{\"prompt\": \"a\", \"max_tokens\": 0}", "max_tokens", "max_tokens: 0 is out of range [1, 2147483647]" },
		{ LLM_API_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": \"ten\"}", "max_tokens", "max_tokens: expected an integer" },
		{ LLM_API_JSONL, "{\"prompt\": \"a\", \"max_tokens\": \"ten\"}", "max_tokens", "max_tokens: expected an integer" },
		{ LLM_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"max_completion_tokens\": 0}",
		  "max_completion_tokens", "max_completion_tokens: 0 is out of range [1, 2147483647]" },
		{ LLM_API_JSONL, "{\"prompt\": \"a\", \"max_completion_tokens\": -4}",
		  "max_completion_tokens", "max_completion_tokens: -4 is out of range [1, 2147483647]" },
		{ LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"max_new_tokens\": 0}}",
		  "max_new_tokens", "max_new_tokens: 0 is out of range [1, 2147483647]" },
		{ LLM_API_COMPLETION, "{\"prompt\": \"a\", \"max_tokens\": 2147483648}", "max_tokens",
		  "max_tokens: 2147483648 is out of range [1, 2147483647]" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
		refused((enum llm_api_kind)bad[i].kind, bad[i].body, bad[i].param, bad[i].msg);
	struct llm_api_env e = env_of(64, LLM_MAX_N);
	struct llm_api_req r;
	enum llm_status s = parse_env(LLM_API_COMPLETION, "{\"prompt\": [1, 2, 3, 4, 5], \"max_tokens\": 60}", &e, &r);
	check(s == LLM_ERR_USAGE && !strcmp(r.param, "max_tokens") &&
	      !strcmp(llm_errmsg(), "max_tokens: prompt of 5 tokens + max_tokens 60 exceeds the context of 64 tokens"),
	      "the context: prompt + max_tokens, with the numbers");
	s = parse_env(LLM_API_COMPLETION, "{\"prompt\": [1, 2, 3, 4, 5], \"max_tokens\": 59}", &e, &r);
	check(!s && r.p.max_tokens == 59, "the context: prompt + max_tokens equal to it is taken");
	llm_api_req_free(&r);
	s = parse_env(LLM_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]}", &e, &r);
	int np = r.n_prompt;
	check(!s && r.p.max_tokens == 64 - np, "chat: no max_tokens: up to the context");
	llm_api_req_free(&r);
	s = parse_env(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"max_new_tokens\": 70}}", &e, &r);
	check(s == LLM_ERR_USAGE && !strcmp(r.param, "max_new_tokens") && strstr(llm_errmsg(), "+ max_new_tokens 70 exceeds"),
	      "tgi: the context names max_new_tokens");
	s = parse(LLM_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"max_completion_tokens\": 7, "
	          "\"max_tokens\": 9}", &r);
	check(!s && r.p.max_tokens == 7, "chat: max_completion_tokens over max_tokens");
	llm_api_req_free(&r);
}

/* The OpenAI fields beyond sampling, and log-probs per kind. */
static void openai_fields(void)
{
	struct llm_api_req r;
	enum llm_status s = parse(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"n\": 3, \"best_of\": 3, \"stream\": true, "
	                          "\"stream_options\": {\"include_usage\": true}, \"echo\": false, \"suffix\": \"\", "
	                          "\"response_format\": {\"type\": \"text\"}, \"model\": \"whatever\"}", &r);
	check(!s && r.n == 3 && r.stream && r.include_usage, "completion: n, best_of = n, stream, include_usage, defaults");
	llm_api_req_free(&r);
	refused(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"n\": 17}", "n", "n: 17 is out of range [1, 16]");
	refused(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"stream\": \"yes\"}", "stream", "stream: expected true or false");
	refused(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"stream_options\": 1}", "stream_options",
	        "stream_options: expected an object");
	s = parse(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"echo\": true, \"prompt_logprobs\": 2}", &r);
	check(!s && r.echo && r.prompt_logprobs == 2, "completion: echo, prompt_logprobs 2");
	llm_api_req_free(&r);
	s = parse(LLM_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"prompt_logprobs\": null}", &r);
	check(s || (!r.echo && r.prompt_logprobs == -1), "chat: prompt_logprobs null is none");
	llm_api_req_free(&r);
	s = parse(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"n\": 2, \"best_of\": 5}", &r);
	check(!s && r.n == 2 && r.best_of == 5, "completion: best_of 5 for n 2");
	llm_api_req_free(&r);
	refused(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"n\": 3, \"best_of\": 2}", "best_of",
	        "best_of: 2 is out of range [3, 16]");
	refused(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"best_of\": 2, \"stream\": true}", "best_of",
	        "best_of: 2 > n: not with stream (the best are known at the end)");
	refused(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"prompt_logprobs\": 21}", "prompt_logprobs",
	        "prompt_logprobs: 21 is out of range [0, 20]");
	refused(LLM_API_JSONL, "{\"prompt\": \"a\", \"echo\": true}", "echo", "echo: not a JSONL field (llm-generate --echo)");
	refused(LLM_API_JSONL, "{\"prompt\": \"a\", \"prompt_logprobs\": 1}", "prompt_logprobs",
	        "prompt_logprobs: not a JSONL field (llm-generate --score scores prompts)");
	refused(LLM_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], \"echo\": true}", "echo",
	        "echo: not supported in chat (a completions field)");
	for (int k = 0; k <= LLM_API_JSONL; k += LLM_API_JSONL) {
		if (k == LLM_API_JSONL)
			refused((enum llm_api_kind)k, "{\"prompt\": \"a\", \"best_of\": 2}", "best_of",
			        "best_of: not supported: only best_of = n");
		refused((enum llm_api_kind)k, "{\"prompt\": \"a\", \"response_format\": {\"type\": \"json_object\"}}",
		        "response_format", "response_format: structured output needs the model's tokenizer files");
		refused((enum llm_api_kind)k, "{\"prompt\": \"a\", \"model\": 5}", "model", "model: expected a string");
	}
	/* llm-generate makes one completion per line */
	struct llm_api_env e = env_of(0, 1);
	s = parse_env(LLM_API_JSONL, "{\"prompt\": \"a\", \"n\": 2}", &e, &r);
	check(s == LLM_ERR_USAGE && !strcmp(llm_errmsg(), "n: 2 is out of range [1, 1]"), "jsonl (max_n 1): n 2 refused");
	s = parse_env(LLM_API_JSONL, "{\"prompt\": \"a\", \"n\": 1, \"stream\": \"x\"}", &e, &r);
	check(!s && r.n == 1, "jsonl: n 1 taken; stream is not a JSONL field");
	llm_api_req_free(&r);
	/* the model named must be the server's */
	e.model_name = "stories";
	s = parse_env(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"model\": \"gpt\"}", &e, &r);
	check(s == LLM_ERR_UNSUPPORTED && !strcmp(r.param, "model") &&
	      !strcmp(llm_errmsg(), "model: the model 'gpt' does not exist (this server has 'stories')"),
	      "another model: LLM_ERR_UNSUPPORTED (404) naming it");
	s = parse_env(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"model\": \"stories\"}", &e, &r);
	check(!s, "the server's model is taken");
	llm_api_req_free(&r);
	/* any_model (llm-serve without adapters): any name is the base; an
	 * adapter_id still has to name an adapter */
	e.any_model = 1;
	s = parse_env(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"model\": \"http://127.0.0.1:8000\"}", &e, &r);
	check(!s && r.adapter == 0, "any_model: a URL as the model (InferenceClient with endpointUrl) is the base");
	llm_api_req_free(&r);
	s = parse_env(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"adapter_id\": \"x\"}}", &e, &r);
	check(s == LLM_ERR_UNSUPPORTED && !strcmp(r.param, "adapter_id"), "any_model: an unknown adapter_id is still 404");
	e.any_model = 0;
	/* LoRA adapters by slot - 1 (slot 2 free): "model" or TGI "adapter_id" picks one */
	refused_st(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"adapter_id\": \"x\"}}", LLM_ERR_UNSUPPORTED,
	           "adapter_id", "adapter_id: the adapter 'x' does not exist (this server has no LoRA adapters)");
	static const char *const ad[] = { "a1", NULL, "b" };
	e.adapters = ad;
	e.n_adapters = 3;
	s = parse_env(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"model\": \"b\"}", &e, &r);
	check(!s && r.adapter == 3, "model 'b' picks slot 3");
	llm_api_req_free(&r);
	s = parse_env(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"adapter_id\": \"a1\"}}", &e, &r);
	check(!s && r.adapter == 1, "tgi adapter_id 'a1' picks slot 1");
	llm_api_req_free(&r);
	e.adapter = 1;
	s = parse_env(LLM_API_JSONL, "{\"prompt\": \"a\"}", &e, &r);
	check(!s && r.adapter == 1, "jsonl: no model, the env's default adapter");
	llm_api_req_free(&r);
	s = parse_env(LLM_API_JSONL, "{\"prompt\": \"a\", \"model\": \"stories\"}", &e, &r);
	check(!s && r.adapter == 0, "jsonl: the model's name picks the base over the default adapter");
	llm_api_req_free(&r);
	s = parse_env(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"model\": \"c\"}", &e, &r);
	check(s == LLM_ERR_UNSUPPORTED && !strcmp(r.param, "model") &&
	      !strcmp(llm_errmsg(), "model: the model 'c' does not exist (this server has 'stories' and the LoRA adapters "
	              "'a1', 'b')"), "an unknown adapter: LLM_ERR_UNSUPPORTED (404) listing the adapters");
	e.adapters = NULL, e.n_adapters = 0, e.adapter = 0;
	llm_api_req_free(&r);
	/* log-probs */
	s = parse(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": 3}", &r);
	check(!s && r.logprobs && r.p.n_logprobs == 3, "completion logprobs 3");
	llm_api_req_free(&r);
	s = parse(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": 0}", &r);
	check(!s && r.logprobs && r.p.n_logprobs == 0, "completion logprobs 0: the chosen tokens' only");
	llm_api_req_free(&r);
	refused(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": true}", "logprobs", "logprobs: expected an integer in [0, 20]");
	refused(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"logprobs\": 21}", "logprobs", "logprobs: 21 is out of range [0, 20]");
	const char *m = "\"messages\": [{\"role\": \"user\", \"content\": \"a\"}]";
	char body[300];
	snprintf(body, sizeof body, "{%s, \"logprobs\": true, \"top_logprobs\": 2}", m);
	s = parse(LLM_API_CHAT, body, &r);
	check(!s && r.logprobs && r.p.n_logprobs == 2, "chat logprobs true, top_logprobs 2");
	llm_api_req_free(&r);
	snprintf(body, sizeof body, "{%s, \"top_logprobs\": 2}", m);
	refused(LLM_API_CHAT, body, "top_logprobs", "top_logprobs: needs logprobs: true");
	snprintf(body, sizeof body, "{%s, \"logprobs\": 2}", m);
	refused(LLM_API_CHAT, body, "logprobs", "logprobs: expected true or false");
	snprintf(body, sizeof body, "{%s, \"logprobs\": true, \"top_logprobs\": 21}", m);
	refused(LLM_API_CHAT, body, "top_logprobs", "top_logprobs: 21 is out of range [0, 20]");
	s = parse(LLM_API_JSONL, "{\"prompt\": \"a\", \"logprobs\": true}", &r);
	check(!s && r.p.n_logprobs == 1, "jsonl logprobs true: one top entry");
	llm_api_req_free(&r);
	s = parse(LLM_API_JSONL, "{\"prompt\": \"a\", \"logprobs\": 4}", &r);
	check(!s && r.p.n_logprobs == 4, "jsonl logprobs 4");
	llm_api_req_free(&r);
	s = parse(LLM_API_JSONL, "{\"prompt\": \"a\", \"top_logprobs\": 5}", &r);
	check(!s && r.p.n_logprobs == 5, "jsonl top_logprobs 5 alone");
	llm_api_req_free(&r);
	refused(LLM_API_JSONL, "{\"prompt\": \"a\", \"logprobs\": \"x\"}", "logprobs",
	        "logprobs: expected true, false or an integer in [0, 20]");
	refused(LLM_API_JSONL, "{\"prompt\": \"a\", \"top_logprobs\": 30}", "top_logprobs", "top_logprobs: 30 is out of range [0, 20]");
	s = parse(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"top_n_tokens\": 3}}", &r);
	check(!s && r.p.n_logprobs == 3, "tgi top_n_tokens 3");
	llm_api_req_free(&r);
	refused(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"top_n_tokens\": 21}}", "top_n_tokens",
	        "top_n_tokens: 21 is out of range [0, 20]");
	static const char *tgi_bad[][2] = {
		{ "\"typical_p\": 0.5", "typical_p: not supported" }, { "\"watermark\": true", "watermark: not supported" },
		{ "\"best_of\": 2", "best_of: not supported: only 1" },
		{ "\"do_sample\": 1", "do_sample: expected true or false" },
		{ "\"grammar\": {\"type\": \"json\", \"value\": {}}", "grammar: structured output needs the model's tokenizer files" },
		{ "\"grammar\": {\"type\": \"xml\", \"value\": {}}", "grammar: expected {\"type\": \"json\" or \"regex\", \"value\": ...}" },
	};
	for (size_t i = 0; i < sizeof tgi_bad / sizeof *tgi_bad; i++) {
		snprintf(body, sizeof body, "{\"inputs\": \"a\", \"parameters\": {%s}}", tgi_bad[i][0]);
		char param[40];
		snprintf(param, sizeof param, "%.*s", (int)(strchr(tgi_bad[i][1], ':') - tgi_bad[i][1]), tgi_bad[i][1]);
		refused(LLM_API_TGI, body, param, tgi_bad[i][1]);
	}
	s = parse(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"typical_p\": 1, \"watermark\": false, \"best_of\": 1, "
	          "\"decoder_input_details\": false}}", &r);
	check(!s, "tgi: the unsupported fields at their defaults are taken");
	llm_api_req_free(&r);
	s = parse(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"details\": true, \"decoder_input_details\": true}}", &r);
	check(!s && r.prefill_details && r.details, "tgi: decoder_input_details");
	llm_api_req_free(&r);
}

/* Fields that would change the answer and are not implemented: refused
 * naming the field unless they ask for the default (issue 23: tools and
 * image parts used to be dropped silently). */
static void unimplemented_fields(void)
{
	static const struct { unsigned kinds; const char *bad, *param, *msg, *dflt; } f[] = {
#define OAI ((1u << LLM_API_COMPLETION) | (1u << LLM_API_CHAT) | (1u << LLM_API_JSONL))
#define CHAT (1u << LLM_API_CHAT)
		{ OAI, "\"use_beam_search\": true", "use_beam_search", "use_beam_search: not supported: no beam search",
		  "\"use_beam_search\": false" },
		{ OAI, "\"include_stop_str_in_output\": true", "include_stop_str_in_output",
		  "include_stop_str_in_output: not supported", "\"include_stop_str_in_output\": false" },
		{ OAI, "\"truncate_prompt_tokens\": 3", "truncate_prompt_tokens", "truncate_prompt_tokens: not supported",
		  "\"truncate_prompt_tokens\": null" },
		{ OAI, "\"allowed_token_ids\": [1]", "allowed_token_ids", "allowed_token_ids: not supported", "\"allowed_token_ids\": null" },
		{ OAI, "\"bad_words\": [\"x\"]", "bad_words", "bad_words: not supported", "\"bad_words\": []" },
		{ OAI, "\"logits_processors\": [\"x\"]", "logits_processors", "logits_processors: not supported", "\"logits_processors\": []" },
		{ OAI, "\"guided_json\": {}", "guided_json", "guided_json: structured output needs the model's tokenizer files",
		  "\"guided_json\": null" },
		{ OAI, "\"structured_outputs\": {}", "structured_outputs",
		  "structured_outputs: not supported: use guided_json, guided_regex, guided_choice or guided_grammar", "" },
		{ OAI, "\"guided_decoding_backend\": \"xgrammar\"", "guided_decoding_backend",
		  "guided_decoding_backend: not supported: one grammar engine", "" },
		{ CHAT, "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", "tools",
		  "tools: this model's chat template has no tool-call format (hermes <tool_call> blocks or Llama 3 JSON); "
		  "tool_choice \"none\" renders the tools without parsing the answer", "\"tools\": []" },
		{ CHAT, "\"tool_choice\": \"required\"", "tool_choice", "tool_choice: required needs tools",
		  "\"tool_choice\": \"none\"" },
		{ CHAT, "\"tool_choice\": {\"type\": \"function\"}", "tool_choice",
		  "tool_choice: named needs tools", "\"tool_choice\": \"auto\"" },
		{ CHAT, "\"functions\": [{\"name\": \"f\"}]", "functions", "functions: not supported: function calling is not implemented",
		  "\"functions\": []" },
		{ CHAT, "\"function_call\": {\"name\": \"f\"}", "function_call",
		  "function_call: not supported: function calling is not implemented", "\"function_call\": \"none\"" },
		{ CHAT, "\"add_generation_prompt\": false", "add_generation_prompt", "add_generation_prompt: not supported",
		  "\"add_generation_prompt\": true" },
		{ CHAT, "\"continue_final_message\": true", "continue_final_message", "continue_final_message: not supported",
		  "\"continue_final_message\": false" },
		{ CHAT, "\"chat_template\": \"{{ x }}\"", "chat_template",
		  "chat_template: not supported: the server's template is used (llm-serve --chat-template)", "" },
		{ CHAT, "\"audio\": {\"voice\": \"x\"}", "audio", "audio: not supported: text output only", "" },
		{ CHAT, "\"modalities\": [\"text\", \"audio\"]", "modalities", "modalities: not supported: text output only",
		  "\"modalities\": [\"text\"]" },
		{ CHAT, "\"reasoning_effort\": \"high\"", "reasoning_effort", "reasoning_effort: not supported", "" },
		{ CHAT, "\"web_search_options\": {}", "web_search_options", "web_search_options: not supported", "" },
		/* taken and ignored: they do not change the answer */
		{ 0, NULL, NULL, NULL, "\"user\": \"u\", \"metadata\": {\"a\": \"b\"}, \"store\": true, "
		  "\"service_tier\": \"auto\", \"prediction\": {\"type\": \"content\", \"content\": \"x\"}, "
		  "\"parallel_tool_calls\": true" },
#undef OAI
#undef CHAT
	};
	char body[600];
	for (int k = 0; k <= LLM_API_JSONL; k++) {
		if (k == LLM_API_TGI)
			continue;
		for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
			struct llm_api_req r;
			if (f[i].kinds & (1u << k)) {
				body_of(body, sizeof body, (enum llm_api_kind)k, f[i].bad);
				refused((enum llm_api_kind)k, body, f[i].param, f[i].msg);
			}
			body_of(body, sizeof body, (enum llm_api_kind)k, f[i].dflt);
			enum llm_status s = parse((enum llm_api_kind)k, body, &r);
			if (!check(!s, "%s %s: taken", kind_name[k], body))
				check_diag("%s", llm_errmsg());
			if (!s)
				llm_api_req_free(&r);
		}
	}
	/* llm-generate's lines still render tools into the prompt (llm-generate(1)) */
	struct llm_api_env e = env_of(0, 1);
	e.chat_template = "{% if tools %}{% for t in tools %}{{ t.function.name }};{% endfor %}{% endif %}{{ messages[0].content }}";
	struct llm_api_req r, r2;
	enum llm_status s = parse_env(LLM_API_JSONL, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], "
	                              "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_time\"}}]}", &e, &r);
	enum llm_status s2 = parse_env(LLM_API_JSONL, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", &e, &r2);
	if (!check(!s && !s2 && r.n_prompt > r2.n_prompt, "jsonl: tools reach the template"))
		check_diag("%d %d %s: %d vs %d tokens", s, s2, llm_errmsg(), r.n_prompt, r2.n_prompt);
	if (!s)
		llm_api_req_free(&r);
	if (!s2)
		llm_api_req_free(&r2);
	/* content parts: text only, in chat and JSONL */
	for (int k = LLM_API_CHAT; k <= LLM_API_JSONL; k += LLM_API_JSONL - LLM_API_CHAT) {
		refused((enum llm_api_kind)k, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"what is\"}, "
		        "{\"type\": \"image_url\", \"image_url\": {\"url\": \"data:image/png;base64,AA==\"}}]}]}", "messages",
		        "messages: message 0: content part 1: type 'image_url' is not supported (text only)");
		refused((enum llm_api_kind)k, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_audio\"}]}]}",
		        "messages", "messages: message 0: content part 0: type 'input_audio' is not supported (text only)");
		refused((enum llm_api_kind)k, "{\"messages\": [{\"role\": \"user\", \"content\": [\"hi\"]}]}", "messages",
		        "messages: message 0: content part 0: expected {\"type\": \"text\", \"text\": string}");
		refused((enum llm_api_kind)k, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\"}]}]}", "messages",
		        "messages: message 0: content part 0: expected {\"type\": \"text\", \"text\": string}");
		s = parse((enum llm_api_kind)k, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"hi\"}]}]}", &r);
		check(!s, "%s: text content parts are taken", kind_name[k]);
		if (!s)
			llm_api_req_free(&r);
	}
}

/* suffix: fill in the middle where the tokenizer has the tokens (qwen3's
 * reference tokenizer), refused naming why where it has not (stories260K). */
static void fill_in_middle(void)
{
	refused(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"suffix\": \"b\"}", "suffix",
	        "suffix: this model has no fill-in-the-middle tokens (<|fim_prefix|>, <|fim_suffix|>, <|fim_middle|> or <fim_...>)");
	struct llm_api_req r;
	enum llm_status s = parse(LLM_API_COMPLETION, "{\"prompt\": \"a\", \"suffix\": \"\"}", &r);
	check(!s, "an empty suffix is no suffix");
	if (!s)
		llm_api_req_free(&r);
	const char *ref = test_ref_dir();
	char dir[4096];
	struct llm_tokenizer *q = NULL;
	snprintf(dir, sizeof dir, "%s/tokenizers/qwen3", ref ? ref : "");
	if (!ref || llm_tokenizer_open(&q, dir)) {
		check_skip("no qwen3 tokenizer in $LLM_TEST_REF/tokenizers", "fill in the middle");
		return;
	}
	struct llm_api_env e = { .defaults = LLM_SAMPLE_DEFAULT, .tk = q, .max_n = 1 };
	s = parse_env(LLM_API_COMPLETION, "{\"prompt\": \"def add(a, b):\\n    \", \"suffix\": \"\\n    return c\\n\"}", &e, &r);
	const char *whole = "<|fim_prefix|>def add(a, b):\n    <|fim_suffix|>\n    return c\n<|fim_middle|>";
	int32_t *ids = NULL;
	size_t n = 0;
	int ok = !s && !llm_tokenizer_encode(q, whole, strlen(whole), true, &ids, &n) && (size_t)r.n_prompt == n &&
	         !memcmp(r.prompt, ids, n * sizeof *ids);
	int32_t pre = llm_tokenizer_find(q, "<|fim_prefix|>"), mid = llm_tokenizer_find(q, "<|fim_middle|>");
	check(ok && n > 3 && r.prompt[0] == pre && r.prompt[n - 1] == mid,
	      "qwen3: the prompt is <|fim_prefix|> prompt <|fim_suffix|> suffix <|fim_middle|> (%zu tokens, first %d, last %d)",
	      n, n ? r.prompt[0] : -1, n ? r.prompt[n - 1] : -1);
	free(ids);
	if (!s)
		llm_api_req_free(&r);
	s = parse_env(LLM_API_COMPLETION, "{\"prompt\": [1, 2], \"suffix\": \"x\"}", &e, &r);
	check(s && !strcmp(r.param, "suffix"), "a suffix with token ids is refused: %s", s ? llm_errmsg() : "taken");
	if (!s)
		llm_api_req_free(&r);
	llm_tokenizer_close(q);
}

/* Structured output: each field compiles into the request's grammar (its
 * sentences checked), one field at most, what is not supported refused
 * by name, and the env's default grammar shared by reference. */
static void structured(void)
{
	struct llm_api_env e = env_of(0, 1);
	struct llm_gvocab *gv = NULL;
	if (!check(!llm_gvocab_tokenizer(&gv, tk, llm_tokenizer_n_vocab(tk)), "the tokenizer's vocabulary for grammars"))
		return;
	e.gvocab = gv;
	static const struct { const char *field, *yes, *no; } ok[] = {
		{ "\"response_format\": {\"type\": \"json_object\"}", "{\"a\":[1,2.5e3,\"x\",null]}", "[1]" },
		{ "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"name\": \"n\", \"schema\": "
		  "{\"type\": \"object\", \"properties\": {\"a\": {\"type\": \"integer\", \"minimum\": 5, \"maximum\": 250}}, "
		  "\"required\": [\"a\"]}}}", "{\"a\":250}", "{\"a\":251}" },
		{ "\"guided_json\": \"{\\\"enum\\\": [\\\"x\\\", 2]}\"", "2", "3" },
		{ "\"guided_regex\": \"(ab|c)+\\\\d{2}\"", "abcab12", "ab1" },
		{ "\"guided_choice\": [\"yes\", \"no\"]", "no", "yes!" },
		{ "\"guided_grammar\": \"root ::= [a-c]{2}\"", "ca", "cad" },
		/* TGI's chat response_format */
		{ "\"response_format\": {\"type\": \"json\", \"value\": {\"type\": \"object\", \"properties\": "
		  "{\"b\": {\"type\": \"boolean\"}}, \"required\": [\"b\"]}}", "{\"b\":true}", "{\"b\":1}" },
		{ "\"response_format\": {\"type\": \"regex\", \"value\": \"[0-9]{3}\"}", "123", "12" },
	};
	char body[800];
	for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
		struct llm_api_req r;
		snprintf(body, sizeof body, "{\"prompt\": \"a\", %s}", ok[i].field);
		enum llm_status s = parse_env(LLM_API_JSONL, body, &e, &r);
		if (s)
			check_diag("%s", llm_errmsg());
		check(!s && r.p.grammar && llm_grammar_match(r.p.grammar, ok[i].yes, strlen(ok[i].yes)) &&
		      !llm_grammar_match(r.p.grammar, ok[i].no, strlen(ok[i].no)),
		      "%s: takes '%s', not '%s'", ok[i].field, ok[i].yes, ok[i].no);
		llm_api_req_free(&r);
	}
	static const struct { enum llm_api_kind k; const char *field, *param, *msg; } bad[] = {
		{ LLM_API_COMPLETION, "\"guided_json\": {\"type\": \"string\", \"format\": \"date\"}", "guided_json",
		  "guided_json: schema: unsupported keyword 'format'" },
		{ LLM_API_CHAT, "\"response_format\": {\"type\": \"json_schema\", \"json_schema\": {\"schema\": {\"properties\": "
		  "{\"a\": {\"type\": \"array\", \"uniqueItems\": true}}}}}", "response_format",
		  "response_format: schema.properties.a: unsupported keyword 'uniqueItems'" },
		{ LLM_API_JSONL, "\"response_format\": {\"type\": \"json_schema\"}", "response_format",
		  "response_format: expected \"json_schema\": {\"name\": ..., \"schema\": {...}}" },
		{ LLM_API_JSONL, "\"response_format\": {\"type\": \"xml\"}", "response_format",
		  "response_format: type 'xml' is not supported (text, json_object, json_schema; TGI's json and regex)" },
		{ LLM_API_CHAT, "\"response_format\": {\"type\": \"regex\", \"value\": 3}", "response_format",
		  "response_format: expected {\"type\": \"regex\", \"value\": a regular expression} (TGI's form)" },
		{ LLM_API_JSONL, "\"guided_regex\": \"(a\"", "guided_regex", "guided_regex: at offset 2: expected ')'" },
		{ LLM_API_JSONL, "\"guided_regex\": \"a\\\\1\"", "guided_regex", "guided_regex: at offset 2: back-references are not supported" },
		{ LLM_API_JSONL, "\"guided_choice\": []", "guided_choice", "guided_choice: expected a non-empty array of strings" },
		{ LLM_API_JSONL, "\"guided_grammar\": \"root ::= x\"", "guided_grammar",
		  "guided_grammar: grammar: line 1: rule 'x' is not defined" },
		{ LLM_API_JSONL, "\"guided_json\": {\"type\": \"integer\", \"minimum\": 3, \"maximum\": 2}", "guided_json",
		  "guided_json: schema: no integer lies between the bounds" },
		{ LLM_API_JSONL, "\"guided_choice\": [\"a\"], \"guided_regex\": \"a\"", "guided_choice",
		  "guided_choice: only one of response_format, guided_json, guided_regex, guided_choice and guided_grammar may be "
		  "given (and guided_regex is)" },
		{ LLM_API_TGI, "\"grammar\": {\"type\": \"regex\", \"value\": 5}", "grammar", "grammar: value: expected a string" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct llm_api_req r;
		if (bad[i].k == LLM_API_TGI)
			snprintf(body, sizeof body, "{\"inputs\": \"a\", \"parameters\": {%s}}", bad[i].field);
		else if (bad[i].k == LLM_API_CHAT)
			snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"a\"}], %s}", bad[i].field);
		else
			snprintf(body, sizeof body, "{\"prompt\": \"a\", %s}", bad[i].field);
		struct llm_api_env eb = e;
		eb.max_n = LLM_MAX_N;
		enum llm_status s = parse_env(bad[i].k, body, &eb, &r);
		if (!check(s == LLM_ERR_USAGE && !strcmp(r.param, bad[i].param) && !strcmp(llm_errmsg(), bad[i].msg),
		           "%s: refused naming %s: %s", kind_name[bad[i].k], bad[i].param, bad[i].msg))
			check_diag("got %d: %s", s, s ? llm_errmsg() : "accepted");
		if (!s)
			llm_api_req_free(&r);
	}
	/* TGI's grammar: a regex */
	struct llm_api_req r;
	enum llm_status s = parse_env(LLM_API_TGI, "{\"inputs\": \"a\", \"parameters\": {\"grammar\": {\"type\": \"regex\", "
	                              "\"value\": \"x+\"}}}", &e, &r);
	check(!s && llm_grammar_match(r.p.grammar, "xx", 2), "tgi: grammar {type: regex}");
	llm_api_req_free(&r);
	/* the default grammar: each request its reference; its own field replaces it */
	struct llm_grammar *g = NULL;
	llm_grammar_compile(&g, "root ::= \"z\"", 12, gv);
	e.defaults.grammar = g;
	struct llm_api_req r1, r2;
	s = parse_env(LLM_API_JSONL, "{\"prompt\": \"a\"}", &e, &r1);
	enum llm_status s2 = parse_env(LLM_API_JSONL, "{\"prompt\": \"a\", \"guided_choice\": [\"q\"]}", &e, &r2);
	check(!s && !s2 && r1.p.grammar == g && r2.p.grammar != g && llm_grammar_match(r2.p.grammar, "q", 1),
	      "the default grammar, or the line's own");
	llm_api_req_free(&r1);
	llm_api_req_free(&r2);
	check(llm_grammar_match(g, "z", 1), "the default outlives its requests");
	llm_grammar_unref(g);
	llm_gvocab_free(gv);
}

/* Tools: the names kept and the template's format for the answer's
 * parse (auto), a grammar that makes the answer one valid call (required,
 * a named function), the refusals. */
/* The Responses and Messages APIs (apis.h): one conversation with a tool
 * round trip in each API's form gives chat's request (the same prompt ids,
 * sampling, tool format and grammar); errors name the API's own fields;
 * the answers' bodies and events. */
static void translated_apis(void)
{
	struct llm_api_env e = env_of(0, 1);
	struct llm_gvocab *gv = NULL;
	if (!check(!llm_gvocab_tokenizer(&gv, tk, llm_tokenizer_n_vocab(tk)), "the tokenizer's vocabulary for grammars"))
		return;
	e.gvocab = gv;
	e.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% if m.tool_calls %}{{ m.tool_calls | tojson }}"
	                  "{% endif %}{% if m.tool_call_id %}[{{ m.tool_call_id }}]{% endif %}{% endfor %}{% if tools %}"
	                  "{{ tools | tojson }} call as <tool_call>{...}</tool_call>{% endif %}<assistant>";
	const char *schema = "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}}";
	char chat[2048], resp[2048], msg[2048];
	snprintf(chat, sizeof chat, "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief\"}, {\"role\": \"user\", "
	         "\"content\": \"Weather?\"}, {\"role\": \"assistant\", \"content\": \"\", \"tool_calls\": [{\"id\": \"c1\", "
	         "\"type\": \"function\", \"function\": {\"name\": \"weather\", \"arguments\": \"{\\\"city\\\":\\\"Oslo\\\"}\"}}]}, "
	         "{\"role\": \"tool\", \"tool_call_id\": \"c1\", \"content\": \"sunny\"}], \"tools\": [{\"type\": \"function\", "
	         "\"function\": {\"name\": \"weather\", \"parameters\": %s}}], \"tool_choice\": \"required\", "
	         "\"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9}", schema);
	snprintf(resp, sizeof resp, "{\"instructions\": \"Be brief\", \"input\": [{\"role\": \"user\", \"content\": "
	         "[{\"type\": \"input_text\", \"text\": \"Weather?\"}]}, {\"type\": \"reasoning\", \"summary\": []}, "
	         "{\"type\": \"function_call\", \"call_id\": \"c1\", \"name\": \"weather\", \"arguments\": "
	         "\"{\\\"city\\\":\\\"Oslo\\\"}\"}, {\"type\": \"function_call_output\", \"call_id\": \"c1\", \"output\": "
	         "\"sunny\"}], \"tools\": [{\"type\": \"function\", \"name\": \"weather\", \"parameters\": %s, \"strict\": true}], "
	         "\"tool_choice\": \"required\", \"max_output_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, "
	         "\"store\": false, \"parallel_tool_calls\": true}", schema);
	snprintf(msg, sizeof msg, "{\"system\": [{\"type\": \"text\", \"text\": \"Be brief\"}], \"messages\": [{\"role\": "
	         "\"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", \"content\": [{\"type\": \"tool_use\", "
	         "\"id\": \"c1\", \"name\": \"weather\", \"input\": {\"city\": \"Oslo\"}}]}, {\"role\": \"user\", \"content\": "
	         "[{\"type\": \"tool_result\", \"tool_use_id\": \"c1\", \"content\": [{\"type\": \"text\", \"text\": "
	         "\"sunny\"}]}]}], \"tools\": [{\"name\": \"weather\", \"input_schema\": %s}], \"tool_choice\": {\"type\": "
	         "\"any\"}, \"max_tokens\": 7, \"temperature\": 0.5, \"top_p\": 0.9, \"metadata\": {\"user_id\": \"u\"}}",
	         schema);
	struct llm_api_req r0, r;
	enum llm_status s0 = parse_env(LLM_API_CHAT, chat, &e, &r0);
	check(!s0 && r0.tool_format == LLM_TOOL_HERMES && r0.p.grammar, "the chat body: %s", s0 ? llm_errmsg() : "ok");
	const struct { enum llm_api_kind k; const char *body; } same[] = {
		{ LLM_API_RESPONSES, resp }, { LLM_API_MESSAGES, msg }, { LLM_API_MESSAGES_COUNT, msg },
	};
	for (size_t i = 0; i < sizeof same / sizeof *same && !s0; i++) {
		enum llm_status s = parse_env(same[i].k, same[i].body, &e, &r);
		int count = same[i].k == LLM_API_MESSAGES_COUNT;
		check(!s && r.n_prompt == r0.n_prompt && !memcmp(r.prompt, r0.prompt, (size_t)r.n_prompt * sizeof *r.prompt) &&
		      (count || (r.p.max_tokens == 7 && r.p.temperature == 0.5f && r.p.top_p == 0.9f && r.p.grammar &&
		                 r.tool_format == LLM_TOOL_HERMES && r.n_tools == 1 && !strcmp(r.tool_names[0], "weather"))),
		      "%s: a tool round trip gives chat's prompt (%d tokens)%s: %s", kind_name[same[i].k], s ? 0 : r.n_prompt,
		      count ? "" : ", sampling, tool format and forced call", s ? llm_errmsg() : "ok");
		if (!s)
			llm_api_req_free(&r);
	}
	if (!s0)
		llm_api_req_free(&r0);
	/* a string input is one user message; text.format json_schema is chat's response_format */
	s0 = parse_env(LLM_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", &e, &r0);
	enum llm_status s = parse_env(LLM_API_RESPONSES, "{\"input\": \"hi\", \"text\": {\"format\": {\"type\": "
	                              "\"json_schema\", \"name\": \"n\", \"schema\": {\"type\": \"integer\"}}}}", &e, &r);
	check(!s0 && !s && r.n_prompt == r0.n_prompt && r.p.grammar && llm_grammar_match(r.p.grammar, "42", 2) &&
	      !llm_grammar_match(r.p.grammar, "x", 1), "responses: input a string; text.format json_schema guides: %s",
	      s ? llm_errmsg() : "ok");
	if (!s)
		llm_api_req_free(&r);
	if (!s0)
		llm_api_req_free(&r0);
	e.gvocab = NULL;
	llm_gvocab_free(gv);

	const enum llm_api_kind R = LLM_API_RESPONSES, M = LLM_API_MESSAGES;
	refused(R, "{\"input\": \"hi\", \"previous_response_id\": \"resp_1\"}", "previous_response_id",
	        "previous_response_id: not supported: llm-serve keeps no responses; send the whole conversation in input");
	refused(R, "{\"input\": \"hi\", \"store\": true}", "store", "store: only false: llm-serve keeps no responses");
	refused(R, "{\"input\": []}", "input", "input: expected a string or a non-empty array of items");
	refused(R, "{\"input\": \"hi\", \"max_output_tokens\": 0}", "max_output_tokens",
	        "max_output_tokens: 0 is out of range [1, 2147483647]");
	refused(R, "{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_image\", \"image_url\": \"x\"}]}]}",
	        "input", "input: item 0: content part 0: expected {\"type\": \"input_text\", \"text\": string}");
	refused(R, "{\"input\": [{\"type\": \"web_search_call\"}]}", "input",
	        "input: item 0: type 'web_search_call' is not supported (message, function_call, function_call_output)");
	refused(R, "{\"input\": \"hi\", \"tools\": [{\"type\": \"web_search\"}]}", "tools",
	        "tools: tools[0]: type 'web_search' is not supported (function tools only)");
	refused(R, "{\"input\": \"hi\", \"text\": {\"format\": {\"type\": \"json_schema\"}}}", "text.format",
	        "text.format: expected {\"type\": \"json_schema\", \"name\": ..., \"schema\": {...}}");
	refused(R, "{\"input\": \"hi\", \"text\": {\"format\": {\"type\": \"json_object\"}}}", "text.format",
	        "text.format: structured output needs the model's tokenizer files");
	refused(R, "{\"input\": \"hi\", \"temperature\": 101}", "temperature",
	        "temperature: 101 is out of range [0, 100]");
	refused(M, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", "max_tokens", "max_tokens: required");
	refused(M, "{\"messages\": [], \"max_tokens\": 5}", "messages", "messages: expected a non-empty array of messages");
	refused(M, "{\"messages\": [{\"role\": \"system\", \"content\": \"hi\"}], \"max_tokens\": 5}", "messages",
	        "messages: message 0: expected {\"role\": \"user\" or \"assistant\", \"content\": ...}");
	refused(M, "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\", \"source\": {}}]}], "
	        "\"max_tokens\": 5}", "messages",
	        "messages: message 0: block 0: type 'image' is not supported in a user turn (text, tool_result)");
	refused(M, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 5, \"stop_sequences\": "
	        "[\"a\", \"b\", \"c\", \"d\", \"e\", \"f\", \"g\", \"h\", \"i\"]}", "stop_sequences",
	        "stop_sequences: 9 stop strings, at most 8");
	refused(M, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 5, \"tools\": "
	        "[{\"type\": \"bash_20250124\", \"name\": \"bash\"}]}", "tools",
	        "tools: tools[0]: type 'bash_20250124' is not supported (client tools only: name, description, input_schema)");
	refused(M, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 5, \"tool_choice\": "
	        "{\"type\": \"tool\"}}", "tool_choice",
	        "tool_choice: expected {\"type\": \"auto\", \"any\", \"none\" or \"tool\" (with \"name\")}");
	refused(M, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 5, \"top_k\": -2}",
	        "top_k", "top_k: -2 is out of range [-1, 1073741824]");
	refused(LLM_API_MESSAGES_COUNT, "{\"messages\": 1}", "messages", "messages: expected a non-empty array of messages");

	/* the answers: a text and a call; the stream's events in order, Responses' numbered from 0 */
	struct llm_tool_call call = { "weather", "{\"city\":\"Oslo\"}" };
	struct llm_tool_answer ta = { &call, 1, "", 0 };
	struct llm_api_out o = { .id = "resp_1", .model = "m", .created = 1, .n_prompt = 5, .n_gen = 9, .text = "Hi",
	                         .len = 2, .calls = &ta, .finish = LLM_FINISH_EOS };
	json_t *b = llm_responses_body(&o);
	json_t *out = json_object_get(b, "output");
	check(json_array_size(out) == 2 && !strcmp(json_string_value(json_object_get(json_array_get(out, 0), "type")), "message") &&
	      !strcmp(json_string_value(json_object_get(json_array_get(out, 1), "arguments")), "{\"city\":\"Oslo\"}") &&
	      !strcmp(json_string_value(json_object_get(b, "status")), "completed") &&
	      json_integer_value(json_object_get(json_object_get(b, "usage"), "total_tokens")) == 14,
	      "responses: a message item then a function_call item, completed, usage");
	json_decref(b);
	struct llm_buf ev = { 0 };
	struct llm_api_stream st = { 0 };
	struct llm_api_out so = o;
	so.finish = LLM_FINISH_NONE;
	llm_api_stream_begin(R, &st, &ev, &so);
	llm_api_stream_text(R, &st, &ev, &so, "H", 1);
	llm_api_stream_text(R, &st, &ev, &so, "i", 1);
	llm_api_stream_end(R, &st, &ev, &o);
	static const char *const want_r[] = { "response.created", "response.in_progress", "response.output_item.added",
		"response.content_part.added", "response.output_text.delta", "response.output_text.delta",
		"response.output_text.done", "response.content_part.done", "response.output_item.done",
		"response.output_item.added", "response.function_call_arguments.delta",
		"response.function_call_arguments.done", "response.output_item.done", "response.completed" };
	int good = 1, n_ev = 0;
	for (char *p = ev.p; p && (p = strstr(p, "event: ")); n_ev++) {
		char *nl = strchr(p, '\n'), *d = nl ? strstr(nl, "data: ") : NULL;
		json_t *j = d ? json_loadb(d + 6, strcspn(d + 6, "\n"), 0, NULL) : NULL;
		good &= n_ev < 14 && nl && (size_t)(nl - p - 7) == strlen(want_r[n_ev]) && !strncmp(p + 7, want_r[n_ev], nl - p - 7) &&
		        json_integer_value(json_object_get(j, "sequence_number")) == n_ev &&
		        !strcmp(json_string_value(json_object_get(j, "type")), want_r[n_ev]);
		json_decref(j);
		p = nl ? nl : p + 7;
	}
	check(good && n_ev == 14, "responses stream: the 14 events in order, sequence_number 0 to 13 (%d)", n_ev);
	llm_buf_free(&ev);
	o.id = "msg_1";
	o.finish = LLM_FINISH_STOP;
	o.stop = "END";
	o.calls = NULL;
	b = llm_messages_body(&o);
	check(!strcmp(json_string_value(json_object_get(b, "stop_reason")), "stop_sequence") &&
	      !strcmp(json_string_value(json_object_get(b, "stop_sequence")), "END") &&
	      !strcmp(json_string_value(json_object_get(json_array_get(json_object_get(b, "content"), 0), "text")), "Hi"),
	      "messages: a stop string is stop_reason stop_sequence, named");
	json_decref(b);
	o.calls = &ta;
	o.stop = NULL;
	memset(&st, 0, sizeof st);
	llm_api_stream_text(M, &st, &ev, &so, "Hi", 2);
	llm_api_stream_end(M, &st, &ev, &o);
	static const char *const want_m[] = { "message_start", "ping", "content_block_start", "content_block_delta",
		"content_block_stop", "content_block_start", "content_block_delta", "content_block_stop", "message_delta",
		"message_stop" };
	good = 1, n_ev = 0;
	for (char *p = ev.p; p && (p = strstr(p, "event: ")); n_ev++) {
		char *nl = strchr(p, '\n');
		good &= n_ev < 10 && nl && (size_t)(nl - p - 7) == strlen(want_m[n_ev]) && !strncmp(p + 7, want_m[n_ev], nl - p - 7);
		p = nl ? nl : p + 7;
	}
	/* the reasoning hook: a reasoning item or thinking block first, streamed before the text */
	o.reasoning = "hmm";
	o.reasoning_len = 3;
	o.calls = NULL;
	b = llm_messages_body(&o);
	check(!strcmp(json_string_value(json_object_get(json_array_get(json_object_get(b, "content"), 0), "thinking")), "hmm") &&
	      !strcmp(json_string_value(json_object_get(json_array_get(json_object_get(b, "content"), 1), "text")), "Hi"),
	      "messages: reasoning is a thinking block before the text");
	json_decref(b);
	o.id = "resp_2";
	b = llm_responses_body(&o);
	out = json_object_get(b, "output");
	check(json_array_size(out) == 2 && !strcmp(json_string_value(json_object_get(json_array_get(out, 0), "type")), "reasoning") &&
	      !strcmp(json_string_value(json_object_get(json_array_get(out, 1), "type")), "message"),
	      "responses: reasoning is a reasoning item before the message");
	json_decref(b);
	struct llm_buf rb = { 0 };
	memset(&st, 0, sizeof st);
	so.id = o.id;
	llm_api_stream_reasoning(R, &st, &rb, &so, "hm", 2);
	llm_api_stream_reasoning(R, &st, &rb, &so, "m", 1);
	so.reasoning = "hmm";       /* the reasoning sent, closed by the text */
	so.reasoning_len = 3;
	llm_api_stream_text(R, &st, &rb, &so, "Hi", 2);
	llm_api_stream_reasoning(R, &st, &rb, &so, "late", 4);
	llm_api_stream_end(R, &st, &rb, &o);
	check(rb.p && strstr(rb.p, "\"type\":\"response.reasoning_text.done\",\"sequence_number\":6,\"item_id\":\"rs_resp_2\","
	                    "\"output_index\":0,\"content_index\":0,\"text\":\"hmm\"") &&
	      strstr(rb.p, "\"type\":\"response.output_text.delta\",\"sequence_number\":11,\"item_id\":\"msg_resp_2\","
	                   "\"output_index\":1") && !strstr(rb.p, "late") && strstr(rb.p, "\"sequence_number\":15,") &&
	      !strstr(rb.p, "\"sequence_number\":16,"),
	      "responses stream: reasoning deltas, its item closed before the message (output_index 1); none after the text");
	llm_buf_free(&rb);
	check(good && n_ev == 10 && strstr(ev.p, "\"stop_reason\":\"tool_use\"") &&
	      strstr(ev.p, "\"partial_json\":\"{\\\"city\\\":\\\"Oslo\\\"}\""),
	      "messages stream: the 10 events in order, the call's input_json_delta, stop_reason tool_use (%d)", n_ev);
	llm_buf_free(&ev);
}

static void tool_calls(void)
{
	struct llm_api_env e = env_of(0, 1);
	struct llm_gvocab *gv = NULL;
	if (!check(!llm_gvocab_tokenizer(&gv, tk, llm_tokenizer_n_vocab(tk)), "the tokenizer's vocabulary for grammars"))
		return;
	e.gvocab = gv;
	e.chat_template = "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if tools %}<tools>"
	                  "{{ tools | tojson }}</tools> call as <tool_call>{...}</tool_call>{% endif %}<assistant>";
	const char *tools = "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \"parameters\": "
	                    "{\"type\": \"object\", \"properties\": {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}, "
	                    "{\"type\": \"function\", \"function\": {\"name\": \"noop\"}}]";
	char body[2048];
	struct llm_api_req r, r0;
	snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], %s}", tools);
	enum llm_status s = parse_env(LLM_API_CHAT, body, &e, &r);
	check(!s && r.tool_format == LLM_TOOL_HERMES && r.n_tools == 2 && !strcmp(r.tool_names[0], "get_weather") &&
	      !strcmp(r.tool_names[1], "noop") && !r.p.grammar, "auto: hermes from the template, the 2 names, no grammar: %s",
	      s ? llm_errmsg() : "ok");
	enum llm_status s0 = parse_env(LLM_API_CHAT, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}", &e, &r0);
	check(!s && !s0 && r.n_prompt > r0.n_prompt + 20, "the tools are rendered into the prompt (%d tokens, %d without)",
	      s ? 0 : r.n_prompt, s0 ? 0 : r0.n_prompt);
	if (!s)
		llm_api_req_free(&r);
	if (!s0)
		llm_api_req_free(&r0);
	static const char *call_w = "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{\"city\":\"Oslo\"}}\n</tool_call>";
	static const char *call_n = "<tool_call>\n{\"name\":\"noop\",\"arguments\":{}}\n</tool_call>";
	static const char *no_city = "<tool_call>\n{\"name\":\"get_weather\",\"arguments\":{}}\n</tool_call>";
	static const char *bare = "{\"name\":\"noop\",\"arguments\":{}}";
	snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], %s, \"tool_choice\": \"required\"}", tools);
	s = parse_env(LLM_API_CHAT, body, &e, &r);
	check(!s && r.p.grammar && llm_grammar_match(r.p.grammar, call_w, strlen(call_w)) &&
	      llm_grammar_match(r.p.grammar, call_n, strlen(call_n)) && !llm_grammar_match(r.p.grammar, no_city, strlen(no_city)) &&
	      !llm_grammar_match(r.p.grammar, bare, strlen(bare)),
	      "required: the grammar takes a whole call to either function with valid arguments, nothing else: %s",
	      s ? llm_errmsg() : "ok");
	if (!s)
		llm_api_req_free(&r);
	snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], %s, \"tool_choice\": "
	         "{\"type\": \"function\", \"function\": {\"name\": \"noop\"}}}", tools);
	s = parse_env(LLM_API_CHAT, body, &e, &r);
	check(!s && r.p.grammar && llm_grammar_match(r.p.grammar, call_n, strlen(call_n)) &&
	      !llm_grammar_match(r.p.grammar, call_w, strlen(call_w)), "a named function: calls to it only: %s",
	      s ? llm_errmsg() : "ok");
	if (!s)
		llm_api_req_free(&r);
	snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], %s, \"tool_choice\": \"none\"}", tools);
	s = parse_env(LLM_API_CHAT, body, &e, &r);
	check(!s && r.tool_format == 0 && !r.p.grammar, "none: rendered, not parsed");
	if (!s)
		llm_api_req_free(&r);
	snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], %s, \"tool_choice\": "
	         "{\"type\": \"function\", \"function\": {\"name\": \"rm\"}}}", tools);
	s = parse_env(LLM_API_CHAT, body, &e, &r);
	check(s && !strcmp(r.param, "tool_choice") && strstr(llm_errmsg(), "function 'rm' is not among the tools"),
	      "a named function not among the tools: %s", s ? llm_errmsg() : "taken");
	if (!s)
		llm_api_req_free(&r);
	snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], %s, \"tool_choice\": \"required\", "
	         "\"guided_regex\": \"a+\"}", tools);
	s = parse_env(LLM_API_CHAT, body, &e, &r);
	check(s && !strcmp(r.param, "tool_choice"), "required with guided_regex is refused: %s", s ? llm_errmsg() : "taken");
	if (!s)
		llm_api_req_free(&r);
	snprintf(body, sizeof body, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [{\"type\": \"function\"}]}");
	s = parse_env(LLM_API_CHAT, body, &e, &r);
	check(s && !strcmp(r.param, "tools"), "a tool without a function name is refused: %s", s ? llm_errmsg() : "taken");
	if (!s)
		llm_api_req_free(&r);
	llm_gvocab_free(gv);
}

int main(void)
{
	const char *models = test_models_dir();
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/stories260K", models ? models : "");
	if (!models || llm_tokenizer_open(&tk, dir)) {
		check_skip("no stories260K in $LLM_TEST_MODELS", "request parsing");
		return check_done();
	}
	sampling_rules();
	defaults();
	seed_rule();
	prompts();
	lengths();
	openai_fields();
	unimplemented_fields();
	fill_in_middle();
	structured();
	tool_calls();
	translated_apis();
	llm_tokenizer_close(tk);
	return check_done();
}
