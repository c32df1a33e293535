/* common/checkpoint/tokenizer_ckpt.c: opening the tokenizer of a checkpoint, shared by
 * every tool (kept apart from tokenizer.c, which knows nothing of checkpoints). */
#define _POSIX_C_SOURCE 200809L
#include "tokenizer.h"
#include "ckpt.h"
#include "fileio.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *aux_get(void *ctx, const char *name, size_t *len)
{
	const struct llm_aux *a = llm_ckpt_aux(ctx, name);
	if (!a)
		return NULL;
	*len = a->len;
	return a->data;
}

enum llm_status llm_tokenizer_open_ckpt(struct llm_tokenizer **tk, const char *origin,
                                        const struct llm_ckpt *ck)
{
	struct llm_tok_files files = { aux_get, (void *)ck };
	return llm_tokenizer_open_mem(tk, origin, &files);
}

enum llm_status llm_tokenizer_open_model(struct llm_tokenizer **tk, const char *path)
{
	struct stat st;
	if (stat(path, &st) != 0)
		return llm_fail(LLM_ERR_IO, "%s: no such file or directory", path);
	if (S_ISDIR(st.st_mode))
		return llm_tokenizer_open(tk, path);
	struct llm_ckpt ck = { 0 };
	LLM_TRY(llm_ckpt_open(&ck, path));
	enum llm_status s;
	if (llm_ckpt_aux(&ck, "tokenizer.json")) {
		s = llm_tokenizer_open_ckpt(tk, path, &ck);
	} else {   /* a model.safetensors inside a model directory */
		char *dir = llm_strdup(path), *slash = dir ? strrchr(dir, '/') : NULL;
		if (slash)
			*slash = 0;
		s = dir ? llm_tokenizer_open(tk, slash ? dir : ".") : llm_fail(LLM_ERR_NOMEM, "out of memory");
		free(dir);
	}
	llm_ckpt_close(&ck);
	return s;
}

enum llm_status llm_tokenizer_open_optional(struct llm_tokenizer **tk, const char *path, int *absent)
{
	*tk = NULL;
	*absent = 0;
	enum llm_status s = llm_tokenizer_open_model(tk, path);
	if (s) {
		char *tj = llm_path_join(path, "tokenizer.json");
		*absent = tj && !llm_exists(tj) && llm_is_dir(path);
		free(tj);
	}
	return s;
}
