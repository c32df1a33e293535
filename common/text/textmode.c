/* common/text/textmode.c: llm-generate's modes that need only the tokenizer
 * files (textmode.h): text to a JSON array of ids, such an array to text,
 * a chat request to its prompt. */
#include "textmode.h"
#include "jinja.h"
#include "buf.h"
#include "fileio.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include "banned.h"

static enum llm_status ids_json(const struct llm_tokenizer *tk, const char *text, size_t len, bool special,
                                       struct llm_buf *out, int *two_bos)
{
	int32_t *ids;
	size_t n;
	LLM_TRY(llm_tokenizer_encode(tk, text, len, special, &ids, &n));
	int32_t bos = llm_tokenizer_bos(tk);
	*two_bos = n >= 2 && bos >= 0 && ids[0] == bos && ids[1] == bos;
	enum llm_status s = llm_buf_append(out, "[", 1);
	for (size_t i = 0; !s && i < n; i++) {
		char num[16];
		int k = snprintf(num, sizeof num, i ? ", %d" : "%d", ids[i]);
		s = llm_buf_append(out, num, (size_t)k);
	}
	if (!s)
		s = llm_buf_append(out, "]\n", 2);
	free(ids);
	return s;
}

static enum llm_status json_text(const struct llm_tokenizer *tk, const char *json, size_t len,
                                        bool skip_special, char **text, size_t *text_len)
{
	json_error_t e;
	json_t *arr = json_loadb(json, len, 0, &e);
	if (!arr)
		return llm_fail(LLM_ERR_USAGE, "line %d: %s", e.line, e.text);
	enum llm_status s = LLM_OK;
	size_t n = json_is_array(arr) ? json_array_size(arr) : 0;
	int32_t *ids = malloc((n + 1) * sizeof *ids);
	if (!json_is_array(arr))
		s = llm_fail(LLM_ERR_USAGE, "expected a JSON array of token ids");
	else if (!ids)
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; !s && i < n; i++) {
		json_t *v = json_array_get(arr, i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
			s = llm_fail(LLM_ERR_USAGE, "element %zu is not a token id", i);
		else
			ids[i] = (int32_t)json_integer_value(v);
	}
	if (!s)
		s = llm_tokenizer_decode(tk, ids, n, skip_special, text, text_len);
	free(ids);
	json_decref(arr);
	return s;
}

enum llm_status llm_text_mode(enum llm_text_mode m, const struct llm_tokenizer *tk, const char *template_src,
                              int flag, const char *in, size_t len, struct llm_buf *out, const char **warning)
{
	int two_bos = 0;
	enum llm_status s = LLM_OK;
	*warning = NULL;
	if (m == LLM_TEXT_TOKENIZE) {
		s = ids_json(tk, in, len, flag, out, &two_bos);
		if (two_bos)
			*warning = "the ids start with two BOS tokens (the text has one and the tokenizer adds one); use --no-special";
		return s;
	}
	char *text = NULL;
	size_t n = 0;
	if (m == LLM_TEXT_DETOKENIZE) {
		s = json_text(tk, in, len, flag, &text, &n);
	} else {
		/* As apply_chat_template does, the prompt is encoded without adding
		 * special tokens; two BOS at its start are almost always a bug. */
		struct llm_buf req = { 0 };
		s = llm_buf_append(&req, in, len);    /* the request as a C string */
		if (!s)
			s = llm_chat_prompt(tk, template_src, req.p, &text, &n, &two_bos);
		llm_buf_free(&req);
		if (two_bos)
			*warning = "the rendered prompt starts with two BOS tokens";
	}
	if (!s)
		s = llm_buf_append(out, text, n);
	free(text);
	return s;
}

enum llm_status llm_text_mode_stdin(enum llm_text_mode m, const struct llm_tokenizer *tk, const char *template_src,
                                    const char *template_path, int flag, FILE *out)
{
	char *in;
	size_t len;
	const char *warning;
	struct llm_buf buf = { 0 };
	LLM_TRY(llm_read_file("-", &in, &len));
	enum llm_status s = llm_text_mode(m, tk, template_src, flag, in, len, &buf, &warning);
	if (warning)
		llm_warn("%s", warning);
	if (s && m != LLM_TEXT_TEMPLATE)
		llm_fail_prefix(s, "stdin");
	else if (s && template_path)
		llm_fail_prefix(s, "%s", template_path);
	if (!s && (fwrite(buf.p ? buf.p : "", 1, buf.len, out) != buf.len || fflush(out)))
		s = llm_fail(LLM_ERR_IO, "stdout: write failed");
	llm_buf_free(&buf);
	free(in);
	return s;
}
