/* tools/llm-generate.c: generate text with a model; for now its tokenizer
 * modes (--tokenize, --detokenize, --apply-template), which need only the
 * tokenizer files of -m. The work is in libllm (tokenizer.c, jinja.c); main
 * parses flags, picks one mode from the table below and maps status to the
 * exit code (0 ok, 1 runtime error, 2 usage error). */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "llm.h"

struct generate_cfg {
	const char *model;            /* -m: model directory or .safetensors file */
	int tokenize, detokenize, apply_template;
	int no_special;               /* --tokenize: no BOS/EOS */
	int skip_special;             /* --detokenize: leave special tokens out */
	const char *chat_template;    /* FILE overriding the model's template */
};

static struct generate_cfg cfg;

static const struct llm_opt opts[] = {
	LLM_STR('m', "model", "DIR", &cfg.model,
	        "model directory or .safetensors file (the tokenizer files suffice for the tokenizer modes)"),
	LLM_FLAG(0, "tokenize", &cfg.tokenize, "read text on stdin, print its token ids as a JSON array"),
	LLM_FLAG(0, "detokenize", &cfg.detokenize, "read a JSON array of token ids on stdin, print the text"),
	LLM_FLAG(0, "apply-template", &cfg.apply_template,
	         "read a chat request (JSON: messages, add_generation_prompt, tools, template_kwargs) on stdin, print the prompt"),
	LLM_FLAG(0, "no-special", &cfg.no_special, "--tokenize: add no special tokens (BOS and the like)"),
	LLM_FLAG(0, "skip-special", &cfg.skip_special, "--detokenize: leave special tokens out of the text"),
	LLM_STR(0, "chat-template", "FILE", &cfg.chat_template, "use the Jinja chat template in FILE instead of the model's"),
};

static const struct llm_cli cli = {
	.usage = "llm-generate [options] -m DIR",
	.summary = "Generate text with a model; --tokenize, --detokenize and --apply-template run its tokenizer and chat template alone.",
	.example = "printf 'Hello world' | llm-generate -m models/stories260K --tokenize",
	.opts = opts,
	.n_opts = sizeof opts / sizeof *opts,
	.min_pos = 0,
	.max_pos = 0,
};

/* ---- tokenizer from a directory or a single-file checkpoint */

static const char *aux_get(void *ctx, const char *name, size_t *len)
{
	const struct llm_aux *a = llm_ckpt_aux(ctx, name);
	if (!a)
		return NULL;
	*len = a->len;
	return a->data;
}

static enum llm_status open_tokenizer(const char *model, struct llm_tokenizer **tk)
{
	struct stat st;
	if (stat(model, &st) != 0)
		return llm_fail(LLM_ERR_IO, "%s: no such file or directory", model);
	if (S_ISDIR(st.st_mode))
		return llm_tokenizer_open(tk, model);
	struct llm_ckpt ck = { 0 };
	LLM_TRY(llm_ckpt_open(&ck, model));
	enum llm_status s;
	if (llm_ckpt_aux(&ck, "tokenizer.json")) {
		struct llm_tok_files files = { aux_get, &ck };
		s = llm_tokenizer_open_mem(tk, model, &files);
	} else {   /* a model.safetensors inside a model directory */
		char *dir = llm_strdup(model), *slash = dir ? strrchr(dir, '/') : NULL;
		if (slash)
			*slash = 0;
		s = dir ? llm_tokenizer_open(tk, slash ? dir : ".") : llm_fail(LLM_ERR_NOMEM, "out of memory");
		free(dir);
	}
	llm_ckpt_close(&ck);
	return s;
}

static enum llm_status write_out(const char *s, size_t n)
{
	if (fwrite(s, 1, n, stdout) != n || fflush(stdout) != 0)
		return llm_fail(LLM_ERR_IO, "stdout: write failed");
	return LLM_OK;
}

/* ---- modes: each reads stdin and writes stdout */

static enum llm_status run_tokenize(struct llm_tokenizer *tk)
{
	char *text;
	size_t len;
	LLM_TRY(llm_read_file("-", &text, &len));
	int32_t *ids;
	size_t n;
	enum llm_status s = llm_tokenizer_encode(tk, text, len, !cfg.no_special, &ids, &n);
	free(text);
	if (s)
		return llm_fail_prefix(s, "stdin");
	int32_t bos = llm_tokenizer_bos(tk);
	if (n >= 2 && bos >= 0 && ids[0] == bos && ids[1] == bos)
		llm_warn("the ids start with two BOS tokens (the text has one and the tokenizer adds one); use --no-special");
	char *line = malloc(n * 12 + 4);
	size_t w = 0;
	if (!line) {
		free(ids);
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	line[w++] = '[';
	for (size_t i = 0; i < n; i++)
		w += (size_t)snprintf(line + w, 13, i ? ", %d" : "%d", ids[i]);
	line[w++] = ']';
	line[w++] = '\n';
	s = write_out(line, w);
	free(line);
	free(ids);
	return s;
}

static enum llm_status run_detokenize(struct llm_tokenizer *tk)
{
	char *text;
	size_t len;
	LLM_TRY(llm_read_file("-", &text, &len));
	json_error_t e;
	json_t *arr = json_loadb(text, len, 0, &e);
	free(text);
	if (!arr)
		return llm_fail(LLM_ERR_USAGE, "stdin: line %d: %s", e.line, e.text);
	enum llm_status s = LLM_OK;
	size_t n = json_is_array(arr) ? json_array_size(arr) : 0;
	int32_t *ids = malloc((n + 1) * sizeof *ids);
	if (!json_is_array(arr))
		s = llm_fail(LLM_ERR_USAGE, "stdin: expected a JSON array of token ids");
	else if (!ids)
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; !s && i < n; i++) {
		json_t *v = json_array_get(arr, i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
			s = llm_fail(LLM_ERR_USAGE, "stdin: element %zu is not a token id", i);
		else
			ids[i] = (int32_t)json_integer_value(v);
	}
	char *out = NULL;
	size_t olen;
	if (!s)
		s = llm_tokenizer_decode(tk, ids, n, cfg.skip_special, &out, &olen);
	if (!s)
		s = write_out(out, olen);
	free(out);
	free(ids);
	json_decref(arr);
	return s;
}

static enum llm_status run_apply_template(struct llm_tokenizer *tk)
{
	char *tmpl = NULL, *req, *out = NULL;
	size_t len;
	if (cfg.chat_template)
		LLM_TRY(llm_read_file(cfg.chat_template, &tmpl, &len));
	enum llm_status s = llm_read_file("-", &req, &len);
	if (!s) {
		s = llm_chat_render(tk, tmpl, req, &out, &len);
		if (s && cfg.chat_template)
			llm_fail_prefix(s, "%s", cfg.chat_template);
	}
	if (!s) {
		/* As apply_chat_template does, the prompt is encoded without adding
		 * special tokens; two BOS at its start are almost always a bug. */
		int32_t *ids;
		size_t n;
		int32_t bos = llm_tokenizer_bos(tk);
		if (bos >= 0 && !llm_tokenizer_encode(tk, out, len, false, &ids, &n)) {
			if (n >= 2 && ids[0] == bos && ids[1] == bos)
				llm_warn("the rendered prompt starts with two BOS tokens");
			free(ids);
		}
		s = write_out(out, len);
	}
	free(out);
	free(req);
	free(tmpl);
	return s;
}

/* One entry per mode; generation joins this table. */
static const struct mode {
	const int *flag;
	const char *name;
	enum llm_status (*run)(struct llm_tokenizer *tk);
} modes[] = {
	{ &cfg.tokenize, "--tokenize", run_tokenize },
	{ &cfg.detokenize, "--detokenize", run_detokenize },
	{ &cfg.apply_template, "--apply-template", run_apply_template },
};

int main(int argc, char **argv)
{
	const char *pos[16];
	int n_pos;
	int rc = llm_args_parse(argc, argv, &cli, pos, &n_pos);
	if (rc != LLM_ARGS_OK)
		return rc == LLM_ARGS_EXIT ? 0 : 2;
	const struct mode *mode = NULL;
	for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
		if (*modes[i].flag) {
			if (mode)
				return llm_args_usage_error(&cli, "%s and %s cannot be combined", mode->name, modes[i].name);
			mode = &modes[i];
		}
	if (!mode)
		return llm_args_usage_error(&cli, "give a mode: --tokenize, --detokenize or --apply-template "
		                                  "(generation is not implemented yet)");
	if (!cfg.model)
		return llm_args_usage_error(&cli, "missing -m DIR");
	if (cfg.no_special && mode->run != run_tokenize)
		return llm_args_usage_error(&cli, "--no-special goes with --tokenize");
	if (cfg.skip_special && mode->run != run_detokenize)
		return llm_args_usage_error(&cli, "--skip-special goes with --detokenize");
	if (cfg.chat_template && mode->run != run_apply_template)
		return llm_args_usage_error(&cli, "--chat-template goes with --apply-template");
	struct llm_tokenizer *tk;
	if (open_tokenizer(cfg.model, &tk))
		llm_die("%s", llm_errmsg());
	enum llm_status s = mode->run(tk);
	llm_tokenizer_close(tk);
	if (s)
		llm_die("%s", llm_errmsg());
	return 0;
}
