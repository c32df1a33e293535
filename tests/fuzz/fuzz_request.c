/* tests/fuzz/fuzz_request.c: libFuzzer harness for the request parser
 * (common/serve/request.c), which llm-serve runs on every body of
 * /v1/completions, /v1/chat/completions, /generate, /v1/responses,
 * /v1/messages and /v1/messages/count_tokens (the last three translated to
 * chat by api_responses.c and api_messages.c first), and llm-generate on
 * every JSONL line. Byte 0 picks the kind: 0 to 6 that kind (completion,
 * chat, TGI, JSONL, Responses, Messages, count_tokens), any other its value
 * mod 4 (as before the last three came); the rest is the body, parsed as JSON the way the
 * server does (json_loadb), then through llm_api_req_parse with the
 * stories260K tokenizer (LLM_FUZZ_MODEL, default
 * ../shared/models/stories260K), the test chat template
 * (tests/data/chat-template.jinja's text, built in), a context of 512 and
 * at most LLM_MAX_N choices.
 *
 * Invariants: a parse either succeeds with a request the scheduler can
 * take (a non-empty prompt of ids in the vocabulary, prompt + max_tokens
 * within the context, n in [1, LLM_MAX_N], at most LLM_MAX_STOP stop
 * strings, min_tokens not above max_tokens) or fails with a status, a
 * message, and, unless memory ran out, the field at fault in r.param
 * which the message starts with. Never a crash, a leak or a hang.
 *   make fuzz && build-fuzz/fuzz_request -timeout=10 -max_total_time=300 /tmp/fr tests/data/fuzz-request */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llm.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define N_CTX 512
#define N_VOCAB 512

static struct llm_tokenizer *tk;
/* the text of tests/data/chat-template.jinja */
static const char *tmpl = "{%- for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n"
                          "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}";

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	const char *dir = getenv("LLM_FUZZ_MODEL");
	if (!dir)
		dir = "../shared/models/stories260K";
	if (llm_tokenizer_open(&tk, dir)) {
		fprintf(stderr, "fuzz_request: %s: %s\n", dir, llm_errmsg());
		exit(2);
	}
	llm_log_level = 0;
	return 0;
}

static void check_ok(const struct llm_api_req *r)
{
	const struct llm_sample_params *p = &r->p;
	if (!r->prompt || r->n_prompt < 1 || r->n_prompt >= N_CTX)
		__builtin_trap();
	for (int i = 0; i < r->n_prompt; i++)
		if (r->prompt[i] < 0 || r->prompt[i] >= N_VOCAB)
			__builtin_trap();
	if (p->max_tokens < 1 || r->n_prompt + (long long)p->max_tokens > N_CTX)
		__builtin_trap();
	if (r->n < 1 || r->n > LLM_MAX_N || p->n_stop < 0 || p->n_stop > LLM_MAX_STOP)
		__builtin_trap();
	if (p->min_tokens > p->max_tokens)
		__builtin_trap();
	for (int i = 0; i < p->n_stop; i++)
		if (!p->stop[i] || !p->stop[i][0])
			__builtin_trap();
	for (int i = 0; i < p->n_stop_ids; i++)
		if (p->stop_ids[i] < 0 || p->stop_ids[i] >= N_VOCAB)
			__builtin_trap();
	for (int i = 0; i < p->n_bias; i++)
		if (!p->bias || p->bias[i].id < 0 || p->bias[i].id >= N_VOCAB)
			__builtin_trap();
	if (llm_sample_params_check(p))
		__builtin_trap();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 16384)
		return 0;
	enum llm_api_kind kind = (enum llm_api_kind)(data[0] < LLM_API_N_KINDS ? data[0] : data[0] % 4);
	json_error_t je;
	json_t *o = json_loadb((const char *)data + 1, size - 1, 0, &je);
	if (!o)
		return 0;
	struct llm_api_env env = { .defaults = LLM_SAMPLE_DEFAULT, .tk = tk, .chat_template = tmpl,
	                           .model_name = "stories260K", .n_vocab = N_VOCAB, .n_ctx = N_CTX, .max_n = LLM_MAX_N };
	env.defaults.seed = 1;
	env.defaults.max_tokens = kind == LLM_API_COMPLETION ? 16 : 0;
	struct llm_api_req r;
	enum llm_status s = llm_api_req_parse(&r, kind, o, &env);
	json_decref(o);
	if (s == LLM_OK) {
		check_ok(&r);
		llm_api_req_free(&r);
	} else {
		const char *m = llm_errmsg();
		size_t n = strlen(r.param);
		if (!m[0])
			__builtin_trap();
		/* the message names the field (the sampler's own check names it
		 * its way: "top_k: ...") */
		if (s != LLM_ERR_NOMEM && (!n || strncmp(m, r.param, n) || m[n] != ':'))
			__builtin_trap();
	}
	return 0;
}
