/* tests/test_tokenizer.c: encode/decode against Hugging Face's reference ids.
 *
 * For each tokenizer under $LLM_TEST_REF/tokenizers (llama3, qwen3,
 * mistral7b, stories260K) every line of cases.jsonl must give exactly
 * ids_special / ids_plain and decode back to decoded / decoded_plain
 * (README: the `disputed` stories260K lines expect the input's U+FEFF kept,
 * so their sentencepiece_decoded_plain is the reference there). Streaming
 * decode must equal the whole decode, and a stream primed with the first
 * ids (a prompt) must give the rest of the reference's decode:
 * decode(prompt + ids) - decode(prompt). Then error paths on malformed
 * files. */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "llm.h"

static int ids_equal(const int32_t *a, size_t na, json_t *ref)
{
	if (!json_is_array(ref) || json_array_size(ref) != na)
		return 0;
	for (size_t i = 0; i < na; i++)
		if (json_integer_value(json_array_get(ref, i)) != a[i])
			return 0;
	return 1;
}

static void show_ids(const char *what, const int32_t *a, size_t n, json_t *ref)
{
	char line[600];
	size_t w = 0;
	for (size_t i = 0; i < n && w < 280; i++)
		w += (size_t)snprintf(line + w, sizeof line - w, "%d ", a[i]);
	char *r = json_dumps(ref, JSON_COMPACT);
	check_diag("  %s got [%s] want %.280s", what, line, r ? r : "?");
	free(r);
}

struct stats { int n, enc_s, enc_p, dec_s, dec_p, stream, cont, cont_ok, lead, eng, eng_ok; };

/* A continuation's text: the stream primed with IDS[0:K] (through the
 * engine's interface D when given, else llm_detok_stream with SKIP), then
 * IDS[K:N] pushed and flushed. Malloc'ed, or NULL on an error. */
static char *continuation(struct llm_tokenizer *tk, const struct llm_detok *d, const int32_t *ids, size_t k,
                          size_t n, bool skip, size_t *len)
{
	struct llm_detok_stream s;
	void *st = d ? d->open(d->ctx) : &s;
	if (!d)
		llm_detok_stream_init(&s, tk, skip);
	int bad = d ? !st || d->prime(st, ids, k) : llm_detok_stream_prime(&s, ids, k) != LLM_OK;
	char *acc = calloc(1, 1);
	*len = 0;
	for (size_t i = k; i <= n && !bad && acc; i++) {
		const char *t;
		size_t l;
		if (d)
			bad = i < n ? d->push(st, ids[i], &t, &l) : d->flush(st, &t, &l);
		else
			bad = i < n ? llm_detok_stream_push(&s, ids[i], &t, &l) != LLM_OK
			            : llm_detok_stream_flush(&s, &t, &l) != LLM_OK;
		char *p = bad ? NULL : realloc(acc, *len + l + 1);
		if (!p)
			break;
		acc = p;
		memcpy(acc + *len, t, l);
		*len += l;
		acc[*len] = 0;
	}
	if (d && st)
		d->close(st);
	else if (!d)
		llm_detok_stream_free(&s);
	if (bad) {
		free(acc);
		return NULL;
	}
	return acc;
}

/* The continuation of the first K of the N ids at several K: it must be
 * WANT (the reference's decode of all N) less the longest common prefix
 * with decode(ids[0:K]), i.e. decode(prompt + ids) - decode(prompt). *LEAD
 * counts continuations that start with a space decode(ids[K:]) alone lacks.
 * Returns how many of the *TRIED splits matched. */
static int continuation_splits(struct llm_tokenizer *tk, const struct llm_detok *d, const int32_t *ids, size_t n,
                               bool skip, const char *want, size_t wlen, int lineno, int *tried, int *lead,
                               int *shown)
{
	size_t ks[] = { 1, 2, 3, n / 3, n / 2, n - 2, n - 1 };
	int ok = 0;
	for (size_t j = 0; j < sizeof ks / sizeof *ks; j++) {
		size_t k = ks[j];
		if (k == 0 || k >= n || (j && ks[j - 1] >= k))
			continue;
		(*tried)++;
		char *pre = NULL, *alone = NULL, *got;
		size_t pl = 0, al = 0, gl = 0, c = 0;
		if (llm_tokenizer_decode(tk, ids, k, skip, &pre, &pl) || llm_tokenizer_decode(tk, ids + k, n - k, skip,
		                                                                             &alone, &al)) {
			free(pre);
			continue;
		}
		while (c < pl && c < wlen && pre[c] == want[c])
			c++;
		got = continuation(tk, d, ids, k, n, skip, &gl);
		if (got && gl == wlen - c && !memcmp(got, want + c, gl)) {
			ok++;
			*lead += gl > 0 && got[0] == ' ' && (al == 0 || alone[0] != ' ');
		} else if ((*shown)++ < 5) {
			check_diag("  line %d continuation after %zu of %zu ids%s: got \"%s\" want \"%s\"", lineno, k, n,
			           d ? " (engine)" : "", got ? got : "(error)", want + c);
		}
		free(got);
		free(pre);
		free(alone);
	}
	return ok;
}

/* llm_tokenizer_max_bytes is a bound: TEXT encodes (special tokens on and
 * off) into N tokens with LEN <= max_bytes(N), so a prompt refused by its
 * length could never have fit. Counted over every case and the texts below. */
static int bound_n, bound_bad;

static void bound_case(struct llm_tokenizer *tk, const char *text, size_t len)
{
	for (int special = 0; special < 2; special++) {
		int32_t *ids = NULL;
		size_t n = 0;
		if (!llm_tokenizer_encode(tk, text, len, special, &ids, &n)) {
			bound_n++;
			if (len > llm_tokenizer_max_bytes(tk, (int64_t)n) && bound_bad++ < 3)
				check_diag("  %zu bytes encode into %zu tokens, past the bound %zu: '%.40s'", len, n,
				           llm_tokenizer_max_bytes(tk, (int64_t)n), text);
		}
		free(ids);
	}
}

/* Texts made to be few tokens for their bytes: the longest token's text
 * repeated, characters normalization shrinks (NFKC: fullwidth and
 * mathematical letters, Hangul jamo composing, the Kelvin sign
 * lowercased), runs of spaces. */
static void bound_texts(struct llm_tokenizer *tk, const char *name)
{
	int32_t nv = llm_tokenizer_n_vocab(tk), best = -1;
	size_t bl = 0;
	for (int32_t i = 0; i < nv; i++) {
		char *t = NULL;
		size_t l = 0;
		if (!llm_tokenizer_decode(tk, &i, 1, false, &t, &l) && l > bl) {
			bl = l;
			best = i;
		}
		free(t);
	}
	static const char *odd[] = {
		"\xef\xbc\xa1\xef\xbc\xa2\xef\xbc\xa3\xef\xbc\xa4", "\xf0\x9d\x90\x80\xf0\x9d\x90\x81\xf0\x9d\x90\x82",
		"\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8\xe1\x84\x80\xe1\x85\xa1\xe1\x86\xa8", "\xe2\x84\xaa\xe2\x84\xaa\xe2\x84\xaa",
		"                                                                ", "\n\n\n\n\n\n\n\n\n\n\n\n",
		"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa", "<s></s><s></s><|endoftext|><|im_start|>",
	};
	for (size_t i = 0; i < sizeof odd / sizeof *odd; i++)
		bound_case(tk, odd[i], strlen(odd[i]));
	char *t = NULL, *rep = NULL;
	size_t l = 0;
	if (best >= 0 && !llm_tokenizer_decode(tk, &best, 1, false, &t, &l) && (rep = malloc(l * 64 + 1))) {
		for (int k = 0; k < 64; k++)
			memcpy(rep + (size_t)k * l, t, l);
		bound_case(tk, rep, l * 64);
	}
	free(t);
	free(rep);
	check(bound_n > 0 && bound_bad == 0, "%s: text of L bytes encodes into N tokens with L <= max_bytes(N) = N x %zu "
	      "(%d encodings, longest token %zu bytes)", name, llm_tokenizer_max_bytes(tk, 1), bound_n, bl);
	bound_n = bound_bad = 0;
}

static void run_case(struct llm_tokenizer *tk, json_t *c, int lineno, struct stats *st, int *shown)
{
	const char *text = json_string_value(json_object_get(c, "text"));
	size_t tlen = json_string_length(json_object_get(c, "text"));
	bound_case(tk, text, tlen);
	json_t *disp = json_object_get(c, "disputed");
	int32_t *ids = NULL;
	size_t n = 0;
	st->n++;
	for (int special = 1; special >= 0; special--) {
		json_t *ref = json_object_get(c, special ? "ids_special" : "ids_plain");
		const char *dkey = special ? "decoded" : "decoded_plain";
		if (llm_tokenizer_encode(tk, text, tlen, special, &ids, &n)) {
			if ((*shown)++ < 5)
				check_diag("  line %d: encode failed: %s", lineno, llm_errmsg());
			continue;
		}
		if (ids_equal(ids, n, ref)) {
			special ? st->enc_s++ : st->enc_p++;
		} else if ((*shown)++ < 5) {
			check_diag("  line %d (%s) %s: %.60s", lineno, json_string_value(json_object_get(c, "category")),
			           special ? "special" : "plain", text);
			show_ids("ids", ids, n, ref);
		}
		/* Decode the reference ids. */
		int32_t rid[8192];
		size_t nr = json_array_size(ref);
		for (size_t i = 0; i < nr && i < 8192; i++)
			rid[i] = (int32_t)json_integer_value(json_array_get(ref, i));
		char *dec = NULL;
		size_t dlen = 0;
		const char *want = json_string_value(json_object_get(c, dkey));
		size_t wlen = json_string_length(json_object_get(c, dkey));
		if (disp) {   /* README: expect the input's U+FEFF kept */
			const char *sp = json_string_value(json_object_get(disp, "sentencepiece_decoded_plain"));
			if (!special)
				want = sp;
			else {
				static char tmp[4096];
				snprintf(tmp, sizeof tmp, "<s> %s", sp);
				want = tmp;
			}
			wlen = strlen(want);
		}
		if (!llm_tokenizer_decode(tk, rid, nr, false, &dec, &dlen) && want && dlen == wlen &&
		    !memcmp(dec, want, wlen)) {
			special ? st->dec_s++ : st->dec_p++;
		} else if ((*shown)++ < 5) {
			check_diag("  line %d decode(%s): got \"%s\" want \"%s\"", lineno, dkey, dec ? dec : llm_errmsg(),
			           want ? want : "?");
		}
		/* Streaming decode of the same ids equals the whole decode. */
		if (special && dec) {
			struct llm_detok_stream s;
			llm_detok_stream_init(&s, tk, false);
			char *acc = calloc(1, 1);
			size_t alen = 0;
			int ok = 1;
			for (size_t i = 0; i <= nr && ok; i++) {
				const char *t;
				size_t l;
				if ((i < nr ? llm_detok_stream_push(&s, rid[i], &t, &l) : llm_detok_stream_flush(&s, &t, &l))) {
					ok = 0;
					break;
				}
				acc = realloc(acc, alen + l + 1);
				memcpy(acc + alen, t, l);
				alen += l;
				acc[alen] = 0;
			}
			llm_detok_stream_free(&s);
			if (ok && alen == dlen && !memcmp(acc, dec, dlen))
				st->stream++;
			else if ((*shown)++ < 5)
				check_diag("  line %d stream: got \"%s\" want \"%s\"", lineno, acc, dec);
			free(acc);
		}
		/* A continuation's text against the reference's decode of all ids. */
		if (dec && dlen == wlen && !memcmp(dec, want, wlen)) {
			int tried = 0;
			st->cont_ok += continuation_splits(tk, NULL, rid, nr, false, want, wlen, lineno, &tried, &st->lead,
			                                   shown);
			st->cont += tried;
		}
		/* The engine's detokenizer (special ids left out) after a prompt
		 * with BOS: its text is that of the plain ids, decoded_plain. */
		json_t *plain = json_object_get(c, "ids_plain");
		int specials = 0;
		for (size_t i = 0; i < json_array_size(plain); i++)
			specials += llm_tokenizer_is_special(tk, (int32_t)json_integer_value(json_array_get(plain, i)));
		const char *wp = json_string_value(json_object_get(c, "decoded_plain"));
		if (special && !disp && !specials && wp && nr > 1) {
			struct llm_detok d;
			llm_tokenizer_detok(&d, tk);
			int tried = 0, lead = 0;
			st->eng_ok += continuation_splits(tk, &d, rid, nr, true, wp, json_string_length(json_object_get(c,
			                                  "decoded_plain")), lineno, &tried, &lead, shown);
			st->eng += tried;
		}
		free(dec);
		free(ids);
		ids = NULL;
	}
}

static void run_tokenizer(const char *ref, const char *name)
{
	char dir[4096], path[4200];
	snprintf(dir, sizeof dir, "%s/tokenizers/%s", ref, name);
	snprintf(path, sizeof path, "%s/cases.jsonl", dir);
	FILE *f = fopen(path, "r");
	if (!f) {
		check_skip("no reference data", "%s: encode", name);
		return;
	}
	struct llm_tokenizer *tk;
	double t0 = llm_now();
	if (!check(llm_tokenizer_open(&tk, dir) == LLM_OK, "%s: open tokenizer.json", name)) {
		check_diag("%s", llm_errmsg());
		fclose(f);
		return;
	}
	check_diag("%s: loaded in %.0f ms, n_vocab %d", name, (llm_now() - t0) * 1e3, llm_tokenizer_n_vocab(tk));
	struct stats st = { 0 };
	char *line = NULL;
	size_t cap = 0;
	int lineno = 0, shown = 0;
	while (getline(&line, &cap, f) > 0) {
		lineno++;
		json_error_t e;
		json_t *c = json_loads(line, JSON_ALLOW_NUL, &e);
		if (!c) {
			check_diag("  line %d: %s", lineno, e.text);
			st.n++;
			continue;
		}
		run_case(tk, c, lineno, &st, &shown);
		json_decref(c);
	}
	free(line);
	fclose(f);
	bound_texts(tk, name);
	check(st.n > 0 && st.enc_s == st.n, "%s: encode with special tokens (%d/%d)", name, st.enc_s, st.n);
	check(st.n > 0 && st.enc_p == st.n, "%s: encode without special tokens (%d/%d)", name, st.enc_p, st.n);
	check(st.n > 0 && st.dec_s == st.n, "%s: decode with special tokens (%d/%d)", name, st.dec_s, st.n);
	check(st.n > 0 && st.dec_p == st.n, "%s: decode without special tokens (%d/%d)", name, st.dec_p, st.n);
	check(st.n > 0 && st.stream == st.n, "%s: streaming decode equals whole decode (%d/%d)", name, st.stream, st.n);
	check(st.cont > 0 && st.cont_ok == st.cont, "%s: a continuation's streamed text is decode(prompt + ids) - "
	      "decode(prompt) of the reference (%d/%d splits; %d keep a leading space)", name, st.cont_ok, st.cont,
	      st.lead);
	check(st.eng > 0 && st.eng_ok == st.eng, "%s: the same through the engine's detokenizer, special ids left out "
	      "(%d/%d splits)", name, st.eng_ok, st.eng);
	if (llm_tokenizer_adds_bos(tk) && !strcmp(llm_tokenizer_token(tk, llm_tokenizer_bos(tk)), "<s>"))
		check(st.lead > 0, "%s: SentencePiece: continuations keep the leading space a decode from the start "
		      "drops (%d)", name, st.lead);
	/* a token's piece keeps the leading space that decode drops at the start */
	int32_t *ids = NULL;
	size_t n = 0;
	char *pc = NULL, *alone = NULL, *sp = NULL, *spd = NULL;
	size_t pl = 0, al = 0, sl = 0, sdl = 0;
	int32_t eos = llm_tokenizer_eos(tk);
	int ok = !llm_tokenizer_encode(tk, "a there", 7, false, &ids, &n) && n == 2 &&
	         !llm_tokenizer_piece(tk, ids[1], &pc, &pl) && !llm_tokenizer_decode(tk, ids + 1, 1, false, &alone, &al) &&
	         eos >= 0 && !llm_tokenizer_piece(tk, eos, &sp, &sl) && !llm_tokenizer_decode(tk, &eos, 1, false, &spd, &sdl);
	char *none;
	size_t nl;
	check(ok && pl == 6 && !memcmp(pc, " there", 6) && sl == sdl && !memcmp(sp, spd, sl) &&
	      llm_tokenizer_piece(tk, -1, &none, &nl) == LLM_ERR_RANGE,
	      "%s: the piece of ' there' is '%s' (decoded alone: '%s'); EOS's is its text '%s'", name,
	      pc ? pc : "?", alone ? alone : "?", sp ? sp : "?");
	free(ids);
	free(pc);
	free(alone);
	free(sp);
	free(spd);
	/* piece bytes: characters split over tokens come back whole when the
	 * bytes of the ids are joined */
	const char *emo = "a \xf0\x9f\xa6\x99\xf0\x9d\x94\xb8 there";
	char all[256];
	size_t al2 = 0;
	int split = 0;
	ok = !llm_tokenizer_encode(tk, emo, strlen(emo), false, &ids, &n);
	for (size_t i = 0; ok && i < n; i++) {
		char *b = NULL, *q = NULL;
		size_t bl = 0, ql = 0;
		ok = !llm_tokenizer_piece_bytes(tk, ids[i], &b, &bl) && !llm_tokenizer_piece(tk, ids[i], &q, &ql) &&
		     al2 + bl < sizeof all;
		if (ok) {
			memcpy(all + al2, b, bl);
			al2 += bl;
			split += bl != ql || memcmp(b, q, bl);
		}
		free(b);
		free(q);
	}
	size_t el = strlen(emo);
	check(ok && split > 0 && ((al2 == el && !memcmp(all, emo, el)) || (al2 == el + 1 && all[0] == ' ' &&
	      !memcmp(all + 1, emo, el))), "%s: the bytes of the %zu tokens of two 4-byte characters join to the text "
	      "(%d tokens hold part of a character)", name, n, split);
	free(ids);
	llm_tokenizer_close(tk);
}

/* A tokenizer directory holding TEXT as tokenizer.json. */
static const char *write_tok(const char *name, const char *text, size_t len)
{
	static char dir[4096];
	char path[4200];
	snprintf(dir, sizeof dir, "%s/%s", test_tmpdir(), name);
	mkdir(dir, 0755);
	snprintf(path, sizeof path, "%s/tokenizer.json", dir);
	FILE *f = fopen(path, "wb");
	if (f) {
		fwrite(text, 1, len, f);
		fclose(f);
	}
	return dir;
}

static void expect_error(const char *what, const char *text, enum llm_status want, const char *needle)
{
	struct llm_tokenizer *tk = NULL;
	const char *dir = write_tok(what, text, strlen(text));
	enum llm_status s = llm_tokenizer_open(&tk, dir);
	int ok = s == want && tk == NULL && strstr(llm_errmsg(), "tokenizer.json") && strstr(llm_errmsg(), needle)
	         && !strchr(llm_errmsg(), '\n');
	if (!check(ok, "malformed tokenizer.json: %s", what))
		check_diag("status %s, message: %s", llm_status_name(s), llm_errmsg());
	llm_tokenizer_close(tk);
}

#define MINI_VOCAB "{\"a\":0,\"b\":1,\"ab\":2,\"<unk>\":3}"

/* Decoding no ids (or only skipped ones) through a decoder chain whose
 * first step writes no byte (ByteLevel of nothing) left the next step
 * reading pieces with no text buffer: a null pointer plus 0, undefined
 * behaviour that clang's UBSan reports (gcc's does not); the text is "". */
static void decode_nothing(void)
{
	static const char json[] = "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": [\"a b\"]}, "
		"\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"ByteLevel\"}, {\"type\": \"Replace\", "
		"\"pattern\": {\"String\": \"x\"}, \"content\": \"y\"}]}}";
	struct llm_tokenizer *tk = NULL;
	const char *dir = write_tok("decode-nothing", json, strlen(json));
	if (!check(llm_tokenizer_open(&tk, dir) == LLM_OK, "a ByteLevel then Replace decoder opens (%s)", llm_errmsg()))
		return;
	int32_t ids[1] = { 0 };
	char *text = NULL;
	size_t len = 1;
	enum llm_status s = llm_tokenizer_decode(tk, ids, 0, false, &text, &len);
	check(s == LLM_OK && text && len == 0 && !*text, "no ids through ByteLevel then Replace decode to \"\"");
	free(text);
	llm_tokenizer_close(tk);
}

static void malformed(const char *ref)
{
	decode_nothing();
	expect_error("not json", "{\"model\": {\"type\": \"BPE\",", LLM_ERR_FORMAT, "line");
	expect_error("not an object", "[1, 2]", LLM_ERR_FORMAT, "not a JSON object");
	expect_error("no model", "{\"version\": \"1.0\"}", LLM_ERR_FORMAT, "model");
	expect_error("unknown model type", "{\"model\": {\"type\": \"Frobnicate\", \"vocab\": {}, \"merges\": []}}",
	             LLM_ERR_FORMAT, "unknown type 'Frobnicate'");
	expect_error("unsupported model type", "{\"model\": {\"type\": \"Unigram\", \"vocab\": []}}",
	             LLM_ERR_UNSUPPORTED, "Unigram");
	expect_error("vocab is a list", "{\"model\": {\"type\": \"BPE\", \"vocab\": [], \"merges\": []}}",
	             LLM_ERR_FORMAT, "vocab");
	expect_error("vocab id is a string", "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": \"0\"}, \"merges\": []}}",
	             LLM_ERR_FORMAT, "'a'");
	expect_error("merges is a string", "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": \"a b\"}}",
	             LLM_ERR_FORMAT, "merges");
	expect_error("merge names a missing token",
	             "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": [\"a b\", \"b c\"]}}",
	             LLM_ERR_FORMAT, "merges[1]");
	expect_error("merge result missing",
	             "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": [\"b a\"]}}",
	             LLM_ERR_FORMAT, "'ba'");
	expect_error("merge with three parts",
	             "{\"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": [\"a b c\"]}}",
	             LLM_ERR_FORMAT, "merges[0]");
	expect_error("added token without id",
	             "{\"added_tokens\": [{\"content\": \"<s>\"}], \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": []}}",
	             LLM_ERR_FORMAT, "added_tokens[0]");
	expect_error("unknown normalizer",
	             "{\"normalizer\": {\"type\": \"Frob\"}, \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": []}}",
	             LLM_ERR_UNSUPPORTED, "normalizer");
	expect_error("unknown pre-tokenizer",
	             "{\"pre_tokenizer\": {\"type\": \"Frob\"}, \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": []}}",
	             LLM_ERR_UNSUPPORTED, "pre_tokenizer");
	expect_error("bad regex",
	             "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}, \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": []}}",
	             LLM_ERR_UNSUPPORTED, "regex");
	expect_error("unknown decoder",
	             "{\"decoder\": {\"type\": \"Frob\"}, \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": []}}",
	             LLM_ERR_UNSUPPORTED, "decoder");
	/* a Sequence member that fails after it allocated (its regex, its
	 * content): refused, and under make asan nothing leaks (found by
	 * tests/fuzz/fuzz_tokenizer_json) */
	expect_error("Sequence member fails after its regex",
	             "{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Split\", \"pattern\": "
	             "{\"Regex\": \"a\"}, \"behavior\": \"Sideways\"}]}, \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB
	             ", \"merges\": []}}",
	             LLM_ERR_FORMAT, "unknown behavior 'Sideways'");
	expect_error("Sequence member fails after its content",
	             "{\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Replace\", \"content\": \"b\", "
	             "\"pattern\": {\"Regex\": \"(\"}}]}, \"model\": {\"type\": \"BPE\", \"vocab\": " MINI_VOCAB ", \"merges\": []}}",
	             LLM_ERR_UNSUPPORTED, "regex");
	struct llm_tokenizer *tk = NULL;
	char dir[4096];
	snprintf(dir, sizeof dir, "%s/absent", test_tmpdir());
	enum llm_status s = llm_tokenizer_open(&tk, dir);
	check(s == LLM_ERR_IO && strstr(llm_errmsg(), "absent/tokenizer.json"), "missing tokenizer.json is an I/O error naming it");

	/* A truncated copy of a real file. */
	char path[4200];
	snprintf(path, sizeof path, "%s/tokenizers/stories260K/tokenizer.json", ref ? ref : "");
	size_t len;
	char *data = ref ? test_read_file(path, &len) : NULL;
	if (!data) {
		check_skip("no reference data", "truncated tokenizer.json");
		return;
	}
	const char *d = write_tok("truncated", data, len / 2);
	s = llm_tokenizer_open(&tk, d);
	check(s == LLM_ERR_FORMAT && strstr(llm_errmsg(), "truncated/tokenizer.json"), "truncated tokenizer.json");
	/* A working mini tokenizer: merges, unk, and invalid UTF-8 refused. */
	const char *mini = "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"vocab\": " MINI_VOCAB
	                   ", \"merges\": [\"a b\"]}}";
	d = write_tok("mini", mini, strlen(mini));
	if (check(llm_tokenizer_open(&tk, d) == LLM_OK, "hand-written mini tokenizer opens")) {
		int32_t *ids;
		size_t n;
		int ok = !llm_tokenizer_encode(tk, "abxab", 5, true, &ids, &n) && n == 3 && ids[0] == 2 && ids[1] == 3 &&
		         ids[2] == 2;
		if (ok)
			free(ids);
		check(ok, "mini tokenizer: merges and unk");
		check(llm_tokenizer_encode(tk, "a\xff", 2, true, &ids, &n) == LLM_ERR_FORMAT, "invalid UTF-8 is refused");
		int32_t bad = 99;
		char *t;
		check(llm_tokenizer_decode(tk, &bad, 1, false, &t, &len) == LLM_ERR_RANGE, "decoding an unknown id is refused");
		llm_tokenizer_close(tk);
	}
	free(data);
}

/* The stream of IDS (skip_special SKIP) against the whole decode, both
 * against WANT. */
static void stream_case(struct llm_tokenizer *tk, const char *what, const int32_t *ids, size_t n, bool skip,
                        const char *want)
{
	char *whole = NULL;
	size_t wl = 0;
	char got[256] = "";
	size_t gl = 0;
	int ok = llm_tokenizer_decode(tk, ids, n, skip, &whole, &wl) == LLM_OK;
	struct llm_detok_stream s;
	llm_detok_stream_init(&s, tk, skip);
	for (size_t i = 0; ok && i <= n; i++) {
		const char *t;
		size_t l;
		if ((i < n ? llm_detok_stream_push(&s, ids[i], &t, &l) : llm_detok_stream_flush(&s, &t, &l)) ||
		    gl + l >= sizeof got) {
			ok = 0;
			break;
		}
		memcpy(got + gl, t, l);
		gl += l;
		got[gl] = 0;
	}
	llm_detok_stream_free(&s);
	ok = ok && wl == strlen(want) && !memcmp(whole, want, wl) && gl == wl && !memcmp(got, whole, wl);
	if (!check(ok, "%s", what))
		check_diag("whole \"%s\", stream \"%s\", want \"%s\"", whole ? whole : "(error)", got, want);
	free(whole);
}

/* Bytes of one character split by a special token that decode leaves out
 * (skip_special) join into that character, in the stream as in the whole
 * decode (found by tests/fuzz/fuzz_tokenizer: the stream took the special
 * token's text as the end of the bytes and gave U+FFFD). */
static void stream_skip_special(const char *ref)
{
	struct {
		const char *name, *a, *b, *sp;
	} cs[] = {
		/* byte-level: "æ¨" is bytes E6 A8, "Ĩ" byte 86: U+6A06 */
		{ "llama3", "\xc3\xa6\xc2\xa8", "\xc4\xa8", "<|eot_id|>" },
		{ "qwen3", "\xc3\xa6\xc2\xa8", "\xc4\xa8", "<|im_end|>" },
		/* byte fallback */
		{ "mistral7b", "<0xE6>", "<0xA8>", "</s>" },
	};
	for (size_t i = 0; i < sizeof cs / sizeof *cs; i++) {
		char dir[4096];
		snprintf(dir, sizeof dir, "%s/tokenizers/%s", ref ? ref : "", cs[i].name);
		struct llm_tokenizer *tk = NULL;
		if (!ref || llm_tokenizer_open(&tk, dir)) {
			check_skip("no reference tokenizer", "%s: stream across a skipped special token", cs[i].name);
			continue;
		}
		int32_t a = llm_tokenizer_find(tk, cs[i].a), b = llm_tokenizer_find(tk, cs[i].b),
		        sp = llm_tokenizer_find(tk, cs[i].sp), c = llm_tokenizer_find(tk, "<0x86>");
		char what[128];
		snprintf(what, sizeof what, "%s: stream across a skipped special token equals the whole decode",
		         cs[i].name);
		if (!check(a >= 0 && b >= 0 && sp >= 0 && llm_tokenizer_is_special(tk, sp), "%s: the test's tokens exist",
		           cs[i].name)) {
			llm_tokenizer_close(tk);
			continue;
		}
		if (c >= 0) {            /* byte fallback: E6 <sp> A8 <sp> 86 */
			int32_t ids[] = { a, sp, b, sp, c };
			stream_case(tk, what, ids, 5, true, "\xe6\xa8\x86");
		} else {                 /* byte-level: E6 A8 <sp> 86 */
			int32_t ids[] = { a, sp, sp, b };
			stream_case(tk, what, ids, 4, true, "\xe6\xa8\x86");
		}
		llm_tokenizer_close(tk);
	}
}

/* A byte-level token longer than any fixed buffer: its bytes are all there. */
static void long_piece_bytes(void)
{
	char json[1024];
	char lng[301];
	memset(lng, 'a', 300);
	lng[300] = 0;
	int n = snprintf(json, sizeof json, "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"%s\": 1}, "
	                 "\"merges\": []}, \"decoder\": {\"type\": \"ByteLevel\"}}", lng);
	struct llm_tokenizer *tk;
	if (!check(llm_tokenizer_open(&tk, write_tok("longtok", json, (size_t)n)) == LLM_OK,
	           "a byte-level tokenizer with a 300-byte token opens")) {
		check_diag("%s", llm_errmsg());
		return;
	}
	char *b = NULL;
	size_t bl = 0;
	enum llm_status st = llm_tokenizer_piece_bytes(tk, 1, &b, &bl);
	check(!st && bl == 300 && !memcmp(b, lng, 300), "its piece bytes are all 300 bytes (%zu)", bl);
	free(b);
	llm_tokenizer_close(tk);
}

int main(void)
{
	const char *ref = test_ref_dir();
	const char *names[] = { "llama3", "qwen3", "mistral7b", "stories260K" };
	for (int i = 0; i < 4; i++) {
		if (!ref)
			check_skip("no reference data in $LLM_TEST_REF", "%s: tokenizer cases", names[i]);
		else
			run_tokenizer(ref, names[i]);
	}
	stream_skip_special(ref);
	malformed(ref);
	long_piece_bytes();
	return check_done();
}
