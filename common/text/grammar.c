/* common/text/grammar.c: the grammar engine (see grammar.h for the text and the
 * guarantees).
 *
 * Compiled form: a flat array of elements, each alternative of a rule a run
 * of them ended by E_END; E_BYTES matches one byte of a 256-bit set, E_REF
 * enters a rule. Repetitions become right-recursive rules (x* is
 * R ::= x R | ""), classes with characters beyond ASCII become a rule
 * whose alternatives are the UTF-8 byte-range sequences of the class.
 *
 * Recogniser: a configuration is a stack of element positions (the top is
 * the next element to match, the others where to go on when a rule ends);
 * a state is the sorted set of such stacks, expanded until each top is an
 * E_BYTES (or the stack is empty: the text is accepted). A rule reference
 * followed by the end of its alternative replaces its frame instead of
 * pushing (a tail call), so x* keeps a stack of bounded depth. */
#include "grammar.h"
#include "hash.h"
#include "buf.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

enum { E_END, E_BYTES, E_REF };
struct gel { uint32_t type, arg; };   /* E_BYTES: bitmap index; E_REF: rule index */

struct grule {
	char name[48];
	uint32_t *alt;                    /* (n_alt) first elements */
	size_t n_alt, cap_alt;
	int defined, line;                /* line: of the first reference or the definition */
};

struct gstate {
	size_t off;                       /* words of the stack set in g->w */
	size_t len;
	int accept, more;
	int32_t *next;                    /* (256) -2 unknown, -1 refused, else a state; NULL until used */
	uint8_t *mask;                    /* (vocabulary) NULL until asked */
	int n_allowed;
};

struct gvis { uint64_t h, gen; };

/* A growable array of words: a stack set is stacks [len, e_0 .. e_len-1] one after another. */
struct words { uint32_t *w; size_t n, cap; };

#define MAX_WORDS ((size_t)1 << 26)   /* interned stack words (256 MiB): a grammar past it fails */
#define MAX_SET ((size_t)1 << 20)     /* words of one state's stack set */

struct llm_grammar {
	atomic_int refs;
	struct gel *el;
	size_t n_el, cap_el;
	uint8_t (*bm)[32];
	size_t n_bm, cap_bm;
	struct grule *rule;
	size_t n_rule, cap_rule;
	const struct llm_gvocab *voc;
	struct gstate *st;
	size_t n_st, cap_st;
	struct words pool;                /* interned sets */
	int32_t *ht;                      /* (ht_cap) state index or -1 */
	size_t ht_cap;
	uint32_t *stk;                    /* (cap_stk) expansion scratch */
	size_t cap_stk;
	struct words tmp, can;            /* a set being built, its canonical form */
	size_t *ord, cap_ord;             /* stack offsets while sorting */
	size_t *ord2, cap_ord2;
	struct gvis *vis;                 /* (cap_vis) the configurations one step has expanded (by
	                                   * hash); entries of another generation than gen are free */
	size_t cap_vis, n_vis;
	uint64_t gen;
	struct words *lvl;                /* (n_lvl) the trie walk's sets by depth */
	size_t n_lvl;
	int start, overflow;
	long mask_hit, mask_miss;
};

struct tnode { int32_t child, sib, tok; uint8_t byte; };

struct gcache {
	uint64_t h;
	char *text;                       /* (len) */
	size_t len;
	struct llm_grammar *g;            /* a reference of the cache's; NULL: a free entry */
	unsigned long use;
};

struct llm_gvocab {
	int n;
	char **tok;                       /* (n) bytes */
	size_t *len;                      /* (n) */
	struct tnode *node;               /* node 0: the root */
	size_t n_node, cap_node;
	int32_t *tok_next;                /* (n) the next token ending at the same node */
	pthread_mutex_t mu;               /* guards the cache */
	struct gcache cache[LLM_GRAMMAR_CACHE];
	unsigned long clock;
};

static int words_reserve(struct words *b, size_t need)
{
	return llm_array_reserve(&b->w, &b->cap, need, sizeof *b->w) ? -1 : 0;
}

static int words_push(struct words *b, uint32_t x)
{
	if (b->n + 1 > b->cap && words_reserve(b, b->n + 1))
		return -1;
	b->w[b->n++] = x;
	return 0;
}

/* ---- the vocabulary ---------------------------------------------------- */

void llm_grammar_unref(struct llm_grammar *g);

void llm_gvocab_free(struct llm_gvocab *v)
{
	if (!v)
		return;
	for (int i = 0; i < LLM_GRAMMAR_CACHE; i++) {
		llm_grammar_unref(v->cache[i].g);
		free(v->cache[i].text);
	}
	pthread_mutex_destroy(&v->mu);
	for (int i = 0; v->tok && i < v->n; i++)
		free(v->tok[i]);
	free(v->tok);
	free(v->len);
	free(v->node);
	free(v->tok_next);
	free(v);
}

static int32_t trie_child(struct llm_gvocab *v, int32_t at, uint8_t b)
{
	for (int32_t c = v->node[at].child; c >= 0; c = v->node[c].sib)
		if (v->node[c].byte == b)
			return c;
	if (llm_array_reserve(&v->node, &v->cap_node, v->n_node + 1, sizeof *v->node))
		return -1;
	int32_t c = (int32_t)v->n_node++;
	v->node[c] = (struct tnode){ .child = -1, .sib = v->node[at].child, .tok = -1, .byte = b };
	v->node[at].child = c;
	return c;
}

enum llm_status llm_gvocab_new(struct llm_gvocab **out, int n, const char *const *bytes, const size_t *len)
{
	*out = NULL;
	struct llm_gvocab *v = calloc(1, sizeof *v);
	if (!v)
		return llm_fail(LLM_ERR_NOMEM, "grammar: out of memory");
	pthread_mutex_init(&v->mu, NULL);
	v->n = n;
	v->tok = calloc((size_t)n + 1, sizeof *v->tok);
	v->len = calloc((size_t)n + 1, sizeof *v->len);
	v->tok_next = malloc(((size_t)n + 1) * sizeof *v->tok_next);
	if (!v->tok || !v->len || !v->tok_next || llm_array_reserve(&v->node, &v->cap_node, 1, sizeof *v->node))
		goto nomem;
	v->node[0] = (struct tnode){ .child = -1, .sib = -1, .tok = -1 };
	v->n_node = 1;
	for (int i = 0; i < n; i++) {
		v->tok_next[i] = -1;
		if (!bytes[i] || !len[i])
			continue;
		if (!(v->tok[i] = malloc(len[i])))
			goto nomem;
		memcpy(v->tok[i], bytes[i], len[i]);
		v->len[i] = len[i];
		int32_t at = 0;
		for (size_t k = 0; k < len[i]; k++)
			if ((at = trie_child(v, at, (uint8_t)bytes[i][k])) < 0)
				goto nomem;
		v->tok_next[i] = v->node[at].tok;
		v->node[at].tok = i;
	}
	*out = v;
	return LLM_OK;
nomem:
	llm_gvocab_free(v);
	return llm_fail(LLM_ERR_NOMEM, "grammar: vocabulary: out of memory");
}

int llm_gvocab_size(const struct llm_gvocab *v) { return v ? v->n : 0; }

const char *llm_gvocab_token(const struct llm_gvocab *v, int id, size_t *len)
{
	if (!v || id < 0 || id >= v->n)
		return NULL;
	*len = v->len[id];
	return v->tok[id];
}

/* ---- the recogniser ---------------------------------------------------- */

static int stk_reserve(struct llm_grammar *g, size_t need)
{
	return llm_array_reserve(&g->stk, &g->cap_stk, need, sizeof *g->stk) ? -1 : 0;
}

/* Whether configuration g->stk[0..n) was expanded already in this step
 * (then it adds nothing: its expansion depends on it alone), else noted. An
 * ambiguous grammar ((a|b?)* and the like) reaches one configuration by
 * many paths; without this their number grows exponentially. -1: no memory. */
static int visited(struct llm_grammar *g, size_t n)
{
	uint64_t h = llm_hash_fmix(llm_hash_fnv1a(LLM_FNV1A_INIT ^ n, g->stk, n * sizeof *g->stk)) | 1;
	if ((g->n_vis + 1) * 2 > g->cap_vis) {
		size_t cap = g->cap_vis ? g->cap_vis * 2 : 256;
		struct gvis *nv = calloc(cap, sizeof *nv);
		if (!nv)
			return -1;
		for (size_t i = 0; i < g->cap_vis; i++)
			if (g->vis[i].gen == g->gen) {
				size_t k = g->vis[i].h & (cap - 1);
				while (nv[k].gen == g->gen)
					k = (k + 1) & (cap - 1);
				nv[k] = g->vis[i];
			}
		free(g->vis);
		g->vis = nv;
		g->cap_vis = cap;
	}
	size_t k = h & (g->cap_vis - 1);
	for (; g->vis[k].gen == g->gen; k = (k + 1) & (g->cap_vis - 1))
		if (g->vis[k].h == h)
			return 1;
	g->vis[k].h = h;
	g->vis[k].gen = g->gen;
	g->n_vis++;
	return 0;
}

/* A new step: no configuration expanded yet. */
static void vis_reset(struct llm_grammar *g)
{
	g->gen++;
	g->n_vis = 0;
}

/* Expand the stack g->stk[0..n) into OUT: each configuration whose top is
 * an E_BYTES, or the empty stack. Leaves g->stk[0..n) as it found it. */
static int expand(struct llm_grammar *g, struct words *out, size_t n)
{
	if (n == 0)
		return words_push(out, 0);
	uint32_t p = g->stk[n - 1];
	const struct gel *e = &g->el[p];
	if (e->type == E_END)
		return expand(g, out, n - 1);
	if (e->type == E_BYTES) {
		if (out->n + n + 1 > MAX_SET) {
			g->overflow = 1;
			return -1;
		}
		if (words_reserve(out, out->n + n + 1))
			return -1;
		out->w[out->n++] = (uint32_t)n;
		memcpy(out->w + out->n, g->stk, n * sizeof *g->stk);
		out->n += n;
		return 0;
	}
	int seen = visited(g, n);
	if (seen)
		return seen < 0 ? -1 : 0;
	const struct grule *r = &g->rule[e->arg];
	size_t m = g->el[p + 1].type == E_END ? n - 1 : n;   /* a tail call replaces the frame */
	if (stk_reserve(g, m + 1))
		return -1;
	g->stk[n - 1] = p + 1;
	for (size_t a = 0; a < r->n_alt; a++) {
		g->stk[m] = r->alt[a];
		if (expand(g, out, m + 1))
			return -1;
	}
	g->stk[n - 1] = p;
	return 0;
}

/* Stacks compared by length, then element by element. */
static int stack_cmp(const uint32_t *w, size_t a, size_t b)
{
	if (w[a] != w[b])
		return w[a] < w[b] ? -1 : 1;
	for (uint32_t i = 1; i <= w[a]; i++)
		if (w[a + i] != w[b + i])
			return w[a + i] < w[b + i] ? -1 : 1;
	return 0;
}

static void sort_offs(const uint32_t *w, size_t *o, size_t *tmp, size_t n)
{
	if (n < 2)
		return;
	size_t h = n / 2, i = 0, j = h, k = 0;
	sort_offs(w, o, tmp, h);
	sort_offs(w, o + h, tmp, n - h);
	while (i < h && j < n)
		tmp[k++] = stack_cmp(w, o[j], o[i]) < 0 ? o[j++] : o[i++];
	while (i < h)
		tmp[k++] = o[i++];
	while (j < n)
		tmp[k++] = o[j++];
	memcpy(o, tmp, n * sizeof *o);
}

/* IN's stacks sorted, duplicates removed, into OUT. */
static int canon(struct llm_grammar *g, const struct words *in, struct words *out)
{
	size_t n = 0;
	for (size_t at = 0; at < in->n; at += in->w[at] + 1) {
		if (llm_array_reserve(&g->ord, &g->cap_ord, n + 1, sizeof *g->ord))
			return -1;
		g->ord[n++] = at;
	}
	if (llm_array_reserve(&g->ord2, &g->cap_ord2, n + 1, sizeof *g->ord2) || words_reserve(out, in->n))
		return -1;
	sort_offs(in->w, g->ord, g->ord2, n);
	out->n = 0;
	for (size_t i = 0; i < n; i++) {
		if (i && !stack_cmp(in->w, g->ord[i - 1], g->ord[i]))
			continue;
		size_t l = in->w[g->ord[i]] + 1;
		memcpy(out->w + out->n, in->w + g->ord[i], l * sizeof *out->w);
		out->n += l;
	}
	return 0;
}

/* The set after byte B from the N words at SET, canonical, into OUT (via g->tmp). */
static int step(struct llm_grammar *g, const uint32_t *set, size_t n, uint8_t b, struct words *out)
{
	g->tmp.n = 0;
	vis_reset(g);
	for (size_t at = 0; at < n; at += set[at] + 1) {
		uint32_t l = set[at];
		if (!l)
			continue;
		uint32_t top = set[at + l];
		if (!(g->bm[g->el[top].arg][b >> 3] >> (b & 7) & 1))
			continue;
		if (stk_reserve(g, l + 1))
			return -1;
		memcpy(g->stk, set + at + 1, l * sizeof *g->stk);
		g->stk[l - 1] = top + 1;
		if (expand(g, &g->tmp, l))
			return -1;
	}
	return canon(g, &g->tmp, out);
}

static uint64_t set_hash(const uint32_t *w, size_t n)
{
	return llm_hash_fmix(llm_hash_fnv1a(LLM_FNV1A_INIT, w, n * sizeof *w));
}

static int ht_grow(struct llm_grammar *g)
{
	size_t cap = g->ht_cap ? g->ht_cap * 2 : 1024;
	int32_t *t = malloc(cap * sizeof *t);
	if (!t)
		return -1;
	for (size_t i = 0; i < cap; i++)
		t[i] = -1;
	for (size_t s = 0; s < g->n_st; s++) {
		size_t h = set_hash(g->pool.w + g->st[s].off, g->st[s].len) & (cap - 1);
		while (t[h] >= 0)
			h = (h + 1) & (cap - 1);
		t[h] = (int32_t)s;
	}
	free(g->ht);
	g->ht = t;
	g->ht_cap = cap;
	return 0;
}

/* The state of canonical set SET (N words): found, or added. -1: no memory or too many. */
static int intern(struct llm_grammar *g, const uint32_t *set, size_t n)
{
	if ((g->n_st + 1) * 2 > g->ht_cap && ht_grow(g))
		return -1;
	size_t h = set_hash(set, n) & (g->ht_cap - 1);
	for (; g->ht[h] >= 0; h = (h + 1) & (g->ht_cap - 1)) {
		const struct gstate *s = &g->st[g->ht[h]];
		if (s->len == n && !memcmp(g->pool.w + s->off, set, n * sizeof *set))
			return g->ht[h];
	}
	if (g->pool.n + n > MAX_WORDS || n > INT32_MAX) {
		g->overflow = 1;
		return -1;
	}
	if (words_reserve(&g->pool, g->pool.n + n) ||
	    llm_array_reserve(&g->st, &g->cap_st, g->n_st + 1, sizeof *g->st))
		return -1;
	struct gstate *s = &g->st[g->n_st];
	memset(s, 0, sizeof *s);
	s->off = g->pool.n;
	s->len = n;
	memcpy(g->pool.w + g->pool.n, set, n * sizeof *set);
	g->pool.n += n;
	for (size_t at = 0; at < n; at += set[at] + 1) {
		if (set[at])
			s->more = 1;
		else
			s->accept = 1;
	}
	g->ht[h] = (int32_t)g->n_st;
	return (int)g->n_st++;
}

int llm_grammar_start(struct llm_grammar *g) { return g->start; }
const struct llm_gvocab *llm_grammar_vocab(const struct llm_grammar *g) { return g->voc; }

int llm_grammar_next(struct llm_grammar *g, int st, const void *bytes, size_t n)
{
	const uint8_t *b = bytes;
	for (size_t i = 0; i < n && st >= 0; i++) {
		struct gstate *s = &g->st[st];
		if (!s->next) {
			if (!(s->next = malloc(256 * sizeof *s->next))) {
				llm_fail(LLM_ERR_NOMEM, "grammar: out of memory");
				return -1;
			}
			for (int k = 0; k < 256; k++)
				s->next[k] = -2;
		}
		int32_t nx = s->next[b[i]];
		if (nx == -2) {
			if (step(g, g->pool.w + s->off, s->len, b[i], &g->can)) {
				llm_fail(LLM_ERR_NOMEM, "grammar: %s", g->overflow ? "state table full" : "out of memory");
				return -1;
			}
			nx = g->can.n ? intern(g, g->can.w, g->can.n) : -1;
			if (nx < 0 && g->can.n) {
				llm_fail(LLM_ERR_NOMEM, "grammar: %s", g->overflow ? "state table full" : "out of memory");
				return -1;
			}
			g->st[st].next[b[i]] = nx;
		}
		st = nx;
	}
	return st;
}

int llm_grammar_next_token(struct llm_grammar *g, int st, int id)
{
	size_t n;
	const char *b = llm_gvocab_token(g->voc, id, &n);
	return b && n ? llm_grammar_next(g, st, b, n) : -1;
}

int llm_grammar_accepts(const struct llm_grammar *g, int st) { return st >= 0 && g->st[st].accept; }
int llm_grammar_can_continue(const struct llm_grammar *g, int st) { return st >= 0 && g->st[st].more; }

int llm_grammar_match(struct llm_grammar *g, const void *text, size_t len)
{
	return llm_grammar_accepts(g, llm_grammar_next(g, g->start, text, len));
}

/* The tokens below trie node AT whose bytes the set at depth D takes. */
static int walk(struct llm_grammar *g, int32_t at, size_t d, uint8_t *mask, int *cnt)
{
	const struct llm_gvocab *v = g->voc;
	if (d + 1 >= g->n_lvl) {
		struct words *l = realloc(g->lvl, (g->n_lvl + 8) * sizeof *l);
		if (!l)
			return -1;
		memset(l + g->n_lvl, 0, 8 * sizeof *l);
		g->lvl = l;
		g->n_lvl += 8;
	}
	for (int32_t c = v->node[at].child; c >= 0; c = v->node[c].sib) {
		if (step(g, g->lvl[d].w, g->lvl[d].n, v->node[c].byte, &g->lvl[d + 1]))
			return -1;
		if (!g->lvl[d + 1].n)
			continue;
		for (int32_t t = v->node[c].tok; t >= 0; t = v->tok_next[t]) {
			mask[t] = 1;
			(*cnt)++;
		}
		if (v->node[c].child >= 0 && walk(g, c, d + 1, mask, cnt))
			return -1;
	}
	return 0;
}

enum llm_status llm_grammar_mask(struct llm_grammar *g, int st, const uint8_t **mask, int *n_allowed)
{
	if (!g->voc)
		return llm_fail(LLM_ERR_USAGE, "grammar: no vocabulary");
	struct gstate *s = &g->st[st];
	if (s->mask) {
		g->mask_hit++;
		*mask = s->mask;
		*n_allowed = s->n_allowed;
		return LLM_OK;
	}
	uint8_t *m = calloc((size_t)g->voc->n + 1, 1);
	if (!m)
		return llm_fail(LLM_ERR_NOMEM, "grammar: out of memory");
	int cnt = 0;
	if (!g->n_lvl && !(g->lvl = calloc(g->n_lvl = 8, sizeof *g->lvl)))
		g->n_lvl = 0;
	if (!g->n_lvl || words_reserve(&g->lvl[0], s->len)) {
		free(m);
		return llm_fail(LLM_ERR_NOMEM, "grammar: out of memory");
	}
	memcpy(g->lvl[0].w, g->pool.w + s->off, s->len * sizeof *g->lvl[0].w);
	g->lvl[0].n = s->len;
	if (walk(g, 0, 0, m, &cnt)) {
		free(m);
		return llm_fail(LLM_ERR_NOMEM, "grammar: %s", g->overflow ? "a state's stack set is too large" : "out of memory");
	}
	s = &g->st[st];
	s->mask = m;
	s->n_allowed = cnt;
	g->mask_miss++;
	*mask = m;
	*n_allowed = cnt;
	return LLM_OK;
}

void llm_grammar_stats(const struct llm_grammar *g, struct llm_grammar_stats *s)
{
	s->n_states = (long)g->n_st;
	s->mask_miss = g->mask_miss;
	s->mask_hit = g->mask_hit;
}

struct llm_grammar *llm_grammar_ref(struct llm_grammar *g)
{
	if (g)
		atomic_fetch_add(&g->refs, 1);
	return g;
}

static void grammar_free(struct llm_grammar *g)
{
	for (size_t i = 0; i < g->n_rule; i++)
		free(g->rule[i].alt);
	for (size_t i = 0; i < g->n_st; i++) {
		free(g->st[i].next);
		free(g->st[i].mask);
	}
	for (size_t i = 0; i < g->n_lvl; i++)
		free(g->lvl[i].w);
	free(g->lvl);
	free(g->el);
	free(g->bm);
	free(g->rule);
	free(g->st);
	free(g->pool.w);
	free(g->ht);
	free(g->stk);
	free(g->vis);
	free(g->tmp.w);
	free(g->can.w);
	free(g->ord);
	free(g->ord2);
	free(g);
}

void llm_grammar_unref(struct llm_grammar *g)
{
	if (g && atomic_fetch_sub(&g->refs, 1) == 1)
		grammar_free(g);
}

/* ---- the compiler ------------------------------------------------------ */

struct seq { struct gel *e; size_t n, cap; };

struct parser {
	struct llm_grammar *g;
	const char *p, *end;
	int line;
	enum llm_status st;
	int n_anon;
};

static int perr(struct parser *P, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int perr(struct parser *P, const char *fmt, ...)
{
	char m[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	if (!P->st)
		P->st = llm_fail(LLM_ERR_USAGE, "grammar: line %d: %s", P->line, m);
	return -1;
}

static int nomem(struct parser *P)
{
	if (!P->st)
		P->st = llm_fail(LLM_ERR_NOMEM, "grammar: out of memory");
	return -1;
}

static int seq_add(struct parser *P, struct seq *s, uint32_t type, uint32_t arg)
{
	if (llm_array_reserve(&s->e, &s->cap, s->n + 1, sizeof *s->e))
		return nomem(P);
	s->e[s->n++] = (struct gel){ type, arg };
	return 0;
}

static int seq_cat(struct parser *P, struct seq *s, const struct seq *t)
{
	for (size_t i = 0; i < t->n; i++)
		if (seq_add(P, s, t->e[i].type, t->e[i].arg))
			return -1;
	return 0;
}

/* A byte set: bit b of the 32 bytes. */
static int bm_new(struct parser *P, const uint8_t set[32])
{
	struct llm_grammar *g = P->g;
	if (llm_array_reserve(&g->bm, &g->cap_bm, g->n_bm + 1, sizeof *g->bm))
		return nomem(P);
	memcpy(g->bm[g->n_bm], set, 32);
	return (int)g->n_bm++;
}

static int add_byte_range(struct parser *P, struct seq *s, unsigned lo, unsigned hi)
{
	uint8_t set[32] = { 0 };
	for (unsigned b = lo; b <= hi; b++)
		set[b >> 3] |= (uint8_t)(1u << (b & 7));
	int k = bm_new(P, set);
	return k < 0 ? -1 : seq_add(P, s, E_BYTES, (uint32_t)k);
}

static int rule_new(struct parser *P, const char *name, size_t len)
{
	struct llm_grammar *g = P->g;
	if (llm_array_reserve(&g->rule, &g->cap_rule, g->n_rule + 1, sizeof *g->rule))
		return nomem(P);
	struct grule *r = &g->rule[g->n_rule];
	memset(r, 0, sizeof *r);
	snprintf(r->name, sizeof r->name, "%.*s", (int)len, name);
	r->line = P->line;
	return (int)g->n_rule++;
}

static int rule_get(struct parser *P, const char *name, size_t len)
{
	if (len >= sizeof P->g->rule[0].name)
		return perr(P, "rule name '%.*s' is too long", (int)len, name);
	for (size_t i = 0; i < P->g->n_rule; i++)
		if (strlen(P->g->rule[i].name) == len && !memcmp(P->g->rule[i].name, name, len))
			return (int)i;
	return rule_new(P, name, len);
}

static int rule_anon(struct parser *P)
{
	char nm[32];
	int n = snprintf(nm, sizeof nm, "_%d", P->n_anon++);
	int r = rule_new(P, nm, (size_t)n);
	if (r >= 0)
		P->g->rule[r].defined = 1;
	return r;
}

/* Append S (then E_END) as an alternative of rule R. */
static int alt_add(struct parser *P, int r, const struct seq *s)
{
	struct llm_grammar *g = P->g;
	if (llm_array_reserve(&g->el, &g->cap_el, g->n_el + s->n + 1, sizeof *g->el))
		return nomem(P);
	struct grule *ru = &g->rule[r];
	if (llm_array_reserve(&ru->alt, &ru->cap_alt, ru->n_alt + 1, sizeof *ru->alt))
		return nomem(P);
	ru->alt[ru->n_alt++] = (uint32_t)g->n_el;
	if (s->n)
		memcpy(g->el + g->n_el, s->e, s->n * sizeof *s->e);
	g->n_el += s->n;
	g->el[g->n_el++] = (struct gel){ E_END, 0 };
	return 0;
}

static int utf8_put(uint32_t c, uint8_t *b)
{
	if (c < 0x80) { b[0] = (uint8_t)c; return 1; }
	if (c < 0x800) { b[0] = (uint8_t)(0xC0 | c >> 6); b[1] = (uint8_t)(0x80 | (c & 0x3F)); return 2; }
	if (c < 0x10000) {
		b[0] = (uint8_t)(0xE0 | c >> 12); b[1] = (uint8_t)(0x80 | (c >> 6 & 0x3F)); b[2] = (uint8_t)(0x80 | (c & 0x3F));
		return 3;
	}
	b[0] = (uint8_t)(0xF0 | c >> 18); b[1] = (uint8_t)(0x80 | (c >> 12 & 0x3F));
	b[2] = (uint8_t)(0x80 | (c >> 6 & 0x3F)); b[3] = (uint8_t)(0x80 | (c & 0x3F));
	return 4;
}

/* The alternatives of rule R matching one character in [LO, HI] (not
 * ASCII): UTF-8 byte-range sequences, split where the encoded length or a
 * continuation byte's range changes (the standard construction). */
static int utf8_alts(struct parser *P, int r, uint32_t lo, uint32_t hi)
{
	static const uint32_t lim[] = { 0x7F, 0x7FF, 0xFFFF };
	if (lo > hi)
		return 0;
	if (lo <= 0xDFFF && hi >= 0xD800) {   /* surrogates are no characters */
		if (lo < 0xD800 && utf8_alts(P, r, lo, 0xD7FF))
			return -1;
		return hi > 0xDFFF ? utf8_alts(P, r, 0xE000, hi) : 0;
	}
	for (int i = 0; i < 3; i++)
		if (lo <= lim[i] && hi > lim[i])
			return utf8_alts(P, r, lo, lim[i]) || utf8_alts(P, r, lim[i] + 1, hi) ? -1 : 0;
	for (int i = 1; i < 4; i++) {
		uint32_t m = (1u << (6 * i)) - 1;
		if ((lo & ~m) != (hi & ~m)) {
			if (lo & m)
				return utf8_alts(P, r, lo, lo | m) || utf8_alts(P, r, (lo | m) + 1, hi) ? -1 : 0;
			if ((hi & m) != m)
				return utf8_alts(P, r, lo, (hi & ~m) - 1) || utf8_alts(P, r, hi & ~m, hi) ? -1 : 0;
		}
	}
	uint8_t a[4], b[4];
	int n = utf8_put(lo, a);
	utf8_put(hi, b);
	struct seq s = { 0 };
	int rc = 0;
	for (int i = 0; i < n && !rc; i++)
		rc = add_byte_range(P, &s, a[i], b[i]);
	if (!rc)
		rc = alt_add(P, r, &s);
	free(s.e);
	return rc;
}

struct range { uint32_t lo, hi; };

static int range_cmp(const void *a, const void *b)
{
	const struct range *x = a, *y = b;
	return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* One character of the set (N ranges, any order; NEG: its complement) as
 * items of S: one E_BYTES for an ASCII set, else a rule of alternatives. */
static int class_items(struct parser *P, struct seq *s, struct range *rg, size_t n, int neg)
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
	struct range cm[130];
	size_t k = 0;
	if (neg) {                        /* m ranges leave at most m + 1 gaps */
		if (m + 1 > sizeof cm / sizeof *cm)
			return perr(P, "character class of more than %zu ranges", sizeof cm / sizeof *cm - 1);
		uint32_t at = 0;
		for (size_t i = 0; i < m; i++) {
			if (rg[i].lo > at)
				cm[k++] = (struct range){ at, rg[i].lo - 1 };
			at = rg[i].hi + 1;
		}
		if (at <= 0x10FFFF)
			cm[k++] = (struct range){ at, 0x10FFFF };
		rg = cm;
		m = k;
	}
	if (!m)
		return perr(P, "character class matches nothing");
	uint8_t set[32] = { 0 };
	int ascii = 0, wide = 0;
	for (size_t i = 0; i < m; i++) {
		for (uint32_t c = rg[i].lo; c <= rg[i].hi && c < 0x80; c++) {
			set[c >> 3] |= (uint8_t)(1u << (c & 7));
			ascii = 1;
		}
		if (rg[i].hi >= 0x80)
			wide = 1;
	}
	if (!wide) {
		int b = bm_new(P, set);
		return b < 0 ? -1 : seq_add(P, s, E_BYTES, (uint32_t)b);
	}
	int r = rule_anon(P);
	if (r < 0)
		return -1;
	if (ascii) {
		int b = bm_new(P, set);
		struct seq a = { 0 };
		int rc = b < 0 || seq_add(P, &a, E_BYTES, (uint32_t)b) || alt_add(P, r, &a);
		free(a.e);
		if (rc)
			return -1;
	}
	for (size_t i = 0; i < m; i++)
		if (rg[i].hi >= 0x80 && utf8_alts(P, r, rg[i].lo < 0x80 ? 0x80 : rg[i].lo, rg[i].hi))
			return -1;
	return seq_add(P, s, E_REF, (uint32_t)r);
}

static int hexval(int c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
}

/* One character of a literal or class, escapes read: its code point, or -1. */
static long read_char(struct parser *P)
{
	const unsigned char *p = (const unsigned char *)P->p, *e = (const unsigned char *)P->end;
	if (p >= e)
		return perr(P, "unexpected end of text");
	if (*p == '\\') {
		if (p + 1 >= e)
			return perr(P, "unexpected end of text after '\\'");
		int c = p[1], nd = c == 'x' ? 2 : c == 'u' ? 4 : c == 'U' ? 8 : 0;
		P->p += 2;
		if (nd) {
			long v = 0;
			for (int i = 0; i < nd; i++) {
				int h = P->p < P->end ? hexval((unsigned char)*P->p) : -1;
				if (h < 0)
					return perr(P, "\\%c needs %d hex digits", c, nd);
				v = v * 16 + h;
				P->p++;
			}
			if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
				return perr(P, "\\%c%0*lX is not a character", c, nd, v);
			return v;
		}
		switch (c) {
		case 'n': return '\n';
		case 'r': return '\r';
		case 't': return '\t';
		case '\\': case '"': case '\'': case ']': case '[': case '-': case '^': return c;
		default: return perr(P, "unknown escape '\\%c'", c);
		}
	}
	int n = *p < 0x80 ? 1 : (*p & 0xE0) == 0xC0 ? 2 : (*p & 0xF0) == 0xE0 ? 3 : (*p & 0xF8) == 0xF0 ? 4 : 0;
	if (!n || p + n > e)
		return perr(P, "invalid UTF-8");
	long v = n == 1 ? *p : *p & (0x7F >> n);
	for (int i = 1; i < n; i++) {
		if ((p[i] & 0xC0) != 0x80)
			return perr(P, "invalid UTF-8");
		v = v << 6 | (p[i] & 0x3F);
	}
	if (v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF) || v < (n == 2 ? 0x80 : n == 3 ? 0x800 : n == 4 ? 0x10000 : 0))
		return perr(P, "invalid UTF-8");   /* beyond Unicode, a surrogate, or overlong */
	if (*p == '\n')
		P->line++;
	P->p += n;
	return v;
}

static void skip_ws(struct parser *P)
{
	while (P->p < P->end) {
		if (*P->p == '#') {
			while (P->p < P->end && *P->p != '\n')
				P->p++;
		} else if (*P->p == ' ' || *P->p == '\t' || *P->p == '\r' || *P->p == '\n') {
			if (*P->p == '\n')
				P->line++;
			P->p++;
		} else {
			break;
		}
	}
}

static int is_name(int c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == '-'; }

static size_t name_len(const char *p, const char *e)
{
	size_t n = 0;
	while (p + n < e && is_name((unsigned char)p[n]))
		n++;
	return n;
}

/* Whether a rule definition (NAME ::=) starts at P->p. */
static int at_definition(const struct parser *P)
{
	size_t n = name_len(P->p, P->end);
	const char *q = P->p + n;
	if (!n)
		return 0;
	while (q < P->end && (*q == ' ' || *q == '\t'))
		q++;
	return P->end - q >= 3 && !memcmp(q, "::=", 3);
}

static int parse_alts(struct parser *P, int r, int nested);

/* ITEM repeated MIN to MAX (-1: no bound) times, appended to S. */
static int repeat(struct parser *P, struct seq *s, struct seq *item, long min, long max)
{
	struct seq one = { 0 }, alt = { 0 };
	int rc = -1;
	if (item->n != 1) {               /* one element to copy: the item as a rule */
		int w = rule_anon(P);
		if (w < 0 || alt_add(P, w, item) || seq_add(P, &one, E_REF, (uint32_t)w))
			goto out;
	} else if (seq_cat(P, &one, item)) {
		goto out;
	}
	for (long i = 0; i < min; i++)
		if (seq_cat(P, s, &one))
			goto out;
	if (max < 0) {                    /* R ::= x R | "" */
		int r = rule_anon(P);
		if (r < 0 || seq_cat(P, &alt, &one) || seq_add(P, &alt, E_REF, (uint32_t)r) || alt_add(P, r, &alt))
			goto out;
		alt.n = 0;
		if (alt_add(P, r, &alt) || seq_add(P, s, E_REF, (uint32_t)r))
			goto out;
	} else {                          /* O_j ::= x O_j-1 | "" */
		int prev = -1;
		for (long j = min; j < max; j++) {
			int r = rule_anon(P);
			alt.n = 0;
			if (r < 0 || seq_cat(P, &alt, &one) || (prev >= 0 && seq_add(P, &alt, E_REF, (uint32_t)prev)) ||
			    alt_add(P, r, &alt))
				goto out;
			alt.n = 0;
			if (alt_add(P, r, &alt))
				goto out;
			prev = r;
		}
		if (prev >= 0 && seq_add(P, s, E_REF, (uint32_t)prev))
			goto out;
	}
	rc = 0;
out:
	free(one.e);
	free(alt.e);
	return rc;
}

static int read_count(struct parser *P, long *v)
{
	long x = 0;
	int n = 0;
	while (P->p < P->end && *P->p >= '0' && *P->p <= '9' && n < 6) {
		x = x * 10 + (*P->p++ - '0');
		n++;
	}
	if (!n)
		return perr(P, "expected a number in {m,n}");
	*v = x;
	return 0;
}

/* One item and its repetition, appended to S. */
static int parse_item(struct parser *P, struct seq *s)
{
	struct seq it = { 0 };
	int rc = -1;
	char c = *P->p;
	if (c == '"') {
		P->p++;
		while (P->p < P->end && *P->p != '"') {
			long ch = read_char(P);
			uint8_t b[4];
			if (ch < 0)
				goto out;
			int n = utf8_put((uint32_t)ch, b);
			for (int i = 0; i < n; i++)
				if (add_byte_range(P, &it, b[i], b[i]))
					goto out;
		}
		if (P->p >= P->end) {
			perr(P, "unterminated string literal");
			goto out;
		}
		P->p++;
	} else if (c == '[' || c == '.') {
		struct range rg[129];
		size_t n = 0;
		int neg = 0;
		if (c == '.') {
			P->p++;
			rg[n++] = (struct range){ 0, 0x10FFFF };
		} else {
			P->p++;
			if (P->p < P->end && *P->p == '^') {
				neg = 1;
				P->p++;
			}
			while (P->p < P->end && *P->p != ']') {
				long lo = read_char(P), hi = lo;
				if (lo < 0)
					goto out;
				if (P->end - P->p >= 2 && P->p[0] == '-' && P->p[1] != ']') {
					P->p++;
					if ((hi = read_char(P)) < 0)
						goto out;
					if (hi < lo) {
						perr(P, "range %lX-%lX is backwards", lo, hi);
						goto out;
					}
				}
				if (n == sizeof rg / sizeof *rg) {
					perr(P, "character class of more than %zu ranges", n);
					goto out;
				}
				rg[n++] = (struct range){ (uint32_t)lo, (uint32_t)hi };
			}
			if (P->p >= P->end) {
				perr(P, "unterminated character class");
				goto out;
			}
			P->p++;
			if (!n && !neg) {
				perr(P, "empty character class");
				goto out;
			}
		}
		if (class_items(P, &it, rg, n, neg))
			goto out;
	} else if (c == '(') {
		P->p++;
		int r = rule_anon(P);
		if (r < 0 || parse_alts(P, r, 1))
			goto out;
		skip_ws(P);
		if (P->p >= P->end || *P->p != ')') {
			perr(P, "expected ')'");
			goto out;
		}
		P->p++;
		if (seq_add(P, &it, E_REF, (uint32_t)r))
			goto out;
	} else if (is_name((unsigned char)c)) {
		size_t n = name_len(P->p, P->end);
		int r = rule_get(P, P->p, n);
		P->p += n;
		if (r < 0 || seq_add(P, &it, E_REF, (uint32_t)r))
			goto out;
	} else {
		perr(P, "unexpected '%c'", c);
		goto out;
	}
	/* repetition */
	long min = 1, max = 1;
	if (P->p < P->end && (*P->p == '?' || *P->p == '*' || *P->p == '+')) {
		min = *P->p == '+';
		max = *P->p == '?' ? 1 : -1;
		P->p++;
	} else if (P->p < P->end && *P->p == '{') {
		P->p++;
		if (read_count(P, &min))
			goto out;
		max = min;
		if (P->p < P->end && *P->p == ',') {
			P->p++;
			max = -1;
			if (P->p < P->end && *P->p != '}' && read_count(P, &max))
				goto out;
		}
		if (P->p >= P->end || *P->p != '}') {
			perr(P, "expected '}'");
			goto out;
		}
		P->p++;
		if ((max >= 0 && max < min) || min > 10000 || max > 10000) {
			perr(P, "bad repetition {%ld,%ld} (0 <= m <= n <= 10000)", min, max);
			goto out;
		}
	}
	rc = min == 1 && max == 1 ? seq_cat(P, s, &it) : repeat(P, s, &it, min, max);
out:
	free(it.e);
	return rc;
}

static int parse_seq(struct parser *P, struct seq *s, int nested)
{
	for (;;) {
		skip_ws(P);
		if (P->p >= P->end || *P->p == '|' || *P->p == ')')
			return 0;
		if (at_definition(P)) {
			if (nested)
				return perr(P, "expected ')' before the next rule");
			return 0;
		}
		if (parse_item(P, s))
			return -1;
	}
}

static int parse_alts(struct parser *P, int r, int nested)
{
	struct seq s = { 0 };
	int rc = 0;
	for (;;) {
		s.n = 0;
		if ((rc = parse_seq(P, &s, nested)) || (rc = alt_add(P, r, &s)))
			break;
		skip_ws(P);
		if (P->p < P->end && *P->p == '|') {
			P->p++;
			continue;
		}
		break;
	}
	free(s.e);
	return rc;
}

/* Undefined rules and left recursion (which the recogniser cannot expand). */
static int check_rules(struct parser *P)
{
	struct llm_grammar *g = P->g;
	size_t n = g->n_rule;
	for (size_t i = 0; i < n; i++)
		if (!g->rule[i].defined) {
			P->line = g->rule[i].line;
			return perr(P, "rule '%s' is not defined", g->rule[i].name);
		}
	uint8_t *nul = calloc(n, 1);
	int rc = 0;
	if (!nul)
		return nomem(P);
	for (int changed = 1; changed; ) {   /* nullable rules, to a fixed point */
		changed = 0;
		for (size_t i = 0; i < n; i++)
			for (size_t a = 0; !nul[i] && a < g->rule[i].n_alt; a++) {
				uint32_t p = g->rule[i].alt[a];
				while (g->el[p].type == E_REF && nul[g->el[p].arg])
					p++;
				if (g->el[p].type == E_END)
					nul[i] = changed = 1;
			}
	}
	/* left edges i -> j; a rule that reaches itself through them is left-recursive:
	 * found by iterating reachability from each rule (the grammars are small) */
	uint8_t *reach = calloc(n, 1);
	size_t *todo = malloc((n + 1) * sizeof *todo);
	if (!reach || !todo) {
		rc = nomem(P);
		goto out;
	}
	for (size_t i = 0; i < n && !rc; i++) {
		memset(reach, 0, n);
		size_t nt = 0;
		todo[nt++] = i;
		while (nt && !rc) {
			size_t u = todo[--nt];
			for (size_t a = 0; a < g->rule[u].n_alt; a++)
				for (uint32_t p = g->rule[u].alt[a]; g->el[p].type == E_REF; p++) {
					uint32_t v = g->el[p].arg;
					if (v == i) {
						P->line = g->rule[i].line;
						rc = g->rule[i].name[0] == '_' ?   /* a group or repetition's rule */
						     perr(P, "left recursion: a repetition of an item that can be empty, as (x?)*, "
						          "or a group that starts with its own rule") :
						     perr(P, "rule '%s' is left-recursive", g->rule[i].name);
						break;
					}
					if (!reach[v]) {
						reach[v] = 1;
						todo[nt++] = v;
					}
					if (!nul[v])
						break;
				}
		}
	}
out:
	free(reach), free(todo), free(nul);
	return rc;
}

enum llm_status llm_grammar_compile(struct llm_grammar **out, const char *src, size_t len, const struct llm_gvocab *v)
{
	*out = NULL;
	struct llm_grammar *g = calloc(1, sizeof *g);
	if (!g)
		return llm_fail(LLM_ERR_NOMEM, "grammar: out of memory");
	atomic_init(&g->refs, 1);
	g->voc = v;
	struct parser P = { .g = g, .p = src, .end = src + len, .line = 1 };
	int root = rule_get(&P, "root", 4);
	while (!P.st) {
		skip_ws(&P);
		if (P.p >= P.end)
			break;
		size_t n = name_len(P.p, P.end);
		if (!at_definition(&P)) {
			perr(&P, "expected a rule: NAME ::= ...");
			break;
		}
		int r = rule_get(&P, P.p, n);
		if (r < 0)
			break;
		if (g->rule[r].defined) {
			perr(&P, "rule '%s' is defined twice", g->rule[r].name);
			break;
		}
		g->rule[r].defined = 1;
		g->rule[r].line = P.line;
		P.p += n;                 /* then blanks and "::=", as at_definition saw */
		while (*P.p != ':')
			P.p++;
		P.p += 3;
		if (parse_alts(&P, r, 0))
			break;
		if (P.p < P.end && *P.p == ')')
			perr(&P, "unmatched ')'");
	}
	if (!P.st && !g->rule[root].defined) {
		P.line = 1;
		perr(&P, "no rule 'root'");
	}
	if (!P.st)
		check_rules(&P);
	/* the start: a frame that enters root and ends */
	struct seq s0 = { 0 };
	size_t at = g->n_el;
	if (!P.st && !seq_add(&P, &s0, E_REF, (uint32_t)root) &&
	    !llm_array_reserve(&g->el, &g->cap_el, g->n_el + 2, sizeof *g->el)) {
		g->el[g->n_el++] = s0.e[0];
		g->el[g->n_el++] = (struct gel){ E_END, 0 };
	} else if (!P.st) {
		nomem(&P);
	}
	free(s0.e);
	if (!P.st) {
		g->tmp.n = 0;
		if (stk_reserve(g, 1))
			nomem(&P);
		else {
			g->stk[0] = (uint32_t)at;
			vis_reset(g);
			if (expand(g, &g->tmp, 1) || canon(g, &g->tmp, &g->can) || (g->start = intern(g, g->can.w, g->can.n)) < 0) {
				if (g->overflow)
					perr(&P, "the grammar is too ambiguous (its start has more than %zu stack words)", MAX_SET);
				else
					nomem(&P);
			}
		}
	}
	if (P.st) {
		grammar_free(g);
		return P.st;
	}
	*out = g;
	return LLM_OK;
}

enum llm_status llm_grammar_compile_cached(struct llm_grammar **out, const char *src, size_t len, struct llm_gvocab *v)
{
	uint64_t h = llm_hash_fnv1a(LLM_FNV1A_INIT, src, len);
	pthread_mutex_lock(&v->mu);
	for (int i = 0; i < LLM_GRAMMAR_CACHE; i++) {
		struct gcache *c = &v->cache[i];
		if (c->g && c->h == h && c->len == len && !memcmp(c->text, src, len)) {
			c->use = ++v->clock;
			*out = llm_grammar_ref(c->g);
			pthread_mutex_unlock(&v->mu);
			return LLM_OK;
		}
	}
	pthread_mutex_unlock(&v->mu);
	/* compiled outside the lock; two threads may both compile a new text,
	 * and the second one's replaces the first in the cache */
	LLM_TRY(llm_grammar_compile(out, src, len, v));
	char *t = malloc(len + 1);
	if (!t)
		return LLM_OK;            /* not kept: still compiled */
	memcpy(t, src, len);
	pthread_mutex_lock(&v->mu);
	struct gcache *old = &v->cache[0];   /* a free entry, else the least recently used */
	for (int i = 1; i < LLM_GRAMMAR_CACHE; i++)
		if (!v->cache[i].g || (old->g && v->cache[i].use < old->use))
			old = &v->cache[i];
	struct llm_grammar *drop = old->g;
	free(old->text);
	*old = (struct gcache){ .h = h, .text = t, .len = len, .g = llm_grammar_ref(*out), .use = ++v->clock };
	pthread_mutex_unlock(&v->mu);
	llm_grammar_unref(drop);
	return LLM_OK;
}
