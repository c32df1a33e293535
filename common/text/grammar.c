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
	int32_t *next;                    /* the transitions known: up to TR_LIST of them a list, each
	                                   * byte | state << 8; then a table of 256, -2 unknown, -1
	                                   * refused, else a state */
	int n_next;                       /* in the list; TR_FULL: the table */
	uint32_t no[8];                   /* the bytes known refused (while a list) */
	uint32_t *mask;                   /* NULL until asked; the allowed ids (n_allowed), or when
	                                   * mask_bits a bitset of the vocabulary ((n + 31) / 32 words) */
	int n_allowed, mask_bits;
};

struct gvis { uint64_t h, gen; };

/* A growable array of words: a stack set is stacks [len, e_0 .. e_len-1] one after another. */
struct words { uint32_t *w; size_t n, cap; };

#define MAX_SET ((size_t)1 << 20)     /* words of one state's stack set */

#define TR_LIST 16                    /* transitions kept as a list before a state gets a table */
#define TR_FULL (-1)
#define MAX_STATES ((1 << 23) - 1)    /* a state fits a transition list's 24 bits, as an int32 */

/* Why a computation stopped short (g->overflow; grammar.h's budgets). */
enum { OVF_NONE, OVF_SET, OVF_WORK, OVF_MEM, OVF_TIME, OVF_CANCEL };

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
	struct words todo;                /* expand's configurations still to expand */
	int start, overflow;
	long mask_hit, mask_miss;
	int32_t byte_bm[256];             /* the bitmap of one byte, shared by literals; -1 none yet */
	int32_t *rht;                     /* (rht_cap) named rules by name hash: rule index or -1 */
	size_t rht_cap, n_named;
	/* the budget */
	size_t max_bytes, held;           /* held: alternatives, masks and transition tables (the rest
	                                   * is counted from the arrays' capacities) */
	size_t work, work_left;           /* per computation; left of the current one */
	size_t work_peak;                 /* the most one computation took */
	size_t polled;                    /* work_left at the last poll of the compile's deadline */
	const struct llm_grammar_budget *bud;   /* while compiling: deadline and cancel test */
	atomic_size_t bytes_pub;          /* grammar_bytes after the last computation, for the cache's
	                                   * thread (the owner's thread changes the rest) */
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

/* Whether configuration C[0..n) was expanded already in this step (then
 * it adds nothing: its expansion depends on it alone), else noted. An
 * ambiguous grammar ((a|b?)* and the like) reaches one configuration by
 * many paths; without this their number grows exponentially. -1: no memory. */
static int visited(struct llm_grammar *g, const uint32_t *c, size_t n)
{
	uint64_t h = llm_hash_fmix(llm_hash_fnv1a(LLM_FNV1A_INIT ^ n, c, n * sizeof *c)) | 1;
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

/* The grammar's memory: its arrays by capacity, plus what g->held counts. */
static size_t grammar_bytes(const struct llm_grammar *g)
{
	return sizeof *g + g->cap_el * sizeof *g->el + g->cap_bm * sizeof *g->bm + g->cap_rule * sizeof *g->rule +
	       g->cap_st * sizeof *g->st + g->pool.cap * sizeof *g->pool.w + g->ht_cap * sizeof *g->ht +
	       g->rht_cap * sizeof *g->rht + (g->cap_stk + g->tmp.cap + g->can.cap + g->todo.cap) * sizeof(uint32_t) +
	       (g->cap_ord + g->cap_ord2) * sizeof(size_t) + g->cap_vis * sizeof *g->vis + g->held;
}

/* Whether the memory budget holds N more bytes (else g->overflow). */
static int mem_ok(struct llm_grammar *g, size_t n)
{
	if (grammar_bytes(g) + n > g->max_bytes) {
		g->overflow = OVF_MEM;
		return 0;
	}
	return 1;
}

/* While compiling: whether the deadline has passed or the client left
 * (then g->overflow). */
static int poll_gone(struct llm_grammar *g)
{
	const struct llm_grammar_budget *b = g->bud;
	if (!b)
		return 0;
	if (b->deadline > 0 && llm_now() > b->deadline)
		g->overflow = OVF_TIME;
	else if (b->cancel && b->cancel(b->arg))
		g->overflow = OVF_CANCEL;
	return g->overflow != OVF_NONE;
}

/* The work budget: N more words copied; 0 within it, else -1 with
 * g->overflow set (the caller's message names the budget). Every 2^16
 * words a compile polls its deadline and its client. */
static int spend(struct llm_grammar *g, size_t n)
{
	if (n > g->work_left) {
		g->overflow = OVF_WORK;
		return -1;
	}
	g->work_left -= n;
	if (g->bud && g->polled - g->work_left >= (1u << 16)) {
		g->polled = g->work_left;
		if (poll_gone(g))
			return -1;
	}
	return 0;
}

/* A new computation (a state's transition or mask, the start): the whole work budget. */
static void work_reset(struct llm_grammar *g)
{
	if (g->work - g->work_left > g->work_peak)
		g->work_peak = g->work - g->work_left;
	g->work_left = g->polled = g->work;
	g->overflow = OVF_NONE;
}

/* What stopped a computation, for its message. */
static const char *ovf_msg(const struct llm_grammar *g, char *m, size_t n)
{
	switch (g->overflow) {
	case OVF_SET: snprintf(m, n, "a state holds more than %zu stack words (the grammar is too ambiguous)", MAX_SET); break;
	case OVF_WORK: snprintf(m, n, "a state's computation passed the work budget (%zu stack words; the grammar "
	                        "is too ambiguous)", g->work); break;
	case OVF_MEM:
		if (g->max_bytes >= (1u << 20))
			snprintf(m, n, "the grammar passed its memory budget (%zu MiB)", g->max_bytes >> 20);
		else
			snprintf(m, n, "the grammar passed its memory budget (%zu bytes)", g->max_bytes);
		break;
	case OVF_TIME: snprintf(m, n, "the compile passed its time budget"); break;
	case OVF_CANCEL: snprintf(m, n, "the compile was given up (its client has gone)"); break;
	default: snprintf(m, n, "out of memory");
	}
	return m;
}

/* Expand the stack g->stk[0..n) into OUT: each configuration whose top is
 * an E_BYTES, or the empty stack. Iterative: the configurations still to
 * expand wait on g->todo, each as its words then its length (the last one
 * on top), so the depth of the grammar never becomes depth of the C stack
 * (nested repetitions chain thousands of nullable rules). */
static int expand(struct llm_grammar *g, struct words *out, size_t n)
{
	struct words *w = &g->todo;
	w->n = 0;
	if (words_reserve(w, n + 1))
		return -1;
	memcpy(w->w, g->stk, n * sizeof *g->stk);
	w->w[n] = (uint32_t)n;
	w->n = n + 1;
	while (w->n) {
		size_t len = w->w[w->n - 1], at = w->n - 1 - len;
		while (len && g->el[w->w[at + len - 1]].type == E_END)
			len--;                    /* a rule's alternative ended: on to its caller */
		if (!len) {
			w->n = at;
			if (words_push(out, 0))
				return -1;
			continue;
		}
		uint32_t p = w->w[at + len - 1];
		const struct gel *e = &g->el[p];
		if (e->type == E_BYTES) {
			if (out->n + len + 1 > MAX_SET) {
				g->overflow = OVF_SET;
				return -1;
			}
			if (spend(g, len + 1) || words_reserve(out, out->n + len + 1))
				return -1;
			out->w[out->n++] = (uint32_t)len;
			memcpy(out->w + out->n, w->w + at, len * sizeof *w->w);
			out->n += len;
			w->n = at;
			continue;
		}
		int seen = visited(g, w->w + at, len);
		if (seen) {
			w->n = at;
			if (seen < 0)
				return -1;
			continue;
		}
		const struct grule *r = &g->rule[e->arg];
		size_t m = g->el[p + 1].type == E_END ? len - 1 : len;   /* a tail call replaces the frame */
		size_t na = r->n_alt, each = m + 2;
		if (spend(g, na * each) || words_reserve(w, at + na * each))
			return -1;
		w->w[at + len - 1] = p + 1;
		/* the alternatives, each the frames below, then its first element */
		for (size_t a = na; a-- > 0; ) {
			uint32_t *d = w->w + at + a * each;
			if (a)
				memmove(d, w->w + at, m * sizeof *d);
			d[m] = r->alt[a];
			d[m + 1] = (uint32_t)(m + 1);
		}
		w->n = at + na * each;
	}
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
	size_t n_stk = 0;
	for (size_t at = 0; at < n; at += set[at] + 1) {
		uint32_t l = set[at];
		n_stk++;
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
	if (spend(g, n_stk))          /* the scan of the set's tops is work too */
		return -1;
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
	if (n > INT32_MAX || g->n_st >= MAX_STATES || !mem_ok(g, (n + g->pool.n < g->pool.cap ? 0 : g->pool.cap * sizeof *g->pool.w) +
	                             2 * sizeof *g->st)) {
		if (!g->overflow)
			g->overflow = OVF_SET;
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

/* State S's transition on byte B: a state, -1 refused, -2 not known yet. */
static int tr_get(const struct gstate *s, uint8_t b)
{
	if (s->n_next == TR_FULL)
		return s->next[b];
	if (s->no[b >> 5] >> (b & 31) & 1)
		return -1;
	for (int i = 0; i < s->n_next; i++)
		if ((s->next[i] & 0xFF) == b)
			return (int)((uint32_t)s->next[i] >> 8);
	return -2;
}

/* Note S's transition on B to NX (a state or -1): a refusal in its
 * bitmap, a state in its list while that is short (most states have a
 * few), else in a table. -1: no memory. */
static int tr_set(struct llm_grammar *g, struct gstate *s, uint8_t b, int nx)
{
	if (s->n_next == TR_FULL) {
		s->next[b] = nx;
		return 0;
	}
	if (nx < 0) {
		s->no[b >> 5] |= 1u << (b & 31);
		return 0;
	}
	if (s->n_next < TR_LIST) {
		int cap = s->n_next;
		if (!cap || (cap >= 2 && !(cap & (cap - 1)))) {   /* 0, 2, 4, 8 held: full, grow */
			int nc = cap ? cap * 2 : 2;
			int32_t *t = mem_ok(g, (size_t)(nc - cap) * sizeof *t) ? realloc(s->next, (size_t)nc * sizeof *t) : NULL;
			if (!t)
				return -1;
			s->next = t;
			g->held += (size_t)(nc - cap) * sizeof *t;
		}
		s->next[s->n_next++] = (int32_t)((uint32_t)b | (uint32_t)nx << 8);
		return 0;
	}
	int32_t *t = mem_ok(g, 256 * sizeof *t) ? malloc(256 * sizeof *t) : NULL;
	if (!t)
		return -1;
	for (int k = 0; k < 256; k++)
		t[k] = s->no[k >> 5] >> (k & 31) & 1 ? -1 : -2;
	for (int i = 0; i < s->n_next; i++)
		t[s->next[i] & 0xFF] = (int32_t)((uint32_t)s->next[i] >> 8);
	t[b] = nx;
	free(s->next);
	g->held += (256 - TR_LIST) * sizeof *t;
	s->next = t;
	s->n_next = TR_FULL;
	return 0;
}

/* The state after byte B from state ST: from ST's transitions, else
 * computed (within what is left of the work budget) and kept. -1: refused;
 * -2: a budget or memory ran out (g->overflow says which). */
static int trans(struct llm_grammar *g, int st, uint8_t b)
{
	int nx = tr_get(&g->st[st], b);
	if (nx != -2)
		return nx;
	struct gstate *s = &g->st[st];
	if (step(g, g->pool.w + s->off, s->len, b, &g->can))
		return -2;
	nx = g->can.n ? intern(g, g->can.w, g->can.n) : -1;
	if (nx < 0 && g->can.n)
		return -2;
	return tr_set(g, &g->st[st], b, nx) ? -2 : nx;
}

/* The one byte state ST allows, when it allows one and is not a whole
 * sentence; else -1. */
static int forced_byte(const struct llm_grammar *g, int st)
{
	const struct gstate *s = &g->st[st];
	const uint32_t *w = g->pool.w + s->off;
	uint8_t any[32] = { 0 };
	if (s->accept)
		return -1;
	for (size_t at = 0; at < s->len; at += w[at] + 1)
		for (int k = 0; k < 32; k++)
			any[k] |= g->bm[g->el[w[at + w[at]]].arg][k];
	int one = -1;
	for (int b = 0; b < 256; b++)
		if (any[b >> 3] >> (b & 7) & 1) {
			if (one >= 0)
				return -1;
			one = b;
		}
	return one;
}

int llm_grammar_next(struct llm_grammar *g, int st, const void *bytes, size_t n)
{
	const uint8_t *b = bytes;
	for (size_t i = 0; i < n && st >= 0; i++) {
		if (tr_get(&g->st[st], b[i]) == -2)
			work_reset(g);        /* a new transition: the whole budget */
		if ((st = trans(g, st, b[i])) == -2) {
			char m[160];
			llm_fail(LLM_ERR_NOMEM, "grammar: %s", ovf_msg(g, m, sizeof m));
			return -1;
		}
	}
	atomic_store(&g->bytes_pub, grammar_bytes(g));
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

/* The tokens below trie node AT whose bytes state ST takes, by the
 * states' transitions (kept: a walk inside a JSON string comes back to one
 * state after each character, so most of the vocabulary costs a lookup).
 * Recursion as deep as the longest token (the tokenizer's, not the
 * grammar's). -1: a budget or memory ran out. */
static int walk(struct llm_grammar *g, int32_t at, int st, uint8_t *mask, int *cnt)
{
	const struct llm_gvocab *v = g->voc;
	for (int32_t c = v->node[at].child; c >= 0; c = v->node[c].sib) {
		int nx = trans(g, st, v->node[c].byte);
		if (nx == -2)
			return -1;
		if (nx < 0)
			continue;
		for (int32_t t = v->node[c].tok; t >= 0; t = v->tok_next[t]) {
			mask[t] = 1;
			(*cnt)++;
		}
		if (v->node[c].child >= 0 && walk(g, c, nx, mask, cnt))
			return -1;
	}
	return 0;
}

/* The mask of state S kept compact from the byte mask M (N tokens, CNT allowed). */
static int mask_keep(struct llm_grammar *g, struct gstate *s, const uint8_t *m, int n, int cnt)
{
	size_t nw = ((size_t)n + 31) / 32, list = (size_t)cnt;
	int bits = list > nw;
	size_t words = bits ? nw : list;
	if (!mem_ok(g, words * 4) || !(s->mask = malloc((words ? words : 1) * 4)))
		return -1;
	g->held += words * 4;
	if (bits) {
		memset(s->mask, 0, nw * 4);
		for (int t = 0; t < n; t++)
			if (m[t])
				s->mask[t >> 5] |= 1u << (t & 31);
	} else {
		size_t k = 0;
		for (int t = 0; t < n; t++)
			if (m[t])
				s->mask[k++] = (uint32_t)t;
	}
	s->mask_bits = bits;
	s->n_allowed = cnt;
	return 0;
}

/* State S's kept mask written out as bytes into M (N tokens). */
static void mask_put(const struct gstate *s, uint8_t *m, int n)
{
	if (s->mask_bits) {
		for (int t = 0; t < n; t++)
			m[t] = (uint8_t)(s->mask[t >> 5] >> (t & 31) & 1);
		return;
	}
	memset(m, 0, (size_t)n);
	for (int k = 0; k < s->n_allowed; k++)
		m[s->mask[k]] = 1;
}

enum llm_status llm_grammar_mask(struct llm_grammar *g, int st, uint8_t *mask, int *n_allowed)
{
	if (!g->voc)
		return llm_fail(LLM_ERR_USAGE, "grammar: no vocabulary");
	int n = g->voc->n;
	struct gstate *s = &g->st[st];
	if (s->mask) {
		g->mask_hit++;
		mask_put(s, mask, n);
		*n_allowed = s->n_allowed;
		return LLM_OK;
	}
	char msg[160];
	memset(mask, 0, (size_t)n);
	int cnt = 0;
	work_reset(g);
	if (walk(g, 0, st, mask, &cnt))
		return llm_fail(g->overflow ? LLM_ERR_RANGE : LLM_ERR_NOMEM, "grammar: %s", ovf_msg(g, msg, sizeof msg));
	s = &g->st[st];
	if (mask_keep(g, s, mask, n, cnt))
		return llm_fail(g->overflow ? LLM_ERR_RANGE : LLM_ERR_NOMEM, "grammar: %s", ovf_msg(g, msg, sizeof msg));
	g->mask_miss++;
	*n_allowed = cnt;
	atomic_store(&g->bytes_pub, grammar_bytes(g));
	return LLM_OK;
}

void llm_grammar_stats(const struct llm_grammar *g, struct llm_grammar_stats *s)
{
	s->n_states = (long)g->n_st;
	s->mask_miss = g->mask_miss;
	s->mask_hit = g->mask_hit;
	s->bytes = grammar_bytes(g);
	s->work_peak = g->work_peak > g->work - g->work_left ? g->work_peak : g->work - g->work_left;
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
	free(g->todo.w);
	free(g->rht);
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
	int depth;                        /* groups open: parse_item and parse_alts recurse per group */
	unsigned long n_alt;              /* alternatives added, for polling the budget's deadline */
};

static int perr_budget(struct parser *P);
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

/* A budget spent while compiling (g->overflow says which): a usage error naming it. */
static int perr_budget(struct parser *P)
{
	char m[160];
	if (!P->st)
		P->st = llm_fail(LLM_ERR_USAGE, "grammar: %s", ovf_msg(P->g, m, sizeof m));
	return -1;
}

static int seq_add(struct parser *P, struct seq *s, uint32_t type, uint32_t arg)
{
	if (s->n + 1 > s->cap && !mem_ok(P->g, 2 * (s->n + 1) * sizeof *s->e))   /* a sequence becomes elements */
		return perr_budget(P);
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
	if (!mem_ok(g, sizeof *g->bm))
		return perr_budget(P);
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
	int32_t *one = lo == hi ? &P->g->byte_bm[lo] : NULL;   /* a literal's byte: one bitmap per byte value */
	int k = one && *one >= 0 ? *one : bm_new(P, set);
	if (one && k >= 0)
		*one = k;
	return k < 0 ? -1 : seq_add(P, s, E_BYTES, (uint32_t)k);
}

static uint64_t name_hash(const char *name, size_t len) { return llm_hash_fmix(llm_hash_fnv1a(LLM_FNV1A_INIT, name, len)); }

static int rule_new(struct parser *P, const char *name, size_t len)
{
	struct llm_grammar *g = P->g;
	if (!mem_ok(g, sizeof *g->rule) || llm_array_reserve(&g->rule, &g->cap_rule, g->n_rule + 1, sizeof *g->rule))
		return g->overflow ? perr_budget(P) : nomem(P);
	struct grule *r = &g->rule[g->n_rule];
	memset(r, 0, sizeof *r);
	snprintf(r->name, sizeof r->name, "%.*s", (int)len, name);
	r->line = P->line;
	return (int)g->n_rule++;
}

/* The named rule NAME: found by its hash (g->rht), or added. */
static int rule_get(struct parser *P, const char *name, size_t len)
{
	struct llm_grammar *g = P->g;
	if (len >= sizeof g->rule[0].name)
		return perr(P, "rule name '%.*s' is too long", (int)len, name);
	if ((g->n_named + 1) * 2 > g->rht_cap) {
		size_t cap = g->rht_cap ? g->rht_cap * 2 : 64;
		int32_t *t = malloc(cap * sizeof *t);
		if (!t)
			return nomem(P);
		for (size_t i = 0; i < cap; i++)
			t[i] = -1;
		for (size_t i = 0; i < g->rht_cap; i++)
			if (g->rht[i] >= 0) {
				const char *nm = g->rule[g->rht[i]].name;
				size_t k = name_hash(nm, strlen(nm)) & (cap - 1);
				while (t[k] >= 0)
					k = (k + 1) & (cap - 1);
				t[k] = g->rht[i];
			}
		free(g->rht);
		g->rht = t;
		g->rht_cap = cap;
	}
	size_t k = name_hash(name, len) & (g->rht_cap - 1);
	for (; g->rht[k] >= 0; k = (k + 1) & (g->rht_cap - 1)) {
		const char *nm = g->rule[g->rht[k]].name;
		if (strlen(nm) == len && !memcmp(nm, name, len))
			return g->rht[k];
	}
	int r = rule_new(P, name, len);
	if (r >= 0) {
		g->rht[k] = r;
		g->n_named++;
	}
	return r;
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
	if (!mem_ok(g, (s->n + 1) * sizeof *g->el + sizeof *g->rule->alt) ||
	    (++P->n_alt % 4096 == 0 && poll_gone(g)))
		return perr_budget(P);
	if (llm_array_reserve(&g->el, &g->cap_el, g->n_el + s->n + 1, sizeof *g->el))
		return nomem(P);
	struct grule *ru = &g->rule[r];
	if (llm_array_reserve(&ru->alt, &ru->cap_alt, ru->n_alt + 1, sizeof *ru->alt))
		return nomem(P);
	g->held += sizeof *ru->alt;
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

/* A character class [...] or . at P->p, as items of S (not recursive:
 * its range table stays out of the parser's recursion). */
static int parse_class(struct parser *P, struct seq *s)
{
	struct range rg[129];
	size_t n = 0;
	int neg = 0;
	if (*P->p == '.') {
		P->p++;
		rg[n++] = (struct range){ 0, 0x10FFFF };
		return class_items(P, s, rg, n, neg);
	}
	P->p++;
	if (P->p < P->end && *P->p == '^') {
		neg = 1;
		P->p++;
	}
	while (P->p < P->end && *P->p != ']') {
		long lo = read_char(P), hi = lo;
		if (lo < 0)
			return -1;
		if (P->end - P->p >= 2 && P->p[0] == '-' && P->p[1] != ']') {
			P->p++;
			if ((hi = read_char(P)) < 0)
				return -1;
			if (hi < lo)
				return perr(P, "range %lX-%lX is backwards", lo, hi);
		}
		if (n == sizeof rg / sizeof *rg)
			return perr(P, "character class of more than %zu ranges", n);
		rg[n++] = (struct range){ (uint32_t)lo, (uint32_t)hi };
	}
	if (P->p >= P->end)
		return perr(P, "unterminated character class");
	P->p++;
	if (!n && !neg)
		return perr(P, "empty character class");
	return class_items(P, s, rg, n, neg);
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
		if (parse_class(P, &it))
			goto out;
	} else if (c == '(') {
		P->p++;
		if (++P->depth > LLM_GRAMMAR_MAX_NEST) {
			perr(P, "groups nested more than %d deep", LLM_GRAMMAR_MAX_NEST);
			goto out;
		}
		int r = rule_anon(P);
		if (r < 0 || parse_alts(P, r, 1))
			goto out;
		P->depth--;
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

/* Undefined rules and left recursion (which the recogniser cannot expand),
 * in time linear in the grammar's size: the nullable rules by a work list
 * (each alternative waits on the rule at its first element not yet known
 * nullable), then the left edges (a rule to each rule its alternatives may
 * start with) searched for a cycle by one depth-first walk on a heap stack. */
static int check_rules(struct parser *P)
{
	struct llm_grammar *g = P->g;
	size_t n = g->n_rule, na = 0;
	for (size_t i = 0; i < n; i++) {
		if (!g->rule[i].defined) {
			P->line = g->rule[i].line;
			return perr(P, "rule '%s' is not defined", g->rule[i].name);
		}
		na += g->rule[i].n_alt;
	}
	uint8_t *nul = calloc(n + 1, 1), *color = calloc(n + 1, 1);
	size_t *ap = malloc((na + 1) * sizeof *ap), *ar = malloc((na + 1) * sizeof *ar), *wnext = malloc((na + 1) * sizeof *wnext);
	size_t *whead = malloc((n + 1) * sizeof *whead), *queue = malloc((n + 1) * sizeof *queue);
	size_t *eoff = calloc(n + 1, sizeof *eoff), *edge = NULL, *stk = malloc((n + 1) * 2 * sizeof *stk);
	size_t nq = 0, qh = 0, ne = 0;
	int rc = 0;
	const size_t NONE = (size_t)-1;
	if (!nul || !color || !ap || !ar || !wnext || !whead || !queue || !eoff || !stk) {
		rc = nomem(P);
		goto out;
	}
	for (size_t i = 0; i < n; i++)
		whead[i] = NONE;
	/* nullable rules */
	for (size_t i = 0, k = 0; i < n; i++)
		for (size_t a = 0; a < g->rule[i].n_alt; a++, k++) {
			ar[k] = i;
			ap[k] = g->rule[i].alt[a];
			for (size_t k2 = k, first = 1; first || qh < nq; first = 0) {
				if (!first) {        /* rule queue[qh] became nullable: its waiters go on */
					size_t v = queue[qh++];
					if ((k2 = whead[v]) == NONE)
						continue;
					whead[v] = NONE;
					for (size_t nx; k2 != NONE; k2 = nx) {
						nx = wnext[k2];
						ap[k2]++;
						while (g->el[ap[k2]].type == E_REF && nul[g->el[ap[k2]].arg])
							ap[k2]++;
						if (g->el[ap[k2]].type == E_END && !nul[ar[k2]]) {
							nul[ar[k2]] = 1;
							queue[nq++] = ar[k2];
						} else if (g->el[ap[k2]].type == E_REF) {
							wnext[k2] = whead[g->el[ap[k2]].arg];
							whead[g->el[ap[k2]].arg] = k2;
						}
					}
					continue;
				}
				while (g->el[ap[k2]].type == E_REF && nul[g->el[ap[k2]].arg])
					ap[k2]++;
				if (g->el[ap[k2]].type == E_END && !nul[ar[k2]]) {
					nul[ar[k2]] = 1;
					queue[nq++] = ar[k2];
				} else if (g->el[ap[k2]].type == E_REF) {
					wnext[k2] = whead[g->el[ap[k2]].arg];
					whead[g->el[ap[k2]].arg] = k2;
				}
			}
		}
	/* the left edges, rule by rule (CSR: rule i's are edge[eoff[i] .. eoff[i + 1])) */
	for (int pass = 0; pass < 2; pass++) {
		ne = 0;
		for (size_t i = 0; i < n; i++) {
			eoff[i] = ne;
			for (size_t a = 0; a < g->rule[i].n_alt; a++)
				for (uint32_t p = g->rule[i].alt[a]; g->el[p].type == E_REF; p++) {
					if (pass)
						edge[ne] = g->el[p].arg;
					ne++;
					if (!nul[g->el[p].arg])
						break;
				}
		}
		eoff[n] = ne;
		if (!pass && !(edge = malloc((ne + 1) * sizeof *edge))) {
			rc = nomem(P);
			goto out;
		}
	}
	/* a cycle: an edge back to a rule on the walk's path (color 1) */
	for (size_t i = 0; i < n && !rc; i++) {
		if (color[i])
			continue;
		size_t ns = 0;
		stk[ns++] = i;
		stk[ns++] = eoff[i];
		color[i] = 1;
		while (ns && !rc) {
			size_t u = stk[ns - 2], e = stk[ns - 1];
			if (e == eoff[u + 1]) {
				color[u] = 2;
				ns -= 2;
				continue;
			}
			stk[ns - 1]++;
			size_t v = edge[e];
			if (color[v] == 1) {
				P->line = g->rule[v].line;
				rc = g->rule[v].name[0] == '_' ?   /* a group or repetition's rule */
				     perr(P, "left recursion: a repetition of an item that can be empty, as (x?)*, "
				          "or a group that starts with its own rule") :
				     perr(P, "rule '%s' is left-recursive", g->rule[v].name);
			} else if (!color[v]) {
				color[v] = 1;
				stk[ns++] = v;
				stk[ns++] = eoff[v];
			}
		}
	}
out:
	free(nul), free(color), free(ap), free(ar), free(wnext), free(whead), free(queue), free(eoff), free(edge), free(stk);
	return rc;
}

enum llm_status llm_grammar_compile_budget(struct llm_grammar **out, const char *src, size_t len,
                                           const struct llm_gvocab *v, const struct llm_grammar_budget *b)
{
	*out = NULL;
	struct llm_grammar *g = calloc(1, sizeof *g);
	if (!g)
		return llm_fail(LLM_ERR_NOMEM, "grammar: out of memory");
	atomic_init(&g->refs, 1);
	g->voc = v;
	g->max_bytes = b && b->max_bytes ? b->max_bytes : LLM_GRAMMAR_MAX_BYTES;
	g->work = b && b->work > 0 ? (size_t)b->work : (size_t)LLM_GRAMMAR_WORK;
	g->bud = b;
	g->work_left = g->work;
	for (int i = 0; i < 256; i++)
		g->byte_bm[i] = -1;
	work_reset(g);
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
	if (!P.st && !poll_gone(g))
		check_rules(&P);
	if (!P.st && g->overflow)
		perr_budget(&P);
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
			work_reset(g);
			if (expand(g, &g->tmp, 1) || canon(g, &g->tmp, &g->can) || (g->start = intern(g, g->can.w, g->can.n)) < 0) {
				if (g->overflow) {
					char m[160];
					P.st = llm_fail(LLM_ERR_USAGE, "grammar: the start state: %s", ovf_msg(g, m, sizeof m));
				} else {
					nomem(&P);
				}
			}
		}
	}
	/* the bytes the start forces (a tool call's "<tool_call>\n{\"name\":"...),
	 * then the state where the text has a choice: computed here, so a
	 * budget the grammar passes there is a compile error */
	int fst = P.st ? -1 : g->start;
	for (int k = 0; k < LLM_GRAMMAR_FORCED && fst >= 0; k++) {
		int b1 = forced_byte(g, fst);
		if (b1 < 0)
			break;
		work_reset(g);
		if ((fst = trans(g, fst, (uint8_t)b1)) == -2) {
			char m[160];
			P.st = llm_fail(g->overflow ? LLM_ERR_USAGE : LLM_ERR_NOMEM, "grammar: after %d bytes that the start "
			                "forces: %s", k + 1, ovf_msg(g, m, sizeof m));
		}
	}
	/* the start's mask, on the compiling thread rather than the first step's */
	uint8_t *m = !P.st && v ? malloc((size_t)v->n + 1) : NULL;
	int na;
	enum llm_status ms = m ? llm_grammar_mask(g, g->start, m, &na) : LLM_OK;
	if (!ms && m && fst >= 0 && fst != g->start)   /* and the first choice's */
		ms = llm_grammar_mask(g, fst, m, &na);
	if (ms && !P.st) {
		char why[300];
		snprintf(why, sizeof why, "%s", llm_errmsg());
		P.st = llm_fail(ms == LLM_ERR_NOMEM ? ms : LLM_ERR_USAGE, "%s (a mask the compile computes)", why);
	}
	else if (!P.st && v && !m)
		nomem(&P);
	free(m);
	g->bud = NULL;                /* the caller's, for the compile only */
	atomic_store(&g->bytes_pub, grammar_bytes(g));
	if (P.st) {
		grammar_free(g);
		return P.st;
	}
	*out = g;
	return LLM_OK;
}

enum llm_status llm_grammar_compile(struct llm_grammar **out, const char *src, size_t len, const struct llm_gvocab *v)
{
	return llm_grammar_compile_budget(out, src, len, v, NULL);
}

enum llm_status llm_grammar_compile_cached(struct llm_grammar **out, const char *src, size_t len, struct llm_gvocab *v,
                                           const struct llm_grammar_budget *b)
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
	LLM_TRY(llm_grammar_compile_budget(out, src, len, v, b));
	size_t bytes = atomic_load(&(*out)->bytes_pub) + len;
	char *t = bytes <= LLM_GRAMMAR_CACHE_BYTES ? malloc(len + 1) : NULL;
	if (!t)
		return LLM_OK;            /* not kept: still compiled */
	memcpy(t, src, len);
	pthread_mutex_lock(&v->mu);
	/* room: the least recently used go while the cache would pass its bytes
	 * (each grammar's memory as it is now: the engine's thread adds states
	 * to the ones in use, each within its own budget) */
	struct llm_grammar *drop[LLM_GRAMMAR_CACHE];
	int n_drop = 0;
	for (;;) {
		size_t held = bytes;
		int n_used = 0;
		struct gcache *old = NULL;
		for (int i = 0; i < LLM_GRAMMAR_CACHE; i++) {
			struct gcache *c = &v->cache[i];
			if (!c->g)
				continue;
			n_used++;
			held += atomic_load(&c->g->bytes_pub) + c->len;
			if (!old || c->use < old->use)
				old = c;
		}
		if (!old || (held <= LLM_GRAMMAR_CACHE_BYTES && n_used < LLM_GRAMMAR_CACHE))
			break;
		drop[n_drop++] = old->g;
		free(old->text);
		*old = (struct gcache){ 0 };
	}
	struct gcache *e = &v->cache[0];
	for (int i = 0; i < LLM_GRAMMAR_CACHE; i++)
		if (!v->cache[i].g) {
			e = &v->cache[i];
			break;
		}
	*e = (struct gcache){ .h = h, .text = t, .len = len, .g = llm_grammar_ref(*out), .use = ++v->clock };
	pthread_mutex_unlock(&v->mu);
	for (int i = 0; i < n_drop; i++)
		llm_grammar_unref(drop[i]);
	return LLM_OK;
}
