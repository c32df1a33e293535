/* common/base/buf.h: the engine's one growable buffer, and the same growth for
 * a typed array.
 *
 * Capacity at least doubles each time it grows (at least 64 bytes, or 16
 * elements), so N appends cost O(N) copying in all. A failed growth leaves
 * the buffer or array as it was (still owned by the caller, still valid)
 * and returns LLM_ERR_NOMEM with a message. A zeroed struct llm_buf is
 * empty and valid; llm_buf_free leaves it so. */
#ifndef LLM_BUF_H
#define LLM_BUF_H

#include <stddef.h>
#include "status.h"

struct llm_buf {
	char *p;           /* (cap) bytes, heap; NULL while cap is 0 */
	size_t len;        /* bytes used; p[len] == 0 after llm_buf_append */
	size_t cap;
};

/* Room for NEED bytes in all (cap >= NEED). */
enum llm_status llm_buf_reserve(struct llm_buf *b, size_t need);

/* Append the N bytes at S and keep a NUL after them (not counted in len):
 * P is a C string when what was appended holds no NUL. */
enum llm_status llm_buf_append(struct llm_buf *b, const void *s, size_t n);

/* Append a NUL-terminated string. */
enum llm_status llm_buf_append_str(struct llm_buf *b, const char *s);

/* Free the bytes; B is empty again. */
void llm_buf_free(struct llm_buf *b);

/* Room for NEED elements of ELT bytes in the heap array *PP (a pointer to
 * any object pointer; NULL when *CAP is 0) of *CAP elements, ELT >= 1:
 * *PP and *CAP change only on success. */
enum llm_status llm_array_reserve(void *pp, size_t *cap, size_t need, size_t elt);

/* llm_array_reserve for array pointer P (an lvalue) of CAP (size_t) elements. */
#define LLM_ARRAY_RESERVE(p, cap, need) llm_array_reserve(&(p), &(cap), (need), sizeof *(p))

#endif
