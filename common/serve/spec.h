/* common/serve/spec.h: speculative decoding's options and its prompt-lookup
 * (n-gram) drafter. The scheduler (scheduler.c) feeds a decoding request's
 * last token and up to n_draft drafted ones as one chunk, one logit row
 * each, and samples the rows in order while the sampled token equals the
 * draft; the first token that differs (or ends the request) is kept and
 * the KV of the positions after it is rolled back.
 *
 * Why that is the standard rule: a prompt-lookup draft is a point mass q
 * on token d. Rejection sampling accepts d with min(1, p(d) / q(d)) = p(d)
 * and on rejection draws from norm(max(0, p - q)) = p without d; the token
 * that comes out has probability p(x) for every x, exactly as one draw
 * x ~ p accepted when x == d. The scheduler makes that one draw with the
 * request's own sampler (the same random number plain decoding would use
 * at that position), so a request's tokens are the same with and without
 * speculation, greedy or sampled, seeded: the logits of each row equal
 * plain decoding's bit for bit (batch-invariant ops, backend.h).
 *
 * Draft-model speculation (LLM_SPEC_DRAFT, --draft DIR): a smaller
 * checkpoint with the same vocabulary runs as a second engine; each step
 * it drafts K tokens per decoding request autoregressively, x_i drawn from
 * its distribution q_i (the request's sampling parameters less penalties,
 * min_tokens and grammar), and the target verifies them with the standard
 * rule (sampler.h: llm_spec_reject): accept x with min(1, p(x) / q(x)),
 * else draw from norm(max(0, p - q)); the token kept is distributed as p.
 * At temperature 0 both are point masses and the ids are greedy
 * decoding's bit for bit; sampled ids keep the distribution, not the
 * seeded sequence (the verify draws its own numbers). */
#ifndef LLM_SPEC_H
#define LLM_SPEC_H

#include "status.h"

enum llm_spec_mode { LLM_SPEC_OFF = 0, LLM_SPEC_NGRAM, LLM_SPEC_DRAFT };

#define LLM_SPEC_MAX_DRAFT 16   /* drafted tokens per step at most */

struct llm_spec_opts {
	enum llm_spec_mode mode;
	int n_draft;                /* tokens drafted per step at most, 1..LLM_SPEC_MAX_DRAFT */
	int ngram;                  /* longest suffix matched (prompt lookup), 1..8 */
	const char *draft;          /* LLM_SPEC_DRAFT: the draft checkpoint's directory (borrowed) */
};

/* The options' table entries, the same in every tool that takes them. */
#define LLM_SPEC_OPTS(mode, k, n, draft) \
	LLM_STR(0, "speculate", "MODE", mode, "speculative decoding: ngram (prompt lookup: drafts copied from an earlier " \
	        "occurrence of the last tokens), draft (a smaller model's tokens, --draft) or off"), \
	LLM_STR(0, "draft", "DIR", draft, "--speculate draft: the draft model's checkpoint (the same vocabulary)"), \
	LLM_INT(0, "spec-tokens", "K", k, "--speculate: tokens drafted per step at most", 1, LLM_SPEC_MAX_DRAFT), \
	LLM_INT(0, "spec-ngram", "N", n, "--speculate ngram: match the last N tokens, then fewer down to 1", 1, 8)
#define LLM_SPEC_DEFAULT_TOKENS 4
#define LLM_SPEC_DEFAULT_NGRAM 3

/* O from a tool's flags: MODE "ngram", "draft" (DRAFT the checkpoint,
 * required) or "off" (NULL: off); K (--spec-tokens) and NGRAM
 * (--spec-ngram), 0 where the command line did not give them (then
 * LLM_SPEC_DEFAULT_TOKENS and LLM_SPEC_DEFAULT_NGRAM). LLM_ERR_USAGE naming
 * the flag for anything else, for DRAFT without MODE draft, for K or NGRAM
 * without MODE, and for NGRAM with MODE draft. */
enum llm_status llm_spec_opts_set(struct llm_spec_opts *o, const char *mode, int64_t k, int64_t ngram,
                                  const char *draft);

/* Prompt lookup: for g = NGRAM down to 1, the most recent earlier
 * occurrence of the last g ids of IDS (N) that some id follows; up to K of
 * the ids that follow it go to OUT (which must not overlap IDS[0..N)).
 * Returns how many (0: no occurrence). O(N * NGRAM) comparisons. */
int llm_spec_ngram(const int32_t *ids, int n, int ngram, int k, int32_t *out);

#endif
