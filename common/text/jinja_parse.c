/* common/text/jinja_parse.c: the chat-template lexer (text, {{ }}, {% %} and
 * {# #} chunks with whitespace control, then expression tokens) and the
 * recursive-descent parser to the AST of jinja_impl.h, plus
 * llm_jinja_parse/llm_jinja_free. Guarantees: a construct Jinja2 would
 * reject, or one this interpreter does not cover (extends, include, an
 * unknown filter or test, ...), fails here at parse time naming its line,
 * never at render time. Reference: Jinja2 3.1's lexer and parser. */
#define _GNU_SOURCE
#include "jinja_impl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "banned.h"

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
		struct chunkt *c = jinja_aalloc(&P->c, cap * sizeof *c);
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
			jinja_die(&P->c, LLM_ERR_FORMAT, line, "unclosed '{%c'", kind);
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
						jinja_die(&P->c, LLM_ERR_FORMAT, line, "{%% raw %%} without {%% endraw %%}");
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
						jinja_die(&P->c, LLM_ERR_FORMAT, line, "unclosed {%% endraw");
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
		struct tok *n = jinja_aalloc(&P->c, cap * sizeof *n);
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
				jinja_die(&P->c, LLM_ERR_UNSUPPORTED, line, "number literal of more than %d digits", (int)sizeof num - 1);
			num[k] = 0;
			if (fl) {
				t.t = T_FLOAT;
				t.f = strtod(num, NULL);
			} else {
				t.t = T_INT;
				errno = 0;
				t.i = strtoll(num, NULL, 10);
				if (errno == ERANGE)
					jinja_die(&P->c, LLM_ERR_UNSUPPORTED, line, "integer literal %s is past 64 bits", num);
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
					case 'n': jinja_sb_putc(&b, '\n'); break;
					case 't': jinja_sb_putc(&b, '\t'); break;
					case 'r': jinja_sb_putc(&b, '\r'); break;
					case '0': jinja_sb_putc(&b, '\0'); break;
					case '\\': jinja_sb_putc(&b, '\\'); break;
					case '\'': jinja_sb_putc(&b, '\''); break;
					case '"': jinja_sb_putc(&b, '"'); break;
					case 'u': case 'x': {
						int nd = *q == 'u' ? 4 : 2;
						if (q + nd >= e)
							jinja_die(&P->c, LLM_ERR_FORMAT, line, "bad \\%c escape", *q);
						char hex[5] = { 0 };
						memcpy(hex, q + 1, (size_t)nd);
						utf8proc_uint8_t u[4];
						utf8proc_ssize_t k = utf8proc_encode_char((utf8proc_int32_t)strtol(hex, NULL, 16), u);
						jinja_sb_put(&b, (const char *)u, (size_t)k);
						q += nd;
						break;
					}
					default: jinja_sb_putc(&b, '\\'); jinja_sb_putc(&b, *q); break;
					}
				} else {
					if (*q == '\n')
						line++;
					jinja_sb_putc(&b, *q);
				}
			}
			if (q >= e)
				jinja_die(&P->c, LLM_ERR_FORMAT, line, "unterminated string");
			t.t = T_STR;
			t.s = b.p ? b.p : jinja_adup(&P->c, "", 0);
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
				jinja_die(&P->c, LLM_ERR_FORMAT, line, "unexpected character '%c'", *s);
			s += t.n;
		}
		push_tok(P, t);
	}
	push_tok(P, (struct tok){ .t = T_EOF, .p = e, .line = line });
}

/* ---------------------------------------------------------------- AST */

static struct node *mk(struct parser *P, enum nk k)
{
	struct node *n = jinja_aalloc(&P->c, sizeof *n);
	n->k = k;
	n->line = P->line;
	return n;
}

static void kid_push(struct parser *P, struct node *n, struct node *k)
{
	struct node **v = jinja_aalloc(&P->c, (n->n_kid + 1) * sizeof *v);
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
		jinja_die(&P->c, LLM_ERR_FORMAT, t->line, "expected %s at end of tag", what);
	jinja_die(&P->c, LLM_ERR_FORMAT, t->line, "expected %s, got '%.*s'", what, (int)(t->n > 40 ? 40 : t->n), t->p);
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
	return jinja_adup(&P->c, t->p, t->n);
}

static struct node *parse_expr(struct parser *P);
static struct node *parse_or(struct parser *P);

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
	n->kw = jinja_aalloc(&P->c, (nk + 1) * sizeof *n->kw);
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
		jinja_sb_put(&b, t->s, t->sn);
		while (peek(P)->t == T_STR) {   /* adjacent literals concatenate */
			struct tok *u = next(P);
			jinja_sb_put(&b, u->s, u->sn);
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
		n->name = jinja_adup(&P->c, t->p, t->n);
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
				a->name = jinja_adup(&P->c, t->p, t->n);
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
		if (!jinja_in_list(jinja_filter_names, f->name))
			jinja_die(&P->c, LLM_ERR_UNSUPPORTED, P->line, "unsupported filter '%s'", f->name);
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
			t->name = jinja_adup(&P->c, nt->p, nt->n);
		else if (nt->t == T_OP && (is_op(nt, "==") || is_op(nt, "!=") || is_op(nt, "<") || is_op(nt, ">") ||
		                           is_op(nt, "<=") || is_op(nt, ">=")))
			t->name = jinja_adup(&P->c, nt->p, nt->n);
		else {
			unread(P, nt);
			syntax(P, "a test name");
		}
		if (!jinja_in_list(jinja_test_names, t->name))
			jinja_die(&P->c, LLM_ERR_UNSUPPORTED, P->line, "unsupported test '%s'", t->name);
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
	n->names = jinja_aalloc(&P->c, k * sizeof *n->names);
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
			jinja_die(&P->c, LLM_ERR_UNSUPPORTED, line, "unsupported: recursive for loops");
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
			n->names = jinja_aalloc(&P->c, sizeof *n->names);
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
			jinja_die(&P->c, LLM_ERR_UNSUPPORTED, line, "unsupported: filtered {%% set %%} block");
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
		n->names = jinja_aalloc(&P->c, (k + 1) * sizeof *n->names);
		n->defaults = jinja_aalloc(&P->c, (k + 1) * sizeof *n->defaults);
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
		jinja_die(&P->c, LLM_ERR_UNSUPPORTED, line, "unsupported tag 'with'");
	}
	if (!w[0])
		jinja_die(&P->c, LLM_ERR_FORMAT, line, "empty or malformed {%% %%} tag");
	jinja_die(&P->c, LLM_ERR_UNSUPPORTED, line, "unsupported tag '%s'", w);
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
				jinja_die(&P->c, LLM_ERR_FORMAT, c->line, "unexpected '%s'", w);
			kid_push(P, body, parse_stmt(P, i));
		}
	}
	if (stops)
		jinja_die(&P->c, LLM_ERR_FORMAT, start_line, "missing '{%% %s %%}'", stops[0][0] == 'e' && stops[1] ? stops[1] : stops[0]);
	*stopped = "";
	return body;
}

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
		jinja_arena_free(&t->ar);
		free(t->src);
		free(t);
		free(P);
		return st;
	}
	t->src = malloc(len + 1);
	if (!t->src)
		jinja_die(&P->c, LLM_ERR_NOMEM, 0, "out of memory");
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
	jinja_arena_free(&t->ar);
	free(t->src);
	free(t);
}
