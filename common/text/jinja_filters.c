/* common/text/jinja_filters.c: the chat-template filters, tests and str/dict/
 * list methods, and tojson, as Jinja2 3.1 and Python define them (tojson
 * is json.dumps(ensure_ascii=False) with indent, separators and sort_keys;
 * case mapping and whitespace by Unicode through utf8proc). The name lists
 * below are what the parser accepts: an unknown filter or test fails at
 * parse time, so a filter added here must be added there too. */
#define _GNU_SOURCE
#include "jinja_impl.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "banned.h"

const char *jinja_filter_names[] = {
	"abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float", "indent",
	"int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject", "rejectattr",
	"replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum", "title", "tojson",
	"trim", "unique", "upper", "wordcount", "center", "batch", "forceescape", "striptags", NULL,
};
const char *jinja_test_names[] = {
	"boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "float", "ge",
	"gt", "in", "integer", "iterable", "le", "lower", "lt", "mapping", "ne", "none", "number", "odd", "sameas",
	"sequence", "string", "true", "undefined", "upper", "==", "!=", "<", ">", "<=", ">=", "greaterthan", "lessthan",
	NULL,
};

/* ---- JSON (tojson) */

static void json_str(struct sb *b, const char *s, size_t n)
{
	jinja_sb_putc(b, '"');
	for (size_t i = 0; i < n; i++) {
		unsigned char ch = (unsigned char)s[i];
		switch (ch) {
		case '"': jinja_sb_puts(b, "\\\""); break;
		case '\\': jinja_sb_puts(b, "\\\\"); break;
		case '\n': jinja_sb_puts(b, "\\n"); break;
		case '\r': jinja_sb_puts(b, "\\r"); break;
		case '\t': jinja_sb_puts(b, "\\t"); break;
		case '\b': jinja_sb_puts(b, "\\b"); break;
		case '\f': jinja_sb_puts(b, "\\f"); break;
		default:
			if (ch < 0x20)
				jinja_sb_printf(b, "\\u%04x", ch);
			else
				jinja_sb_putc(b, (char)ch);
		}
	}
	jinja_sb_putc(b, '"');
}

struct jopts { int indent; const char *item_sep, *key_sep; bool sort; };

static void newline_indent(struct sb *b, const struct jopts *o, int depth)
{
	jinja_sb_putc(b, '\n');
	for (int i = 0; i < depth * o->indent; i++)
		jinja_sb_putc(b, ' ');
}

static void to_json(struct rctx *r, struct sb *b, struct val v, const struct jopts *o, int depth, int line)
{
	switch (v.t) {
	case V_NONE: jinja_sb_puts(b, "null"); break;
	case V_BOOL: jinja_sb_puts(b, v.b ? "true" : "false"); break;
	case V_INT: jinja_sb_printf(b, "%lld", (long long)v.i); break;
	case V_FLOAT:
		if (isnan(v.f)) jinja_sb_puts(b, "NaN");
		else if (isinf(v.f)) jinja_sb_puts(b, v.f < 0 ? "-Infinity" : "Infinity");
		else jinja_put_float(b, v.f);
		break;
	case V_STR: json_str(b, v.s.p, v.s.n); break;
	case V_LIST:
		if (!v.l->n) {
			jinja_sb_puts(b, "[]");
			break;
		}
		jinja_sb_putc(b, '[');
		for (size_t i = 0; i < v.l->n; i++) {
			if (i)
				jinja_sb_puts(b, o->item_sep);
			if (o->indent >= 0)
				newline_indent(b, o, depth + 1);
			to_json(r, b, v.l->v[i], o, depth + 1, line);
		}
		if (o->indent >= 0)
			newline_indent(b, o, depth);
		jinja_sb_putc(b, ']');
		break;
	case V_DICT: {
		if (!v.d->n) {
			jinja_sb_puts(b, "{}");
			break;
		}
		size_t *ord = jinja_aalloc(&r->c, v.d->n * sizeof *ord);
		for (size_t i = 0; i < v.d->n; i++)
			ord[i] = i;
		if (o->sort)   /* insertion sort by key */
			for (size_t i = 1; i < v.d->n; i++)
				for (size_t j = i; j > 0 && jinja_cmp_vals(r, v.d->k[ord[j - 1]], v.d->k[ord[j]], line) > 0; j--) {
					size_t t = ord[j];
					ord[j] = ord[j - 1];
					ord[j - 1] = t;
				}
		jinja_sb_putc(b, '{');
		for (size_t q = 0; q < v.d->n; q++) {
			size_t i = ord[q];
			if (q)
				jinja_sb_puts(b, o->item_sep);
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
				jinja_rdie(r, line, LLM_ERR_USAGE, "tojson: keys must be str, int, float, bool or None");
			}
			jinja_sb_puts(b, o->key_sep);
			to_json(r, b, v.d->v[i], o, depth + 1, line);
		}
		if (o->indent >= 0)
			newline_indent(b, o, depth);
		jinja_sb_putc(b, '}');
		break;
	}
	default:
		jinja_rdie(r, line, LLM_ERR_USAGE, "tojson: Object of type %s is not JSON serializable", jinja_type_name(v));
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
		jinja_sb_put(&b, (const char *)u, (size_t)n);
		first = false;
		i += k;
	}
	return vstr(b.p ? b.p : "", b.n);
}

static struct val split_str(struct rctx *r, struct val s, struct val sep, int64_t maxsplit)
{
	struct val l = jinja_vlist(&r->c);
	if (sep.t == V_STR) {
		if (!sep.s.n)
			jinja_rdie(r, 0, LLM_ERR_USAGE, "split: empty separator");
		size_t i = 0;
		int64_t k = 0;
		for (;;) {
			const char *p = (maxsplit < 0 || k < maxsplit) ? memmem(s.s.p + i, s.s.n - i, sep.s.p, sep.s.n) : NULL;
			if (!p) {
				jinja_list_push(&r->c, l.l, vstr(s.s.p + i, s.s.n - i));
				break;
			}
			jinja_list_push(&r->c, l.l, vstr(s.s.p + i, (size_t)(p - (s.s.p + i))));
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
			jinja_list_push(&r->c, l.l, rest);
			break;
		}
		size_t j = i;
		while (j < s.s.n && !is_space_cp(cp_at(s.s.p, s.s.n, j, &k)))
			j += k;
		jinja_list_push(&r->c, l.l, vstr(s.s.p + i, j - i));
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
				jinja_sb_put(&o, b.s.p, b.s.n);
				k++;
			}
			if (i == s.s.n)
				break;
			size_t n = 1;
			while (i + n < s.s.n && ((unsigned char)s.s.p[i + n] & 0xC0) == 0x80)
				n++;
			jinja_sb_put(&o, s.s.p + i, n);
			i += n;
		}
		return vstr(o.p ? o.p : "", o.n);
	}
	size_t i = 0;
	int64_t k = 0;
	while (i < s.s.n) {
		const char *p = (count < 0 || k < count) ? memmem(s.s.p + i, s.s.n - i, a.s.p, a.s.n) : NULL;
		if (!p) {
			jinja_sb_put(&o, s.s.p + i, s.s.n - i);
			break;
		}
		jinja_sb_put(&o, s.s.p + i, (size_t)(p - (s.s.p + i)));
		jinja_sb_put(&o, b.s.p, b.s.n);
		i = (size_t)(p - s.s.p) + a.s.n;
		k++;
	}
	return vstr(o.p ? o.p : "", o.n);
}

static void need_str(struct rctx *r, struct val v, const char *what, int line)
{
	if (v.t != V_STR)
		jinja_rdie(r, line, LLM_ERR_USAGE, "%s: expected a string, got %s", what, jinja_type_name(v));
}

struct val jinja_call_method(struct rctx *r, struct method *m, struct args *a, int line)
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
				jinja_rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported: rsplit with maxsplit");
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
					return vint((int64_t)jinja_u8count(s.s.p, s.s.n) + 1);
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
				jinja_rdie(r, line, LLM_ERR_USAGE, "substring not found");
			return vint(p ? (int64_t)jinja_u8count(s.s.p, (size_t)(p - s.s.p)) : -1);
		}
		if (!strcmp(n, "join")) {
			struct val l = jinja_to_list(r, a0, line);
			struct sb o = { .c = &r->c };
			for (size_t i = 0; i < l.l->n; i++) {
				if (i)
					jinja_sb_put(&o, s.s.p, s.s.n);
				need_str(r, l.l->v[i], "join", line);
				jinja_sb_put(&o, l.l->v[i].s.p, l.l->v[i].s.n);
			}
			return vstr(o.p ? o.p : "", o.n);
		}
		if (!strcmp(n, "splitlines")) {
			struct val l = jinja_vlist(&r->c);
			size_t i = 0;
			while (i < s.s.n) {
				size_t j = i;
				while (j < s.s.n && s.s.p[j] != '\n' && s.s.p[j] != '\r')
					j++;
				jinja_list_push(&r->c, l.l, vstr(s.s.p + i, j - i));
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
		jinja_rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported string method '%s'", n);
	}
	if (s.t == V_DICT) {
		if (!strcmp(n, "items")) {
			struct val l = jinja_vlist(&r->c);
			for (size_t i = 0; i < s.d->n; i++) {
				struct val t = jinja_vlist(&r->c);
				jinja_list_push(&r->c, t.l, s.d->k[i]);
				jinja_list_push(&r->c, t.l, s.d->v[i]);
				jinja_list_push(&r->c, l.l, t);
			}
			return l;
		}
		if (!strcmp(n, "keys") || !strcmp(n, "values")) {
			struct val l = jinja_vlist(&r->c);
			for (size_t i = 0; i < s.d->n; i++)
				jinja_list_push(&r->c, l.l, n[0] == 'k' ? s.d->k[i] : s.d->v[i]);
			return l;
		}
		if (!strcmp(n, "get")) {
			struct val *v = jinja_dict_find(s.d, a0);
			return v ? *v : (a->n_pos > 1 ? a1 : NONE);
		}
		if (!strcmp(n, "copy")) {
			struct val d = jinja_vdict(&r->c);
			for (size_t i = 0; i < s.d->n; i++)
				jinja_dict_set(&r->c, d.d, s.d->k[i], s.d->v[i]);
			return d;
		}
		jinja_rdie(r, line, LLM_ERR_USAGE, "access to attribute '%s' of 'dict' object is unsafe (immutable sandbox)", n);
	}
	if (s.t == V_LIST) {
		if (!strcmp(n, "index") || !strcmp(n, "count")) {
			int64_t k = 0;
			for (size_t i = 0; i < s.l->n; i++)
				if (jinja_val_eq(s.l->v[i], a0)) {
					if (n[0] == 'i')
						return vint((int64_t)i);
					k++;
				}
			if (n[0] == 'i')
				jinja_rdie(r, line, LLM_ERR_USAGE, "value is not in list");
			return vint(k);
		}
		if (!strcmp(n, "copy"))
			return jinja_slice(r, s, UNDEF, UNDEF, UNDEF, line);
		jinja_rdie(r, line, LLM_ERR_USAGE, "access to attribute '%s' of 'list' object is unsafe (immutable sandbox)", n);
	}
	jinja_rdie(r, line, LLM_ERR_INTERNAL, "method '%s'", n);
}

/* ---- filters and tests */

static struct val attr_path(struct rctx *r, struct val v, struct val path, int line)
{
	/* "a.b" or an integer index */
	if (path.t == V_INT)
		return jinja_get_item(r, v, path, line);
	need_str(r, path, "attribute", line);
	const char *p = path.s.p, *e = p + path.s.n;
	while (p <= e) {
		const char *d = memchr(p, '.', (size_t)(e - p));
		if (!d)
			d = e;
		bool digits = d > p;
		for (const char *q = p; q < d; q++)
			digits &= *q >= '0' && *q <= '9';
		struct val key = digits ? vint(strtoll(jinja_adup(&r->c, p, (size_t)(d - p)), NULL, 10)) : vstr(p, (size_t)(d - p));
		if (v.t == V_UNDEF)
			return UNDEF;
		v = jinja_get_item(r, v, key, line);
		p = d + 1;
	}
	return v;
}

/* select/reject/selectattr/rejectattr/map share argument handling. */
static struct val filter_seq(struct rctx *r, const char *name, struct val v, struct args *a, int line)
{
	struct val l = jinja_to_list(r, v, line), out = jinja_vlist(&r->c);
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
					jinja_rdie(r, line, LLM_ERR_USAGE, "map: needs a filter name or attribute=");
				need_str(r, a->pos[0], "map", line);
				char *fname = jinja_adup(&r->c, a->pos[0].s.p, a->pos[0].s.n);
				if (!jinja_in_list(jinja_filter_names, fname))
					jinja_rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported filter '%s'", fname);
				struct args sub = { a->pos + 1, a->n_pos - 1, a->kw, a->kwv, a->n_kw };
				x = jinja_apply_filter(r, fname, x, &sub, line);
			}
			jinja_list_push(&r->c, out.l, x);
		}
		return out;
	}
	size_t first = attr ? 1 : 0;
	if (attr && !a->n_pos)
		jinja_rdie(r, line, LLM_ERR_USAGE, "%s: needs an attribute", name);
	char *test = NULL;
	if (a->n_pos > first) {
		need_str(r, a->pos[first], name, line);
		test = jinja_adup(&r->c, a->pos[first].s.p, a->pos[first].s.n);
		if (!jinja_in_list(jinja_test_names, test))
			jinja_rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported test '%s'", test);
	}
	struct args sub = { a->pos + first + 1, a->n_pos > first + 1 ? a->n_pos - first - 1 : 0, NULL, NULL, 0 };
	for (size_t i = 0; i < l.l->n; i++) {
		struct val x = attr ? attr_path(r, l.l->v[i], a->pos[0], line) : l.l->v[i];
		bool ok = test ? jinja_apply_test(r, test, x, &sub, line) : jinja_truthy(x);
		if (ok != reject)
			jinja_list_push(&r->c, out.l, l.l->v[i]);
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

struct val jinja_apply_filter(struct rctx *r, const char *f, struct val v, struct args *a, int line)
{
	struct val a0 = a->n_pos > 0 ? a->pos[0] : UNDEF;
	if (!strcmp(f, "trim")) {
		if (v.t == V_UNDEF)
			return vstr("", 0);
		v = jinja_to_string(r, v);
		return strip(v, kwarg(a, "chars", 0, UNDEF), true, true);
	}
	if (!strcmp(f, "length") || !strcmp(f, "count"))
		return vint(jinja_length_of(r, v, line));
	if (!strcmp(f, "string"))
		return jinja_to_string(r, v);
	if (!strcmp(f, "safe") || !strcmp(f, "e") || !strcmp(f, "escape") || !strcmp(f, "forceescape")) {
		if (f[0] == 's')
			return v;
		/* autoescape is off in HF; |e still escapes */
		struct val s = jinja_to_string(r, v);
		struct sb o = { .c = &r->c };
		for (size_t i = 0; i < s.s.n; i++) {
			char ch = s.s.p[i];
			if (ch == '&') jinja_sb_puts(&o, "&amp;");
			else if (ch == '<') jinja_sb_puts(&o, "&lt;");
			else if (ch == '>') jinja_sb_puts(&o, "&gt;");
			else if (ch == '"') jinja_sb_puts(&o, "&#34;");
			else if (ch == '\'') jinja_sb_puts(&o, "&#39;");
			else jinja_sb_putc(&o, ch);
		}
		return vstr(o.p ? o.p : "", o.n);
	}
	if (!strcmp(f, "upper") || !strcmp(f, "lower") || !strcmp(f, "capitalize") || !strcmp(f, "title"))
		return case_map(r, jinja_to_string(r, v), f[0] == 'l' ? 0 : f[0] == 'u' ? 1 : f[0] == 'c' ? 2 : 3);
	if (!strcmp(f, "default") || !strcmp(f, "d")) {
		struct val def = kwarg(a, "default_value", 0, vstr("", 0));
		bool boolean = jinja_truthy(kwarg(a, "boolean", 1, vbool(false)));
		if (v.t == V_UNDEF || (boolean && !jinja_truthy(v)))
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
			o.item_sep = jinja_adup(&r->c, seps.l->v[0].s.p, seps.l->v[0].s.n);
			o.key_sep = jinja_adup(&r->c, seps.l->v[1].s.p, seps.l->v[1].s.n);
		}
		o.sort = jinja_truthy(kwarg(a, "sort_keys", 99, vbool(false)));
		struct sb b = { .c = &r->c };
		to_json(r, &b, v, &o, 0, line);
		return vstr(b.p ? b.p : "", b.n);
	}
	if (!strcmp(f, "items")) {
		if (v.t == V_UNDEF)
			return jinja_vlist(&r->c);
		if (v.t != V_DICT)
			jinja_rdie(r, line, LLM_ERR_USAGE, "items: expected a mapping, got %s", jinja_type_name(v));
		struct method m = { v, "items" };
		struct args none = { 0 };
		return jinja_call_method(r, &m, &none, line);
	}
	if (!strcmp(f, "first") || !strcmp(f, "last")) {
		struct val l = jinja_to_list(r, v, line);
		if (!l.l->n)
			return UNDEF;
		return f[0] == 'f' ? l.l->v[0] : l.l->v[l.l->n - 1];
	}
	if (!strcmp(f, "list"))
		return jinja_slice(r, jinja_to_list(r, v, line), UNDEF, UNDEF, UNDEF, line);
	if (!strcmp(f, "join")) {
		struct val l = jinja_to_list(r, v, line);
		struct val sep = kwarg(a, "d", 0, vstr("", 0));
		struct val at = kwarg(a, "attribute", 1, UNDEF);
		struct sb o = { .c = &r->c };
		for (size_t i = 0; i < l.l->n; i++) {
			if (i)
				jinja_put_str(&o, sep);
			jinja_put_str(&o, at.t != V_UNDEF ? attr_path(r, l.l->v[i], at, line) : l.l->v[i]);
		}
		return vstr(o.p ? o.p : "", o.n);
	}
	if (!strcmp(f, "select") || !strcmp(f, "reject") || !strcmp(f, "selectattr") || !strcmp(f, "rejectattr") ||
	    !strcmp(f, "map"))
		return filter_seq(r, f, v, a, line);
	if (!strcmp(f, "attr"))
		return jinja_get_attr(r, v, jinja_adup(&r->c, jinja_to_string(r, a0).s.p, jinja_to_string(r, a0).s.n), line);
	if (!strcmp(f, "replace")) {
		struct val s = jinja_to_string(r, v);
		need_str(r, a0, "replace", line);
		struct val b = a->n_pos > 1 ? jinja_to_string(r, a->pos[1]) : vstr("", 0);
		return replace_str(r, s, a0, b, a->n_pos > 2 && a->pos[2].t == V_INT ? a->pos[2].i : -1);
	}
	if (!strcmp(f, "int")) {
		struct val def = kwarg(a, "default", 0, vint(0));
		if (v.t == V_INT) return v;
		if (v.t == V_BOOL) return vint(v.b);
		if (v.t == V_FLOAT) return vint((int64_t)v.f);
		if (v.t == V_STR) {
			char *s = jinja_adup(&r->c, v.s.p, v.s.n), *end;
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
			char *s = jinja_adup(&r->c, v.s.p, v.s.n), *end;
			double d = strtod(s, &end);
			if (end != s && !*end)
				return vfloat(d);
		}
		return def;
	}
	if (!strcmp(f, "abs")) {
		if (v.t == V_INT) return vint(v.i < 0 ? -v.i : v.i);
		if (v.t == V_FLOAT) return vfloat(fabs(v.f));
		jinja_rdie(r, line, LLM_ERR_USAGE, "abs: bad operand %s", jinja_type_name(v));
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
			return jinja_slice(r, v, UNDEF, UNDEF, vint(-1), line);
		return jinja_slice(r, jinja_to_list(r, v, line), UNDEF, UNDEF, vint(-1), line);
	}
	if (!strcmp(f, "sort") || !strcmp(f, "dictsort")) {
		struct val l = !strcmp(f, "dictsort") ? jinja_apply_filter(r, "items", v, &(struct args){ 0 }, line)
		                                      : jinja_slice(r, jinja_to_list(r, v, line), UNDEF, UNDEF, UNDEF, line);
		bool rev = jinja_truthy(kwarg(a, "reverse", 0, vbool(false)));
		sort_ci = !jinja_truthy(kwarg(a, "case_sensitive", 1, vbool(false)));
		sort_attr = !strcmp(f, "dictsort") ? vint(jinja_truthy(kwarg(a, "by", 99, UNDEF)) ? 1 : 0)
		                                   : kwarg(a, "attribute", 2, UNDEF);
		sort_r = r;
		sort_cmp_line = line;
		for (size_t i = 1; i < l.l->n; i++)   /* stable insertion sort */
			for (size_t j = i; j > 0; j--) {
				int c = jinja_cmp_vals(r, sort_key(l.l->v[j - 1]), sort_key(l.l->v[j]), line);
				if (rev ? c >= 0 : c <= 0)
					break;
				struct val t = l.l->v[j];
				l.l->v[j] = l.l->v[j - 1];
				l.l->v[j - 1] = t;
			}
		return l;
	}
	if (!strcmp(f, "unique")) {
		struct val l = jinja_to_list(r, v, line), out = jinja_vlist(&r->c);
		for (size_t i = 0; i < l.l->n; i++)
			if (!jinja_contains(r, out, l.l->v[i], line))
				jinja_list_push(&r->c, out.l, l.l->v[i]);
		return out;
	}
	if (!strcmp(f, "min") || !strcmp(f, "max")) {
		struct val l = jinja_to_list(r, v, line);
		if (!l.l->n)
			return UNDEF;
		struct val best = l.l->v[0];
		for (size_t i = 1; i < l.l->n; i++) {
			int c = jinja_cmp_vals(r, l.l->v[i], best, line);
			if (f[1] == 'i' ? c < 0 : c > 0)
				best = l.l->v[i];
		}
		return best;
	}
	if (!strcmp(f, "sum")) {
		struct val l = jinja_to_list(r, v, line), acc = kwarg(a, "start", 1, vint(0));
		struct val at = kwarg(a, "attribute", 0, UNDEF);
		for (size_t i = 0; i < l.l->n; i++)
			acc = jinja_binop(r, "+", acc, at.t != V_UNDEF ? attr_path(r, l.l->v[i], at, line) : l.l->v[i], line);
		return acc;
	}
	if (!strcmp(f, "wordcount"))
		return vint((int64_t)split_str(r, jinja_to_string(r, v), UNDEF, -1).l->n);
	if (!strcmp(f, "indent")) {
		struct val w = kwarg(a, "width", 0, vint(4));
		bool first = jinja_truthy(kwarg(a, "first", 1, vbool(false)));
		bool blank = jinja_truthy(kwarg(a, "blank", 2, vbool(false)));
		struct sb pad = { .c = &r->c };
		if (w.t == V_STR)
			jinja_sb_put(&pad, w.s.p, w.s.n);
		else if (w.t != V_INT)
			jinja_rdie(r, line, LLM_ERR_USAGE, "indent(): width must be an integer or a string");
		else if (w.i > JINJA_MAX_STR)
			jinja_rdie(r, line, LLM_ERR_USAGE, "indent(): width %lld: more than %d MiB", (long long)w.i, JINJA_MAX_STR >> 20);
		else
			for (int64_t i = 0; i < w.i; i++)
				jinja_sb_putc(&pad, ' ');
		struct val s = jinja_to_string(r, v);
		struct sb o = { .c = &r->c };
		size_t i = 0;
		bool is_first = true;
		while (i <= s.s.n) {
			size_t j = i;
			while (j < s.s.n && s.s.p[j] != '\n')
				j++;
			bool empty = j == i;
			if ((is_first ? first : true) && (blank || !empty) && !(is_first && !first))
				jinja_sb_put(&o, pad.p ? pad.p : "", pad.n);
			jinja_sb_put(&o, s.s.p + i, j - i);
			if (j < s.s.n)
				jinja_sb_putc(&o, '\n');
			is_first = false;
			if (j >= s.s.n)
				break;
			i = j + 1;
		}
		return vstr(o.p ? o.p : "", o.n);
	}
	jinja_rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported filter '%s'", f);
}

bool jinja_apply_test(struct rctx *r, const char *t, struct val v, struct args *a, int line)
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
			jinja_rdie(r, line, LLM_ERR_USAGE, "test %s: expected an integer", t);
		return (v.i % 2 != 0) == (t[0] == 'o');
	}
	if (!strcmp(t, "divisibleby")) {
		if (v.t != V_INT || a0.t != V_INT || !a0.i)
			jinja_rdie(r, line, LLM_ERR_USAGE, "test divisibleby: expected integers");
		return v.i % a0.i == 0;
	}
	if (!strcmp(t, "lower") || !strcmp(t, "upper")) {
		if (v.t != V_STR)
			return false;
		struct val m = case_map(r, v, t[0] == 'l' ? 0 : 1);
		return jinja_val_eq(m, v);
	}
	if (!strcmp(t, "in")) return jinja_contains(r, a0, v, line);
	if (!strcmp(t, "sameas")) return v.t == a0.t && (v.t == V_NONE || v.t == V_UNDEF || (v.t == V_BOOL && v.b == a0.b) ||
	                                                 (v.t == V_LIST && v.l == a0.l) || (v.t == V_DICT && v.d == a0.d));
	const char *op = !strcmp(t, "eq") || !strcmp(t, "equalto") || !strcmp(t, "==") ? "=="
	               : !strcmp(t, "ne") || !strcmp(t, "!=") ? "!="
	               : !strcmp(t, "lt") || !strcmp(t, "lessthan") || !strcmp(t, "<") ? "<"
	               : !strcmp(t, "gt") || !strcmp(t, "greaterthan") || !strcmp(t, ">") ? ">"
	               : !strcmp(t, "le") || !strcmp(t, "<=") ? "<=" : !strcmp(t, "ge") || !strcmp(t, ">=") ? ">=" : NULL;
	if (op)
		return jinja_truthy(jinja_binop(r, op, v, a0, line));
	jinja_rdie(r, line, LLM_ERR_UNSUPPORTED, "unsupported test '%s'", t);
}
