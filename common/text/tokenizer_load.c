/* common/text/tokenizer_load.c: reading a Hugging Face tokenizer: tokenizer.json
 * (model vocab and merges, added tokens, normalizer, pre-tokenizer,
 * decoder, post-processor) plus tokenizer_config.json,
 * special_tokens_map.json and generation_config.json (special ids, chat
 * template) into struct llm_tokenizer (tokenizer_impl.h), and
 * llm_tokenizer_open, llm_tokenizer_open_mem and llm_tokenizer_close.
 *
 * Guarantees: only components tokenizer.c implements exactly are accepted;
 * any other type or setting is LLM_ERR_UNSUPPORTED (a malformed file
 * LLM_ERR_FORMAT) at open time, naming the file, never a silently different
 * tokenization later. Reference: huggingface/tokenizers (Rust), the
 * serialization of its models, normalizers, pre-tokenizers, decoders and
 * processors; transformers tokenization_utils for the side files. */
#define _GNU_SOURCE
#include "tokenizer_impl.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "banned.h"

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
		if (d->stop)
			L->tk->strip_tail = true;
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
	if (LLM_ARRAY_RESERVE(tk->arena, tk->cap_arena, tk->n_arena + 1))
		return NULL;
	char *p = malloc(n + 1);
	if (!p)
		return NULL;
	memcpy(p, s, n);
	p[n] = 0;
	tk->arena[tk->n_arena++] = p;
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

/* Token ids must lie below LIMIT: config.json's vocab_size when FROM_CONFIG,
 * else LLM_TOKENIZER_MAX_IDS; the tables are indexed by id, so an id is
 * checked before anything is sized by it. */
static enum llm_status check_id(struct loader *L, int64_t id, int64_t limit, int from_config, const char *what,
                                const char *key, size_t i)
{
	if (id < limit)
		return LLM_OK;
	char where[128];
	if (key)
		snprintf(where, sizeof where, "model.vocab[\"%.64s\"]", key);
	else
		snprintf(where, sizeof where, "%s[%zu].id", what, i);
	return LFAIL(L, LLM_ERR_RANGE, "%s: id %lld is not below %s %lld", where, (long long)id,
	             from_config ? "config.json's vocab_size" : "the limit for a tokenizer without config.json,",
	             (long long)limit);
}

static enum llm_status load_model(struct loader *L, json_t *model, json_t *added, int64_t limit, int from_config)
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
		LLM_TRY(check_id(L, json_integer_value(v), limit, from_config, NULL, key, 0));
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
		LLM_TRY(check_id(L, json_integer_value(id), limit, from_config, "added_tokens", NULL, i));
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
	if (!blk || LLM_ARRAY_RESERVE(tk->arena, tk->cap_arena, tk->n_arena + 1)) {
		free(blk);
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	tk->arena[tk->n_arena++] = blk;
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
	if (tok_smap_init(&tk->vmap, n_vocab_entries, tk->vocab))
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < nv; i++)
		if (tk->vocab[i].s)
			tok_smap_put(&tk->vmap, (int32_t)i);

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
	if (tok_smap_init(&tk->tmap, nv, tk->tok))
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; i < tk->n_added; i++)
		tok_smap_put(&tk->tmap, tk->added[i].id);
	for (size_t i = 0; i < nv; i++)
		if (tk->tok[i].s)
			tok_smap_put(&tk->tmap, (int32_t)i);

	/* unk and byte fallback. */
	tk->unk_id = -1;
	json_t *unk = json_object_get(model, "unk_token");
	if (json_is_string(unk)) {
		tk->unk_id = tok_smap_get(&tk->vmap, json_string_value(unk), strlen(json_string_value(unk)));
		if (tk->unk_id < 0)
			return LFAIL(L, LLM_ERR_FORMAT, "model: unk_token '%s' is not in the vocab", json_string_value(unk));
	}
	for (int b = 0; b < 256; b++) {
		char name[8];
		snprintf(name, sizeof name, "<0x%02X>", b);
		tk->byte_id[b] = tok_smap_get(&tk->vmap, name, 6);
	}

	/* Merges: "a b" strings or [a, b] pairs; the merged token must exist. */
	if (tok_mmap_init(&tk->merges, json_array_size(merges)))
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
		int32_t ia = tok_smap_get(&tk->vmap, a, la), ib = tok_smap_get(&tk->vmap, b, lb);
		if ((st = LLM_ARRAY_RESERVE(tmp, tmp_cap, la + lb + 1)))
			break;
		memcpy(tmp, a, la);
		memcpy(tmp + la, b, lb);
		int32_t im = tok_smap_get(&tk->vmap, tmp, la + lb);
		if (ia < 0 || ib < 0 || im < 0) {
			tmp[la + lb] = 0;
			st = LFAIL(L, LLM_ERR_FORMAT, "model: merges[%zu]: token '%s' is not in the vocab", i,
			           ia < 0 ? (la < 64 ? a : "(long)") : ib < 0 ? b : tmp);
			break;
		}
		tok_mmap_put(&tk->merges, ia, ib, (uint32_t)i, im);
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

/* How many times shorter the normalizer can make text, or 0 when it can
 * drop text without bound (Strip, a regex or shortening Replace). Unicode
 * normalization and lowercasing map one character to at least one byte
 * (NFKC's 4-byte mathematical letters to ASCII: 4x); composition merges at
 * most three Hangul jamo into one syllable (3x). */
static size_t norm_shrink(const struct norm *n)
{
	size_t f = 1, g;
	switch (n->type) {
	case NORM_SEQ:
		for (size_t i = 0; i < n->n_sub; i++) {
			if (!(g = norm_shrink(&n->sub[i])))
				return 0;
			f *= g;
		}
		return f;
	case NORM_PREPEND: return 1;
	case NORM_REPLACE: return !n->re && n->a && n->b && strlen(n->b) >= strlen(n->a) ? 1 : 0;
	case NORM_UNICODE:
		return n->uflags & (UTF8PROC_IGNORE | UTF8PROC_STRIPCC | UTF8PROC_STRIPMARK | UTF8PROC_STRIPNA) ? 0 : 4;
	case NORM_LOWER: return 4;
	default: return 0;   /* Strip */
	}
}

/* Whether the pre-tokenizer keeps every byte (a Split that removes its
 * matches, or a Metaspace with an empty replacement, drops some). */
static bool pre_keeps(const struct pre *p)
{
	for (size_t i = 0; p->type == PRE_SEQ && i < p->n_sub; i++)
		if (!pre_keeps(&p->sub[i]))
			return false;
	return !(p->type == PRE_SPLIT && p->behavior == SPLIT_REMOVED) &&
	       !(p->type == PRE_METASPACE && (!p->repl || !*p->repl));
}

/* A lower bound on the tokens of any text: each token stands for at most
 * bytes_per_token of its bytes. A token's text is at least as long as the
 * normalized bytes it covers (ByteLevel maps a byte to a 1- or 2-byte
 * character, Metaspace a space to "▁", byte fallback tokens are "<0xXX>"),
 * an unknown character is one token of at most 4 bytes (fused unknowns
 * happen only without byte fallback for all 256 bytes), an added token
 * matches its own content; what the normalizer shrinks multiplies it. No
 * bound when text can vanish into a token or before one: fused unknowns,
 * added tokens that strip the whitespace beside them, a normalizer or
 * pre-tokenizer that drops text. */
static size_t bytes_per_token(const struct llm_tokenizer *tk)
{
	size_t shrink = tk->norm ? norm_shrink(tk->norm) : 1, m = 4;
	bool all_bytes = tk->byte_fallback;     /* then no character is unknown */
	for (int b = 0; b < 256; b++)
		all_bytes &= tk->byte_id[b] >= 0;
	if (!shrink || (tk->pre && !pre_keeps(tk->pre)) || (tk->fuse_unk && tk->unk_id >= 0 && !all_bytes))
		return 0;
	for (size_t i = 0; i < tk->n_added; i++)
		if (tk->added[i].lstrip || tk->added[i].rstrip)
			return 0;
	for (int32_t i = 0; i < tk->n_vocab; i++) {
		m = tk->tok[i].len > m ? tk->tok[i].len : m;
		m = tk->vocab[i].len > m ? tk->vocab[i].len : m;
	}
	return m * shrink;
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

enum llm_status llm_tokenizer_open_mem(struct llm_tokenizer **out, const char *origin,
                                       const struct llm_tok_files *files)
{
	*out = NULL;
	tok_init_bytelevel();
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
	/* the model's vocab_size bounds the ids (a config.json that does not
	 * parse is left to the model's loader to report) */
	int64_t limit = LLM_TOKENIZER_MAX_IDS;
	json_t *mc = NULL, *vs;
	if (parse_side(origin, files, "config.json", &mc))
		mc = NULL;
	int from_config = json_is_integer(vs = json_object_get(mc, "vocab_size")) && json_integer_value(vs) > 0 &&
	                  json_integer_value(vs) <= LLM_TOKENIZER_MAX_IDS;
	if (from_config)
		limit = json_integer_value(vs);
	json_t *mp = json_object_get(mc, "max_position_embeddings");
	if (json_is_integer(mp) && json_integer_value(mp) > 0 && json_integer_value(mp) <= INT32_MAX)
		tk->model_ctx = (int)json_integer_value(mp);
	json_decref(mc);
	if ((st = load_model(&L, json_object_get(j, "model"), json_object_get(j, "added_tokens"), limit, from_config)))
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
	tk->bytes_per_token = bytes_per_token(tk);
	if (!st) {
		int32_t *a;
		size_t na;
		struct buf at = { 0 };
		if (!llm_tokenizer_encode(tk, "a", 1, false, &a, &na) && na <= 4 &&
		    !tok_decode_buf(tk, a, na, false, &at) && at.n < sizeof tk->anchor_text) {
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
struct dir_files { const char *dir; char *data[8]; size_t n; };

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
	if (b.oom || err || df->n >= sizeof df->data / sizeof *df->data) {
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
