/* tests/test_spec.c: speculative sampling's rejection rule keeps the
 * target's distribution (sampler.h: llm_spec_reject, llm_sampler_dist,
 * llm_sampler_verify), checked with a chi-square test over 10^5 draws on a
 * small vocabulary, and its greedy form is the target's argmax.
 *
 * Never timing-dependent and never flaky: every stream is seeded, so each
 * run draws the same numbers; the threshold is the chi-square quantile at
 * alpha = 1e-6 (Wilson-Hilferty), so a correct rule passes for all but a
 * one-in-a-million seed, and the controls show the test rejects rules that
 * are wrong by less than the rule's own corrections. */
#include "check.h"
#include "sampler.h"

#include <math.h>
#include <string.h>

#define NV 8
#define DRAWS 100000

/* The chi-square quantile at upper tail 1e-6 for DF degrees of freedom
 * (Wilson-Hilferty; z = 4.753 is the normal's 1e-6 upper quantile). */
static double chi2_limit(int df)
{
	double a = 2.0 / (9.0 * df), t = 1 - a + 4.753 * sqrt(a);
	return df * t * t * t;
}

/* Pearson's statistic of counts CNT (NV, N draws) against WANT; *DF the
 * degrees of freedom (ids with want > 0, less one); an id drawn that WANT
 * gives no mass makes it infinite. */
static double chi2(const long *cnt, const float *want, long n, int *df)
{
	double x = 0;
	int k = 0;
	for (int i = 0; i < NV; i++)
		k += want[i] > 0;
	*df = k - 1;
	for (int i = 0; i < NV; i++) {
		if (want[i] <= 0) {
			if (cnt[i])
				return INFINITY;
			continue;
		}
		double e = (double)n * want[i], d = (double)cnt[i] - e;
		x += d * d / e;
	}
	return x;
}

/* One draw from Q (NV) with the inverse of its running sum. */
static int32_t from(const float *q, uint64_t rng[4])
{
	double r = llm_rng_uniform(rng), c = 0;
	int32_t last = 0;
	for (int i = 0; i < NV; i++) {
		if (q[i] <= 0)
			continue;
		c += q[i];
		last = i;
		if (r < c)
			return i;
	}
	return last;
}

/* The rule on fixed P and Q: the histogram of what comes out is P; two
 * wrong rules (the draft's token kept, and p instead of the residual on
 * rejection) are refused by the same test, so it has the power to see a
 * mistake in the rule. */
static void test_fixed(void)
{
	/* q gives mass where p has none (id 7) and none where p has some (id 6) */
	const float p[NV] = { 0.30f, 0.20f, 0.15f, 0.10f, 0.10f, 0.10f, 0.05f, 0 };
	const float q[NV] = { 0.10f, 0.35f, 0.15f, 0.05f, 0.15f, 0.05f, 0, 0.15f };
	uint64_t rd[4], rv[4];
	llm_rng_seed(rd, 11);
	llm_rng_seed(rv, 12);
	long cnt[NV] = { 0 }, naive[NV] = { 0 }, wrong[NV] = { 0 }, acc = 0;
	for (long i = 0; i < DRAWS; i++) {
		int32_t x = from(q, rd);
		int a;
		int32_t t = llm_spec_reject(p, q, NV, x, rv, &a);
		cnt[t]++;
		acc += a;
		naive[x]++;
		/* the wrong rule: accept as the real one does, else a fresh draw from p */
		wrong[a ? x : from(p, rd)]++;
	}
	int df, dfn, dfw;
	double x2 = chi2(cnt, p, DRAWS, &df), lim = chi2_limit(df);
	check(x2 < lim, "draft q, target p, 10^5 draws: the output is distributed as p (chi-square %.2f < %.2f, df %d)",
	      x2, lim, df);
	/* the acceptance rate is sum min(p, q) = 1 - TV(p, q) */
	double want_acc = 0;
	for (int i = 0; i < NV; i++)
		want_acc += p[i] < q[i] ? p[i] : q[i];
	double f = (double)acc / DRAWS;
	check(fabs(f - want_acc) < 5 * sqrt(want_acc * (1 - want_acc) / DRAWS),
	      "acceptance rate %.4f = sum min(p, q) = %.4f", f, want_acc);
	double xn = chi2(naive, p, DRAWS, &dfn), xw = chi2(wrong, p, DRAWS, &dfw);
	check(xn > chi2_limit(dfn) && xw > chi2_limit(dfw),
	      "control: the draft's own tokens (chi-square %g) and p instead of the residual on rejection "
	      "(chi-square %.1f) fail the same test", xn, xw);
}

/* Through the samplers: a draft sampler (its own temperature, no top-k)
 * proposes x ~ q with llm_sampler_sample, q from llm_sampler_dist; the
 * target's sampler (temperature, top-k, a bias, a repetition penalty)
 * verifies with llm_sampler_verify; the output is distributed as the
 * target's llm_sampler_dist, which is what llm_sampler_sample draws from. */
static void test_samplers(void)
{
	const float lt[NV] = { 1.0f, 2.0f, 0.5f, 1.5f, -1.0f, 0.0f, 2.2f, 0.3f };
	const float ld[NV] = { 2.0f, 1.0f, 1.0f, 0.0f, 0.5f, 0.0f, 1.2f, 1.5f };
	struct llm_logit_bias bias = { .id = 2, .bias = 1.0f };
	struct llm_sample_params pt = LLM_SAMPLE_DEFAULT, pd = LLM_SAMPLE_DEFAULT;
	pt.temperature = 0.8f;
	pt.top_k = 6;
	pt.repetition_penalty = 1.3f;
	pt.n_bias = 1;
	pt.bias = &bias;
	pt.seed = 5;
	pd.temperature = 1.3f;
	pd.seed = 6;
	struct llm_sampler st, sd, sp;
	check(!llm_sampler_init(&st, &pt, NV) && !llm_sampler_init(&sd, &pd, NV) && !llm_sampler_init(&sp, &pt, NV),
	      "samplers made");
	const int32_t prompt[2] = { 6, 1 };
	llm_sampler_prompt(&st, prompt, 2);
	llm_sampler_prompt(&sp, prompt, 2);
	float p[NV], q[NV];
	check(!llm_sampler_dist(&st, lt, p) && !llm_sampler_dist(&sd, ld, q), "final distributions");
	int zero = 0;
	double sum = 0;
	for (int i = 0; i < NV; i++) {
		sum += p[i];
		zero += p[i] == 0;
	}
	check(zero == 2 && fabs(sum - 1) < 1e-6, "the target's distribution: top-k 6 leaves 2 ids out, sums to 1");
	long cnt[NV] = { 0 }, plain[NV] = { 0 }, acc = 0;
	for (long i = 0; i < DRAWS; i++) {
		struct llm_sample_out o;
		int a;
		llm_sampler_sample(&sd, ld, &o);
		llm_sampler_verify(&st, lt, q, o.token, &o, &a);
		cnt[o.token]++;
		acc += a;
		llm_sampler_sample(&sp, lt, &o);
		plain[o.token]++;
	}
	int df, dfp;
	double x2 = chi2(cnt, p, DRAWS, &df), xp = chi2(plain, p, DRAWS, &dfp);
	check(x2 < chi2_limit(df), "verified draft tokens are distributed as the target's sampler "
	      "(chi-square %.2f < %.2f, df %d; accepted %.1f%%)", x2, chi2_limit(df), df, 100.0 * acc / DRAWS);
	check(xp < chi2_limit(dfp), "llm_sampler_sample draws from llm_sampler_dist (chi-square %.2f, df %d)", xp, dfp);
	llm_sampler_free(&st);
	llm_sampler_free(&sd);
	llm_sampler_free(&sp);
}

/* Temperature 0: both distributions are point masses, so a draft is kept
 * exactly when it is the target's argmax, and otherwise the argmax comes
 * out: greedy decoding's token either way. */
static void test_greedy(void)
{
	const float lt[NV] = { 1.0f, 2.0f, 0.5f, 2.0f, -1.0f, 0.0f, 1.9f, 0.3f };   /* tie 1, 3: the lowest */
	struct llm_sample_params pg = LLM_SAMPLE_DEFAULT;
	pg.temperature = 0;
	struct llm_sampler st;
	llm_sampler_init(&st, &pg, NV);
	int bad = 0;
	for (int32_t x = 0; x < NV; x++) {
		float q[NV] = { 0 }, p[NV];
		q[x] = 1;
		struct llm_sample_out o;
		int a;
		llm_sampler_dist(&st, lt, p);
		bad += p[1] != 1.0f;
		llm_sampler_verify(&st, lt, q, x, &o, &a);
		bad += o.token != 1 || a != (x == 1);
	}
	check(!bad, "greedy: a draft is accepted iff it is the argmax, and the argmax comes out");
	llm_sampler_free(&st);
}

int main(void)
{
	test_fixed();
	test_samplers();
	test_greedy();
	return check_done();
}
