/* common/text/jinja_eval.c: the chat-template evaluator: scopes, macro and
 * global function calls (raise_exception, namespace, dict, range,
 * strftime_now, loop.cycle), the statements, and llm_jinja_render. A render
 * is deterministic for given variables except strftime_now. Operations on
 * values (operators, access, slicing) are in jinja_ops.c; filters, tests and
 * methods in jinja_filters.c. */
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
				jinja_int_overflow(r, "-", n->line);
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
