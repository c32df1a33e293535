/* common/serve/reqout.c: a request's output (see reqout.h for the order). */
#include "reqout.h"
#include "buf.h"
#include "grammar.h"

#include <stdlib.h>
#include <string.h>
#include "banned.h"

enum llm_status llm_reqout_init(struct llm_reqout *o, int id, const struct llm_request *rq, int n_vocab,
                                int max_new, const struct llm_detok *detok, const int32_t *eos, int n_eos)
{
	memset(o, 0, sizeof *o);
	o->id = id;
	o->p = rq->params;
	o->max_new = max_new;
	o->detok = detok && detok->push ? detok : NULL;
	o->eos = eos;
	o->n_eos = n_eos;
	o->on_token = rq->on_token;
	o->user = rq->user;
	/* one buffer: the biases, then the stop strings */
	size_t nb = (size_t)o->p.n_bias * sizeof *o->p.bias, total = nb;
	for (int i = 0; i < o->p.n_stop; i++)
		total += strlen(o->p.stop[i]) + 1;
	if (total) {
		char *q = o->buf = malloc(total);
		if (!q)
			return llm_fail(LLM_ERR_NOMEM, "request: out of memory");
		if (nb)
			memcpy(q, o->p.bias, nb);
		o->p.bias = nb ? (const struct llm_logit_bias *)(void *)q : NULL;
		q += nb;
		for (int i = 0; i < o->p.n_stop; i++) {
			size_t n = strlen(o->p.stop[i]);
			memcpy(q, o->p.stop[i], n + 1);
			o->p.stop[i] = q;
			q += n + 1;
		}
	}
	enum llm_status s = llm_sampler_init(&o->smp, &o->p, n_vocab);
	if (s) {
		free(o->buf);
		memset(o, 0, sizeof *o);
		return s;
	}
	if (o->p.grammar) {
		o->g = llm_grammar_ref(o->p.grammar);
		o->gst = llm_grammar_start(o->g);
		o->n_vocab = n_vocab;
		int nm = llm_gvocab_size(llm_grammar_vocab(o->g));   /* the mask is written whole, then cut to n_vocab */
		if (!(o->mask = malloc((size_t)(nm > n_vocab ? nm : n_vocab)))) {
			llm_reqout_free(o);
			return llm_fail(LLM_ERR_NOMEM, "request: out of memory");
		}
	}
	llm_sampler_prompt(&o->smp, rq->prompt, rq->n_prompt);
	llm_sampler_hold(&o->smp, o->p.stop_ids, o->p.n_stop_ids);
	if (!o->p.ignore_eos)
		llm_sampler_hold(&o->smp, eos, n_eos);
	if (o->detok && o->detok->open && !(o->dt = o->detok->open(o->detok->ctx))) {
		llm_reqout_free(o);
		return llm_fail(LLM_ERR_NOMEM, "request: detokenizer state");
	}
	/* the text is the continuation's: decoded after the prompt */
	if (o->dt && o->detok->prime && rq->n_prompt > 0 && o->detok->prime(o->dt, rq->prompt, (size_t)rq->n_prompt)) {
		llm_reqout_free(o);
		return llm_fail(LLM_ERR_NOMEM, "request: detokenizer state");
	}
	return LLM_OK;
}

void llm_reqout_free(struct llm_reqout *o)
{
	if (o->dt && o->detok->close)
		o->detok->close(o->dt);
	llm_sampler_free(&o->smp);
	llm_grammar_unref(o->g);
	free(o->mask);
	free(o->buf);
	free(o->text);
	memset(o, 0, sizeof *o);
}

static int text_append(struct llm_reqout *o, const char *s, size_t n)
{
	if (LLM_ARRAY_RESERVE(o->text, o->text_cap, o->text_len + n + 1))
		return -1;
	memcpy(o->text + o->text_len, s, n);
	o->text_len += n;
	o->text[o->text_len] = 0;
	return 0;
}

/* Earliest stop string in the pending text: its offset and index, or -1. */
static long stop_find(const struct llm_reqout *o, int *which)
{
	long best = -1;
	for (int i = 0; o->text && i < o->p.n_stop; i++) {
		const char *hit = strstr(o->text, o->p.stop[i]);
		if (hit && (best < 0 || hit - o->text < best)) {
			best = hit - o->text;
			*which = i;
		}
	}
	return best;
}

/* Bytes at the end of the pending text that could start a stop string. */
static size_t stop_holdback(const struct llm_reqout *o)
{
	size_t keep = 0;
	for (int i = 0; i < o->p.n_stop; i++) {
		size_t sl = strlen(o->p.stop[i]);
		for (size_t k = sl - 1; k > keep; k--)
			if (k <= o->text_len && !memcmp(o->text + o->text_len - k, o->p.stop[i], k)) {
				keep = k;
				break;
			}
	}
	return keep;
}

/* At the end: flush the detokenizer and release all pending text, up to a
 * stop string found in the flushed tail. */
static void release_tail(struct llm_reqout *o, struct llm_token_event *ev)
{
	if (o->dt && o->detok->flush) {
		const char *t;
		size_t n;
		if (!o->detok->flush(o->dt, &t, &n) && n)
			text_append(o, t, n);
	}
	ev->text = o->text ? o->text : "";
	ev->text_len = o->text_len;
	int w;
	long at = stop_find(o, &w);
	if (at >= 0) {
		ev->text_len = (size_t)at;
		ev->finish = LLM_FINISH_STOP;
		ev->stop_index = o->p.n_stop_ids + w;
	}
}

/* Hand EV to the callback; 1 when it asked to cancel. */
static int emit(struct llm_reqout *o, const struct llm_token_event *ev)
{
	if (o->quiet || !o->on_token)
		return 0;
	if (o->on_token(o->user, ev))
		o->quiet = 1;
	return o->quiet;
}

void llm_reqout_end(struct llm_reqout *o, enum llm_finish fin)
{
	struct llm_token_event ev = { .req = o->id, .index = o->n_gen, .token = -1, .text = "",
	                              .finish = fin, .stop_index = -1 };
	emit(o, &ev);
}

void llm_reqout_cancelled(struct llm_reqout *o)
{
	llm_reqout_end(o, LLM_FINISH_CANCEL);
}

/* The grammar's mask for the next draw into the sampler: 0 it goes on, 1
 * the text is a sentence nothing extends (*FIN STOP), -1 an error (message left). */
static int grammar_mask(struct llm_reqout *o)
{
	struct llm_grammar *g = o->g;
	int acc = llm_grammar_accepts(g, o->gst);
	if (acc && !llm_grammar_can_continue(g, o->gst))
		return 1;
	int na;
	int nm = llm_gvocab_size(llm_grammar_vocab(g));   /* the tokenizer's ids; the model may pad past them */
	if (llm_grammar_mask(g, o->gst, o->mask, &na))
		return -1;
	for (int t = o->n_vocab; t < nm; t++)   /* ids past the model's: never drawn */
		na -= o->mask[t];
	if (nm < o->n_vocab)
		memset(o->mask + nm, 0, (size_t)(o->n_vocab - nm));
	if (acc && !o->p.ignore_eos)
		for (int i = 0; i < o->n_eos; i++)
			if (o->eos[i] >= 0 && o->eos[i] < o->n_vocab) {
				o->mask[o->eos[i]] = 1;
				na++;
			}
	if (!na) {
		llm_fail(LLM_ERR_RANGE, "grammar: no token of the vocabulary continues the text");
		return -1;
	}
	o->smp.mask = o->mask;
	o->smp.n_mask = o->n_vocab;
	return 0;
}

enum llm_status llm_reqout_take(struct llm_reqout *o, const float *logits, int32_t *tok, enum llm_finish *fin)
{
	return llm_reqout_verify(o, logits, NULL, -1, tok, fin);
}

/* The token the sampler chose (SO), handled as reqout.h orders it. */
static enum llm_status handle(struct llm_reqout *o, const struct llm_sample_out *so, int32_t *tok,
                              enum llm_finish *fin)
{
	*tok = so->token;
	struct llm_token_event ev = {
		.req = o->id, .index = o->n_gen, .token = so->token, .logprob = so->logprob,
		.n_top = so->n_top, .top = so->top, .text = "", .stop_index = -1,
	};
	o->n_gen++;
	llm_sampler_accept(&o->smp, so->token);
	for (int i = 0; i < o->p.n_stop_ids; i++)
		if (so->token == o->p.stop_ids[i]) {
			ev.finish = LLM_FINISH_STOP;
			ev.stop_index = i;
		}
	if (!ev.finish && !o->p.ignore_eos)
		for (int i = 0; i < o->n_eos; i++)
			if (so->token == o->eos[i])
				ev.finish = LLM_FINISH_EOS;
	if (!ev.finish && o->g) {   /* the mask allowed it: the grammar takes its bytes */
		o->gst = llm_grammar_next_token(o->g, o->gst, so->token);
		if (o->gst < 0) {
			llm_fail(LLM_ERR_INTERNAL, "grammar: token %d does not continue the text (or its state table is full)",
			         so->token);
			struct llm_token_event ee = { .req = o->id, .index = o->n_gen - 1, .token = -1, .text = "",
			                              .finish = LLM_FINISH_ERROR, .stop_index = -1, .error = llm_errmsg() };
			emit(o, &ee);
			*tok = -1;
			*fin = LLM_FINISH_ERROR;
			return LLM_OK;
		}
	}
	if (ev.finish) {            /* the stop or EOS token adds no text; what is pending is final */
		release_tail(o, &ev);
		emit(o, &ev);
		*fin = ev.finish;
		return LLM_OK;
	}
	if (o->dt) {
		const char *t;
		size_t n;
		if (o->detok->push(o->dt, so->token, &t, &n)) {
			t = "";             /* no text for it; the request goes on */
			n = 0;
		}
		if (text_append(o, t, n))
			return llm_fail(LLM_ERR_NOMEM, "request %d: out of memory", o->id);
	}
	size_t release = o->text_len;
	if (o->p.n_stop) {
		int w;
		long at = o->n_gen >= o->p.min_tokens ? stop_find(o, &w) : -1;
		if (at >= 0) {
			ev.finish = LLM_FINISH_STOP;
			ev.stop_index = o->p.n_stop_ids + w;
			release = (size_t)at;
		} else {
			release = o->text_len - stop_holdback(o);
		}
	}
	if (!ev.finish && o->g && llm_grammar_accepts(o->g, o->gst) && !llm_grammar_can_continue(o->g, o->gst)) {
		ev.finish = LLM_FINISH_STOP;   /* a whole sentence that nothing extends */
		release_tail(o, &ev);
		release = ev.text_len;
	}
	if (!ev.finish && o->n_gen >= o->max_new) {
		ev.finish = LLM_FINISH_LENGTH;
		release_tail(o, &ev);
		release = ev.text_len;
	}
	ev.text = o->text ? o->text : "";
	ev.text_len = release;
	int cancel = emit(o, &ev);
	if (o->text_len) {          /* drop the released bytes */
		memmove(o->text, o->text + release, o->text_len - release + 1);
		o->text_len -= release;
	}
	*fin = ev.finish ? ev.finish : cancel ? LLM_FINISH_CANCEL : LLM_FINISH_NONE;
	return LLM_OK;
}

enum llm_status llm_reqout_verify(struct llm_reqout *o, const float *logits, const float *q, int32_t x, int32_t *tok,
                                  enum llm_finish *fin)
{
	struct llm_sample_out so;
	int acc;
	int gm = o->g ? grammar_mask(o) : 0;
	if (gm > 0) {               /* complete: ends without a token */
		struct llm_token_event ev = { .req = o->id, .index = o->n_gen, .token = -1, .text = "",
		                              .finish = LLM_FINISH_STOP, .stop_index = -1 };
		release_tail(o, &ev);
		emit(o, &ev);
		*tok = -1;
		*fin = LLM_FINISH_STOP;
		return LLM_OK;
	}
	if (gm < 0 || (q ? llm_sampler_verify(&o->smp, logits, q, x, &so, &acc) : llm_sampler_sample(&o->smp, logits, &so))) {   /* this request fails, the others go on */
		struct llm_token_event ev = { .req = o->id, .index = o->n_gen, .token = -1, .text = "",
		                              .finish = LLM_FINISH_ERROR, .stop_index = -1, .error = llm_errmsg() };
		emit(o, &ev);
		*tok = -1;
		*fin = LLM_FINISH_ERROR;
		return LLM_OK;
	}
	return handle(o, &so, tok, fin);
}

int llm_reqout_drawable(const struct llm_reqout *o)
{
	return o->g == NULL;
}

enum llm_status llm_reqout_draw(struct llm_reqout *o, const float *logits, struct llm_sample_out *so)
{
	return llm_sampler_sample(&o->smp, logits, so);
}

enum llm_status llm_reqout_drawn(struct llm_reqout *o, const struct llm_sample_out *so, int32_t *tok,
                                 enum llm_finish *fin)
{
	return handle(o, so, tok, fin);
}

int llm_reqout_row_ok(const struct llm_reqout *o)
{
	return llm_sampler_row_ok(&o->smp);
}

void llm_reqout_row(struct llm_reqout *o, struct llm_sample_row *row)
{
	llm_sampler_row(&o->smp, row);
}

enum llm_status llm_reqout_put(struct llm_reqout *o, int32_t id, float logprob, int32_t *tok, enum llm_finish *fin)
{
	if (id < 0) {               /* the sampler's refusal, with its message: this request fails */
		llm_fail(LLM_ERR_RANGE, "the model's logits are not finite (%g at token %d): "
		         "its weights may hold NaN or Inf (see llm-quantize --check)", (double)logprob, -1 - id);
		struct llm_token_event ev = { .req = o->id, .index = o->n_gen, .token = -1, .text = "",
		                              .finish = LLM_FINISH_ERROR, .stop_index = -1, .error = llm_errmsg() };
		emit(o, &ev);
		*tok = -1;
		*fin = LLM_FINISH_ERROR;
		return LLM_OK;
	}
	struct llm_sample_out so = { .token = id, .logprob = logprob };
	return handle(o, &so, tok, fin);
}
