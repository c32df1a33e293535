/* common/base/buf.c: the growable buffer and array growth (see buf.h). */
#include "buf.h"

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

enum llm_status llm_array_reserve(void *pp, size_t *cap, size_t need, size_t elt)
{
	if (need <= *cap)
		return LLM_OK;
	size_t min = elt == 1 ? 64 : 16;
	size_t n = *cap > SIZE_MAX / 2 ? need : 2 * *cap;
	if (n < need)
		n = need;
	if (n < min)
		n = min;
	/* no object is larger than PTRDIFF_MAX bytes: refuse before asking */
	if (n > (size_t)PTRDIFF_MAX / elt)
		return llm_fail(LLM_ERR_NOMEM, "out of memory: %zu elements of %zu bytes", need, elt);
	void *old;
	memcpy(&old, pp, sizeof old);   /* *PP is any object pointer: copied, not aliased */
	void *p = realloc(old, n * elt);
	if (!p)
		return llm_fail(LLM_ERR_NOMEM, "out of memory: %zu bytes", n * elt);
	memcpy(pp, &p, sizeof p);
	*cap = n;
	return LLM_OK;
}

enum llm_status llm_buf_reserve(struct llm_buf *b, size_t need)
{
	return llm_array_reserve(&b->p, &b->cap, need, 1);
}

enum llm_status llm_buf_append(struct llm_buf *b, const void *s, size_t n)
{
	if (n >= SIZE_MAX - b->len)
		return llm_fail(LLM_ERR_NOMEM, "out of memory: %zu + %zu bytes", b->len, n);
	LLM_TRY(llm_buf_reserve(b, b->len + n + 1));
	if (n)
		memcpy(b->p + b->len, s, n);
	b->len += n;
	b->p[b->len] = 0;
	return LLM_OK;
}

enum llm_status llm_buf_append_str(struct llm_buf *b, const char *s)
{
	return llm_buf_append(b, s, strlen(s));
}

void llm_buf_free(struct llm_buf *b)
{
	free(b->p);
	b->p = NULL;
	b->len = b->cap = 0;
}
