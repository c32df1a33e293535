/* common/serve/reqout.h: a request's output, as the scheduler (scheduler.c)
 * handles it: sampling, the conditions that end a request, the decoded
 * text and the events handed to the request's callback.
 *
 * Per sampled token, in this order: the stop ids, then EOS (unless
 * ignore_eos) end the request with that token, which adds no text; else
 * the token's text joins the pending text, and a stop string found there
 * ends the request at the string (the text before it is released, the
 * string and what follows are not); else max new tokens ends it with
 * LLM_FINISH_LENGTH. Until min_tokens tokens, the sampler gives the stop ids
 * and EOS ids no probability and stop strings are not looked for. Text that
 * could still start a stop string is held back; the last event releases
 * all that is left (the detokenizer flushed). The callback's nonzero
 * return cancels: no further events.
 *
 * With a grammar (params.grammar): before each draw the sampler gets the
 * grammar state's token mask, EOS ids added where the text so far is a
 * whole sentence (unless ignore_eos); each token advances the state. The
 * request ends with LLM_FINISH_STOP as soon as the text is a sentence
 * nothing can extend; max new tokens before that end it with
 * LLM_FINISH_LENGTH, never as complete; a state that no token of the
 * vocabulary continues ends it with LLM_FINISH_ERROR. */
#ifndef LLM_REQOUT_H
#define LLM_REQOUT_H

#include "generate.h"
#include "detok.h"

struct llm_reqout {
	int id;                     /* the request's, in events */
	struct llm_sample_params p; /* stop strings and biases point into buf */
	void *buf;
	struct llm_sampler smp;
	const struct llm_detok *detok;   /* the manager's (borrowed); NULL: no text */
	const int32_t *eos;         /* (n_eos) the manager's (borrowed) */
	int n_eos;
	void *dt;                   /* the detokenizer's state */
	char *text;                 /* decoded, not yet released */
	size_t text_len, text_cap;
	int max_new, n_gen;
	int (*on_token)(void *, const struct llm_token_event *);
	void *user;
	int quiet;                  /* no more events: cancelled by the callback, or set by the
	                             * manager on a rank that only follows rank 0 */
	struct llm_grammar *g;      /* p.grammar, a reference of its own; NULL: none */
	int gst;                    /* its state */
	uint8_t *mask;              /* (n_vocab) the grammar's mask with EOS where it accepts */
	int n_vocab;
};

/* Set O up for request RQ (its params checked by the caller) with MAX_NEW
 * tokens at most: copies the stop strings and biases, opens the sampler
 * (seeing the prompt) and a detokenizer state primed with the prompt (the
 * events' text is the continuation's, decoded after it). DETOK and EOS stay the
 * caller's. On failure O holds nothing; else free it with llm_reqout_free. */
enum llm_status llm_reqout_init(struct llm_reqout *o, int id, const struct llm_request *rq, int n_vocab,
                                int max_new, const struct llm_detok *detok, const int32_t *eos, int n_eos);
void llm_reqout_free(struct llm_reqout *o);

/* Sample the token after LOGITS (n_vocab) and handle it as above: *TOK gets
 * it, *FIN why the request ends (LLM_FINISH_NONE: it goes on;
 * LLM_FINISH_CANCEL: the callback asked; LLM_FINISH_ERROR: the logits are
 * not finite, the request's last event (token -1) carries the reason and
 * *TOK is -1). LLM_ERR_NOMEM if the text cannot grow. A token the detokenizer refuses adds no text. */
enum llm_status llm_reqout_take(struct llm_reqout *o, const float *logits, int32_t *tok, enum llm_finish *fin);
/* The same for a token a draft model proposed: X drawn from its
 * distribution Q (n_vocab), kept or replaced by the rejection rule
 * (llm_sampler_verify), so *TOK is distributed as plain sampling's. Q NULL:
 * llm_reqout_take. */
enum llm_status llm_reqout_verify(struct llm_reqout *o, const float *logits, const float *q, int32_t x, int32_t *tok,
                                  enum llm_finish *fin);

/* The same in two halves, so that the draws of a step's requests can run
 * in parallel (each on its own request; llm_reqout_draw touches nothing
 * else): whether O's next draw can be made apart (no grammar: its mask
 * follows the state the previous token left); the draw from LOGITS into
 * *SO (llm_sampler_sample's statuses; on failure nothing changed, and
 * llm_reqout_take on the same logits reports it as its own); then the
 * token handled as llm_reqout_take handles its own. */
int llm_reqout_drawable(const struct llm_reqout *o);
enum llm_status llm_reqout_draw(struct llm_reqout *o, const float *logits, struct llm_sample_out *so);
enum llm_status llm_reqout_drawn(struct llm_reqout *o, const struct llm_sample_out *so, int32_t *tok,
                                 enum llm_finish *fin);

/* Sampling elsewhere (a backend's sample op, backend.h): whether it can
 * make O's next draw (no grammar, no top log-probs); ROW for that draw
 * (llm_sampler_row: takes the request's random number when it samples);
 * and the token it chose, ID (< 0: the logits held a non-finite value,
 * LOGPROB, at id -1 - ID) with its LOGPROB, handled as llm_reqout_take
 * handles its own, *TOK and *FIN likewise. */
int llm_reqout_row_ok(const struct llm_reqout *o);
void llm_reqout_row(struct llm_reqout *o, struct llm_sample_row *row);
enum llm_status llm_reqout_put(struct llm_reqout *o, int32_t id, float logprob, int32_t *tok, enum llm_finish *fin);

/* The last event of a request that ends without a token (token -1, no
 * text): FIN is why (a prefill-only request ends with LLM_FINISH_LENGTH). */
void llm_reqout_end(struct llm_reqout *o, enum llm_finish fin);
/* The event of a request cancelled from outside: llm_reqout_end(CANCEL). */
void llm_reqout_cancelled(struct llm_reqout *o);

#endif
