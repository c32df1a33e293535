/* common/text/tokenizer_impl.h: the private interface between tokenizer_load.c
 * (reading tokenizer.json and its side files into struct llm_tokenizer) and
 * tokenizer.c (encode, decode, the streaming detokenizer): the tokenizer's
 * layout, its component types, the growable buffer, the hash maps of the
 * vocab and merges, and the tok_-prefixed functions the loader calls in
 * tokenizer.c. Not a public header: tokenizer.h is the API. */
#ifndef LLM_TOKENIZER_IMPL_H
#define LLM_TOKENIZER_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifndef PCRE2_CODE_UNIT_WIDTH
#define PCRE2_CODE_UNIT_WIDTH 8
#endif
#include <pcre2.h>

#include "buf.h"
#include "tokenizer.h"

/* ---------------------------------------------------------------- buffers */

/* A growable byte buffer (grown as buf.h grows one), kept 0-terminated; an
 * allocation failure sets oom and later appends do nothing, so callers
 * check once at the end. */
struct buf { char *p; size_t n, cap; bool oom; };

static inline void buf_reserve(struct buf *b, size_t extra)
{
	if (!b->oom && llm_array_reserve(&b->p, &b->cap, b->n + extra + 1, 1))
		b->oom = true;
}

static inline void buf_put(struct buf *b, const void *s, size_t n)
{
	buf_reserve(b, n);
	if (b->oom)
		return;
	if (n)
		memcpy(b->p + b->n, s, n);
	b->n += n;
	b->p[b->n] = 0;
}

static inline void buf_putc(struct buf *b, char c) { buf_put(b, &c, 1); }

/* ---------------------------------------------------------------- hashing (tokenizer.c) */

struct str { const char *s; uint32_t len; };

/* text -> id, open addressing over ids whose text is keys[id]. Each slot
 * keeps 32 bits of the hash so probing rarely touches the key text (the
 * vocab is too big for the cache: loading does ~3 lookups per merge). */
struct smap { uint64_t *slot; size_t mask; const struct str *keys; };   /* tag << 32 | (id + 1); 0: empty */

int tok_smap_init(struct smap *m, size_t n, const struct str *keys);
int32_t tok_smap_get(const struct smap *m, const char *s, size_t n);
void tok_smap_put(struct smap *m, int32_t id);

/* (left id, right id) -> (rank, merged id). */
struct mmap { uint64_t *key; uint32_t *rank; int32_t *id; size_t mask; };

int tok_mmap_init(struct mmap *m, size_t n);
void tok_mmap_put(struct mmap *m, int32_t a, int32_t b, uint32_t rank, int32_t id);

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
	char **arena;                 /* (cap_arena) copies of token strings, n_arena used */
	size_t n_arena, cap_arena;
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
	bool strip_tail;             /* a Strip decoder cuts the text's end: a stream never re-anchors */
	bool bytelevel_dec;             /* the decoder has a ByteLevel step */
	char *chat_template;
	char *config_json;
	int32_t anchor[4];            /* "a" encoded: the text llm_tokenizer_piece decodes after */
	size_t n_anchor;
	char anchor_text[16];         /* their decoded text */
	size_t anchor_len;
	size_t bytes_per_token;       /* text bytes one token can stand for at most, the
	                               * normalizer's shrinking included; 0: no bound */
	int model_ctx;                /* config.json's max_position_embeddings, else 0 */
};

/* ID names a token (model vocabulary or added): decodable. */
static inline bool has_token(const struct llm_tokenizer *tk, int32_t id)
{
	return id >= 0 && id < tk->n_vocab && tk->tok[id].s;
}

/* ---------------------------------------------------------------- tokenizer.c */

/* Fill the GPT-2 byte <-> printable character tables if constructors did
 * not run. */
void tok_init_bytelevel(void);
/* Decode N ids into OUT (appended, NUL-terminated), skipping special
 * tokens when SKIP_SPECIAL. */
enum llm_status tok_decode_buf(const struct llm_tokenizer *tk, const int32_t *ids, size_t n,
                               bool skip_special, struct buf *out);

#endif
