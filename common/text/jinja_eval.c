/* common/text/jinja_eval.c: the chat-template evaluator: scopes, operators
 * (Python semantics: 64-bit ints that refuse to overflow, float % and //
 * as CPython's), attribute and item access, slicing, macro and global
 * function calls (raise_exception, namespace, dict, range, strftime_now,
 * loop.cycle), the statements, and llm_jinja_render. A render is
 * deterministic for given variables except strftime_now. Filters, tests
 * and methods are in jinja_filters.c. */
#define _GNU_SOURCE
#include "jinja_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "banned.h"

/* ---------------------------------------------------------------- evaluation */

_Noreturn void jinja_rdie(struct rctx *r, int line, enum llm_status st, const char *fmt, ...)
{
	char msg[700];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	jinja_die(&r->c, st, line, "%s", msg);
}

static struct val lookup(struct rctx *r, const char *name)
{
	for (struct scope *s = r->sc; s; s = s->up) {
		struct val *v = jinja_dict_finds(&s->vars, name);
		if (v)
			return *v;
	}
	struct val *g = jinja_dict_finds(r->globals, name);
	return g ? *g : UNDEF;
}

static void assign(struct rctx *r, const char *name, struct val v)
{
	jinja_dict_sets(&r->c, &r->sc->vars, name, v);
}

static struct val eval(struct rctx *r, struct node *n);
static void exec_body(struct rctx *r, struct node *body, struct sb *out);

size_t jinja_u8count(const char *s, size_t n)
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

int64_t jinja_length_of(struct rctx *r, struct val v, int line)
{
	switch (v.t) {
	case V_STR: return (int64_t)jinja_u8count(v.s.p, v.s.n);
	case V_LIST: return (int64_t)v.l->n;
	case V_DICT: return (int64_t)v.d->n;
	case V_UNDEF: return 0;
	default: jinja_rdie(r, line, LLM_ERR_USAGE, "object of type '%s' has no len()", jinja_type_name(v));
	}
}

/* Iterate: lists, dict keys, string characters; undefined is empty. */
struct val jinja_to_list(struct rctx *r, struct val v, int line)
{
	struct val l = jinja_vlist(&r->c);
	switch (v.t) {
	case V_LIST: return v;
	case V_DICT:
		for (size_t i = 0; i < v.d->n; i++)
			jinja_list_push(&r->c, l.l, v.d->k[i]);
		return l;
	case V_STR:
		for (size_t i = 0; i < v.s.n;) {
			size_t k = 1;
			while (i + k < v.s.n && ((unsigned char)v.s.p[i + k] & 0xC0) == 0x80)
				k++;
			jinja_list_push(&r->c, l.l, vstr(v.s.p + i, k));
			i += k;
		}
		return l;
	case V_UNDEF: case V_NONE:
		if (v.t == V_NONE)
			jinja_rdie(r, line, LLM_ERR_USAGE, "'NoneType' object is not iterable");
		return l;
	default: jinja_rdie(r, line, LLM_ERR_USAGE, "'%s' object is not iterable", jinja_type_name(v));
	}
}

struct val jinja_to_string(struct rctx *r, struct val v)
{
	if (v.t == V_STR)
		return v;
	struct sb b = { .c = &r->c };
	jinja_put_str(&b, v);
	return vstr(b.p ? b.p : "", b.n);
}

int jinja_cmp_vals(struct rctx *r, struct val a, struct val b, int line)
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
			int c = jinja_cmp_vals(r, a.l->v[i], b.l->v[i], line);
			if (c)
				return c;
		}
		return a.l->n < b.l->n ? -1 : a.l->n > b.l->n;
	}
	jinja_rdie(r, line, LLM_ERR_USAGE, "'<' not supported between '%s' and '%s'", jinja_type_name(a), jinja_type_name(b));
}

bool jinja_contains(struct rctx *r, struct val hay, struct val x, int line)
{
	switch (hay.t) {
	case V_STR:
		if (x.t != V_STR)
			jinja_rdie(r, line, LLM_ERR_USAGE, "'in <string>' requires string as left operand, not %s", jinja_type_name(x));
		return x.s.n == 0 || memmem(hay.s.p, hay.s.n, x.s.p, x.s.n) != NULL;
	case V_LIST:
		for (size_t i = 0; i < hay.l->n; i++)
			if (jinja_val_eq(hay.l->v[i], x))
				return true;
		return false;
	case V_DICT: return jinja_dict_find(hay.d, x) != NULL;
	case V_UNDEF: return false;
	default: jinja_rdie(r, line, LLM_ERR_USAGE, "argument of type '%s' is not iterable", jinja_type_name(hay));
	}
}

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
	jinja_rdie(r, line, LLM_ERR_USAGE, "integer overflow in '%s' (integers are 64-bit here)", op);
}

struct val jinja_binop(struct rctx *r, const char *op, struct val a, struct val b, int line)
{
	if (!strcmp(op, "~")) {
		struct sb s = { .c = &r->c };
		jinja_put_str(&s, a);
		jinja_put_str(&s, b);
		return vstr(s.p ? s.p : "", s.n);
	}
	if (!strcmp(op, "==")) return vbool(jinja_val_eq(a, b));
	if (!strcmp(op, "!=")) return vbool(!jinja_val_eq(a, b));
	if (!strcmp(op, "<")) return vbool(jinja_cmp_vals(r, a, b, line) < 0);
	if (!strcmp(op, ">")) return vbool(jinja_cmp_vals(r, a, b, line) > 0);
	if (!strcmp(op, "<=")) return vbool(jinja_cmp_vals(r, a, b, line) <= 0);
	if (!strcmp(op, ">=")) return vbool(jinja_cmp_vals(r, a, b, line) >= 0);
	if (!strcmp(op, "in")) return vbool(jinja_contains(r, b, a, line));
	if (!strcmp(op, "not in")) return vbool(!jinja_contains(r, b, a, line));
	if (!strcmp(op, "+")) {
		if (a.t == V_STR && b.t == V_STR) {
			char *p = jinja_aalloc(&r->c, a.s.n + b.s.n + 1);
			memcpy(p, a.s.p, a.s.n);
			memcpy(p + a.s.n, b.s.p, b.s.n);
			return vstr(p, a.s.n + b.s.n);
		}
		if (a.t == V_LIST && b.t == V_LIST) {
			struct val l = jinja_vlist(&r->c);
			for (size_t i = 0; i < a.l->n; i++)
				jinja_list_push(&r->c, l.l, a.l->v[i]);
			for (size_t i = 0; i < b.l->n; i++)
				jinja_list_push(&r->c, l.l, b.l->v[i]);
			return l;
		}
	}
	if (op[0] == '*' && !op[1] && ((a.t == V_STR && b.t == V_INT) || (a.t == V_INT && b.t == V_STR))) {
		struct val s = a.t == V_STR ? a : b;
		int64_t k = a.t == V_INT ? a.i : b.i;
		if (k > 0 && s.s.n > 0 && (uint64_t)k > JINJA_MAX_STR / s.s.n)
			jinja_rdie(r, line, LLM_ERR_USAGE, "string repeated %lld times: more than %d MiB", (long long)k,
			     JINJA_MAX_STR >> 20);
		struct sb o = { .c = &r->c };
		for (int64_t i = 0; i < k; i++)
			jinja_sb_put(&o, s.s.p, s.s.n);
		return vstr(o.p ? o.p : "", o.n);
	}
	if (!isnum(a) || !isnum(b))
		jinja_rdie(r, line, LLM_ERR_USAGE, "unsupported operand types for %s: '%s' and '%s'", op, jinja_type_name(a), jinja_type_name(b));
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
			jinja_rdie(r, line, LLM_ERR_USAGE, "division by zero");
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
			jinja_rdie(r, line, LLM_ERR_USAGE, "modulo by zero");
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
	jinja_rdie(r, line, LLM_ERR_INTERNAL, "operator %s", op);
}

/* obj.name: dict methods first (Jinja's getattr), then keys. */
struct val jinja_get_attr(struct rctx *r, struct val obj, const char *name, int line)
{
	static const char *dict_m[] = { "items", "keys", "values", "get", "copy", "update", "pop", "setdefault", NULL };
	static const char *str_m[] = { "startswith", "endswith", "strip", "lstrip", "rstrip", "split", "rsplit", "replace",
	                               "upper", "lower", "title", "capitalize", "find", "rfind", "count", "join",
	                               "splitlines", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper",
	                               "format", "index", NULL };
	static const char *list_m[] = { "append", "extend", "pop", "insert", "remove", "index", "count", "copy", NULL };
	if (obj.t == V_UNDEF)
		jinja_rdie(r, line, LLM_ERR_USAGE, "'%s' is undefined", name);   /* jinja2.UndefinedError */
	const char **ml = obj.t == V_DICT && !obj.d->ns ? dict_m : obj.t == V_STR ? str_m : obj.t == V_LIST ? list_m : NULL;
	if (ml && jinja_in_list(ml, name)) {
		struct val m = { .t = V_METHOD };
		m.m = jinja_aalloc(&r->c, sizeof *m.m);
		m.m->self = obj;
		m.m->name = name;
		return m;
	}
	if (obj.t == V_DICT) {
		struct val *v = jinja_dict_finds(obj.d, name);
		return v ? *v : UNDEF;
	}
	return UNDEF;
}

static int64_t norm_index(int64_t i, int64_t n) { return i < 0 ? i + n : i; }

struct val jinja_get_item(struct rctx *r, struct val obj, struct val key, int line)
{
	if (obj.t == V_UNDEF)
		jinja_rdie(r, line, LLM_ERR_USAGE, "cannot index an undefined value");
	if (obj.t == V_DICT) {
		struct val *v = jinja_dict_find(obj.d, key);
		if (v)
			return *v;
		if (key.t == V_STR) {
			char *k = jinja_adup(&r->c, key.s.p, key.s.n);
			if (!obj.d->ns)
				return jinja_get_attr(r, obj, k, line);
		}
		return UNDEF;
	}
	if (obj.t == V_LIST || obj.t == V_STR) {
		if (key.t != V_INT && key.t != V_BOOL) {
			if (key.t == V_STR)
				return jinja_get_attr(r, obj, jinja_adup(&r->c, key.s.p, key.s.n), line);
			jinja_rdie(r, line, LLM_ERR_USAGE, "indices must be integers, not %s", jinja_type_name(key));
		}
		int64_t n = jinja_length_of(r, obj, line), i = norm_index(key.t == V_INT ? key.i : key.b, n);
		if (i < 0 || i >= n)
			return UNDEF;   /* jinja2: undefined, not an exception */
		if (obj.t == V_LIST)
			return obj.l->v[i];
		size_t a = u8off(obj.s.p, obj.s.n, (size_t)i), b = u8off(obj.s.p, obj.s.n, (size_t)i + 1);
		return vstr(obj.s.p + a, b - a);
	}
	return UNDEF;
}

struct val jinja_slice(struct rctx *r, struct val obj, struct val lo, struct val hi, struct val step, int line)
{
	if (obj.t != V_LIST && obj.t != V_STR)
		jinja_rdie(r, line, LLM_ERR_USAGE, "'%s' object is not subscriptable", jinja_type_name(obj));
	int64_t n = jinja_length_of(r, obj, line);
	int64_t st = step.t == V_INT ? step.i : 1;
	if (st == 0)
		jinja_rdie(r, line, LLM_ERR_USAGE, "slice step cannot be zero");
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
	struct val out = obj.t == V_LIST ? jinja_vlist(&r->c) : UNDEF;
	struct sb sb = { .c = &r->c };
	for (int64_t i = a; st > 0 ? i < b : i > b; i += st) {
		if (obj.t == V_LIST) {
			jinja_list_push(&r->c, out.l, obj.l->v[i]);
		} else {
			size_t x = u8off(obj.s.p, obj.s.n, (size_t)i), y = u8off(obj.s.p, obj.s.n, (size_t)i + 1);
			jinja_sb_put(&sb, obj.s.p + x, y - x);
		}
	}
	if (obj.t == V_STR)
		return vstr(sb.p ? sb.p : "", sb.n);
	return out;
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
		jinja_rdie(r, line, LLM_ERR_USAGE, "macro '%s' takes %zu arguments, got %zu", m->name, m->n_names, a->n_pos);
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
			jinja_rdie(r, line, LLM_ERR_USAGE, "macro '%s' has no argument '%s'", m->name, a->kw[k]);
	}
	struct sb out = { .c = &r->c };
	exec_body(r, m->a, &out);
	r->sc = saved;
	return vstr(out.p ? out.p : "", out.n);
}

struct val jinja_call_value(struct rctx *r, struct val fn, struct args *a, int line)
{
	if (fn.t == V_METHOD)
		return jinja_call_method(r, fn.m, a, line);
	if (fn.t != V_FUNC)
		jinja_rdie(r, line, LLM_ERR_USAGE, "'%s' object is not callable", jinja_type_name(fn));
	if (fn.fn->macro)
		return call_macro(r, fn.fn, a, line);
	return fn.fn->builtin(r, fn.fn, a, line);
}

static struct val bi_raise(struct rctx *r, struct func *f, struct args *a, int line)
{
	(void)f;
	struct val m = a->n_pos ? jinja_to_string(r, a->pos[0]) : vstr("", 0);
	jinja_rdie(r, line, LLM_ERR_USAGE, "raise_exception: %.*s", (int)m.s.n, m.s.p);
}

static struct val bi_namespace(struct rctx *r, struct func *f, struct args *a, int line)
{
	(void)f;
	struct val d = jinja_vdict(&r->c);
	d.d->ns = true;
	for (size_t i = 0; i < a->n_pos; i++) {
		if (a->pos[i].t != V_DICT)
			jinja_rdie(r, line, LLM_ERR_USAGE, "namespace(): positional argument must be a dict");
		for (size_t k = 0; k < a->pos[i].d->n; k++)
			jinja_dict_set(&r->c, d.d, a->pos[i].d->k[k], a->pos[i].d->v[k]);
	}
	for (size_t i = 0; i < a->n_kw; i++)
		jinja_dict_sets(&r->c, d.d, a->kw[i], a->kwv[i]);
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
		jinja_rdie(r, line, LLM_ERR_USAGE, "range() takes 1 to 3 arguments");
	for (size_t i = 0; i < a->n_pos; i++)
		if (a->pos[i].t != V_INT)
			jinja_rdie(r, line, LLM_ERR_USAGE, "range(): arguments must be integers");
	if (a->n_pos == 1)
		v[1] = a->pos[0].i;
	else
		for (size_t i = 0; i < a->n_pos; i++)
			v[i] = a->pos[i].i;
	if (!v[2])
		jinja_rdie(r, line, LLM_ERR_USAGE, "range() arg 3 must not be zero");
	struct val l = jinja_vlist(&r->c);
	for (int64_t i = v[0]; v[2] > 0 ? i < v[1] : i > v[1];) {
		if (l.l->n > 10000000)
			jinja_rdie(r, line, LLM_ERR_USAGE, "range() too large");
		jinja_list_push(&r->c, l.l, vint(i));
		if (__builtin_add_overflow(i, v[2], &i))   /* past the last 64-bit value: the end */
			break;
	}
	return l;
}

static struct val bi_strftime(struct rctx *r, struct func *f, struct args *a, int line)
{
	(void)f;
	if (a->n_pos != 1 || a->pos[0].t != V_STR)
		jinja_rdie(r, line, LLM_ERR_USAGE, "strftime_now(format) takes one string");
	char fmt[256], out[512];
	snprintf(fmt, sizeof fmt, "%.*s", (int)a->pos[0].s.n, a->pos[0].s.p);
	time_t now = time(NULL);
	struct tm tm;
	localtime_r(&now, &tm);
	size_t n = strftime(out, sizeof out, fmt, &tm);
	return vstr(jinja_adup(&r->c, out, n), n);
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
	v.fn = jinja_aalloc(&r->c, sizeof *v.fn);
	v.fn->name = name;
	v.fn->builtin = fn;
	return v;
}

static struct args eval_args(struct rctx *r, struct node *n, struct val *first)
{
	struct args a = { 0 };
	size_t np = n->n_kid - n->n_kw + (first ? 1 : 0);
	a.pos = jinja_aalloc(&r->c, (np + 1) * sizeof *a.pos);
	if (first)
		a.pos[a.n_pos++] = *first;
	for (size_t i = 0; i < n->n_kid - n->n_kw; i++)
		a.pos[a.n_pos++] = eval(r, n->kid[i]);
	a.kw = n->kw;
	a.n_kw = n->n_kw;
	a.kwv = jinja_aalloc(&r->c, (n->n_kw + 1) * sizeof *a.kwv);
	for (size_t i = 0; i < n->n_kw; i++)
		a.kwv[i] = eval(r, n->kid[n->n_kid - n->n_kw + i]);
	return a;
}

static struct val eval(struct rctx *r, struct node *n)
{
	switch (n->k) {
	case N_LIT: return n->v;
	case N_NAME: return lookup(r, n->name);
	case N_ATTR: return jinja_get_attr(r, eval(r, n->a), n->name, n->line);
	case N_ITEM: return jinja_get_item(r, eval(r, n->a), eval(r, n->b), n->line);
	case N_SLICE: {
		struct val o = eval(r, n->a);
		return jinja_slice(r, o, n->b ? eval(r, n->b) : UNDEF, n->c ? eval(r, n->c) : UNDEF, n->d ? eval(r, n->d) : UNDEF,
		             n->line);
	}
	case N_CALL: {
		struct val fn = eval(r, n->a);
		if (fn.t == V_UNDEF)
			jinja_rdie(r, n->line, LLM_ERR_USAGE, "'%s' is undefined",
			     n->a->k == N_NAME || n->a->k == N_ATTR ? n->a->name : "callee");
		struct args a = eval_args(r, n, NULL);
		return jinja_call_value(r, fn, &a, n->line);
	}
	case N_FILTER: {
		struct val v = eval(r, n->a);
		struct args a = eval_args(r, n, NULL);
		return jinja_apply_filter(r, n->name, v, &a, n->line);
	}
	case N_TEST: {
		struct val v = eval(r, n->a);
		struct args a = eval_args(r, n, NULL);
		return vbool(jinja_apply_test(r, n->name, v, &a, n->line) != n->neg);
	}
	case N_BIN: return jinja_binop(r, n->name, eval(r, n->a), eval(r, n->b), n->line);
	case N_NOT: return vbool(!jinja_truthy(eval(r, n->a)));
	case N_NEG: case N_POS: {
		struct val v = eval(r, n->a);
		if (v.t == V_INT) {
			if (n->k == N_NEG && v.i == INT64_MIN)
				int_overflow(r, "-", n->line);
			return vint(n->k == N_NEG ? -v.i : v.i);
		}
		if (v.t == V_FLOAT) return vfloat(n->k == N_NEG ? -v.f : v.f);
		jinja_rdie(r, n->line, LLM_ERR_USAGE, "bad operand type for unary %c: '%s'", n->k == N_NEG ? '-' : '+',
		     jinja_type_name(v));
	}
	case N_AND: {
		struct val a = eval(r, n->a);
		return jinja_truthy(a) ? eval(r, n->b) : a;
	}
	case N_OR: {
		struct val a = eval(r, n->a);
		return jinja_truthy(a) ? a : eval(r, n->b);
	}
	case N_COND:
		if (jinja_truthy(eval(r, n->a)))
			return eval(r, n->b);
		return n->c ? eval(r, n->c) : UNDEF;
	case N_LIST: case N_TUPLE: {
		struct val l = jinja_vlist(&r->c);
		for (size_t i = 0; i < n->n_kid; i++)
			jinja_list_push(&r->c, l.l, eval(r, n->kid[i]));
		return l;
	}
	case N_DICT: {
		struct val d = jinja_vdict(&r->c);
		for (size_t i = 0; i + 1 < n->n_kid; i += 2)
			jinja_dict_set(&r->c, d.d, eval(r, n->kid[i]), eval(r, n->kid[i + 1]));
		return d;
	}
	default: jinja_rdie(r, n->line, LLM_ERR_INTERNAL, "bad expression node %d", n->k);
	}
}

static void assign_targets(struct rctx *r, struct node *n, struct val v)
{
	if (n->n_names == 1) {
		assign(r, n->names[0], v);
		return;
	}
	struct val l = jinja_to_list(r, v, n->line);
	if (l.l->n != n->n_names)
		jinja_rdie(r, n->line, LLM_ERR_USAGE, "cannot unpack %zu values into %zu names", l.l->n, n->n_names);
	for (size_t i = 0; i < n->n_names; i++)
		assign(r, n->names[i], l.l->v[i]);
}

static void exec_for(struct rctx *r, struct node *n, struct sb *out)
{
	struct val seq = eval(r, n->b);
	struct val l = jinja_to_list(r, seq, n->line);
	struct scope sc = { .up = r->sc };
	r->sc = &sc;
	if (n->filter) {   /* "for x in xs if cond": filter first, loop.* counts the kept items */
		struct val kept = jinja_vlist(&r->c);
		for (size_t i = 0; i < l.l->n; i++) {
			assign_targets(r, n, l.l->v[i]);
			if (jinja_truthy(eval(r, n->filter)))
				jinja_list_push(&r->c, kept.l, l.l->v[i]);
		}
		l = kept;
	}
	size_t len = l.l->n;
	for (size_t i = 0; i < len; i++) {
		sc.vars.n = 0;   /* a fresh scope per iteration */
		struct val loop = jinja_vdict(&r->c);
		jinja_dict_sets(&r->c, loop.d, "index0", vint((int64_t)i));
		jinja_dict_sets(&r->c, loop.d, "index", vint((int64_t)i + 1));
		jinja_dict_sets(&r->c, loop.d, "revindex", vint((int64_t)(len - i)));
		jinja_dict_sets(&r->c, loop.d, "revindex0", vint((int64_t)(len - i - 1)));
		jinja_dict_sets(&r->c, loop.d, "first", vbool(i == 0));
		jinja_dict_sets(&r->c, loop.d, "last", vbool(i + 1 == len));
		jinja_dict_sets(&r->c, loop.d, "length", vint((int64_t)len));
		jinja_dict_sets(&r->c, loop.d, "depth", vint(1));
		jinja_dict_sets(&r->c, loop.d, "depth0", vint(0));
		jinja_dict_sets(&r->c, loop.d, "previtem", i ? l.l->v[i - 1] : UNDEF);
		jinja_dict_sets(&r->c, loop.d, "nextitem", i + 1 < len ? l.l->v[i + 1] : UNDEF);
		struct val cyc = mkfunc(r, "cycle", bi_cycle);
		cyc.fn->data = vint((int64_t)i);
		jinja_dict_sets(&r->c, loop.d, "cycle", cyc);
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
		case N_TEXT: jinja_sb_put(out, n->v.s.p, n->v.s.n); break;
		case N_OUT: jinja_put_str(out, eval(r, n->a)); break;
		case N_IF:
			if (jinja_truthy(eval(r, n->a)))
				exec_body(r, n->b, out);
			else if (n->c)
				exec_body(r, n->c, out);
			break;
		case N_FOR: exec_for(r, n, out); break;
		case N_SET:
			if (n->neg) {
				struct val ns = lookup(r, n->name);
				if (ns.t != V_DICT || !ns.d->ns)
					jinja_rdie(r, n->line, LLM_ERR_USAGE, "cannot assign attribute on non-namespace object '%s'", n->name);
				jinja_dict_sets(&r->c, ns.d, n->names[0], eval(r, n->a));
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
			f.fn = jinja_aalloc(&r->c, sizeof *f.fn);
			f.fn->name = n->name;
			f.fn->macro = n;
			assign(r, n->name, f);
			break;
		}
		case N_BREAK: r->loop_ctl = 1; break;
		case N_CONTINUE: r->loop_ctl = 2; break;
		case N_BODY: exec_body(r, n, out); break;
		default: jinja_rdie(r, n->line, LLM_ERR_INTERNAL, "bad statement node %d", n->k);
		}
	}
}

static struct val from_json(struct rctx *r, const json_t *j)
{
	switch (json_typeof(j)) {
	case JSON_OBJECT: {
		struct val d = jinja_vdict(&r->c);
		const char *k;
		json_t *v;
		json_object_foreach((json_t *)j, k, v)
			jinja_dict_set(&r->c, d.d, vstr(jinja_adup(&r->c, k, strlen(k)), strlen(k)), from_json(r, v));
		return d;
	}
	case JSON_ARRAY: {
		struct val l = jinja_vlist(&r->c);
		for (size_t i = 0; i < json_array_size(j); i++)
			jinja_list_push(&r->c, l.l, from_json(r, json_array_get(j, i)));
		return l;
	}
	case JSON_STRING: return vstr(jinja_adup(&r->c, json_string_value(j), json_string_length(j)), json_string_length(j));
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
		jinja_arena_free(&ar);
		free(r);
		return st;
	}
	struct val g = jinja_vdict(&r->c);
	r->globals = g.d;
	jinja_dict_sets(&r->c, r->globals, "raise_exception", mkfunc(r, "raise_exception", bi_raise));
	jinja_dict_sets(&r->c, r->globals, "namespace", mkfunc(r, "namespace", bi_namespace));
	jinja_dict_sets(&r->c, r->globals, "dict", mkfunc(r, "dict", bi_dict));
	jinja_dict_sets(&r->c, r->globals, "range", mkfunc(r, "range", bi_range));
	jinja_dict_sets(&r->c, r->globals, "strftime_now", mkfunc(r, "strftime_now", bi_strftime));
	r->sc = &top;
	if (vars) {
		if (!json_is_object(vars))
			jinja_rdie(r, 0, LLM_ERR_USAGE, "variables are not a JSON object");
		struct val v = from_json(r, vars);
		for (size_t i = 0; i < v.d->n; i++)
			jinja_dict_set(&r->c, &top.vars, v.d->k[i], v.d->v[i]);
	}
	exec_body(r, t->root, &o);
	if (!o.p)
		jinja_sb_put(&o, "", 0);
	*out = o.p;
	*len = o.n;
	jinja_arena_free(&ar);
	free(r);
	return LLM_OK;
}
