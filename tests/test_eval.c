/* tests/test_eval.c: the evaluation job (common/jobs/eval.c).
 *
 * - llm_eval_plan's dynamic program against brute force over every way
 *   to cut small random lists, and on hand-checked cases;
 * - code points counted as Python's len() counts them;
 * - on stories260K, each ending's score against a sum of per-token
 *   log-probs computed here from one plain forward pass of the whole
 *   context + ending (one fresh sequence, logits of every position,
 *   llm_logprob), and the normalised score against that sum over the
 *   characters counted by hand; and the items' prompt tokens computed
 *   once each (no context computed twice). */
#define _GNU_SOURCE
#include "check.h"
#include "eval.h"
#include "kvcache.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the plan ---------------------------------------------------------------- */

static double batch_cost(const int64_t *tok, const size_t *order, size_t a, size_t b, int step)
{
	int64_t t = 0;
	for (size_t i = a; i < b; i++)
		t += tok[order[i]];
	return (double)((t + step - 1) / step) + 1;
}

/* Whether cutting ORDER at END (NB batches) follows llm_eval_plan's rules. */
static int plan_valid(const int64_t *tok, const int *seqs, const size_t *order, size_t n, int64_t theta, int max_seqs,
                      const size_t *end, size_t nb)
{
	size_t a = 0;
	for (size_t b = 0; b < nb; a = end[b++]) {
		if (end[b] <= a || end[b] > n)
			return 0;
		int64_t t = 0;
		long sq = 0;
		for (size_t i = a; i < end[b]; i++)
			t += tok[order[i]], sq += seqs[order[i]];
		if (sq > max_seqs && end[b] - a > 1)
			return 0;
		if (t < theta && end[b] != n && sq + seqs[order[end[b]]] <= max_seqs)
			return 0;
	}
	return a == n;
}

static void test_plan(void)
{
	/* hand-checked: 4 items of 100 tokens and 5 sequences */
	int64_t tok[12] = { 100, 100, 100, 100 };
	int seqs[12] = { 5, 5, 5, 5 };
	size_t order[12] = { 0, 1, 2, 3 }, end[12], nb;
	check(!llm_eval_plan(tok, seqs, order, 4, 150, 512, 100, end, &nb) && nb == 1 && end[0] == 4,
	      "plan: 4 items fitting one step and the sequences make one batch");
	check(!llm_eval_plan(tok, seqs, order, 4, 150, 512, 10, end, &nb) && nb == 2 && end[0] == 2 && end[1] == 4,
	      "plan: 10 sequences at most cut them in batches of 2 items (200 tokens >= theta 150)");
	check(!llm_eval_plan(tok, seqs, order, 4, 250, 512, 10, end, &nb) && nb == 2 && end[0] == 2,
	      "plan: a batch below theta is kept when the next item's sequences do not fit");
	check(!llm_eval_plan(tok, seqs, order, 4, 1, 100, 15, end, &nb) && nb == 2,
	      "plan: 100-token steps, 15 sequences (3 items) at most: 2 batches, 6 steps (3 batches would take 7)");
	/* brute force: every cut of small random lists */
	unsigned rng = 12345;
	int bad = 0, cases = 0;
	for (int trial = 0; trial < 300; trial++) {
		size_t n = 1 + (size_t)(trial % 10);
		for (size_t i = 0; i < n; i++) {
			rng = rng * 1103515245u + 12345u;
			tok[i] = 20 + (rng >> 16) % 300;
			seqs[i] = 2 + (int)((rng >> 8) % 4);
			order[i] = i;
		}
		int64_t theta = 1 + (trial * 37) % 900;
		int step = 64 << (trial % 4), max_seqs = 4 + trial % 20;
		if (llm_eval_plan(tok, seqs, order, n, theta, step, max_seqs, end, &nb)) {
			bad++;
			continue;
		}
		double got = 0, best = HUGE_VAL;
		for (size_t b = 0, a = 0; b < nb; a = end[b++])
			got += batch_cost(tok, order, a, end[b], step);
		for (unsigned mask = 0; mask < 1u << (n - 1); mask++) {
			size_t e[12], k = 0;
			for (size_t i = 1; i < n; i++)
				if (mask >> (i - 1) & 1)
					e[k++] = i;
			e[k++] = n;
			if (!plan_valid(tok, seqs, order, n, theta, max_seqs, e, k))
				continue;
			double c = 0;
			for (size_t b = 0, a = 0; b < k; a = e[b++])
				c += batch_cost(tok, order, a, e[b], step);
			best = c < best ? c : best;
		}
		cases++;
		bad += !plan_valid(tok, seqs, order, n, theta, max_seqs, end, nb) || got != best;
	}
	check(!bad, "plan: valid and of the least cost against brute force on %d random lists", cases);
}

/* ---- scores on the model ------------------------------------------------------- */

/* The log-prob of ids[from ..] after ids[.. from) by one forward pass of
 * all of IDS in a fresh sequence. */
static double forward_logprob(struct llm_engine *e, const int32_t *ids, int n, int from)
{
	struct llm_kv *kv = llm_engine_kv(e);
	int seq;
	if (llm_kv_seq_new(kv, &seq))
		return NAN;
	int32_t pos[256], sq[256];
	int8_t want[256];
	for (int i = 0; i < n; i++)
		pos[i] = i, sq[i] = seq, want[i] = 1;
	struct llm_batch b = { n, ids, pos, sq, want, NULL };
	const float *lg;
	int n_out, nv = llm_engine_model(e)->cfg.n_vocab;
	double lp = NAN;
	if (!llm_engine_forward(e, &b, &lg, &n_out) && n_out == n) {
		lp = 0;
		for (int i = from; i < n; i++)
			lp += llm_logprob(lg + (size_t)(i - 1) * (size_t)nv, nv, ids[i]);
	}
	llm_kv_seq_free(kv, seq);
	return lp;
}

struct lines {
	char *v[8];
	int n;
};

static void put(void *user, const char *json)
{
	struct lines *l = user;
	if (l->n < 8)
		l->v[l->n++] = strdup(json);
}

static void test_scores(const char *dir)
{
	const char *ctx = "Once upon a time, there was a little";
	const char *ends[3] = { " girl", " café", " naïve ñandú" };
	int chars[3] = { 5, 5, 12 };    /* counted by hand */
	char path[1200];
	snprintf(path, sizeof path, "%s/items.jsonl", test_tmpdir());
	FILE *f = fopen(path, "w");
	if (!f)
		return;
	fprintf(f, "{\"context\": \"%s\", \"endings\": [\"%s\", \"%s\", \"%s\"], \"label\": 1}\n", ctx, ends[0], ends[1], ends[2]);
	fprintf(f, "\n{\"ctx\": \"The cat\", \"continuations\": [\" sat\", \" ran away\"], \"label\": \"0\"}\n");
	fclose(f);
	struct llm_tokenizer *tk;
	struct llm_engine *e;
	struct llm_engine_opts o = LLM_ENGINE_OPTS_DEFAULT;
	o.max_seqs = 8;
	o.n_threads = 1;
	if (!check(!llm_tokenizer_open(&tk, dir), "open the tokenizer"))
		return;
	/* the items read while the engine opens, as llm-generate does */
	struct llm_eval_opts eo = { .labels = 1, .sort = 1, .theta = 1, .step_tokens = 16, .max_seqs = 8, .threads = 2 };
	struct llm_eval *ev;
	check(!llm_eval_start(&ev, path, tk, &eo), "start reading %s", path);
	if (!check(!llm_engine_open(&e, dir, &o), "open the engine")) {
		llm_eval_free(ev), llm_tokenizer_close(tk);
		return;
	}
	struct llm_sched_opts so = { .max_running = 8, .max_batch_tokens = 16 };
	struct llm_sched *s;
	struct lines out = { 0 };
	size_t done = 0;
	enum llm_status st = llm_sched_open(&s, e, &so);
	if (!st)
		st = llm_eval_run(ev, s, NULL, put, &out, &done);
	check(!st && done == 2 && out.n == 2, "2 items scored, the empty line skipped: %s", st ? llm_errmsg() : "");
	char sum[1200];
	if (!st)
		llm_eval_summary(ev, e, 1, sum, sizeof sum), check_diag("%s", sum);
	/* each item computes its context once and each ending's tokens once */
	json_t *js = json_loads(sum, 0, NULL), *it = out.n ? json_loads(out.v[0], 0, NULL) : NULL;
	int64_t want = 0;
	for (int i = 0; i < out.n; i++) {
		json_t *x = json_loads(out.v[i], 0, NULL), *t = json_object_get(x, "tokens");
		want += json_integer_value(json_object_get(x, "context_tokens")) - 1;
		for (size_t k = 0; k < json_array_size(t); k++)
			want += json_integer_value(json_array_get(t, k));
		json_decref(x);
	}
	check(js && json_integer_value(json_object_get(js, "computed_tokens")) == want &&
	      json_integer_value(json_object_get(js, "context_prefills")) == 2,
	      "the scheduler computed %lld prompt tokens: each context once and each ending's tokens (%lld)",
	      (long long)json_integer_value(json_object_get(js, "computed_tokens")), (long long)want);
	/* the reference: encode(context) and encode(context + ending), one forward each */
	int32_t *cids, *wids;
	size_t nc, nw;
	int ok = it && !llm_tokenizer_encode(tk, ctx, strlen(ctx), true, &cids, &nc);
	for (int k = 0; ok && k < 3; k++) {
		char whole[256];
		snprintf(whole, sizeof whole, "%s%s", ctx, ends[k]);
		if (llm_tokenizer_encode(tk, whole, strlen(whole), true, &wids, &nw)) {
			ok = 0;
			break;
		}
		double ref = forward_logprob(e, wids, (int)nw, (int)nc);
		double got = json_real_value(json_array_get(json_object_get(it, "logprobs"), (size_t)k));
		double norm = json_real_value(json_array_get(json_object_get(it, "normalized"), (size_t)k));
		check(fabs(got - ref) <= 1e-9 * fabs(ref) && fabs(norm - ref / chars[k]) <= 1e-9 * fabs(ref),
		      "'%s': %zu tokens, log-prob %.9f (forward pass: %.9f), normalised %.9f = / %d characters",
		      ends[k], nw - nc, got, ref, norm, chars[k]);
		free(wids);
	}
	check(ok, "tokenised the reference");
	if (ok)
		free(cids);
	check(llm_utf8_chars(" café", strlen(" café")) == 5 && llm_utf8_chars("日本", strlen("日本")) == 2,
	      "code points: \" café\" 5, \"日本\" 2");
	json_decref(js), json_decref(it);
	for (int i = 0; i < out.n; i++)
		free(out.v[i]);
	llm_sched_close(s);
	llm_eval_free(ev);
	llm_engine_close(e);
	llm_tokenizer_close(tk);
}

int main(void)
{
	test_plan();
	const char *models = test_models_dir();
	char dir[1100];
	snprintf(dir, sizeof dir, "%s/stories260K", models ? models : "");
	if (!models)
		check_skip("no stories260K model", "scores on the model");
	else
		test_scores(dir);
	return check_done();
}
