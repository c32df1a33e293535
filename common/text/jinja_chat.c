/* common/text/jinja_chat.c: llm_chat_render, the variables transformers'
 * apply_chat_template(tokenize=False) gives a chat template (the config's
 * special tokens, messages, tools, documents, add_generation_prompt, the
 * template arguments), rendered through llm_jinja_parse/llm_jinja_render.
 * Reference: transformers/utils/chat_template_utils.py. */
#include "jinja.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "tokenizer.h"
#include "banned.h"

/* ---------------------------------------------------------------- chat */

enum llm_status llm_chat_render(const struct llm_tokenizer *tk, const char *template_src,
                                const char *request, char **out, size_t *len)
{
	*out = NULL;
	*len = 0;
	const char *src = template_src ? template_src : tk ? llm_tokenizer_chat_template(tk) : NULL;
	if (!src)
		return llm_fail(LLM_ERR_USAGE, "the tokenizer has no chat_template (give one with --chat-template FILE)");
	json_error_t e;
	json_t *req = json_loads(request, JSON_ALLOW_NUL, &e);
	if (!req)
		return llm_fail(LLM_ERR_USAGE, "request: line %d: %s", e.line, e.text);
	enum llm_status st = LLM_OK;
	json_t *vars = json_object(), *cfg = NULL;
	struct llm_jinja *t = NULL;
	if (!json_is_object(req)) {
		st = llm_fail(LLM_ERR_USAGE, "request: not a JSON object");
		goto out;
	}
	json_t *msgs = json_object_get(req, "messages");
	if (!json_is_array(msgs)) {
		st = llm_fail(LLM_ERR_USAGE, "request: \"messages\" is not a list");
		goto out;
	}
	for (size_t i = 0; i < json_array_size(msgs); i++)
		if (!json_is_object(json_array_get(msgs, i))) {
			st = llm_fail(LLM_ERR_USAGE, "request: messages[%zu] is not an object", i);
			goto out;
		}
	/* Special tokens of the config, as transformers' special_tokens_map. */
	if (tk && (cfg = json_loads(llm_tokenizer_config_json(tk), JSON_DECODE_INT_AS_REAL, &e))) {
		static const char *names[] = { "bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
		                               "cls_token", "mask_token" };
		for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
			json_t *v = json_object_get(cfg, names[i]);
			const char *s = json_is_string(v) ? json_string_value(v) : json_string_value(json_object_get(v, "content"));
			if (s)
				json_object_set_new(vars, names[i], json_string(s));
		}
		json_t *add = json_object_get(cfg, "additional_special_tokens");
		if (json_is_array(add)) {
			json_t *l = json_array();
			for (size_t i = 0; i < json_array_size(add); i++) {
				json_t *v = json_array_get(add, i);
				const char *s = json_is_string(v) ? json_string_value(v) : json_string_value(json_object_get(v, "content"));
				if (s)
					json_array_append_new(l, json_string(s));
			}
			json_object_set_new(vars, "additional_special_tokens", l);
		}
	}
	json_object_set(vars, "messages", msgs);
	json_t *tools = json_object_get(req, "tools");
	json_object_set_new(vars, "tools", tools ? json_incref(tools) : json_null());
	json_t *docs = json_object_get(req, "documents");
	json_object_set_new(vars, "documents", docs ? json_incref(docs) : json_null());
	json_t *agp = json_object_get(req, "add_generation_prompt");
	json_object_set_new(vars, "add_generation_prompt", json_boolean(json_is_true(agp)));
	const char *k;
	json_t *v;
	json_object_foreach(req, k, v) {
		if (!strcmp(k, "messages") || !strcmp(k, "tools") || !strcmp(k, "documents") ||
		    !strcmp(k, "add_generation_prompt") || !strcmp(k, "template_kwargs") || !strcmp(k, "chat_template_kwargs"))
			continue;
		json_object_set(vars, k, v);
	}
	for (int i = 0; i < 2; i++) {
		json_t *kw = json_object_get(req, i ? "chat_template_kwargs" : "template_kwargs");
		if (kw && !json_is_object(kw) && !json_is_null(kw)) {
			st = llm_fail(LLM_ERR_USAGE, "request: \"%s\" is not an object", i ? "chat_template_kwargs" : "template_kwargs");
			goto out;
		}
		json_object_foreach(kw, k, v)
			json_object_set(vars, k, v);
	}
	if ((st = llm_jinja_parse(&t, src, strlen(src))))
		goto out;
	st = llm_jinja_render(t, vars, out, len);
out:
	llm_jinja_free(t);
	json_decref(cfg);
	json_decref(vars);
	json_decref(req);
	return st;
}

enum llm_status llm_chat_prompt(const struct llm_tokenizer *tk, const char *template_src, const char *request,
                                char **out, size_t *len, int *two_bos)
{
	*two_bos = 0;
	LLM_TRY(llm_chat_render(tk, template_src, request, out, len));
	int32_t *ids, bos = tk ? llm_tokenizer_bos(tk) : -1;
	size_t n;
	if (bos >= 0 && !llm_tokenizer_encode(tk, *out, *len, false, &ids, &n)) {
		*two_bos = n >= 2 && ids[0] == bos && ids[1] == bos;
		free(ids);
	}
	return LLM_OK;
}
