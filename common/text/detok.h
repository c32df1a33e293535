/* common/text/detok.h: the engine's streaming detokenizer interface. Declared
 * below the engine so that the tokenizer can fill it (llm_tokenizer_detok,
 * tokenizer.h) without including the engine; generate.h uses it for stop
 * strings and event text. */
#ifndef LLM_DETOK_H
#define LLM_DETOK_H

#include <stddef.h>
#include <stdint.h>

/* A streaming detokenizer (e.g. over tokenizer.h's llm_detok_stream), one
 * state per request, needed for stop strings and event text. push() gives
 * the text that ID makes final (UTF-8 complete); *TEXT stays valid until the
 * next call on that state. prime() (may be NULL), called once before the
 * first push with the request's prompt, makes the text a continuation's:
 * decode(prompt + ids) less decode(prompt), so the first token keeps the
 * leading space a decode from the start would drop. Return 0, or -1 on
 * error. */
struct llm_detok {
	void *(*open)(void *ctx);
	int (*push)(void *state, int32_t id, const char **text, size_t *len);
	int (*flush)(void *state, const char **text, size_t *len);   /* may be NULL */
	void (*close)(void *state);
	void *ctx;
	int (*prime)(void *state, const int32_t *prompt, size_t n);  /* may be NULL */
};

#endif
