/* tests/test_sched.c: the one scheduler (common/serve/scheduler.c) on stories260K.
 *
 * The reference is each prompt generated alone (one sequence, no prefix
 * cache, no preemption). Under the scheduler, with many
 * requests, a KV pool too small for all of them (so requests are preempted
 * and recomputed), a small SplitFuse budget (prompts cut into chunks) and
 * the prefix cache, every greedy output must be identical, every block must
 * come back, and no step may exceed the budget. Then cancellation, context
 * overflow and prefix-cache hits; then speculative decoding (prompt
 * lookup) under the same pool and budget: greedy and seeded sampled
 * outputs equal plain decoding's, drafts are accepted, blocks come back. */
#define _GNU_SOURCE
#include "check.h"
#include "scheduler.h"
#include "sched_run.h"
#include "score.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#define N_REQ 12
#define MAX_NEW 40

struct out {
	int32_t ids[512];
	int n, finish, events, cancel_events;
};

static int on_token(void *user, const struct llm_token_event *ev)
{
	struct out *o = user;
	o->events++;
	if (ev->token >= 0 && !(ev->finish == LLM_FINISH_EOS || ev->finish == LLM_FINISH_STOP) && o->n < 512)
		o->ids[o->n++] = ev->token;
	if (ev->finish == LLM_FINISH_CANCEL)
		o->cancel_events++;
	if (ev->finish)
		o->finish = ev->finish;
	return 0;
}

static int32_t prompts[N_REQ + 2][300];
static int n_prompt[N_REQ + 2];

static int load_prompts(void)
{
	char path[1100];
	const char *ref = test_ref_dir();
	if (!ref)
		return 0;
	snprintf(path, sizeof path, "%s/stories260K/greedy.jsonl", ref);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	char *line = NULL;
	size_t cap = 0;
	int k = 0;
	while (k < N_REQ && getline(&line, &cap, f) > 0) {
		json_t *o = json_loads(line, 0, NULL);
		json_t *a = o ? json_object_get(o, "prompt_ids") : NULL;
		json_t *ids = o ? json_object_get(o, "ids") : NULL;
		/* prompt ids + the first reference ids: prompts of varied length */
		int n = 0;
		for (size_t i = 0; a && i < json_array_size(a); i++)
			prompts[k][n++] = (int32_t)json_integer_value(json_array_get(a, i));
		for (size_t i = 0; ids && i < (size_t)(k * 7) && i < json_array_size(ids); i++)
			prompts[k][n++] = (int32_t)json_integer_value(json_array_get(ids, i));
		n_prompt[k++] = n;
		json_decref(o);
	}
	free(line);
	fclose(f);
	return k == N_REQ;
}

static struct llm_sample_params greedy(int max_tokens)
{
	struct llm_sample_params p = LLM_SAMPLE_DEFAULT;
	p.temperature = 0;
	p.max_tokens = max_tokens;
	p.ignore_eos = 1;
	return p;
}

/* Run the scheduler until idle, at most LIMIT steps; checks the budget. */
static int drain(struct llm_sched *s, int limit, int budget, int *over)
{
	int pending = 1, steps = 0;
	struct llm_sched_stats st;
	while (pending > 0 && steps < limit) {
		if (llm_sched_step(s, &pending)) {
			check_diag("step: %s", llm_errmsg());
			return -1;
		}
		llm_sched_stats(s, &st);
		if (st.last_step_tokens > budget)
			(*over)++;
		steps++;
	}
	return pending;
}

/* Scoring requests (score.h) under the same small pool and budget: items
 * each with a context and 3 continuations, scored all at once (forks of
 * the contexts, preemptions), give the numbers of each item scored alone;
 * a child whose parent is cancelled computes the context itself. */
static int on_lp(void *user, int index, int32_t token, double lp, int argmax)
{
	(void)index, (void)token, (void)argmax;
	*(double *)user += lp;
	return 0;
}

static void test_scoring(const char *dir)
{
	enum { N_ITEM = 6, N_CONT = 3, N_CTX = 48 };
	static struct llm_score_result all[N_ITEM][N_CONT];
	double alone[N_ITEM][N_CONT];
	int is_greedy[N_ITEM][N_CONT], bad = 0, ok_alone = 1;
	const int32_t *cont[N_CONT];
	int n_cont[N_CONT];
	for (int c = 0; c < N_CONT; c++) {
		cont[c] = prompts[c + 9] + 1;
		n_cont[c] = 10 + 10 * c;
	}
	/* 12 blocks of 8: an item (a 48-token context, 3 continuations of up to
	 * 30) fits alone, but not all of its children at once: they are
	 * preempted mid-prompt and recomputed */
	struct llm_engine_opts o = LLM_ENGINE_OPTS_DEFAULT;
	o.max_seqs = 8;
	o.n_threads = 1;
	o.kv_block_size = 8;
	o.kv_blocks = 12;
	o.max_batch_tokens = 32;
	struct llm_engine *e;
	struct llm_sched_opts so = { .max_running = 6, .max_batch_tokens = 32 };
	struct llm_sched *s;
	if (!check(llm_engine_open(&e, dir, &o) == LLM_OK, "open an engine of 12 KV blocks for scoring"))
		return;
	if (!check(llm_sched_open(&s, e, &so) == LLM_OK, "open a scheduler for scoring")) {
		llm_engine_close(e);
		return;
	}
	/* an older generating request that grows to the whole pool */
	struct out gen = { 0 }, gen_alone = { 0 };
	struct llm_request gr = { .prompt = prompts[5], .n_prompt = 40, .params = greedy(50), .on_token = on_token,
	                          .user = &gen_alone };
	ok_alone &= test_sched_run(e, &gr, 1, NULL) == LLM_OK;
	gr.user = &gen;
	bad += llm_sched_add(s, &gr, NULL) != LLM_OK;
	for (int k = 0; k < N_ITEM; k++) {
		const int32_t *ctx = prompts[k + 5];
		ok_alone &= llm_score(e, ctx, N_CTX, cont, n_cont, N_CONT, alone[k], is_greedy[k]) == LLM_OK;
		bad += llm_sched_score(s, ctx, N_CTX, cont, n_cont, N_CONT, all[k]) != LLM_OK;
	}
	int over = 0, left = drain(s, 5000, 32, &over);
	struct llm_sched_stats st;
	llm_sched_stats(s, &st);
	int diff = 0;
	for (int k = 0; k < N_ITEM; k++)
		for (int c = 0; c < N_CONT; c++)
			diff += all[k][c].logprob != alone[k][c] || all[k][c].is_greedy != is_greedy[k][c]
			        || all[k][c].n_scored != n_cont[c];
	check(ok_alone && !bad && !left && !diff, "%d items of %d continuations scored together, "
	      "beside a generation that outgrows them, equal each alone, digit for digit (%d differ, %lld preemptions, "
	      "%lld context tokens forked)", N_ITEM, N_CONT, diff, (long long)st.preemptions,
	      (long long)st.prefix_hit_tokens);
	check(gen.n == 50 && !memcmp(gen.ids, gen_alone.ids, sizeof(int32_t) * 50), "... and the generation's ids are "
	      "its own alone");
	check(llm_engine_kv(e)->n_free == llm_engine_kv(e)->n_block, "every block is free after scoring");
	/* a parent cancelled before its child could fork it */
	double lp_child = 0;
	int32_t whole[N_CTX + 30];
	memcpy(whole, prompts[5], N_CTX * sizeof *whole);
	memcpy(whole + N_CTX, cont[1], (size_t)n_cont[1] * sizeof *whole);
	struct llm_request par = { .prompt = whole, .n_prompt = N_CTX, .params = greedy(1), .prefill_only = 1 };
	struct llm_request ch = { .prompt = whole, .n_prompt = N_CTX + n_cont[1], .params = greedy(1), .prefill_only = 1,
	                          .score_from = N_CTX, .on_score = on_lp, .user = &lp_child, .n_shared = N_CTX - 1 };
	int pid;
	llm_sched_add(s, &par, &pid);
	ch.parent = pid;
	enum llm_status a = llm_sched_add(s, &ch, NULL);
	llm_sched_cancel(s, pid);
	left = drain(s, 1000, 32, &over);
	check(a == LLM_OK && !left && lp_child == alone[0][1], "a child whose parent was cancelled scores the same "
	      "(%.6f vs %.6f)", lp_child, alone[0][1]);
	ch.n_shared = N_CTX;    /* would share the input of the first scored token */
	check(llm_sched_add(s, &ch, NULL) == LLM_ERR_USAGE, "n_shared past score_from - 1 is refused: %s", llm_errmsg());
	llm_sched_close(s);
	llm_engine_close(e);
}

/* The prompt-lookup drafter on crafted ids: the longest suffix first, the
 * most recent occurrence, at most k, nothing without an occurrence. */
static void test_ngram(void)
{
	const int32_t a[] = { 1, 2, 3, 9, 9, 2, 3, 7, 8, 5, 1, 2, 3 };
	int32_t out[8] = { 0 };
	int m = llm_spec_ngram(a, 13, 3, 4, out);   /* "1 2 3" at 0 -> 9 9 2 3 */
	check(m == 4 && out[0] == 9 && out[1] == 9 && out[2] == 2 && out[3] == 3, "ngram: 3-gram match copies 4 (%d)", m);
	m = llm_spec_ngram(a, 13, 2, 2, out);       /* "2 3" last at 5 -> 7 8 */
	check(m == 2 && out[0] == 7 && out[1] == 8, "ngram: 2-gram, most recent occurrence (%d: %d %d)", m, out[0], out[1]);
	const int32_t b[] = { 4, 5, 6, 6 };
	m = llm_spec_ngram(b, 4, 3, 4, out);        /* only "6" matches, at 2 -> 6 */
	check(m == 1 && out[0] == 6, "ngram: falls back to 1-gram, cut at the end (%d)", m);
	const int32_t c[] = { 1, 2, 3, 4 };
	check(llm_spec_ngram(c, 4, 3, 4, out) == 0 && llm_spec_ngram(c, 1, 3, 4, out) == 0, "ngram: no occurrence, no draft");
	struct llm_spec_opts so;
	check(llm_spec_opts_set(&so, "medusa", 4, 3, NULL) == LLM_ERR_USAGE && strstr(llm_errmsg(), "--speculate"),
	      "an unknown --speculate mode is refused (%s)", llm_errmsg());
}

/* Speculation: the 12 requests (greedy: REF; sampled at temperature 0.9,
 * seeded: against the same run without speculation) through a scheduler
 * with prompt lookup, 6 running, a budget of 32, the small pool (so
 * requests are preempted); then greedy with a draft model (DRAFT: the
 * same checkpoint, whose drafts the target's argmax must equal) against
 * REF, and sampled with it (the ids differ from the seeded run: only that
 * it ends cleanly, test_spec.c checks the distribution). */
static void test_spec(struct llm_engine *e, const struct out *ref, struct llm_engine *draft)
{
	static struct out plain[N_REQ], got[N_REQ];
	for (int pass = 0; pass < 5; pass++) {   /* 0: sampled plain, 1: sampled, 2: greedy (ngram); 3: greedy, 4: sampled (draft) */
		struct llm_sched_opts so = { .max_running = 6, .max_batch_tokens = 32, .prefix_entries = 2 };
		if (pass && llm_spec_opts_set(&so.spec, pass < 3 ? "ngram" : "draft", 4, pass < 3 ? 3 : 0, pass < 3 ? NULL : "stories260K"))
			check_diag("spec opts: %s", llm_errmsg());
		so.draft = pass < 3 ? NULL : draft;
		if (pass >= 3 && !draft)
			break;
		struct llm_sched *s;
		if (!check(llm_sched_open(&s, e, &so) == LLM_OK, "open a scheduler (speculation pass %d)", pass))
			return;
		struct out *o = pass ? got : plain;
		memset(o, 0, sizeof(struct out) * N_REQ);
		for (int k = 0; k < N_REQ; k++) {
			struct llm_request rq = { .prompt = prompts[k], .n_prompt = n_prompt[k], .params = greedy(MAX_NEW),
			                          .on_token = on_token, .user = &o[k] };
			if (pass < 2 || pass == 4) {
				rq.params.temperature = 0.9f;
				rq.params.seed = 1000 + (uint64_t)k;
			}
			llm_sched_add(s, &rq, NULL);
		}
		int over = 0, left = drain(s, 5000, 32, &over);
		struct llm_sched_stats st;
		llm_sched_stats(s, &st);
		llm_sched_close(s);
		if (!pass)
			continue;
		if (pass == 4) {
			struct llm_kv *dkv = llm_engine_kv(draft);
			int short_ = 0;
			for (int k = 0; k < N_REQ; k++)
				short_ += o[k].n < 1;
			check(left == 0 && !short_ && over == 0 && st.kv_blocks_used == 0 && dkv->n_free == dkv->n_block,
			      "draft model, sampled (T 0.9): every request ends, no step over the budget, every block of "
			      "both caches free again (%lld of %lld drafted accepted, %lld preemptions)",
			      (long long)st.spec_accepted_tokens, (long long)st.spec_draft_tokens, (long long)st.preemptions);
			continue;
		}
		const struct out *want = pass == 1 ? plain : ref;
		int diff = 0;
		for (int k = 0; k < N_REQ; k++)
			if (o[k].n != want[k].n || memcmp(o[k].ids, want[k].ids, (size_t)want[k].n * sizeof(int32_t))) {
				diff++;
				check_diag("request %d: %d ids, expected %d", k, o[k].n, want[k].n);
			}
		const char *what = pass == 1 ? "seeded sampled (T 0.9)" : pass == 2 ? "greedy" : "greedy, draft model";
		check(left == 0 && diff == 0, "speculation (%s, k 4): %s outputs equal plain decoding's "
		      "(%d differ, %d left)", pass < 3 ? "prompt lookup, n 3" : "the model itself as draft", what, diff, left);
		check(st.spec_accepted_tokens > 0 && (pass == 3 ? st.spec_accepted_tokens == st.spec_draft_tokens
		                                                : st.spec_accepted_tokens < st.spec_draft_tokens),
		      "%s: %lld of %lld drafted tokens accepted", what, (long long)st.spec_accepted_tokens,
		      (long long)st.spec_draft_tokens);
		check(over == 0 && st.kv_blocks_used == 0, "%s: no step over the budget, every block free again "
		      "(%lld used; %lld preemptions)", what, (long long)st.kv_blocks_used, (long long)st.preemptions);
	}
}

int main(void)
{
	const char *models = test_models_dir();
	char dir[1100];
	snprintf(dir, sizeof dir, "%s/stories260K", models ? models : "");
	test_ngram();
	if (!models || !load_prompts()) {
		check_skip("no stories260K model or reference prompts", "scheduler tests");
		return check_done();
	}
	/* references: each prompt alone, one sequence, no prefix cache */
	static struct out ref[N_REQ + 2], got[N_REQ + 2];
	struct llm_engine_opts ro = LLM_ENGINE_OPTS_DEFAULT;
	ro.max_seqs = 1;
	ro.n_threads = 1;
	struct llm_engine *re;
	if (!check(llm_engine_open(&re, dir, &ro) == LLM_OK, "open the reference engine")) {
		check_diag("%s", llm_errmsg());
		return check_done();
	}
	/* two more prompts: a long shared prefix with different endings */
	n_prompt[N_REQ] = n_prompt[N_REQ + 1] = 0;
	for (int i = 0; i < 5; i++)
		for (int j = 0; j < n_prompt[i]; j++) {
			prompts[N_REQ][n_prompt[N_REQ]++] = prompts[i][j];
			prompts[N_REQ + 1][n_prompt[N_REQ + 1]++] = prompts[i][j];
		}
	prompts[N_REQ][n_prompt[N_REQ]++] = 300;
	prompts[N_REQ + 1][n_prompt[N_REQ + 1]++] = 301;
	for (int k = 0; k < N_REQ + 2; k++) {
		struct llm_request rq = { .prompt = prompts[k], .n_prompt = n_prompt[k], .params = greedy(MAX_NEW), .on_token = on_token, .user = &ref[k] };
		if (test_sched_run(re, &rq, 1, NULL)) {
			check(0, "reference generation %d: %s", k, llm_errmsg());
			return check_done();
		}
	}
	llm_engine_close(re);
	check_diag("prefix prompts: %d tokens", n_prompt[N_REQ]);

	/* the scheduler: 6 running, 2 prefix entries, 24 blocks of 8 positions
	 * (192 positions for 12 requests of up to ~120), a budget of 32 */
	struct llm_engine_opts o = LLM_ENGINE_OPTS_DEFAULT;
	o.max_seqs = 8;
	o.n_threads = 1;
	o.kv_block_size = 8;
	o.kv_blocks = 24;
	o.max_batch_tokens = 32;
	struct llm_engine *e;
	if (!check(llm_engine_open(&e, dir, &o) == LLM_OK, "open the engine for the scheduler")) {
		check_diag("%s", llm_errmsg());
		return check_done();
	}
	struct llm_sched_opts so = { .max_running = 6, .max_batch_tokens = 32, .prefix_entries = 2 };
	struct llm_sched *s;
	if (!check(llm_sched_open(&s, e, &so) == LLM_OK, "open the scheduler")) {
		check_diag("%s", llm_errmsg());
		llm_engine_close(e);
		return check_done();
	}
	int bad = 0, over = 0;
	for (int k = 0; k < N_REQ; k++) {
		struct llm_request rq = { .prompt = prompts[k], .n_prompt = n_prompt[k], .params = greedy(MAX_NEW), .on_token = on_token, .user = &got[k] };
		bad += llm_sched_add(s, &rq, NULL) != LLM_OK;
	}
	check(bad == 0, "12 requests queued");
	int left = drain(s, 5000, 32, &over);
	check(left == 0, "every request finished (%d left)", left);
	struct llm_sched_stats st;
	llm_sched_stats(s, &st);
	int diff = 0;
	for (int k = 0; k < N_REQ; k++)
		if (got[k].n != ref[k].n || memcmp(got[k].ids, ref[k].ids, (size_t)ref[k].n * sizeof(int32_t))) {
			diff++;
			check_diag("request %d: %d ids, reference %d", k, got[k].n, ref[k].n);
		}
	check(diff == 0, "greedy outputs under preemption and chunking equal each prompt alone (%d differ)", diff);
	check(st.preemptions > 0, "the small KV pool forced preemptions (%lld)", (long long)st.preemptions);
	check(over == 0, "no step exceeded the token budget of 32");
	check(st.kv_blocks_used == 0, "every block is free again (%lld used, %lld cached)",
	      (long long)st.kv_blocks_used, (long long)st.kv_blocks_cached);
	check(st.running == 0 && st.waiting == 0, "nothing running or waiting");

	/* prefix cache: the second long prompt reuses the first one's blocks */
	llm_sched_prefix_clear(s);
	int64_t hits0 = st.prefix_hit_tokens;
	for (int k = N_REQ; k < N_REQ + 2; k++) {
		struct llm_request rq = { .prompt = prompts[k], .n_prompt = n_prompt[k], .params = greedy(MAX_NEW), .on_token = on_token, .user = &got[k] };
		if (llm_sched_add(s, &rq, NULL))
			check_diag("add: %s", llm_errmsg());
		drain(s, 5000, 32, &over);
	}
	llm_sched_stats(s, &st);
	int64_t hit = st.prefix_hit_tokens - hits0;
	check(hit >= 8 * ((n_prompt[N_REQ] - 1) / 8) - 8 && hit > 0,
	      "a shared %d-token prefix came from the cache (%lld tokens)", n_prompt[N_REQ], (long long)hit);
	diff = 0;
	for (int k = N_REQ; k < N_REQ + 2; k++)
		diff += got[k].n != ref[k].n || memcmp(got[k].ids, ref[k].ids, (size_t)ref[k].n * sizeof(int32_t));
	check(diff == 0, "outputs with a cached prefix equal the recomputed ones");
	check(st.kv_blocks_used == 0 && st.kv_blocks_cached > 0, "the cache holds blocks, requests none (%lld cached)",
	      (long long)st.kv_blocks_cached);

	/* cancellation frees the blocks at the next step */
	struct out c = { 0 };
	int id;
	struct llm_request rq = { .prompt = prompts[3], .n_prompt = n_prompt[3], .params = greedy(MAX_NEW), .on_token = on_token, .user = &c };
	llm_sched_add(s, &rq, &id);
	for (int i = 0; i < 3; i++)
		llm_sched_step(s, NULL);
	llm_sched_cancel(s, id);
	int pending;
	llm_sched_step(s, &pending);
	llm_sched_stats(s, &st);
	check(c.cancel_events == 1 && c.finish == LLM_FINISH_CANCEL && pending == 0,
	      "a cancelled request gets one cancel event and leaves");
	check(st.kv_blocks_used == 0, "its blocks are free (%lld used)", (long long)st.kv_blocks_used);

	/* context overflow names the numbers */
	struct llm_request big = { .prompt = prompts[0], .n_prompt = n_prompt[0], .params = greedy(600), .on_token = on_token, .user = &c };
	enum llm_status rc = llm_sched_add(s, &big, NULL);
	check(rc == LLM_ERR_RANGE && strstr(llm_errmsg(), "max_tokens 600") && strstr(llm_errmsg(), "512"),
	      "prompt + max_tokens beyond the context is refused with the numbers (%s)", llm_errmsg());
	llm_sched_close(s);

	/* a short prompt arriving while a long one is being prefilled (budget
	 * 32) gets its first token at once, not after the long prefill; the
	 * long one's output is unchanged */
	struct llm_sched_opts fo = { .max_running = 4, .max_batch_tokens = 32 };
	if (check(llm_sched_open(&s, e, &fo) == LLM_OK, "open a scheduler without prefix cache")) {
		static int32_t longp[120];     /* fits the 24 blocks of 8 with the short one */
		int nl = 0;
		for (int k = 0; k < N_REQ && nl < 120; k++)
			for (int j = k ? 1 : 0; j < n_prompt[k] && nl < 120; j++)
				longp[nl++] = prompts[k][j];
		struct out lo = { 0 }, sh = { 0 }, alone = { 0 };
		struct llm_request lr = { .prompt = longp, .n_prompt = nl, .params = greedy(8), .on_token = on_token, .user = &lo };
		struct llm_request sr = { .prompt = prompts[1], .n_prompt = n_prompt[1], .params = greedy(8), .on_token = on_token, .user = &sh };
		llm_sched_add(s, &lr, NULL);
		llm_sched_step(s, NULL);                  /* the long prefill has begun */
		llm_sched_add(s, &sr, NULL);
		int steps = 0;
		while (sh.events == 0 && steps < 100 && !llm_sched_step(s, NULL))
			steps++;
		int long_waiting = lo.events == 0;
		check(steps <= 2 && long_waiting, "a %d-token prompt arriving during a %d-token prefill gets its first "
		      "token after %d step(s), the long one still prefilling (%s)", n_prompt[1], nl, steps,
		      long_waiting ? "yes" : "no");
		drain(s, 1000, 32, &over);
		llm_sched_close(s);
		/* the long prompt alone, for its output: with no decode in its
		 * steps nothing is weighted, every chunk but the last takes the
		 * whole budget of 32 */
		int chunk[64] = { 0 }, n_chunk = 0, sum = 0, costly = 0, full = 1;
		if (llm_sched_open(&s, e, &fo) == LLM_OK) {
			struct llm_request lr2 = { .prompt = longp, .n_prompt = nl, .params = greedy(8), .on_token = on_token, .user = &alone };
			llm_sched_add(s, &lr2, NULL);
			while (alone.events == 0 && n_chunk < 64 && !llm_sched_step(s, NULL)) {
				llm_sched_stats(s, &st);
				chunk[n_chunk++] = st.last_step_tokens;
			}
			drain(s, 1000, 32, &over);
			llm_sched_close(s);
		}
		for (int i = 0; i < n_chunk; i++) {
			full &= i == n_chunk - 1 || chunk[i] == 32;
			sum += chunk[i];
		}
		check(n_chunk >= 3 && sum == nl && full, "a %d-token prompt alone at budget 32: chunks %d, %d, ... %d, "
		      "the whole budget in tokens (no decode shares its steps)", nl, chunk[0],
		      n_chunk > 1 ? chunk[1] : 0, chunk[n_chunk - 1]);
		/* beside a decoding request, its chunks are weighted by context
		 * (1 + c / K, K from the config as scheduler.c derives it): each
		 * costs at most what the decode leaves of the budget, and they
		 * shrink as the context grows; the outputs do not change */
		struct out dec = { 0 }, lo3 = { 0 };
		int n_mixed = 0, pos = 0, grows = 0, prev = 0;
		const struct llm_config *cf = &llm_engine_model(e)->cfg;
		double dq = (double)cf->n_head * cf->d_head, dkv = (double)cf->n_kv_head * cf->d_head;
		double K = ((double)cf->d_model * (dq + 2 * dkv) + dq * cf->d_model + 3.0 * cf->d_model * cf->d_ff)
		           / (4.0 * 2.0 * dq);
		int first = 0, last = 0;
		if (llm_sched_open(&s, e, &fo) == LLM_OK) {
			struct llm_request dr = { .prompt = prompts[1], .n_prompt = n_prompt[1], .params = greedy(24),
			                          .on_token = on_token, .user = &dec };
			struct llm_request lr3 = { .prompt = longp, .n_prompt = nl, .params = greedy(8), .on_token = on_token, .user = &lo3 };
			dr.params.ignore_eos = 1;
			llm_sched_add(s, &dr, NULL);
			while (dec.events == 0 && !llm_sched_step(s, NULL))
				;
			llm_sched_add(s, &lr3, NULL);
			while (lo3.events == 0 && !dec.finish && n_mixed < 200 && !llm_sched_step(s, NULL)) {
				llm_sched_stats(s, &st);
				int t = st.last_step_tokens - 1;   /* the decode's token, then the chunk */
				if (t < 1 || pos >= nl)
					break;
				double c = pos, tt = t;
				costly += t > 1 && tt + (tt * c + tt * (tt - 1) / 2) / K > 31.0 + 1e-9;
				grows += n_mixed > 0 && pos + t < nl && t > prev;
				first = n_mixed ? first : t;
				last = t;
				prev = t;
				pos += t;
				n_mixed++;
			}
			drain(s, 1000, 32, &over);
			llm_sched_close(s);
		}
		check(n_mixed >= 3 && pos == nl && !costly && !grows && last < first,
		      "a %d-token prompt beside a decode at budget 32 (K = %.1f positions): chunks %d ... %d over "
		      "%d steps, each within the budget weighted by context", nl, K, first, last, n_mixed);
		check(lo3.n == 8 && !memcmp(lo3.ids, alone.ids, sizeof(int32_t) * 8),
		      "the long prompt's output is the same beside the decode");
		check(lo.n == 8 && alone.n == 8 && !memcmp(lo.ids, alone.ids, sizeof(int32_t) * 8),
		      "the long prompt's output is the same with the short one going first");
	}
	struct llm_engine_opts dopt = o;   /* the draft: the scheduler's 6 sequences, its own pool */
	dopt.max_seqs = dopt.kv_seqs = 6;
	struct llm_engine *draft = NULL;
	if (!check(llm_sched_draft_open(&draft, e, dir, &dopt) == LLM_OK, "open stories260K as a draft model"))
		check_diag("%s", llm_errmsg());
	test_spec(e, ref, draft);
	llm_engine_close(draft);
	llm_engine_close(e);
	test_scoring(dir);
	return check_done();
}
