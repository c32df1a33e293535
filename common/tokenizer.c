/* common/tokenizer.c: Hugging Face tokenizer.json BPE, encode and decode.
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
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include "banned.h"

/* ---------------------------------------------------------------- buffers */

/* A growable byte buffer; an allocation failure sets oom and later appends
 * do nothing, so callers check once at the end. */
struct buf { char *p; size_t n, cap; bool oom; };

static void buf_reserve(struct buf *b, size_t extra)
{
	if (b->oom || b->n + extra + 1 <= b->cap)
		return;
	size_t cap = b->cap ? b->cap : 64;
	while (cap < b->n + extra + 1)
		cap *= 2;
	char *p = realloc(b->p, cap);
	if (!p) {
		b->oom = true;
		return;
	}
	b->p = p;
	b->cap = cap;
}

static void buf_put(struct buf *b, const void *s, size_t n)
{
	buf_reserve(b, n);
	if (b->oom)
		return;
	if (n)
		memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

static void buf_putc(struct buf *b, char c) { buf_put(b, &c, 1); }

/* A list of strings stored back to back: piece i is text.p[off[i]..off[i+1]). */
struct pieces {
	struct buf text;
	size_t *off;       /* (n + 1) */
	size_t n, cap;
	bool oom;
};

static void pieces_clear(struct pieces *ps)
{
	ps->text.n = 0;
	ps->n = 0;
	if (!ps->off) {
		ps->off = malloc(16 * sizeof *ps->off);
		ps->cap = ps->off ? 15 : 0;
		if (!ps->off)
			ps->oom = true;
	}
	if (ps->off)
		ps->off[0] = 0;
}

/* Close the current piece (the bytes appended since the last close). */
static void pieces_close(struct pieces *ps)
{
	if (ps->oom)
		return;
	if (ps->n + 1 >= ps->cap) {
		size_t cap = ps->cap * 2 + 16;
		size_t *o = realloc(ps->off, (cap + 1) * sizeof *o);
		if (!o) {
			ps->oom = true;
			return;
		}
		ps->off = o;
		ps->cap = cap;
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
	return ps->text.p + ps->off[i];
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

static void init_bytelevel(void)
{
	if (!byte_cp['!'])   /* only if constructors did not run */
		init_bytelevel_tables();
}

/* ---------------------------------------------------------------- hashing */

static uint64_t hash_bytes(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ULL;
	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 0x100000001b3ULL;
	}
	h ^= h >> 33;            /* finalize: FNV's high bits are weak */
	h *= 0xff51afd7ed558ccdULL;
	return h ^ (h >> 33);
}

struct str { const char *s; uint32_t len; };

/* text -> id, open addressing over ids whose text is keys[id]. Each slot
 * keeps 32 bits of the hash so probing rarely touches the key text (the
 * vocab is too big for the cache: loading does ~3 lookups per merge). */
struct smap { uint64_t *slot; size_t mask; const struct str *keys; };   /* tag << 32 | (id + 1); 0: empty */

static int smap_init(struct smap *m, size_t n, const struct str *keys)
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

static int32_t smap_get(const struct smap *m, const char *s, size_t n)
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
static void smap_put(struct smap *m, int32_t id)
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

/* (left id, right id) -> (rank, merged id). */
struct mmap { uint64_t *key; uint32_t *rank; int32_t *id; size_t mask; };

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdULL;
	x ^= x >> 33;
	return x;
}

static int mmap_init(struct mmap *m, size_t n)
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
static void mmap_put(struct mmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id)
{
	uint64_t k = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
	for (size_t i = mix64(k) & m->mask;; i = (i + 1) & m->mask) {
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
	for (size_t i = mix64(k) & m->mask;; i = (i + 1) & m->mask) {
		if (m->key[i] == k) {
			*rank = m->rank[i];
			*id = m->id[i];
			return true;
		}
		if (m->key[i] == UINT64_MAX)
			return false;
	}
}

/* ---------------------------------------------------------------- components */

enum { SPLIT_ISOLATED, SPLIT_REMOVED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS };

enum norm_type { NORM_SEQ, NORM_PREPEND, NORM_REPLACE, NORM_UNICODE, NORM_LOWER, NORM_STRIP };
struct norm {
	enum norm_type type;
	char *a, *b;              /* prepend text / replace pattern and content */
	pcre2_code *re;           /* replace by regex */
	int uflags;               /* utf8proc flags of NFC/NFD/NFKC/NFKD */
	bool left, right;         /* Strip */
	struct norm *sub;
	size_t n_sub;
};

enum pre_type { PRE_SEQ, PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE };
struct pre {
	enum pre_type type;
	pcre2_code *re;           /* Split pattern; ByteLevel's GPT-2 regex when use_regex */
	int behavior;
	bool invert;
	bool add_prefix_space;    /* ByteLevel */
	char *repl;               /* Metaspace replacement (UTF-8) */
	int prepend;              /* Metaspace: 0 never, 1 first, 2 always */
	bool split;               /* Metaspace */
	struct pre *sub;
	size_t n_sub;
};

enum dec_type { DEC_SEQ, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_BYTELEVEL, DEC_METASPACE };
struct dec {
	enum dec_type type;
	char *a, *b;              /* Replace pattern / content; Strip content; Metaspace replacement */
	size_t start, stop;       /* Strip */
	int prepend;              /* Metaspace */
	struct dec *sub;
	size_t n_sub;
};

struct added {
	const char *s;
	size_t len;
	int32_t id;
	bool lstrip, rstrip, special;
};

enum { TF_SPECIAL = 1, TF_ADDED = 2 };

struct llm_tokenizer {
	char *origin;                 /* for messages: "DIR/tokenizer.json" */
	int32_t n_vocab;              /* max id + 1 */
	struct str *tok;              /* (n_vocab) id -> token text (added content wins) */
	struct str *vocab;            /* (n_vocab) id -> model vocab text (len 0 + NULL: none) */
	uint8_t *flags;               /* (n_vocab) TF_* */
	char **arena;                 /* copies of token strings */
	size_t n_arena;
	struct smap vmap;             /* model vocab */
	struct smap tmap;             /* every token text, added first */
	struct mmap merges;
	struct added *added;
	size_t n_added;
	uint32_t *abucket;            /* (n_added) added indices by first byte, longest first */
	uint32_t aidx[257];           /* abucket[aidx[c] .. aidx[c + 1]) start with byte c */
	struct norm *norm;
	struct pre *pre;
	struct dec *dec;
	bool byte_fallback, fuse_unk, ignore_merges;
	int32_t unk_id;
	int32_t byte_id[256];         /* <0xXX> */
	int32_t post_pre[8], post_post[8];
	size_t n_post_pre, n_post_post;
	int32_t bos, eos;
	int32_t eos_ids[16];
	size_t n_eos;
	bool cleanup;
	bool bytelevel_dec;             /* the decoder has a ByteLevel step */
	char *chat_template;
	char *config_json;
	int32_t anchor[4];            /* "a" encoded: the text llm_tokenizer_piece decodes after */
	size_t n_anchor;
	char anchor_text[16];         /* their decoded text */
	size_t anchor_len;
};

/* ID names a token (model vocabulary or added): decodable. */
static bool has_token(const struct llm_tokenizer *tk, int32_t id)
{
	return id >= 0 && id < tk->n_vocab && tk->tok[id].s;
}

/* ---------------------------------------------------------------- loading */

struct loader {
	struct llm_tokenizer *tk;
	const char *file;             /* "DIR/tokenizer.json" */
};

#define LFAIL(L, st, ...) (llm_fail_prefix(llm_fail((st), __VA_ARGS__), "%s", (L)->file))

static char *xstrdup(const char *s) { return s ? strdup(s) : NULL; }

static const char *jstr(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

static bool jbool(json_t *o, const char *key, bool def)
{
	json_t *v = json_object_get(o, key);
	return json_is_boolean(v) ? json_is_true(v) : def;
}

/* Rewrite \s and \S so they mean Unicode White_Space (Rust regex, Oniguruma
 * and Python agree on it; PCRE2's UCP \s leaves out U+0085). */
#define WS_SET "\\t\\n\\x{0B}\\f\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}"

static char *rewrite_regex(const char *pat)
{
	struct buf b = { 0 };
	bool in_class = false;
	for (const char *p = pat; *p; p++) {
		if (*p == '\\' && p[1]) {
			if (p[1] == 's') {
				buf_put(&b, in_class ? WS_SET : "[" WS_SET "]", strlen(WS_SET) + (in_class ? 0 : 2));
			} else if (p[1] == 'S' && !in_class) {
				buf_put(&b, "[^" WS_SET "]", strlen(WS_SET) + 3);
			} else {
				buf_put(&b, p, 2);
			}
			p++;
			continue;
		}
		if (*p == '[' && !in_class) {
			in_class = true;
			buf_putc(&b, *p);
			if (p[1] == '^')
				buf_putc(&b, *++p);
			if (p[1] == ']')
				buf_putc(&b, *++p);
			continue;
		}
		if (*p == ']' && in_class)
			in_class = false;
		buf_putc(&b, *p);
	}
	if (b.oom) {
		free(b.p);
		return NULL;
	}
	return b.p ? b.p : strdup("");
}

static enum llm_status compile_re(struct loader *L, const char *pat, bool literal,
                                  const char *where, pcre2_code **out)
{
	char *p = literal ? strdup(pat) : rewrite_regex(pat);
	if (!p)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	int err;
	PCRE2_SIZE off;
	uint32_t opt = PCRE2_UTF | PCRE2_UCP | (literal ? PCRE2_LITERAL : 0);
	*out = pcre2_compile((PCRE2_SPTR)p, PCRE2_ZERO_TERMINATED, opt, &err, &off, NULL);
	free(p);
	if (!*out) {
		PCRE2_UCHAR msg[160];
		pcre2_get_error_message(err, msg, sizeof msg);
		return LFAIL(L, LLM_ERR_UNSUPPORTED, "%s: regex at offset %zu: %s", where, (size_t)off, msg);
	}
	pcre2_jit_compile(*out, PCRE2_JIT_COMPLETE);   /* falls back to the interpreter */
	return LLM_OK;
}

/* {"String": s} or {"Regex": r}. */
static enum llm_status load_pattern(struct loader *L, json_t *pat, const char *where,
                                    char **lit, pcre2_code **re)
{
	const char *s;
	if ((s = jstr(pat, "String"))) {
		if (lit) {
			*lit = strdup(s);
			return *lit ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "out of memory");
		}
		return compile_re(L, s, true, where, re);
	}
	if ((s = jstr(pat, "Regex")))
		return compile_re(L, s, false, where, re);
	return LFAIL(L, LLM_ERR_FORMAT, "%s: pattern: expected {\"String\": ...} or {\"Regex\": ...}", where);
}

static enum llm_status load_norm(struct loader *L, json_t *j, struct norm *n)
{
	const char *type = jstr(j, "type");
	if (!type)
		return LFAIL(L, LLM_ERR_FORMAT, "normalizer: missing \"type\"");
	if (!strcmp(type, "Sequence")) {
		json_t *a = json_object_get(j, "normalizers");
		if (!json_is_array(a))
			return LFAIL(L, LLM_ERR_FORMAT, "normalizer: Sequence: \"normalizers\" is not a list");
		n->type = NORM_SEQ;
		n->sub = calloc(json_array_size(a) + 1, sizeof *n->sub);
		if (!n->sub)
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		/* counted before it loads: a member that fails part way is freed too */
		for (size_t i = 0; i < json_array_size(a); i++) {
			n->n_sub++;
			LLM_TRY(load_norm(L, json_array_get(a, i), &n->sub[i]));
		}
	} else if (!strcmp(type, "Prepend")) {
		n->type = NORM_PREPEND;
		if (!jstr(j, "prepend"))
			return LFAIL(L, LLM_ERR_FORMAT, "normalizer: Prepend: \"prepend\" is not a string");
		n->a = xstrdup(jstr(j, "prepend"));
	} else if (!strcmp(type, "Replace")) {
		n->type = NORM_REPLACE;
		if (!jstr(j, "content"))
			return LFAIL(L, LLM_ERR_FORMAT, "normalizer: Replace: \"content\" is not a string");
		n->b = xstrdup(jstr(j, "content"));
		LLM_TRY(load_pattern(L, json_object_get(j, "pattern"), "normalizer: Replace", &n->a, &n->re));
	} else if (!strcmp(type, "NFC") || !strcmp(type, "NFD") || !strcmp(type, "NFKC") || !strcmp(type, "NFKD")) {
		n->type = NORM_UNICODE;
		n->uflags = UTF8PROC_STABLE | (type[2] == 'C' || type[3] == 'C' ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE)
		            | (type[2] == 'K' ? UTF8PROC_COMPAT : 0);
	} else if (!strcmp(type, "Lowercase")) {
		n->type = NORM_LOWER;
	} else if (!strcmp(type, "Strip")) {
		n->type = NORM_STRIP;
		n->left = jbool(j, "strip_left", true);
		n->right = jbool(j, "strip_right", true);
	} else {
		return LFAIL(L, LLM_ERR_UNSUPPORTED, "normalizer: unsupported type '%s'", type);
	}
	return LLM_OK;
}

static const char GPT2_RE[] =
	"'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static enum llm_status load_pre(struct loader *L, json_t *j, struct pre *p)
{
	const char *type = jstr(j, "type");
	if (!type)
		return LFAIL(L, LLM_ERR_FORMAT, "pre_tokenizer: missing \"type\"");
	if (!strcmp(type, "Sequence")) {
		json_t *a = json_object_get(j, "pretokenizers");
		if (!json_is_array(a))
			return LFAIL(L, LLM_ERR_FORMAT, "pre_tokenizer: Sequence: \"pretokenizers\" is not a list");
		p->type = PRE_SEQ;
		p->sub = calloc(json_array_size(a) + 1, sizeof *p->sub);
		if (!p->sub)
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		/* counted before it loads: a member that fails part way is freed too */
		for (size_t i = 0; i < json_array_size(a); i++) {
			p->n_sub++;
			LLM_TRY(load_pre(L, json_array_get(a, i), &p->sub[i]));
		}
	} else if (!strcmp(type, "Split")) {
		p->type = PRE_SPLIT;
		LLM_TRY(load_pattern(L, json_object_get(j, "pattern"), "pre_tokenizer: Split", NULL, &p->re));
		const char *b = jstr(j, "behavior");
		static const char *names[] = { "Isolated", "Removed", "MergedWithPrevious", "MergedWithNext", "Contiguous" };
		p->behavior = -1;
		for (int i = 0; i < 5; i++)
			if (b && !strcmp(b, names[i]))
				p->behavior = i;
		if (p->behavior < 0)
			return LFAIL(L, LLM_ERR_FORMAT, "pre_tokenizer: Split: unknown behavior '%s'", b ? b : "(none)");
		p->invert = jbool(j, "invert", false);
	} else if (!strcmp(type, "ByteLevel")) {
		p->type = PRE_BYTELEVEL;
		p->add_prefix_space = jbool(j, "add_prefix_space", true);
		if (jbool(j, "use_regex", true))
			LLM_TRY(compile_re(L, GPT2_RE, false, "pre_tokenizer: ByteLevel", &p->re));
	} else if (!strcmp(type, "Metaspace")) {
		p->type = PRE_METASPACE;
		p->repl = xstrdup(jstr(j, "replacement") ? jstr(j, "replacement") : "\xe2\x96\x81");
		const char *sch = jstr(j, "prepend_scheme");
		p->prepend = sch ? (!strcmp(sch, "always") ? 2 : !strcmp(sch, "first") ? 1 : 0)
		                 : (jbool(j, "add_prefix_space", true) ? 2 : 0);
		p->split = jbool(j, "split", true);
	} else if (!strcmp(type, "Digits")) {
		p->type = PRE_SPLIT;
		bool ind = jbool(j, "individual_digits", false);
		p->behavior = ind ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
		LLM_TRY(compile_re(L, "\\p{N}", false, "pre_tokenizer: Digits", &p->re));
	} else if (!strcmp(type, "WhitespaceSplit")) {
		p->type = PRE_SPLIT;
		p->behavior = SPLIT_REMOVED;
		LLM_TRY(compile_re(L, "\\s+", false, "pre_tokenizer: WhitespaceSplit", &p->re));
	} else if (!strcmp(type, "Whitespace")) {
		p->type = PRE_SPLIT;
		p->behavior = SPLIT_REMOVED;
		p->invert = true;
		LLM_TRY(compile_re(L, "\\w+|[^\\w\\s]+", false, "pre_tokenizer: Whitespace", &p->re));
	} else {
		return LFAIL(L, LLM_ERR_UNSUPPORTED, "pre_tokenizer: unsupported type '%s'", type);
	}
	return LLM_OK;
}

static enum llm_status load_dec(struct loader *L, json_t *j, struct dec *d)
{
	const char *type = jstr(j, "type");
	if (!type)
		return LFAIL(L, LLM_ERR_FORMAT, "decoder: missing \"type\"");
	if (!strcmp(type, "Sequence")) {
		json_t *a = json_object_get(j, "decoders");
		if (!json_is_array(a))
			return LFAIL(L, LLM_ERR_FORMAT, "decoder: Sequence: \"decoders\" is not a list");
		d->type = DEC_SEQ;
		d->sub = calloc(json_array_size(a) + 1, sizeof *d->sub);
		if (!d->sub)
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		/* counted before it loads: a member that fails part way is freed too */
		for (size_t i = 0; i < json_array_size(a); i++) {
			d->n_sub++;
			LLM_TRY(load_dec(L, json_array_get(a, i), &d->sub[i]));
		}
	} else if (!strcmp(type, "Replace")) {
		d->type = DEC_REPLACE;
		const char *s = jstr(json_object_get(j, "pattern"), "String");
		if (!s)
			return LFAIL(L, LLM_ERR_UNSUPPORTED, "decoder: Replace: only a String pattern is supported");
		if (!jstr(j, "content"))
			return LFAIL(L, LLM_ERR_FORMAT, "decoder: Replace: \"content\" is not a string");
		d->a = xstrdup(s);
		d->b = xstrdup(jstr(j, "content"));
	} else if (!strcmp(type, "ByteFallback")) {
		d->type = DEC_BYTEFALLBACK;
	} else if (!strcmp(type, "Fuse")) {
		d->type = DEC_FUSE;
	} else if (!strcmp(type, "Strip")) {
		d->type = DEC_STRIP;
		const char *c = jstr(j, "content");
		d->a = xstrdup(c ? c : " ");
		json_t *s = json_object_get(j, "start"), *e = json_object_get(j, "stop");
		if ((s && !json_is_integer(s)) || (e && !json_is_integer(e)))
			return LFAIL(L, LLM_ERR_FORMAT, "decoder: Strip: start/stop are not integers");
		d->start = s ? (size_t)json_integer_value(s) : 0;
		d->stop = e ? (size_t)json_integer_value(e) : 0;
	} else if (!strcmp(type, "ByteLevel")) {
		d->type = DEC_BYTELEVEL;
		L->tk->bytelevel_dec = true;
	} else if (!strcmp(type, "Metaspace")) {
		d->type = DEC_METASPACE;
		d->a = xstrdup(jstr(j, "replacement") ? jstr(j, "replacement") : "\xe2\x96\x81");
		const char *sch = jstr(j, "prepend_scheme");
		d->prepend = sch ? (!strcmp(sch, "never") ? 0 : 1) : (jbool(j, "add_prefix_space", true) ? 1 : 0);
	} else {
		return LFAIL(L, LLM_ERR_UNSUPPORTED, "decoder: unsupported type '%s'", type);
	}
	return LLM_OK;
}

static char *arena_dup(struct llm_tokenizer *tk, const char *s, size_t n)
{
	char **a = realloc(tk->arena, (tk->n_arena + 1) * sizeof *a);
	if (!a)
		return NULL;
	tk->arena = a;
	char *p = malloc(n + 1);
	if (!p)
		return NULL;
	memcpy(p, s, n);
	p[n] = 0;
	a[tk->n_arena++] = p;
	return p;
}

/* One id list of a post-processor special token: {"ids": [..]}. */
static enum llm_status post_special(struct loader *L, json_t *specials, const char *name,
                                    int32_t *dst, size_t *n)
{
	json_t *st = json_object_get(specials, name);
	json_t *ids = json_object_get(st, "ids");
	if (!json_is_array(ids))
		return LFAIL(L, LLM_ERR_FORMAT, "post_processor: special token '%s' has no ids", name);
	for (size_t i = 0; i < json_array_size(ids); i++) {
		json_t *v = json_array_get(ids, i);
		if (!json_is_integer(v) || *n >= 8)
			return LFAIL(L, LLM_ERR_FORMAT, "post_processor: special token '%s': bad ids", name);
		dst[(*n)++] = (int32_t)json_integer_value(v);
	}
	return LLM_OK;
}

static enum llm_status load_post(struct loader *L, json_t *j)
{
	struct llm_tokenizer *tk = L->tk;
	const char *type = jstr(j, "type");
	if (!type)
		return LFAIL(L, LLM_ERR_FORMAT, "post_processor: missing \"type\"");
	if (!strcmp(type, "Sequence")) {
		json_t *a = json_object_get(j, "processors");
		if (!json_is_array(a))
			return LFAIL(L, LLM_ERR_FORMAT, "post_processor: Sequence: \"processors\" is not a list");
		for (size_t i = 0; i < json_array_size(a); i++)
			LLM_TRY(load_post(L, json_array_get(a, i)));
	} else if (!strcmp(type, "ByteLevel")) {
		/* offsets only */
	} else if (!strcmp(type, "TemplateProcessing")) {
		json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
		if (!json_is_array(single))
			return LFAIL(L, LLM_ERR_FORMAT, "post_processor: TemplateProcessing: \"single\" is not a list");
		bool seen_a = false;
		for (size_t i = 0; i < json_array_size(single); i++) {
			json_t *it = json_array_get(single, i), *st;
			if ((st = json_object_get(it, "SpecialToken"))) {
				const char *id = jstr(st, "id");
				if (!id)
					return LFAIL(L, LLM_ERR_FORMAT, "post_processor: SpecialToken without id");
				if (seen_a)
					LLM_TRY(post_special(L, specials, id, tk->post_post, &tk->n_post_post));
				else
					LLM_TRY(post_special(L, specials, id, tk->post_pre, &tk->n_post_pre));
			} else if (json_object_get(it, "Sequence")) {
				seen_a = true;
			} else {
				return LFAIL(L, LLM_ERR_FORMAT, "post_processor: TemplateProcessing: bad item %zu", i);
			}
		}
	} else if (!strcmp(type, "RobertaProcessing") || !strcmp(type, "BertProcessing")) {
		json_t *cls = json_object_get(j, "cls"), *sep = json_object_get(j, "sep");
		if (!json_is_array(cls) || !json_is_integer(json_array_get(cls, 1)) ||
		    !json_is_array(sep) || !json_is_integer(json_array_get(sep, 1)))
			return LFAIL(L, LLM_ERR_FORMAT, "post_processor: %s: bad cls/sep", type);
		tk->post_pre[tk->n_post_pre++] = (int32_t)json_integer_value(json_array_get(cls, 1));
		tk->post_post[tk->n_post_post++] = (int32_t)json_integer_value(json_array_get(sep, 1));
	} else {
		return LFAIL(L, LLM_ERR_UNSUPPORTED, "post_processor: unsupported type '%s'", type);
	}
	return LLM_OK;
}

static int cmp_added(const void *a, const void *b, void *ctx)
{
	const struct added *ad = ctx;
	const struct added *x = &ad[*(const uint32_t *)a], *y = &ad[*(const uint32_t *)b];
	int cx = (unsigned char)x->s[0], cy = (unsigned char)y->s[0];
	if (cx != cy)
		return cx - cy;
	if (x->len != y->len)
		return x->len > y->len ? -1 : 1;
	return x->id - y->id;
}

static enum llm_status load_model(struct loader *L, json_t *model, json_t *added)
{
	struct llm_tokenizer *tk = L->tk;
	if (!json_is_object(model))
		return LFAIL(L, LLM_ERR_FORMAT, "model: missing or not an object");
	const char *type = jstr(model, "type");
	json_t *vocab = json_object_get(model, "vocab"), *merges = json_object_get(model, "merges");
	if (!type && json_is_array(merges))
		type = "BPE";
	if (!type)
		return LFAIL(L, LLM_ERR_FORMAT, "model: missing \"type\"");
	if (!strcmp(type, "WordPiece") || !strcmp(type, "Unigram") || !strcmp(type, "WordLevel"))
		return LFAIL(L, LLM_ERR_UNSUPPORTED, "model: type '%s' is not supported (BPE only)", type);
	if (strcmp(type, "BPE"))
		return LFAIL(L, LLM_ERR_FORMAT, "model: unknown type '%s'", type);
	if (!json_is_object(vocab))
		return LFAIL(L, LLM_ERR_FORMAT, "model: \"vocab\" is not an object");
	if (!json_is_array(merges))
		return LFAIL(L, LLM_ERR_FORMAT, "model: \"merges\" is not a list");
	if (added && !json_is_array(added))
		return LFAIL(L, LLM_ERR_FORMAT, "added_tokens: not a list");
	const char *cp = jstr(model, "continuing_subword_prefix"), *ew = jstr(model, "end_of_word_suffix");
	if ((cp && *cp) || (ew && *ew))
		return LFAIL(L, LLM_ERR_UNSUPPORTED, "model: continuing_subword_prefix/end_of_word_suffix are not supported");
	json_t *dropout = json_object_get(model, "dropout");
	if (json_is_number(dropout) && json_number_value(dropout) > 0)
		return LFAIL(L, LLM_ERR_UNSUPPORTED, "model: BPE dropout is not supported");
	tk->byte_fallback = jbool(model, "byte_fallback", false);
	tk->fuse_unk = jbool(model, "fuse_unk", false);
	tk->ignore_merges = jbool(model, "ignore_merges", false);

	/* n_vocab: one more than the largest id. */
	int64_t max_id = -1;
	const char *key;
	json_t *v;
	json_object_foreach(vocab, key, v) {
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX - 1)
			return LFAIL(L, LLM_ERR_FORMAT, "model: vocab: '%s': id is not a non-negative integer", key);
		if (json_integer_value(v) > max_id)
			max_id = json_integer_value(v);
	}
	for (size_t i = 0; added && i < json_array_size(added); i++) {
		json_t *a = json_array_get(added, i), *id = json_object_get(a, "id");
		if (!jstr(a, "content") || !json_is_integer(id) || json_integer_value(id) < 0 ||
		    json_integer_value(id) > INT32_MAX - 1)
			return LFAIL(L, LLM_ERR_FORMAT, "added_tokens[%zu]: needs \"content\" (string) and \"id\" (integer)", i);
		if (!*jstr(a, "content"))
			return LFAIL(L, LLM_ERR_FORMAT, "added_tokens[%zu]: empty content", i);
		if (json_integer_value(id) > max_id)
			max_id = json_integer_value(id);
	}
	if (max_id < 0)
		return LFAIL(L, LLM_ERR_FORMAT, "model: empty vocab");
	tk->n_vocab = (int32_t)(max_id + 1);
	size_t nv = (size_t)tk->n_vocab;
	tk->tok = calloc(nv, sizeof *tk->tok);
	tk->vocab = calloc(nv, sizeof *tk->vocab);
	tk->flags = calloc(nv, 1);
	if (!tk->tok || !tk->vocab || !tk->flags)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");

	/* One arena block for every vocab string. */
	size_t total = 0;
	json_object_foreach(vocab, key, v)
		total += strlen(key) + 1;
	char *blk = malloc(total + 1), *w = blk;
	char **ar = realloc(tk->arena, (tk->n_arena + 1) * sizeof *ar);
	if (!blk || !ar) {
		free(blk);
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	tk->arena = ar;
	ar[tk->n_arena++] = blk;
	size_t n_vocab_entries = 0;
	json_object_foreach(vocab, key, v) {
		size_t len = strlen(key);
		int32_t id = (int32_t)json_integer_value(v);
		memcpy(w, key, len + 1);
		if (tk->vocab[id].s)
			return LFAIL(L, LLM_ERR_FORMAT, "model: vocab: id %d is given twice", id);
		tk->vocab[id] = (struct str){ w, (uint32_t)len };
		tk->tok[id] = tk->vocab[id];
		w += len + 1;
		n_vocab_entries++;
	}
	if (smap_init(&tk->vmap, n_vocab_entries, tk->vocab))
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < nv; i++)
		if (tk->vocab[i].s)
			smap_put(&tk->vmap, (int32_t)i);

	/* Added tokens. */
	size_t na = added ? json_array_size(added) : 0;
	tk->added = calloc(na + 1, sizeof *tk->added);
	tk->abucket = calloc(na + 1, sizeof *tk->abucket);
	if (!tk->added || !tk->abucket)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < na; i++) {
		json_t *a = json_array_get(added, i);
		const char *c = jstr(a, "content");
		struct added *ad = &tk->added[tk->n_added++];
		ad->len = strlen(c);
		ad->s = arena_dup(tk, c, ad->len);
		if (!ad->s)
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		ad->id = (int32_t)json_integer_value(json_object_get(a, "id"));
		ad->lstrip = jbool(a, "lstrip", false);
		ad->rstrip = jbool(a, "rstrip", false);
		ad->special = jbool(a, "special", false);
		tk->tok[ad->id] = (struct str){ ad->s, (uint32_t)ad->len };
		tk->flags[ad->id] |= TF_ADDED | (ad->special ? TF_SPECIAL : 0);
		tk->abucket[i] = (uint32_t)i;
	}
	qsort_r(tk->abucket, tk->n_added, sizeof *tk->abucket, cmp_added, tk->added);
	for (int c = 0, k = 0; c <= 256; c++) {
		while (k < (int)tk->n_added && (unsigned char)tk->added[tk->abucket[k]].s[0] < c)
			k++;
		tk->aidx[c] = (uint32_t)k;
	}
	if (smap_init(&tk->tmap, nv, tk->tok))
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < tk->n_added; i++)
		smap_put(&tk->tmap, tk->added[i].id);
	for (size_t i = 0; i < nv; i++)
		if (tk->tok[i].s)
			smap_put(&tk->tmap, (int32_t)i);

	/* unk and byte fallback. */
	tk->unk_id = -1;
	json_t *unk = json_object_get(model, "unk_token");
	if (json_is_string(unk)) {
		tk->unk_id = smap_get(&tk->vmap, json_string_value(unk), strlen(json_string_value(unk)));
		if (tk->unk_id < 0)
			return LFAIL(L, LLM_ERR_FORMAT, "model: unk_token '%s' is not in the vocab", json_string_value(unk));
	}
	for (int b = 0; b < 256; b++) {
		char name[8];
		snprintf(name, sizeof name, "<0x%02X>", b);
		tk->byte_id[b] = smap_get(&tk->vmap, name, 6);
	}

	/* Merges: "a b" strings or [a, b] pairs; the merged token must exist. */
	if (mmap_init(&tk->merges, json_array_size(merges)))
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	char *tmp = NULL;
	size_t tmp_cap = 0;
	enum llm_status st = LLM_OK;
	for (size_t i = 0; i < json_array_size(merges) && !st; i++) {
		json_t *m = json_array_get(merges, i);
		const char *a, *b;
		size_t la, lb;
		if (json_is_string(m)) {
			a = json_string_value(m);
			const char *sp = strchr(a, ' ');
			if (!sp || strchr(sp + 1, ' ')) {
				st = LFAIL(L, LLM_ERR_FORMAT, "model: merges[%zu]: '%s' is not two tokens", i, a);
				break;
			}
			la = (size_t)(sp - a);
			b = sp + 1;
			lb = strlen(b);
		} else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
		           json_is_string(json_array_get(m, 1))) {
			a = json_string_value(json_array_get(m, 0));
			b = json_string_value(json_array_get(m, 1));
			la = strlen(a);
			lb = strlen(b);
		} else {
			st = LFAIL(L, LLM_ERR_FORMAT, "model: merges[%zu]: not a string or a pair of strings", i);
			break;
		}
		int32_t ia = smap_get(&tk->vmap, a, la), ib = smap_get(&tk->vmap, b, lb);
		if (la + lb + 1 > tmp_cap) {
			tmp_cap = 2 * (la + lb + 1);
			char *t = realloc(tmp, tmp_cap);
			if (!t) {
				st = llm_fail(LLM_ERR_NOMEM, "out of memory");
				break;
			}
			tmp = t;
		}
		memcpy(tmp, a, la);
		memcpy(tmp + la, b, lb);
		int32_t im = smap_get(&tk->vmap, tmp, la + lb);
		if (ia < 0 || ib < 0 || im < 0) {
			tmp[la + lb] = 0;
			st = LFAIL(L, LLM_ERR_FORMAT, "model: merges[%zu]: token '%s' is not in the vocab", i,
			           ia < 0 ? (la < 64 ? a : "(long)") : ib < 0 ? b : tmp);
			break;
		}
		mmap_put(&tk->merges, ia, ib, (uint32_t)i, im);
	}
	free(tmp);
	return st;
}

/* The text of a special token entry of a config: "x" or {"content": "x"}. */
static const char *token_text(json_t *v)
{
	if (json_is_string(v))
		return json_string_value(v);
	return jstr(v, "content");
}

static enum llm_status load_configs(struct loader *L, json_t *cfg, json_t *stm, json_t *gen)
{
	struct llm_tokenizer *tk = L->tk;
	if (!cfg)
		cfg = json_object();
	else
		json_incref(cfg);
	if (!cfg)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	/* special_tokens_map.json fills what tokenizer_config.json leaves out. */
	const char *key;
	json_t *v;
	if (json_is_object(stm))
		json_object_foreach(stm, key, v)
			if (!json_object_get(cfg, key) || json_is_null(json_object_get(cfg, key)))
				json_object_set(cfg, key, v);
	const char *bos = token_text(json_object_get(cfg, "bos_token"));
	const char *eos = token_text(json_object_get(cfg, "eos_token"));
	tk->bos = bos ? llm_tokenizer_find(tk, bos) : -1;
	tk->eos = eos ? llm_tokenizer_find(tk, eos) : -1;
	if (tk->eos >= 0)
		tk->eos_ids[tk->n_eos++] = tk->eos;
	json_t *ge = json_object_get(gen, "eos_token_id");
	for (size_t i = 0; ge && i < (json_is_array(ge) ? json_array_size(ge) : 1); i++) {
		json_t *e = json_is_array(ge) ? json_array_get(ge, i) : ge;
		if (!json_is_integer(e))
			continue;
		int32_t id = (int32_t)json_integer_value(e);
		bool dup = false;
		for (size_t k = 0; k < tk->n_eos; k++)
			dup |= tk->eos_ids[k] == id;
		if (!dup && tk->n_eos < 16 && id >= 0 && id < tk->n_vocab)
			tk->eos_ids[tk->n_eos++] = id;
	}
	if (tk->bos < 0 && json_is_integer(json_object_get(gen, "bos_token_id")))
		tk->bos = (int32_t)json_integer_value(json_object_get(gen, "bos_token_id"));
	tk->cleanup = jbool(cfg, "clean_up_tokenization_spaces", false);

	/* transformers' LlamaTokenizerFast rebuilds the post-processor from
	 * add_bos_token / add_eos_token (defaults true / false). */
	const char *cls = jstr(cfg, "tokenizer_class");
	if (cls && (!strcmp(cls, "LlamaTokenizer") || !strcmp(cls, "LlamaTokenizerFast") ||
	            !strcmp(cls, "CodeLlamaTokenizer") || !strcmp(cls, "CodeLlamaTokenizerFast"))) {
		bool ab = jbool(cfg, "add_bos_token", true), ae = jbool(cfg, "add_eos_token", false);
		tk->n_post_pre = tk->n_post_post = 0;
		if (ab && tk->bos >= 0)
			tk->post_pre[tk->n_post_pre++] = tk->bos;
		if (ae && tk->eos >= 0)
			tk->post_post[tk->n_post_post++] = tk->eos;
	}

	json_t *ct = json_object_get(cfg, "chat_template");
	if (json_is_string(ct)) {
		tk->chat_template = strdup(json_string_value(ct));
	} else if (json_is_array(ct)) {
		for (size_t i = 0; i < json_array_size(ct); i++) {
			json_t *e = json_array_get(ct, i);
			const char *name = jstr(e, "name"), *t = jstr(e, "template");
			if (name && t && !strcmp(name, "default"))
				tk->chat_template = strdup(t);
		}
	}
	json_object_del(cfg, "added_tokens_decoder");
	tk->config_json = json_dumps(cfg, JSON_COMPACT | JSON_PRESERVE_ORDER);
	json_decref(cfg);
	if (!tk->config_json)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	return LLM_OK;
}

/* Parse an optional side file; a present but broken one is an error. */
static enum llm_status parse_side(const char *origin, const struct llm_tok_files *files,
                                  const char *name, json_t **out)
{
	size_t len;
	const char *d = files->get(files->ctx, name, &len);
	*out = NULL;
	if (!d)
		return LLM_OK;
	json_error_t e;
	*out = json_loadb(d, len, JSON_ALLOW_NUL, &e);
	if (!*out && strstr(e.text, "too big integer"))   /* model_max_length 1e30 */
		*out = json_loadb(d, len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &e);
	if (!*out)
		return llm_fail(LLM_ERR_FORMAT, "%s%s%s: line %d: %s", origin, *origin ? "/" : "", name, e.line, e.text);
	if (!json_is_object(*out)) {
		json_decref(*out);
		*out = NULL;
		return llm_fail(LLM_ERR_FORMAT, "%s%s%s: not a JSON object", origin, *origin ? "/" : "", name);
	}
	return LLM_OK;
}

static enum llm_status decode_buf(const struct llm_tokenizer *tk, const int32_t *ids, size_t n,
                                  bool skip_special, struct buf *out);

enum llm_status llm_tokenizer_open_mem(struct llm_tokenizer **out, const char *origin,
                                       const struct llm_tok_files *files)
{
	*out = NULL;
	init_bytelevel();
	struct llm_tokenizer *tk = calloc(1, sizeof *tk);
	char file[4096];
	snprintf(file, sizeof file, "%s%stokenizer.json", origin, *origin ? "/" : "");
	struct loader L = { tk, file };
	json_t *j = NULL, *cfg = NULL, *stm = NULL, *gen = NULL;
	enum llm_status st = LLM_OK;
	if (!tk)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	tk->origin = strdup(file);
	tk->bos = tk->eos = tk->unk_id = -1;
	size_t len;
	const char *d = files->get(files->ctx, "tokenizer.json", &len);
	if (!d) {
		st = llm_fail(LLM_ERR_IO, "%s: not found", file);
		goto out;
	}
	json_error_t e;
	j = json_loadb(d, len, 0, &e);
	if (!j) {
		st = llm_fail(LLM_ERR_FORMAT, "%s: line %d column %d: %s", file, e.line, e.column, e.text);
		goto out;
	}
	if (!json_is_object(j)) {
		st = LFAIL(&L, LLM_ERR_FORMAT, "not a JSON object");
		goto out;
	}
	if ((st = load_model(&L, json_object_get(j, "model"), json_object_get(j, "added_tokens"))))
		goto out;
	json_t *c;
	if ((c = json_object_get(j, "normalizer")) && !json_is_null(c)) {
		tk->norm = calloc(1, sizeof *tk->norm);
		if (!tk->norm || (st = load_norm(&L, c, tk->norm)))
			goto out;
	}
	if ((c = json_object_get(j, "pre_tokenizer")) && !json_is_null(c)) {
		tk->pre = calloc(1, sizeof *tk->pre);
		if (!tk->pre || (st = load_pre(&L, c, tk->pre)))
			goto out;
	}
	if ((c = json_object_get(j, "decoder")) && !json_is_null(c)) {
		tk->dec = calloc(1, sizeof *tk->dec);
		if (!tk->dec || (st = load_dec(&L, c, tk->dec)))
			goto out;
	}
	if ((c = json_object_get(j, "post_processor")) && !json_is_null(c) && (st = load_post(&L, c)))
		goto out;
	for (size_t i = 0; i < tk->n_post_pre + tk->n_post_post; i++) {
		int32_t id = i < tk->n_post_pre ? tk->post_pre[i] : tk->post_post[i - tk->n_post_pre];
		if (!has_token(tk, id)) {
			st = LFAIL(&L, LLM_ERR_FORMAT, "post_processor: id %d is not a token", id);
			goto out;
		}
	}
	if ((st = parse_side(origin, files, "tokenizer_config.json", &cfg)) ||
	    (st = parse_side(origin, files, "special_tokens_map.json", &stm)) ||
	    (st = parse_side(origin, files, "generation_config.json", &gen)))
		goto out;
	st = load_configs(&L, cfg, stm, gen);
	if (!st) {
		int32_t *a;
		size_t na;
		struct buf at = { 0 };
		if (!llm_tokenizer_encode(tk, "a", 1, false, &a, &na) && na <= 4 &&
		    !decode_buf(tk, a, na, false, &at) && at.n < sizeof tk->anchor_text) {
			memcpy(tk->anchor, a, na * sizeof *a);
			tk->n_anchor = na;
			memcpy(tk->anchor_text, at.p, at.n);
			tk->anchor_len = at.n;
		}
		free(a);
		free(at.p);
	}
out:
	json_decref(j);
	json_decref(cfg);
	json_decref(stm);
	json_decref(gen);
	if (st == LLM_OK && !tk->origin)
		st = llm_fail(LLM_ERR_NOMEM, "out of memory");
	if (st) {
		llm_tokenizer_close(tk);
		return st;
	}
	*out = tk;
	return LLM_OK;
}

/* Files of a directory, read whole. */
struct dir_files { const char *dir; char *data[4]; const char *names[4]; size_t n; };

static const char *dir_get(void *ctx, const char *name, size_t *len)
{
	struct dir_files *df = ctx;
	char path[4096];
	snprintf(path, sizeof path, "%s/%s", df->dir, name);
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	struct buf b = { 0 };
	char tmp[65536];
	size_t k;
	while ((k = fread(tmp, 1, sizeof tmp, f)) > 0)
		buf_put(&b, tmp, k);
	bool err = ferror(f);
	fclose(f);
	if (b.oom || err || df->n >= 4) {
		free(b.p);
		*len = 0;
		return err ? NULL : "";
	}
	if (!b.p)
		buf_put(&b, "", 0);
	df->data[df->n++] = b.p;
	*len = b.n;
	return b.p;
}

enum llm_status llm_tokenizer_open(struct llm_tokenizer **tk, const char *dir)
{
	struct dir_files df = { .dir = dir };
	struct llm_tok_files files = { dir_get, &df };
	enum llm_status st = llm_tokenizer_open_mem(tk, dir, &files);
	for (size_t i = 0; i < df.n; i++)
		free(df.data[i]);
	return st;
}

static void free_norm(struct norm *n)
{
	for (size_t i = 0; i < n->n_sub; i++)
		free_norm(&n->sub[i]);
	free(n->sub);
	free(n->a);
	free(n->b);
	if (n->re)
		pcre2_code_free(n->re);
}

static void free_pre(struct pre *p)
{
	for (size_t i = 0; i < p->n_sub; i++)
		free_pre(&p->sub[i]);
	free(p->sub);
	free(p->repl);
	if (p->re)
		pcre2_code_free(p->re);
}

static void free_dec(struct dec *d)
{
	for (size_t i = 0; i < d->n_sub; i++)
		free_dec(&d->sub[i]);
	free(d->sub);
	free(d->a);
	free(d->b);
}

void llm_tokenizer_close(struct llm_tokenizer *tk)
{
	if (!tk)
		return;
	if (tk->norm)
		free_norm(tk->norm);
	if (tk->pre)
		free_pre(tk->pre);
	if (tk->dec)
		free_dec(tk->dec);
	free(tk->norm);
	free(tk->pre);
	free(tk->dec);
	for (size_t i = 0; i < tk->n_arena; i++)
		free(tk->arena[i]);
	free(tk->arena);
	free(tk->tok);
	free(tk->vocab);
	free(tk->flags);
	free(tk->vmap.slot);
	free(tk->tmap.slot);
	free(tk->merges.key);
	free(tk->merges.rank);
	free(tk->merges.id);
	free(tk->added);
	free(tk->abucket);
	free(tk->chat_template);
	free(tk->config_json);
	free(tk->origin);
	free(tk);
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
	if (e->n_ids == e->cap_ids) {
		size_t cap = e->cap_ids * 2 + 64;
		int32_t *p = realloc(e->ids, cap * sizeof *p);
		if (!p) {
			e->oom = true;
			return;
		}
		e->ids = p;
		e->cap_ids = cap;
	}
	e->ids[e->n_ids++] = id;
}

static void push_sym(struct enc *e, int32_t id)
{
	if (e->n_sym == e->cap_sym) {
		size_t cap = e->cap_sym * 2 + 64;
		struct sym *p = realloc(e->sym, cap * sizeof *p);
		if (!p) {
			e->oom = true;
			return;
		}
		e->sym = p;
		e->cap_sym = cap;
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
	if (e->n_heap == e->cap_heap) {
		size_t cap = e->cap_heap * 2 + 64;
		struct hitem *p = realloc(e->heap, cap * sizeof *p);
		if (!p) {
			e->oom = true;
			return;
		}
		e->heap = p;
		e->cap_heap = cap;
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
		int32_t id = smap_get(&tk->vmap, w, n);
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
		int32_t id = smap_get(&tk->vmap, w + i, k);
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

static enum llm_status decode_buf(const struct llm_tokenizer *tk, const int32_t *ids, size_t n,
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
	enum llm_status st = decode_buf(tk, ids, n, skip_special, &b);
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
	enum llm_status st = decode_buf(tk, ids, na + 1, false, &b);
	if (!st && na && b.n >= al && !memcmp(b.p, tk->anchor_text, al)) {
		memmove(b.p, b.p + al, b.n - al + 1);
		b.n -= al;
	} else if (!st && na) {      /* the anchor's text changed: the token alone */
		st = decode_buf(tk, ids + na, 1, false, &b);
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
	memset(s, 0, sizeof *s);
}

/* How many trailing ids could still change the text before them: a run of
 * byte-fallback bytes, or byte-level tokens whose bytes end inside a
 * UTF-8 character. Special ids that SKIP_SPECIAL leaves out add no text:
 * the bytes on either side of them join (as in decode_buf), so they are
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

static enum llm_status stream_emit(struct llm_detok_stream *s, bool final, const char **text, size_t *len)
{
	const struct llm_tokenizer *tk = s->tk;
	size_t hold = final ? 0 : unstable_tail(tk, s->ids, s->n, s->skip_special);
	struct buf b = { 0 };
	LLM_TRY(decode_buf(tk, s->ids, s->n - hold, s->skip_special, &b));
	size_t stable = b.n;
	if (!final && tk->cleanup) {
		/* hold back a tail that clean-up could still rewrite */
		static const char *pre[] = { " n'", " 'r", " 'v", " n", " '", " " };
		for (size_t i = 0; i < sizeof pre / sizeof *pre; i++) {
			size_t l = strlen(pre[i]);
			if (stable >= l && !memcmp(b.p + stable - l, pre[i], l)) {
				stable -= l;
				break;
			}
		}
	}
	if (!final && !tk->dec) {
		/* no decoder: tokens are joined by spaces; nothing held */
	}
	free(s->out);
	s->out = NULL;
	if (stable > s->emitted) {
		s->out = malloc(stable - s->emitted + 1);
		if (!s->out) {
			free(b.p);
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		}
		memcpy(s->out, b.p + s->emitted, stable - s->emitted);
		s->out[stable - s->emitted] = 0;
		*len = stable - s->emitted;
		s->emitted = stable;
	} else {
		s->out = calloc(1, 1);
		*len = 0;
	}
	*text = s->out ? s->out : "";
	/* Re-anchor the window once nothing is held back, keeping a few ids of
	 * context so decoders that treat the first token specially agree: four
	 * that add text (special ids left out add none). */
	size_t keep = 0;
	if (!final && hold == 0 && stable == b.n && s->n > 32)
		for (size_t seen = 0; keep < s->n && seen < 4; keep++)
			if (!(s->skip_special && (tk->flags[s->ids[s->n - 1 - keep]] & TF_SPECIAL)))
				seen++;
	if (keep && keep < s->n) {
		memmove(s->ids, s->ids + s->n - keep, keep * sizeof *s->ids);
		s->n = keep;
		struct buf c = { 0 };
		enum llm_status st = decode_buf(tk, s->ids, s->n, s->skip_special, &c);
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

enum llm_status llm_detok_stream_push(struct llm_detok_stream *s, int32_t id, const char **text, size_t *len)
{
	*text = "";
	*len = 0;
	if (!has_token(s->tk, id))
		return llm_fail(LLM_ERR_RANGE, "token id %d: not in the vocabulary (n_vocab %d)", id, s->tk->n_vocab);
	if (s->n == s->cap) {
		size_t cap = s->cap * 2 + 64;
		int32_t *p = realloc(s->ids, cap * sizeof *p);
		if (!p)
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		s->ids = p;
		s->cap = cap;
	}
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
	return smap_get(&tk->tmap, s, strlen(s));
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
	*d = (struct llm_detok){ detok_open, detok_push, detok_flush, detok_close, (void *)tk };
}
