/* tests/test_grammar.c: the grammar engine (common/text/grammar.c): sentences
 * accepted and refused, compile errors, UTF-8 classes, token masks against
 * a brute force over a small vocabulary, and the mask cache. */
#include "check.h"
#include "grammar.h"
#include "status.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static struct llm_grammar *compile(const char *src, const struct llm_gvocab *v)
{
	struct llm_grammar *g = NULL;
	if (llm_grammar_compile(&g, src, strlen(src), v))
		check_diag("compile: %s", llm_errmsg());
	return g;
}

/* snprintf into a buffer the caller sized; the count written */
#define sprintf_check(q, ...) snprintf(q, 64, __VA_ARGS__)

struct acase { const char *grammar, *yes[6], *no[6]; };

static const struct acase cases[] = {
	{ "root ::= \"ab\" | \"c\"", { "ab", "c" }, { "", "a", "abc", "b", "cc" } },
	{ "root ::= [a-c]* \"x\"", { "x", "abcx", "aaax" }, { "", "xa", "dx", "abc" } },
	{ "root ::= [0-9]+", { "0", "123456" }, { "", "a", "1a" } },
	{ "root ::= \"a\"? \"b\"", { "b", "ab" }, { "aab", "a", "" } },
	{ "root ::= [ab]{2,3}", { "ab", "bab" }, { "a", "abab", "" } },
	{ "root ::= \"x\"{3}", { "xxx" }, { "xx", "xxxx" } },
	{ "root ::= \"x\"{2,}", { "xx", "xxxxxxx" }, { "x", "" } },
	{ "root ::= [^\"\\\\]*", { "", "abc", "\xce\xb2" }, { "\"", "a\\", "\xce" } },
	{ "root ::= [α-ω]+", { "\xce\xb2", "\xce\xb1\xcf\x89" }, { "a", "\xce", "" } },
	{ "root ::= .", { "a", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\n" }, { "", "ab", "\xed\xa0\x80", "\xff" } },
	{ "# a comment\nroot ::= x (\",\" x)*  # tail\nx ::= \"[\" root? \"]\" | [0-9]",
	  { "1", "1,2", "[]", "[1,[2]]", "[[[]]]" }, { "", "1,", "[", "[1,]", "]" } },
	{ "root ::= (\"a\" | \"b\" \"c\")* \"d\"", { "d", "abcad", "bcbcd" }, { "bd", "abc", "" } },
	{ "root ::= \"\\x41\\u00e9\\t\"", { "A\xc3\xa9\t" }, { "A" } },
	{ "root ::= [^a-z]", { "A", "\xc3\xa9" }, { "a", "m", "" } },
	{ "root ::= e\ne ::= t (\"+\" t)*\nt ::= [0-9] | \"(\" e \")\"", { "1+2", "(1+2)+3", "((1))" }, { "1+", "(1", "1)" } },
};

static void test_accept(void)
{
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		const struct acase *c = &cases[i];
		char name[200];
		snprintf(name, sizeof name, "%s", c->grammar);
		for (char *q = name; *q; q++)
			if (*q == '\n')
				*q = '/';
		struct llm_grammar *g = compile(c->grammar, NULL);
		if (!check(g != NULL, "compiles: %s", name))
			continue;
		int ok = 1;
		for (int k = 0; k < 6 && c->yes[k]; k++)
			if (!llm_grammar_match(g, c->yes[k], strlen(c->yes[k]))) {
				check_diag("should accept '%s'", c->yes[k]);
				ok = 0;
			}
		for (int k = 0; k < 6 && c->no[k]; k++)
			if (llm_grammar_match(g, c->no[k], strlen(c->no[k]))) {
				check_diag("should refuse '%s'", c->no[k]);
				ok = 0;
			}
		check(ok, "accepts and refuses as it should: %s", name);
		llm_grammar_unref(g);
	}
}

static void test_errors(void)
{
	static const struct { const char *src, *msg; } bad[] = {
		{ "root ::= x", "grammar: line 1: rule 'x' is not defined" },
		{ "root ::= root \"a\" | \"b\"", "grammar: line 1: rule 'root' is left-recursive" },
		{ "root ::= x\nx ::= \"a\"? root", "grammar: line 1: rule 'root' is left-recursive" },
		{ "root ::= \"a", "grammar: line 1: unterminated string literal" },
		{ "root ::= [a-", "grammar: line 1: unterminated character class" },
		{ "root ::= \"a\\", "grammar: line 1: unexpected end of text after '\\'" },
		{ "root ::= (\"a\"", "grammar: line 1: expected ')'" },
		{ "x ::= \"a\"", "grammar: line 1: no rule 'root'" },
		{ "root ::= \"a\"\n\nroot ::= \"b\"", "grammar: line 3: rule 'root' is defined twice" },
		{ "root ::= \"a\"{3,2}", "grammar: line 1: bad repetition {3,2} (0 <= m <= n <= 10000)" },
		{ "root ::= [z-a]", "grammar: line 1: range 7A-61 is backwards" },
		{ "root ::= \"\\q\"", "grammar: line 1: unknown escape '\\q'" },
		{ "root ::= \"a\" = \"b\"", "grammar: line 1: unexpected '='" },
		{ "root ::= []", "grammar: line 1: empty character class" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		struct llm_grammar *g = NULL;
		enum llm_status s = llm_grammar_compile(&g, bad[i].src, strlen(bad[i].src), NULL);
		if (!check(s == LLM_ERR_USAGE && !g && !strcmp(llm_errmsg(), bad[i].msg), "bad grammar %zu refused: %s", i,
		           bad[i].msg))
			check_diag("got: %s", s ? llm_errmsg() : "accepted");
	}
}

/* A small vocabulary: single bytes, pieces of JSON, multi-byte characters
 * and their lone bytes (byte-fallback tokens), one empty token. */
static const char *vocab_text[] = {
	"{", "}", "[", "]", ",", ":", "\"", "\\", "a", "b", "c", "ab", "abc", "\"a", "a\"", "\":", "\",\"", "{\"",
	"\"}", "0", "1", "12", "123", "-", "-1", " ", " {", "true", "tr", "ue", "false", "null", "nul", "l",
	"\xce\xb2", "\xce", "\xb2", "\xe2\x82\xac", "\xe2", "\x82", "\xac", "e", "E", ".", "+", "x\"y", "", "}}",
	"u", "\\u", "00", "0041", "n", "t", "f", "ru", "al", "se", "ll", "1,", ",\"", "\"b\":", "]}",
};
#define NV ((int)(sizeof vocab_text / sizeof *vocab_text))

static const char *json_g =
	"root ::= obj\n"
	"value ::= obj | arr | str | num | \"true\" | \"false\" | \"null\"\n"
	"obj ::= \"{\" (str \":\" value (\",\" str \":\" value)*)? \"}\"\n"
	"arr ::= \"[\" (value (\",\" value)*)? \"]\"\n"
	"str ::= \"\\\"\" ([^\"\\\\\\x00-\\x1f] | \"\\\\\" ([\"\\\\/bfnrt] | \"u\" [0-9a-fA-F]{4}))* \"\\\"\"\n"
	"num ::= \"-\"? (\"0\" | [1-9] [0-9]*) (\".\" [0-9]+)? ([eE] [-+]? [0-9]+)?\n";

static int gone_now(void *arg)
{
	(void)arg;
	return 1;
}

static void test_masks(void)
{
	size_t len[NV];
	for (int i = 0; i < NV; i++)
		len[i] = strlen(vocab_text[i]);
	struct llm_gvocab *v = NULL;
	if (!check(!llm_gvocab_new(&v, NV, vocab_text, len), "vocabulary of %d tokens", NV))
		return;
	struct llm_grammar *g = compile(json_g, v);
	if (!check(g != NULL, "the JSON grammar compiles"))
		return;
	/* random walks: at each state the mask must equal the brute force (each
	 * token's bytes run from the state), and the walk's text stays a prefix
	 * of a sentence; the walk ends when it accepts */
	uint64_t r = 12345;
	int bad = 0, states = 0, accepted = 0;
	for (int walk = 0; walk < 200; walk++) {
		int st = llm_grammar_start(g);
		char text[512];
		size_t tl = 0;
		for (int k = 0; k < 40 && !bad; k++) {
			uint8_t m[NV];
			int na;
			if (llm_grammar_mask(g, st, m, &na)) {
				bad = 1;
				break;
			}
			int cnt = 0;
			for (int t = 0; t < NV; t++) {
				int want = len[t] > 0 && llm_grammar_next(g, st, vocab_text[t], len[t]) >= 0;
				cnt += want;
				if (want != m[t]) {
					check_diag("after '%.*s': token '%s' mask %d brute force %d", (int)tl, text, vocab_text[t], m[t], want);
					bad = 1;
				}
			}
			if (cnt != na)
				bad = 1;
			states++;
			if (llm_grammar_accepts(g, st) && (r >> 33) % 3 == 0) {
				accepted++;
				if (!llm_grammar_match(g, text, tl))
					bad = 1;
				break;
			}
			if (!na)
				break;
			r = r * 6364136223846793005ull + 1442695040888963407ull;
			int pick = (int)((r >> 33) % (uint64_t)na), t = 0;
			for (; t < NV; t++)
				if (m[t] && pick-- == 0)
					break;
			if (tl + len[t] >= sizeof text)
				break;
			memcpy(text + tl, vocab_text[t], len[t]);
			tl += len[t];
			st = llm_grammar_next(g, st, vocab_text[t], len[t]);
		}
	}
	check(!bad, "masks equal the brute force at %d states of 200 random walks (%d ended accepted)", states, accepted);
	/* the cache: the same state again is a hit, and "aaaa" inside a string
	 * comes back to one state */
	struct llm_grammar_stats s0, s1;
	llm_grammar_stats(g, &s0);
	int st = llm_grammar_next(g, llm_grammar_start(g), "{\"a", 3);
	int st2 = llm_grammar_next(g, st, "aaaa", 4);
	uint8_t m[NV];
	int na;
	llm_grammar_mask(g, st, m, &na);
	llm_grammar_mask(g, st2, m, &na);
	llm_grammar_stats(g, &s1);
	check(st == st2 && st >= 0, "a string's characters come back to one state (%d, %d)", st, st2);
	check(s1.mask_hit >= s0.mask_hit + 1 && s1.mask_miss <= s0.mask_miss + 1,
	      "a state's mask is computed once, then served from the cache (hits %ld -> %ld, misses %ld -> %ld)",
	      s0.mask_hit, s1.mask_hit, s0.mask_miss, s1.mask_miss);
	/* byte-fallback pieces: the lone first byte of a 2-byte character is
	 * allowed inside a string, its continuation byte alone is not */
	int lead = -1, cont = -1, empty = -1;
	for (int t = 0; t < NV; t++) {
		if (!strcmp(vocab_text[t], "\xce"))
			lead = t;
		if (!strcmp(vocab_text[t], "\xb2"))
			cont = t;
		if (!len[t])
			empty = t;
	}
	check(m[lead] && !m[cont] && !m[empty], "inside a string: a lead byte allowed, a lone continuation byte and the empty token not");
	int after = llm_grammar_next(g, st, "\xce", 1);
	llm_grammar_mask(g, after, m, &na);
	int only_cont = 1;
	for (int t = 0; t < NV; t++)
		if (m[t] && !(len[t] == 1 && ((unsigned char)vocab_text[t][0] & 0xC0) == 0x80))
			only_cont = 0;
	check(na == 3 && m[cont] && only_cont, "after a lead byte only the continuation bytes (%d allowed)", na);
	int start = llm_grammar_start(g);
	check(!llm_grammar_accepts(g, start) && llm_grammar_accepts(g, llm_grammar_next(g, start, "{}", 2)) &&
	      !llm_grammar_can_continue(g, llm_grammar_next(g, start, "{}", 2)),
	      "accepts where the object closes, and nothing may follow");
	llm_grammar_unref(g);
	/* the vocabulary's cache: the same text is the same grammar (its states
	 * and masks shared), another text another one */
	struct llm_grammar *c1 = NULL, *c2 = NULL, *c3 = NULL;
	llm_grammar_compile_cached(&c1, json_g, strlen(json_g), v, NULL);
	llm_grammar_compile_cached(&c2, json_g, strlen(json_g), v, NULL);
	llm_grammar_compile_cached(&c3, "root ::= \"a\"", 12, v, NULL);
	check(c1 && c1 == c2 && c3 && c3 != c1, "the compile cache: one grammar per text");
	llm_grammar_unref(c1);
	llm_grammar_unref(c2);
	llm_grammar_unref(c3);
	llm_gvocab_free(v);   /* drops the cache's references */
}

/* An ambiguous grammar reaches one configuration by many paths: expanded
 * once each (3^16 paths before), and a nullable item under * is refused as
 * left recursion with a message that says what it is. */
static void test_ambiguous(void)
{
	const char *src = "root ::= x{0,16} \"z\"\nx ::= \"a\"? | \"b\"? | \"\"";
	struct llm_grammar *g = compile(src, NULL);
	check(g && llm_grammar_match(g, "ababz", 5) && !llm_grammar_match(g, "abcz", 4),
	      "an ambiguous repetition compiles and matches");
	llm_grammar_unref(g);
	g = NULL;
	enum llm_status s = llm_grammar_compile(&g, "root ::= (\"a\"?)*", 16, NULL);
	check(s == LLM_ERR_USAGE && strstr(llm_errmsg(), "a repetition of an item that can be empty"),
	      "(x?)* is refused naming what it is (%s)", llm_errmsg());
}


/* A text of COPIES of PIECE between PRE and POST (malloc'd). */
static char *repeat_text(const char *pre, const char *piece, int copies, const char *mid, const char *piece2, const char *post)
{
	size_t n = strlen(pre) + (strlen(piece) + strlen(piece2)) * (size_t)copies + strlen(mid) + strlen(post) + 1;
	char *t = malloc(n), *q = t;
	q += snprintf(q, n, "%s", pre);
	for (int i = 0; i < copies; i++)
		q += snprintf(q, n - (size_t)(q - t), "%s", piece);
	q += snprintf(q, n - (size_t)(q - t), "%s", mid);
	for (int i = 0; i < copies; i++)
		q += snprintf(q, n - (size_t)(q - t), "%s", piece2);
	snprintf(q, n - (size_t)(q - t), "%s", post);
	return t;
}

/* Issue 45: nothing the text asks for reaches the C stack's depth, and
 * each budget is refused by name (the old code crashed on the first two). */
static void test_limits(void)
{
	struct llm_grammar *g = NULL;
	/* nested bounded repetitions: thousands of nullable rules in a chain */
	const char *nest = "root ::= ((\"a\"{0,10000}){0,10000}){0,10000}";
	enum llm_status s = llm_grammar_compile(&g, nest, strlen(nest), NULL);
	check(s == LLM_ERR_USAGE && !g && strstr(llm_errmsg(), "grammar: the start state: ") &&
	      strstr(llm_errmsg(), "too ambiguous"), "nested repetitions {0,10000} x3: refused naming the limit (%s)",
	      s ? llm_errmsg() : "compiled");
	llm_grammar_unref(g);
	g = compile("root ::= ((\"a\"{0,40}){0,40}){0,40} \"b\"", NULL);
	check(g && llm_grammar_match(g, "aaaaab", 6) && llm_grammar_match(g, "b", 1) && !llm_grammar_match(g, "aaaa", 4),
	      "nested repetitions {0,40} x3 compile and match");
	llm_grammar_unref(g);
	/* groups nested in the text: 5000 refused, LLM_GRAMMAR_MAX_NEST taken */
	char *deep = repeat_text("root ::= ", "(", 5000, "\"a\"", ")", "");
	g = NULL;
	s = llm_grammar_compile(&g, deep, strlen(deep), NULL);
	check(s == LLM_ERR_USAGE && !g && !strcmp(llm_errmsg(), "grammar: line 1: groups nested more than 1000 deep"),
	      "5000 nested groups: refused naming the limit (%s)", s ? llm_errmsg() : "compiled");
	free(deep);
	deep = repeat_text("root ::= ", "(", LLM_GRAMMAR_MAX_NEST, "\"a\"", ")", "");
	g = compile(deep, NULL);
	check(g && llm_grammar_match(g, "a", 1), "%d nested groups compile", LLM_GRAMMAR_MAX_NEST);
	llm_grammar_unref(g);
	free(deep);
	/* 20000 rules in a chain: compiled (the lookups by name and the checks are linear) */
	char *chain = malloc(20000 * 40), *q = chain;
	q += sprintf_check(q, "root ::= r0\n");
	for (int i = 0; i < 20000; i++)
		q += sprintf_check(q, "r%d ::= \"x\" r%d | \"\"\n", i, i + 1);
	q += sprintf_check(q, "r20000 ::= \"y\"\n");
	g = compile(chain, NULL);
	check(g && llm_grammar_match(g, "xxx", 3) && llm_grammar_match(g, "", 0) && !llm_grammar_match(g, "xy", 2),
	      "a chain of 20000 rules compiles and matches");
	llm_grammar_unref(g);
	free(chain);
	/* the budgets: memory, work, and the compile's cancel test */
	struct llm_grammar_budget b = { .max_bytes = 1 << 16 };
	g = NULL;
	s = llm_grammar_compile_budget(&g, "root ::= [a-z]{5000}", 20, NULL, &b);
	check(s == LLM_ERR_USAGE && !g && !strcmp(llm_errmsg(), "grammar: the grammar passed its memory budget (65536 bytes)"),
	      "a grammar past its memory budget: refused naming it (%s)", s ? llm_errmsg() : "compiled");
	b = (struct llm_grammar_budget){ .work = 1000 };
	const char *amb = "root ::= (\"a\"{0,100}){0,100}";
	s = llm_grammar_compile_budget(&g, amb, strlen(amb), NULL, &b);
	check(s == LLM_ERR_USAGE && !g && strstr(llm_errmsg(), "passed the work budget (1000 stack words"),
	      "a start past its work budget: refused naming it (%s)", s ? llm_errmsg() : "compiled");
	b = (struct llm_grammar_budget){ .cancel = gone_now };
	s = llm_grammar_compile_budget(&g, json_g, strlen(json_g), NULL, &b);
	check(s == LLM_ERR_USAGE && !g && !strcmp(llm_errmsg(), "grammar: the compile was given up (its client has gone)"),
	      "a compile whose client has gone is given up (%s)", s ? llm_errmsg() : "compiled");
	b = (struct llm_grammar_budget){ .deadline = 1e-9 };   /* long past */
	s = llm_grammar_compile_budget(&g, json_g, strlen(json_g), NULL, &b);
	check(s == LLM_ERR_USAGE && !g && !strcmp(llm_errmsg(), "grammar: the compile passed its time budget"),
	      "a compile past its deadline is given up (%s)", s ? llm_errmsg() : "compiled");
}

int main(void)
{
	test_accept();
	test_errors();
	test_masks();
	test_ambiguous();
	test_limits();
	return check_done();
}
