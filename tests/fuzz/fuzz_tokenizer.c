/* tests/fuzz/fuzz_tokenizer.c: libFuzzer harness for the tokenizer, which
 * takes prompts and ids straight from HTTP requests in llm-serve. Byte 0
 * picks what the rest is:
 *   even: text. Encoded with and without special tokens: either refused
 *         (invalid UTF-8) or ids that decode;
 *   odd:  ids, 3 bytes each, taken modulo n_vocab.
 * Every id list is then decoded whole and, with and without special
 * tokens, pushed through a streaming detokenizer one id at a time; the
 * stream's text must equal the whole decode byte for byte (tokenizer.h
 * promises it), and a stream primed with the first half must give the
 * rest (decode(all) less decode(first half)); each id's piece and piece bytes (log-prob text) must be
 * given exactly when decode takes the id. The tokenizer directory comes from LLM_FUZZ_TOKENIZER
 * (default ../shared/reference/tokenizers/llama3).
 *   make fuzz && LLM_FUZZ_TOKENIZER=DIR build-fuzz/fuzz_tokenizer -max_total_time=300 */
#include <stdlib.h>
#include <string.h>
#include "llm.h"
#include "tok_check.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct llm_tokenizer *tk;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	const char *dir = getenv("LLM_FUZZ_TOKENIZER");
	if (!dir)
		dir = "../shared/reference/tokenizers/llama3";
	if (llm_tokenizer_open(&tk, dir)) {
		fprintf(stderr, "fuzz_tokenizer: %s\n", llm_errmsg());
		exit(2);
	}
	llm_log_level = 0;
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 4096)
		return 0;
	if (!(data[0] & 1)) {
		for (int special = 0; special < 2; special++) {
			int32_t *ids = NULL;
			size_t n = 0;
			if (llm_tokenizer_encode(tk, (const char *)data + 1, size - 1, special, &ids, &n) == LLM_OK) {
				for (size_t i = 0; i < n; i++)
					if (ids[i] < 0 || ids[i] >= llm_tokenizer_n_vocab(tk))
						__builtin_trap();
				check_ids(tk, ids, n);
			}
			free(ids);
		}
	} else {
		size_t n = (size - 1) / 3;
		int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
		int32_t nv = llm_tokenizer_n_vocab(tk);
		for (size_t i = 0; i < n; i++) {
			const uint8_t *p = data + 1 + 3 * i;
			ids[i] = (int32_t)(((uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16) % (uint32_t)nv);
		}
		check_ids(tk, ids, n);
		free(ids);
	}
	return 0;
}
