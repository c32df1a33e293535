/* common/text/jinja_ops.c: operations on chat-template values with Python's
 * semantics, shared by the evaluator (jinja_eval.c) and the filters, tests
 * and methods (jinja_filters.c): length, list and string conversion,
 * comparison, membership, the binary operators (64-bit ints that refuse to
 * overflow, float % and // as CPython's), attribute and item access,
 * slicing, and the render's error exit. Both callers sit above this file;
 * it calls neither. */
#define _GNU_SOURCE
#include "jinja_impl.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "banned.h"

_Noreturn void jinja_rdie(struct rctx *r, int line, enum llm_status st, const char *fmt, ...)
{
	char msg[700];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	jinja_die(&r->c, st, line, "%s", msg);
}

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
_Noreturn void jinja_int_overflow(struct rctx *r, const char *op, int line)
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
			jinja_int_overflow(r, op, line);
		return vint(z);
	case '-':
		if (!ints)
			return vfloat(fx - fy);
		if (__builtin_sub_overflow(x, y, &z))
			jinja_int_overflow(r, op, line);
		return vint(z);
	case '*':
		if (op[1] == '*') {
			if (!ints || y < 0)
				return vfloat(pow(fx, fy));
			/* exact, by squaring: pow() rounds past 2^53 */
			z = 1;
			for (int64_t base = x, e = y; e; e >>= 1) {
				if ((e & 1) && __builtin_mul_overflow(z, base, &z))
					jinja_int_overflow(r, op, line);
				if (e > 1 && __builtin_mul_overflow(base, base, &base))
					jinja_int_overflow(r, op, line);
			}
			return vint(z);
		}
		if (!ints)
			return vfloat(fx * fy);
		if (__builtin_mul_overflow(x, y, &z))
			jinja_int_overflow(r, op, line);
		return vint(z);
	case '/':
		if (fy == 0)
			jinja_rdie(r, line, LLM_ERR_USAGE, "division by zero");
		if (op[1] == '/') {
			if (ints) {
				if (x == INT64_MIN && y == -1)
					jinja_int_overflow(r, op, line);
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
