/* common/engine/sampler.h: per-request token sampling.
 *
 * Order (as vLLM/Hugging Face): the tokens a grammar's mask refuses
 * (struct llm_sampler's mask, set by the caller before each draw) set to
 * -inf, so every later step sees only allowed tokens; logit biases added to the logits, the ids
 * held back before min_tokens (llm_sampler_hold) set to -inf, penalties
 * (repetition over prompt and output, frequency and presence over the
 * output), then greedy
 * argmax when temperature is 0 (ties: the lowest id, as run.c), else
 * temperature, top-k, top-p, min-p, and one draw. Reported log-probabilities
 * (the chosen token's and the top-n) are those of the raw model distribution,
 * log_softmax(logits) computed in double, before penalties and temperature.
 *
 * Randomness: each request owns a xoshiro256** stream seeded (splitmix64)
 * from its seed alone, and draws exactly one number per sampled token, so
 * its tokens do not depend on the other requests of the batch. */
#ifndef LLM_SAMPLER_H
#define LLM_SAMPLER_H

#include "status.h"

#define LLM_MAX_STOP 8
#define LLM_MAX_LOGPROBS 20
#define LLM_MAX_BIAS 1024
#define LLM_MAX_HOLD 24         /* ids held back before min_tokens: EOS ids and stop ids */

struct llm_logit_bias { int32_t id; float bias; };
struct llm_grammar;

struct llm_sample_params {
	float temperature;          /* 0: greedy */
	int top_k;                  /* 0: off */
	float top_p;                /* 1: off */
	float min_p;                /* 0: off */
	float repetition_penalty;   /* 1: off; > 1 discourages tokens seen in prompt or output */
	float frequency_penalty;    /* 0: off; minus count * this */
	float presence_penalty;     /* 0: off; minus this once a token appeared */
	uint64_t seed;
	int max_tokens;             /* generated tokens at most; 0: up to the context */
	int min_tokens;             /* generated tokens before EOS, a stop id or a stop string can
	                             * end the request (0: off); at most max_tokens when that is set */
	int n_logprobs;             /* top-n log-probs per token, 0..LLM_MAX_LOGPROBS */
	int skip_logprob;           /* 1: the chosen token's log-prob is not wanted (NaN): saves a
	                             * pass of exp over the vocabulary per token */
	int ignore_eos;             /* 1: the model's EOS ids do not stop */
	int n_stop_ids;
	int32_t stop_ids[LLM_MAX_STOP];   /* generated ids that stop (finish "stop") */
	int n_stop;
	const char *stop[LLM_MAX_STOP];   /* strings that stop, matched on the decoded text */
	int n_bias;
	const struct llm_logit_bias *bias;   /* (n_bias) added to the logits (an id twice: both
	                                      * added), each in [-100, 100]; -100 all but bans */
	struct llm_grammar *grammar;   /* structured output (grammar.h): the text must be a sentence
	                                * of it; NULL: none. The request's owner holds a reference;
	                                * the scheduler's request output takes its own (reqout.c) */
};
#define LLM_SAMPLE_DEFAULT { .temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f }

/* Check ranges; LLM_ERR_USAGE naming the field (token ids are checked
 * against the vocabulary by llm_sampler_init). */
enum llm_status llm_sample_params_check(const struct llm_sample_params *p);

/* The request forms of two fields, shared by llm-serve (OpenAI bodies) and
 * llm-generate (JSONL lines and flags); common/engine/sample_json.c. V is the
 * field's JSON value (a jansson json_t, not null). Token ids must lie in
 * [0, N_VOCAB) when N_VOCAB > 0 (else llm_sampler_init checks the biases).
 * On bad input LLM_ERR_USAGE with a message that does not name the field:
 * the caller prefixes it. */
struct json_t;
/* logit_bias: {"ID": BIAS in [-100, 100], ...}, at most LLM_MAX_BIAS
 * entries; *BIAS is malloc'd (NULL when there are none). */
enum llm_status llm_json_logit_bias(struct json_t *v, int n_vocab, struct llm_logit_bias **bias, int *n);
/* stop_token_ids: [ID, ...], at most LLM_MAX_STOP. */
enum llm_status llm_json_stop_ids(struct json_t *v, int n_vocab, int32_t ids[LLM_MAX_STOP], int *n);
/* "ID=BIAS", a command line's form of one logit bias. */
enum llm_status llm_logit_bias_parse(const char *spec, struct llm_logit_bias *b);

struct llm_logprob { int32_t id; float logprob; };

struct llm_sample_out {
	int32_t token;
	float logprob;              /* of token, raw distribution */
	int n_top;
	struct llm_logprob top[LLM_MAX_LOGPROBS];   /* best first */
};

struct llm_sampler {
	struct llm_sample_params p;
	int n_vocab;
	uint64_t rng[4];
	int32_t *count;             /* (n_vocab) occurrences in the output */
	uint8_t *seen;              /* (n_vocab) 1: in the prompt or output */
	float *work;                /* (n_vocab) */
	int32_t *idx, *tmp;         /* (n_vocab) candidates, merge buffer */
	double *prob;               /* (n_vocab) */
	int n_out;                  /* tokens accepted */
	int n_hold;
	int32_t hold[LLM_MAX_HOLD]; /* no probability while n_out < p.min_tokens */
	const uint8_t *mask;        /* (n_mask) set by the caller before a draw, NULL: none; a token
	                             * whose byte is 0 (or at or past n_mask) gets no probability */
	int n_mask;
	float *dist;                /* (n_vocab) llm_sampler_verify's target distribution, made on first use */
	int32_t *seen_id;           /* (n_vocab) with penalties: the ids seen, distinct, in first-seen
	                             * order (n_seen of them), for llm_sampler_row */
	int32_t *seen_cnt;          /* (n_vocab) their output counts, filled by llm_sampler_row */
	int n_seen;
};

/* Allocates the per-request state (O(n_vocab)); P's strings and biases are
 * borrowed. LLM_ERR_RANGE for a bias on an id outside [0, n_vocab). */
enum llm_status llm_sampler_init(struct llm_sampler *s, const struct llm_sample_params *p, int n_vocab);
/* IDS (N, at most LLM_MAX_HOLD; ids outside the vocabulary are left out)
 * cannot be sampled until p.min_tokens tokens have been accepted: the ids
 * that would end the request. */
void llm_sampler_hold(struct llm_sampler *s, const int32_t *ids, int n);
void llm_sampler_free(struct llm_sampler *s);
/* Note prompt tokens (repetition penalty). */
void llm_sampler_prompt(struct llm_sampler *s, const int32_t *ids, int n);
/* Note a generated token (all penalties). */
void llm_sampler_accept(struct llm_sampler *s, int32_t id);
/* Choose the next token from LOGITS (n_vocab, not modified). LLM_ERR_RANGE
 * when a logit is NaN or infinite (the model's numbers are broken: no
 * token is chosen and OUT is not set); the message names the first such id.
 * LLM_ERR_RANGE too when the mask (and min_tokens' hold) leave no token.
 * A mask needs p.grammar set at init (its working copy of the logits). */
enum llm_status llm_sampler_sample(struct llm_sampler *s, const float *logits, struct llm_sample_out *out);

/* The final distribution LOGITS would be sampled from, into PROB (n_vocab
 * f32, summing to 1 up to rounding): after the mask, biases, hold and
 * penalties, temperature, top-k, top-p and min-p, exactly the candidates
 * and odds llm_sampler_sample draws from; at temperature 0 a point mass on
 * the argmax. Draws no random number. Statuses as llm_sampler_sample. */
enum llm_status llm_sampler_dist(struct llm_sampler *s, const float *logits, float *prob);

/* Speculative sampling's rejection rule (draft-model speculation, spec.h):
 * X was drawn from the draft's distribution Q; P is the target's (both N
 * f32, as llm_sampler_dist makes them). Accepts X with probability
 * min(1, p(x) / q(x)) (*ACCEPTED = 1, returns X); else (*ACCEPTED = 0)
 * returns a draw from norm(max(0, p - q)), or from P when rounding leaves
 * that empty. The token returned is distributed as P whatever Q is. Draws
 * one number from RNG to decide, a second on rejection. */
int32_t llm_spec_reject(const float *p, const float *q, int n, int32_t x, uint64_t rng[4], int *accepted);

/* The request's side of it: P from LOGITS by llm_sampler_dist, the rule
 * with the sampler's own random stream, OUT filled as llm_sampler_sample
 * fills it (log-probs of the raw distribution). LLM_ERR_NOMEM for its
 * buffer (one n_vocab f32 array, kept), else llm_sampler_sample's statuses. */
enum llm_status llm_sampler_verify(struct llm_sampler *s, const float *logits, const float *q, int32_t x,
                                   struct llm_sample_out *out, int *accepted);

/* One draw handed to a backend's sample op (backend.h), which chooses the
 * token on the device where the logits are: the parameters and the
 * request's state as llm_sampler_sample uses them (the order of sampler.h),
 * the per-request arrays as lists. */
struct llm_sample_row {
	float temperature;          /* 0: greedy */
	int top_k;                  /* 0: off */
	float top_p, min_p;
	float repetition_penalty, frequency_penalty, presence_penalty;
	int n_bias;
	const struct llm_logit_bias *bias;   /* (n_bias) added in this order */
	int n_hold;
	const int32_t *hold;        /* (n_hold) ids given no probability; 0 once min_tokens are out */
	int n_seen;
	const int32_t *seen;        /* (n_seen) distinct ids seen in the prompt or output (penalties) */
	const int32_t *count;       /* (n_seen) their counts in the output */
	double u;                   /* the request's draw in [0, 1) when temperature > 0 */
	int want_logprob;           /* 0: the chosen token's log-prob is not wanted (NaN) */
};

/* Whether a backend's sample op can make S's next draw: no grammar mask and
 * no top log-probs (the op returns only the token and its log-prob). */
int llm_sampler_row_ok(const struct llm_sampler *s);
/* Fill ROW for S's next draw (llm_sampler_row_ok true), taking the draw
 * from S's random stream when temperature > 0: the same one number
 * llm_sampler_sample would take, so the request's stream stays where the
 * host path leaves it. ROW points into S until its next accept. */
void llm_sampler_row(struct llm_sampler *s, struct llm_sample_row *row);

/* The first index of the largest of W[0..n) (as `w[i] > w[best]` from 0). */
int32_t llm_argmax(const float *w, int n);

/* log_softmax(logits)[id] in double, and the top N (best first, ties by id). */
double llm_logprob(const float *logits, int n_vocab, int32_t id);
int llm_top_logprobs(const float *logits, int n_vocab, int n, struct llm_logprob *out);

/* The request RNG, exposed for tests: seed it, then draw in [0, 1). */
void llm_rng_seed(uint64_t st[4], uint64_t seed);
double llm_rng_uniform(uint64_t st[4]);

#endif
