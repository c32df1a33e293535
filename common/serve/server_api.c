/* common/serve/server_api.c: llm-serve's endpoints that answer without the
 * engine (server_impl.h): /tokenize and /detokenize in the shapes vLLM's
 * server gives them, TGI's /info, the refusal of /v1/embeddings, the
 * metrics under the names vLLM documents (with a model_name label) that
 * dashboards built for it query, /v1/models, and vLLM's LoRA endpoints
 * /v1/load_lora_adapter and /v1/unload_lora_adapter (whose work the engine
 * thread does, server_engine.c).
 *
 * Guarantees:
 * - /tokenize gives the ids a completion or chat request of the same text
 *   or messages would run (the chat template rendered as for
 *   /v1/chat/completions, then tokenized without special tokens unless
 *   add_special_tokens says otherwise); /detokenize is its inverse with
 *   special tokens kept.
 * - A field this server does not implement is refused by name (400),
 *   never ignored.
 * - The metrics are read under the server lock, one consistent snapshot. */
#define _GNU_SOURCE
#include "server_http.h"
#include "args.h"
#include "tokenizer.h"
#include "jinja.h"
#include "fileio.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

/* Refuse keys of O outside ALLOWED (NULL-terminated): *PARAM names one. */
static enum llm_status only(json_t *o, const char *const *allowed, const char **param)
{
	const char *k;
	json_t *v;
	json_object_foreach(o, k, v) {
		int ok = 0;
		for (const char *const *a = allowed; *a && !ok; a++)
			ok = !strcmp(k, *a);
		if (!ok) {
			*param = k;
			return llm_fail(LLM_ERR_USAGE, "%s: not a field of this endpoint here", k);
		}
	}
	(void)v;
	return LLM_OK;
}

/* A boolean field K of O (absent: DEF). */
static enum llm_status flag(json_t *o, const char *k, int def, int *out, const char **param)
{
	json_t *v = json_object_get(o, k);
	*out = def;
	if (!v)
		return LLM_OK;
	if (!json_is_boolean(v)) {
		*param = k;
		return llm_fail(LLM_ERR_USAGE, "%s: expected true or false", k);
	}
	*out = json_is_true(v);
	return LLM_OK;
}

/* The chat request's prompt text, rendered as for /v1/chat/completions. */
static enum llm_status chat_text(struct llm_server *s, json_t *o, int gen, char **text, size_t *len,
                                 const char **param)
{
	json_t *msgs = json_object_get(o, "messages"), *kw = json_object_get(o, "chat_template_kwargs");
	json_t *tools = json_object_get(o, "tools");
	*param = "messages";
	if (!s->template_src && !llm_tokenizer_chat_template(s->tk))
		return llm_fail(LLM_ERR_USAGE, "messages: this model has no chat template (give one with --chat-template FILE)");
	if (kw && !json_is_object(kw))
		return *param = "chat_template_kwargs", llm_fail(LLM_ERR_USAGE, "chat_template_kwargs: expected an object");
	if (tools && !json_is_array(tools))
		return *param = "tools", llm_fail(LLM_ERR_USAGE, "tools: expected an array");
	json_t *ms = NULL;
	LLM_TRY(llm_api_chat_messages(msgs, &ms));
	json_t *req = json_pack("{s:o, s:b}", "messages", ms, "add_generation_prompt", gen);   /* takes ms */
	if (req && kw)
		json_object_set(req, "chat_template_kwargs", kw);
	if (req && tools)
		json_object_set(req, "tools", tools);
	char *rs = req ? json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
	json_decref(req);
	if (!rs)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	enum llm_status st = llm_chat_render(s->tk, s->template_src, rs, text, len);
	free(rs);
	return st ? llm_fail_prefix(LLM_ERR_USAGE, "messages: chat template") : LLM_OK;
}

static int server_ctx(struct llm_server *s)
{
	pthread_mutex_lock(&s->mu);
	int n = s->n_ctx;
	pthread_mutex_unlock(&s->mu);
	return n > 0 ? n : llm_tokenizer_model_ctx(s->tk);
}

enum llm_status llm_srv_tokenize(struct llm_server *s, json_t *o, json_t **out, const char **param)
{
	static const char *const completion[] = { "model", "prompt", "add_special_tokens", "return_token_strs", NULL };
	static const char *const chat[] = { "model", "messages", "add_generation_prompt", "add_special_tokens",
	                                    "return_token_strs", "chat_template_kwargs", "tools",
	                                    "continue_final_message", NULL };
	*out = NULL;
	*param = NULL;
	if (!s->tk)
		return llm_fail(LLM_ERR_USAGE, "the model has no tokenizer files: nothing to tokenize with");
	int is_chat = json_object_get(o, "messages") != NULL, special, strs, gen = 1, cont = 0;
	LLM_TRY(only(o, is_chat ? chat : completion, param));
	LLM_TRY(flag(o, "add_special_tokens", !is_chat, &special, param));
	LLM_TRY(flag(o, "return_token_strs", 0, &strs, param));
	char *text = NULL;
	size_t len;
	if (is_chat) {
		LLM_TRY(flag(o, "add_generation_prompt", 1, &gen, param));
		LLM_TRY(flag(o, "continue_final_message", 0, &cont, param));
		if (cont)
			return *param = "continue_final_message",
			       llm_fail(LLM_ERR_USAGE, "continue_final_message: not implemented (the template ends each message)");
		LLM_TRY(chat_text(s, o, gen, &text, &len, param));
	} else {
		json_t *p = json_object_get(o, "prompt");
		*param = "prompt";
		if (!json_is_string(p))
			return llm_fail(LLM_ERR_USAGE, "prompt: expected a string (or give \"messages\")");
		len = json_string_length(p);
		if (!(text = malloc(len + 1)))
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		memcpy(text, json_string_value(p), len + 1);
	}
	int32_t *ids;
	size_t n;
	enum llm_status st = llm_tokenizer_encode(s->tk, text, len, special, &ids, &n);
	free(text);
	if (st)
		return llm_fail_prefix(LLM_ERR_USAGE, "%s", is_chat ? "messages" : "prompt");
	json_t *t = json_array(), *ts = strs ? json_array() : json_null();
	for (size_t i = 0; i < n; i++) {
		json_array_append_new(t, json_integer(ids[i]));
		const char *piece = strs ? llm_tokenizer_token(s->tk, ids[i]) : NULL;
		json_t *js = piece ? json_string(piece) : NULL;   /* NULL too for a piece that is not UTF-8 */
		if (strs)
			json_array_append_new(ts, js ? js : json_null());
	}
	free(ids);
	*param = NULL;
	*out = json_pack("{s:I, s:i, s:o, s:o}", "count", (json_int_t)n, "max_model_len", server_ctx(s), "tokens", t,
	                 "token_strs", ts);
	return *out ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "out of memory");
}

enum llm_status llm_srv_detokenize(struct llm_server *s, json_t *o, json_t **out, const char **param)
{
	static const char *const fields[] = { "model", "tokens", NULL };
	*out = NULL;
	*param = NULL;
	if (!s->tk)
		return llm_fail(LLM_ERR_USAGE, "the model has no tokenizer files: nothing to detokenize with");
	LLM_TRY(only(o, fields, param));
	json_t *t = json_object_get(o, "tokens");
	*param = "tokens";
	if (!json_is_array(t))
		return llm_fail(LLM_ERR_USAGE, "tokens: expected an array of token ids");
	size_t n = json_array_size(t);
	int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
	if (!ids)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	int32_t nv = llm_tokenizer_n_vocab(s->tk);
	for (size_t i = 0; i < n; i++) {
		json_t *v = json_array_get(t, i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= nv) {
			free(ids);
			return llm_fail(LLM_ERR_USAGE, "tokens[%zu]: expected a token id in [0, %d)", i, nv);
		}
		ids[i] = (int32_t)json_integer_value(v);
	}
	char *text;
	size_t len;
	enum llm_status st = llm_tokenizer_decode(s->tk, ids, n, false, &text, &len);
	free(ids);
	if (st)
		return llm_fail_prefix(LLM_ERR_USAGE, "tokens");
	*param = NULL;
	*out = json_pack("{s:s%}", "prompt", text, len);
	free(text);
	return *out ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "out of memory");
}

json_t *llm_srv_info(struct llm_server *s)
{
	int ctx = server_ctx(s);
	const char *dev = s->o.eng.backend && !strcmp(s->o.eng.backend, "cuda") ? "cuda" : "cpu";
	return json_pack("{s:s, s:n, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:s, s:s, s:n}",
	                 "model_id", s->model_name, "model_sha", "model_dtype", "float8_e4m3 (group-wise scales)",
	                 "model_device_type", dev, "model_pipeline_tag", "text-generation",
	                 "max_concurrent_requests", s->o.sched.max_running + (s->o.max_queue > 0 ? s->o.max_queue : 0),
	                 "max_best_of", 1, "max_stop_sequences", LLM_MAX_STOP, "max_input_tokens", ctx > 1 ? ctx - 1 : ctx,
	                 "max_total_tokens", ctx, "max_client_batch_size", 1, "router", "llm-serve",
	                 "version", LLM_VERSION, "sha");
}

/* ---- metrics under vLLM's names ------------------------------------------ */

const double llm_srv_tokens_le[N_BUCKET] = { 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, INFINITY };

/* NAME's lines of histogram H with the label L (`model_name="..."`; "":
 * none). */
void llm_srv_histo_text(FILE *f, const char *name, const char *help, const struct histo *h, const char *l)
{
	const double *le = h->le ? h->le : llm_srv_bucket_le;
	const char *sep = *l ? "," : "", *o = *l ? "{" : "", *c = *l ? "}" : "";
	fprintf(f, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
	for (int k = 0; k < N_BUCKET; k++) {
		if (isinf(le[k]))
			fprintf(f, "%s_bucket{%s%sle=\"+Inf\"} %llu\n", name, l, sep, (unsigned long long)h->n[k]);
		else
			fprintf(f, "%s_bucket{%s%sle=\"%g\"} %llu\n", name, l, sep, le[k], (unsigned long long)h->n[k]);
	}
	fprintf(f, "%s_sum%s%s%s %.6f\n%s_count%s%s%s %llu\n", name, o, l, c, h->sum, name, o, l, c,
	        (unsigned long long)h->count);
}

static void one(FILE *f, const char *name, const char *type, const char *help, const char *l, double v)
{
	fprintf(f, "# HELP %s %s\n# TYPE %s %s\n%s{%s} %.17g\n", name, help, name, type, name, l, v);
}

void llm_srv_metrics_vllm(struct llm_server *s, FILE *f)
{
	char l[300], esc[200];
	size_t k = 0;
	for (const char *p = s->model_name; *p && k + 2 < sizeof esc; p++) {   /* label value escapes */
		if (*p == '"' || *p == '\\' || *p == '\n')
			esc[k++] = '\\';
		esc[k++] = *p == '\n' ? 'n' : *p;
	}
	esc[k] = 0;
	snprintf(l, sizeof l, "model_name=\"%s\"", esc);
	const struct llm_sched_stats *st = &s->st;
	int waiting = s->in_flight - st->running;
	one(f, "vllm:num_requests_running", "gauge", "Requests in the running batch.", l, st->running);
	one(f, "vllm:num_requests_waiting", "gauge", "Requests waiting to be admitted.", l, waiting > 0 ? waiting : 0);
	one(f, "vllm:kv_cache_usage_perc", "gauge", "Fraction of KV blocks held by requests (0 to 1).", l,
	    st->kv_blocks_total ? (double)st->kv_blocks_used / (double)st->kv_blocks_total : 0);
	one(f, "vllm:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.", l,
	    (double)s->prompt_tokens);
	one(f, "vllm:prefix_cache_hits_total", "counter", "Prompt tokens found in the prefix cache.", l,
	    (double)st->prefix_hit_tokens);
	one(f, "vllm:num_preemptions_total", "counter", "Requests preempted for KV blocks.", l, (double)st->preemptions);
	one(f, "vllm:spec_decode_num_draft_tokens_total", "counter", "Drafted tokens verified by the model.", l,
	    (double)st->spec_draft_tokens);
	one(f, "vllm:spec_decode_num_accepted_tokens_total", "counter", "Drafted tokens accepted.", l,
	    (double)st->spec_accepted_tokens);
	one(f, "vllm:prompt_tokens_total", "counter", "Prompt tokens of accepted requests.", l, (double)s->prompt_tokens);
	one(f, "vllm:generation_tokens_total", "counter", "Generated tokens.", l, (double)s->gen_tokens);
	static const char *reason[] = { "stop", "length", "abort", "error" };
	fprintf(f, "# HELP vllm:request_success_total Finished sequences by finish reason.\n"
	           "# TYPE vllm:request_success_total counter\n");
	for (int i = 0; i < 4; i++)
		fprintf(f, "vllm:request_success_total{finished_reason=\"%s\",%s} %llu\n", reason[i], l,
		        (unsigned long long)s->finished[i]);
	llm_srv_histo_text(f, "vllm:time_to_first_token_seconds", "Arrival to the first generated token.", &s->ttft, l);
	llm_srv_histo_text(f, "vllm:inter_token_latency_seconds", "Gap between consecutive tokens of a sequence.", &s->itl, l);
	llm_srv_histo_text(f, "vllm:e2e_request_latency_seconds", "Arrival to the last token of a request.", &s->e2e, l);
	llm_srv_histo_text(f, "vllm:request_queue_time_seconds", "Arrival to admission into the running batch.", &s->queue, l);
	llm_srv_histo_text(f, "vllm:request_prefill_time_seconds", "Admission to the first generated token.", &s->prefill, l);
	llm_srv_histo_text(f, "vllm:request_decode_time_seconds", "First to last generated token of a sequence.", &s->decode, l);
	llm_srv_histo_text(f, "vllm:request_prompt_tokens", "Prompt tokens of a finished request.", &s->req_prompt, l);
	llm_srv_histo_text(f, "vllm:request_generation_tokens", "Generated tokens of a finished sequence.", &s->req_gen, l);
}

json_t *llm_srv_models(struct llm_server *s)
{
	json_t *data = json_array();
	json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:s, s:n, s:i}", "id", s->model_name, "object", "model",
	                                      "created", (json_int_t)0, "owned_by", "llm-tools", "root", s->o.model,
	                                      "parent", "max_model_len", s->n_ctx));
	for (int i = 0; i < LLM_LORA_SLOTS; i++)
		if (s->lora_name[i][0])
			json_array_append_new(data, json_pack("{s:s, s:s, s:I, s:s, s:s?, s:s, s:i}", "id", s->lora_name[i],
			                                      "object", "model", "created", (json_int_t)0, "owned_by", "llm-tools",
			                                      "root", s->lora_dir[i], "parent", s->model_name,
			                                      "max_model_len", s->n_ctx));
	return json_pack("{s:s, s:o}", "object", "list", "data", data);
}

/* Field K of O: a non-empty string, or a usage error naming it. */
static const char *lora_field(json_t *o, const char *k, char *msg, size_t n, const char **param)
{
	json_t *v = json_object_get(o, k);
	if (json_is_string(v) && json_string_length(v) > 0 && strlen(json_string_value(v)) == json_string_length(v))
		return json_string_value(v);
	*param = k;
	snprintf(msg, n, "%s: %s", k, v ? "expected a non-empty string" : "missing");
	return NULL;
}

void llm_srv_lora_op(struct llm_server *s, json_t *o, int load, unsigned *status, char *msg, size_t n,
                     const char **param)
{
	static const char *const k_load[] = { "lora_name", "lora_path", NULL }, *const k_unload[] = { "lora_name", NULL };
	*status = 400;
	*param = NULL;
	const char *name, *path = NULL;
	if (!json_is_object(o)) {
		snprintf(msg, n, "the body must be a JSON object");
		return;
	}
	if (only(o, load ? k_load : k_unload, param)) {
		snprintf(msg, n, "%s", llm_errmsg());
		return;
	}
	if (!(name = lora_field(o, "lora_name", msg, n, param)) || (load && !(path = lora_field(o, "lora_path", msg, n, param))))
		return;
	if (strlen(name) >= LLM_LORA_NAME_MAX || strchr(name, '=')) {
		*param = "lora_name";
		snprintf(msg, n, "lora_name: 1 to %d bytes, no '='", LLM_LORA_NAME_MAX - 1);
		return;
	}
	struct lora_op *op = calloc(1, sizeof *op);
	if (!op || (path && !(op->path = llm_strdup(path)))) {
		free(op);
		*status = 500;
		snprintf(msg, n, "out of memory");
		return;
	}
	op->load = load;
	memcpy(op->name, name, strlen(name) + 1);
	pthread_cond_init(&op->cv, NULL);
	/* a load's files are read here, not on the engine thread: the model's
	 * config is fixed once it is ready */
	pthread_mutex_lock(&s->mu);
	const struct llm_config *cfg = s->state == LLM_SERVER_READY ? &llm_engine_model(s->e)->cfg : NULL;
	pthread_mutex_unlock(&s->mu);
	enum llm_status lst = LLM_OK;
	if (load && cfg && (lst = llm_lora_load(&op->lo, path, cfg)))
		lst = llm_fail_prefix(lst, "adapter '%s'", name);
	pthread_mutex_lock(&s->mu);
	if (lst) {
		*status = lst == LLM_ERR_NOMEM ? 500 : 400;
		*param = "lora_path";
		snprintf(msg, n, "%s", llm_errmsg());
	} else if (s->state != LLM_SERVER_READY) {
		*status = 503;
		snprintf(msg, n, "the server is %s", s->state == LLM_SERVER_LOADING ? "loading" : "not ready");
	} else if (load && !strcmp(name, s->model_name)) {
		*param = "lora_name";
		snprintf(msg, n, "lora_name: '%s' is the model's own name", name);
	} else {
		struct lora_op **pp = &s->loraq;
		while (*pp)
			pp = &(*pp)->next;
		*pp = op;
		llm_srv_wake_locked(s);
		while (!op->done)
			pthread_cond_wait(&op->cv, &s->mu);
		*status = op->status;
		if (op->status != 200)
			*param = "lora_name";
		snprintf(msg, n, "%s", op->msg);
	}
	pthread_mutex_unlock(&s->mu);
	pthread_cond_destroy(&op->cv);
	llm_lora_free(&op->lo);      /* zeroed when the engine took it */
	free(op->path);
	free(op);
}
