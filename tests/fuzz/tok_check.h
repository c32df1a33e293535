/* tests/fuzz/tok_check.h: the check the tokenizer harnesses share (a
 * header, not a harness: make fuzz builds only the .c files here). */
#ifndef TOK_CHECK_H
#define TOK_CHECK_H
#include <stdlib.h>
#include <string.h>
#include "llm.h"

/* IDS must decode, and the stream must give the same text. */
static void check_ids(const struct llm_tokenizer *tk, const int32_t *ids, size_t n)
{
	for (int skip = 0; skip < 2; skip++) {
		char *whole = NULL;
		size_t wlen = 0;
		enum llm_status st = llm_tokenizer_decode(tk, ids, n, skip, &whole, &wlen);
		struct llm_detok_stream ds;
		memset(&ds, 0, sizeof ds);
		llm_detok_stream_init(&ds, tk, skip);
		char *acc = malloc(wlen + 1);
		size_t alen = 0, cap = wlen + 1;
		int ok = 1;
		for (size_t i = 0; i <= n && ok; i++) {
			const char *t;
			size_t tl;
			enum llm_status ps = i < n ? llm_detok_stream_push(&ds, ids[i], &t, &tl)
			                           : llm_detok_stream_flush(&ds, &t, &tl);
			if (ps) {
				ok = 0;
				break;
			}
			if (alen + tl + 1 > cap) {
				cap = (alen + tl + 1) * 2;
				acc = realloc(acc, cap);
			}
			memcpy(acc + alen, t, tl);
			alen += tl;
		}
		llm_detok_stream_free(&ds);
		/* a whole decode refuses only ids the tokenizer lacks; the stream
		 * must then refuse too, and otherwise agree byte for byte */
		if (st == LLM_OK && (!ok || alen != wlen || memcmp(acc, whole, wlen)))
			__builtin_trap();
		if (st != LLM_OK && ok)
			__builtin_trap();
		/* primed with the first half (a prompt), the stream gives the
		 * rest: the whole text less its longest common prefix with the
		 * first half's */
		size_t k = n / 2, c = 0, pl = 0;
		char *pre = NULL;
		if (st == LLM_OK && k > 0 && !llm_tokenizer_decode(tk, ids, k, skip, &pre, &pl)) {
			while (c < pl && c < wlen && pre[c] == whole[c])
				c++;
			llm_detok_stream_init(&ds, tk, skip);
			alen = 0;
			ok = llm_detok_stream_prime(&ds, ids, k) == LLM_OK;
			for (size_t i = k; i <= n && ok; i++) {
				const char *t;
				size_t tl;
				ok = (i < n ? llm_detok_stream_push(&ds, ids[i], &t, &tl)
				            : llm_detok_stream_flush(&ds, &t, &tl)) == LLM_OK;
				if (ok && (alen + tl > wlen - c || memcmp(whole + c + alen, t, tl)))
					__builtin_trap();
				alen += ok ? tl : 0;
			}
			llm_detok_stream_free(&ds);
			if (!ok || alen != wlen - c)
				__builtin_trap();
		}
		free(pre);
		free(acc);
		free(whole);
	}
	/* each id's piece and bytes: given for an id decode takes, refused
	 * with LLM_ERR_RANGE otherwise */
	for (size_t i = 0; i < n && i < 64; i++) {
		char *one = NULL, *pc = NULL, *by = NULL;
		size_t l1, lp, lb;
		enum llm_status sd = llm_tokenizer_decode(tk, ids + i, 1, false, &one, &l1);
		enum llm_status sp = llm_tokenizer_piece(tk, ids[i], &pc, &lp);
		enum llm_status sb = llm_tokenizer_piece_bytes(tk, ids[i], &by, &lb);
		if ((sd == LLM_OK) != (sp == LLM_OK) || sp != sb || (sp && sp != LLM_ERR_RANGE) ||
		    (sp == LLM_OK && (!pc || !by || pc[lp] || by[lb])))
			__builtin_trap();
		free(one);
		free(pc);
		free(by);
	}
}

#endif
