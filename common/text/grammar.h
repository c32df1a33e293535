/* common/text/grammar.h: the grammar engine of constrained decoding (structured
 * output): a grammar in the EBNF below compiled to a pushdown recogniser
 * over bytes, its states, and per state the mask of the vocabulary's
 * tokens that may come next.
 *
 * The grammar text (GBNF-like; llm-serve(1) and llm-generate(1) document it):
 *   root  ::= "{" pair ("," pair)* "}"     rules: NAME ::= alternatives; "root" starts
 *   pair  ::= str ":" [0-9]+               a rule ends where the next NAME ::= begins
 *   str   ::= "\"" [^"\\]{1,8} "\""        # comments run to the end of the line
 * Alternatives are separated by |; a sequence is items side by side; an
 * item is a "string literal", a [character class] ([^...] negated, a-z
 * ranges), . (any character), a rule NAME or a ( group ), followed by at
 * most one of ? * + {m} {m,} {m,n} (n <= 10000). Escapes in literals and
 * classes: \n \r \t \\ \" \' \] \[ \- \^ \xHH \uHHHH \UHHHHHHHH. Text is
 * UTF-8: a class or . matches one whole UTF-8 character (classes compile to
 * byte sequences, surrogates excluded), so masks and states are over bytes
 * and a token whose bytes end mid-character (a byte-fallback token) is
 * allowed exactly when some completion of it is. Rules may recurse, but not
 * on the left (refused at compile time, as is an undefined rule). Groups
 * nest at most LLM_GRAMMAR_MAX_NEST deep.
 *
 * A state is an int (a set of recogniser stacks, interned in the grammar);
 * its byte transitions and its token mask are computed once and kept, so a
 * state seen again (inside a JSON string, between list items) costs a
 * lookup. A grammar is shared by reference (llm_grammar_ref/_unref, atomic
 * count); its states and caches are not locked: one thread at a time
 * (the scheduler's) may call the state functions.
 *
 * Budgets: no recursion of the engine follows the grammar's depth (the
 * parser stops at LLM_GRAMMAR_MAX_NEST, the recogniser keeps its work on a
 * heap stack), and every grammar has a budget (struct llm_grammar_budget):
 * its memory (compiled form, states, transitions and masks together), the
 * work of one state's computation (stack words copied while expanding:
 * bounded per call, so no one call of a state function runs long), and for
 * the compile a deadline and a cancel test. A compile past a budget is
 * refused with LLM_ERR_USAGE naming it; a state function past one returns
 * -1 or LLM_ERR_RANGE with the budget named. */
#ifndef LLM_GRAMMAR_H
#define LLM_GRAMMAR_H

#include <stddef.h>
#include <stdint.h>
#include "status.h"

struct llm_grammar;

/* The tokens' byte strings and their trie, built once per tokenizer. */
struct llm_gvocab;

/* N tokens; token i is the LEN[i] bytes at BYTES[i] (copied). A token of no
 * bytes (special and control tokens, ids the tokenizer lacks) is never
 * allowed by a mask. LLM_ERR_NOMEM. */
enum llm_status llm_gvocab_new(struct llm_gvocab **v, int n, const char *const *bytes, const size_t *len);
void llm_gvocab_free(struct llm_gvocab *v);
int llm_gvocab_size(const struct llm_gvocab *v);
/* Token ID's bytes (*LEN of them), or NULL outside [0, size). */
const char *llm_gvocab_token(const struct llm_gvocab *v, int id, size_t *len);

#define LLM_GRAMMAR_MAX_NEST 1000                  /* groups ( ... ) nested in grammar text */
#define LLM_GRAMMAR_MAX_BYTES ((size_t)128 << 20)  /* one grammar's memory */
#define LLM_GRAMMAR_WORK (1L << 22)                /* stack words one state's computation copies */
#define LLM_GRAMMAR_CACHE_BYTES ((size_t)512 << 20) /* the cached grammars' memory (below) */
#define LLM_GRAMMAR_FORCED 4096                    /* bytes the start forces, followed by the compile */

struct llm_grammar_budget {
	size_t max_bytes;        /* the grammar's memory, its lifetime long (0: LLM_GRAMMAR_MAX_BYTES) */
	long work;               /* per state computed: transitions, masks, the start (0: LLM_GRAMMAR_WORK) */
	double deadline;         /* llm_now() past which a compile is given up (0: none) */
	int (*cancel)(void *arg);   /* polled while compiling: nonzero gives it up (its client left); NULL: none */
	void *arg;
};

/* Compile LEN bytes of grammar text SRC; masks are over V (borrowed: it
 * must outlive the grammar; NULL: no masks). The start state and, with V,
 * its mask are computed here, so the first token costs the caller's thread
 * nothing, and so are the states along the bytes the start forces (up to
 * LLM_GRAMMAR_FORCED: a tool call's wrapping and name), so a budget passed
 * where the text first has a choice is a compile error too. LLM_ERR_USAGE
 * with a message "grammar: line L: ..." for bad
 * text, "grammar: ... budget ..." for one spent (B NULL: the defaults),
 * LLM_ERR_NOMEM. The count is 1. */
enum llm_status llm_grammar_compile_budget(struct llm_grammar **g, const char *src, size_t len, const struct llm_gvocab *v,
                                           const struct llm_grammar_budget *b);
enum llm_status llm_grammar_compile(struct llm_grammar **g, const char *src, size_t len, const struct llm_gvocab *v);
/* The same from V's cache of the last LLM_GRAMMAR_CACHE texts compiled
 * over it: a text seen again is the grammar compiled the first time (a new
 * reference), so its states and masks, computed for one request, serve the
 * next ones (clients send the same schema again and again). The cache
 * keeps at most LLM_GRAMMAR_CACHE_BYTES of grammars (their memory when one
 * is added; the least recently used go first, a bigger one is not kept).
 * Thread-safe (V holds a mutex); the grammar's states, as any grammar's,
 * are for one thread at a time. */
#define LLM_GRAMMAR_CACHE 16
enum llm_status llm_grammar_compile_cached(struct llm_grammar **g, const char *src, size_t len, struct llm_gvocab *v,
                                           const struct llm_grammar_budget *b);
struct llm_grammar *llm_grammar_ref(struct llm_grammar *g);
void llm_grammar_unref(struct llm_grammar *g);   /* NULL: nothing */

/* The vocabulary masks are over (NULL: none). */
const struct llm_gvocab *llm_grammar_vocab(const struct llm_grammar *g);
/* The start state. */
int llm_grammar_start(struct llm_grammar *g);
/* The state after N bytes at S from state ST: -1 when the grammar refuses
 * them (or its state table is full: LLM_ERR_NOMEM is then left as the message). */
int llm_grammar_next(struct llm_grammar *g, int st, const void *s, size_t n);
/* llm_grammar_next with the bytes of token ID of the grammar's vocabulary
 * (-1 for a token of no bytes or outside it). */
int llm_grammar_next_token(struct llm_grammar *g, int st, int id);
/* Whether the text so far is a whole sentence of the grammar. */
int llm_grammar_accepts(const struct llm_grammar *g, int st);
/* Whether some byte may follow. */
int llm_grammar_can_continue(const struct llm_grammar *g, int st);
/* Whether LEN bytes of TEXT are a whole sentence (tests, tools). */
int llm_grammar_match(struct llm_grammar *g, const void *text, size_t len);

/* MASK (llm_gvocab_size bytes, the caller's) set 1 for the tokens whose
 * bytes the grammar takes from ST, 0 for the others; *N_ALLOWED counts the
 * ones. Computed on the first call for ST (a walk of the token trie,
 * pruned where the grammar refuses), then kept compact (the allowed ids,
 * or a bitset when that is smaller). LLM_ERR_USAGE without a vocabulary,
 * LLM_ERR_RANGE past a budget, LLM_ERR_NOMEM. */
enum llm_status llm_grammar_mask(struct llm_grammar *g, int st, uint8_t *mask, int *n_allowed);

/* Counters: states interned, masks computed (misses), masks served from
 * the cache (hits), bytes of memory held, the most work one computation
 * took (stack words, as the budget counts). */
struct llm_grammar_stats { long n_states, mask_miss, mask_hit; size_t bytes, work_peak; };
void llm_grammar_stats(const struct llm_grammar *g, struct llm_grammar_stats *s);

#endif
