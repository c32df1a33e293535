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
 * on the left (refused at compile time, as is an undefined rule).
 *
 * A state is an int (a set of recogniser stacks, interned in the grammar);
 * its byte transitions and its token mask are computed once and kept, so a
 * state seen again (inside a JSON string, between list items) costs a
 * lookup. A grammar is shared by reference (llm_grammar_ref/_unref, atomic
 * count); its states and caches are not locked: one thread at a time
 * (the scheduler's) may call the state functions. */
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

/* Compile LEN bytes of grammar text SRC; masks are over V (borrowed: it
 * must outlive the grammar; NULL: no masks). LLM_ERR_USAGE with a message
 * "grammar: line L: ..." for bad text, LLM_ERR_NOMEM. The count is 1. */
enum llm_status llm_grammar_compile(struct llm_grammar **g, const char *src, size_t len, const struct llm_gvocab *v);
/* The same from V's cache of the last LLM_GRAMMAR_CACHE texts compiled
 * over it: a text seen again is the grammar compiled the first time (a new
 * reference), so its states and masks, computed for one request, serve the
 * next ones (clients send the same schema again and again). Thread-safe (V
 * holds a mutex); the grammar's states, as any grammar's, are for one
 * thread at a time. */
#define LLM_GRAMMAR_CACHE 16
enum llm_status llm_grammar_compile_cached(struct llm_grammar **g, const char *src, size_t len, struct llm_gvocab *v);
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

/* *MASK (llm_gvocab_size bytes, owned by the grammar, valid while it
 * lives): 1 for the tokens whose bytes the grammar takes from ST, 0 else;
 * *N_ALLOWED counts the ones. Computed on the first call for ST (a walk of
 * the token trie, pruned where the grammar refuses), then kept.
 * LLM_ERR_USAGE without a vocabulary, LLM_ERR_NOMEM. */
enum llm_status llm_grammar_mask(struct llm_grammar *g, int st, const uint8_t **mask, int *n_allowed);

/* Counters: states interned, masks computed (misses), masks served from
 * the cache (hits). */
struct llm_grammar_stats { long n_states, mask_miss, mask_hit; };
void llm_grammar_stats(const struct llm_grammar *g, struct llm_grammar_stats *s);

#endif
