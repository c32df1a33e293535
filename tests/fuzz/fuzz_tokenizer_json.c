/* tests/fuzz/fuzz_tokenizer_json.c: libFuzzer harness for loading a
 * tokenizer: tokenizer.json (and, after a NUL, tokenizer_config.json) as a
 * downloaded checkpoint carries them. Every input opens or is refused with
 * a status and a message; one that opens then encodes a fixed text (with
 * and without special tokens) and decodes the result and the first ids
 * of its vocabulary, whole and streamed, which must agree (tok_check.h).
 *   make fuzz && build-fuzz/fuzz_tokenizer_json -timeout=10 -max_total_time=300 NEW_DIR tests/data/fuzz-tokenizer-json */
#include <stdlib.h>
#include <string.h>
#include "llm.h"
#include "tok_check.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	llm_log_level = 0;
	return 0;
}

struct files { const char *tok, *cfg; size_t tok_len, cfg_len; };

static const char *get(void *ctx, const char *name, size_t *len)
{
	const struct files *f = ctx;
	if (!strcmp(name, "tokenizer.json")) {
		*len = f->tok_len;
		return f->tok;
	}
	if (!strcmp(name, "tokenizer_config.json") && f->cfg) {
		*len = f->cfg_len;
		return f->cfg;
	}
	return NULL;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size > 65536)
		return 0;
	/* exact-size copies, so a read past either file is seen */
	const uint8_t *nul = memchr(data, 0, size);
	size_t tl = nul ? (size_t)(nul - data) : size;
	char *tok = malloc(tl ? tl : 1), *cfg = NULL;
	memcpy(tok, data, tl);
	struct files f = { tok, NULL, tl, 0 };
	if (nul) {
		f.cfg_len = size - tl - 1;
		cfg = malloc(f.cfg_len ? f.cfg_len : 1);
		memcpy(cfg, nul + 1, f.cfg_len);
		f.cfg = cfg;
	}
	struct llm_tok_files tf = { get, &f };
	struct llm_tokenizer *tk = NULL;
	if (llm_tokenizer_open_mem(&tk, "fuzz", &tf) == LLM_OK) {
		static const char text[] = "Hello world, it's 2024!\n\tcafé 日本語 <s>x</s> <|endoftext|>  ab  ";
		for (int special = 0; special < 2; special++) {
			int32_t *ids = NULL;
			size_t n = 0;
			if (llm_tokenizer_encode(tk, text, sizeof text - 1, special, &ids, &n) == LLM_OK) {
				for (size_t i = 0; i < n; i++)
					if (ids[i] < 0 || ids[i] >= llm_tokenizer_n_vocab(tk))
						__builtin_trap();
				check_ids(tk, ids, n);
			}
			free(ids);
		}
		int32_t nv = llm_tokenizer_n_vocab(tk), ids[64];
		size_t n = 0;
		for (int32_t i = 0; i < nv && n < 64; i++)
			ids[n++] = i;
		check_ids(tk, ids, n);
		llm_tokenizer_close(tk);
	} else if (tk || !llm_errmsg()[0]) {
		__builtin_trap();       /* a refusal leaves no tokenizer and says why */
	}
	free(tok);
	free(cfg);
	return 0;
}
