/* tests/test_sampler.c: sampling rules, seeds, log-probs, and the engine's
 * stop handling and per-request randomness (on stories260K when present).
 *
 * Frequencies are checked against the exact distribution with a tolerance
 * of 5 standard deviations of the binomial estimate (false alarm < 1e-6). */
#define _GNU_SOURCE
#include "check.h"
#include "sampler.h"
#include "grammar.h"
#include "generate.h"
#include "sched_run.h"
#include "reqout.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static struct llm_sample_params params(float temp, uint64_t seed)
{
	struct llm_sample_params p = LLM_SAMPLE_DEFAULT;
	p.temperature = temp;
	p.seed = seed;
	return p;
}

static int32_t draw(struct llm_sampler *s, const float *l)
{
	struct llm_sample_out o;
	llm_sampler_sample(s, l, &o);
	return o.token;
}

/* Frequencies of N draws vs WANT (n_vocab values). */
static int freq_ok(const struct llm_sample_params *p, const float *logits, int nv, const double *want,
                   const char *what)
{
	struct llm_sampler s;
	llm_sampler_init(&s, p, nv);
	int n = 20000, cnt[16] = { 0 };
	for (int i = 0; i < n; i++)
		cnt[draw(&s, logits)]++;
	llm_sampler_free(&s);
	int ok = 1;
	double worst = 0;
	for (int i = 0; i < nv; i++) {
		double f = (double)cnt[i] / n, sd = sqrt(want[i] * (1 - want[i]) / n) + 1e-12;
		double z = fabs(f - want[i]) / sd;
		if (want[i] == 0 ? cnt[i] != 0 : z > 5)
			ok = 0;
		if (want[i] > 0 && z > worst)
			worst = z;
	}
	return check(ok, "%s: frequencies of 20000 draws match (worst %.2f sd)", what, worst);
}

static void test_rules(void)
{
	float l[4] = { 1.0f, 3.0f, 3.0f, -2.0f };
	struct llm_sampler s;
	struct llm_sample_params p = params(0, 1);
	llm_sampler_init(&s, &p, 4);
	check(draw(&s, l) == 1, "greedy: argmax, ties to the lowest id (as run.c)");
	llm_sampler_free(&s);

	/* p = 0.5, 0.3, 0.2 */
	float q[3] = { logf(0.5f), logf(0.3f), logf(0.2f) };
	double w[3] = { 0.5, 0.3, 0.2 };
	p = params(1, 7);
	freq_ok(&p, q, 3, w, "temperature 1");
	p.top_k = 2;
	double wk[3] = { 0.625, 0.375, 0 };
	freq_ok(&p, q, 3, wk, "top_k 2");
	p = params(1, 8);
	p.top_p = 0.75f;
	freq_ok(&p, q, 3, wk, "top_p 0.75 keeps the smallest prefix with mass >= 0.75");
	p = params(1, 9);
	p.min_p = 0.5f;                       /* keeps p >= 0.25: tokens 0 and 1 */
	freq_ok(&p, q, 3, wk, "min_p 0.5");
	p = params(2, 10);                     /* temperature 2: p ~ sqrt */
	double t2[3], z = sqrt(0.5) + sqrt(0.3) + sqrt(0.2);
	for (int i = 0; i < 3; i++)
		t2[i] = sqrt(w[i]) / z;
	freq_ok(&p, q, 3, t2, "temperature 2");
	p = params(0.5f, 11);
	p.top_k = 1;
	llm_sampler_init(&s, &p, 3);
	int all0 = 1;
	for (int i = 0; i < 100; i++)
		all0 &= draw(&s, q) == 0;
	llm_sampler_free(&s);
	check(all0, "top_k 1 is greedy");

	/* penalties */
	float r[3] = { 2.0f, 1.9f, -1.0f };
	p = params(0, 0);
	p.repetition_penalty = 2.0f;
	llm_sampler_init(&s, &p, 3);
	int32_t pr[1] = { 0 };
	llm_sampler_prompt(&s, pr, 1);
	check(draw(&s, r) == 1, "repetition penalty 2 divides a positive logit of a prompt token (2 -> 1 < 1.9)");
	llm_sampler_free(&s);
	float r2[2] = { -0.5f, -0.9f };
	llm_sampler_init(&s, &p, 2);
	llm_sampler_accept(&s, 0);
	check(draw(&s, r2) == 1, "... and multiplies a negative one (-0.5 -> -1 < -0.9)");
	llm_sampler_free(&s);
	p = params(0, 0);
	p.frequency_penalty = 0.1f;
	llm_sampler_init(&s, &p, 3);
	llm_sampler_accept(&s, 0);
	int32_t t1 = draw(&s, r);          /* 2 - 0.1 = 1.9: tie, lowest id */
	llm_sampler_accept(&s, 0);
	int32_t t2b = draw(&s, r);         /* 2 - 0.2 < 1.9 */
	check(t1 == 0 && t2b == 1, "frequency penalty grows with the count (%d then %d)", t1, t2b);
	llm_sampler_free(&s);
	p = params(0, 0);
	p.presence_penalty = 0.2f;
	llm_sampler_init(&s, &p, 3);
	int32_t pp[1] = { 0 };
	llm_sampler_prompt(&s, pp, 1);
	int32_t before = draw(&s, r);
	llm_sampler_accept(&s, 0);
	check(before == 0 && draw(&s, r) == 1, "presence penalty: output tokens only, once");
	llm_sampler_free(&s);
	/* vocabulary-sized arrays only for what the parameters use */
	p = params(0, 0);
	llm_sampler_init(&s, &p, 3);
	llm_sampler_prompt(&s, pp, 1);
	llm_sampler_accept(&s, 0);
	int bare = !s.count && !s.seen && !s.work && !s.idx && !s.tmp && !s.prob && draw(&s, r) == 0;
	llm_sampler_free(&s);
	p = params(0.7f, 3);
	p.presence_penalty = 0.2f;
	llm_sampler_init(&s, &p, 3);
	int full = s.count && s.seen && s.work && s.idx && s.tmp && s.prob;
	llm_sampler_free(&s);
	check(bare && full, "greedy without penalties allocates no vocabulary arrays (and still takes the "
	      "prompt and tokens); sampling with a penalty has them all");

	/* log-probs of the raw distribution */
	struct llm_sample_out o;
	p = params(0, 0);
	p.n_logprobs = 3;
	p.repetition_penalty = 3.0f;
	llm_sampler_init(&s, &p, 4);
	llm_sampler_accept(&s, 1);
	llm_sampler_sample(&s, l, &o);
	double lse = log(exp(1.0) + 2 * exp(3.0) + exp(-2.0));
	check(o.token == 2 && fabs(o.logprob - (3.0 - lse)) < 1e-6,
	      "logprob of the chosen token is from the raw logits (%g vs %g)", o.logprob, 3.0 - lse);
	check(o.n_top == 3 && o.top[0].id == 1 && o.top[1].id == 2 && o.top[2].id == 0 &&
	      fabs(o.top[2].logprob - (1.0 - lse)) < 1e-6, "top-3 log-probs, best first, ties by id");
	llm_sampler_free(&s);

	/* a vocabulary-sized log-sum-exp (the SIMD one where the CPU has it)
	 * against f64 libm, for logits spread over [-60, 20], an odd length */
	{
		int nv = 49157;
		float *big = malloc((size_t)nv * sizeof *big);
		uint64_t st = 12345;
		for (int i = 0; i < nv; i++) {
			st = st * 6364136223846793005ull + 1442695040888963407ull;
			big[i] = (float)((double)(st >> 11) / 9007199254740992.0 * 80.0 - 60.0);
		}
		big[777] = 25.0f;
		double mx = 25.0, sum = 0, worst = 0;
		for (int i = 0; i < nv; i++)
			sum += exp((double)big[i] - mx);
		for (int id = 0; id < nv; id += 997) {
			double want = (double)big[id] - mx - log(sum), d = fabs(llm_logprob(big, nv, id) - want);
			worst = d > worst ? d : worst;
		}
		check(worst < 1e-6, "log-prob over 49157 logits within 1e-6 of f64 libm (worst %.2g)", worst);
		free(big);
	}

	/* logit biases: added before greedy and sampling; log-probs stay raw */
	{
		struct llm_logit_bias b1[1] = { { 3, 10.0f } }, b2[2] = { { 1, -100.0f }, { 2, -100.0f } };
		p = params(0, 0);
		p.n_logprobs = 1;
		p.n_bias = 1;
		p.bias = b1;
		llm_sampler_init(&s, &p, 4);
		llm_sampler_sample(&s, l, &o);
		check(o.token == 3 && fabs(o.logprob - (-2.0 - lse)) < 1e-6 && o.top[0].id == 1,
		      "logit_bias +10 on id 3 makes it the greedy choice; its log-prob is the raw one (%g)", o.logprob);
		llm_sampler_free(&s);
		p.n_bias = 2;
		p.bias = b2;
		llm_sampler_init(&s, &p, 4);
		check(draw(&s, l) == 0, "logit_bias -100 on the two best ids: greedy takes the next");
		llm_sampler_free(&s);
		struct llm_logit_bias b3[2] = { { 0, -100.0f }, { 2, logf(2.0f) } };
		p = params(1, 12);
		p.n_bias = 2;
		p.bias = b3;
		double wb[3] = { 0, 0.3 / 0.7, 0.4 / 0.7 };
		freq_ok(&p, q, 3, wb, "logit_bias -100 on id 0 and +ln 2 on id 2 (p = 0, 3/7, 4/7)");
		struct llm_logit_bias b4[1] = { { 4, 1.0f } };
		p.n_bias = 1;
		p.bias = b4;
		check(llm_sampler_init(&s, &p, 4) == LLM_ERR_RANGE && strstr(llm_errmsg(), "logit_bias"),
		      "a bias on an id outside the vocabulary is refused: %s", llm_errmsg());
		b4[0] = (struct llm_logit_bias){ 1, 101.0f };
		check(llm_sample_params_check(&p) == LLM_ERR_USAGE && strstr(llm_errmsg(), "[-100, 100]"),
		      "a bias of 101 is refused: %s", llm_errmsg());
	}
	/* min_tokens: held ids get no probability before it */
	{
		p = params(0, 0);
		p.min_tokens = 2;
		int32_t h[2] = { 1, 7 };           /* 7: outside the vocabulary, left out */
		llm_sampler_init(&s, &p, 4);
		llm_sampler_hold(&s, h, 2);
		int32_t a = draw(&s, l);
		llm_sampler_accept(&s, a);
		int32_t b = draw(&s, l);
		llm_sampler_accept(&s, b);
		int32_t c = draw(&s, l);
		check(s.n_hold == 1 && a == 2 && b == 2 && c == 1,
		      "min_tokens 2 holds id 1 back for two tokens (%d %d, then %d)", a, b, c);
		llm_sampler_free(&s);
		p.max_tokens = 1;
		check(llm_sample_params_check(&p) == LLM_ERR_USAGE && strstr(llm_errmsg(), "min_tokens"),
		      "min_tokens above max_tokens is refused: %s", llm_errmsg());
	}

	/* bad params */
	p = params(-1, 0);
	check(llm_sample_params_check(&p) == LLM_ERR_USAGE && strstr(llm_errmsg(), "temperature"),
	      "temperature -1 refused: %s", llm_errmsg());
	p = params(1, 0);
	p.top_p = 0;
	check(llm_sample_params_check(&p) == LLM_ERR_USAGE, "top_p 0 refused: %s", llm_errmsg());
	p = params(1, 0);
	p.n_logprobs = 21;
	check(llm_sample_params_check(&p) == LLM_ERR_USAGE, "logprobs 21 refused: %s", llm_errmsg());
}

static void test_seeds(void)
{
	float l[64];
	for (int i = 0; i < 64; i++)
		l[i] = (float)sin(i * 1.7) * 2;
	struct llm_sample_params p1 = params(1, 123), p2 = params(1, 456);
	struct llm_sampler a, b, a2;
	llm_sampler_init(&a, &p1, 64);
	llm_sampler_init(&b, &p2, 64);
	llm_sampler_init(&a2, &p1, 64);
	int32_t sa[200], sb[200], sa2[200];
	for (int i = 0; i < 200; i++) {      /* a and b interleaved, a2 alone */
		sa[i] = draw(&a, l);
		sb[i] = draw(&b, l);
	}
	for (int i = 0; i < 200; i++)
		sa2[i] = draw(&a2, l);
	check(!memcmp(sa, sa2, sizeof sa), "a seed gives the same stream alone or interleaved with another");
	check(memcmp(sa, sb, sizeof sa) != 0, "different seeds give different streams");
	llm_sampler_free(&a);
	llm_sampler_free(&b);
	llm_sampler_free(&a2);
	uint64_t st[4];
	llm_rng_seed(st, 0);
	double u = llm_rng_uniform(st);
	check(u >= 0 && u < 1, "rng in [0, 1)");
}

/* ---- engine: stops, streaming, per-request randomness ------------------- */

/* A detokenizer whose piece for id is "<id>" (ids never contain '<'). */
struct fake_dt { char buf[32]; };
static void *fd_open(void *ctx) { (void)ctx; return calloc(1, sizeof(struct fake_dt)); }
static int fd_push(void *st, int32_t id, const char **t, size_t *n)
{
	struct fake_dt *d = st;
	*n = (size_t)snprintf(d->buf, sizeof d->buf, "<%d>", id);
	*t = d->buf;
	return 0;
}
static void fd_close(void *st) { free(st); }

struct out {
	int32_t ids[600];
	int n;
	char text[8192];
	size_t tl;
	enum llm_finish finish;
	int stop_index, events_after_finish, cancel_at;
};

static int cb(void *user, const struct llm_token_event *ev)
{
	struct out *o = user;
	if (o->finish)
		o->events_after_finish++;
	if (ev->token >= 0 && o->n < 600)
		o->ids[o->n++] = ev->token;
	if (o->tl + ev->text_len < sizeof o->text) {
		memcpy(o->text + o->tl, ev->text, ev->text_len);
		o->tl += ev->text_len;
		o->text[o->tl] = 0;
	}
	if (ev->finish) {
		o->finish = ev->finish;
		o->stop_index = ev->stop_index;
	}
	return o->cancel_at && o->n == o->cancel_at;
}

/* the detokenizer of these tests: each id becomes "<id>" */
static const struct llm_detok fd_detok = { .open = fd_open, .push = fd_push, .close = fd_close };

/* The row a backend's sample op gets (llm_sampler_row), and a token chosen
 * there handed back (llm_reqout_put): the same state, random stream and
 * events as the request that samples its own (llm_reqout_take). */
static void test_row(void)
{
	enum { NV = 64 };
	static const int32_t hold[2] = { 2, 3 }, prompt[4] = { 5, 6, 5, 9 };
	struct llm_sample_params p = params(0.8f, 77);
	p.repetition_penalty = 1.3f;
	p.frequency_penalty = 0.5f;
	p.min_tokens = 3;
	struct llm_sampler a;
	struct llm_sample_row row;
	uint64_t rng[4];
	int ok = !llm_sampler_init(&a, &p, NV);
	llm_sampler_hold(&a, hold, 2);
	llm_sampler_prompt(&a, prompt, 4);
	llm_rng_seed(rng, 77);
	llm_sampler_row(&a, &row);
	ok = ok && row.n_seen == 3 && row.seen[0] == 5 && row.seen[1] == 6 && row.seen[2] == 9 && !row.count[0]
	     && !row.count[2] && row.n_hold == 2 && row.u == llm_rng_uniform(rng) && row.temperature == 0.8f
	     && row.want_logprob == 1;
	llm_sampler_accept(&a, 6);
	llm_sampler_accept(&a, 7);
	llm_sampler_accept(&a, 7);
	llm_sampler_row(&a, &row);
	ok = ok && row.n_seen == 4 && row.seen[3] == 7 && row.count[1] == 1 && row.count[3] == 2 && row.count[0] == 0
	     && row.n_hold == 0 && row.u == llm_rng_uniform(rng);
	ok = ok && llm_sampler_row_ok(&a);
	llm_sampler_free(&a);
	p.n_logprobs = 2;
	ok = ok && !llm_sampler_init(&a, &p, NV) && !llm_sampler_row_ok(&a);
	llm_sampler_free(&a);
	p = params(0, 1);
	ok = ok && !llm_sampler_init(&a, &p, NV);
	llm_sampler_row(&a, &row);
	llm_rng_seed(rng, 1);       /* greedy: no draw taken */
	ok = ok && row.n_seen == 0 && row.u == 0 && !memcmp(a.rng, rng, sizeof rng);
	llm_sampler_free(&a);
	check(ok, "sampler row: the seen ids and counts, the hold until min_tokens, the request's own draw");

	/* take (samples its own) against row + put (the token chosen elsewhere) */
	struct llm_sample_params q = params(0.9f, 5);
	q.presence_penalty = 0.6f;
	q.stop_ids[0] = 40;
	q.n_stop_ids = 1;
	struct out oa, ob;
	memset(&oa, 0, sizeof oa);
	memset(&ob, 0, sizeof ob);
	struct llm_request ra = { .prompt = prompt, .n_prompt = 4, .params = q, .on_token = cb, .user = &oa };
	struct llm_request rb = ra;
	rb.user = &ob;
	static const int32_t eos = 1;
	struct llm_reqout xa, xb;
	ok = !llm_reqout_init(&xa, 0, &ra, NV, 30, &fd_detok, &eos, 1) && !llm_reqout_init(&xb, 1, &rb, NV, 30, &fd_detok, &eos, 1);
	float l[NV];
	uint64_t lr = 99;
	enum llm_finish fa = LLM_FINISH_NONE, fb = LLM_FINISH_NONE;
	for (int step = 0; ok && !fa && step < 40; step++) {
		for (int i = 0; i < NV; i++) {
			lr = lr * 6364136223846793005ull + 1442695040888963407ull;
			l[i] = (float)(lr >> 40) / (float)(1 << 24) * 4.0f;
		}
		int32_t ta, tb;
		ok = !llm_reqout_take(&xa, l, &ta, &fa) && llm_reqout_row_ok(&xb);
		llm_reqout_row(&xb, &row);
		ok = ok && !llm_reqout_put(&xb, ta, (float)llm_logprob(l, NV, ta), &tb, &fb);
		ok = ok && ta == tb && fa == fb && !memcmp(xa.smp.rng, xb.smp.rng, sizeof rng) && xa.smp.n_out == xb.smp.n_out;
	}
	ok = ok && fa && oa.n == ob.n && !memcmp(oa.ids, ob.ids, (size_t)oa.n * sizeof *oa.ids) && oa.tl == ob.tl
	     && !strcmp(oa.text, ob.text) && oa.finish == ob.finish;
	check(ok, "reqout: a token chosen by the backend (row + put) gives the events, state and stream of take (%d ids, %s)",
	      oa.n, llm_finish_name(oa.finish));
	llm_reqout_free(&xa);
	llm_reqout_free(&xb);
	/* a row with a non-finite logit: this request fails, naming the id */
	memset(&ob, 0, sizeof ob);
	int32_t tb;
	ok = !llm_reqout_init(&xb, 2, &rb, NV, 30, &fd_detok, &eos, 1) && !llm_reqout_put(&xb, -1 - 17, NAN, &tb, &fb);
	check(ok && tb == -1 && fb == LLM_FINISH_ERROR && ob.finish == LLM_FINISH_ERROR && strstr(llm_errmsg(), "at token 17"),
	      "reqout: a backend's refusal (non-finite logits) ends that request with an error naming the token");
	llm_reqout_free(&xb);
}

static int run1(struct llm_engine *e, const int32_t *prompt, int np, struct llm_sample_params p, struct out *o)
{
	memset(o, 0, sizeof *o);
	struct llm_request r = { .prompt = prompt, .n_prompt = np, .params = p, .on_token = cb, .user = o };
	if (test_sched_run(e, &r, 1, &fd_detok)) {
		check_diag("%s", llm_errmsg());
		return 0;
	}
	return 1;
}

static void test_engine(void)
{
	const char *models = test_models_dir();
	char dir[1100], f[1200];
	snprintf(dir, sizeof dir, "%s/stories260K", models ? models : ".");
	snprintf(f, sizeof f, "%s/model.safetensors", dir);
	if (!models || access(f, R_OK)) {
		check_skip("no stories260K in $LLM_TEST_MODELS", "engine sampling tests");
		return;
	}
	struct llm_engine_opts eo = LLM_ENGINE_OPTS_DEFAULT;
	eo.n_threads = 2;
	eo.max_batch_tokens = 32;
	struct llm_engine *e;
	if (!check(llm_engine_open(&e, dir, &eo) == LLM_OK, "open stories260K with a detokenizer"))
		return;
	int32_t prompt[] = { 1, 403, 407, 261 };
	struct out g, o;
	struct llm_sample_params p = params(0, 0);
	p.max_tokens = 20;
	run1(e, prompt, 4, p, &g);
	check(g.n == 20 && g.finish == LLM_FINISH_LENGTH, "max_tokens 20: 20 tokens, finish length (%d, %s)",
	      g.n, llm_finish_name(g.finish));
	char want[8192] = "";
	size_t wl = 0;
	for (int i = 0; i < g.n; i++)
		wl += (size_t)snprintf(want + wl, sizeof want - wl, "<%d>", g.ids[i]);
	check(!strcmp(g.text, want), "streamed text is the concatenation of the pieces");

	/* stop id: the 6th token */
	p.stop_ids[p.n_stop_ids++] = g.ids[5];
	run1(e, prompt, 4, p, &o);
	int first = 0;
	while (g.ids[first] != g.ids[5])
		first++;
	check(o.finish == LLM_FINISH_STOP && o.n == first + 1 && o.stop_index == 0,
	      "stop id ends at its first occurrence, reported as the last event (%d tokens)", o.n);
	/* stop string across two tokens: "<a><b" holds back, then stops */
	p = params(0, 0);
	p.max_tokens = 20;
	char stop[64];
	snprintf(stop, sizeof stop, "%d><%d", g.ids[7], g.ids[8]);
	p.stop[p.n_stop++] = stop;
	run1(e, prompt, 4, p, &o);
	char *at = strstr(want, stop);
	size_t cut = at ? (size_t)(at - want) : 0;
	check(o.finish == LLM_FINISH_STOP && o.tl == cut && !strncmp(o.text, want, cut) && !strstr(o.text, stop),
	      "stop string spanning tokens: text ends right before it (%zu bytes, want %zu)", o.tl, cut);
	/* min_tokens: the stop id cannot end it before, nor the stop string */
	p = params(0, 0);
	p.max_tokens = 20;
	p.min_tokens = first + 3;
	p.stop_ids[p.n_stop_ids++] = g.ids[5];
	run1(e, prompt, 4, p, &o);
	int held = o.n >= p.min_tokens;
	for (int i = 0; i < p.min_tokens && i < o.n; i++)
		held &= o.ids[i] != g.ids[5];
	check(held && (o.finish == LLM_FINISH_LENGTH || o.ids[o.n - 1] == g.ids[5]),
	      "min_tokens %d: the stop id is not sampled before (%d tokens, %s)", p.min_tokens, o.n,
	      llm_finish_name(o.finish));
	p = params(0, 0);
	p.max_tokens = 20;
	p.min_tokens = 12;
	p.stop[p.n_stop++] = stop;
	run1(e, prompt, 4, p, &o);
	check(o.n == 20 && o.tl > cut + strlen(stop) && !strncmp(o.text, want, cut + strlen(stop)),
	      "min_tokens 12: a stop string ending at token 9 does not stop it (%d tokens, %s)", o.n,
	      llm_finish_name(o.finish));
	/* cancel from the callback */
	p = params(0, 0);
	p.max_tokens = 20;
	run1(e, prompt, 4, p, &o);
	memset(&o, 0, sizeof o);
	o.cancel_at = 3;
	struct llm_request rq = { .prompt = prompt, .n_prompt = 4, .params = p, .on_token = cb, .user = &o };
	test_sched_run(e, &rq, 1, &fd_detok);
	check(o.n == 3 && o.events_after_finish == 0, "the callback cancels: no events after it (%d tokens)", o.n);

	/* seeded sampling: alone == among other requests */
	struct out alone[3], together[3];
	uint64_t seeds[3] = { 1, 2, 3 };
	for (int k = 0; k < 3; k++) {
		struct llm_sample_params sp = params(0.9f, seeds[k]);
		sp.top_p = 0.95f;
		sp.max_tokens = 40;
		run1(e, prompt, 4 - k % 2, sp, &alone[k]);
	}
	struct llm_request rs[3];
	for (int k = 0; k < 3; k++) {
		struct llm_sample_params sp = params(0.9f, seeds[k]);
		sp.top_p = 0.95f;
		sp.max_tokens = 40;
		memset(&together[k], 0, sizeof together[k]);
		rs[k] = (struct llm_request){ .prompt = prompt, .n_prompt = 4 - k % 2, .params = sp, .on_token = cb, .user = &together[k] };
	}
	test_sched_run(e, rs, 3, &fd_detok);
	int same = 1;
	for (int k = 0; k < 3; k++)
		same &= alone[k].n == together[k].n && !memcmp(alone[k].ids, together[k].ids, (size_t)alone[k].n * 4);
	check(same, "seeded sampling: the same tokens alone or batched with other requests");
	check(memcmp(alone[0].ids, alone[2].ids, 40 * 4) != 0, "different seeds, different samples");
	struct llm_mem_plan mp;
	llm_engine_plan(e, &mp);
	check(mp.weight_bytes > 1000000 && mp.weight_bytes <= 1044992 && mp.kv_bytes_per_token == 2 * 5 * 4 * 8 * 2,   /* the default KV: bf16 */
	      "memory plan: weights %zu B, KV %zu B per token, pool %zu B, scratch %zu B",
	      mp.weight_bytes, mp.kv_bytes_per_token, mp.kv_bytes, mp.scratch_bytes);
	llm_engine_close(e);
}

/* llm_argmax against the loop it replaces, on lengths around the vector
 * width, with ties, -0/+0, infinities and NaNs placed anywhere. */
static void test_argmax(void)
{
	uint64_t rng[4];
	llm_rng_seed(rng, 7);
	static float w[300];
	int bad = 0, cases = 0;
	for (int n = 1; n <= 300; n += (n < 40 ? 1 : 13))
		for (int kind = 0; kind < 6; kind++) {
			for (int i = 0; i < n; i++)
				w[i] = (float)(int)(llm_rng_uniform(rng) * 8.0) - 4.0f;   /* many ties */
			int a = (int)(llm_rng_uniform(rng) * n), b = (int)(llm_rng_uniform(rng) * n);
			if (kind == 1) { w[a] = NAN; }
			if (kind == 2) { w[0] = NAN; }
			if (kind == 3) { for (int i = 0; i < n; i++) w[i] = (i & 1) ? 0.0f : -0.0f; }
			if (kind == 4) { w[a] = INFINITY; w[b] = INFINITY; }
			if (kind == 5) { for (int i = 0; i < n; i++) w[i] = -INFINITY; w[a] = NAN; }
			int32_t ref = 0;
			for (int i = 1; i < n; i++)
				if (w[i] > w[ref])
					ref = i;
			bad += llm_argmax(w, n) != ref;
			cases++;
		}
	check(bad == 0, "llm_argmax equals the first-index loop in %d cases (ties, +-0, inf, NaN, ragged lengths): %d differ",
	      cases, bad);
	/* and greedy sampling takes it: the first of two equal maxima */
	for (int i = 0; i < 100; i++)
		w[i] = 1.0f;
	w[37] = w[81] = 3.0f;
	struct llm_sample_params p = params(0, 1);
	struct llm_sampler s;
	struct llm_sample_out o = { 0 };
	if (llm_sampler_init(&s, &p, 100) == LLM_OK) {
		llm_sampler_sample(&s, w, &o);
		llm_sampler_free(&s);
	}
	check(o.token == 37, "greedy sample of tied maxima at 37 and 81: %d", o.token);
	/* skip_logprob: the same token, no log-prob; without it log p(37) */
	struct llm_sample_out o2 = { 0 };
	p.skip_logprob = 1;
	if (llm_sampler_init(&s, &p, 100) == LLM_OK) {
		llm_sampler_sample(&s, w, &o2);
		llm_sampler_free(&s);
	}
	double want = 3.0 - log(98.0 * exp(1.0) + 2.0 * exp(3.0));
	check(o2.token == 37 && isnan(o2.logprob) && fabs(o.logprob - want) < 1e-6,
	      "skip_logprob: token %d, log-prob %g (NaN); without it %.7f = log p(37) %.7f", o2.token,
	      (double)o2.logprob, (double)o.logprob, want);
}

/* llm_logprob (vectorised where the CPU allows) against log-softmax in
 * double, on ragged lengths around the vector widths, with a -inf logit and
 * a spread wide enough that most terms underflow f32's exp. */
static void test_logprob(void)
{
	uint64_t g[4];
	llm_rng_seed(g, 5);
	static float w[50000];
	double worst = 0;
	int cases = 0;
	for (int n = 1; n <= 50000; n = n < 40 ? n + 1 : n * 3 + 7) {
		for (int kind = 0; kind < 3; kind++) {
			for (int i = 0; i < n; i++)
				w[i] = (float)((llm_rng_uniform(g) - 0.5) * (kind == 2 ? 300.0 : 12.0));
			if (kind == 1 && n > 1)
				w[n / 2] = -INFINITY;
			int32_t id = (int32_t)(llm_rng_uniform(g) * n);
			if (w[id] == -INFINITY)
				id = 0;
			double mx = w[0], sum = 0;
			for (int i = 1; i < n; i++)
				mx = w[i] > mx ? w[i] : mx;
			for (int i = 0; i < n; i++)
				sum += exp((double)w[i] - mx);
			double want = (double)w[id] - mx - log(sum), d = fabs(llm_logprob(w, n, id) - want);
			worst = d > worst ? d : worst;
			cases++;
		}
	}
	check(worst < 1e-6, "llm_logprob within 1e-6 of log-softmax in double in %d cases (lengths 1..50000): worst %.2g",
	      cases, worst);
}

/* ---- the candidates' order: the sampler against a plain reference -------- */

static const float *ref_key;
static int ref_cmp(const void *a, const void *b)
{
	int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
	float x = ref_key[i], y = ref_key[j];
	if (x != y)
		return x > y ? -1 : 1;
	return i < j ? -1 : i > j;
}

/* sampler.h's rules written plainly (qsort for the order, no penalties or
 * biases): the token for draw U. */
static int32_t ref_sample(const float *w, int n, const struct llm_sample_params *p, double u)
{
	float mx = w[0];
	for (int i = 1; i < n; i++)
		mx = w[i] > mx ? w[i] : mx;
	float cut = mx - 40.0f * p->temperature;
	int32_t *idx = malloc((size_t)n * sizeof *idx);
	double *pr = malloc((size_t)n * sizeof *pr);
	int m = 0;
	for (int i = 0; i < n; i++)
		if (w[i] >= cut)
			idx[m++] = i;
	ref_key = w;
	qsort(idx, (size_t)m, sizeof *idx, ref_cmp);
	if (p->top_k > 0 && p->top_k < m)
		m = p->top_k;
	double sum = 0;
	for (int i = 0; i < m; i++) {
		pr[i] = exp(((double)w[idx[i]] - mx) / p->temperature);
		sum += pr[i];
	}
	if (p->top_p < 1.0f) {
		double c = 0;
		int k = 0;
		while (k < m) {
			c += pr[k++] / sum;
			if (c >= p->top_p)
				break;
		}
		m = k;
	}
	if (p->min_p > 0) {
		int k = 1;
		while (k < m && pr[k] >= p->min_p * pr[0])
			k++;
		m = k;
	}
	sum = 0;
	for (int i = 0; i < m; i++)
		sum += pr[i];
	double r = u * sum, c = 0;
	int32_t tok = idx[m - 1];
	for (int i = 0; i < m; i++) {
		c += pr[i];
		if (r < c) {
			tok = idx[i];
			break;
		}
	}
	free(idx);
	free(pr);
	return tok;
}

/* Vocabularies past the size where the sampler sorts by radix, logits with
 * many ties, -0 beside +0, and a spread wider than the 40 T cut, at
 * several temperatures with top-k, top-p and min-p: every draw's token
 * equals the reference's for the same random number. */
static void test_order(void)
{
	int sizes[] = { 255, 256, 1000, 4099, 49152 };
	int bad = 0, cases = 0;
	uint64_t g[4];
	llm_rng_seed(g, 11);
	for (size_t si = 0; si < sizeof sizes / sizeof *sizes; si++) {
		int n = sizes[si];
		float *w = malloc((size_t)n * sizeof *w);
		for (int kind = 0; kind < 4; kind++) {
			for (int i = 0; i < n; i++) {
				double v = llm_rng_uniform(g);
				if (kind == 0)          /* a few levels: ties everywhere */
					w[i] = (float)(int)(v * 6) - 3.0f;
				else if (kind == 1)     /* zeros of both signs among ties */
					w[i] = v < 0.3 ? 0.0f : v < 0.6 ? -0.0f : (float)(int)(v * 4) * 0.5f;
				else if (kind == 2)     /* a spread past the cut, some far below */
					w[i] = v < 0.05 ? -1e30f : (float)((v - 0.5) * 200.0);
				else                    /* fine values: distinct keys in every digit */
					w[i] = (float)(sin(i * 0.37 + v) * 4.0 + v * 1e-3);
			}
			float temps[] = { 0.3f, 1.0f, 2.5f };
			for (int ti = 0; ti < 3; ti++)
				for (int cfg = 0; cfg < 4; cfg++) {
					struct llm_sample_params p = params(temps[ti], 1000 + (uint64_t)cases);
					p.skip_logprob = 1;
					if (cfg == 1)
						p.top_k = 50;
					if (cfg == 2)
						p.top_p = 0.9f;
					if (cfg == 3)
						p.min_p = 0.05f, p.top_p = 0.97f;
					struct llm_sampler s;
					if (llm_sampler_init(&s, &p, n))
						continue;
					uint64_t st[4];
					llm_rng_seed(st, p.seed);
					for (int d = 0; d < 8; d++) {
						double u = llm_rng_uniform(st);
						int32_t ta = draw(&s, w), tb = ref_sample(w, n, &p, u);
						if (ta != tb && bad < 5) check_diag("n %d kind %d T %g cfg %d: %d vs %d", n, kind, (double)temps[ti], cfg, ta, tb);
						bad += ta != tb;
						cases++;
					}
					llm_sampler_free(&s);
				}
		}
		free(w);
	}
	check(bad == 0, "sampled tokens equal a qsort reference in %d draws (vocabularies 255..49152; ties, +-0, far tails; "
	      "top-k, top-p, min-p): %d differ", cases, bad);
}

/* The request forms of logit_bias and stop_token_ids (sample_json.c). */
static void test_forms(void)
{
	struct llm_logit_bias b;
	static const struct { const char *spec; int ok; int32_t id; float bias; } cl[] = {
		{ "5=-100", 1, 5, -100 }, { "0=2.5", 1, 0, 2.5f }, { "31999=+1e2", 1, 31999, 100 },
		{ "5", 0, 0, 0 }, { "5=", 0, 0, 0 }, { "=1", 0, 0, 0 }, { "-5=1", 0, 0, 0 }, { "5=100.5", 0, 0, 0 },
		{ "5=nan", 0, 0, 0 }, { "5= 1", 0, 0, 0 }, { "5=1x", 0, 0, 0 }, { "x=1", 0, 0, 0 },
		{ "99999999999=1", 0, 0, 0 },
	};
	for (size_t i = 0; i < sizeof cl / sizeof *cl; i++) {
		enum llm_status s = llm_logit_bias_parse(cl[i].spec, &b);
		check(cl[i].ok ? !s && b.id == cl[i].id && b.bias == cl[i].bias : s == LLM_ERR_USAGE,
		      "--logit-bias %s: %s", cl[i].spec, cl[i].ok ? "parsed" : "refused");
	}
	json_t *v = json_loads("{\"3\": -100, \"10\": 0.5}", 0, NULL);
	struct llm_logit_bias *bias = NULL;
	int n = -1;
	enum llm_status s = llm_json_logit_bias(v, 16, &bias, &n);
	int ok = !s && n == 2;
	for (int i = 0; ok && i < n; i++)
		ok = (bias[i].id == 3 && bias[i].bias == -100) || (bias[i].id == 10 && bias[i].bias == 0.5f);
	check(ok, "logit_bias object: two entries read");
	free(bias);
	json_decref(v);
	static const char *bad[] = { "[1]", "{\"16\": 1}", "{\"03x\": 1}", "{\"-1\": 1}", "{\"1\": \"a\"}",
	                             "{\"1\": 101}", "{\"\": 1}" };
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		v = json_loads(bad[i], JSON_DECODE_ANY, NULL);
		bias = (void *)1;
		s = llm_json_logit_bias(v, 16, &bias, &n);
		check(s == LLM_ERR_USAGE && !bias && n == 0, "logit_bias %s refused: %s", bad[i], llm_errmsg());
		json_decref(v);
	}
	v = json_loads("{\"1000000\": 1}", 0, NULL);
	check(!llm_json_logit_bias(v, 0, &bias, &n) && n == 1 && bias[0].id == 1000000,
	      "logit_bias without a vocabulary: ids are left to the sampler");
	free(bias);
	json_decref(v);
	int32_t ids[LLM_MAX_STOP];
	v = json_loads("[2, 7]", JSON_DECODE_ANY, NULL);
	check(!llm_json_stop_ids(v, 8, ids, &n) && n == 2 && ids[0] == 2 && ids[1] == 7, "stop_token_ids read");
	json_decref(v);
	static const char *bad_ids[] = { "[8]", "[-1]", "[1.5]", "7", "[0,1,2,3,4,5,6,7,0]" };
	for (size_t i = 0; i < sizeof bad_ids / sizeof *bad_ids; i++) {
		v = json_loads(bad_ids[i], JSON_DECODE_ANY, NULL);
		check(llm_json_stop_ids(v, 8, ids, &n) == LLM_ERR_USAGE && n == 0, "stop_token_ids %s refused: %s",
		      bad_ids[i], llm_errmsg());
		json_decref(v);
	}
}

/* Non-finite logits are refused with LLM_ERR_RANGE naming the first bad
 * id, greedy and sampled (the sampled path read out of bounds on NaN:
 * top-p kept no candidate), and llm_first_nonfinite finds the first bad
 * element in every float type. */
static void test_nonfinite(void)
{
	enum { NV = 5000 };
	static float l[NV];
	for (int i = 0; i < NV; i++)
		l[i] = (float)(i % 7) * 0.5f;
	const float bad[] = { NAN, INFINITY, -INFINITY };
	for (int b = 0; b < 3; b++)
		for (int mode = 0; mode < 3; mode++) {
			struct llm_sample_params p = params(mode == 0 ? 0.0f : 0.8f, 1);
			if (mode == 2) {
				p.top_p = 0.9f;
				p.min_p = 0.05f;
				p.n_logprobs = 3;
			}
			struct llm_sampler s;
			llm_sampler_init(&s, &p, NV);
			l[4321] = bad[b];
			struct llm_sample_out o = { .token = -7 };
			enum llm_status st = llm_sampler_sample(&s, l, &o);
			check(st == LLM_ERR_RANGE && strstr(llm_errmsg(), "at token 4321") && o.token == -7,
			      "%g at id 4321, mode %d: refused naming it (%s: %s)", (double)bad[b], mode,
			      llm_status_name(st), llm_errmsg());
			l[4321] = 0;
			check(llm_sampler_sample(&s, l, &o) == LLM_OK && o.token >= 0 && o.token < NV,
			      "mode %d: finite logits again sample", mode);
			llm_sampler_free(&s);
		}
	float f[9000];
	uint16_t h[9000], bh[9000];
	uint8_t e[9000];
	for (int i = 0; i < 9000; i++) {
		f[i] = (float)i - 4500.0f;
		h[i] = llm_f32_to_f16(f[i] / 64);
		bh[i] = llm_f32_to_bf16(f[i]);
		e[i] = llm_f32_to_e4m3(f[i] / 64);
	}
	check(llm_first_nonfinite(f, LLM_DTYPE_F32, 9000) < 0 && llm_first_nonfinite(h, LLM_DTYPE_F16, 9000) < 0 &&
	      llm_first_nonfinite(bh, LLM_DTYPE_BF16, 9000) < 0 && llm_first_nonfinite(e, LLM_DTYPE_E4M3, 9000) < 0,
	      "llm_first_nonfinite: finite arrays (e4m3 448 saturation included) have none");
	f[8193] = NAN;
	f[8500] = INFINITY;
	h[5000] = llm_f32_to_f16(-INFINITY);
	bh[17] = llm_f32_to_bf16(NAN);
	e[4097] = 0xff;
	check(llm_first_nonfinite(f, LLM_DTYPE_F32, 9000) == 8193 && llm_first_nonfinite(f, LLM_DTYPE_F32, 8193) < 0 &&
	      llm_first_nonfinite(h, LLM_DTYPE_F16, 9000) == 5000 && llm_first_nonfinite(bh, LLM_DTYPE_BF16, 9000) == 17 &&
	      llm_first_nonfinite(e, LLM_DTYPE_E4M3, 9000) == 4097,
	      "llm_first_nonfinite: the first NaN/Inf in f32, f16, bf16 and e4m3, across blocks");
	f[4095] = -INFINITY;          /* the last of a whole block */
	check(llm_first_nonfinite(f, LLM_DTYPE_F32, 9000) == 4095 && llm_first_nonfinite(f, LLM_DTYPE_F32, 4095) < 0,
	      "llm_first_nonfinite: f32 -inf at the end of a whole 4096-element block");
}

/* A grammar's mask: refused tokens get no probability before every other
 * step (a +100 bias, penalties, greedy, top-k), the rest keep their
 * relative odds; a mask that leaves nothing is an error, not a token. */
static void test_mask(void)
{
	float l[6] = { 5.0f, 1.0f, 0.5f, 0.0f, 4.0f, -1.0f };
	uint8_t m[6] = { 0, 1, 1, 0, 0, 1 };
	struct llm_logit_bias b = { 3, 100.0f };
	struct llm_grammar *g = NULL;
	llm_grammar_compile(&g, "root ::= \"x\"", 12, NULL);   /* the masks below stand for its */
	struct llm_sample_params p = params(0, 1);
	p.grammar = g;
	p.n_bias = 1;
	p.bias = &b;
	struct llm_sampler s;
	llm_sampler_init(&s, &p, 6);
	s.mask = m;
	s.n_mask = 6;
	check(draw(&s, l) == 1, "greedy under a mask: the best allowed token, a +100 bias on a refused one changes nothing");
	llm_sampler_free(&s);
	p = params(1.0f, 3);
	p.grammar = g;
	p.top_k = 2;
	p.repetition_penalty = 1.5f;
	llm_sampler_init(&s, &p, 6);
	s.mask = m;
	s.n_mask = 5;                 /* id 5 past the mask: refused too */
	int bad = 0, c1 = 0, n = 4000;
	for (int i = 0; i < n; i++) {
		int32_t t = draw(&s, l);
		bad += !(t == 1 || t == 2);
		c1 += t == 1;
	}
	double want = exp(1.0) / (exp(1.0) + exp(0.5)), f = (double)c1 / n;
	check(!bad && fabs(f - want) < 5 * sqrt(want * (1 - want) / n),
	      "sampled under a mask (top-k 2, penalty): only allowed ids, at their relative odds (%.3f vs %.3f)", f, want);
	uint8_t none[6] = { 0 };
	s.mask = none;
	struct llm_sample_out o;
	check(llm_sampler_sample(&s, l, &o) == LLM_ERR_RANGE && strstr(llm_errmsg(), "no token is allowed"),
	      "a mask that allows nothing: an error, no token");
	llm_sampler_free(&s);
	llm_grammar_unref(g);
}

int main(void)
{
	test_row();
	test_mask();
	test_nonfinite();
	test_forms();
	test_argmax();
	test_order();
	test_logprob();
	test_rules();
	test_seeds();
	test_engine();
	return check_done();
}
