/* common/text/toolcall.c: tool calls in a chat answer (toolcall.h). The parse
 * is all or nothing: either every call-shaped part of the answer is a
 * whole, known call and the rest is content, or the answer is content. */
#include "toolcall.h"
#include "fileio.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

static const char open_tag[] = "<tool_call>", close_tag[] = "</tool_call>", python_tag[] = "<|python_tag|>";

enum llm_tool_format llm_tool_format_of(const char *t)
{
	if (!t)
		return LLM_TOOL_NONE;
	if (strstr(t, open_tag))
		return LLM_TOOL_HERMES;
	if (strstr(t, python_tag) || strstr(t, "\"parameters\": dictionary"))
		return LLM_TOOL_LLAMA3;
	return LLM_TOOL_NONE;
}

const char *llm_tool_format_name(enum llm_tool_format f)
{
	return f == LLM_TOOL_HERMES ? "hermes" : f == LLM_TOOL_LLAMA3 ? "llama3" : "none";
}

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

static const char *memfind(const char *h, size_t n, const char *needle)
{
	size_t m = strlen(needle);
	for (size_t i = 0; m <= n && i <= n - m; i++)
		if (!memcmp(h + i, needle, m))
			return h + i;
	return NULL;
}

void llm_tool_answer_free(struct llm_tool_answer *a)
{
	for (int i = 0; a->calls && i < a->n; i++)
		free(a->calls[i].name), free(a->calls[i].arguments);
	free(a->calls);
	free(a->content);
	memset(a, 0, sizeof *a);
}

/* O as a call to one of NAMES: 1 added, 0 not a call, -1 out of memory. */
static int add_call(struct llm_tool_answer *a, json_t *o, const char *args_key, const char *const *names, int n_names)
{
	json_t *name = json_object_get(o, "name"), *args = json_object_get(o, args_key);
	if (!args)
		args = json_object_get(o, args_key[0] == 'a' ? "parameters" : "arguments");
	if (json_is_string(args)) {   /* arguments sent as a JSON string */
		json_t *parsed = json_loads(json_string_value(args), 0, NULL);
		if (!json_is_object(parsed)) {
			json_decref(parsed);
			return 0;
		}
		json_object_set_new(o, args_key, parsed);
		args = parsed;
	}
	if (!json_is_object(o) || !json_is_string(name) || !json_is_object(args))
		return 0;
	int known = !names;
	for (int i = 0; i < n_names && !known; i++)
		known = !strcmp(names[i], json_string_value(name));
	if (!known)
		return 0;
	struct llm_tool_call *c = realloc(a->calls, ((size_t)a->n + 1) * sizeof *c);
	if (!c)
		return -1;
	a->calls = c;
	c = &a->calls[a->n];
	c->name = llm_strdup(json_string_value(name));
	c->arguments = json_dumps(args, JSON_COMPACT);
	if (!c->name || !c->arguments) {
		free(c->name), free(c->arguments);
		return -1;
	}
	a->n++;
	return 1;
}

/* Hermes: every <tool_call> block a whole call, the text between them
 * content. 1: parsed, 0: not calls, -1: out of memory. */
static int parse_hermes(const char *t, size_t len, const char *const *names, int n_names, struct llm_tool_answer *a,
                        char *content, size_t *cl)
{
	const char *p = t, *end = t + len, *at;
	while ((at = memfind(p, (size_t)(end - p), open_tag))) {
		memcpy(content + *cl, p, (size_t)(at - p));
		*cl += (size_t)(at - p);
		const char *body = at + sizeof open_tag - 1, *close = memfind(body, (size_t)(end - body), close_tag);
		const char *body_end = close ? close : end;   /* the answer may end before the tag */
		json_t *o = json_loadb(body, (size_t)(body_end - body), 0, NULL);
		int r = o ? add_call(a, o, "arguments", names, n_names) : 0;
		json_decref(o);
		if (r <= 0)
			return r;
		p = close ? close + sizeof close_tag - 1 : end;
	}
	if (!a->n)
		return 0;
	memcpy(content + *cl, p, (size_t)(end - p));
	*cl += (size_t)(end - p);
	return 1;
}

/* Llama 3: the answer is calls alone, ';' between them. */
static int parse_llama3(const char *t, size_t len, const char *const *names, int n_names, struct llm_tool_answer *a)
{
	const char *p = t, *end = t + len;
	while (p < end && is_space(*p))
		p++;
	if ((size_t)(end - p) >= sizeof python_tag - 1 && !memcmp(p, python_tag, sizeof python_tag - 1))
		p += sizeof python_tag - 1;
	while (p < end) {
		while (p < end && (is_space(*p) || (*p == ';' && a->n)))
			p++;
		if (p == end)
			break;
		if (*p != '{')
			return 0;
		json_error_t je;
		json_t *o = json_loadb(p, (size_t)(end - p), JSON_DISABLE_EOF_CHECK, &je);
		int r = o ? add_call(a, o, "parameters", names, n_names) : 0;
		json_decref(o);
		if (r <= 0)
			return r;
		p += je.position;
	}
	return a->n > 0;
}

enum llm_status llm_tool_parse(enum llm_tool_format f, const char *text, size_t len, const char *const *names,
                               int n_names, struct llm_tool_answer *out)
{
	memset(out, 0, sizeof *out);
	char *content = malloc(len + 1);
	if (!content)
		return llm_fail(LLM_ERR_NOMEM, "tool calls: out of memory");
	size_t cl = 0;
	int r = f == LLM_TOOL_HERMES ? parse_hermes(text, len, names, n_names, out, content, &cl) :
	        f == LLM_TOOL_LLAMA3 ? parse_llama3(text, len, names, n_names, out) : 0;
	if (r < 0) {
		free(content);
		llm_tool_answer_free(out);
		return llm_fail(LLM_ERR_NOMEM, "tool calls: out of memory");
	}
	if (r == 0) {                /* no calls: the answer as it is */
		llm_tool_answer_free(out);
		memcpy(content, text, len);
		cl = len;
	} else {                     /* content around calls, trimmed */
		size_t a = 0;
		while (a < cl && is_space(content[a]))
			a++;
		while (cl > a && is_space(content[cl - 1]))
			cl--;
		memmove(content, content + a, cl - a);
		cl -= a;
	}
	content[cl] = 0;
	out->content = content;
	out->content_len = cl;
	return LLM_OK;
}

size_t llm_tool_safe_prefix(enum llm_tool_format f, const char *text, size_t len)
{
	if (f == LLM_TOOL_HERMES) {
		const char *at = memfind(text, len, open_tag);
		if (at)
			return (size_t)(at - text);
		/* a tail that may grow into the tag waits */
		for (size_t k = sizeof open_tag - 2; k > 0; k--)
			if (k <= len && !memcmp(text + len - k, open_tag, k))
				return len - k;
		return len;
	}
	if (f == LLM_TOOL_LLAMA3) {
		size_t i = 0;
		while (i < len && is_space(text[i]))
			i++;
		if (i == len || text[i] == '{')
			return 0;            /* nothing yet, or a call may be coming */
		size_t m = len - i < sizeof python_tag - 1 ? len - i : sizeof python_tag - 1;
		return memcmp(text + i, python_tag, m) ? len : 0;
	}
	return len;
}
