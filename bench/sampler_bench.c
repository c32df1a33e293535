/* bench/sampler_bench.c: the time of one draw of llm_sampler_sample, the
 * host sampler every request's token goes through (on the engine's host
 * threads, between forwards), on synthetic logits of a vocabulary's size.
 *
 *   sampler_bench [N_VOCAB...]       (default: 32000 49152 128256)
 *
 * The logits are N(0, 3^2), about what a model's spread is, drawn from a
 * fixed seed; every candidate is then within the 40 T cut, so a draw at a
 * temperature above 0 sorts them all. For each setting it prints the best
 * of 7 timings of 8 draws (one draw in microseconds) and the sum of the
 * tokens drawn, which two builds must agree on (the same seeds, the same
 * tokens). Built with the tools: build/<tree>/bench/sampler_bench. */
#include "sampler.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const struct {
	const char *name;
	float temperature, top_p;
	int top_k, want_logprob;
} cases[] = {
	{ "greedy", 0.0f, 1.0f, 0, 0 },
	{ "greedy, log-prob", 0.0f, 1.0f, 0, 1 },
	{ "T 1", 1.0f, 1.0f, 0, 0 },
	{ "T 0.7, top-p 0.9", 0.7f, 0.9f, 0, 0 },
	{ "T 0.7, top-k 40", 0.7f, 1.0f, 40, 0 },
};

static int bench(int n)
{
	float *l = malloc((size_t)n * sizeof *l);
	if (!l)
		return 1;
	uint64_t g[4];
	llm_rng_seed(g, 7);
	for (int i = 0; i < n; i++) {
		double u = llm_rng_uniform(g), v = llm_rng_uniform(g);
		l[i] = (float)(3.0 * sqrt(-2.0 * log(u + 1e-12)) * cos(6.283185307179586 * v));
	}
	for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
		struct llm_sample_params p = LLM_SAMPLE_DEFAULT;
		p.temperature = cases[c].temperature;
		p.top_p = cases[c].top_p;
		p.top_k = cases[c].top_k;
		p.skip_logprob = !cases[c].want_logprob;
		p.seed = 1;
		struct llm_sampler s;
		if (llm_sampler_init(&s, &p, n)) {
			fprintf(stderr, "sampler_bench: %s\n", llm_errmsg());
			free(l);
			return 1;
		}
		struct llm_sample_out o;
		double best = 1e30;
		long long sum = 0;
		for (int k = 0; k < 7; k++) {
			double t0 = now_s();
			for (int r = 0; r < 8; r++) {
				if (llm_sampler_sample(&s, l, &o)) {
					fprintf(stderr, "sampler_bench: %s\n", llm_errmsg());
					llm_sampler_free(&s);
					free(l);
					return 1;
				}
				sum += o.token;
			}
			double dt = (now_s() - t0) / 8;
			best = dt < best ? dt : best;
		}
		printf("%-18s %8d %10.1f %12lld\n", cases[c].name, n, best * 1e6, sum);
		llm_sampler_free(&s);
	}
	free(l);
	return 0;
}

int main(int argc, char **argv)
{
	printf("%-18s %8s %10s %12s\n", "draw", "n_vocab", "us", "token sum");
	if (argc < 2) {
		int def[] = { 32000, 49152, 128256 };
		for (int i = 0; i < 3; i++)
			if (bench(def[i]))
				return 1;
		return 0;
	}
	for (int i = 1; i < argc; i++) {
		int n = atoi(argv[i]);
		if (n < 1) {
			fprintf(stderr, "sampler_bench: bad vocabulary size '%s'\n", argv[i]);
			return 2;
		}
		if (bench(n))
			return 1;
	}
	return 0;
}
