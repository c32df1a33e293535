/* common/text/jinja_impl.h: the private interface between the parts of the
 * chat-template interpreter: jinja_value.c (arena, errors, values),
 * jinja_parse.c (lexer and parser to the AST), jinja_ops.c (operations on
 * values), jinja_filters.c (filters, tests, methods, tojson) and
 * jinja_eval.c (the evaluator). Calls go one way: the evaluator calls the
 * filters and the operations, the filters call the operations. It holds the types
 * they share and the jinja_-prefixed functions one part calls in another.
 * Not a public header: only those files include it; jinja.h is the API.
 *
 * Memory: the parsed template and every value of a render live in arenas
 * freed at once. Errors unwind with longjmp to the parse/render entry after
 * llm_fail() recorded "chat template: line N: ..."; nothing leaks because
 * every allocation is in an arena. */
#ifndef LLM_JINJA_IMPL_H
#define LLM_JINJA_IMPL_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "jinja.h"

/* ---------------------------------------------------------------- arena + errors */

struct chunk { struct chunk *next; size_t used, cap; max_align_t data[]; };
struct arena { struct chunk *head; };

struct ctx {                    /* shared by parser and renderer */
	struct arena *ar;
	jmp_buf jb;
	enum llm_status st;
};

/* jinja_value.c */

_Noreturn void jinja_die(struct ctx *c, enum llm_status st, int line, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
void *jinja_aalloc(struct ctx *c, size_t n);
void jinja_arena_free(struct arena *a);
char *jinja_adup(struct ctx *c, const char *s, size_t n);

/* A growable string in malloc memory (the render output) or the arena. */
struct sb { char *p; size_t n, cap; struct ctx *c; bool heap; };

void jinja_sb_put(struct sb *b, const char *s, size_t n);
void jinja_sb_puts(struct sb *b, const char *s);
void jinja_sb_putc(struct sb *b, char ch);
void jinja_sb_printf(struct sb *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

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

static inline struct val vbool(bool b) { struct val v = { .t = V_BOOL }; v.b = b; return v; }
static inline struct val vint(int64_t i) { struct val v = { .t = V_INT }; v.i = i; return v; }
static inline struct val vfloat(double f) { struct val v = { .t = V_FLOAT }; v.f = f; return v; }
static inline struct val vstr(const char *p, size_t n) { struct val v = { .t = V_STR }; v.s.p = p; v.s.n = n; return v; }
static inline double num(struct val v) { return v.t == V_FLOAT ? v.f : v.t == V_INT ? (double)v.i : v.b; }
static inline bool isnum(struct val v) { return v.t == V_INT || v.t == V_FLOAT || v.t == V_BOOL; }

struct val jinja_vlist(struct ctx *c);
struct val jinja_vdict(struct ctx *c);
void jinja_list_push(struct ctx *c, struct list *l, struct val x);
struct val *jinja_dict_find(struct dict *d, struct val k);
struct val *jinja_dict_finds(struct dict *d, const char *k);
void jinja_dict_set(struct ctx *c, struct dict *d, struct val k, struct val v);
void jinja_dict_sets(struct ctx *c, struct dict *d, const char *k, struct val v);
const char *jinja_type_name(struct val v);
bool jinja_val_eq(struct val a, struct val b);
bool jinja_truthy(struct val v);
void jinja_put_float(struct sb *b, double f);
void jinja_put_str(struct sb *b, struct val v);

/* ---------------------------------------------------------------- AST (jinja_parse.c) */

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

struct llm_jinja {
	struct arena ar;
	struct node *root;
	char *src;
};

/* Whether S is in the NULL-terminated list L (jinja_value.c). */
bool jinja_in_list(const char **l, const char *s);
extern const char *jinja_filter_names[], *jinja_test_names[];   /* jinja_filters.c: NULL-terminated */

/* ---------------------------------------------------------------- a render's context */

struct scope { struct dict vars; struct scope *up; };

struct rctx {
	struct ctx c;
	struct scope *sc;
	struct dict *globals;
	int loop_ctl;                /* 1 break, 2 continue */
};

/* jinja_ops.c: operations on values, with Python's semantics */
_Noreturn void jinja_rdie(struct rctx *r, int line, enum llm_status st, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* The error of an int operation OP that would pass 64 bits. */
_Noreturn void jinja_int_overflow(struct rctx *r, const char *op, int line);
size_t jinja_u8count(const char *s, size_t n);
int64_t jinja_length_of(struct rctx *r, struct val v, int line);
struct val jinja_to_list(struct rctx *r, struct val v, int line);
struct val jinja_to_string(struct rctx *r, struct val v);
int jinja_cmp_vals(struct rctx *r, struct val a, struct val b, int line);
bool jinja_contains(struct rctx *r, struct val hay, struct val x, int line);
struct val jinja_binop(struct rctx *r, const char *op, struct val a, struct val b, int line);
struct val jinja_get_attr(struct rctx *r, struct val obj, const char *name, int line);
struct val jinja_get_item(struct rctx *r, struct val obj, struct val key, int line);
struct val jinja_slice(struct rctx *r, struct val obj, struct val lo, struct val hi, struct val step, int line);
/* jinja_eval.c */
struct val jinja_call_value(struct rctx *r, struct val fn, struct args *a, int line);

/* The longest string one operation may build (repetition, indent) */
#define JINJA_MAX_STR (64 << 20)

/* jinja_filters.c */
struct val jinja_call_method(struct rctx *r, struct method *m, struct args *a, int line);
struct val jinja_apply_filter(struct rctx *r, const char *f, struct val v, struct args *a, int line);
bool jinja_apply_test(struct rctx *r, const char *t, struct val v, struct args *a, int line);

#endif
