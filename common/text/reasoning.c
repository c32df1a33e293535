/* common/text/reasoning.c: <think> blocks split from a chat answer
 * (reasoning.h). Plain byte scanning: the markers are ASCII, so a match
 * never starts inside a UTF-8 character. */
#include "reasoning.h"

#include <string.h>
#include "banned.h"

static const char open_tag[] = "<think>", close_tag[] = "</think>";

int llm_reasoning_of(const char *t)
{
	return t && strstr(t, open_tag) && strstr(t, close_tag);
}

static int is_space(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

int llm_reasoning_prompt_open(const char *p, size_t len)
{
	size_t n = sizeof open_tag - 1;
	while (len && is_space(p[len - 1]))
		len--;
	return len >= n && !memcmp(p + len - n, open_tag, n);
}

/* The first NEEDLE in H[from, n), or n. */
static size_t find(const char *h, size_t from, size_t n, const char *needle)
{
	size_t m = strlen(needle);
	for (size_t i = from; m <= n && i <= n - m; i++)
		if (!memcmp(h + i, needle, m))
			return i;
	return n;
}

/* How many bytes at the end of H[from, n) are a proper prefix of NEEDLE:
 * held back while streaming, as the next token may complete the marker. */
static size_t partial_tail(const char *h, size_t from, size_t n, const char *needle)
{
	size_t m = strlen(needle);
	for (size_t k = m - 1; k > 0; k--)
		if (k <= n - from && !memcmp(h + n - k, needle, k))
			return k;
	return 0;
}

void llm_reasoning_split(const char *t, size_t len, int starts_open, int done, struct llm_reasoning_split *o)
{
	memset(o, 0, sizeof *o);
	size_t i = 0, no = sizeof open_tag - 1, nc = sizeof close_tag - 1;
	if (!starts_open) {
		while (i < len && is_space(t[i]))
			i++;
		size_t k = len - i < no ? len - i : no;
		if (memcmp(t + i, open_tag, k)) {   /* no block: all content */
			o->c_end = len;
			return;
		}
		if (k < no) {                      /* "<thi" so far */
			if (done)
				o->c_end = len;
			return;
		}
		i += no;
	}
	o->has_reasoning = 1;
	while (i < len && is_space(t[i]))
		i++;
	size_t end = find(t, i, len, close_tag);
	o->r_begin = i;
	if (end == len) {                      /* still reasoning */
		size_t e = done ? len : len - partial_tail(t, i, len, close_tag);
		while (e > i && is_space(t[e - 1]))
			e--;                           /* may be the white space before </think> */
		o->r_end = e;
		o->c_begin = o->c_end = len;
		return;
	}
	size_t e = end;
	while (e > i && is_space(t[e - 1]))
		e--;
	o->r_end = e;
	size_t c = end + nc;
	while (c < len && is_space(t[c]))
		c++;
	o->c_begin = c;
	o->c_end = len;
}
