/* tests/fuzz/fuzz_grammar.c: libFuzzer harness for structured output's
 * compilers (common/text/grammar.c, common/text/guide.c), which llm-serve runs on
 * every body with response_format or a guided_* field. Byte 0 picks what
 * the rest is (its low 3 bits):
 *   0, 4: grammar text (guided_grammar);
 *   1: a JSON Schema's text (json_schema, guided_json);
 *   2, 6: a regular expression (guided_regex);
 *   3, 7: a JSON array of strings (guided_choice);
 *   5: a JSON array of tools' parameter schemas (tools with tool_choice
 *      "required": llm_guide_tool_call).
 * Inputs up to llm-serve's default --max-body (1 MiB). Every input
 * compiles or is refused with a status and a message; the front ends'
 * text compiles unless it passes a budget of the grammar engine (named in
 * the message) or a schema loops through $ref (refused by the front end). A
 * compiled grammar, over a small vocabulary of bytes and pieces: the start
 * state's mask equals the brute force (each token's bytes run from the
 * state), and a walk along the input's own bytes stays consistent (a state
 * that accepts agrees with llm_grammar_match). Never a crash, a leak or a
 * hang (run with -timeout).
 *   make fuzz && build/fuzz/fuzz_grammar -timeout=10 -max_total_time=300 tests/data/fuzz-grammar */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llm.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char *toks[] = { "{", "}", "\"", "a", "ab", "1", "12", ",", ":", "[", "]", " ", "\\", "\xce", "\xb2",
                              "\xce\xb2", "true", "null", "-", ".", "e", "x\"", "" };
#define NT ((int)(sizeof toks / sizeof *toks))
static struct llm_gvocab *voc;

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc;
	(void)argv;
	size_t len[NT];
	for (int i = 0; i < NT; i++)
		len[i] = strlen(toks[i]);
	if (llm_gvocab_new(&voc, NT, toks, len))
		exit(2);
	llm_log_level = 0;
	return 0;
}

static void exercise(struct llm_grammar *g, const uint8_t *text, size_t n)
{
	int st = llm_grammar_start(g);
	uint8_t m[NT];
	int na;
	if (llm_grammar_mask(g, st, m, &na) == LLM_OK) {
		int cnt = 0;
		for (int t = 0; t < NT; t++) {
			int want = toks[t][0] && llm_grammar_next(g, st, toks[t], strlen(toks[t])) >= 0;
			if (want != m[t])
				__builtin_trap();
			cnt += want;
		}
		if (cnt != na)
			__builtin_trap();
	}
	for (size_t i = 0; i < n && st >= 0; i++) {
		st = llm_grammar_next(g, st, text + i, 1);
		if (st >= 0 && i < 4096 &&   /* each match walks the prefix again: quadratic, so the first 4 KiB */
		    llm_grammar_accepts(g, st) != llm_grammar_match(g, text, i + 1))
			__builtin_trap();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1 || size > (1 << 20))
		return 0;
	const char *s = (const char *)data + 1;
	size_t n = size - 1;
	struct llm_buf b = { 0 };
	enum llm_status st = LLM_OK;
	json_t *j = NULL;
	int mode = data[0] & 7;
	switch (mode == 4 ? 0 : mode == 6 ? 2 : mode == 7 ? 3 : mode) {
	case 5: {
		const char *names[16] = { "a", "b\"", "", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p" };
		const json_t *params[16];
		if (!(j = json_loadb(s, n, 0, NULL)) || !json_is_array(j) || !json_array_size(j) || json_array_size(j) > 16)
			break;
		for (size_t k = 0; k < json_array_size(j); k++)
			params[k] = json_is_null(json_array_get(j, k)) ? NULL : json_array_get(j, k);
		st = llm_guide_tool_call(names, (const struct json_t *const *)params, json_array_size(j), "arguments",
		                         (data[0] & 8) ? "<tool_call>\n" : "", (data[0] & 8) ? "\n</tool_call>" : "", &b);
		break;
	}
	case 0:
		st = llm_buf_append(&b, s, n);
		break;
	case 1:
		if (!(j = json_loadb(s, n, JSON_DECODE_ANY, NULL)))
			return 0;
		st = llm_guide_json_schema(j, &b);
		break;
	case 2:
		st = llm_guide_regex(s, n, &b);
		break;
	case 3: {
		if (!(j = json_loadb(s, n, 0, NULL)) || !json_is_array(j) || json_array_size(j) > 64)
			break;
		const char *ch[64];
		size_t k = 0;
		for (; k < json_array_size(j) && json_is_string(json_array_get(j, k)); k++)
			ch[k] = json_string_value(json_array_get(j, k));
		if (k == json_array_size(j))
			st = llm_guide_choice(ch, k, &b);
		break;
	}
	}
	if (st && !llm_errmsg()[0])
		__builtin_trap();
	struct llm_grammar *g = NULL;
	if (!st && b.len) {
		st = llm_grammar_compile(&g, b.p, b.len, voc);
		if (st && !llm_errmsg()[0])
			__builtin_trap();
		/* the front ends write grammar text the compiler takes, within its budgets */
		if (st && (data[0] & 7) != 0 && (data[0] & 7) != 4 && !strstr(llm_errmsg(), "budget") &&
		    !strstr(llm_errmsg(), "too ambiguous"))
			__builtin_trap();
	}
	if (g) {
		exercise(g, (const uint8_t *)s, n);
		llm_grammar_unref(g);
	}
	llm_buf_free(&b);
	json_decref(j);
	return 0;
}
