/* common/text/textmode.h: the modes of llm-generate that need only the
 * tokenizer files of a model (textmode.c). */
#ifndef LLM_TEXTMODE_H
#define LLM_TEXTMODE_H

#include "tokenizer.h"

#include <stdio.h>

struct llm_buf;

enum llm_text_mode {
	LLM_TEXT_TOKENIZE,          /* text -> "[1, 2, 3]\n"; FLAG: add special tokens (BOS ...) */
	LLM_TEXT_DETOKENIZE,        /* a JSON array of ids -> text; FLAG: leave special tokens out */
	LLM_TEXT_TEMPLATE,          /* a chat request (JSON) -> its prompt, through TEMPLATE_SRC
	                             * (NULL: the tokenizer's chat template) */
};

/* Run mode M over IN (LEN bytes) and append its output to OUT. *WARNING
 * gets a line worth telling the user (two BOS tokens at the start), or
 * NULL. Bad input is LLM_ERR_USAGE naming the line or element. */
enum llm_status llm_text_mode(enum llm_text_mode m, const struct llm_tokenizer *tk, const char *template_src,
                              int flag, const char *in, size_t len, struct llm_buf *out, const char **warning);
/* llm_text_mode from standard input to OUT (the tool's stdout), the
 * warning through llm_warn. Errors name stdin, or TEMPLATE_PATH (the file
 * TEMPLATE_SRC came from; NULL: the tokenizer's) for a template's. */
enum llm_status llm_text_mode_stdin(enum llm_text_mode m, const struct llm_tokenizer *tk, const char *template_src,
                                    const char *template_path, int flag, FILE *out);

#endif
