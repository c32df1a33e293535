/* common/jinja.c: a small Jinja2 interpreter (lexer, parser to AST,
 * evaluator) for Hugging Face chat templates; see jinja.h for what it covers.
 *
 * Memory: the parsed template and every value of a render live in arenas
 * freed at once. Errors unwind with longjmp to the parse/render entry after
 * llm_fail() recorded "chat template: line N: ..."; nothing leaks because
 * every allocation is in an arena. Values are Python's: strings are UTF-8
 * but length, indexing and slicing count code points, str() of a float is
 * Python's repr, tojson is json.dumps(ensure_ascii=False). */
#define _GNU_SOURCE
#include "jinja.h"

#include <jansson.h>
#include <errno.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <utf8proc.h>

#include "tokenizer.h"
#include "banned.h"

/* ---------------------------------------------------------------- arena + errors */

struct chunk { struct chunk *next; size_t used, cap; max_align_t data[]; };
struct arena { struct chunk *head; };

struct ctx {                    /* shared by parser and renderer */
	struct arena *ar;
	jmp_buf jb;
	enum llm_status st;
};

static _Noreturn void die(struct ctx *c, enum llm_status st, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static _Noreturn void die(struct ctx *c, enum llm_status st, int line, const char *fmt, ...)
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

static void *aalloc(struct ctx *c, size_t n)
{
	n = (n + 15) & ~(size_t)15;
	struct chunk *h = c->ar->head;
	if (!h || h->used + n > h->cap) {
		size_t cap = n > 65536 ? n : 65536;
		h = malloc(sizeof *h + cap);
		if (!h)
			die(c, LLM_ERR_NOMEM, 0, "out of memory");
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

static void arena_free(struct arena *a)
{
	for (struct chunk *h = a->head, *n; h; h = n) {
		n = h->next;
		free(h);
	}
	a->head = NULL;
}

static char *adup(struct ctx *c, const char *s, size_t n)
{
	char *p = aalloc(c, n + 1);
	memcpy(p, s, n);
	p[n] = 0;
	return p;
}

/* A growable string in malloc memory (the render output) or the arena. */
struct sb { char *p; size_t n, cap; struct ctx *c; bool heap; };

static void sb_put(struct sb *b, const char *s, size_t n)
{
	if (b->n + n + 1 > b->cap) {
		size_t cap = b->cap ? b->cap * 2 : 64;
		while (cap < b->n + n + 1)
			cap *= 2;
		char *p;
		if (b->heap) {
			p = realloc(b->p, cap);
			if (!p)
				die(b->c, LLM_ERR_NOMEM, 0, "out of memory");
		} else {
			p = aalloc(b->c, cap);
			if (b->n)
				memcpy(p, b->p, b->n);
		}
		b->p = p;
		b->cap = cap;
	}
	if (n)
		memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

static void sb_puts(struct sb *b, const char *s) { sb_put(b, s, strlen(s)); }
static void sb_putc(struct sb *b, char ch) { sb_put(b, &ch, 1); }

static void sb_printf(struct sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(struct sb *b, const char *fmt, ...)
{
	char tmp[128];
	va_list ap;
	va_start(ap, fmt);
	int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
	va_end(ap);
	sb_put(b, tmp, (size_t)k < sizeof tmp ? (size_t)k : sizeof tmp - 1);
}

/* ---------------------------------------------------------------- values */

enum vt { V_UNDEF, V_NONE, V_BOOL, V_INT, V_FLOAT, V_STR, V_LIST, V_DICT, V_FUNC, V_METHOD };

struct list;
struct dict;
struct node;
struct val {
	enum vt t;
	union {
		bool b;
		int64_t i;
		double f;
		struct { const char *p; size_t n; } s;
		struct list *l;
		struct dict *d;
		struct func *fn;
		struct method *m;
	};
};
struct list { struct val *v; size_t n, cap; };
struct dict { struct val *k, *v; size_t n, cap; bool ns; };   /* ns: a namespace() */
struct method { struct val self; const char *name; };

struct rctx;
struct args {
	struct val *pos;
	size_t n_pos;
	const char **kw;
	struct val *kwv;
	size_t n_kw;
};
struct func {
	const char *name;
	struct val (*builtin)(struct rctx *r, struct func *f, struct args *a, int line);
	struct node *macro;         /* a {% macro %} */
	struct val data;            /* loop.cycle: the items */
};

static const struct val UNDEF = { .t = V_UNDEF };
static const struct val NONE = { .t = V_NONE };

static struct val vbool(bool b) { struct val v = { .t = V_BOOL }; v.b = b; return v; }
static struct val vint(int64_t i) { struct val v = { .t = V_INT }; v.i = i; return v; }
static struct val vfloat(double f) { struct val v = { .t = V_FLOAT }; v.f = f; return v; }
static struct val vstr(const char *p, size_t n) { struct val v = { .t = V_STR }; v.s.p = p; v.s.n = n; return v; }

static struct val vlist(struct ctx *c)
{
	struct val v = { .t = V_LIST };
	v.l = aalloc(c, sizeof *v.l);
	return v;
}

static struct val vdict(struct ctx *c)
{
	struct val v = { .t = V_DICT };
	v.d = aalloc(c, sizeof *v.d);
	return v;
}

static void list_push(struct ctx *c, struct list *l, struct val x)
{
	if (l->n == l->cap) {
		size_t cap = l->cap * 2 + 4;
		struct val *v = aalloc(c, cap * sizeof *v);
		if (l->n)
			memcpy(v, l->v, l->n * sizeof *v);
		l->v = v;
		l->cap = cap;
	}
	l->v[l->n++] = x;
}

static bool val_eq(struct val a, struct val b);

static struct val *dict_find(struct dict *d, struct val k)
{
	for (size_t i = 0; i < d->n; i++)
		if (val_eq(d->k[i], k))
			return &d->v[i];
	return NULL;
}

static struct val *dict_finds(struct dict *d, const char *k)
{
	size_t n = strlen(k);
	for (size_t i = 0; i < d->n; i++)
		if (d->k[i].t == V_STR && d->k[i].s.n == n && !memcmp(d->k[i].s.p, k, n))
			return &d->v[i];
	return NULL;
}

static void dict_set(struct ctx *c, struct dict *d, struct val k, struct val v)
{
	struct val *p = dict_find(d, k);
	if (p) {
		*p = v;
		return;
	}
	if (d->n == d->cap) {
		size_t cap = d->cap * 2 + 4;
		struct val *nk = aalloc(c, cap * sizeof *nk), *nv = aalloc(c, cap * sizeof *nv);
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

static void dict_sets(struct ctx *c, struct dict *d, const char *k, struct val v)
{
	dict_set(c, d, vstr(k, strlen(k)), v);
}

static const char *type_name(struct val v)
{
	static const char *n[] = { "Undefined", "NoneType", "bool", "int", "float", "str", "list", "dict",
	                           "function", "method" };
	if (v.t == V_DICT && v.d->ns)
		return "Namespace";
	return n[v.t];
}

static bool val_eq(struct val a, struct val b)
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
			if (!val_eq(a.l->v[i], b.l->v[i]))
				return false;
		return true;
	case V_DICT:
		if (a.d->n != b.d->n)
			return false;
		for (size_t i = 0; i < a.d->n; i++) {
			struct val *o = dict_find(b.d, a.d->k[i]);
			if (!o || !val_eq(a.d->v[i], *o))
				return false;
		}
		return true;
	default: return a.fn == b.fn;
	}
}

static bool truthy(struct val v)
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
static void put_float(struct sb *b, double f)
{
	if (isnan(f)) { sb_puts(b, "nan"); return; }
	if (isinf(f)) { sb_puts(b, f < 0 ? "-inf" : "inf"); return; }
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
		sb_putc(b, '-');
	if (exp >= -5 && exp < 16) {
		if (exp < 0) {
			sb_puts(b, "0.");
			for (int i = 0; i < -exp - 1; i++)
				sb_putc(b, '0');
			sb_put(b, digits, nd);
		} else {
			for (int i = 0; i <= exp; i++)
				sb_putc(b, (size_t)i < nd ? digits[i] : '0');
			sb_putc(b, '.');
			if ((size_t)exp + 1 < nd)
				sb_put(b, digits + exp + 1, nd - (size_t)exp - 1);
			else
				sb_putc(b, '0');
		}
	} else {
		sb_putc(b, digits[0]);
		if (nd > 1) {
			sb_putc(b, '.');
			sb_put(b, digits + 1, nd - 1);
		}
		sb_printf(b, "e%c%02d", exp < 0 ? '-' : '+', exp < 0 ? -exp : exp);
	}
}

static void put_repr(struct sb *b, struct val v);

static void put_str(struct sb *b, struct val v)
{
	switch (v.t) {
	case V_UNDEF: break;
	case V_NONE: sb_puts(b, "None"); break;
	case V_BOOL: sb_puts(b, v.b ? "True" : "False"); break;
	case V_INT: sb_printf(b, "%lld", (long long)v.i); break;
	case V_FLOAT: put_float(b, v.f); break;
	case V_STR: sb_put(b, v.s.p, v.s.n); break;
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
		sb_putc(b, q);
		for (size_t i = 0; i < v.s.n; i++) {
			unsigned char ch = (unsigned char)v.s.p[i];
			if (ch == '\\') sb_puts(b, "\\\\");
			else if (ch == (unsigned char)q) { sb_putc(b, '\\'); sb_putc(b, q); }
			else if (ch == '\n') sb_puts(b, "\\n");
			else if (ch == '\r') sb_puts(b, "\\r");
			else if (ch == '\t') sb_puts(b, "\\t");
			else if (ch < 0x20 || ch == 0x7f) sb_printf(b, "\\x%02x", ch);
			else sb_putc(b, (char)ch);
		}
		sb_putc(b, q);
		break;
	}
	case V_LIST:
		sb_putc(b, '[');
		for (size_t i = 0; i < v.l->n; i++) {
			if (i)
				sb_puts(b, ", ");
			put_repr(b, v.l->v[i]);
		}
		sb_putc(b, ']');
		break;
	case V_DICT:
		if (v.d->ns) {
			sb_puts(b, "<Namespace>");
			break;
		}
		sb_putc(b, '{');
		for (size_t i = 0; i < v.d->n; i++) {
			if (i)
				sb_puts(b, ", ");
			put_repr(b, v.d->k[i]);
			sb_puts(b, ": ");
			put_repr(b, v.d->v[i]);
		}
		sb_putc(b, '}');
		break;
	case V_FUNC: case V_METHOD: sb_puts(b, "<function>"); break;
	case V_UNDEF: sb_puts(b, "Undefined"); break;    /* its repr: [u] prints [Undefined] */
	default: put_str(b, v); break;
	}
}

/* ---------------------------------------------------------------- lexer */

enum tk { T_EOF, T_NAME, T_INT, T_FLOAT, T_STR, T_OP };
struct tok { enum tk t; const char *p; size_t n; int line; int64_t i; double f; char *s; size_t sn; };

/* A template chunk: text, {{ expr }} or {% stmt %}. */
enum ck { CK_TEXT, CK_EXPR, CK_STMT };
struct chunkt { enum ck k; const char *p; size_t n; int line; };

struct parser {
	struct ctx c;
	const char *src;
	size_t len;
	struct chunkt *ck;
	size_t n_ck, cap_ck, pos;
	/* expression tokens of the current tag */
	struct tok *tk;
	size_t n_tk, cap_tk, tpos;
	int line;
};

static int line_at(const char *src, const char *p)
{
	int l = 1;
	for (const char *q = src; q < p; q++)
		l += *q == '\n';
	return l;
}

static void add_chunk(struct parser *P, enum ck k, const char *p, size_t n, int line)
{
	if (P->n_ck == P->cap_ck) {
		size_t cap = P->cap_ck * 2 + 32;
		struct chunkt *c = aalloc(&P->c, cap * sizeof *c);
		if (P->n_ck)
			memcpy(c, P->ck, P->n_ck * sizeof *c);
		P->ck = c;
		P->cap_ck = cap;
	}
	P->ck[P->n_ck++] = (struct chunkt){ k, p, n, line };
}

/* Split the source into chunks with Jinja2's whitespace rules
 * (trim_blocks, lstrip_blocks, "-" and "+" modifiers). */
static void lex_chunks(struct parser *P)
{
	const char *s = P->src, *end = s + P->len, *text = s;
	bool trim_next_nl = false, strip_next_ws = false;
	const char *p = s;
	while (p < end) {
		const char *o = NULL;
		for (const char *q = p; q + 1 < end; q++)
			if (q[0] == '{' && (q[1] == '{' || q[1] == '%' || q[1] == '#')) {
				o = q;
				break;
			}
		const char *tend = o ? o : end;
		/* the text before the tag */
		const char *ts = text, *te = tend;
		if (strip_next_ws)
			while (ts < te && strchr(" \t\r\n\v\f", *ts))
				ts++;
		else if (trim_next_nl && ts < te && *ts == '\n')   /* the source has no \r (llm_jinja_parse) */
			ts++;
		strip_next_ws = trim_next_nl = false;
		if (!o) {
			if (te > ts)
				add_chunk(P, CK_TEXT, ts, (size_t)(te - ts), line_at(s, ts));
			break;
		}
		char kind = o[1];
		const char *in = o + 2;
		bool minus_l = in < end && *in == '-', plus_l = in < end && *in == '+';
		if (minus_l || plus_l)
			in++;
		if (minus_l) {
			while (te > ts && strchr(" \t\r\n\v\f", te[-1]))
				te--;
		} else if ((kind == '%' || kind == '#') && !plus_l) {
			/* lstrip_blocks: spaces and tabs from the line start to the tag */
			const char *q = te;
			while (q > ts && (q[-1] == ' ' || q[-1] == '\t'))
				q--;
			bool line_start = q == s || q[-1] == '\n';
			if (line_start)
				te = q;
		}
		if (te > ts)
			add_chunk(P, CK_TEXT, ts, (size_t)(te - ts), line_at(s, ts));
		/* find the closer */
		const char *close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
		const char *c = NULL;
		if (kind == '#') {
			c = memmem(in, (size_t)(end - in), close, 2);
		} else {   /* skip closers inside string literals */
			char quote = 0;
			for (const char *q = in; q + 1 < end; q++) {
				if (quote) {
					if (*q == '\\')
						q++;
					else if (*q == quote)
						quote = 0;
				} else if (*q == '\'' || *q == '"') {
					quote = *q;
				} else if (q[0] == close[0] && q[1] == close[1]) {
					c = q;
					break;
				}
			}
		}
		int line = line_at(s, o);
		if (!c)
			die(&P->c, LLM_ERR_FORMAT, line, "unclosed '{%c'", kind);
		const char *ie = c;
		bool minus_r = ie > in && ie[-1] == '-', plus_r = ie > in && ie[-1] == '+';
		if (minus_r || plus_r)
			ie--;
		if (kind != '#')
			add_chunk(P, kind == '{' ? CK_EXPR : CK_STMT, in, (size_t)(ie - in), line);
		p = text = c + 2;
		if (minus_r)
			strip_next_ws = true;
		else if (kind != '{' && !plus_r)
			trim_next_nl = true;
		/* {% raw %}: the text up to {% endraw %} verbatim */
		if (kind == '%') {
			const char *a = in;
			while (a < ie && strchr(" \t\r\n", *a))
				a++;
			if ((size_t)(ie - a) >= 3 && !memcmp(a, "raw", 3)) {
				const char *b = a + 3;
				while (b < ie && strchr(" \t\r\n", *b))
					b++;
				if (b == ie) {
					P->n_ck--;   /* drop the raw tag itself */
					const char *r = p;
					const char *stop = NULL;
					for (const char *q = r; q + 1 < end; q++)
						if (q[0] == '{' && q[1] == '%') {
							const char *w = q + 2;
							if (*w == '-' || *w == '+')
								w++;
							while (w < end && strchr(" \t\r\n", *w))
								w++;
							if ((size_t)(end - w) >= 6 && !memcmp(w, "endraw", 6)) {
								stop = q;
								break;
							}
						}
					if (!stop)
						die(&P->c, LLM_ERR_FORMAT, line, "{%% raw %%} without {%% endraw %%}");
					const char *rs = r, *re = stop;
					if (trim_next_nl && rs < re && *rs == '\n')
						rs++;
					if (strip_next_ws)
						while (rs < re && strchr(" \t\r\n\v\f", *rs))
							rs++;
					trim_next_nl = strip_next_ws = false;
					if (stop[2] == '-')
						while (re > rs && strchr(" \t\r\n\v\f", re[-1]))
							re--;
					if (re > rs)
						add_chunk(P, CK_TEXT, rs, (size_t)(re - rs), line);
					const char *rc = memmem(stop, (size_t)(end - stop), "%}", 2);
					if (!rc)
						die(&P->c, LLM_ERR_FORMAT, line, "unclosed {%% endraw");
					if (rc[-1] == '-')
						strip_next_ws = true;
					else
						trim_next_nl = true;
					p = text = rc + 2;
				}
			}
		}
	}
}

static void push_tok(struct parser *P, struct tok t)
{
	if (P->n_tk == P->cap_tk) {
		size_t cap = P->cap_tk * 2 + 32;
		struct tok *n = aalloc(&P->c, cap * sizeof *n);
		if (P->n_tk)
			memcpy(n, P->tk, P->n_tk * sizeof *n);
		P->tk = n;
		P->cap_tk = cap;
	}
	P->tk[P->n_tk++] = t;
}

/* Tokenize the inside of one tag. */
static void lex_expr(struct parser *P, const char *s, size_t n, int line)
{
	P->n_tk = 0;
	P->tpos = 0;
	P->line = line;
	const char *e = s + n;
	while (s < e) {
		if (strchr(" \t\r\n", *s)) {
			if (*s == '\n')
				line++;
			s++;
			continue;
		}
		struct tok t = { .p = s, .line = line };
		if ((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_') {
			const char *q = s;
			while (q < e && ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || *q == '_' || (*q >= '0' && *q <= '9')))
				q++;
			t.t = T_NAME;
			t.n = (size_t)(q - s);
			s = q;
		} else if (*s >= '0' && *s <= '9') {
			const char *q = s;
			while (q < e && ((*q >= '0' && *q <= '9') || *q == '_'))
				q++;
			bool fl = false;
			if (q + 1 < e && *q == '.' && q[1] >= '0' && q[1] <= '9') {
				fl = true;
				q++;
				while (q < e && ((*q >= '0' && *q <= '9') || *q == '_'))
					q++;
			}
			if (q < e && (*q == 'e' || *q == 'E')) {
				const char *r = q + 1;
				if (r < e && (*r == '+' || *r == '-'))
					r++;
				if (r < e && *r >= '0' && *r <= '9') {
					fl = true;
					q = r;
					while (q < e && *q >= '0' && *q <= '9')
						q++;
				}
			}
			char num[64];
			size_t k = 0;
			for (const char *r = s; r < q && k < sizeof num; r++)
				if (*r != '_')
					num[k++] = *r;
			/* Python's ints have no bound; these are 64-bit, so a
			 * literal past them is refused, never cut short */
			if (k == sizeof num)
				die(&P->c, LLM_ERR_UNSUPPORTED, line, "number literal of more than %d digits", (int)sizeof num - 1);
			num[k] = 0;
			if (fl) {
				t.t = T_FLOAT;
				t.f = strtod(num, NULL);
			} else {
				t.t = T_INT;
				errno = 0;
				t.i = strtoll(num, NULL, 10);
				if (errno == ERANGE)
					die(&P->c, LLM_ERR_UNSUPPORTED, line, "integer literal %s is past 64 bits", num);
			}
			t.n = (size_t)(q - s);
			s = q;
		} else if (*s == '\'' || *s == '"') {
			char qc = *s;
			struct sb b = { .c = &P->c };
			const char *q = s + 1;
			for (; q < e && *q != qc; q++) {
				if (*q == '\\' && q + 1 < e) {
					q++;
					switch (*q) {
					case 'n': sb_putc(&b, '\n'); break;
					case 't': sb_putc(&b, '\t'); break;
					case 'r': sb_putc(&b, '\r'); break;
					case '0': sb_putc(&b, '\0'); break;
					case '\\': sb_putc(&b, '\\'); break;
					case '\'': sb_putc(&b, '\''); break;
					case '"': sb_putc(&b, '"'); break;
					case 'u': case 'x': {
						int nd = *q == 'u' ? 4 : 2;
						if (q + nd >= e)
							die(&P->c, LLM_ERR_FORMAT, line, "bad \\%c escape", *q);
						char hex[5] = { 0 };
						memcpy(hex, q + 1, (size_t)nd);
						utf8proc_uint8_t u[4];
						utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)strtol(hex, NULL, 16), u);
						sb_put(&b, (const char *)u, (size_t)k);
						q += nd;
						break;
					}
					default: sb_putc(&b, '\\'); sb_putc(&b, *q); break;
					}
				} else {
					if (*q == '\n')
						line++;
					sb_putc(&b, *q);
				}
			}
			if (q >= e)
				die(&P->c, LLM_ERR_FORMAT, line, "unterminated string");
			t.t = T_STR;
			t.s = b.p ? b.p : adup(&P->c, "", 0);
			t.sn = b.n;
			t.n = (size_t)(q + 1 - s);
			s = q + 1;
		} else {
			static const char *ops[] = { "**", "//", "==", "!=", "<=", ">=", "+", "-", "*", "/", "%", "~",
			                             "(", ")", "[", "]", "{", "}", ",", ".", ":", "|", "=", "<", ">" };
			t.t = T_OP;
			for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
				size_t l = strlen(ops[i]);
				if ((size_t)(e - s) >= l && !memcmp(s, ops[i], l)) {
					t.n = l;
					break;
				}
			}
			if (!t.n)
				die(&P->c, LLM_ERR_FORMAT, line, "unexpected character '%c'", *s);
			s += t.n;
		}
		push_tok(P, t);
	}
	push_tok(P, (struct tok){ .t = T_EOF, .p = e, .line = line });
}

/* ---------------------------------------------------------------- AST */

enum nk {
	/* expressions */
	N_LIT, N_NAME, N_ATTR, N_ITEM, N_SLICE, N_CALL, N_FILTER, N_TEST, N_BIN, N_NOT, N_NEG, N_POS,
	N_AND, N_OR, N_COND, N_LIST, N_DICT, N_TUPLE,
	/* statements */
	N_TEXT, N_OUT, N_IF, N_FOR, N_SET, N_SETBLOCK, N_MACRO, N_BREAK, N_CONTINUE, N_BODY,
};

struct node {
	enum nk k;
	int line;
	struct val v;                /* N_LIT; N_TEXT text */
	const char *name;            /* N_NAME, N_ATTR, N_FILTER, N_TEST, N_BIN op, N_MACRO */
	struct node *a, *b, *c, *d;  /* operands; for: target a, iter b, body c, else d; if: cond a, then b, else c */
	struct node **kid;           /* call/filter args, list items, body statements, dict k/v pairs */
	size_t n_kid;
	const char **kw;             /* keyword argument names (kwv are the last n_kw kids) */
	size_t n_kw;
	bool neg;                    /* N_TEST: is not */
	const char **names;          /* for/set targets, macro parameters */
	struct node **defaults;      /* macro parameter defaults (NULL: none) */
	size_t n_names;
	struct node *filter;         /* for ... if cond */
};

static struct node *mk(struct parser *P, enum nk k)
{
	struct node *n = aalloc(&P->c, sizeof *n);
	n->k = k;
	n->line = P->line;
	return n;
}

static void kid_push(struct parser *P, struct node *n, struct node *k)
{
	struct node **v = aalloc(&P->c, (n->n_kid + 1) * sizeof *v);
	if (n->n_kid)
		memcpy(v, n->kid, n->n_kid * sizeof *v);
	v[n->n_kid++] = k;
	n->kid = v;
}

static struct tok *peek(struct parser *P) { return &P->tk[P->tpos]; }
static struct tok *next(struct parser *P) { struct tok *t = &P->tk[P->tpos]; if (t->t != T_EOF) P->tpos++; return t; }
/* Put back T, the token next() just returned (it stays put at the end) */
static void unread(struct parser *P, const struct tok *t) { if (t->t != T_EOF) P->tpos--; }

static bool is_op(struct tok *t, const char *op) { return t->t == T_OP && t->n == strlen(op) && !memcmp(t->p, op, t->n); }
static bool is_name(struct tok *t, const char *nm) { return t->t == T_NAME && t->n == strlen(nm) && !memcmp(t->p, nm, t->n); }

static bool accept_op(struct parser *P, const char *op)
{
	if (is_op(peek(P), op)) {
		next(P);
		return true;
	}
	return false;
}

static bool accept_name(struct parser *P, const char *nm)
{
	if (is_name(peek(P), nm)) {
		next(P);
		return true;
	}
	return false;
}

static _Noreturn void syntax(struct parser *P, const char *what)
{
	struct tok *t = peek(P);
	if (t->t == T_EOF)
		die(&P->c, LLM_ERR_FORMAT, t->line, "expected %s at end of tag", what);
	die(&P->c, LLM_ERR_FORMAT, t->line, "expected %s, got '%.*s'", what, (int)(t->n > 40 ? 40 : t->n), t->p);
}

static void expect_op(struct parser *P, const char *op)
{
	if (!accept_op(P, op)) {
		char w[16];
		snprintf(w, sizeof w, "'%s'", op);
		syntax(P, w);
	}
}

static const char *expect_ident(struct parser *P)
{
	struct tok *t = peek(P);
	if (t->t != T_NAME)
		syntax(P, "a name");
	next(P);
	return adup(&P->c, t->p, t->n);
}

static struct node *parse_expr(struct parser *P);
static struct node *parse_or(struct parser *P);

static const char *FILTERS[] = {
	"abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float", "indent",
	"int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr",
	"replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson",
	"trim", "unique", "upper", "wordcount", "center", "batch", "forceescape", "striptags", NULL,
};
static const char *TESTS[] = {
	"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "float", "ge",
	"gt", "in", "integer", "iterable", "le", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas",
	"sequence", "string", "true", "undefined", "upper", "==", "!=", "<", ">", "<=", ">=", "greaterthan", "lessthan",
	NULL,
};

static bool in_list(const char **l, const char *s)
{
	for (; *l; l++)
		if (!strcmp(*l, s))
			return true;
	return false;
}

/* Call arguments after '(' up to ')': positional then name=value. */
static void parse_args(struct parser *P, struct node *n)
{
	const char *kw[32];
	struct node *kwv[32];
	size_t nk = 0;
	while (!accept_op(P, ")")) {
		if (peek(P)->t == T_NAME && is_op(&P->tk[P->tpos + 1], "=")) {
			if (nk == 32)
				syntax(P, "fewer arguments");
			kw[nk] = expect_ident(P);
			next(P);
			kwv[nk++] = parse_expr(P);
		} else {
			if (nk)
				syntax(P, "a keyword argument (positional after keyword)");
			kid_push(P, n, parse_expr(P));
		}
		if (!accept_op(P, ",")) {
			expect_op(P, ")");
			break;
		}
	}
	n->kw = aalloc(&P->c, (nk + 1) * sizeof *n->kw);
	for (size_t i = 0; i < nk; i++) {
		n->kw[i] = kw[i];
		kid_push(P, n, kwv[i]);
	}
	n->n_kw = nk;
}

static struct node *parse_primary(struct parser *P)
{
	struct tok *t = next(P);
	struct node *n;
	switch (t->t) {
	case T_INT: n = mk(P, N_LIT); n->v = vint(t->i); return n;
	case T_FLOAT: n = mk(P, N_LIT); n->v = vfloat(t->f); return n;
	case T_STR: {
		n = mk(P, N_LIT);
		struct sb b = { .c = &P->c };
		sb_put(&b, t->s, t->sn);
		while (peek(P)->t == T_STR) {   /* adjacent literals concatenate */
			struct tok *u = next(P);
			sb_put(&b, u->s, u->sn);
		}
		n->v = vstr(b.p, b.n);
		return n;
	}
	case T_NAME:
		n = mk(P, N_LIT);
		if (is_name(t, "true") || is_name(t, "True")) { n->v = vbool(true); return n; }
		if (is_name(t, "false") || is_name(t, "False")) { n->v = vbool(false); return n; }
		if (is_name(t, "none") || is_name(t, "None")) { n->v = NONE; return n; }
		n->k = N_NAME;
		n->name = adup(&P->c, t->p, t->n);
		return n;
	case T_OP:
		if (is_op(t, "(")) {
			if (accept_op(P, ")"))
				return mk(P, N_TUPLE);
			struct node *e = parse_expr(P);
			if (is_op(peek(P), ",")) {
				n = mk(P, N_TUPLE);
				kid_push(P, n, e);
				while (accept_op(P, ",") && !is_op(peek(P), ")"))
					kid_push(P, n, parse_expr(P));
				expect_op(P, ")");
				return n;
			}
			expect_op(P, ")");
			return e;
		}
		if (is_op(t, "[")) {
			n = mk(P, N_LIST);
			while (!accept_op(P, "]")) {
				kid_push(P, n, parse_expr(P));
				if (!accept_op(P, ",")) {
					expect_op(P, "]");
					break;
				}
			}
			return n;
		}
		if (is_op(t, "{")) {
			n = mk(P, N_DICT);
			while (!accept_op(P, "}")) {
				kid_push(P, n, parse_expr(P));
				expect_op(P, ":");
				kid_push(P, n, parse_expr(P));
				if (!accept_op(P, ",")) {
					expect_op(P, "}");
					break;
				}
			}
			return n;
		}
		break;
	default: break;
	}
	unread(P, t);
	syntax(P, "an expression");
}

static struct node *parse_postfix(struct parser *P)
{
	struct node *n = parse_primary(P);
	for (;;) {
		if (accept_op(P, ".")) {
			struct tok *t = next(P);
			struct node *a = mk(P, N_ATTR);
			a->a = n;
			if (t->t == T_NAME) {
				a->name = adup(&P->c, t->p, t->n);
			} else if (t->t == T_INT) {   /* x.0 is x[0] */
				a->k = N_ITEM;
				a->b = mk(P, N_LIT);
				a->b->v = vint(t->i);
			} else {
				unread(P, t);
				syntax(P, "an attribute name");
			}
			n = a;
		} else if (accept_op(P, "[")) {
			struct node *lo = NULL, *hi = NULL, *st = NULL;
			bool slice = false;
			if (!is_op(peek(P), ":"))
				lo = parse_expr(P);
			if (accept_op(P, ":")) {
				slice = true;
				if (!is_op(peek(P), "]") && !is_op(peek(P), ":"))
					hi = parse_expr(P);
				if (accept_op(P, ":") && !is_op(peek(P), "]"))
					st = parse_expr(P);
			}
			expect_op(P, "]");
			struct node *a = mk(P, slice ? N_SLICE : N_ITEM);
			a->a = n;
			a->b = lo;
			a->c = hi;
			a->d = st;
			n = a;
		} else if (accept_op(P, "(")) {
			struct node *c = mk(P, N_CALL);
			c->a = n;
			parse_args(P, c);
			n = c;
		} else {
			return n;
		}
	}
}

static struct node *parse_filters(struct parser *P, struct node *n)
{
	while (accept_op(P, "|")) {
		struct node *f = mk(P, N_FILTER);
		f->name = expect_ident(P);
		if (!in_list(FILTERS, f->name))
			die(&P->c, LLM_ERR_UNSUPPORTED, P->line, "unsupported filter '%s'", f->name);
		f->a = n;
		if (accept_op(P, "("))
			parse_args(P, f);
		n = f;
	}
	return n;
}

static struct node *parse_unary(struct parser *P)
{
	if (accept_op(P, "-")) {
		struct node *n = mk(P, N_NEG);
		n->a = parse_unary(P);
		return n;
	}
	if (accept_op(P, "+")) {
		struct node *n = mk(P, N_POS);
		n->a = parse_unary(P);
		return n;
	}
	struct node *n = parse_filters(P, parse_postfix(P));
	/* tests bind after filters: x | length is divisibleby 2 */
	while (is_name(peek(P), "is")) {
		next(P);
		struct node *t = mk(P, N_TEST);
		t->neg = accept_name(P, "not");
		struct tok *nt = next(P);
		if (nt->t == T_NAME)
			t->name = adup(&P->c, nt->p, nt->n);
		else if (nt->t == T_OP && (is_op(nt, "==") || is_op(nt, "!=") || is_op(nt, "<") || is_op(nt, ">") ||
		                           is_op(nt, "<=") || is_op(nt, ">=")))
			t->name = adup(&P->c, nt->p, nt->n);
		else {
			unread(P, nt);
			syntax(P, "a test name");
		}
		if (!in_list(TESTS, t->name))
			die(&P->c, LLM_ERR_UNSUPPORTED, P->line, "unsupported test '%s'", t->name);
		t->a = n;
		if (accept_op(P, "(")) {
			parse_args(P, t);
		} else {
			struct tok *q = peek(P);
			/* one argument without parentheses: "is divisibleby 3", "is sameas none" */
			if (q->t == T_INT || q->t == T_FLOAT || q->t == T_STR ||
			    (q->t == T_NAME && !is_name(q, "and") && !is_name(q, "or") && !is_name(q, "else") &&
			     !is_name(q, "if") && !is_name(q, "in") && !is_name(q, "is") && !is_name(q, "not")))
				kid_push(P, t, parse_postfix(P));
		}
		n = t;
	}
	return n;
}

static struct node *bin(struct parser *P, const char *op, struct node *a, struct node *b)
{
	struct node *n = mk(P, N_BIN);
	n->name = op;
	n->a = a;
	n->b = b;
	return n;
}

static struct node *parse_pow(struct parser *P)
{
	struct node *n = parse_unary(P);
	while (accept_op(P, "**"))
		n = bin(P, "**", n, parse_unary(P));
	return n;
}

static struct node *parse_mul(struct parser *P)
{
	struct node *n = parse_pow(P);
	for (;;) {
		const char *op = accept_op(P, "*") ? "*" : accept_op(P, "//") ? "//" : accept_op(P, "/") ? "/"
		               : accept_op(P, "%") ? "%" : NULL;
		if (!op)
			return n;
		n = bin(P, op, n, parse_pow(P));
	}
}

static struct node *parse_add(struct parser *P)
{
	struct node *n = parse_mul(P);
	for (;;) {
		const char *op = accept_op(P, "+") ? "+" : accept_op(P, "-") ? "-" : NULL;
		if (!op)
			return n;
		n = bin(P, op, n, parse_mul(P));
	}
}

static struct node *parse_concat(struct parser *P)
{
	struct node *n = parse_add(P);
	while (accept_op(P, "~"))
		n = bin(P, "~", n, parse_add(P));
	return n;
}

static struct node *parse_cmp(struct parser *P)
{
	struct node *n = parse_concat(P);
	for (;;) {
		const char *op = NULL;
		static const char *ops[] = { "==", "!=", "<=", ">=", "<", ">" };
		for (int i = 0; i < 6 && !op; i++)
			if (accept_op(P, ops[i]))
				op = ops[i];
		if (!op && accept_name(P, "in"))
			op = "in";
		if (!op && is_name(peek(P), "not") && is_name(&P->tk[P->tpos + 1], "in")) {
			P->tpos += 2;
			op = "not in";
		}
		if (!op)
			return n;
		n = bin(P, op, n, parse_concat(P));
	}
}

static struct node *parse_not(struct parser *P)
{
	if (accept_name(P, "not")) {
		struct node *n = mk(P, N_NOT);
		n->a = parse_not(P);
		return n;
	}
	return parse_cmp(P);
}

static struct node *parse_and(struct parser *P)
{
	struct node *n = parse_not(P);
	while (accept_name(P, "and")) {
		struct node *a = mk(P, N_AND);
		a->a = n;
		a->b = parse_not(P);
		n = a;
	}
	return n;
}

static struct node *parse_or(struct parser *P)
{
	struct node *n = parse_and(P);
	while (accept_name(P, "or")) {
		struct node *a = mk(P, N_OR);
		a->a = n;
		a->b = parse_and(P);
		n = a;
	}
	return n;
}

static struct node *parse_expr(struct parser *P)
{
	struct node *n = parse_or(P);
	if (accept_name(P, "if")) {
		struct node *c = mk(P, N_COND);
		c->b = n;
		c->a = parse_or(P);
		if (accept_name(P, "else"))
			c->c = parse_expr(P);
		n = c;
	}
	return n;
}

/* expr or a bare tuple "a, b" (for {% set %} right-hand sides and for iterables). */
static struct node *parse_tuple_expr(struct parser *P)
{
	struct node *e = parse_expr(P);
	if (!is_op(peek(P), ","))
		return e;
	struct node *t = mk(P, N_TUPLE);
	kid_push(P, t, e);
	while (accept_op(P, ",") && peek(P)->t != T_EOF)
		kid_push(P, t, parse_expr(P));
	return t;
}

static void expect_end(struct parser *P)
{
	if (peek(P)->t != T_EOF)
		syntax(P, "end of tag");
}

/* Target names: "a" or "a, b" (or "(a, b)"). */
static void parse_targets(struct parser *P, struct node *n)
{
	const char *names[16];
	size_t k = 0;
	bool paren = accept_op(P, "(");
	do {
		if (k == 16)
			syntax(P, "fewer names");
		names[k++] = expect_ident(P);
	} while (accept_op(P, ","));
	if (paren)
		expect_op(P, ")");
	n->names = aalloc(&P->c, k * sizeof *n->names);
	memcpy(n->names, names, k * sizeof *names);
	n->n_names = k;
}

/* The tag name of chunk i ("endif"), or "". */
static const char *stmt_word(struct parser *P, size_t i, char *w, size_t wn)
{
	const char *p = P->ck[i].p, *e = p + P->ck[i].n;
	while (p < e && strchr(" \t\r\n", *p))
		p++;
	size_t k = 0;
	while (p < e && k + 1 < wn && ((*p >= 'a' && *p <= 'z') || *p == '_'))
		w[k++] = *p++;
	w[k] = 0;
	return w;
}

static struct node *parse_body(struct parser *P, const char **stops, const char **stopped);

static void start_tag(struct parser *P, size_t i)
{
	lex_expr(P, P->ck[i].p, P->ck[i].n, P->ck[i].line);
	next(P);   /* the tag word */
}

static struct node *parse_stmt(struct parser *P, size_t i)
{
	char w[32];
	stmt_word(P, i, w, sizeof w);
	start_tag(P, i);
	int line = P->ck[i].line;
	struct node *n;
	if (!strcmp(w, "if")) {
		n = mk(P, N_IF);
		n->a = parse_expr(P);
		expect_end(P);
		static const char *stops[] = { "elif", "else", "endif", NULL };
		const char *st;
		n->b = parse_body(P, stops, &st);
		struct node *cur = n;
		while (!strcmp(st, "elif")) {
			struct node *e = mk(P, N_IF);
			start_tag(P, P->pos - 1);
			e->a = parse_expr(P);
			expect_end(P);
			e->b = parse_body(P, stops, &st);
			struct node *body = mk(P, N_BODY);
			kid_push(P, body, e);
			cur->c = body;
			cur = e;
		}
		if (!strcmp(st, "else")) {
			static const char *s2[] = { "endif", NULL };
			cur->c = parse_body(P, s2, &st);
		}
		return n;
	}
	if (!strcmp(w, "for")) {
		n = mk(P, N_FOR);
		parse_targets(P, n);
		if (!accept_name(P, "in"))
			syntax(P, "'in'");
		n->b = parse_or(P);   /* not parse_expr: "if" filters the loop */
		if (is_op(peek(P), ",")) {
			struct node *t = mk(P, N_TUPLE);
			kid_push(P, t, n->b);
			while (accept_op(P, ","))
				kid_push(P, t, parse_or(P));
			n->b = t;
		}
		if (accept_name(P, "if"))
			n->filter = parse_expr(P);
		if (accept_name(P, "recursive"))
			die(&P->c, LLM_ERR_UNSUPPORTED, line, "unsupported: recursive for loops");
		expect_end(P);
		static const char *stops[] = { "else", "endfor", NULL };
		const char *st;
		n->c = parse_body(P, stops, &st);
		if (!strcmp(st, "else")) {
			static const char *s2[] = { "endfor", NULL };
			n->d = parse_body(P, s2, &st);
		}
		return n;
	}
	if (!strcmp(w, "set")) {
		const char *nm = expect_ident(P);
		if (accept_op(P, ".")) {           /* ns.attr = value */
			n = mk(P, N_SET);
			n->name = nm;
			n->names = aalloc(&P->c, sizeof *n->names);
			n->names[0] = expect_ident(P);
			n->n_names = 1;
			n->neg = true;   /* attribute assignment */
			expect_op(P, "=");
			n->a = parse_tuple_expr(P);
			expect_end(P);
			return n;
		}
		P->tpos--;
		n = mk(P, N_SET);
		parse_targets(P, n);
		if (accept_op(P, "=")) {
			n->a = parse_tuple_expr(P);
			expect_end(P);
			return n;
		}
		if (accept_op(P, "|"))
			die(&P->c, LLM_ERR_UNSUPPORTED, line, "unsupported: filtered {%% set %%} block");
		expect_end(P);
		if (n->n_names != 1)
			syntax(P, "'='");
		n->k = N_SETBLOCK;
		static const char *stops[] = { "endset", NULL };
		const char *st;
		n->a = parse_body(P, stops, &st);
		return n;
	}
	if (!strcmp(w, "macro")) {
		n = mk(P, N_MACRO);
		n->name = expect_ident(P);
		expect_op(P, "(");
		const char *names[32];
		struct node *defs[32];
		size_t k = 0;
		while (!accept_op(P, ")")) {
			if (k == 32)
				syntax(P, "fewer parameters");
			names[k] = expect_ident(P);
			defs[k] = accept_op(P, "=") ? parse_expr(P) : NULL;
			k++;
			if (!accept_op(P, ",")) {
				expect_op(P, ")");
				break;
			}
		}
		expect_end(P);
		n->names = aalloc(&P->c, (k + 1) * sizeof *n->names);
		n->defaults = aalloc(&P->c, (k + 1) * sizeof *n->defaults);
		memcpy(n->names, names, k * sizeof *names);
		memcpy(n->defaults, defs, k * sizeof *defs);
		n->n_names = k;
		static const char *stops[] = { "endmacro", NULL };
		const char *st;
		n->a = parse_body(P, stops, &st);
		return n;
	}
	if (!strcmp(w, "break") || !strcmp(w, "continue")) {
		expect_end(P);
		return mk(P, w[0] == 'b' ? N_BREAK : N_CONTINUE);
	}
	if (!strcmp(w, "generation")) {
		expect_end(P);
		static const char *stops[] = { "endgeneration", NULL };
		const char *st;
		return parse_body(P, stops, &st);
	}
	if (!strcmp(w, "with")) {
		die(&P->c, LLM_ERR_UNSUPPORTED, line, "unsupported tag 'with'");
	}
	if (!w[0])
		die(&P->c, LLM_ERR_FORMAT, line, "empty or malformed {%% %%} tag");
	die(&P->c, LLM_ERR_UNSUPPORTED, line, "unsupported tag '%s'", w);
}

/* Statements until one of STOPS (its name in *stopped) or the end (stops NULL). */
static struct node *parse_body(struct parser *P, const char **stops, const char **stopped)
{
	struct node *body = mk(P, N_BODY);
	int start_line = P->pos < P->n_ck ? P->ck[P->pos].line : 0;
	while (P->pos < P->n_ck) {
		size_t i = P->pos++;
		struct chunkt *c = &P->ck[i];
		P->line = c->line;
		if (c->k == CK_TEXT) {
			struct node *t = mk(P, N_TEXT);
			t->v = vstr(c->p, c->n);
			kid_push(P, body, t);
		} else if (c->k == CK_EXPR) {
			lex_expr(P, c->p, c->n, c->line);
			struct node *o = mk(P, N_OUT);
			o->a = parse_expr(P);
			expect_end(P);
			kid_push(P, body, o);
		} else {
			char w[32];
			stmt_word(P, i, w, sizeof w);
			for (const char **s = stops; s && *s; s++)
				if (!strcmp(w, *s)) {
					if (strcmp(w, "elif") && strcmp(w, "else")) {   /* end tags take no arguments */
						start_tag(P, i);
						expect_end(P);
					} else if (!strcmp(w, "else")) {
						start_tag(P, i);
						expect_end(P);
					}
					*stopped = *s;
					return body;
				}
			if (!strncmp(w, "end", 3) || !strcmp(w, "elif") || !strcmp(w, "else"))
				die(&P->c, LLM_ERR_FORMAT, c->line, "unexpected '%s'", w);
			kid_push(P, body, parse_stmt(P, i));
		}
	}
	if (stops)
		die(&P->c, LLM_ERR_FORMAT, start_line, "missing '{%% %s %%}'", stops[0][0] == 'e' && stops[1] ? stops[1] : stops[0]);
	*stopped = "";
	return body;
}

struct llm_jinja {
	struct arena ar;
	struct node *root;
	char *src;
};

enum llm_status llm_jinja_parse(struct llm_jinja **out, const char *src, size_t len)
{
	*out = NULL;
	struct llm_jinja *t = calloc(1, sizeof *t);
	struct parser *P = calloc(1, sizeof *P);
	if (!t || !P) {
		free(t);
		free(P);
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	P->c.ar = &t->ar;
	if (setjmp(P->c.jb)) {
		enum llm_status st = P->c.st;
		arena_free(&t->ar);
		free(t->src);
		free(t);
		free(P);
		return st;
	}
	t->src = malloc(len + 1);
	if (!t->src)
		die(&P->c, LLM_ERR_NOMEM, 0, "out of memory");
	/* as Jinja2's lexer reads a source: \r\n and \r become \n, and one
	 * newline at the very end is dropped (keep_trailing_newline is off in
	 * transformers' environment), so a template file's last newline is not
	 * part of the prompt */
	size_t n = 0;
	for (size_t i = 0; i < len; i++) {
		if (src[i] == '\r') {
			t->src[n++] = '\n';
			if (i + 1 < len && src[i + 1] == '\n')
				i++;
		} else {
			t->src[n++] = src[i];
		}
	}
	if (n && t->src[n - 1] == '\n')
		n--;
	t->src[n] = 0;
	P->src = t->src;
	P->len = n;
	lex_chunks(P);
	const char *st;
	t->root = parse_body(P, NULL, &st);
	free(P);
	*out = t;
	return LLM_OK;
}

void llm_jinja_free(struct llm_jinja *t)
{
	if (!t)
		return;
	arena_free(&t->ar);
	free(t->src);
	free(t);
}

/* ---------------------------------------------------------------- evaluation */

struct scope { struct dict vars; struct scope *up; };

struct rctx {
	struct ctx c;
	struct scope *sc;
	struct dict *globals;
	int loop_ctl;                /* 1 break, 2 continue */
};

static _Noreturn void rdie(struct rctx *r, int line, enum llm_status st, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static _Noreturn void rdie(struct rctx *r, int line, enum llm_status st, const char *fmt, ...)
{
	char msg[700];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	die(&r->c, st, line, "%s", msg);
}

static struct val lookup(struct rctx *r, const char *name)
{
	for (struct scope *s = r->sc; s; s = s->up) {
		struct val *v = dict_finds(&s->vars, name);
		if (v)
			return *v;
	}
	struct val *g = dict_finds(r->globals, name);
	return g ? *g : UNDEF;
}

static void assign(struct rctx *r, const char *name, struct val v)
{
	dict_sets(&r->c, &r->sc->vars, name, v);
}

static struct val eval(struct rctx *r, struct node *n);
static void exec_body(struct rctx *r, struct node *body, struct sb *out);

static size_t u8count(const char *s, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += ((unsigned char)s[i] & 0xC0) != 0x80;
	return k;
}

/* Byte offset of code point index CI in s. */
static size_t u8off(const char *s, size_t n, size_t ci)
{
	size_t i = 0;
	while (i < n && ci) {
		i++;
		while (i < n && ((unsigned char)s[i] & 0xC0) == 0x80)
			i++;
		ci--;
	}
	return i;
}

static int64_t length_of(struct rctx *r, struct val v, int line)
{
	switch (v.t) {
	case V_STR: return (int64_t)u8count(v.s.p, v.s.n);
	case V_LIST: return (int64_t)v.l->n;
	case V_DICT: return (int64_t)v.d->n;
	case V_UNDEF: return 0;
	default: rdie(r, line, LLM_ERR_USAGE, "object of type '%s' has no len()", type_name(v));
	}
}

/* Iterate: lists, dict keys, string characters; undefined is empty. */
static struct val to_list(struct rctx *r, struct val v, int line)
{
	struct val l = vlist(&r->c);
	switch (v.t) {
	case V_LIST: return v;
	case V_DICT:
		for (size_t i = 0; i < v.d->n; i++)
			list_push(&r->c, l.l, v.d->k[i]);
		return l;
	case V_STR:
		for (size_t i = 0; i < v.s.n;) {
			size_t k = 1;
			while (i + k < v.s.n && ((unsigned char)v.s.p[i + k] & 0xC0) == 0x80)
				k++;
			list_push(&r->c, l.l, vstr(v.s.p + i, k));
			i += k;
		}
		return l;
	case V_UNDEF: case V_NONE:
		if (v.t == V_NONE)
			rdie(r, line, LLM_ERR_USAGE, "'NoneType' object is not iterable");
		return l;
	default: rdie(r, line, LLM_ERR_USAGE, "'%s' object is not iterable", type_name(v));
	}
}

static struct val to_string(struct rctx *r, struct val v)
{
	if (v.t == V_STR)
		return v;
	struct sb b = { .c = &r->c };
	put_str(&b, v);
	return vstr(b.p ? b.p : "", b.n);
}

static int cmp_vals(struct rctx *r, struct val a, struct val b, int line)
{
	bool an = a.t == V_INT || a.t == V_FLOAT || a.t == V_BOOL, bn = b.t == V_INT || b.t == V_FLOAT || b.t == V_BOOL;
	if (an && bn) {
		if (a.t != V_FLOAT && b.t != V_FLOAT) {
			int64_t x = a.t == V_INT ? a.i : a.b, y = b.t == V_INT ? b.i : b.b;
			return x < y ? -1 : x > y;
		}
		double x = a.t == V_FLOAT ? a.f : a.t == V_INT ? (double)a.i : a.b;
		double y = b.t == V_FLOAT ? b.f : b.t == V_INT ? (double)b.i : b.b;
		return x < y ? -1 : x > y;
	}
	if (a.t == V_STR && b.t == V_STR) {
		size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
		int c = memcmp(a.s.p, b.s.p, n);
		return c ? (c < 0 ? -1 : 1) : (a.s.n < b.s.n ? -1 : a.s.n > b.s.n);
	}
	if (a.t == V_LIST && b.t == V_LIST) {
		for (size_t i = 0; i < a.l->n && i < b.l->n; i++) {
			int c = cmp_vals(r, a.l->v[i], b.l->v[i], line);
			if (c)
				return c;
		}
		return a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
	}
	rdie(r, line, LLM_ERR_USAGE, "'<' not supported between '%s' and '%s'", type_name(a), type_name(b));
}

static bool contains(struct rctx *r, struct val hay, struct val x, int line)
{
	switch (hay.t) {
	case V_STR:
		if (x.t != V_STR)
			rdie(r, line, LLM_ERR_USAGE, "'in <string>' requires string as left operand, not %s", type_name(x));
		return x.s.n == 0 || memmem(hay.s.p, hay.s.n, x.s.p, x.s.n) != NULL;
	case V_LIST:
		for (size_t i = 0; i < hay.l->n; i++)
			if (val_eq(hay.l->v[i], x))
				return true;
		return false;
	case V_DICT: return dict_find(hay.d, x) != NULL;
	case V_UNDEF: return false;
	default: rdie(r, line, LLM_ERR_USAGE, "argument of type '%s' is not iterable", type_name(hay));
	}
}

static double num(struct val v) { return v.t == V_FLOAT ? v.f : v.t == V_INT ? (double)v.i : v.b; }
static bool isnum(struct val v) { return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL; }

/* The longest string one operation may build (repetition, indent) */
#define JINJA_MAX_STR (64 << 20)

/* Python's float % and // (floatobject.c's float_rem and float_floor_div):
 * through fmod, so 1 % inf is 1 and -1 // inf is -1, not nan and -0 */
static double py_mod(double x, double y)
{
	double m = fmod(x, y);
	if (m != 0) {
		if ((y < 0) != (m < 0))
			m += y;
	} else {
		m = copysign(0.0, y);
	}
	return m;
}

static double py_floordiv(double x, double y)
{
	double m = fmod(x, y), d = (x - m) / y;
	if (m != 0 && (y < 0) != (m < 0))
		d -= 1.0;
	if (d == 0)
		return copysign(0.0, x / y);
	double f = floor(d);
	return d - f > 0.5 ? f + 1.0 : f;
}

/* Python's ints have no bound; these are 64-bit: a result past them is
 * refused, never wrapped. */
static _Noreturn void int_overflow(struct rctx *r, const char *op, int line)
{
	rdie(r, line, LLM_ERR_USAGE, "integer overflow in '%s' (integers are 64-bit here)", op);
}

static struct val binop(struct rctx *r, const char *op, struct val a, struct val b, int line)
{
	if (!strcmp(op, "~")) {
		struct sb s = { .c = &r->c };
		put_str(&s, a);
		put_str(&s, b);
		return vstr(s.p ? s.p : "", s.n);
	}
	if (!strcmp(op, "==")) return vbool(val_eq(a, b));
	if (!strcmp(op, "!=")) return vbool(!val_eq(a, b));
	if (!strcmp(op, "<")) return vbool(cmp_vals(r, a, b, line) < 0);
	if (!strcmp(op, ">")) return vbool(cmp_vals(r, a, b, line) > 0);
	if (!strcmp(op, "<=")) return vbool(cmp_vals(r, a, b, line) <= 0);
	if (!strcmp(op, ">=")) return vbool(cmp_vals(r, a, b, line) >= 0);
	if (!strcmp(op, "in")) return vbool(contains(r, b, a, line));
	if (!strcmp(op, "not in")) return vbool(!contains(r, b, a, line));
	if (!strcmp(op, "+")) {
		if (a.t == V_STR && b.t == V_STR) {
			char *p = aalloc(&r->c, a.s.n + b.s.n + 1);
			memcpy(p, a.s.p, a.s.n);
			memcpy(p + a.s.n, b.s.p, b.s.n);
			return vstr(p, a.s.n + b.s.n);
		}
		if (a.t == V_LIST && b.t == V_LIST) {
			struct val l = vlist(&r->c);
			for (size_t i = 0; i < a.l->n; i++)
				list_push(&r->c, l.l, a.l->v[i]);
			for (size_t i = 0; i < b.l->n; i++)
				list_push(&r->c, l.l, b.l->v[i]);
			return l;
		}
	}
	if (op[0] == '*' && !op[1] && ((a.t == V_STR && b.t == V_INT) || (a.t == V_INT && b.t == V_STR))) {
		struct val s = a.t == V_STR ? a : b;
		int64_t k = a.t == V_INT ? a.i : b.i;
		if (k > 0 && s.s.n > 0 && (uint64_t)k > JINJA_MAX_STR / s.s.n)
			rdie(r, line, LLM_ERR_USAGE, "string repeated %lld times: more than %d MiB", (long long)k,
			     JINJA_MAX_STR >> 20);
		struct sb o = { .c = &r->c };
		for (int64_t i = 0; i < k; i++)
			sb_put(&o, s.s.p, s.s.n);
		return vstr(o.p ? o.p : "", o.n);
	}
	if (!isnum(a) || !isnum(b))
		rdie(r, line, LLM_ERR_USAGE, "unsupported operand types for %s: '%s' and '%s'", op, type_name(a), type_name(b));
	bool ints = a.t != V_FLOAT && b.t != V_FLOAT;
	/* the integer value of an int or a bool (floats take fx, fy) */
	int64_t x = a.t == V_INT ? a.i : a.t == V_BOOL ? a.b : 0, y = b.t == V_INT ? b.i : b.t == V_BOOL ? b.b : 0;
	double fx = num(a), fy = num(b);
	int64_t z;
	switch (op[0]) {
	case '+':
		if (!ints)
			return vfloat(fx + fy);
		if (__builtin_add_overflow(x, y, &z))
			int_overflow(r, op, line);
		return vint(z);
	case '-':
		if (!ints)
			return vfloat(fx - fy);
		if (__builtin_sub_overflow(x, y, &z))
			int_overflow(r, op, line);
		return vint(z);
	case '*':
		if (op[1] == '*') {
			if (!ints || y < 0)
				return vfloat(pow(fx, fy));
			/* exact, by squaring: pow() rounds past 2^53 */
			z = 1;
			for (int64_t base = x, e = y; e; e >>= 1) {
				if ((e & 1) && __builtin_mul_overflow(z, base, &z))
					int_overflow(r, op, line);
				if (e > 1 && __builtin_mul_overflow(base, base, &base))
					int_overflow(r, op, line);
			}
			return vint(z);
		}
		if (!ints)
			return vfloat(fx * fy);
		if (__builtin_mul_overflow(x, y, &z))
			int_overflow(r, op, line);
		return vint(z);
	case '/':
		if (fy == 0)
			rdie(r, line, LLM_ERR_USAGE, "division by zero");
		if (op[1] == '/') {
			if (ints) {
				if (x == INT64_MIN && y == -1)
					int_overflow(r, op, line);
				int64_t q = x / y;
				if ((x % y != 0) && ((x < 0) != (y < 0)))
					q--;
				return vint(q);
			}
			return vfloat(py_floordiv(fx, fy));
		}
		return vfloat(fx / fy);
	case '%':
		if (fy == 0)
			rdie(r, line, LLM_ERR_USAGE, "modulo by zero");
		if (ints) {
			if (y == -1)        /* INT64_MIN % -1 traps */
				return vint(0);
			int64_t m = x % y;
			if (m != 0 && ((m < 0) != (y < 0)))
				m += y;
			return vint(m);
		}
		return vfloat(py_mod(fx, fy));
	}
	rdie(r, line, LLM_ERR_INTERNAL, "operator %s", op);
}

static struct val get_item(struct rctx *r, struct val obj, struct val key, int line);

/* obj.name: dict methods first (Jinja's getattr), then keys. */
static struct val get_attr(struct rctx *r, struct val obj, const char *name, int line)
{
	static const char *dict_m[] = { "items", "keys", "values", "get", "copy", "update", "pop", "setdefault", NULL };
	static const char *str_m[] = { "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "replace",
	                               "upper", "lower", "title", "capitalize", "find", "rfind", "count", "join",
	                               "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper",
	                               "format", "index", NULL };
	static const char *list_m[] = { "append", "extend", "pop", "insert", "remove", "index", "count", "copy", NULL };
	if (obj.t == V_UNDEF)
		rdie(r, line, LLM_ERR_USAGE, "'%s' is undefined", name);   /* jinja2.UndefinedError */
	const char **ml = obj.t == V_DICT && !obj.d->ns ? dict_m : obj.t == V_STR ? str_m : obj.t == V_LIST ? list_m : NULL;
	if (ml && in_list(ml, name)) {
		struct val m = { .t = V_METHOD };
		m.m = aalloc(&r->c, sizeof *m.m);
		m.m->self = obj;
		m.m->name = name;
		return m;
	}
	if (obj.t == V_DICT) {
		struct val *v = dict_finds(obj.d, name);
		return v ? *v : UNDEF;
	}
	return UNDEF;
}

static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

static struct val get_item(struct rctx *r, struct val obj, struct val key, int line)
{
	if (obj.t == V_UNDEF)
		rdie(r, line, LLM_ERR_USAGE, "cannot index an undefined value");
	if (obj.t == V_DICT) {
		struct val *v = dict_find(obj.d, key);
		if (v)
			return *v;
		if (key.t == V_STR) {
			char *k = adup(&r->c, key.s.p, key.s.n);
			if (!obj.d->ns)
				return get_attr(r, obj, k, line);
		}
		return UNDEF;
	}
	if (obj.t == V_LIST || obj.t == V_STR) {
		if (key.t != V_INT && key.t != V_BOOL) {
			if (key.t == V_STR)
				return get_attr(r, obj, adup(&r->c, key.s.p, key.s.n), line);
			rdie(r, line, LLM_ERR_USAGE, "indices must be integers, not %s", type_name(key));
		}
		int64_t n = length_of(r, obj, line), i = norm_index(key.t == V_INT ? key.i : key.b, n);
		if (i < 0 || i >= n)
			return UNDEF;   /* jinja2: undefined, not an exception */
		if (obj.t == V_LIST)
			return obj.l->v[i];
		size_t a = u8off(obj.s.p, obj.s.n, (size_t)i), b = u8off(obj.s.p, obj.s.n, (size_t)i + 1);
		return vstr(obj.s.p + a, b - a);
	}
	return UNDEF;
}

static struct val slice(struct rctx *r, struct val obj, struct val lo, struct val hi, struct val step, int line)
{
	if (obj.t != V_LIST && obj.t != V_STR)
		rdie(r, line, LLM_ERR_USAGE, "'%s' object is not subscriptable", type_name(obj));
	int64_t n = length_of(r, obj, line);
	int64_t st = step.t == V_INT ? step.i : 1;
	if (st == 0)
		rdie(r, line, LLM_ERR_USAGE, "slice step cannot be zero");
	int64_t a, b;
	if (st > 0) {
		a = lo.t == V_INT ? norm_index(lo.i, n) : 0;
		b = hi.t == V_INT ? norm_index(hi.i, n) : n;
		a = a < 0 ? 0 : a > n ? n : a;
		b = b < 0 ? 0 : b > n ? n : b;
	} else {
		a = lo.t == V_INT ? norm_index(lo.i, n) : n - 1;
		b = hi.t == V_INT ? norm_index(hi.i, n) : -1;
		a = a < -1 ? -1 : a > n - 1 ? n - 1 : a;
		b = b < -1 ? -1 : b > n - 1 ? n - 1 : b;
	}
	struct val out = obj.t == V_LIST ? vlist(&r->c) : UNDEF;
	struct sb sb = { .c = &r->c };
	for (int64_t i = a; st > 0 ? i < b : i > b; i += st) {
		if (obj.t == V_LIST) {
			list_push(&r->c, out.l, obj.l->v[i]);
		} else {
			size_t x = u8off(obj.s.p, obj.s.n, (size_t)i), y = u8off(obj.s.p, obj.s.n, (size_t)i + 1);
			sb_put(&sb, obj.s.p + x, y - x);
		}
	}
	if (obj.t == V_STR)
		return vstr(sb.p ? sb.p : "", sb.n);
	return out;
}

/* ---- JSON (tojson) */

static void json_str(struct sb *b, const char *s, size_t n)
{
	sb_putc(b, '"');
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		switch (ch) {
		case '"': sb_puts(b, "\\\""); break;
		case '\\': sb_puts(b, "\\\\"); break;
		case '\n': sb_puts(b, "\\n"); break;
		case '\r': sb_puts(b, "\\r"); break;
		case '\t': sb_puts(b, "\\t"); break;
		case '\b': sb_puts(b, "\\b"); break;
		case '\f': sb_puts(b, "\\f"); break;
		default:
			if (ch < 0x20)
				sb_printf(b, "\\u%04x", ch);
			else
				sb_putc(b, (char)ch);
		}
	}
	sb_putc(b, '"');
}

struct jopts { int indent; const char *item_sep, *key_sep; bool sort; };

static void newline_indent(struct sb *b, const struct jopts *o, int depth)
{
	sb_putc(b, '\n');
	for (int i = 0; i < depth * o->indent; i++)
		sb_putc(b, ' ');
}

static void to_json(struct rctx *r, struct sb *b, struct val v, const struct jopts *o, int depth, int line)
{
	switch (v.t) {
	case V_NONE: sb_puts(b, "null"); break;
	case V_BOOL: sb_puts(b, v.b ? "true" : "false"); break;
	case V_INT: sb_printf(b, "%lld", (long long)v.i); break;
	case V_FLOAT:
		if (isnan(v.f)) sb_puts(b, "NaN");
		else if (isinf(v.f)) sb_puts(b, v.f < 0 ? "-Infinity" : "Infinity");
		else put_float(b, v.f);
		break;
	case V_STR: json_str(b, v.s.p, v.s.n); break;
	case V_LIST:
		if (!v.l->n) {
			sb_puts(b, "[]");
			break;
		}
		sb_putc(b, '[');
		for (size_t i = 0; i < v.l->n; i++) {
			if (i)
				sb_puts(b, o->item_sep);
			if (o->indent >= 0)
				newline_indent(b, o, depth + 1);
			to_json(r, b, v.l->v[i], o, depth + 1, line);
		}
		if (o->indent >= 0)
			newline_indent(b, o, depth);
		sb_putc(b, ']');
		break;
	case V_DICT: {
		if (!v.d->n) {
			sb_puts(b, "{}");
			break;
		}
		size_t *ord = aalloc(&r->c, v.d->n * sizeof *ord);
		for (size_t i = 0; i < v.d->n; i++)
			ord[i] = i;
		if (o->sort)   /* insertion sort by key */
			for (size_t i = 1; i < v.d->n; i++)
				for (size_t j = i; j > 0 && cmp_vals(r, v.d->k[ord[j - 1]], v.d->k[ord[j]], line) > 0; j--) {
					size_t t = ord[j];
					ord[j] = ord[j - 1];
					ord[j - 1] = t;
				}
		sb_putc(b, '{');
		for (size_t q = 0; q < v.d->n; q++) {
			size_t i = ord[q];
			if (q)
				sb_puts(b, o->item_sep);
			if (o->indent >= 0)
				newline_indent(b, o, depth + 1);
			struct val k = v.d->k[i];
			if (k.t == V_STR) {
				json_str(b, k.s.p, k.s.n);
			} else if (k.t == V_INT || k.t == V_FLOAT || k.t == V_BOOL || k.t == V_NONE) {
				struct sb t = { .c = &r->c };
				to_json(r, &t, k, o, depth, line);
				json_str(b, t.p, t.n);
			} else {
				rdie(r, line, LLM_ERR_USAGE, "tojson: keys must be str, int, float, bool or None");
			}
			sb_puts(b, o->key_sep);
			to_json(r, b, v.d->v[i], o, depth + 1, line);
		}
		if (o->indent >= 0)
			newline_indent(b, o, depth);
		sb_putc(b, '}');
		break;
	}
	default:
		rdie(r, line, LLM_ERR_USAGE, "tojson: Object of type %s is not JSON serializable", type_name(v));
	}
}

/* ---- calls */

static struct val kwarg(struct args *a, const char *name, size_t pos, struct val def)
{
	for (size_t i = 0; i < a->n_kw; i++)
		if (!strcmp(a->kw[i], name))
			return a->kwv[i];
	return pos < a->n_pos ? a->pos[pos] : def;
}

static struct val call_value(struct rctx *r, struct val fn, struct args *a, int line);
static struct val apply_filter(struct rctx *r, const char *name, struct val v, struct args *a, int line);
static bool apply_test(struct rctx *r, const char *name, struct val v, struct args *a, int line);

static bool is_space_cp(int32_t c)
{
	return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
	       (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static int32_t cp_at(const char *s, size_t n, size_t i, size_t *k)
{
	utf8proc_int32_t cp;
	utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
	*k = r > 0 ? (size_t)r : 1;
	return r > 0 ? cp : 0xFFFD;
}

static bool in_chars(struct val chars, int32_t cp)
{
	if (chars.t != V_STR)
		return is_space_cp(cp);
	for (size_t i = 0; i < chars.s.n;) {
		size_t k;
		if (cp_at(chars.s.p, chars.s.n, i, &k) == cp)
			return true;
		i += k;
	}
	return false;
}

/* Python str.strip/lstrip/rstrip(chars). */
static struct val strip(struct val s, struct val chars, bool left, bool right)
{
	size_t a = 0, b = s.s.n, k;
	while (left && a < b && in_chars(chars, cp_at(s.s.p, s.s.n, a, &k)))
		a += k;
	while (right && b > a) {
		size_t q = b - 1;
		while (q > a && ((unsigned char)s.s.p[q] & 0xC0) == 0x80)
			q--;
		if (!in_chars(chars, cp_at(s.s.p, s.s.n, q, &k)))
			break;
		b = q;
	}
	return vstr(s.s.p + a, b - a);
}

static struct val case_map(struct rctx *r, struct val s, int mode)   /* 0 lower, 1 upper, 2 capitalize, 3 title */
{
	struct sb b = { .c = &r->c };
	bool first = true, prev_cased = false;
	for (size_t i = 0; i < s.s.n;) {
		size_t k;
		int32_t cp = cp_at(s.s.p, s.s.n, i, &k);
		int32_t o;
		if (mode == 0) o = utf8proc_tolower(cp);
		else if (mode == 1) o = utf8proc_toupper(cp);
		else if (mode == 2) o = first ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
		else o = prev_cased ? utf8proc_tolower(cp) : utf8proc_toupper(cp);
		const utf8proc_property_t *pr = utf8proc_get_property(cp);
		prev_cased = pr->category == UTF8PROC_CATEGORY_LU || pr->category == UTF8PROC_CATEGORY_LL ||
		             pr->category == UTF8PROC_CATEGORY_LT;
		utf8proc_uint8_t u[4];
		utf8proc_ssize_t n = utf8proc_encode_char(o, u);
		sb_put(&b, (const char *)u, (size_t)n);
		first = false;
		i += k;
	}
	return vstr(b.p ? b.p : "", b.n);
}

static struct val split_str(struct rctx *r, struct val s, struct val sep, int64_t maxsplit)
{
	struct val l = vlist(&r->c);
	if (sep.t == V_STR) {
		if (!sep.s.n)
			rdie(r, 0, LLM_ERR_USAGE, "split: empty separator");
		size_t i = 0;
		int64_t k = 0;
		for (;;) {
			const char *p = (maxsplit < 0 || k < maxsplit) ? memmem(s.s.p + i, s.s.n - i, sep.s.p, sep.s.n) : NULL;
			if (!p) {
				list_push(&r->c, l.l, vstr(s.s.p + i, s.s.n - i));
				break;
			}
			list_push(&r->c, l.l, vstr(s.s.p + i, (size_t)(p - (s.s.p + i))));
			i = (size_t)(p - s.s.p) + sep.s.n;
			k++;
		}
		return l;
	}
	size_t i = 0, k;
	int64_t cnt = 0;
	while (i < s.s.n) {
		while (i < s.s.n && is_space_cp(cp_at(s.s.p, s.s.n, i, &k)))
			i += k;
		if (i >= s.s.n)
			break;
		if (maxsplit >= 0 && cnt >= maxsplit) {
			struct val rest = strip(vstr(s.s.p + i, s.s.n - i), UNDEF, false, true);
			list_push(&r->c, l.l, rest);
			break;
		}
		size_t j = i;
		while (j < s.s.n && !is_space_cp(cp_at(s.s.p, s.s.n, j, &k)))
			j += k;
		list_push(&r->c, l.l, vstr(s.s.p + i, j - i));
		cnt++;
		i = j;
	}
	return l;
}

static struct val replace_str(struct rctx *r, struct val s, struct val a, struct val b, int64_t count)
{
	struct sb o = { .c = &r->c };
	if (!a.s.n) {   /* Python inserts b between every character */
		int64_t k = 0;
		for (size_t i = 0; i <= s.s.n;) {
			if (count < 0 || k < count) {
				sb_put(&o, b.s.p, b.s.n);
				k++;
			}
			if (i == s.s.n)
				break;
			size_t n = 1;
			while (i + n < s.s.n && ((unsigned char)s.s.p[i + n] & 0xC0) == 0x80)
				n++;
			sb_put(&o, s.s.p + i, n);
			i += n;
		}
		return vstr(o.p ? o.p : "", o.n);
	}
	size_t i = 0;
	int64_t k = 0;
	while (i < s.s.n) {
		const char *p = (count < 0 || k < count) ? memmem(s.s.p + i, s.s.n - i, a.s.p, a.s.n) : NULL;
		if (!p) {
			sb_put(&o, s.s.p + i, s.s.n - i);
			break;
		}
		sb_put(&o, s.s.p + i, (size_t)(p - (s.s.p + i)));
		sb_put(&o, b.s.p, b.s.n);
		i = (size_t)(p - s.s.p) + a.s.n;
		k++;
	}
	return vstr(o.p ? o.p : "", o.n);
}

static void need_str(struct rctx *r, struct val v, const char *what, int line)
{
	if (v.t != V_STR)
		rdie(r, line, LLM_ERR_USAGE, "%s: expected a string, got %s", what, type_name(v));
}

static struct val call_method(struct rctx *r, struct method *m, struct args *a, int line)
{
	struct val s = m->self;
	const char *n = m->name;
	struct val a0 = a->n_pos > 0 ? a->pos[0] : UNDEF, a1 = a->n_pos > 1 ? a->pos[1] : UNDEF;
	if (s.t == V_STR) {
		if (!strcmp(n, "startswith") || !strcmp(n, "endswith")) {
			bool end = n[0] == 'e';
			struct val pre = a0;
			struct val list = pre.t == V_LIST ? pre : UNDEF;
			size_t cnt = list.t == V_LIST ? list.l->n : 1;
			for (size_t i = 0; i < cnt; i++) {
				struct val p = list.t == V_LIST ? list.l->v[i] : pre;
				need_str(r, p, n, line);
				if (p.s.n <= s.s.n && !memcmp(s.s.p + (end ? s.s.n - p.s.n : 0), p.s.p, p.s.n))
					return vbool(true);
			}
			return vbool(false);
		}
		if (!strcmp(n, "strip")) return strip(s, a0.t == V_NONE ? UNDEF : a0, true, true);
		if (!strcmp(n, "lstrip")) return strip(s, a0.t == V_NONE ? UNDEF : a0, true, false);
		if (!strcmp(n, "rstrip")) return strip(s, a0.t == V_NONE ? UNDEF : a0, false, true);
		if (!strcmp(n, "split")) {
			struct val sep = kwarg(a, "sep", 0, UNDEF), mx = kwarg(a, "maxsplit", 1, vint(-1));
			return split_str(r, s, sep.t == V_NONE ? UNDEF : sep, mx.t == V_INT ? mx.i : -1);
		}
		if (!strcmp(n, "rsplit")) {
			struct val mx = kwarg(a, "maxsplit", 1, vint(-1));
			if (mx.t == V_INT && mx.i >= 0)
				rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported: rsplit with maxsplit");
			return split_str(r, s, a0.t == V_NONE ? UNDEF : a0, -1);
		}
		if (!strcmp(n, "replace")) {
			need_str(r, a0, "replace", line);
			need_str(r, a1, "replace", line);
			return replace_str(r, s, a0, a1, a->n_pos > 2 && a->pos[2].t == V_INT ? a->pos[2].i : -1);
		}
		if (!strcmp(n, "upper")) return case_map(r, s, 1);
		if (!strcmp(n, "lower")) return case_map(r, s, 0);
		if (!strcmp(n, "capitalize")) return case_map(r, s, 2);
		if (!strcmp(n, "title")) return case_map(r, s, 3);
		if (!strcmp(n, "find") || !strcmp(n, "rfind") || !strcmp(n, "index") || !strcmp(n, "count")) {
			need_str(r, a0, n, line);
			if (!strcmp(n, "count")) {
				int64_t k = 0;
				if (!a0.s.n)
					return vint((int64_t)u8count(s.s.p, s.s.n) + 1);
				for (const char *p = s.s.p; (p = memmem(p, s.s.n - (size_t)(p - s.s.p), a0.s.p, a0.s.n)); p += a0.s.n)
					k++;
				return vint(k);
			}
			const char *p = NULL;
			if (n[0] == 'r') {
				for (size_t i = s.s.n + 1; i-- > 0;)
					if (i + a0.s.n <= s.s.n && !memcmp(s.s.p + i, a0.s.p, a0.s.n)) {
						p = s.s.p + i;
						break;
					}
			} else {
				p = a0.s.n ? memmem(s.s.p, s.s.n, a0.s.p, a0.s.n) : s.s.p;
			}
			if (!p && n[0] == 'i')
				rdie(r, line, LLM_ERR_USAGE, "substring not found");
			return vint(p ? (int64_t)u8count(s.s.p, (size_t)(p - s.s.p)) : -1);
		}
		if (!strcmp(n, "join")) {
			struct val l = to_list(r, a0, line);
			struct sb o = { .c = &r->c };
			for (size_t i = 0; i < l.l->n; i++) {
				if (i)
					sb_put(&o, s.s.p, s.s.n);
				need_str(r, l.l->v[i], "join", line);
				sb_put(&o, l.l->v[i].s.p, l.l->v[i].s.n);
			}
			return vstr(o.p ? o.p : "", o.n);
		}
		if (!strcmp(n, "splitlines")) {
			struct val l = vlist(&r->c);
			size_t i = 0;
			while (i < s.s.n) {
				size_t j = i;
				while (j < s.s.n && s.s.p[j] != '\n' && s.s.p[j] != '\r')
					j++;
				list_push(&r->c, l.l, vstr(s.s.p + i, j - i));
				if (j < s.s.n && s.s.p[j] == '\r' && j + 1 < s.s.n && s.s.p[j + 1] == '\n')
					j++;
				i = j + 1;
			}
			return l;
		}
		if (!strncmp(n, "is", 2)) {
			if (!s.s.n)
				return vbool(false);
			bool all = true, any_cased = false;
			for (size_t i = 0; i < s.s.n;) {
				size_t k;
				int32_t cp = cp_at(s.s.p, s.s.n, i, &k);
				int cat = utf8proc_get_property(cp)->category;
				bool alpha = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
				bool digit = cat == UTF8PROC_CATEGORY_ND;
				if (!strcmp(n, "isdigit")) all &= digit;
				else if (!strcmp(n, "isalpha")) all &= alpha;
				else if (!strcmp(n, "isalnum")) all &= alpha || digit || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
				else if (!strcmp(n, "isspace")) all &= is_space_cp(cp);
				else if (!strcmp(n, "islower")) { all &= cat != UTF8PROC_CATEGORY_LU && cat != UTF8PROC_CATEGORY_LT; any_cased |= cat == UTF8PROC_CATEGORY_LL; }
				else if (!strcmp(n, "isupper")) { all &= cat != UTF8PROC_CATEGORY_LL && cat != UTF8PROC_CATEGORY_LT; any_cased |= cat == UTF8PROC_CATEGORY_LU; }
				i += k;
			}
			if (!strcmp(n, "islower") || !strcmp(n, "isupper"))
				return vbool(all && any_cased);
			return vbool(all);
		}
		rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported string method '%s'", n);
	}
	if (s.t == V_DICT) {
		if (!strcmp(n, "items")) {
			struct val l = vlist(&r->c);
			for (size_t i = 0; i < s.d->n; i++) {
				struct val t = vlist(&r->c);
				list_push(&r->c, t.l, s.d->k[i]);
				list_push(&r->c, t.l, s.d->v[i]);
				list_push(&r->c, l.l, t);
			}
			return l;
		}
		if (!strcmp(n, "keys") || !strcmp(n, "values")) {
			struct val l = vlist(&r->c);
			for (size_t i = 0; i < s.d->n; i++)
				list_push(&r->c, l.l, n[0] == 'k' ? s.d->k[i] : s.d->v[i]);
			return l;
		}
		if (!strcmp(n, "get")) {
			struct val *v = dict_find(s.d, a0);
			return v ? *v : (a->n_pos > 1 ? a1 : NONE);
		}
		if (!strcmp(n, "copy")) {
			struct val d = vdict(&r->c);
			for (size_t i = 0; i < s.d->n; i++)
				dict_set(&r->c, d.d, s.d->k[i], s.d->v[i]);
			return d;
		}
		rdie(r, line, LLM_ERR_USAGE, "access to attribute '%s' of 'dict' object is unsafe (immutable sandbox)", n);
	}
	if (s.t == V_LIST) {
		if (!strcmp(n, "index") || !strcmp(n, "count")) {
			int64_t k = 0;
			for (size_t i = 0; i < s.l->n; i++)
				if (val_eq(s.l->v[i], a0)) {
					if (n[0] == 'i')
						return vint((int64_t)i);
					k++;
				}
			if (n[0] == 'i')
				rdie(r, line, LLM_ERR_USAGE, "value is not in list");
			return vint(k);
		}
		if (!strcmp(n, "copy"))
			return slice(r, s, UNDEF, UNDEF, UNDEF, line);
		rdie(r, line, LLM_ERR_USAGE, "access to attribute '%s' of 'list' object is unsafe (immutable sandbox)", n);
	}
	rdie(r, line, LLM_ERR_INTERNAL, "method '%s'", n);
}

static struct val call_macro(struct rctx *r, struct func *f, struct args *a, int line)
{
	struct node *m = f->macro;
	struct scope sc = { .up = r->sc };
	/* Macros see the template's globals and their own arguments (Jinja2
	 * macros do not see the caller's local variables). */
	struct scope *root = r->sc;
	while (root->up)
		root = root->up;
	sc.up = root;
	if (a->n_pos > m->n_names)
		rdie(r, line, LLM_ERR_USAGE, "macro '%s' takes %zu arguments, got %zu", m->name, m->n_names, a->n_pos);
	struct scope *saved = r->sc;
	r->sc = &sc;
	for (size_t i = 0; i < m->n_names; i++) {
		struct val v = UNDEF;
		bool set = false;
		if (i < a->n_pos) {
			v = a->pos[i];
			set = true;
		}
		for (size_t k = 0; k < a->n_kw; k++)
			if (!strcmp(a->kw[k], m->names[i])) {
				v = a->kwv[k];
				set = true;
			}
		if (!set && m->defaults[i])
			v = eval(r, m->defaults[i]);
		assign(r, m->names[i], v);
	}
	for (size_t k = 0; k < a->n_kw; k++) {
		bool known = false;
		for (size_t i = 0; i < m->n_names; i++)
			known |= !strcmp(a->kw[k], m->names[i]);
		if (!known)
			rdie(r, line, LLM_ERR_USAGE, "macro '%s' has no argument '%s'", m->name, a->kw[k]);
	}
	struct sb out = { .c = &r->c };
	exec_body(r, m->a, &out);
	r->sc = saved;
	return vstr(out.p ? out.p : "", out.n);
}

static struct val call_value(struct rctx *r, struct val fn, struct args *a, int line)
{
	if (fn.t == V_METHOD)
		return call_method(r, fn.m, a, line);
	if (fn.t != V_FUNC)
		rdie(r, line, LLM_ERR_USAGE, "'%s' object is not callable", type_name(fn));
	if (fn.fn->macro)
		return call_macro(r, fn.fn, a, line);
	return fn.fn->builtin(r, fn.fn, a, line);
}

static struct val bi_raise(struct rctx *r, struct func *f, struct args *a, int line)
{
	(void)f;
	struct val m = a->n_pos ? to_string(r, a->pos[0]) : vstr("", 0);
	rdie(r, line, LLM_ERR_USAGE, "raise_exception: %.*s", (int)m.s.n, m.s.p);
}

static struct val bi_namespace(struct rctx *r, struct func *f, struct args *a, int line)
{
	(void)f;
	struct val d = vdict(&r->c);
	d.d->ns = true;
	for (size_t i = 0; i < a->n_pos; i++) {
		if (a->pos[i].t != V_DICT)
			rdie(r, line, LLM_ERR_USAGE, "namespace(): positional argument must be a dict");
		for (size_t k = 0; k < a->pos[i].d->n; k++)
			dict_set(&r->c, d.d, a->pos[i].d->k[k], a->pos[i].d->v[k]);
	}
	for (size_t i = 0; i < a->n_kw; i++)
		dict_sets(&r->c, d.d, a->kw[i], a->kwv[i]);
	return d;
}

static struct val bi_dict(struct rctx *r, struct func *f, struct args *a, int line)
{
	struct val d = bi_namespace(r, f, a, line);
	d.d->ns = false;
	return d;
}

static struct val bi_range(struct rctx *r, struct func *f, struct args *a, int line)
{
	(void)f;
	int64_t v[3] = { 0, 0, 1 };
	if (a->n_pos < 1 || a->n_pos > 3)
		rdie(r, line, LLM_ERR_USAGE, "range() takes 1 to 3 arguments");
	for (size_t i = 0; i < a->n_pos; i++)
		if (a->pos[i].t != V_INT)
			rdie(r, line, LLM_ERR_USAGE, "range(): arguments must be integers");
	if (a->n_pos == 1)
		v[1] = a->pos[0].i;
	else
		for (size_t i = 0; i < a->n_pos; i++)
			v[i] = a->pos[i].i;
	if (!v[2])
		rdie(r, line, LLM_ERR_USAGE, "range() arg 3 must not be zero");
	struct val l = vlist(&r->c);
	for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1];) {
		if (l.l->n > 10000000)
			rdie(r, line, LLM_ERR_USAGE, "range() too large");
		list_push(&r->c, l.l, vint(i));
		if (__builtin_add_overflow(i, v[2], &i))   /* past the last 64-bit value: the end */
			break;
	}
	return l;
}

static struct val bi_strftime(struct rctx *r, struct func *f, struct args *a, int line)
{
	(void)f;
	if (a->n_pos != 1 || a->pos[0].t != V_STR)
		rdie(r, line, LLM_ERR_USAGE, "strftime_now(format) takes one string");
	char fmt[256], out[512];
	snprintf(fmt, sizeof fmt, "%.*s", (int)a->pos[0].s.n, a->pos[0].s.p);
	time_t now = time(NULL);
	struct tm tm;
	localtime_r(&now, &tm);
	size_t n = strftime(out, sizeof out, fmt, &tm);
	return vstr(adup(&r->c, out, n), n);
}

static struct val bi_cycle(struct rctx *r, struct func *f, struct args *a, int line)
{
	(void)line;
	if (!a->n_pos)
		return UNDEF;
	int64_t idx = f->data.i;
	return a->pos[idx % (int64_t)a->n_pos];
	(void)r;
}

static struct val mkfunc(struct rctx *r, const char *name,
                         struct val (*fn)(struct rctx *, struct func *, struct args *, int))
{
	struct val v = { .t = V_FUNC };
	v.fn = aalloc(&r->c, sizeof *v.fn);
	v.fn->name = name;
	v.fn->builtin = fn;
	return v;
}

/* ---- filters and tests */

static struct val attr_path(struct rctx *r, struct val v, struct val path, int line)
{
	/* "a.b" or an integer index */
	if (path.t == V_INT)
		return get_item(r, v, path, line);
	need_str(r, path, "attribute", line);
	const char *p = path.s.p, *e = p + path.s.n;
	while (p <= e) {
		const char *d = memchr(p, '.', (size_t)(e - p));
		if (!d)
			d = e;
		bool digits = d > p;
		for (const char *q = p; q < d; q++)
			digits &= *q >= '0' && *q <= '9';
		struct val key = digits ? vint(strtoll(adup(&r->c, p, (size_t)(d - p)), NULL, 10)) : vstr(p, (size_t)(d - p));
		if (v.t == V_UNDEF)
			return UNDEF;
		v = get_item(r, v, key, line);
		p = d + 1;
	}
	return v;
}

/* select/reject/selectattr/rejectattr/map share argument handling. */
static struct val filter_seq(struct rctx *r, const char *name, struct val v, struct args *a, int line)
{
	struct val l = to_list(r, v, line), out = vlist(&r->c);
	bool attr = strstr(name, "attr") != NULL, reject = name[0] == 'r';
	if (!strcmp(name, "map")) {
		struct val at = kwarg(a, "attribute", 99, UNDEF);
		struct val def = kwarg(a, "default", 99, UNDEF);
		for (size_t i = 0; i < l.l->n; i++) {
			struct val x = l.l->v[i];
			if (at.t != V_UNDEF) {
				x = attr_path(r, x, at, line);
				if (x.t == V_UNDEF && def.t != V_UNDEF)
					x = def;
			} else {
				if (!a->n_pos)
					rdie(r, line, LLM_ERR_USAGE, "map: needs a filter name or attribute=");
				need_str(r, a->pos[0], "map", line);
				char *fname = adup(&r->c, a->pos[0].s.p, a->pos[0].s.n);
				if (!in_list(FILTERS, fname))
					rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported filter '%s'", fname);
				struct args sub = { a->pos + 1, a->n_pos - 1, a->kw, a->kwv, a->n_kw };
				x = apply_filter(r, fname, x, &sub, line);
			}
			list_push(&r->c, out.l, x);
		}
		return out;
	}
	size_t first = attr ? 1 : 0;
	if (attr && !a->n_pos)
		rdie(r, line, LLM_ERR_USAGE, "%s: needs an attribute", name);
	char *test = NULL;
	if (a->n_pos > first) {
		need_str(r, a->pos[first], name, line);
		test = adup(&r->c, a->pos[first].s.p, a->pos[first].s.n);
		if (!in_list(TESTS, test))
			rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported test '%s'", test);
	}
	struct args sub = { a->pos + first + 1, a->n_pos > first + 1 ? a->n_pos - first - 1 : 0, NULL, NULL, 0 };
	for (size_t i = 0; i < l.l->n; i++) {
		struct val x = attr ? attr_path(r, l.l->v[i], a->pos[0], line) : l.l->v[i];
		bool ok = test ? apply_test(r, test, x, &sub, line) : truthy(x);
		if (ok != reject)
			list_push(&r->c, out.l, l.l->v[i]);
	}
	return out;
}

static int sort_cmp_line;
static struct rctx *sort_r;
static bool sort_ci;
static struct val sort_attr;

static struct val sort_key(struct val v)
{
	if (sort_attr.t != V_UNDEF)
		v = attr_path(sort_r, v, sort_attr, sort_cmp_line);
	if (!sort_ci && v.t == V_STR)
		return v;
	if (v.t == V_STR)
		return case_map(sort_r, v, 0);
	return v;
}

static struct val apply_filter(struct rctx *r, const char *f, struct val v, struct args *a, int line)
{
	struct val a0 = a->n_pos > 0 ? a->pos[0] : UNDEF;
	if (!strcmp(f, "trim")) {
		if (v.t == V_UNDEF)
			return vstr("", 0);
		v = to_string(r, v);
		return strip(v, kwarg(a, "chars", 0, UNDEF), true, true);
	}
	if (!strcmp(f, "length") || !strcmp(f, "count"))
		return vint(length_of(r, v, line));
	if (!strcmp(f, "string"))
		return to_string(r, v);
	if (!strcmp(f, "safe") || !strcmp(f, "e") || !strcmp(f, "escape") || !strcmp(f, "forceescape")) {
		if (f[0] == 's')
			return v;
		/* autoescape is off in HF; |e still escapes */
		struct val s = to_string(r, v);
		struct sb o = { .c = &r->c };
		for (size_t i = 0; i < s.s.n; i++) {
			char ch = s.s.p[i];
			if (ch == '&') sb_puts(&o, "&amp;");
			else if (ch == '<') sb_puts(&o, "&lt;");
			else if (ch == '>') sb_puts(&o, "&gt;");
			else if (ch == '"') sb_puts(&o, "&#34;");
			else if (ch == '\'') sb_puts(&o, "&#39;");
			else sb_putc(&o, ch);
		}
		return vstr(o.p ? o.p : "", o.n);
	}
	if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize") || !strcmp(f, "title"))
		return case_map(r, to_string(r, v), f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 'c' ? 2 : 3);
	if (!strcmp(f, "default") || !strcmp(f, "d")) {
		struct val def = kwarg(a, "default_value", 0, vstr("", 0));
		bool boolean = truthy(kwarg(a, "boolean", 1, vbool(false)));
		if (v.t == V_UNDEF || (boolean && !truthy(v)))
			return def;
		return v;
	}
	if (!strcmp(f, "tojson")) {
		struct jopts o = { -1, ", ", ": ", false };
		struct val ind = kwarg(a, "indent", 0, NONE);
		if (ind.t == V_INT) {
			o.indent = (int)ind.i;
			o.item_sep = ",";
		}
		struct val seps = kwarg(a, "separators", 99, NONE);
		if (seps.t == V_LIST && seps.l->n == 2 && seps.l->v[0].t == V_STR && seps.l->v[1].t == V_STR) {
			o.item_sep = adup(&r->c, seps.l->v[0].s.p, seps.l->v[0].s.n);
			o.key_sep = adup(&r->c, seps.l->v[1].s.p, seps.l->v[1].s.n);
		}
		o.sort = truthy(kwarg(a, "sort_keys", 99, vbool(false)));
		struct sb b = { .c = &r->c };
		to_json(r, &b, v, &o, 0, line);
		return vstr(b.p ? b.p : "", b.n);
	}
	if (!strcmp(f, "items")) {
		if (v.t == V_UNDEF)
			return vlist(&r->c);
		if (v.t != V_DICT)
			rdie(r, line, LLM_ERR_USAGE, "items: expected a mapping, got %s", type_name(v));
		struct method m = { v, "items" };
		struct args none = { 0 };
		return call_method(r, &m, &none, line);
	}
	if (!strcmp(f, "first") || !strcmp(f, "last")) {
		struct val l = to_list(r, v, line);
		if (!l.l->n)
			return UNDEF;
		return f[0] == 'f' ? l.l->v[0] : l.l->v[l.l->n - 1];
	}
	if (!strcmp(f, "list"))
		return slice(r, to_list(r, v, line), UNDEF, UNDEF, UNDEF, line);
	if (!strcmp(f, "join")) {
		struct val l = to_list(r, v, line);
		struct val sep = kwarg(a, "d", 0, vstr("", 0));
		struct val at = kwarg(a, "attribute", 1, UNDEF);
		struct sb o = { .c = &r->c };
		for (size_t i = 0; i < l.l->n; i++) {
			if (i)
				put_str(&o, sep);
			put_str(&o, at.t != V_UNDEF ? attr_path(r, l.l->v[i], at, line) : l.l->v[i]);
		}
		return vstr(o.p ? o.p : "", o.n);
	}
	if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") || !strcmp(f, "rejectattr") ||
	    !strcmp(f, "map"))
		return filter_seq(r, f, v, a, line);
	if (!strcmp(f, "attr"))
		return get_attr(r, v, adup(&r->c, to_string(r, a0).s.p, to_string(r, a0).s.n), line);
	if (!strcmp(f, "replace")) {
		struct val s = to_string(r, v);
		need_str(r, a0, "replace", line);
		struct val b = a->n_pos > 1 ? to_string(r, a->pos[1]) : vstr("", 0);
		return replace_str(r, s, a0, b, a->n_pos > 2 && a->pos[2].t == V_INT ? a->pos[2].i : -1);
	}
	if (!strcmp(f, "int")) {
		struct val def = kwarg(a, "default", 0, vint(0));
		if (v.t == V_INT) return v;
		if (v.t == V_BOOL) return vint(v.b);
		if (v.t == V_FLOAT) return vint((int64_t)v.f);
		if (v.t == V_STR) {
			char *s = adup(&r->c, v.s.p, v.s.n), *end;
			long long x = strtoll(s, &end, 10);
			if (end != s && !*end)
				return vint(x);
			double d = strtod(s, &end);
			if (end != s && !*end)
				return vint((int64_t)d);
		}
		return def;
	}
	if (!strcmp(f, "float")) {
		struct val def = kwarg(a, "default", 0, vfloat(0));
		if (isnum(v)) return vfloat(num(v));
		if (v.t == V_STR) {
			char *s = adup(&r->c, v.s.p, v.s.n), *end;
			double d = strtod(s, &end);
			if (end != s && !*end)
				return vfloat(d);
		}
		return def;
	}
	if (!strcmp(f, "abs")) {
		if (v.t == V_INT) return vint(v.i < 0 ? -v.i : v.i);
		if (v.t == V_FLOAT) return vfloat(fabs(v.f));
		rdie(r, line, LLM_ERR_USAGE, "abs: bad operand %s", type_name(v));
	}
	if (!strcmp(f, "round")) {
		int64_t prec = kwarg(a, "precision", 0, vint(0)).i;
		struct val m = kwarg(a, "method", 1, vstr("common", 6));
		double x = num(v), p = pow(10, (double)prec);
		double y = m.t == V_STR && m.s.n == 4 && !memcmp(m.s.p, "ceil", 4) ? ceil(x * p) / p
		         : m.t == V_STR && m.s.n == 5 && !memcmp(m.s.p, "floor", 5) ? floor(x * p) / p : round(x * p) / p;
		return vfloat(y);
	}
	if (!strcmp(f, "reverse")) {
		if (v.t == V_STR)
			return slice(r, v, UNDEF, UNDEF, vint(-1), line);
		return slice(r, to_list(r, v, line), UNDEF, UNDEF, vint(-1), line);
	}
	if (!strcmp(f, "sort") || !strcmp(f, "dictsort")) {
		struct val l = !strcmp(f, "dictsort") ? apply_filter(r, "items", v, &(struct args){ 0 }, line)
		                                      : slice(r, to_list(r, v, line), UNDEF, UNDEF, UNDEF, line);
		bool rev = truthy(kwarg(a, "reverse", 0, vbool(false)));
		sort_ci = !truthy(kwarg(a, "case_sensitive", 1, vbool(false)));
		sort_attr = !strcmp(f, "dictsort") ? vint(truthy(kwarg(a, "by", 99, UNDEF)) ? 1 : 0)
		                                   : kwarg(a, "attribute", 2, UNDEF);
		sort_r = r;
		sort_cmp_line = line;
		for (size_t i = 1; i < l.l->n; i++)   /* stable insertion sort */
			for (size_t j = i; j > 0; j--) {
				int c = cmp_vals(r, sort_key(l.l->v[j - 1]), sort_key(l.l->v[j]), line);
				if (rev ? c >= 0 : c <= 0)
					break;
				struct val t = l.l->v[j];
				l.l->v[j] = l.l->v[j - 1];
				l.l->v[j - 1] = t;
			}
		return l;
	}
	if (!strcmp(f, "unique")) {
		struct val l = to_list(r, v, line), out = vlist(&r->c);
		for (size_t i = 0; i < l.l->n; i++)
			if (!contains(r, out, l.l->v[i], line))
				list_push(&r->c, out.l, l.l->v[i]);
		return out;
	}
	if (!strcmp(f, "min") || !strcmp(f, "max")) {
		struct val l = to_list(r, v, line);
		if (!l.l->n)
			return UNDEF;
		struct val best = l.l->v[0];
		for (size_t i = 1; i < l.l->n; i++) {
			int c = cmp_vals(r, l.l->v[i], best, line);
			if (f[1] == 'i' ? c < 0 : c > 0)
				best = l.l->v[i];
		}
		return best;
	}
	if (!strcmp(f, "sum")) {
		struct val l = to_list(r, v, line), acc = kwarg(a, "start", 1, vint(0));
		struct val at = kwarg(a, "attribute", 0, UNDEF);
		for (size_t i = 0; i < l.l->n; i++)
			acc = binop(r, "+", acc, at.t != V_UNDEF ? attr_path(r, l.l->v[i], at, line) : l.l->v[i], line);
		return acc;
	}
	if (!strcmp(f, "wordcount"))
		return vint((int64_t)split_str(r, to_string(r, v), UNDEF, -1).l->n);
	if (!strcmp(f, "indent")) {
		struct val w = kwarg(a, "width", 0, vint(4));
		bool first = truthy(kwarg(a, "first", 1, vbool(false)));
		bool blank = truthy(kwarg(a, "blank", 2, vbool(false)));
		struct sb pad = { .c = &r->c };
		if (w.t == V_STR)
			sb_put(&pad, w.s.p, w.s.n);
		else if (w.t != V_INT)
			rdie(r, line, LLM_ERR_USAGE, "indent(): width must be an integer or a string");
		else if (w.i > JINJA_MAX_STR)
			rdie(r, line, LLM_ERR_USAGE, "indent(): width %lld: more than %d MiB", (long long)w.i, JINJA_MAX_STR >> 20);
		else
			for (int64_t i = 0; i < w.i; i++)
				sb_putc(&pad, ' ');
		struct val s = to_string(r, v);
		struct sb o = { .c = &r->c };
		size_t i = 0;
		bool is_first = true;
		while (i <= s.s.n) {
			size_t j = i;
			while (j < s.s.n && s.s.p[j] != '\n')
				j++;
			bool empty = j == i;
			if ((is_first ? first : true) && (blank || !empty) && !(is_first && !first))
				sb_put(&o, pad.p ? pad.p : "", pad.n);
			sb_put(&o, s.s.p + i, j - i);
			if (j < s.s.n)
				sb_putc(&o, '\n');
			is_first = false;
			if (j >= s.s.n)
				break;
			i = j + 1;
		}
		return vstr(o.p ? o.p : "", o.n);
	}
	rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported filter '%s'", f);
}

static bool apply_test(struct rctx *r, const char *t, struct val v, struct args *a, int line)
{
	struct val a0 = a->n_pos > 0 ? a->pos[0] : UNDEF;
	if (!strcmp(t, "defined")) return v.t != V_UNDEF;
	if (!strcmp(t, "undefined")) return v.t == V_UNDEF;
	if (!strcmp(t, "none")) return v.t == V_NONE;
	if (!strcmp(t, "string")) return v.t == V_STR;
	if (!strcmp(t, "number")) return v.t == V_INT || v.t == V_FLOAT;
	if (!strcmp(t, "integer")) return v.t == V_INT;
	if (!strcmp(t, "float")) return v.t == V_FLOAT;
	if (!strcmp(t, "boolean")) return v.t == V_BOOL;
	if (!strcmp(t, "true")) return v.t == V_BOOL && v.b;
	if (!strcmp(t, "false")) return v.t == V_BOOL && !v.b;
	if (!strcmp(t, "mapping")) return v.t == V_DICT;
	if (!strcmp(t, "sequence")) return v.t == V_LIST || v.t == V_STR || v.t == V_DICT;
	if (!strcmp(t, "iterable")) return v.t == V_LIST || v.t == V_STR || v.t == V_DICT;
	if (!strcmp(t, "callable")) return v.t == V_FUNC || v.t == V_METHOD;
	if (!strcmp(t, "escaped")) return false;
	if (!strcmp(t, "odd") || !strcmp(t, "even")) {
		if (v.t != V_INT)
			rdie(r, line, LLM_ERR_USAGE, "test %s: expected an integer", t);
		return (v.i % 2 != 0) == (t[0] == 'o');
	}
	if (!strcmp(t, "divisibleby")) {
		if (v.t != V_INT || a0.t != V_INT || !a0.i)
			rdie(r, line, LLM_ERR_USAGE, "test divisibleby: expected integers");
		return v.i % a0.i == 0;
	}
	if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
		if (v.t != V_STR)
			return false;
		struct val m = case_map(r, v, t[0] == 'l' ? 0 : 1);
		return val_eq(m, v);
	}
	if (!strcmp(t, "in")) return contains(r, a0, v, line);
	if (!strcmp(t, "sameas")) return v.t == a0.t && (v.t == V_NONE || v.t == V_UNDEF || (v.t == V_BOOL && v.b == a0.b) ||
	                                                 (v.t == V_LIST && v.l == a0.l) || (v.t == V_DICT && v.d == a0.d));
	const char *op = !strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==") ? "=="
	               : !strcmp(t, "ne") || !strcmp(t, "!=") ? "!="
	               : !strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<") ? "<"
	               : !strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">") ? ">"
	               : !strcmp(t, "le") || !strcmp(t, "<=") ? "<=" : !strcmp(t, "ge") || !strcmp(t, ">=") ? ">=" : NULL;
	if (op)
		return truthy(binop(r, op, v, a0, line));
	rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported test '%s'", t);
}

static struct args eval_args(struct rctx *r, struct node *n, struct val *first)
{
	struct args a = { 0 };
	size_t np = n->n_kid - n->n_kw + (first ? 1 : 0);
	a.pos = aalloc(&r->c, (np + 1) * sizeof *a.pos);
	if (first)
		a.pos[a.n_pos++] = *first;
	for (size_t i = 0; i < n->n_kid - n->n_kw; i++)
		a.pos[a.n_pos++] = eval(r, n->kid[i]);
	a.kw = n->kw;
	a.n_kw = n->n_kw;
	a.kwv = aalloc(&r->c, (n->n_kw + 1) * sizeof *a.kwv);
	for (size_t i = 0; i < n->n_kw; i++)
		a.kwv[i] = eval(r, n->kid[n->n_kid - n->n_kw + i]);
	return a;
}

static struct val eval(struct rctx *r, struct node *n)
{
	switch (n->k) {
	case N_LIT: return n->v;
	case N_NAME: return lookup(r, n->name);
	case N_ATTR: return get_attr(r, eval(r, n->a), n->name, n->line);
	case N_ITEM: return get_item(r, eval(r, n->a), eval(r, n->b), n->line);
	case N_SLICE: {
		struct val o = eval(r, n->a);
		return slice(r, o, n->b ? eval(r, n->b) : UNDEF, n->c ? eval(r, n->c) : UNDEF, n->d ? eval(r, n->d) : UNDEF,
		             n->line);
	}
	case N_CALL: {
		struct val fn = eval(r, n->a);
		if (fn.t == V_UNDEF)
			rdie(r, n->line, LLM_ERR_USAGE, "'%s' is undefined",
			     n->a->k == N_NAME || n->a->k == N_ATTR ? n->a->name : "callee");
		struct args a = eval_args(r, n, NULL);
		return call_value(r, fn, &a, n->line);
	}
	case N_FILTER: {
		struct val v = eval(r, n->a);
		struct args a = eval_args(r, n, NULL);
		return apply_filter(r, n->name, v, &a, n->line);
	}
	case N_TEST: {
		struct val v = eval(r, n->a);
		struct args a = eval_args(r, n, NULL);
		return vbool(apply_test(r, n->name, v, &a, n->line) != n->neg);
	}
	case N_BIN: return binop(r, n->name, eval(r, n->a), eval(r, n->b), n->line);
	case N_NOT: return vbool(!truthy(eval(r, n->a)));
	case N_NEG: case N_POS: {
		struct val v = eval(r, n->a);
		if (v.t == V_INT) {
			if (n->k == N_NEG && v.i == INT64_MIN)
				int_overflow(r, "-", n->line);
			return vint(n->k == N_NEG ? -v.i : v.i);
		}
		if (v.t == V_FLOAT) return vfloat(n->k == N_NEG ? -v.f : v.f);
		rdie(r, n->line, LLM_ERR_USAGE, "bad operand type for unary %c: '%s'", n->k == N_NEG ? '-' : '+',
		     type_name(v));
	}
	case N_AND: {
		struct val a = eval(r, n->a);
		return truthy(a) ? eval(r, n->b) : a;
	}
	case N_OR: {
		struct val a = eval(r, n->a);
		return truthy(a) ? a : eval(r, n->b);
	}
	case N_COND:
		if (truthy(eval(r, n->a)))
			return eval(r, n->b);
		return n->c ? eval(r, n->c) : UNDEF;
	case N_LIST: case N_TUPLE: {
		struct val l = vlist(&r->c);
		for (size_t i = 0; i < n->n_kid; i++)
			list_push(&r->c, l.l, eval(r, n->kid[i]));
		return l;
	}
	case N_DICT: {
		struct val d = vdict(&r->c);
		for (size_t i = 0; i + 1 < n->n_kid; i += 2)
			dict_set(&r->c, d.d, eval(r, n->kid[i]), eval(r, n->kid[i + 1]));
		return d;
	}
	default: rdie(r, n->line, LLM_ERR_INTERNAL, "bad expression node %d", n->k);
	}
}

static void assign_targets(struct rctx *r, struct node *n, struct val v)
{
	if (n->n_names == 1) {
		assign(r, n->names[0], v);
		return;
	}
	struct val l = to_list(r, v, n->line);
	if (l.l->n != n->n_names)
		rdie(r, n->line, LLM_ERR_USAGE, "cannot unpack %zu values into %zu names", l.l->n, n->n_names);
	for (size_t i = 0; i < n->n_names; i++)
		assign(r, n->names[i], l.l->v[i]);
}

static void exec_for(struct rctx *r, struct node *n, struct sb *out)
{
	struct val seq = eval(r, n->b);
	struct val l = to_list(r, seq, n->line);
	struct scope sc = { .up = r->sc };
	r->sc = &sc;
	if (n->filter) {   /* "for x in xs if cond": filter first, loop.* counts the kept items */
		struct val kept = vlist(&r->c);
		for (size_t i = 0; i < l.l->n; i++) {
			assign_targets(r, n, l.l->v[i]);
			if (truthy(eval(r, n->filter)))
				list_push(&r->c, kept.l, l.l->v[i]);
		}
		l = kept;
	}
	size_t len = l.l->n;
	for (size_t i = 0; i < len; i++) {
		sc.vars.n = 0;   /* a fresh scope per iteration */
		struct val loop = vdict(&r->c);
		dict_sets(&r->c, loop.d, "index0", vint((int64_t)i));
		dict_sets(&r->c, loop.d, "index", vint((int64_t)i + 1));
		dict_sets(&r->c, loop.d, "revindex", vint((int64_t)(len - i)));
		dict_sets(&r->c, loop.d, "revindex0", vint((int64_t)(len - i - 1)));
		dict_sets(&r->c, loop.d, "first", vbool(i == 0));
		dict_sets(&r->c, loop.d, "last", vbool(i + 1 == len));
		dict_sets(&r->c, loop.d, "length", vint((int64_t)len));
		dict_sets(&r->c, loop.d, "depth", vint(1));
		dict_sets(&r->c, loop.d, "depth0", vint(0));
		dict_sets(&r->c, loop.d, "previtem", i ? l.l->v[i - 1] : UNDEF);
		dict_sets(&r->c, loop.d, "nextitem", i + 1 < len ? l.l->v[i + 1] : UNDEF);
		struct val cyc = mkfunc(r, "cycle", bi_cycle);
		cyc.fn->data = vint((int64_t)i);
		dict_sets(&r->c, loop.d, "cycle", cyc);
		assign(r, "loop", loop);
		assign_targets(r, n, l.l->v[i]);
		exec_body(r, n->c, out);
		if (r->loop_ctl == 1) {
			r->loop_ctl = 0;
			break;
		}
		r->loop_ctl = 0;
	}
	r->sc = sc.up;
	if (!len && n->d)
		exec_body(r, n->d, out);
}

static void exec_body(struct rctx *r, struct node *body, struct sb *out)
{
	for (size_t i = 0; i < body->n_kid && !r->loop_ctl; i++) {
		struct node *n = body->kid[i];
		switch (n->k) {
		case N_TEXT: sb_put(out, n->v.s.p, n->v.s.n); break;
		case N_OUT: put_str(out, eval(r, n->a)); break;
		case N_IF:
			if (truthy(eval(r, n->a)))
				exec_body(r, n->b, out);
			else if (n->c)
				exec_body(r, n->c, out);
			break;
		case N_FOR: exec_for(r, n, out); break;
		case N_SET:
			if (n->neg) {
				struct val ns = lookup(r, n->name);
				if (ns.t != V_DICT || !ns.d->ns)
					rdie(r, n->line, LLM_ERR_USAGE, "cannot assign attribute on non-namespace object '%s'", n->name);
				dict_sets(&r->c, ns.d, n->names[0], eval(r, n->a));
			} else {
				assign_targets(r, n, eval(r, n->a));
			}
			break;
		case N_SETBLOCK: {
			struct sb b = { .c = &r->c };
			exec_body(r, n->a, &b);
			assign(r, n->names[0], vstr(b.p ? b.p : "", b.n));
			break;
		}
		case N_MACRO: {
			struct val f = { .t = V_FUNC };
			f.fn = aalloc(&r->c, sizeof *f.fn);
			f.fn->name = n->name;
			f.fn->macro = n;
			assign(r, n->name, f);
			break;
		}
		case N_BREAK: r->loop_ctl = 1; break;
		case N_CONTINUE: r->loop_ctl = 2; break;
		case N_BODY: exec_body(r, n, out); break;
		default: rdie(r, n->line, LLM_ERR_INTERNAL, "bad statement node %d", n->k);
		}
	}
}

static struct val from_json(struct rctx *r, const json_t *j)
{
	switch (json_typeof(j)) {
	case JSON_OBJECT: {
		struct val d = vdict(&r->c);
		const char *k;
		json_t *v;
		json_object_foreach((json_t *)j, k, v)
			dict_set(&r->c, d.d, vstr(adup(&r->c, k, strlen(k)), strlen(k)), from_json(r, v));
		return d;
	}
	case JSON_ARRAY: {
		struct val l = vlist(&r->c);
		for (size_t i = 0; i < json_array_size(j); i++)
			list_push(&r->c, l.l, from_json(r, json_array_get(j, i)));
		return l;
	}
	case JSON_STRING: return vstr(adup(&r->c, json_string_value(j), json_string_length(j)), json_string_length(j));
	case JSON_INTEGER: return vint(json_integer_value(j));
	case JSON_REAL: return vfloat(json_real_value(j));
	case JSON_TRUE: return vbool(true);
	case JSON_FALSE: return vbool(false);
	default: return NONE;
	}
}

enum llm_status llm_jinja_render(const struct llm_jinja *t, const struct json_t *vars, char **out, size_t *len)
{
	*out = NULL;
	*len = 0;
	struct arena ar = { 0 };
	struct rctx *r = calloc(1, sizeof *r);
	if (!r)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	struct sb o = { .heap = true };
	r->c.ar = &ar;
	o.c = &r->c;
	struct scope top = { 0 };
	if (setjmp(r->c.jb)) {
		enum llm_status st = r->c.st;
		free(o.p);
		arena_free(&ar);
		free(r);
		return st;
	}
	struct val g = vdict(&r->c);
	r->globals = g.d;
	dict_sets(&r->c, r->globals, "raise_exception", mkfunc(r, "raise_exception", bi_raise));
	dict_sets(&r->c, r->globals, "namespace", mkfunc(r, "namespace", bi_namespace));
	dict_sets(&r->c, r->globals, "dict", mkfunc(r, "dict", bi_dict));
	dict_sets(&r->c, r->globals, "range", mkfunc(r, "range", bi_range));
	dict_sets(&r->c, r->globals, "strftime_now", mkfunc(r, "strftime_now", bi_strftime));
	r->sc = &top;
	if (vars) {
		if (!json_is_object(vars))
			rdie(r, 0, LLM_ERR_USAGE, "variables are not a JSON object");
		struct val v = from_json(r, vars);
		for (size_t i = 0; i < v.d->n; i++)
			dict_set(&r->c, &top.vars, v.d->k[i], v.d->v[i]);
	}
	exec_body(r, t->root, &o);
	if (!o.p)
		sb_put(&o, "", 0);
	*out = o.p;
	*len = o.n;
	arena_free(&ar);
	free(r);
	return LLM_OK;
}

/* ---------------------------------------------------------------- chat */

enum llm_status llm_chat_render(const struct llm_tokenizer *tk, const char *template_src,
                                const char *request, char **out, size_t *len)
{
	*out = NULL;
	*len = 0;
	const char *src = template_src ? template_src : tk ? llm_tokenizer_chat_template(tk) : NULL;
	if (!src)
		return llm_fail(LLM_ERR_USAGE, "the tokenizer has no chat_template (give one with --chat-template FILE)");
	json_error_t e;
	json_t *req = json_loads(request, JSON_ALLOW_NUL, &e);
	if (!req)
		return llm_fail(LLM_ERR_USAGE, "request: line %d: %s", e.line, e.text);
	enum llm_status st = LLM_OK;
	json_t *vars = json_object(), *cfg = NULL;
	struct llm_jinja *t = NULL;
	if (!json_is_object(req)) {
		st = llm_fail(LLM_ERR_USAGE, "request: not a JSON object");
		goto out;
	}
	json_t *msgs = json_object_get(req, "messages");
	if (!json_is_array(msgs)) {
		st = llm_fail(LLM_ERR_USAGE, "request: \"messages\" is not a list");
		goto out;
	}
	for (size_t i = 0; i < json_array_size(msgs); i++)
		if (!json_is_object(json_array_get(msgs, i))) {
			st = llm_fail(LLM_ERR_USAGE, "request: messages[%zu] is not an object", i);
			goto out;
		}
	/* Special tokens of the config, as transformers' special_tokens_map. */
	if (tk && (cfg = json_loads(llm_tokenizer_config_json(tk), JSON_DECODE_INT_AS_REAL, &e))) {
		static const char *names[] = { "bos_token", "eos_token", "unk_token", "sep_token", "pad_token",
		                               "cls_token", "mask_token" };
		for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
			json_t *v = json_object_get(cfg, names[i]);
			const char *s = json_is_string(v) ? json_string_value(v) : json_string_value(json_object_get(v, "content"));
			if (s)
				json_object_set_new(vars, names[i], json_string(s));
		}
		json_t *add = json_object_get(cfg, "additional_special_tokens");
		if (json_is_array(add)) {
			json_t *l = json_array();
			for (size_t i = 0; i < json_array_size(add); i++) {
				json_t *v = json_array_get(add, i);
				const char *s = json_is_string(v) ? json_string_value(v) : json_string_value(json_object_get(v, "content"));
				if (s)
					json_array_append_new(l, json_string(s));
			}
			json_object_set_new(vars, "additional_special_tokens", l);
		}
	}
	json_object_set(vars, "messages", msgs);
	json_t *tools = json_object_get(req, "tools");
	json_object_set_new(vars, "tools", tools ? json_incref(tools) : json_null());
	json_t *docs = json_object_get(req, "documents");
	json_object_set_new(vars, "documents", docs ? json_incref(docs) : json_null());
	json_t *agp = json_object_get(req, "add_generation_prompt");
	json_object_set_new(vars, "add_generation_prompt", json_boolean(json_is_true(agp)));
	const char *k;
	json_t *v;
	json_object_foreach(req, k, v) {
		if (!strcmp(k, "messages") || !strcmp(k, "tools") || !strcmp(k, "documents") ||
		    !strcmp(k, "add_generation_prompt") || !strcmp(k, "template_kwargs") || !strcmp(k, "chat_template_kwargs"))
			continue;
		json_object_set(vars, k, v);
	}
	for (int i = 0; i < 2; i++) {
		json_t *kw = json_object_get(req, i ? "chat_template_kwargs" : "template_kwargs");
		if (kw && !json_is_object(kw) && !json_is_null(kw)) {
			st = llm_fail(LLM_ERR_USAGE, "request: \"%s\" is not an object", i ? "chat_template_kwargs" : "template_kwargs");
			goto out;
		}
		json_object_foreach(kw, k, v)
			json_object_set(vars, k, v);
	}
	if ((st = llm_jinja_parse(&t, src, strlen(src))))
		goto out;
	st = llm_jinja_render(t, vars, out, len);
out:
	llm_jinja_free(t);
	json_decref(cfg);
	json_decref(vars);
	json_decref(req);
	return st;
}
