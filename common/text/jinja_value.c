/* common/text/jinja_value.c: the chat-template interpreter's runtime base: the
 * arena every parse and render allocates from, the error exit (llm_fail,
 * then longjmp to the entry), the growable string, and Python-like values
 * with their equality, truthiness, str() and repr(). See jinja.h for what
 * the interpreter covers and jinja_impl.h for the memory rules.
 *
 * Values are Python's: strings are UTF-8 but length, indexing and slicing
 * count code points (jinja_ops.c), str() of a float is Python's repr,
 * tojson is json.dumps(ensure_ascii=False) (jinja_filters.c). */
#define _GNU_SOURCE
#include "jinja_impl.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "buf.h"

#include "banned.h"

/* ---------------------------------------------------------------- arena + errors */

_Noreturn void jinja_die(struct ctx *c, enum llm_status st, int line, const char *fmt, ...)
{
	char msg[768];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (line > 0)
		llm_fail(st, "chat template: line %d: %s", line, msg);
	else
		llm_fail(st, "chat template: %s", msg);
	c->st = st;
	longjmp(c->jb, 1);
}

void *jinja_aalloc(struct ctx *c, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	struct chunk *h = c->ar->head;
	if (!h || h->used + n > h->cap) {
		size_t cap = n > 65536 ? n : 65536;
		h = malloc(sizeof *h + cap);
		if (!h)
			jinja_die(c, LLM_ERR_NOMEM, 0, "out of memory");
		h->next = c->ar->head;
		h->used = 0;
		h->cap = cap;
		c->ar->head = h;
	}
	void *p = (char *)h->data + h->used;
	h->used += n;
	memset(p, 0, n);
	return p;
}

void jinja_arena_free(struct arena *a)
{
	for (struct chunk *h = a->head, *n; h; h = n) {
		n = h->next;
		free(h);
	}
	a->head = NULL;
}

char *jinja_adup(struct ctx *c, const char *s, size_t n)
{
	char *p = jinja_aalloc(c, n + 1);
	memcpy(p, s, n);
	p[n] = 0;
	return p;
}

void jinja_sb_put(struct sb *b, const char *s, size_t n)
{
	if (b->heap) {
		if (llm_array_reserve(&b->p, &b->cap, b->n + n + 1, 1))
			jinja_die(b->c, LLM_ERR_NOMEM, 0, "out of memory");
	} else if (b->n + n + 1 > b->cap) {   /* arena memory: a larger copy, the old one stays */
		size_t cap = b->cap ? b->cap * 2 : 64;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *p = jinja_aalloc(b->c, cap);
		if (b->n)
			memcpy(p, b->p, b->n);
		b->p = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

void jinja_sb_puts(struct sb *b, const char *s) { jinja_sb_put(b, s, strlen(s)); }
void jinja_sb_putc(struct sb *b, char ch) { jinja_sb_put(b, &ch, 1); }

void jinja_sb_printf(struct sb *b, const char *fmt, ...)
{
	char tmp[128];
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	jinja_sb_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* ---------------------------------------------------------------- values */

struct val jinja_vlist(struct ctx *c)
{
	struct val v = { .t = V_LIST };
	v.l = jinja_aalloc(c, sizeof *v.l);
	return v;
}

struct val jinja_vdict(struct ctx *c)
{
	struct val v = { .t = V_DICT };
	v.d = jinja_aalloc(c, sizeof *v.d);
	return v;
}

void jinja_list_push(struct ctx *c, struct list *l, struct val x)
{
	if (l->n == l->cap) {
		size_t cap = l->cap * 2 + 4;
		struct val *v = jinja_aalloc(c, cap * sizeof *v);
		if (l->n)
			memcpy(v, l->v, l->n * sizeof *v);
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = x;
}

struct val *jinja_dict_find(struct dict *d, struct val k)
{
	for (size_t i = 0; i < d->n; i++)
		if (jinja_val_eq(d->k[i], k))
			return &d->v[i];
	return NULL;
}

struct val *jinja_dict_finds(struct dict *d, const char *k)
{
	size_t n = strlen(k);
	for (size_t i = 0; i < d->n; i++)
		if (d->k[i].t == V_STR && d->k[i].s.n == n && !memcmp(d->k[i].s.p, k, n))
			return &d->v[i];
	return NULL;
}

void jinja_dict_set(struct ctx *c, struct dict *d, struct val k, struct val v)
{
	struct val *p = jinja_dict_find(d, k);
	if (p) {
		*p = v;
		return;
	}
	if (d->n == d->cap) {
		size_t cap = d->cap * 2 + 4;
		struct val *nk = jinja_aalloc(c, cap * sizeof *nk), *nv = jinja_aalloc(c, cap * sizeof *nv);
		if (d->n) {
			memcpy(nk, d->k, d->n * sizeof *nk);
			memcpy(nv, d->v, d->n * sizeof *nv);
		}
		d->k = nk;
		d->v = nv;
		d->cap = cap;
	}
	d->k[d->n] = k;
	d->v[d->n++] = v;
}

void jinja_dict_sets(struct ctx *c, struct dict *d, const char *k, struct val v)
{
	jinja_dict_set(c, d, vstr(k, strlen(k)), v);
}

const char *jinja_type_name(struct val v)
{
	static const char *n[] = { "Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
	                           "function", "method" };
	if (v.t == V_DICT && v.d->ns)
		return "Namespace";
	return n[v.t];
}

bool jinja_val_eq(struct val a, struct val b)
{
	if ((a.t == V_INT || a.t == V_FLOAT || a.t == V_BOOL) && (b.t == V_INT || b.t == V_FLOAT || b.t == V_BOOL)) {
		double x = a.t == V_FLOAT ? a.f : a.t == V_INT ? (double)a.i : a.b;
		double y = b.t == V_FLOAT ? b.f : b.t == V_INT ? (double)b.i : b.b;
		if (a.t != V_FLOAT && b.t != V_FLOAT)
			return (a.t == V_INT ? a.i : a.b) == (b.t == V_INT ? b.i : b.b);
		return x == y;
	}
	if (a.t != b.t)
		return false;
	switch (a.t) {
	case V_UNDEF: case V_NONE: return true;
	case V_STR: return a.s.n == b.s.n && !memcmp(a.s.p, b.s.p, a.s.n);
	case V_LIST:
		if (a.l->n != b.l->n)
			return false;
		for (size_t i = 0; i < a.l->n; i++)
			if (!jinja_val_eq(a.l->v[i], b.l->v[i]))
				return false;
		return true;
	case V_DICT:
		if (a.d->n != b.d->n)
			return false;
		for (size_t i = 0; i < a.d->n; i++) {
			struct val *o = jinja_dict_find(b.d, a.d->k[i]);
			if (!o || !jinja_val_eq(a.d->v[i], *o))
				return false;
		}
		return true;
	default: return a.fn == b.fn;
	}
}

bool jinja_truthy(struct val v)
{
	switch (v.t) {
	case V_UNDEF: case V_NONE: return false;
	case V_BOOL: return v.b;
	case V_INT: return v.i != 0;
	case V_FLOAT: return v.f != 0;
	case V_STR: return v.s.n > 0;
	case V_LIST: return v.l->n > 0;
	case V_DICT: return v.d->n > 0;
	default: return true;
	}
}

/* Python repr of a float. */
void jinja_put_float(struct sb *b, double f)
{
	if (isnan(f)) { jinja_sb_puts(b, "nan"); return; }
	if (isinf(f)) { jinja_sb_puts(b, f < 0 ? "-inf" : "inf"); return; }
	char tmp[40];
	int p;
	for (p = 0; p < 17; p++) {           /* shortest round-trip digits */
		snprintf(tmp, sizeof tmp, "%.*e", p, f);
		if (strtod(tmp, NULL) == f)
			break;
	}
	/* tmp = [-]d.ddde[+-]XX */
	char *e = strchr(tmp, 'e');
	int exp = (int)strtol(e + 1, NULL, 10);
	*e = 0;
	char digits[40];
	size_t nd = 0;
	bool neg = tmp[0] == '-';
	for (char *q = tmp + neg; *q; q++)
		if (*q != '.')
			digits[nd++] = *q;
	digits[nd] = 0;
	if (neg)
		jinja_sb_putc(b, '-');
	if (exp >= -5 && exp < 16) {
		if (exp < 0) {
			jinja_sb_puts(b, "0.");
			for (int i = 0; i < -exp - 1; i++)
				jinja_sb_putc(b, '0');
			jinja_sb_put(b, digits, nd);
		} else {
			for (int i = 0; i <= exp; i++)
				jinja_sb_putc(b, (size_t)i < nd ? digits[i] : '0');
			jinja_sb_putc(b, '.');
			if ((size_t)exp + 1 < nd)
				jinja_sb_put(b, digits + exp + 1, nd - (size_t)exp - 1);
			else
				jinja_sb_putc(b, '0');
		}
	} else {
		jinja_sb_putc(b, digits[0]);
		if (nd > 1) {
			jinja_sb_putc(b, '.');
			jinja_sb_put(b, digits + 1, nd - 1);
		}
		jinja_sb_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
	}
}

static void put_repr(struct sb *b, struct val v);

void jinja_put_str(struct sb *b, struct val v)
{
	switch (v.t) {
	case V_UNDEF: break;
	case V_NONE: jinja_sb_puts(b, "None"); break;
	case V_BOOL: jinja_sb_puts(b, v.b ? "True" : "False"); break;
	case V_INT: jinja_sb_printf(b, "%lld", (long long)v.i); break;
	case V_FLOAT: jinja_put_float(b, v.f); break;
	case V_STR: jinja_sb_put(b, v.s.p, v.s.n); break;
	default: put_repr(b, v); break;
	}
}

/* Python repr (for str() of lists and dicts). */
static void put_repr(struct sb *b, struct val v)
{
	switch (v.t) {
	case V_STR: {
		bool dq = memchr(v.s.p, '\'', v.s.n) && !memchr(v.s.p, '"', v.s.n);
		char q = dq ? '"' : '\'';
		jinja_sb_putc(b, q);
		for (size_t i = 0; i < v.s.n; i++) {
			unsigned char ch = (unsigned char)v.s.p[i];
			if (ch == '\\') jinja_sb_puts(b, "\\\\");
			else if (ch == (unsigned char)q) { jinja_sb_putc(b, '\\'); jinja_sb_putc(b, q); }
			else if (ch == '\n') jinja_sb_puts(b, "\\n");
			else if (ch == '\r') jinja_sb_puts(b, "\\r");
			else if (ch == '\t') jinja_sb_puts(b, "\\t");
			else if (ch < 0x20 || ch == 0x7f) jinja_sb_printf(b, "\\x%02x", ch);
			else jinja_sb_putc(b, (char)ch);
		}
		jinja_sb_putc(b, q);
		break;
	}
	case V_LIST:
		jinja_sb_putc(b, '[');
		for (size_t i = 0; i < v.l->n; i++) {
			if (i)
				jinja_sb_puts(b, ", ");
			put_repr(b, v.l->v[i]);
		}
		jinja_sb_putc(b, ']');
		break;
	case V_DICT:
		if (v.d->ns) {
			jinja_sb_puts(b, "<Namespace>");
			break;
		}
		jinja_sb_putc(b, '{');
		for (size_t i = 0; i < v.d->n; i++) {
			if (i)
				jinja_sb_puts(b, ", ");
			put_repr(b, v.d->k[i]);
			jinja_sb_puts(b, ": ");
			put_repr(b, v.d->v[i]);
		}
		jinja_sb_putc(b, '}');
		break;
	case V_FUNC: case V_METHOD: jinja_sb_puts(b, "<function>"); break;
	case V_UNDEF: jinja_sb_puts(b, "Undefined"); break;    /* its repr: [u] prints [Undefined] */
	default: jinja_put_str(b, v); break;
	}
}

bool jinja_in_list(const char **l, const char *s)
{
	for (; *l; l++)
		if (!strcmp(*l, s))
			return true;
	return false;
}
