/* common/text/guide.c: JSON, JSON Schema, regular expressions and choices as
 * grammar text (see guide.h for what each accepts and guarantees).
 *
 * The JSON rules are the grammar of RFC 8259 written compact: strings of
 * any characters but the quote, the backslash and controls, or their
 * escapes (\uXXXX without surrogates, so every string is valid Unicode).
 * A schema becomes one rule per schema node (memoized by node, so $ref
 * recursion is grammar recursion). Objects list their properties in the
 * schema's order; the optional ones make two chains of rules, A_i (nothing
 * written yet) and B_i (a comma before the next), so the grammar is linear
 * in the number of properties. Integer bounds become the digit-range
 * alternatives of each length (as a regular expression for [lo, hi]). */
#include "guide.h"
#include "tokenizer.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

#define JSON_RULES \
	"jvalue ::= jobj | jarr | jstr | jnum | \"true\" | \"false\" | \"null\"\n" \
	"jobj ::= \"{\" (jstr \":\" jvalue (\",\" jstr \":\" jvalue)*)? \"}\"\n" \
	"jarr ::= \"[\" (jvalue (\",\" jvalue)*)? \"]\"\n" \
	"jstr ::= \"\\\"\" jchar* \"\\\"\"\n" \
	"jchar ::= [^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" jhex)\n" \
	"jhex ::= [0-9a-cA-CeEfF] [0-9a-fA-F]{3} | [dD] [0-7] [0-9a-fA-F]{2}\n" \
	"jnum ::= \"-\"? jint (\".\" [0-9]{1,15})? ([eE] [-+]? [0-9]{1,2})?\n" \
	"jint ::= \"0\" | [1-9] [0-9]{0,15}\n"

static enum llm_status put(struct llm_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static enum llm_status put(struct llm_buf *b, const char *fmt, ...)
{
	char tmp[256];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	if (n < 0 || (size_t)n >= sizeof tmp)
		return llm_fail(LLM_ERR_INTERNAL, "guide: text too long");
	return llm_buf_append(b, tmp, (size_t)n);
}

/* N bytes at S as a grammar string literal. */
static enum llm_status put_lit(struct llm_buf *b, const char *s, size_t n)
{
	LLM_TRY(llm_buf_append(b, "\"", 1));
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c == '"' || c == '\\')
			LLM_TRY(put(b, "\\%c", c));
		else if (c < 0x20 || c == 0x7F)
			LLM_TRY(put(b, "\\x%02X", c));
		else
			LLM_TRY(llm_buf_append(b, &s[i], 1));
	}
	return llm_buf_append(b, "\"", 1);
}

enum llm_status llm_guide_json_object(struct llm_buf *out)
{
	return llm_buf_append_str(out, "root ::= jobj\n" JSON_RULES);
}

enum llm_status llm_guide_choice(const char *const *choice, size_t n, struct llm_buf *out)
{
	if (!n)
		return llm_fail(LLM_ERR_USAGE, "expected at least one choice");
	LLM_TRY(llm_buf_append_str(out, "root ::= "));
	for (size_t i = 0; i < n; i++) {
		if (i)
			LLM_TRY(llm_buf_append_str(out, " | "));
		LLM_TRY(put_lit(out, choice[i], strlen(choice[i])));
	}
	return llm_buf_append_str(out, "\n");
}

/* ---- regular expressions ----------------------------------------------- */

struct range { uint32_t lo, hi; };
#define MAX_RANGES 120

struct rx {
	const char *p, *s, *e;
	struct llm_buf *b;
	int json;                  /* inside a JSON string: quote, backslash, controls escaped */
	int depth;
	int nullable;              /* of what was parsed last */
	enum llm_status st;
};

static int rx_fail(struct rx *x, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int rx_fail(struct rx *x, const char *fmt, ...)
{
	char m[200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	if (!x->st)
		x->st = llm_fail(LLM_ERR_USAGE, "at offset %ld: %s", (long)(x->p - x->s), m);
	return -1;
}

static int rx_put(struct rx *x, enum llm_status s)
{
	if (s && !x->st)
		x->st = s;
	return s ? -1 : 0;
}

/* One code point in a grammar literal; in JSON mode as the string's escape where JSON needs one. */
static int rx_char(struct rx *x, uint32_t c)
{
	if (x->json && c == '"')
		return rx_put(x, llm_buf_append_str(x->b, "\"\\\\\\\"\" "));
	if (x->json && c == '\\')
		return rx_put(x, llm_buf_append_str(x->b, "\"\\\\\\\\\" "));
	if (x->json && c < 0x20)
		return rx_put(x, put(x->b, "\"\\\\u00%02X\" ", c));
	if (c >= 0x20 && c < 0x7F && c != '"' && c != '\\')
		return rx_put(x, put(x->b, "\"%c\" ", (char)c));
	return rx_put(x, put(x->b, "\"\\U%08X\" ", c));
}

static int add_range(struct rx *x, struct range *rg, size_t *n, uint32_t lo, uint32_t hi)
{
	if (*n >= MAX_RANGES)
		return rx_fail(x, "character class too large");
	rg[(*n)++] = (struct range){ lo, hi };
	return 0;
}

static int range_cmp(const void *a, const void *b)
{
	const struct range *p = a, *q = b;
	return p->lo < q->lo ? -1 : p->lo > q->lo;
}

/* Sorted, merged; NEG: complemented within [0, TOP]. */
static size_t ranges_norm(struct range *rg, size_t n, int neg, uint32_t top)
{
	qsort(rg, n, sizeof *rg, range_cmp);
	size_t m = 0;
	for (size_t i = 0; i < n; i++) {
		if (m && rg[i].lo <= rg[m - 1].hi + 1) {
			if (rg[i].hi > rg[m - 1].hi)
				rg[m - 1].hi = rg[i].hi;
		} else {
			rg[m++] = rg[i];
		}
	}
	if (!neg)
		return m;
	struct range c[MAX_RANGES + 1];
	size_t k = 0;
	uint32_t at = 0;
	for (size_t i = 0; i < m && at <= top; i++) {
		if (rg[i].lo > at)
			c[k++] = (struct range){ at, rg[i].lo - 1 < top ? rg[i].lo - 1 : top };
		at = rg[i].hi + 1;
	}
	if (at <= top)
		c[k++] = (struct range){ at, top };
	memcpy(rg, c, k * sizeof *c);
	return k;
}

/* RG (room for MAX_RANGES) less the code points JSON strings escape (quote, backslash, controls). */
static size_t ranges_json(struct range *rg, size_t n)
{
	struct range out[MAX_RANGES * 2 + 2];
	size_t k = 0;
	static const struct range cut[] = { { 0, 0x1F }, { '"', '"' }, { '\\', '\\' } };
	for (size_t i = 0; i < n; i++) {
		struct range r = rg[i];
		for (size_t j = 0; j < 3 && r.lo <= r.hi; j++) {
			if (cut[j].hi < r.lo || cut[j].lo > r.hi)
				continue;
			if (r.lo < cut[j].lo)
				out[k++] = (struct range){ r.lo, cut[j].lo - 1 };
			r.lo = cut[j].hi + 1;
		}
		if (r.lo <= r.hi)
			out[k++] = r;
	}
	if (k > MAX_RANGES)
		k = MAX_RANGES;   /* only fewer characters: still valid */
	memcpy(rg, out, k * sizeof *out);
	return k;
}

static int rx_class_put(struct rx *x, struct range *rg, size_t n)
{
	if (x->json)
		n = ranges_json(rg, n);
	if (!n)
		return rx_fail(x, x->json ? "a class of only quotes, backslashes or control characters" : "a class that matches nothing");
	if (rx_put(x, llm_buf_append_str(x->b, "[")))
		return -1;
	for (size_t i = 0; i < n; i++)
		if (rx_put(x, rg[i].lo == rg[i].hi ? put(x->b, "\\U%08X", rg[i].lo) : put(x->b, "\\U%08X-\\U%08X", rg[i].lo, rg[i].hi)))
			return -1;
	return rx_put(x, llm_buf_append_str(x->b, "] "));
}

/* \d \w \s (and D W S): their ASCII ranges; *NEG for the capitals. */
static int rx_shorthand(struct rx *x, int c, struct range *rg, size_t *n, int *neg)
{
	*neg = c == 'D' || c == 'W' || c == 'S';
	switch (c | 0x20) {
	case 'd': return add_range(x, rg, n, '0', '9');
	case 'w': return add_range(x, rg, n, '0', '9') || add_range(x, rg, n, 'A', 'Z') || add_range(x, rg, n, 'a', 'z') ||
	                 add_range(x, rg, n, '_', '_');
	case 's': return add_range(x, rg, n, '\t', '\r') || add_range(x, rg, n, 0x1C, ' ');
	}
	return 1;
}

static int hexv(int c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* A code point of the pattern (after '\' when ESC): its value, or -1. */
static long rx_cp(struct rx *x, int esc)
{
	if (x->p >= x->e)
		return rx_fail(x, "unexpected end");
	if (esc) {
		int c = (unsigned char)*x->p++, nd = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
		if (nd) {
			long v = 0;
			for (int i = 0; i < nd; i++) {
				int h = x->p < x->e ? hexv((unsigned char)*x->p) : -1;
				if (h < 0)
					return rx_fail(x, "\\%c needs %d hex digits", c, nd);
				v = v * 16 + h;
				x->p++;
			}
			if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
				return rx_fail(x, "\\%c escape is not a character", c);
			return v;
		}
		switch (c) {
		case 'n': return '\n';
		case 't': return '\t';
		case 'r': return '\r';
		case 'f': return '\f';
		case 'v': return '\v';
		case 'a': return '\a';
		case '0': return 0;
		}
		if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9'))
			return rx_fail(x, "the escape \\%c is not supported", c);
		return c;
	}
	const unsigned char *p = (const unsigned char *)x->p;
	int n = *p < 0x80 ? 1 : (*p & 0xE0) == 0xC0 ? 2 : (*p & 0xF0) == 0xE0 ? 3 : (*p & 0xF8) == 0xF0 ? 4 : 0;
	if (!n || x->p + n > x->e)
		return rx_fail(x, "invalid UTF-8");
	long v = n == 1 ? *p : *p & (0x7F >> n);
	for (int i = 1; i < n; i++) {
		if ((p[i] & 0xC0) != 0x80)
			return rx_fail(x, "invalid UTF-8");
		v = v << 6 | (p[i] & 0x3F);
	}
	if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) || v < (n == 2 ? 0x80 : n == 3 ? 0x800 : n == 4 ? 0x10000 : 0))
		return rx_fail(x, "invalid UTF-8");   /* beyond Unicode, a surrogate, or overlong */
	x->p += n;
	return v;
}

static int rx_class(struct rx *x)
{
	struct range rg[MAX_RANGES + 1];
	size_t n = 0;
	int neg = 0, ascii = 0;
	if (x->p < x->e && *x->p == '^') {
		neg = 1;
		x->p++;
	}
	for (int first = 1; ; first = 0) {
		if (x->p >= x->e)
			return rx_fail(x, "unterminated class");
		if (*x->p == ']' && !first)
			break;
		int esc = *x->p == '\\';
		x->p += esc;
		if (esc && x->p < x->e && strchr("dwsDWS", *x->p)) {
			struct range sub[8];
			size_t k = 0;
			int sneg;
			if (rx_shorthand(x, *x->p++, sub, &k, &sneg))
				return -1;
			if (sneg) {   /* a negated shorthand in a class: its ASCII complement */
				k = ranges_norm(sub, k, 1, 0x7F);
				ascii = 1;
			} else if (neg) {
				ascii = 1;
			}
			for (size_t i = 0; i < k; i++)
				if (add_range(x, rg, &n, sub[i].lo, sub[i].hi))
					return -1;
			continue;
		}
		long lo = rx_cp(x, esc), hi = lo;
		if (lo < 0)
			return -1;
		if (x->e - x->p >= 2 && x->p[0] == '-' && x->p[1] != ']') {
			x->p++;
			int e2 = *x->p == '\\';
			x->p += e2;
			if ((hi = rx_cp(x, e2)) < 0)
				return -1;
			if (hi < lo)
				return rx_fail(x, "bad range");
		}
		if (add_range(x, rg, &n, (uint32_t)lo, (uint32_t)hi))
			return -1;
	}
	x->p++;
	/* Python's \d \w \s are Unicode-wide: a complement that holds them keeps to ASCII */
	n = ranges_norm(rg, n, neg, ascii ? 0x7F : 0x10FFFF);
	return rx_class_put(x, rg, n);
}

static int rx_alt(struct rx *x);

static int rx_atom(struct rx *x)
{
	char c = *x->p;
	x->nullable = 0;                /* a group's is its alternatives' */
	if (c == '(') {
		x->p++;
		if (x->p < x->e && *x->p == '?') {
			if (x->e - x->p >= 2 && x->p[1] == ':')
				x->p += 2;
			else if (x->e - x->p >= 3 && x->p[1] == 'P' && x->p[2] == '<') {
				const char *q = memchr(x->p, '>', (size_t)(x->e - x->p));
				if (!q)
					return rx_fail(x, "unterminated group name");
				x->p = q + 1;
			} else {
				return rx_fail(x, "'(?' groups other than (?:...) and (?P<name>...) are not supported");
			}
		}
		if (++x->depth > 100)
			return rx_fail(x, "groups nested too deep");
		if (rx_put(x, llm_buf_append_str(x->b, "(")) || rx_alt(x))
			return -1;
		x->depth--;
		if (x->p >= x->e || *x->p != ')')
			return rx_fail(x, "expected ')'");
		x->p++;
		return rx_put(x, llm_buf_append_str(x->b, ") "));
	}
	if (c == '[') {
		x->p++;
		return rx_class(x);
	}
	if (c == '.') {               /* any character but a newline */
		x->p++;
		struct range rg[MAX_RANGES + 1] = { { 0, 9 }, { 11, 0x10FFFF } };   /* room for the JSON cuts */
		return rx_class_put(x, rg, 2);
	}
	if (c == '^' || c == '$')
		return rx_fail(x, "'%c' is supported only at the start or the end", c);
	if (c == '*' || c == '+' || c == '?' || c == '{')
		return rx_fail(x, "nothing to repeat");
	int esc = c == '\\';
	x->p += esc;
	if (esc && x->p < x->e && strchr("dwsDWS", *x->p)) {
		struct range rg[MAX_RANGES + 1];
		size_t n = 0;
		int neg;
		if (rx_shorthand(x, *x->p++, rg, &n, &neg))
			return -1;
		n = ranges_norm(rg, n, neg, 0x7F);
		return rx_class_put(x, rg, n);
	}
	if (esc && x->p < x->e && *x->p >= '1' && *x->p <= '9')
		return rx_fail(x, "back-references are not supported");
	if (esc && x->p < x->e && strchr("bBAZ", *x->p))
		return rx_fail(x, "the anchor \\%c is not supported", *x->p);
	long cp = rx_cp(x, esc);
	return cp < 0 ? -1 : rx_char(x, (uint32_t)cp);
}

static int rx_count(struct rx *x, long *v)
{
	int n = 0;
	*v = 0;
	while (x->p < x->e && *x->p >= '0' && *x->p <= '9' && n < 6) {
		*v = *v * 10 + (*x->p++ - '0');
		n++;
	}
	return n;
}

/* Repetitions of an atom that can match the empty text (as (a?)*) would
 * be left recursion in the grammar: unbounded ones are written bounded,
 * {0,m+16}, which matches a subset of the same texts (each of which the
 * pattern still matches). */
#define RX_EMPTY_REPS 16

/* A sequence; x->nullable: whether it matches the empty text. */
static int rx_seq(struct rx *x)
{
	int nullable = 1;
	while (x->p < x->e && *x->p != '|' && *x->p != ')') {
		if (*x->p == '$' && x->p + 1 == x->e && !x->depth) {
			x->p++;
			break;
		}
		/* the atom goes in a group of its own, so a repetition applies to it alone */
		if (rx_put(x, llm_buf_append_str(x->b, "(")) || rx_atom(x) || rx_put(x, llm_buf_append_str(x->b, ")")))
			return -1;
		int an = x->nullable;
		long m = 1, n = 1;
		if (x->p < x->e && (*x->p == '?' || *x->p == '*' || *x->p == '+')) {
			m = *x->p == '+';
			n = *x->p == '?' ? 1 : -1;
			x->p++;
		} else if (x->p < x->e && *x->p == '{') {
			x->p++;
			int hm = rx_count(x, &m);
			if (x->p < x->e && *x->p == ',') {
				x->p++;
				if (!rx_count(x, &n))
					n = -1;
			} else {
				n = m;
			}
			if ((!hm && n < 0) || x->p >= x->e || *x->p != '}')
				return rx_fail(x, "'{' must start a repetition {m}, {m,}, {,n} or {m,n}");
			x->p++;
			if ((n >= 0 && n < m) || m > 10000 - RX_EMPTY_REPS || n > 10000)
				return rx_fail(x, "repetition {%ld,%ld}: bounds out of order or beyond 10000", m, n);
		}
		if (an && n < 0) {
			n = m + RX_EMPTY_REPS;
			m = 0;
		}
		if ((m != 1 || n != 1) && rx_put(x, n < 0 ? put(x->b, "{%ld,}", m) : put(x->b, "{%ld,%ld}", m, n)))
			return -1;
		nullable &= an || m == 0;
		if (x->p < x->e && *x->p == '?')   /* lazy: the same texts */
			x->p++;
		if (x->p < x->e && (*x->p == '*' || *x->p == '+' || *x->p == '{' || *x->p == '?'))
			return rx_fail(x, "multiple repeat");
		if (rx_put(x, llm_buf_append_str(x->b, " ")))
			return -1;
	}
	x->nullable = nullable;
	return 0;
}

/* Alternatives; x->nullable: whether one matches the empty text. */
static int rx_alt(struct rx *x)
{
	int nullable = 0;
	for (;;) {
		if (rx_seq(x))
			return -1;
		nullable |= x->nullable;
		if (x->p < x->e && *x->p == '|') {
			x->p++;
			if (rx_put(x, llm_buf_append_str(x->b, "| ")))
				return -1;
			continue;
		}
		x->nullable = nullable;
		return 0;
	}
}

/* The pattern's rule body (no rule name) appended to B. */
static enum llm_status regex_body(const char *re, size_t len, int json, struct llm_buf *b)
{
	struct rx x = { .p = re, .s = re, .e = re + len, .b = b, .json = json };
	if (x.p < x.e && *x.p == '^')
		x.p++;
	if (llm_buf_append_str(b, "(") || rx_alt(&x))
		return x.st ? x.st : llm_fail(LLM_ERR_NOMEM, "out of memory");
	if (x.p < x.e)
		return rx_fail(&x, "unmatched ')'"), x.st;
	return llm_buf_append_str(b, ")");
}

enum llm_status llm_guide_regex(const char *re, size_t len, struct llm_buf *out)
{
	LLM_TRY(llm_buf_append_str(out, "root ::= "));
	LLM_TRY(regex_body(re, len, 0, out));
	return llm_buf_append_str(out, "\n");
}

/* ---- JSON Schema ------------------------------------------------------- */

struct sc {
	struct llm_buf *out;
	const json_t *root;
	struct { const json_t *s; int id, depth, open; } *memo;   /* open: being written, at depth */
	size_t n_memo, cap_memo;
	int n_rule, depth;
	/* left recursion: a schema reached again through $ref and anyOf alone,
	 * which write no text before their target, is a grammar rule that
	 * starts with itself */
	int call_left;             /* the next gen() is entered by $ref or anyOf */
	int lstart;                /* the depth from which every entry so far was by $ref or anyOf */
	const char *ref;           /* the $ref being followed */
	char path[200];
	enum llm_status st;
};

static int sfail(struct sc *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sfail(struct sc *c, const char *fmt, ...)
{
	char m[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	if (!c->st)
		c->st = llm_fail(LLM_ERR_USAGE, "%s: %s", c->path, m);
	return -1;
}

static int sput(struct sc *c, struct llm_buf *b, enum llm_status s)
{
	(void)b;
	if (s && !c->st)
		c->st = s;
	return s ? -1 : 0;
}

/* Keywords this code honours; others are refused by name. The
 * annotations change nothing in what validates. */
static const char *const known[] = {
	"type", "properties", "required", "additionalProperties", "items", "minItems", "maxItems", "enum", "const",
	"anyOf", "$ref", "$defs", "definitions", "minLength", "maxLength", "pattern", "minimum", "maximum",
	"exclusiveMinimum", "exclusiveMaximum",
	"title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated", "readOnly", "writeOnly",
};
#define N_ANNOT 10   /* the last ones of known[] */

static int is_annotation(const char *k)
{
	size_t n = sizeof known / sizeof *known;
	for (size_t i = n - N_ANNOT; i < n; i++)
		if (!strcmp(k, known[i]))
			return 1;
	return !strcmp(k, "$defs") || !strcmp(k, "definitions");
}

static int gen(struct sc *c, const json_t *s, int *id);

/* The path for a child: PATH.KEY, restored by the caller from SAVE. */
static size_t path_push(struct sc *c, const char *key)
{
	size_t n = strlen(c->path);
	snprintf(c->path + n, sizeof c->path - n, ".%s", key);
	return n;
}

static int gen_child(struct sc *c, const json_t *s, const char *key, int *id)
{
	size_t save = path_push(c, key);
	int r = gen(c, s, id);
	if (!r)
		c->path[save] = 0;
	return r;
}

static int new_rule(struct sc *c) { return c->n_rule++; }

static int emit_rule(struct sc *c, int id, const struct llm_buf *body)
{
	return sput(c, c->out, put(c->out, "s%d ::= ", id)) ||
	       sput(c, c->out, llm_buf_append(c->out, body->p ? body->p : "", body->len)) ||
	       sput(c, c->out, llm_buf_append_str(c->out, "\n"));
}

static int type_ok(const json_t *v, const char *t)
{
	if (!t)
		return 1;
	if (!strcmp(t, "string")) return json_is_string(v);
	if (!strcmp(t, "integer")) return json_is_integer(v) || (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)));
	if (!strcmp(t, "number")) return json_is_number(v);
	if (!strcmp(t, "boolean")) return json_is_boolean(v);
	if (!strcmp(t, "null")) return json_is_null(v);
	if (!strcmp(t, "object")) return json_is_object(v);
	if (!strcmp(t, "array")) return json_is_array(v);
	return 0;
}

/* A count keyword in [0, 10000], or DFLT when absent. */
static int get_count(struct sc *c, const json_t *s, const char *k, long dflt, long *v)
{
	const json_t *x = json_object_get(s, k);
	*v = dflt;
	if (!x)
		return 0;
	if (!json_is_integer(x) || json_integer_value(x) < 0)
		return sfail(c, "%s: expected a non-negative integer", k);
	if (json_integer_value(x) > 10000)
		return sfail(c, "%s: %lld is beyond what is supported (10000)", k, (long long)json_integer_value(x));
	*v = (long)json_integer_value(x);
	return 0;
}

/* The digits of [lo, hi], both of N digits, as grammar text. */
static int digits_range(struct sc *c, struct llm_buf *b, const char *lo, const char *hi, int n)
{
	if (n == 1)
		return sput(c, b, lo[0] == hi[0] ? put(b, "\"%c\"", lo[0]) : put(b, "[%c-%c]", lo[0], hi[0]));
	if (lo[0] == hi[0])
		return sput(c, b, put(b, "\"%c\" ", lo[0])) || digits_range(c, b, lo + 1, hi + 1, n - 1);
	char nine[24], zero[24];
	memset(nine, '9', sizeof nine);
	memset(zero, '0', sizeof zero);
	int lo_z = !memcmp(lo + 1, zero, (size_t)n - 1), hi_n = !memcmp(hi + 1, nine, (size_t)n - 1);
	char a = lo[0], z = hi[0];
	int first = 1;
	if (sput(c, b, llm_buf_append_str(b, "(")))
		return -1;
	if (!lo_z) {
		if (sput(c, b, put(b, "\"%c\" ", a)) || digits_range(c, b, lo + 1, nine, n - 1))
			return -1;
		a++;
		first = 0;
	}
	char z2 = hi_n ? z : (char)(z - 1);
	if (a <= z2) {
		if (sput(c, b, put(b, "%s[%c-%c] [0-9]{%d}", first ? "" : " | ", a, z2, n - 1)))
			return -1;
		first = 0;
	}
	if (!hi_n && (sput(c, b, put(b, "%s\"%c\" ", first ? "" : " | ", z)) || digits_range(c, b, zero, hi + 1, n - 1)))
		return -1;
	return sput(c, b, llm_buf_append_str(b, ")"));
}

/* Non-negative integers in [lo, hi] (hi < 0: no bound, at most MAXD digits). */
static int uint_range(struct sc *c, struct llm_buf *b, unsigned long long lo, long long hi, int maxd)
{
	char ls[24], hs[24];
	int ld = snprintf(ls, sizeof ls, "%llu", lo), hd = hi >= 0 ? snprintf(hs, sizeof hs, "%lld", hi) : maxd;
	int first = 1;
	if (sput(c, b, llm_buf_append_str(b, "(")))
		return -1;
	for (int d = ld; d <= hd; d++) {
		char a[24], z[24];
		if (d == ld)
			memcpy(a, ls, (size_t)d + 1);
		else {
			a[0] = '1';
			memset(a + 1, '0', (size_t)d - 1);
			a[d] = 0;
		}
		if (hi >= 0 && d == hd)
			memcpy(z, hs, (size_t)d + 1);
		else {
			memset(z, '9', (size_t)d);
			z[d] = 0;
		}
		if (sput(c, b, llm_buf_append_str(b, first ? "" : " | ")) || digits_range(c, b, a, z, d))
			return -1;
		first = 0;
	}
	return sput(c, b, llm_buf_append_str(b, ")"));
}

/* An integer bound: minimum/maximum/exclusive*, as an integer. 0 absent, 1 set, -1 bad. */
static int int_bound(struct sc *c, const json_t *s, const char *k, int up, long long *v)
{
	const json_t *x = json_object_get(s, k);
	if (!x)
		return 0;
	if (!json_is_number(x))
		return sfail(c, "%s: expected a number", k);
	double d = json_number_value(x);
	if (!(fabs(d) <= 1e15))
		return sfail(c, "%s: %g is beyond what is supported (|bound| <= 1e15)", k, d);
	int excl = !strncmp(k, "exclusive", 9);
	double r = up ? floor(d) : ceil(d);
	if (excl && r == d)
		r += up ? -1 : 1;
	*v = (long long)r;
	return 1;
}

static int gen_integer(struct sc *c, const json_t *s, struct llm_buf *b)
{
	long long lo = 0, hi = 0, t;
	int hl = 0, hh = 0, r;
	static const char *const lk[] = { "minimum", "exclusiveMinimum" }, *const hk[] = { "maximum", "exclusiveMaximum" };
	for (int i = 0; i < 2; i++) {
		if ((r = int_bound(c, s, lk[i], 0, &t)) < 0)
			return -1;
		if (r && (!hl || t > lo))
			lo = t, hl = 1;
		if ((r = int_bound(c, s, hk[i], 1, &t)) < 0)
			return -1;
		if (r && (!hh || t < hi))
			hi = t, hh = 1;
	}
	if (!hl && !hh)
		return sput(c, b, llm_buf_append_str(b, "\"-\"? jint"));
	if (hl && hh && lo > hi)
		return sfail(c, "no integer lies between the bounds");
	int first = 1;
	if (sput(c, b, llm_buf_append_str(b, "(")))
		return -1;
	if (!hl || lo < 0) {          /* negative: "-" and the magnitudes [max(1, -hi), -lo] */
		long long mlo = hh && hi < 0 ? -hi : 1, mhi = hl ? -lo : -1;
		if (sput(c, b, llm_buf_append_str(b, "\"-\" ")) || uint_range(c, b, (unsigned long long)mlo, mhi, 16))
			return -1;
		first = 0;
	}
	if (!hh || hi >= 0) {
		if (sput(c, b, llm_buf_append_str(b, first ? "" : " | ")) ||
		    uint_range(c, b, (unsigned long long)(hl && lo > 0 ? lo : 0), hh ? hi : -1, 16))
			return -1;
	}
	return sput(c, b, llm_buf_append_str(b, ")"));
}

static int gen_string(struct sc *c, const json_t *s, struct llm_buf *b)
{
	long mn, mx;
	const json_t *pat = json_object_get(s, "pattern");
	if (get_count(c, s, "minLength", 0, &mn) || get_count(c, s, "maxLength", -1, &mx))
		return -1;
	if (pat) {
		if (!json_is_string(pat))
			return sfail(c, "pattern: expected a string");
		if (json_object_get(s, "minLength") || json_object_get(s, "maxLength"))
			return sfail(c, "pattern with minLength or maxLength is not supported");
		if (sput(c, b, llm_buf_append_str(b, "\"\\\"\" ")))
			return -1;
		enum llm_status st = regex_body(json_string_value(pat), json_string_length(pat), 1, b);
		if (st)
			return sfail(c, "pattern: %s", llm_errmsg());
		return sput(c, b, llm_buf_append_str(b, " \"\\\"\""));
	}
	if (mx >= 0 && mx < mn)
		return sfail(c, "maxLength is below minLength");
	if (mx < 0)
		return sput(c, b, mn ? put(b, "\"\\\"\" jchar{%ld,} \"\\\"\"", mn) : put(b, "jstr"));
	return sput(c, b, put(b, "\"\\\"\" jchar{%ld,%ld} \"\\\"\"", mn, mx));
}

static int gen_array(struct sc *c, const json_t *s, struct llm_buf *b)
{
	long mn, mx;
	const json_t *it = json_object_get(s, "items");
	if (get_count(c, s, "minItems", 0, &mn) || get_count(c, s, "maxItems", -1, &mx))
		return -1;
	if (mx >= 0 && mx < mn)
		return sfail(c, "maxItems is below minItems");
	if (it && !json_is_object(it) && !json_is_boolean(it))
		return sfail(c, "items: only a schema is supported (not a list)");
	int id = -1;
	if (it && json_is_false(it)) {
		if (mn > 0)
			return sfail(c, "items false with minItems > 0 matches nothing");
		return sput(c, b, llm_buf_append_str(b, "\"[]\""));
	}
	if (it && gen_child(c, it, "items", &id))
		return -1;
	char item[24];
	snprintf(item, sizeof item, id >= 0 ? "s%d" : "jvalue", id);
	if (mx == 0)
		return sput(c, b, llm_buf_append_str(b, "\"[]\""));
	if (sput(c, b, put(b, "\"[\" %s%s", mn ? "" : "(", item)))
		return -1;
	long rmin = mn ? mn - 1 : 0, rmax = mx < 0 ? -1 : mx - 1;
	if (rmax < 0 ? sput(c, b, put(b, " (\",\" %s){%ld,}", item, rmin)) : sput(c, b, put(b, " (\",\" %s){%ld,%ld}", item, rmin, rmax)))
		return -1;
	return sput(c, b, put(b, "%s \"]\"", mn ? "" : ")?"));
}

static int gen_object(struct sc *c, const json_t *s, struct llm_buf *b)
{
	const json_t *props = json_object_get(s, "properties"), *req = json_object_get(s, "required"),
	             *ap = json_object_get(s, "additionalProperties");
	if (props && !json_is_object(props))
		return sfail(c, "properties: expected an object");
	if (req && !json_is_array(req))
		return sfail(c, "required: expected an array of names");
	if (ap && !json_is_boolean(ap) && !json_is_object(ap))
		return sfail(c, "additionalProperties: expected a boolean or a schema");
	size_t n = props ? json_object_size(props) : 0;
	for (size_t i = 0; req && i < json_array_size(req); i++) {
		const json_t *r = json_array_get(req, i);
		if (!json_is_string(r))
			return sfail(c, "required: expected an array of names");
		if (!props || !json_object_get(props, json_string_value(r)))
			return sfail(c, "required: '%s' is not among the properties (not supported)", json_string_value(r));
	}
	if (!n) {
		if (ap && json_is_object(ap)) {   /* a map: any keys, values of the schema */
			int id;
			if (gen_child(c, ap, "additionalProperties", &id))
				return -1;
			return sput(c, b, put(b, "\"{\" (jstr \":\" s%d (\",\" jstr \":\" s%d)*)? \"}\"", id, id));
		}
		return sput(c, b, llm_buf_append_str(b, "\"{}\""));
	}
	json_t *reqset = json_object();   /* the required names, for lookups in constant time */
	for (size_t k = 0; reqset && req && k < json_array_size(req); k++)
		json_object_set(reqset, json_string_value(json_array_get(req, k)), json_true());
	if (!reqset)
		return sput(c, b, llm_fail(LLM_ERR_NOMEM, "out of memory"));
	/* kv_i, then the chains: A_i ::= kv_i B_i+1 (| A_i+1 when optional),
	 * B_i ::= "," kv_i B_i+1 (| B_i+1 when optional); A_n = B_n = "" */
	int base = c->n_rule;
	c->n_rule += 3 * (int)n + 2;   /* kv: base+i, A: base+n+i, B: base+2n+1+i */
	const char *key;
	json_t *ps;
	size_t i = 0;
	struct llm_buf rb = { 0 };
	int rc = 0;
	void *iter = json_object_iter((json_t *)props);
	for (; iter && !rc; iter = json_object_iter_next((json_t *)props, iter), i++) {
		key = json_object_iter_key(iter);
		ps = json_object_iter_value(iter);
		int req_i = json_object_get(reqset, key) != NULL;
		int id;
		size_t save = path_push(c, "properties");
		rc = gen_child(c, ps, key, &id);
		if (rc)
			break;
		c->path[save] = 0;
		json_t *ks = json_string(key);
		char *kj = ks ? json_dumps(ks, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
		json_decref(ks);
		rb.len = 0;
		rc = !kj || put_lit(&rb, kj, strlen(kj)) || put(&rb, " \":\" s%d", id) ? sput(c, b, llm_fail(LLM_ERR_NOMEM, "out of memory")) : 0;
		free(kj);
		if (rc || (rc = emit_rule(c, base + (int)i, &rb)))
			break;
		int kv = base + (int)i, A = base + (int)n + (int)i, B = base + 2 * (int)n + 1 + (int)i;
		rb.len = 0;
		if (put(&rb, "s%d s%d%s", kv, B + 1, "") || (!req_i && put(&rb, " | s%d", A + 1)) ||
		    (rc = emit_rule(c, A, &rb)))
			rc = rc ? rc : sput(c, b, LLM_ERR_NOMEM);
		if (rc)
			break;
		rb.len = 0;
		if (put(&rb, "\",\" s%d s%d", kv, B + 1) || (!req_i && put(&rb, " | s%d", B + 1)) ||
		    (rc = emit_rule(c, B, &rb)))
			rc = rc ? rc : sput(c, b, LLM_ERR_NOMEM);
	}
	if (!rc) {
		rb.len = 0;
		if (put(&rb, "\"\"") || emit_rule(c, base + 2 * (int)n, &rb) || emit_rule(c, base + 3 * (int)n + 1, &rb))
			rc = sput(c, b, LLM_ERR_NOMEM);
	}
	llm_buf_free(&rb);
	json_decref(reqset);
	if (rc)
		return -1;
	return sput(c, b, put(b, "\"{\" s%d \"}\"", base + (int)n));
}

/* The body for one type T of schema S. */
static int gen_type(struct sc *c, const json_t *s, const char *t, struct llm_buf *b)
{
	if (!strcmp(t, "string"))
		return gen_string(c, s, b);
	if (!strcmp(t, "integer"))
		return gen_integer(c, s, b);
	if (!strcmp(t, "number")) {
		static const char *const bk[] = { "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum" };
		for (int i = 0; i < 4; i++)
			if (json_object_get(s, bk[i]))
				return sfail(c, "%s: bounds are supported on integers only (not type number)", bk[i]);
		return sput(c, b, llm_buf_append_str(b, "jnum"));
	}
	if (!strcmp(t, "boolean"))
		return sput(c, b, llm_buf_append_str(b, "\"true\" | \"false\""));
	if (!strcmp(t, "null"))
		return sput(c, b, llm_buf_append_str(b, "\"null\""));
	if (!strcmp(t, "object"))
		return gen_object(c, s, b);
	if (!strcmp(t, "array"))
		return gen_array(c, s, b);
	return sfail(c, "type: unknown type '%s'", t);
}

/* A local reference "#", "#/$defs/NAME" or "#/definitions/NAME". */
static const json_t *resolve(struct sc *c, const char *ref)
{
	if (!strcmp(ref, "#"))
		return c->root;
	const char *pre[] = { "#/$defs/", "#/definitions/" };
	for (int i = 0; i < 2; i++) {
		size_t n = strlen(pre[i]);
		if (!strncmp(ref, pre[i], n)) {
			const json_t *d = json_object_get(c->root, i ? "definitions" : "$defs");
			const json_t *t = d ? json_object_get(d, ref + n) : NULL;
			if (t)
				return t;
		}
	}
	sfail(c, "$ref: '%s' is not a local definition (#/$defs/NAME, #/definitions/NAME or #)", ref);
	return NULL;
}

/* Sorting values' texts (byte order, a prefix first). */
struct vtext { const char *s; size_t n; };
static int vtext_cmp(const void *a, const void *b)
{
	const struct vtext *x = a, *y = b;
	int r = memcmp(x->s, y->s, x->n < y->n ? x->n : y->n);
	return r ? r : (x->n > y->n) - (x->n < y->n);
}

/* The N texts VALS (VLEN bytes each) as alternatives into B, factored by
 * their common prefixes: a rule per branching of the texts' trie, written
 * from a work list (no recursion), so the grammar is linear in the texts'
 * bytes and its states stay small (a 100000-value enum would otherwise
 * start with 100000 stacks, which every byte of every token scans). */
static int values_trie(struct sc *c, struct llm_buf *b, char **vals, const size_t *vlen, size_t n)
{
	struct vtext *v = malloc((n + 1) * sizeof *v);
	struct task { size_t lo, hi, d; int id; } *todo = malloc((n + 1) * sizeof *todo);
	struct llm_buf rb = { 0 };
	size_t nt = 0, m = 0;
	int rc = 0;
	if (!v || !todo) {
		rc = sput(c, b, llm_fail(LLM_ERR_NOMEM, "out of memory"));
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		v[i] = (struct vtext){ vals[i], vlen[i] };
	qsort(v, n, sizeof *v, vtext_cmp);
	for (size_t i = 0; i < n; i++)   /* duplicates once */
		if (!m || vtext_cmp(&v[m - 1], &v[i]))
			v[m++] = v[i];
	todo[nt++] = (struct task){ 0, m, 0, -1 };   /* -1: the node's alternatives go into B */
	while (nt && !rc) {
		struct task t = todo[--nt];
		struct llm_buf *o = t.id < 0 ? b : &rb;
		rb.len = 0;
		if (t.id < 0)
			rc = sput(c, b, llm_buf_append_str(b, "("));
		for (size_t a = t.lo, first = 1; a < t.hi && !rc; first = 0) {
			size_t z = a + 1;
			if (v[a].n == t.d) {      /* a text that ends here */
				rc = sput(c, o, llm_buf_append_str(o, first ? "\"\"" : " | \"\""));
				a = z;
				continue;
			}
			while (z < t.hi && v[z].s[t.d] == v[a].s[t.d])
				z++;
			size_t l = t.d;           /* the group's common prefix: its first and last text's */
			while (l < v[a].n && l < v[z - 1].n && v[a].s[l] == v[z - 1].s[l])
				l++;
			rc = sput(c, o, llm_buf_append_str(o, first ? "" : " | ")) || sput(c, o, put_lit(o, v[a].s + t.d, l - t.d));
			if (!rc && z - a > 1) {
				int id = new_rule(c);
				todo[nt++] = (struct task){ a, z, l, id };
				rc = sput(c, o, put(o, " s%d", id));
			}
			a = z;
		}
		if (!rc)
			rc = t.id < 0 ? sput(c, b, llm_buf_append_str(b, ")")) : emit_rule(c, t.id, &rb);
	}
out:
	llm_buf_free(&rb);
	free(v);
	free(todo);
	return rc;
}

static int gen(struct sc *c, const json_t *s, int *id)
{
	int left = c->call_left;
	c->call_left = 0;
	for (size_t i = c->n_memo; i-- > 0; )
		if (c->memo[i].s == s) {
			if (left && c->memo[i].open && c->lstart <= c->memo[i].depth)
				return sfail(c, "$ref '%s' comes back to its own schema before any text (left recursion)",
				             c->ref ? c->ref : "");
			*id = c->memo[i].id;
			return 0;
		}
	if (++c->depth > 64)
		return sfail(c, "schema nested too deep");
	int lstart = c->lstart;
	if (!left)
		c->lstart = c->depth;
	if (json_is_boolean(s)) {
		if (json_is_false(s))
			return sfail(c, "the schema false matches nothing");
	} else if (!json_is_object(s)) {
		return sfail(c, "expected a schema (an object)");
	}
	*id = new_rule(c);
	if (llm_array_reserve(&c->memo, &c->cap_memo, c->n_memo + 1, sizeof *c->memo))
		return sput(c, NULL, llm_fail(LLM_ERR_NOMEM, "out of memory"));
	size_t me = c->n_memo++;
	c->memo[me].s = s;
	c->memo[me].id = *id;
	c->memo[me].depth = c->depth;
	c->memo[me].open = 1;
	struct llm_buf b = { 0 };
	int rc = 0;
	const char *k;
	json_t *v;
	json_object_foreach((json_t *)s, k, v) {
		size_t j = 0;
		while (j < sizeof known / sizeof *known && strcmp(k, known[j]))
			j++;
		if (j == sizeof known / sizeof *known) {
			rc = sfail(c, "unsupported keyword '%s'", k);
			goto out;
		}
	}
	const json_t *ty = json_object_get(s, "type"), *en = json_object_get(s, "enum"), *co = json_object_get(s, "const"),
	             *any = json_object_get(s, "anyOf"), *ref = json_object_get(s, "$ref");
	const char *only_t = json_is_string(ty) ? json_string_value(ty) : NULL;
	if (ty && !json_is_string(ty) && !json_is_array(ty)) {
		rc = sfail(c, "type: expected a string or an array of strings");
		goto out;
	}
	if (ref || any) {
		/* alone (beside annotations): combining them with other keywords is not supported */
		json_object_foreach((json_t *)s, k, v)
			if (!is_annotation(k) && strcmp(k, ref ? "$ref" : "anyOf")) {
				rc = sfail(c, "'%s' beside %s is not supported", k, ref ? "$ref" : "anyOf");
				goto out;
			}
	}
	if (ref) {
		if (!json_is_string(ref)) {
			rc = sfail(c, "$ref: expected a string");
			goto out;
		}
		const json_t *t = resolve(c, json_string_value(ref));
		int tid;
		c->ref = json_string_value(ref);
		c->call_left = 1;
		if (!t) {                 /* resolve() left the message */
			rc = -1;
			goto out;
		}
		if ((rc = gen_child(c, t, json_string_value(ref), &tid)))
			goto out;
		rc = sput(c, &b, put(&b, "s%d", tid));
	} else if (any) {
		if (!json_is_array(any) || !json_array_size(any)) {
			rc = sfail(c, "anyOf: expected a non-empty array of schemas");
			goto out;
		}
		for (size_t i = 0; i < json_array_size(any) && !rc; i++) {
			char key[32];
			int sid;
			snprintf(key, sizeof key, "anyOf[%zu]", i);
			c->call_left = 1;
			if (!(rc = gen_child(c, json_array_get(any, i), key, &sid)))
				rc = sput(c, &b, put(&b, "%ss%d", i ? " | " : "", sid));
		}
	} else if (en || co) {
		/* the listed values that pass the type; other keywords beside them are not supported */
		json_object_foreach((json_t *)s, k, v)
			if (!is_annotation(k) && strcmp(k, "enum") && strcmp(k, "const") && strcmp(k, "type")) {
				rc = sfail(c, "'%s' beside enum or const is not supported", k);
				goto out;
			}
		if (en && (!json_is_array(en) || !json_array_size(en))) {
			rc = sfail(c, "enum: expected a non-empty array");
			goto out;
		}
		int nv = 0;
		size_t n = co ? 1 : json_array_size(en);
		char **vals = calloc(n, sizeof *vals);
		size_t *vlen = calloc(n, sizeof *vlen);
		if (!vals || !vlen) {
			free(vals);
			free(vlen);
			rc = sput(c, &b, llm_fail(LLM_ERR_NOMEM, "out of memory"));
			goto out;
		}
		for (size_t i = 0; i < n && !rc; i++) {
			const json_t *x = co ? co : json_array_get(en, i);
			int ok = !ty;
			for (size_t t = 0; ty && !ok && t < (json_is_array(ty) ? json_array_size(ty) : 1); t++)
				ok = type_ok(x, json_is_array(ty) ? json_string_value(json_array_get(ty, t)) : only_t);
			if (co && en) {           /* both: the const, if the enum has it */
				int in = 0;
				for (size_t e = 0; e < json_array_size(en); e++)
					in |= json_equal((json_t *)x, json_array_get(en, e));
				ok &= in;
			}
			if (!ok)
				continue;
			if (!(vals[nv] = json_dumps(x, JSON_COMPACT | JSON_ENCODE_ANY)))
				rc = sput(c, &b, llm_fail(LLM_ERR_NOMEM, "out of memory"));
			else
				vlen[nv] = strlen(vals[nv]), nv++;
		}
		if (!rc && !nv)
			rc = sfail(c, "no value of enum or const passes the other keywords");
		if (!rc)
			rc = values_trie(c, &b, vals, vlen, (size_t)nv);
		for (int i = 0; i < nv; i++)
			free(vals[i]);
		free(vals);
		free(vlen);
	} else {
		const char *types[8];
		size_t nt = 0;
		if (only_t) {
			types[nt++] = only_t;
		} else if (ty) {
			for (size_t i = 0; i < json_array_size(ty); i++) {
				const json_t *x = json_array_get(ty, i);
				if (!json_is_string(x) || nt == 8) {
					rc = sfail(c, "type: expected a string or an array of strings");
					goto out;
				}
				types[nt++] = json_string_value(x);
			}
		} else if (json_object_get(s, "properties") || json_object_get(s, "required") ||
		           json_object_get(s, "additionalProperties")) {
			types[nt++] = "object";   /* the keywords' type: a subset of what validates */
		} else if (json_object_get(s, "items") || json_object_get(s, "minItems") || json_object_get(s, "maxItems")) {
			types[nt++] = "array";
		} else if (json_object_get(s, "minLength") || json_object_get(s, "maxLength") || json_object_get(s, "pattern")) {
			types[nt++] = "string";
		} else if (json_object_get(s, "minimum") || json_object_get(s, "maximum") ||
		           json_object_get(s, "exclusiveMinimum") || json_object_get(s, "exclusiveMaximum")) {
			types[nt++] = "integer";
		}
		if (!nt)
			rc = sput(c, &b, llm_buf_append_str(&b, "jvalue"));
		for (size_t i = 0; i < nt && !rc; i++) {
			if ((rc = sput(c, &b, llm_buf_append_str(&b, i ? " | (" : "("))) || (rc = gen_type(c, s, types[i], &b)))
				break;
			rc = sput(c, &b, llm_buf_append_str(&b, ")"));
		}
	}
	if (!rc)
		rc = emit_rule(c, *id, &b);
out:
	llm_buf_free(&b);
	c->memo[me].open = 0;
	c->lstart = lstart;
	c->depth--;
	return rc;
}

enum llm_status llm_guide_tool_call(const char *const *names, const json_t *const *params, size_t n, const char *argkey,
                                    const char *pre, const char *post, struct llm_buf *out)
{
	struct sc c = { .out = out };
	struct llm_buf root = { 0 };
	enum llm_status st = llm_buf_append_str(&root, "root ::= ");
	if (!st)
		st = put_lit(&root, pre, strlen(pre));
	if (!st)
		st = llm_buf_append_str(&root, " (");
	for (size_t i = 0; i < n && !st; i++) {
		int id = -1;
		if (params[i]) {       /* each schema its own: its "#" is itself */
			c.root = params[i];
			c.n_memo = 0;
			snprintf(c.path, sizeof c.path, "tools[%zu] ('%.60s') parameters", i, names[i]);
			if (gen(&c, params[i], &id)) {
				st = c.st ? c.st : llm_fail(LLM_ERR_INTERNAL, "schema: failed");
				break;
			}
		}
		json_t *nm = json_string(names[i]);
		char *lit = nm ? json_dumps(nm, JSON_COMPACT | JSON_ENCODE_ANY) : NULL;
		json_decref(nm);
		if (!lit) {
			st = llm_fail(LLM_ERR_NOMEM, "out of memory");
			break;
		}
		char key[80];
		snprintf(key, sizeof key, ",\"%s\":", argkey);
		st = i ? llm_buf_append_str(&root, " | ") : LLM_OK;
		if (!st)
			st = put_lit(&root, "{\"name\":", 8);
		if (!st)
			st = put_lit(&root, lit, strlen(lit));
		free(lit);
		if (!st)
			st = put_lit(&root, key, strlen(key));
		if (!st)
			st = id >= 0 ? put(&root, " s%d ", id) : put_lit(&root, "{}", 2);
		if (!st)
			st = put_lit(&root, "}", 1);
	}
	if (!st)
		st = llm_buf_append_str(&root, ") ");
	if (!st)
		st = put_lit(&root, post, strlen(post));
	if (!st)
		st = llm_buf_append_str(&root, "\n");
	if (!st)
		st = llm_buf_append(out, root.p, root.len);
	if (!st)
		st = llm_buf_append_str(out, JSON_RULES);
	llm_buf_free(&root);
	free(c.memo);
	return st;
}

enum llm_status llm_guide_json_schema(const json_t *schema, struct llm_buf *out)
{
	struct sc c = { .out = out, .root = schema };
	snprintf(c.path, sizeof c.path, "schema");
	int id;
	if (gen(&c, schema, &id) || (c.st = put(out, "root ::= s%d\n", id)) ||
	    (c.st = llm_buf_append_str(out, JSON_RULES))) {
		free(c.memo);
		return c.st ? c.st : llm_fail(LLM_ERR_INTERNAL, "schema: failed");
	}
	free(c.memo);
	return LLM_OK;
}

/* ---- the vocabulary of a tokenizer ------------------------------------- */

enum llm_status llm_gvocab_tokenizer(struct llm_gvocab **v, const struct llm_tokenizer *tk, int n_vocab)
{
	char **b = calloc((size_t)n_vocab + 1, sizeof *b);
	size_t *len = calloc((size_t)n_vocab + 1, sizeof *len);
	enum llm_status s = b && len ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "grammar: vocabulary: out of memory");
	int nt = llm_tokenizer_n_vocab(tk);
	for (int i = 0; !s && i < n_vocab && i < nt; i++) {
		if (!llm_tokenizer_token(tk, i) || llm_tokenizer_is_special(tk, i))
			continue;
		if (llm_tokenizer_piece_bytes(tk, i, &b[i], &len[i])) {
			b[i] = NULL;      /* no bytes: never allowed */
			len[i] = 0;
		}
	}
	if (!s)
		s = llm_gvocab_new(v, n_vocab, (const char *const *)b, len);
	for (int i = 0; b && i < n_vocab; i++)
		free(b[i]);
	free(b);
	free(len);
	return s;
}
