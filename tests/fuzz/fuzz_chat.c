/* tests/fuzz/fuzz_chat.c: libFuzzer harness for chat rendering (common/jinja_*.c),
 * which llm-serve runs on every /v1/chat/completions body. Byte 0 picks:
 *   0, 1: the rest is the request JSON ({"messages": [...], ...}), rendered
 *        with the chat template of the reference tokenizer llama3 or qwen3
 *        (LLM_FUZZ_TOKENIZERS, default ../shared/reference/tokenizers):
 *        what a client controls;
 *   2+:  the rest is a template, a NUL, then the request: the template
 *        language itself (a checkpoint's or --chat-template's).
 * Every input renders or is refused with a status and a message; a render
 * is NUL-terminated at its length. Never a crash, a leak or a hang (run
 * with -timeout).
 *   make fuzz && build-fuzz/fuzz_chat -timeout=10 -max_total_time=300 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llm.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *names[2] = { "llama3", "qwen3" };
static struct llm_tokenizer *tks[2];

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	const char *dir = getenv("LLM_FUZZ_TOKENIZERS");
	if (!dir)
		dir = "../shared/reference/tokenizers";
	for (int i = 0; i < 2; i++) {
		char path[4096];
		snprintf(path, sizeof path, "%s/%s", dir, names[i]);
		if (llm_tokenizer_open(&tks[i], path) || !llm_tokenizer_chat_template(tks[i])) {
			fprintf(stderr, "fuzz_chat: %s: %s\n", path, llm_errmsg());
			exit(2);
		}
	}
	llm_log_level = 0;
	return 0;
}

static void render(const struct llm_tokenizer *tk, const char *tmpl, const char *req)
{
	char *out = NULL;
	size_t len = 0;
	if (llm_chat_render(tk, tmpl, req, &out, &len) == LLM_OK) {
		if (!out || out[len] != '\0')
			__builtin_trap();
	} else if (!llm_errmsg()[0]) {
		__builtin_trap();
	}
	free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > 8192)
		return 0;
	/* NUL-terminated copies: the API takes C strings */
	char *buf = malloc(size);
	memcpy(buf, data + 1, size - 1);
	buf[size - 1] = '\0';
	if (data[0] < 2) {
		render(tks[data[0]], NULL, buf);
	} else {
		size_t tl = strlen(buf);
		const char *req = tl + 1 < size ? buf + tl + 1 : "{\"messages\": []}";
		render(NULL, buf, req);
	}
	free(buf);
	return 0;
}
