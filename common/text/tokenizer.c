/* common/text/tokenizer.c: Hugging Face tokenizer.json BPE, encode and decode,
 * and the streaming detokenizer; tokenizer_load.c reads the tokenizer.
 *
 * Guarantees: the ids and text of the Rust `tokenizers` library for the
 * components implemented here (see tokenizer.h); anything else is refused
 * at open time. Encoding: added tokens split out (leftmost-longest), then per
 * segment normalizer -> pre-tokenizer -> BPE -> post-processor. BPE merges
 * follow tokenizers/src/models/bpe/word.rs: a heap of (rank, position)
 * over a doubly linked list of symbols, stale entries skipped when the pair
 * they name no longer exists. */
#define _GNU_SOURCE
#include "tokenizer.h"
#include "detok.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>
#include "hash.h"
#include "tokenizer_impl.h"

#include "banned.h"

/* ---------------------------------------------------------------- buffers */

/* A list of strings stored back to back: piece i is text.p[off[i]..off[i+1]). */
struct pieces {
	struct buf text;
	size_t *off;       /* (cap) of which n + 1 used */
	size_t n, cap;
	bool oom;
};

static void pieces_clear(struct pieces *ps)
{
	ps->text.n = 0;
	ps->n = 0;
	if (LLM_ARRAY_RESERVE(ps->off, ps->cap, 1))
		ps->oom = true;
	else
		ps->off[0] = 0;
}

/* Close the current piece (the bytes appended since the last close). */
static void pieces_close(struct pieces *ps)
{
	if (ps->oom)
		return;
	if (LLM_ARRAY_RESERVE(ps->off, ps->cap, ps->n + 2)) {
		ps->oom = true;
		return;
	}
	ps->off[++ps->n] = ps->text.n;
}

static void pieces_add(struct pieces *ps, const char *s, size_t n)
{
	buf_put(&ps->text, s, n);
	pieces_close(ps);
}

static const char *piece(const struct pieces *ps, size_t i, size_t *len)
{
	*len = ps->off[i + 1] - ps->off[i];
	return ps->text.p ? ps->text.p + ps->off[i] : "";   /* all pieces empty: no text buffer yet */
}

static void pieces_free(struct pieces *ps)
{
	free(ps->text.p);
	free(ps->off);
	memset(ps, 0, sizeof *ps);
}

static void pieces_swap(struct pieces *a, struct pieces *b)
{
	struct pieces t = *a;
	*a = *b;
	*b = t;
}

/* ---------------------------------------------------------------- UTF-8 */

/* Length of the UTF-8 character at s (1 for an invalid lead byte). */
static size_t u8len(unsigned char c)
{
	return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* The offset of the first invalid byte, or len when S is valid UTF-8. */
static size_t utf8_valid_prefix(const char *s, size_t len)
{
	size_t i = 0;
	while (i < len) {
		utf8proc_int32_t cp;
		utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)s + i,
		                                      (utf8proc_ssize_t)(len - i), &cp);
		if (k <= 0)
			return i;
		i += (size_t)k;
	}
	return len;
}

static void put_cp(struct buf *b, int32_t cp)
{
	utf8proc_uint8_t tmp[4];
	utf8proc_ssize_t k = utf8proc_encode_char(cp, tmp);
	buf_put(b, tmp, (size_t)k);
}

/* Append S with invalid sequences replaced by U+FFFD, one per maximal
 * subpart (the Unicode / WHATWG rule that Rust's from_utf8_lossy and
 * TextDecoder follow). */
static void put_lossy(struct buf *b, const unsigned char *s, size_t n)
{
	size_t i = 0;
	while (i < n) {
		unsigned c = s[i];
		if (c < 0x80) {
			buf_putc(b, (char)c);
			i++;
			continue;
		}
		size_t need;
		unsigned lo = 0x80, hi = 0xBF;
		if (c >= 0xC2 && c <= 0xDF) need = 1;
		else if (c >= 0xE0 && c <= 0xEF) {
			need = 2;
			if (c == 0xE0) lo = 0xA0;
			if (c == 0xED) hi = 0x9F;
		} else if (c >= 0xF0 && c <= 0xF4) {
			need = 3;
			if (c == 0xF0) lo = 0x90;
			if (c == 0xF4) hi = 0x8F;
		} else {
			buf_put(b, "\xEF\xBF\xBD", 3);
			i++;
			continue;
		}
		size_t j = 1;
		for (; j <= need && i + j < n; j++) {
			unsigned d = s[i + j];
			if (d < lo || d > hi)
				break;
			lo = 0x80;
			hi = 0xBF;
		}
		if (j == need + 1) {
			buf_put(b, s + i, need + 1);
			i += need + 1;
		} else {
			buf_put(b, "\xEF\xBF\xBD", 3);
			i += j;
		}
	}
}

/* GPT-2's byte <-> printable character map (bytes_to_unicode). */
static int32_t byte_cp[256];
static int16_t cp_byte[324];
static char byte_chr[256][3];       /* UTF-8 of byte_cp, NUL-terminated */

/* Filled before main() (the tables are constant), so no thread can race. */
__attribute__((constructor)) static void init_bytelevel_tables(void)
{
	int n = 0;
	for (int b = 0; b < 256; b++) {
		bool keep = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
		byte_cp[b] = keep ? b : 256 + n++;
	}
	for (int i = 0; i < 324; i++)
		cp_byte[i] = -1;
	for (int b = 0; b < 256; b++) {
		cp_byte[byte_cp[b]] = (int16_t)b;
		utf8proc_encode_char(byte_cp[b], (utf8proc_uint8_t *)byte_chr[b]);
	}
}

void tok_init_bytelevel(void)
{
	if (!byte_cp['!'])   /* only if constructors did not run */
		init_bytelevel_tables();
}

/* ---------------------------------------------------------------- hashing */

/* FNV-1a, finalized: FNV's high bits reach the low bits poorly. */
static uint64_t hash_bytes(const char *s, size_t n)
{
	return llm_hash_fmix(llm_hash_fnv1a(LLM_FNV1A_INIT, s, n));
}

int tok_smap_init(struct smap *m, size_t n, const struct str *keys)
{
	size_t cap = 16;
	while (cap < n * 2)
		cap *= 2;
	m->slot = calloc(cap, sizeof *m->slot);
	if (!m->slot)
		return -1;
	m->mask = cap - 1;
	m->keys = keys;
	return 0;
}

int32_t tok_smap_get(const struct smap *m, const char *s, size_t n)
{
	if (!m->slot)
		return -1;
	uint64_t h = hash_bytes(s, n), tag = h >> 32;
	for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
		uint64_t e = m->slot[i];
		if (!e)
			return -1;
		int32_t id = (int32_t)(uint32_t)e - 1;
		if ((e >> 32) == tag && m->keys[id].len == n && !memcmp(m->keys[id].s, s, n))
			return id;
	}
}

/* Insert id (its text is keys[id]); an existing equal key keeps its id. */
void tok_smap_put(struct smap *m, int32_t id)
{
	const struct str *k = &m->keys[id];
	uint64_t h = hash_bytes(k->s, k->len), tag = h >> 32;
	for (size_t i = h & m->mask;; i = (i + 1) & m->mask) {
		uint64_t e = m->slot[i];
		if (!e) {
			m->slot[i] = tag << 32 | (uint32_t)(id + 1);
			return;
		}
		int32_t o = (int32_t)(uint32_t)e - 1;
		if ((e >> 32) == tag && m->keys[o].len == k->len && !memcmp(m->keys[o].s, k->s, k->len))
			return;
	}
}

int tok_mmap_init(struct mmap *m, size_t n)
{
	size_t cap = 16;
	while (cap < n * 2)
		cap *= 2;
	m->key = malloc(cap * sizeof *m->key);
	m->rank = malloc(cap * sizeof *m->rank);
	m->id = malloc(cap * sizeof *m->id);
	if (!m->key || !m->rank || !m->id)
		return -1;
	memset(m->key, 0xff, cap * sizeof *m->key);
	m->mask = cap - 1;
	return 0;
}

/* A later duplicate replaces the earlier rank, as the Rust HashMap collect does. */
void tok_mmap_put(struct mmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (size_t i = llm_hash_fmix(k) & m->mask;; i = (i + 1) & m->mask) {
		if (m->key[i] == UINT64_MAX || m->key[i] == k) {
			m->key[i] = k;
			m->rank[i] = rank;
			m->id[i] = id;
			return;
		}
	}
}

static bool mmap_get(const struct mmap *m, int32_t a, int32_t b, uint32_t *rank, int32_t *id)
{
	if (!m->key)
		return false;
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (size_t i = llm_hash_fmix(k) & m->mask;; i = (i + 1) & m->mask) {
		if (m->key[i] == k) {
			*rank = m->rank[i];
			*id = m->id[i];
			return true;
		}
		if (m->key[i] == UINT64_MAX)
			return false;
	}
}

/* ---------------------------------------------------------------- encoding */

/* Per-call scratch space, reused across words. */
struct enc {
	const struct llm_tokenizer *tk;
	struct pieces a, b;
	struct buf nb, nb2;
	pcre2_match_data *md;
	struct sym { int32_t id, prev, next; bool dead; } *sym;
	size_t n_sym, cap_sym;
	struct hitem { uint32_t rank, pos; int32_t id; } *heap;
	size_t n_heap, cap_heap;
	int32_t *ids;
	size_t n_ids, cap_ids;
	bool oom;
};

static void push_id(struct enc *e, int32_t id)
{
	if (LLM_ARRAY_RESERVE(e->ids, e->cap_ids, e->n_ids + 1)) {
		e->oom = true;
		return;
	}
	e->ids[e->n_ids++] = id;
}

static void push_sym(struct enc *e, int32_t id)
{
	if (LLM_ARRAY_RESERVE(e->sym, e->cap_sym, e->n_sym + 1)) {
		e->oom = true;
		return;
	}
	e->sym[e->n_sym] = (struct sym){ id, (int32_t)e->n_sym - 1, (int32_t)e->n_sym + 1, false };
	e->n_sym++;
}

/* Min-heap on (rank, pos). */
static bool hless(const struct hitem *a, const struct hitem *b)
{
	return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

static void heap_push(struct enc *e, uint32_t rank, uint32_t pos, int32_t id)
{
	if (LLM_ARRAY_RESERVE(e->heap, e->cap_heap, e->n_heap + 1)) {
		e->oom = true;
		return;
	}
	size_t i = e->n_heap++;
	struct hitem it = { rank, pos, id };
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!hless(&it, &e->heap[p]))
			break;
		e->heap[i] = e->heap[p];
		i = p;
	}
	e->heap[i] = it;
}

static struct hitem heap_pop(struct enc *e)
{
	struct hitem top = e->heap[0], last = e->heap[--e->n_heap];
	size_t i = 0, n = e->n_heap;
	for (;;) {
		size_t c = 2 * i + 1;
		if (c >= n)
			break;
		if (c + 1 < n && hless(&e->heap[c + 1], &e->heap[c]))
			c++;
		if (!hless(&e->heap[c], &last))
			break;
		e->heap[i] = e->heap[c];
		i = c;
	}
	if (n)
		e->heap[i] = last;
	return top;
}

static void try_pair(struct enc *e, int32_t pos)
{
	struct sym *s = &e->sym[pos];
	if (s->next >= (int32_t)e->n_sym)
		return;
	uint32_t rank;
	int32_t id;
	if (mmap_get(&e->tk->merges, s->id, e->sym[s->next].id, &rank, &id))
		heap_push(e, rank, (uint32_t)pos, id);
}

/* BPE over one pre-tokenized word (tokenizers' BPE::tokenize + Word::merge_all). */
static enum llm_status bpe_word(struct enc *e, const char *w, size_t n)
{
	const struct llm_tokenizer *tk = e->tk;
	if (!n)
		return LLM_OK;
	if (tk->ignore_merges) {
		int32_t id = tok_smap_get(&tk->vmap, w, n);
		if (id >= 0) {
			push_id(e, id);
			return LLM_OK;
		}
	}
	e->n_sym = 0;
	bool pending_unk = false;
	for (size_t i = 0; i < n;) {
		size_t k = u8len((unsigned char)w[i]);
		if (i + k > n)
			k = n - i;
		int32_t id = tok_smap_get(&tk->vmap, w + i, k);
		if (id < 0 && tk->byte_fallback) {
			bool all = true;
			for (size_t j = 0; j < k; j++)
				all &= tk->byte_id[(unsigned char)w[i + j]] >= 0;
			if (all) {
				for (size_t j = 0; j < k; j++)
					push_sym(e, tk->byte_id[(unsigned char)w[i + j]]);
				pending_unk = false;
				i += k;
				continue;
			}
		}
		if (id < 0) {
			if (tk->unk_id < 0) {
				utf8proc_int32_t cp = 0;
				utf8proc_iterate((const utf8proc_uint8_t *)w + i, (utf8proc_ssize_t)k, &cp);
				return llm_fail(LLM_ERR_RANGE, "%s: character U+%04X has no token and the model has no unk_token",
				                tk->origin, (unsigned)cp);
			}
			if (!(tk->fuse_unk && pending_unk))
				push_sym(e, tk->unk_id);
			pending_unk = true;
		} else {
			push_sym(e, id);
			pending_unk = false;
		}
		i += k;
	}
	if (e->oom)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	e->n_heap = 0;
	for (size_t i = 0; i + 1 < e->n_sym; i++)
		try_pair(e, (int32_t)i);
	while (e->n_heap) {
		struct hitem top = heap_pop(e);
		struct sym *s = &e->sym[top.pos];
		if (s->dead || s->next >= (int32_t)e->n_sym)
			continue;
		struct sym *r = &e->sym[s->next];
		uint32_t rank;
		int32_t id;
		if (!mmap_get(&tk->merges, s->id, r->id, &rank, &id) || id != top.id)
			continue;
		s->id = top.id;
		r->dead = true;
		s->next = r->next;
		if (r->next < (int32_t)e->n_sym)
			e->sym[r->next].prev = (int32_t)top.pos;
		if (s->prev >= 0)
			try_pair(e, s->prev);
		try_pair(e, (int32_t)top.pos);
	}
	if (e->oom)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (int32_t i = 0; i < (int32_t)e->n_sym && i >= 0; i = e->sym[i].next)
		push_id(e, e->sym[i].id);
	return LLM_OK;
}

/* Replace every match of the literal A (or regex RE) in IN by B. */
static void replace_all(struct enc *e, const char *in, size_t n, const char *a, pcre2_code *re,
                        const char *b, struct buf *out)
{
	size_t lb = strlen(b);
	out->n = 0;
	buf_put(out, "", 0);
	if (a) {
		size_t la = strlen(a);
		size_t i = 0;
		while (i < n) {
			const char *p = la ? memmem(in + i, n - i, a, la) : NULL;
			if (!p) {
				buf_put(out, in + i, n - i);
				break;
			}
			buf_put(out, in + i, (size_t)(p - (in + i)));
			buf_put(out, b, lb);
			i = (size_t)(p - in) + la;
		}
		return;
	}
	size_t i = 0;
	while (i <= n) {
		int rc = pcre2_match(re, (PCRE2_SPTR)in, n, i, PCRE2_NO_UTF_CHECK, e->md, NULL);
		if (rc < 0)
			break;
		PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
		buf_put(out, in + i, ov[0] - i);
		buf_put(out, b, lb);
		if (ov[1] == ov[0]) {
			if (ov[0] >= n)
				return;
			size_t k = u8len((unsigned char)in[ov[0]]);
			buf_put(out, in + ov[0], k);
			i = ov[0] + k;
		} else {
			i = ov[1];
		}
	}
	if (i < n)
		buf_put(out, in + i, n - i);
}

static bool is_ws_cp(int32_t c)
{
	return (c >= 9 && c <= 13) || c == 32 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
	       (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
	       c == 0x205F || c == 0x3000;
}

/* Apply normalizer N to e->nb in place (nb2 is scratch). */
static enum llm_status normalize(struct enc *e, const struct norm *n)
{
	struct buf *b = &e->nb;
	switch (n->type) {
	case NORM_SEQ:
		for (size_t i = 0; i < n->n_sub; i++)
			LLM_TRY(normalize(e, &n->sub[i]));
		return LLM_OK;
	case NORM_PREPEND:
		if (b->n) {
			e->nb2.n = 0;
			buf_put(&e->nb2, n->a, strlen(n->a));
			buf_put(&e->nb2, b->p, b->n);
			break;
		}
		return LLM_OK;
	case NORM_REPLACE:
		replace_all(e, b->p, b->n, n->a, n->re, n->b, &e->nb2);
		break;
	case NORM_UNICODE: {
		if (!b->n)
			return LLM_OK;
		utf8proc_uint8_t *o = NULL;
		utf8proc_ssize_t k = utf8proc_map((const utf8proc_uint8_t *)b->p, (utf8proc_ssize_t)b->n, &o,
		                                  (utf8proc_option_t)n->uflags);
		if (k < 0)
			return llm_fail(LLM_ERR_FORMAT, "text: %s", utf8proc_errmsg(k));
		e->nb2.n = 0;
		buf_put(&e->nb2, o, (size_t)k);
		free(o);
		break;
	}
	case NORM_LOWER: {
		e->nb2.n = 0;
		for (size_t i = 0; i < b->n;) {
			utf8proc_int32_t cp;
			utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)b->p + i,
			                                      (utf8proc_ssize_t)(b->n - i), &cp);
			put_cp(&e->nb2, utf8proc_tolower(cp));
			i += (size_t)k;
		}
		break;
	}
	case NORM_STRIP: {
		size_t s = 0, t = b->n;
		while (n->left && s < t) {
			utf8proc_int32_t cp;
			utf8proc_ssize_t k = utf8proc_iterate((const utf8proc_uint8_t *)b->p + s, (utf8proc_ssize_t)(t - s), &cp);
			if (!is_ws_cp(cp))
				break;
			s += (size_t)k;
		}
		while (n->right && t > s) {
			size_t q = t - 1;
			while (q > s && ((unsigned char)b->p[q] & 0xC0) == 0x80)
				q--;
			utf8proc_int32_t cp;
			utf8proc_iterate((const utf8proc_uint8_t *)b->p + q, (utf8proc_ssize_t)(t - q), &cp);
			if (!is_ws_cp(cp))
				break;
			t = q;
		}
		e->nb2.n = 0;
		buf_put(&e->nb2, b->p + s, t - s);
		break;
	}
	}
	struct buf t = e->nb;
	e->nb = e->nb2;
	e->nb2 = t;
	return (e->nb.oom || e->nb2.oom) ? llm_fail(LLM_ERR_NOMEM, "out of memory") : LLM_OK;
}

/* Split every piece of e->a by RE with BEHAVIOR into e->b, then swap. */
static void split_pieces(struct enc *e, pcre2_code *re, int behavior, bool invert)
{
	pieces_clear(&e->b);
	for (size_t pi = 0; pi < e->a.n; pi++) {
		size_t n;
		const char *s = piece(&e->a, pi, &n);
		/* Spans (start, end, is_match) covering s. */
		size_t pos = 0, open_start = 0;
		bool have_open = false, open_match = false;   /* a pending piece not closed yet */
#define SPAN(st, en, m) do {                                                                  \
		size_t st_ = (st), en_ = (en); bool m_ = (m) != invert;                               \
		if (en_ > st_) {                                                                      \
			if (behavior == SPLIT_REMOVED) {                                                  \
				if (!m_) pieces_add(&e->b, s + st_, en_ - st_);                               \
			} else if (behavior == SPLIT_ISOLATED) {                                          \
				pieces_add(&e->b, s + st_, en_ - st_);                                        \
			} else if (behavior == SPLIT_MERGED_PREV) {                                       \
				if (m_ && have_open) { buf_put(&e->b.text, s + st_, en_ - st_); }              \
				else { if (have_open) pieces_close(&e->b);                                     \
				       buf_put(&e->b.text, s + st_, en_ - st_); have_open = true; }            \
				if (m_) { pieces_close(&e->b); have_open = false; }                           \
			} else if (behavior == SPLIT_MERGED_NEXT) {                                       \
				if (have_open && !open_match) { pieces_close(&e->b); have_open = false; }     \
				buf_put(&e->b.text, s + st_, en_ - st_);                                      \
				if (m_) { have_open = true; open_match = true; } else { pieces_close(&e->b); have_open = false; } \
			} else { /* contiguous */                                                         \
				if (have_open && open_match == m_) buf_put(&e->b.text, s + st_, en_ - st_);    \
				else { if (have_open) pieces_close(&e->b);                                     \
				       buf_put(&e->b.text, s + st_, en_ - st_); have_open = true; open_match = m_; } \
			}                                                                                 \
		}                                                                                     \
	} while (0)
		(void)open_start;
		while (pos < n) {
			int rc = pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, e->md, NULL);
			if (rc < 0)
				break;
			PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
			size_t ms = ov[0], me = ov[1];
			if (me == ms) {                  /* empty match: step over one character */
				if (ms >= n)
					break;
				size_t k = u8len((unsigned char)s[ms]);
				SPAN(pos, ms + k, false);
				pos = ms + k;
				continue;
			}
			SPAN(pos, ms, false);
			SPAN(ms, me, true);
			pos = me;
		}
		SPAN(pos, n, false);
		if (have_open)
			pieces_close(&e->b);
#undef SPAN
	}
	pieces_swap(&e->a, &e->b);
}

static void bytelevel_map(struct enc *e, bool prefix)
{
	pieces_clear(&e->b);
	for (size_t pi = 0; pi < e->a.n; pi++) {
		size_t n;
		const char *s = piece(&e->a, pi, &n);
		if (prefix && (n == 0 || s[0] != ' '))
			buf_put(&e->b.text, byte_chr[' '], strlen(byte_chr[' ']));
		for (size_t i = 0; i < n; i++) {
			const char *c = byte_chr[(unsigned char)s[i]];
			buf_put(&e->b.text, c, c[1] ? (c[2] ? 3 : 2) : 1);
		}
		pieces_close(&e->b);
	}
	pieces_swap(&e->a, &e->b);
}

static enum llm_status pretokenize(struct enc *e, const struct pre *p, bool at_start)
{
	switch (p->type) {
	case PRE_SEQ:
		for (size_t i = 0; i < p->n_sub; i++)
			LLM_TRY(pretokenize(e, &p->sub[i], at_start));
		break;
	case PRE_SPLIT:
		split_pieces(e, p->re, p->behavior, p->invert);
		break;
	case PRE_BYTELEVEL:
		if (p->add_prefix_space) {   /* prefix each piece, before the regex split */
			pieces_clear(&e->b);
			for (size_t i = 0; i < e->a.n; i++) {
				size_t n;
				const char *s = piece(&e->a, i, &n);
				if (!n || s[0] != ' ')
					buf_putc(&e->b.text, ' ');
				pieces_add(&e->b, s, n);
			}
			pieces_swap(&e->a, &e->b);
		}
		if (p->re)
			split_pieces(e, p->re, SPLIT_ISOLATED, false);
		bytelevel_map(e, false);
		break;
	case PRE_METASPACE: {
		size_t lr = strlen(p->repl);
		pieces_clear(&e->b);
		for (size_t i = 0; i < e->a.n; i++) {
			size_t n;
			const char *s = piece(&e->a, i, &n);
			bool starts = n >= lr && !memcmp(s, p->repl, lr);
			if (!starts && (p->prepend == 2 || (p->prepend == 1 && at_start && i == 0)))
				buf_put(&e->b.text, p->repl, lr);
			for (size_t k = 0; k < n; k++) {
				if (s[k] == ' ')
					buf_put(&e->b.text, p->repl, lr);
				else
					buf_putc(&e->b.text, s[k]);
			}
			pieces_close(&e->b);
		}
		pieces_swap(&e->a, &e->b);
		if (p->split) {
			pcre2_code *re = NULL;
			int err;
			PCRE2_SIZE off;
			re = pcre2_compile((PCRE2_SPTR)p->repl, lr, PCRE2_UTF | PCRE2_LITERAL, &err, &off, NULL);
			if (!re)
				return llm_fail(LLM_ERR_NOMEM, "out of memory");
			split_pieces(e, re, SPLIT_MERGED_NEXT, false);
			pcre2_code_free(re);
		}
		break;
	}
	}
	return (e->a.oom || e->a.text.oom || e->b.oom || e->b.text.oom)
	       ? llm_fail(LLM_ERR_NOMEM, "out of memory") : LLM_OK;
}

static bool is_space_char(const char *s, size_t n, size_t i, size_t *k)
{
	utf8proc_int32_t cp;
	utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(n - i), &cp);
	*k = r > 0 ? (size_t)r : 1;
	return r > 0 && is_ws_cp(cp);
}

/* Encode one text segment (no added tokens in it). */
static enum llm_status encode_segment(struct enc *e, const char *s, size_t n, bool at_start)
{
	const struct llm_tokenizer *tk = e->tk;
	if (!n)
		return LLM_OK;
	e->nb.n = 0;
	buf_put(&e->nb, s, n);
	if (tk->norm)
		LLM_TRY(normalize(e, tk->norm));
	pieces_clear(&e->a);
	pieces_add(&e->a, e->nb.p, e->nb.n);
	if (tk->pre)
		LLM_TRY(pretokenize(e, tk->pre, at_start));
	if (e->a.oom || e->a.text.oom)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < e->a.n; i++) {
		size_t len;
		const char *w = piece(&e->a, i, &len);
		LLM_TRY(bpe_word(e, w, len));
	}
	return LLM_OK;
}

/* The longest added token at text[i], or NULL. */
static const struct added *added_at(const struct llm_tokenizer *tk, const char *t, size_t n, size_t i)
{
	unsigned c = (unsigned char)t[i];
	for (uint32_t k = tk->aidx[c]; k < tk->aidx[c + 1]; k++) {
		const struct added *a = &tk->added[tk->abucket[k]];
		if (a->len <= n - i && !memcmp(a->s, t + i, a->len))
			return a;   /* sorted longest first */
	}
	return NULL;
}

static enum llm_status encode_text(struct enc *e, const char *t, size_t n)
{
	const struct llm_tokenizer *tk = e->tk;
	size_t seg = 0;   /* start of the pending text segment */
	size_t i = 0;
	while (i < n) {
		const struct added *a = tk->n_added ? added_at(tk, t, n, i) : NULL;
		if (!a) {
			i++;
			continue;
		}
		size_t s = i, end = i + a->len, k;
		if (a->lstrip)
			while (s > seg) {
				size_t q = s - 1;
				while (q > seg && ((unsigned char)t[q] & 0xC0) == 0x80)
					q--;
				if (!is_space_char(t, n, q, &k))
					break;
				s = q;
			}
		if (a->rstrip)
			while (end < n && is_space_char(t, n, end, &k))
				end += k;
		LLM_TRY(encode_segment(e, t + seg, s - seg, seg == 0));
		push_id(e, a->id);
		seg = i = end;
	}
	return encode_segment(e, t + seg, n - seg, seg == 0);
}

enum llm_status llm_tokenizer_encode(const struct llm_tokenizer *tk, const char *text,
                                     size_t len, bool add_special, int32_t **ids, size_t *n)
{
	*ids = NULL;
	*n = 0;
	size_t bad = utf8_valid_prefix(text, len);
	if (bad < len)
		return llm_fail(LLM_ERR_FORMAT, "text: invalid UTF-8 at byte %zu", bad);
	struct enc e = { .tk = tk };
	e.md = pcre2_match_data_create(8, NULL);
	enum llm_status st = e.md ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "out of memory");
	if (add_special)
		for (size_t i = 0; i < tk->n_post_pre; i++)
			push_id(&e, tk->post_pre[i]);
	if (!st)
		st = encode_text(&e, text, len);
	if (!st && add_special)
		for (size_t i = 0; i < tk->n_post_post; i++)
			push_id(&e, tk->post_post[i]);
	if (!st && e.oom)
		st = llm_fail(LLM_ERR_NOMEM, "out of memory");
	if (!st && !e.ids) {
		e.ids = malloc(sizeof *e.ids);
		if (!e.ids)
			st = llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	pieces_free(&e.a);
	pieces_free(&e.b);
	free(e.nb.p);
	free(e.nb2.p);
	free(e.sym);
	free(e.heap);
	if (e.md)
		pcre2_match_data_free(e.md);
	if (st) {
		free(e.ids);
		return st;
	}
	*ids = e.ids;
	*n = e.n_ids;
	return LLM_OK;
}

/* ---------------------------------------------------------------- decoding */

static int hexval(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* The byte of a byte-fallback token's text <0xXX> (N bytes at S), or -1. */
static int fallback_byte(const char *s, size_t n)
{
	if (!s || n != 6 || memcmp(s, "<0x", 3) || s[5] != '>' || hexval(s[3]) < 0 || hexval(s[4]) < 0)
		return -1;
	return hexval(s[3]) * 16 + hexval(s[4]);
}

static void decode_chain(const struct dec *d, struct pieces *ps, struct pieces *tmp)
{
	switch (d->type) {
	case DEC_SEQ:
		for (size_t i = 0; i < d->n_sub; i++)
			decode_chain(&d->sub[i], ps, tmp);
		return;
	case DEC_REPLACE: {
		size_t la = strlen(d->a), lb = strlen(d->b);
		pieces_clear(tmp);
		for (size_t i = 0; i < ps->n; i++) {
			size_t n;
			const char *s = piece(ps, i, &n);
			for (size_t k = 0; k < n;) {
				if (la && k + la <= n && !memcmp(s + k, d->a, la)) {
					buf_put(&tmp->text, d->b, lb);
					k += la;
				} else {
					buf_putc(&tmp->text, s[k++]);
				}
			}
			pieces_close(tmp);
		}
		break;
	}
	case DEC_BYTEFALLBACK: {
		pieces_clear(tmp);
		struct buf run = { 0 };
		size_t n_run = 0;
		for (size_t i = 0; i <= ps->n; i++) {
			size_t n = 0;
			const char *s = i < ps->n ? piece(ps, i, &n) : NULL;
			int v = fallback_byte(s, n);
			bool isbyte = false;
			if (v >= 0) {
				buf_putc(&run, (char)v);
				n_run++;
				isbyte = true;
			}
			if (!isbyte && n_run) {
				if (utf8_valid_prefix(run.p, run.n) == run.n) {
					pieces_add(tmp, run.p, run.n);
				} else {
					for (size_t k = 0; k < n_run; k++)
						pieces_add(tmp, "\xEF\xBF\xBD", 3);
				}
				run.n = 0;
				n_run = 0;
			}
			if (!isbyte && s)
				pieces_add(tmp, s, n);
		}
		free(run.p);
		break;
	}
	case DEC_FUSE:
		pieces_clear(tmp);
		buf_put(&tmp->text, ps->text.p ? ps->text.p : "", ps->text.n);
		pieces_close(tmp);
		break;
	case DEC_STRIP: {
		size_t lc = strlen(d->a);
		pieces_clear(tmp);
		for (size_t i = 0; i < ps->n; i++) {
			size_t n;
			const char *s = piece(ps, i, &n);
			size_t a = 0, b = n;
			for (size_t k = 0; k < d->start && lc && a + lc <= b && !memcmp(s + a, d->a, lc); k++)
				a += lc;
			for (size_t k = 0; k < d->stop && lc && b >= a + lc && !memcmp(s + b - lc, d->a, lc); k++)
				b -= lc;
			pieces_add(tmp, s + a, b - a);
		}
		break;
	}
	case DEC_BYTELEVEL: {
		struct buf raw = { 0 };
		for (size_t i = 0; i < ps->n; i++) {
			size_t n;
			const char *s = piece(ps, i, &n);
			size_t start = raw.n;
			bool ok = true;
			for (size_t k = 0; k < n;) {
				utf8proc_int32_t cp;
				utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)s + k, (utf8proc_ssize_t)(n - k), &cp);
				if (r <= 0 || cp >= 324 || cp_byte[cp] < 0) {
					ok = false;
					break;
				}
				buf_putc(&raw, (char)cp_byte[cp]);
				k += (size_t)r;
			}
			if (!ok) {
				raw.n = start;
				buf_put(&raw, s, n);
			}
		}
		pieces_clear(tmp);
		put_lossy(&tmp->text, (const unsigned char *)(raw.p ? raw.p : ""), raw.n);
		pieces_close(tmp);
		free(raw.p);
		if (raw.oom)
			tmp->oom = true;
		break;
	}
	case DEC_METASPACE: {
		size_t lr = strlen(d->a);
		pieces_clear(tmp);
		for (size_t i = 0; i < ps->n; i++) {
			size_t n;
			const char *s = piece(ps, i, &n);
			for (size_t k = 0; k < n;) {
				if (lr && k + lr <= n && !memcmp(s + k, d->a, lr)) {
					if (!(i == 0 && d->prepend))
						buf_putc(&tmp->text, ' ');
					k += lr;
				} else {
					buf_putc(&tmp->text, s[k++]);
				}
			}
			pieces_close(tmp);
		}
		break;
	}
	}
	pieces_swap(ps, tmp);
}

/* transformers' clean_up_tokenization, in its order. */
static void cleanup_spaces(struct buf *b)
{
	static const char *pat[][2] = {
		{ " .", "." }, { " ?", "?" }, { " !", "!" }, { " ,", "," }, { " ' ", "'" },
		{ " n't", "n't" }, { " 'm", "'m" }, { " 's", "'s" }, { " 've", "'ve" }, { " 're", "'re" },
	};
	for (size_t p = 0; p < sizeof pat / sizeof *pat; p++) {
		size_t la = strlen(pat[p][0]), lb = strlen(pat[p][1]), w = 0;
		for (size_t r = 0; r < b->n;) {
			if (r + la <= b->n && !memcmp(b->p + r, pat[p][0], la)) {
				memmove(b->p + w, pat[p][1], lb);
				w += lb;
				r += la;
			} else {
				b->p[w++] = b->p[r++];
			}
		}
		b->n = w;
		if (b->p)
			b->p[w] = 0;
	}
}

enum llm_status tok_decode_buf(const struct llm_tokenizer *tk, const int32_t *ids, size_t n,
                               bool skip_special, struct buf *out)
{
	struct pieces ps = { 0 }, tmp = { 0 };
	pieces_clear(&ps);
	for (size_t i = 0; i < n; i++) {
		int32_t id = ids[i];
		if (!has_token(tk, id)) {
			pieces_free(&ps);
			return llm_fail(LLM_ERR_RANGE, "token id %d: not in the vocabulary (n_vocab %d)", id, tk->n_vocab);
		}
		if (skip_special && (tk->flags[id] & TF_SPECIAL))
			continue;
		pieces_add(&ps, tk->tok[id].s, tk->tok[id].len);
	}
	if (tk->dec) {
		decode_chain(tk->dec, &ps, &tmp);
		out->n = 0;
		buf_put(out, ps.text.p ? ps.text.p : "", ps.text.n);
	} else {
		out->n = 0;
		buf_put(out, "", 0);
		for (size_t i = 0; i < ps.n; i++) {
			size_t len;
			const char *s = piece(&ps, i, &len);
			if (i)
				buf_putc(out, ' ');
			buf_put(out, s, len);
		}
	}
	bool oom = ps.oom || ps.text.oom || tmp.oom || tmp.text.oom || out->oom;
	pieces_free(&ps);
	pieces_free(&tmp);
	if (oom)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	if (tk->cleanup)
		cleanup_spaces(out);
	return LLM_OK;
}

enum llm_status llm_tokenizer_decode(const struct llm_tokenizer *tk, const int32_t *ids,
                                     size_t n, bool skip_special, char **text, size_t *len)
{
	struct buf b = { 0 };
	*text = NULL;
	*len = 0;
	enum llm_status st = tok_decode_buf(tk, ids, n, skip_special, &b);
	if (st) {
		free(b.p);
		return st;
	}
	*text = b.p;
	*len = b.n;
	return LLM_OK;
}

enum llm_status llm_tokenizer_piece(const struct llm_tokenizer *tk, int32_t id, char **text, size_t *len)
{
	*text = NULL;
	*len = 0;
	if (!has_token(tk, id))
		return llm_fail(LLM_ERR_RANGE, "token id %d: not in the vocabulary (n_vocab %d)", id, tk->n_vocab);
	int32_t ids[5];
	size_t na = tk->n_anchor;
	memcpy(ids, tk->anchor, na * sizeof *ids);
	ids[na] = id;
	size_t al = tk->anchor_len;
	struct buf b = { 0 };
	enum llm_status st = tok_decode_buf(tk, ids, na + 1, false, &b);
	if (!st && na && b.n >= al && !memcmp(b.p, tk->anchor_text, al)) {
		memmove(b.p, b.p + al, b.n - al + 1);
		b.n -= al;
	} else if (!st && na) {      /* the anchor's text changed: the token alone */
		st = tok_decode_buf(tk, ids + na, 1, false, &b);
	}
	if (st) {
		free(b.p);
		return st;
	}
	*text = b.p;
	*len = b.n;
	return LLM_OK;
}

enum llm_status llm_tokenizer_piece_bytes(const struct llm_tokenizer *tk, int32_t id, char **bytes, size_t *len)
{
	if (has_token(tk, id) && !(tk->flags[id] & TF_ADDED)) {
		const struct str *t = &tk->tok[id];
		unsigned char *raw = malloc(t->len + 1);   /* a byte per character at most */
		size_t m = 0;
		if (!raw)
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		int fb = tk->byte_fallback ? fallback_byte(t->s, t->len) : -1;
		if (fb >= 0) {
			raw[m++] = (unsigned char)fb;
		} else if (tk->bytelevel_dec) {
			for (size_t q = 0; q < t->len;) {
				utf8proc_int32_t cp;
				utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)t->s + q,
				                                      (utf8proc_ssize_t)(t->len - q), &cp);
				if (r <= 0 || cp >= 324 || cp_byte[cp] < 0) {
					m = 0;      /* not byte-level text: its piece */
					break;
				}
				raw[m++] = (unsigned char)cp_byte[cp];
				q += (size_t)r;
			}
		}
		if (m) {
			raw[m] = 0;
			*bytes = (char *)raw;
			*len = m;
			return LLM_OK;
		}
		free(raw);
	}
	return llm_tokenizer_piece(tk, id, bytes, len);
}

/* ---------------------------------------------------------------- streaming */

void llm_detok_stream_init(struct llm_detok_stream *s, const struct llm_tokenizer *tk, bool skip_special)
{
	memset(s, 0, sizeof *s);
	s->tk = tk;
	s->skip_special = skip_special;
}

void llm_detok_stream_free(struct llm_detok_stream *s)
{
	free(s->ids);
	free(s->out);
	free(s->tail);
	memset(s, 0, sizeof *s);
}

/* How many trailing ids could still change the text before them: a run of
 * byte-fallback bytes, or byte-level tokens whose bytes end inside a
 * UTF-8 character. Special ids that SKIP_SPECIAL leaves out add no text:
 * the bytes on either side of them join (as in tok_decode_buf), so they are
 * looked through, and held with the bytes before them. */
static size_t unstable_tail(const struct llm_tokenizer *tk, const int32_t *ids, size_t n, bool skip_special)
{
	size_t k = 0, fallback = 0;
	while (k < n) {
		int32_t id = ids[n - 1 - k];
		const struct str *t = &tk->tok[id];
		if (skip_special && (tk->flags[id] & TF_SPECIAL)) {
			k++;
		} else if (fallback_byte(t->s, t->len) >= 0) {
			k++;
			fallback++;
		} else {
			break;
		}
	}
	if (fallback)
		return k;
	if (!tk->bytelevel_dec)
		return 0;
	/* The last bytes of the stream (at most 8), with the token each came from. */
	unsigned char by[8];
	size_t from[8], nb = 0;
	for (size_t j = 0; j < n && nb < 4; j++) {
		if (skip_special && (tk->flags[ids[n - 1 - j]] & TF_SPECIAL))
			continue;
		const struct str *t = &tk->tok[ids[n - 1 - j]];
		unsigned char tb[64];
		size_t m = 0;
		for (size_t q = 0; q < t->len && m < sizeof tb;) {
			utf8proc_int32_t cp;
			utf8proc_ssize_t r = utf8proc_iterate((const utf8proc_uint8_t *)t->s + q,
			                                      (utf8proc_ssize_t)(t->len - q), &cp);
			if (r <= 0 || cp >= 324 || cp_byte[cp] < 0)
				return 0;   /* not a byte-level token: its text is whole */
			tb[m++] = (unsigned char)cp_byte[cp];
			q += (size_t)r;
		}
		while (m > 0 && nb < 8) {   /* prepend tb, last byte first */
			memmove(by + 1, by, nb);
			memmove(from + 1, from, nb * sizeof *from);
			by[0] = tb[--m];
			from[0] = j;
			nb++;
		}
	}
	for (size_t q = nb; q > 0 && nb - q < 4; q--) {
		unsigned c = by[q - 1];
		if ((c & 0xC0) == 0x80)
			continue;
		size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
		return nb - (q - 1) >= need ? 0 : from[q - 1] + 1;
	}
	return 0;
}

/* The length of the first N bytes of text P less a tail that clean-up
 * could still rewrite when more text follows. */
static size_t cleanup_stable(const struct llm_tokenizer *tk, const char *p, size_t n)
{
	static const char *pre[] = { " n'", " 'r", " 'v", " n", " '", " " };
	if (!tk->cleanup)
		return n;
	for (size_t i = 0; i < sizeof pre / sizeof *pre; i++) {
		size_t l = strlen(pre[i]);
		if (n >= l && !memcmp(p + n - l, pre[i], l))
			return n - l;
	}
	return n;
}

static enum llm_status stream_emit(struct llm_detok_stream *s, bool final, const char **text, size_t *len)
{
	const struct llm_tokenizer *tk = s->tk;
	size_t hold = final ? 0 : unstable_tail(tk, s->ids, s->n, s->skip_special);
	struct buf b = { 0 };
	LLM_TRY(tok_decode_buf(tk, s->ids, s->n - hold, s->skip_special, &b));
	/* hold back a tail that clean-up could still rewrite (no decoder: tokens
	 * are joined by spaces; the same rule) */
	size_t stable = final ? b.n : cleanup_stable(tk, b.p, b.n);
	size_t from = s->emitted;
	if (s->junction) {          /* primed: after the prompt's text as far as it still agrees */
		size_t k = 0;
		while (k < s->tail_len && s->fixed + k < b.n && b.p[s->fixed + k] == s->tail[k])
			k++;
		from = s->fixed + k;
	}
	free(s->out);
	s->out = NULL;
	if (stable > from) {
		s->out = malloc(stable - from + 1);
		if (!s->out) {
			free(b.p);
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		}
		memcpy(s->out, b.p + from, stable - from);
		s->out[stable - from] = 0;
		*len = stable - from;
		s->emitted = stable;
		s->junction = false;
	} else {
		s->out = calloc(1, 1);
		*len = 0;
	}
	*text = s->out ? s->out : "";
	/* Re-anchor the window once nothing is held back, keeping a few ids of
	 * context so decoders that treat the first token specially agree: four
	 * that add text (special ids left out add none). Not when a Strip
	 * decoder cuts the end of the text: what it cut is held back unseen,
	 * and the window's own start could cut it again (the whole decode is
	 * redone each time instead; no real tokenizer has such a decoder). */
	size_t keep = 0;
	if (!final && hold == 0 && stable == b.n && !s->junction && s->n > 32 && !tk->strip_tail)
		for (size_t seen = 0; keep < s->n && seen < 4; keep++)
			if (!(s->skip_special && (tk->flags[s->ids[s->n - 1 - keep]] & TF_SPECIAL)))
				seen++;
	if (keep && keep < s->n) {
		memmove(s->ids, s->ids + s->n - keep, keep * sizeof *s->ids);
		s->n = keep;
		struct buf c = { 0 };
		enum llm_status st = tok_decode_buf(tk, s->ids, s->n, s->skip_special, &c);
		s->emitted = c.n;
		free(c.p);
		if (st) {
			free(b.p);
			return st;
		}
	}
	free(b.p);
	return LLM_OK;
}

enum llm_status llm_detok_stream_prime(struct llm_detok_stream *s, const int32_t *ids, size_t n)
{
	const struct llm_tokenizer *tk = s->tk;
	/* The prompt's last ids: its last byte-fallback run whole (the run's
	 * text depends on all its bytes: one U+FFFD per byte when it is not
	 * UTF-8), past 4096 bytes from a character's first byte on, and four ids
	 * before it that add text, as context for the decoders that treat the
	 * first token specially. */
	size_t start = n, seen = 0, run = 0;
	while (start > 0 && seen < 4) {
		int32_t id = ids[--start];
		if (!has_token(tk, id) || (s->skip_special && (tk->flags[id] & TF_SPECIAL)))
			continue;
		int byte = fallback_byte(tk->tok[id].s, tk->tok[id].len);
		if (byte < 0 || seen)
			seen++;
		else if (++run >= 4096 && (byte & 0xC0) != 0x80)
			break;
	}
	size_t m = 0;
	for (size_t i = start; i < n; i++)
		m += has_token(tk, ids[i]);
	if (m > s->cap) {
		int32_t *p = realloc(s->ids, (m + 64) * sizeof *p);
		if (!p)
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		s->ids = p;
		s->cap = m + 64;
	}
	s->n = 0;
	for (size_t i = start; i < n; i++)
		if (has_token(tk, ids[i]))
			s->ids[s->n++] = ids[i];
	/* FIXED: the text of the ids before the unstable tail, less what
	 * clean-up may rewrite, as far as the whole text agrees; TAIL: the
	 * rest of the prompt's whole text */
	size_t u = unstable_tail(tk, s->ids, s->n, s->skip_special);
	struct buf b = { 0 }, w = { 0 };
	enum llm_status st = tok_decode_buf(tk, s->ids, s->n - u, s->skip_special, &b);
	if (!st)
		st = tok_decode_buf(tk, s->ids, s->n, s->skip_special, &w);
	if (st) {
		free(b.p);
		free(w.p);
		return st;
	}
	size_t fixed = cleanup_stable(tk, b.p, b.n), k = 0;
	while (k < fixed && k < w.n && b.p[k] == w.p[k])
		k++;
	s->fixed = k;
	free(b.p);
	free(s->tail);
	s->tail = w.p;
	s->tail_len = w.n - s->fixed;
	memmove(s->tail, s->tail + s->fixed, s->tail_len + 1);
	s->emitted = s->fixed;
	s->junction = true;
	return LLM_OK;
}

enum llm_status llm_detok_stream_push(struct llm_detok_stream *s, int32_t id, const char **text, size_t *len)
{
	*text = "";
	*len = 0;
	if (!has_token(s->tk, id))
		return llm_fail(LLM_ERR_RANGE, "token id %d: not in the vocabulary (n_vocab %d)", id, s->tk->n_vocab);
	LLM_TRY(LLM_ARRAY_RESERVE(s->ids, s->cap, s->n + 1));
	s->ids[s->n++] = id;
	return stream_emit(s, false, text, len);
}

enum llm_status llm_detok_stream_flush(struct llm_detok_stream *s, const char **text, size_t *len)
{
	*text = "";
	*len = 0;
	if (!s->n)
		return LLM_OK;
	return stream_emit(s, true, text, len);
}

/* ---------------------------------------------------------------- lookups */

int32_t llm_tokenizer_n_vocab(const struct llm_tokenizer *tk) { return tk->n_vocab; }
int llm_tokenizer_model_ctx(const struct llm_tokenizer *tk) { return tk->model_ctx; }

size_t llm_tokenizer_max_bytes(const struct llm_tokenizer *tk, int64_t n_tokens)
{
	if (!tk->bytes_per_token || n_tokens < 0 || (uint64_t)n_tokens > SIZE_MAX / tk->bytes_per_token)
		return SIZE_MAX;
	return (size_t)n_tokens * tk->bytes_per_token;
}
int32_t llm_tokenizer_bos(const struct llm_tokenizer *tk) { return tk->bos; }
int32_t llm_tokenizer_eos(const struct llm_tokenizer *tk) { return tk->eos; }

bool llm_tokenizer_is_eos(const struct llm_tokenizer *tk, int32_t id)
{
	for (size_t i = 0; i < tk->n_eos; i++)
		if (tk->eos_ids[i] == id)
			return true;
	return false;
}

size_t llm_tokenizer_eos_ids(const struct llm_tokenizer *tk, const int32_t **ids)
{
	*ids = tk->eos_ids;
	return tk->n_eos;
}

bool llm_tokenizer_is_special(const struct llm_tokenizer *tk, int32_t id)
{
	return id >= 0 && id < tk->n_vocab && (tk->flags[id] & TF_SPECIAL);
}

const char *llm_tokenizer_token(const struct llm_tokenizer *tk, int32_t id)
{
	return id >= 0 && id < tk->n_vocab ? tk->tok[id].s : NULL;
}

int32_t llm_tokenizer_find(const struct llm_tokenizer *tk, const char *s)
{
	return tok_smap_get(&tk->tmap, s, strlen(s));
}

bool llm_tokenizer_adds_bos(const struct llm_tokenizer *tk)
{
	return tk->n_post_pre > 0 && tk->bos >= 0 && tk->post_pre[0] == tk->bos;
}

const char *llm_tokenizer_chat_template(const struct llm_tokenizer *tk) { return tk->chat_template; }
const char *llm_tokenizer_config_json(const struct llm_tokenizer *tk) { return tk->config_json; }

static void *detok_open(void *ctx)
{
	struct llm_detok_stream *d = calloc(1, sizeof *d);
	if (d)
		llm_detok_stream_init(d, ctx, true);
	return d;
}

static int detok_push(void *st, int32_t id, const char **text, size_t *len)
{
	struct llm_detok_stream *d = st;
	if (!has_token(d->tk, id)) {
		*text = "";
		*len = 0;
		return 0;
	}
	return llm_detok_stream_push(d, id, text, len) ? -1 : 0;
}

static int detok_prime(void *st, const int32_t *ids, size_t n)
{
	return llm_detok_stream_prime(st, ids, n) ? -1 : 0;
}

static int detok_flush(void *st, const char **text, size_t *len)
{
	return llm_detok_stream_flush(st, text, len) ? -1 : 0;
}

static void detok_close(void *st)
{
	llm_detok_stream_free(st);
	free(st);
}

void llm_tokenizer_detok(struct llm_detok *d, const struct llm_tokenizer *tk)
{
	*d = (struct llm_detok){ detok_open, detok_push, detok_flush, detok_close, (void *)tk, detok_prime };
}
