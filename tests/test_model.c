/* tests/test_model.c: the model against independent references.
 *
 * ../shared/reference/stories260K/greedy.jsonl (llama2.c run.c, cross-checked
 * by llama.cpp with an F32 KV cache): greedy ids must equal up to the first
 * position where the reference's top-two margin is below 1e-3, log-probs
 * within 1e-4 there (the file's README). perplexity.json: total NLL within
 * 1e-5 relative. Then batch invariance, bad inputs, and the FP8/BF16
 * checkpoints made with bin/llm-quantize (reported, FP8 128x128 perplexity
 * within 5% of F32). */
#define _GNU_SOURCE
#include "check.h"
#include "model.h"
#include "generate.h"
#include "sched_run.h"
#include "score.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MARGIN_MIN 1e-3      /* README: near-ties below this may flip */
#define LOGPROB_ATOL 1e-4    /* README: F32 log-prob tolerance */
#define NLL_RTOL 1e-5        /* the issue: total NLL within 1e-5 relative */

struct prompt {
	char id[16];
	int n_prompt, n_ref;
	int32_t *prompt, *ref;
	double *logprob, *margin;
	int stop_bos;
};

static struct prompt *P;
static int n_P;
static char model_dir[1024];

static int32_t *int_array(json_t *a, int *n)
{
	*n = (int)json_array_size(a);
	int32_t *v = malloc(((size_t)*n + 1) * sizeof *v);
	for (int i = 0; i < *n; i++)
		v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
	return v;
}

static double *num_array(json_t *a)
{
	size_t n = json_array_size(a);
	double *v = malloc((n + 1) * sizeof *v);
	for (size_t i = 0; i < n; i++)
		v[i] = json_number_value(json_array_get(a, i));
	return v;
}

static int load_greedy(const char *ref)
{
	char path[1100];
	snprintf(path, sizeof path, "%s/stories260K/greedy.jsonl", ref);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	char *line = NULL;
	size_t cap = 0;
	P = calloc(64, sizeof *P);
	while (getline(&line, &cap, f) > 0 && n_P < 64) {
		json_t *o = json_loads(line, 0, NULL);
		if (!o)
			continue;
		struct prompt *p = &P[n_P++];
		snprintf(p->id, sizeof p->id, "%s", json_string_value(json_object_get(o, "id")));
		p->prompt = int_array(json_object_get(o, "prompt_ids"), &p->n_prompt);
		p->ref = int_array(json_object_get(o, "ids"), &p->n_ref);
		p->logprob = num_array(json_object_get(o, "logprobs"));
		p->margin = num_array(json_object_get(o, "margins"));
		p->stop_bos = !strcmp(json_string_value(json_object_get(o, "stop")), "bos");
		json_decref(o);
	}
	free(line);
	fclose(f);
	return n_P;
}

/* ---- greedy through the engine ----------------------------------------- */

struct collect {
	int32_t ids[600];
	float lp[600];
	int n;
	enum llm_finish finish;
};

static int on_token(void *user, const struct llm_token_event *ev)
{
	struct collect *c = user;
	if (ev->finish == LLM_FINISH_NONE || ev->finish == LLM_FINISH_LENGTH) {
		if (c->n < 600) {
			c->ids[c->n] = ev->token;
			c->lp[c->n] = ev->logprob;
			c->n++;
		}
	}
	if (ev->finish)
		c->finish = ev->finish;
	return 0;
}

static struct llm_sample_params greedy_params(const struct prompt *p)
{
	struct llm_sample_params sp = LLM_SAMPLE_DEFAULT;
	sp.temperature = 0;
	sp.max_tokens = 257 - p->n_prompt;       /* run.c -n 256: positions 0..256 */
	sp.stop_ids[sp.n_stop_ids++] = 1;        /* run.c stops where the argmax is BOS */
	sp.ignore_eos = 1;                       /* ... and not at EOS */
	return sp;
}

/* Compare one prompt's output with the reference under the margin rule. */
static int compare(const struct prompt *p, const struct collect *c, double *max_dlp, int *agree)
{
	int lim = p->n_ref;
	for (int i = 0; i < p->n_ref; i++)
		if (p->margin[i] < MARGIN_MIN) {
			lim = i;
			break;
		}
	int ok = 1, i;
	for (i = 0; i < lim; i++) {
		if (i >= c->n || c->ids[i] != p->ref[i]) {
			ok = 0;
			break;
		}
		double d = fabs(c->lp[i] - p->logprob[i]);
		if (d > *max_dlp)
			*max_dlp = d;
		if (d > LOGPROB_ATOL)
			ok = 0;
	}
	int a = 0;
	while (a < c->n && a < p->n_ref && c->ids[a] == p->ref[a])
		a++;
	*agree = a;
	/* an exact run also ends the same way */
	if (ok && lim == p->n_ref && c->n != p->n_ref)
		ok = 0;
	return ok;
}

static struct llm_engine *open_engine_head(const char *path, enum llm_dtype kv, int threads, int max_seqs,
                                          enum llm_lm_head head)
{
	struct llm_engine_opts o = LLM_ENGINE_OPTS_DEFAULT;
	o.lm_head = head;
	o.kv_dtype = kv;
	o.n_threads = threads;
	o.max_seqs = max_seqs;
	struct llm_engine *e = NULL;
	if (llm_engine_open(&e, path, &o)) {
		check_diag("engine open %s: %s", path, llm_errmsg());
		return NULL;
	}
	return e;
}

static struct llm_engine *open_engine(const char *path, enum llm_dtype kv, int threads, int max_seqs)
{
	return open_engine_head(path, kv, threads, max_seqs, LLM_HEAD_AUTO);
}

/* Run prompts [first, first + n) queued together; C[k] gets prompt first + k. */
static int run_greedy(struct llm_engine *e, int first, int n, struct collect *c)
{
	struct llm_request *r = calloc((size_t)n, sizeof *r);
	if (!r)
		return 0;
	for (int k = 0; k < n; k++) {
		const struct prompt *p = &P[first + k];
		memset(&c[k], 0, sizeof c[k]);
		r[k] = (struct llm_request){ .prompt = p->prompt, .n_prompt = p->n_prompt, .params = greedy_params(p), .on_token = on_token, .user = &c[k] };
	}
	enum llm_status s = test_sched_run(e, r, n, NULL);
	free(r);
	if (s) {
		check_diag("run: %s", llm_errmsg());
		return 0;
	}
	return 1;
}

static void report_run(const char *what, struct collect *c, int *n_ok_out, double *max_dlp_out, int quiet)
{
	int n_ok = 0, total_agree = 0, total_ref = 0;
	double max_dlp = 0;
	for (int i = 0; i < n_P; i++) {
		int agree;
		int ok = compare(&P[i], &c[i], &max_dlp, &agree);
		n_ok += ok;
		total_agree += agree;
		total_ref += P[i].n_ref;
		if (!ok && !quiet)
			check_diag("%s %s: first difference at %d of %d (ids %d vs ref %d)", what, P[i].id, agree,
			           P[i].n_ref, agree < c[i].n ? c[i].ids[agree] : -1,
			           agree < P[i].n_ref ? P[i].ref[agree] : -1);
	}
	if (n_ok_out)
		*n_ok_out = n_ok;
	if (max_dlp_out)
		*max_dlp_out = max_dlp;
	check_diag("%s: %d/%d prompts pass the margin rule, %d/%d leading reference ids reproduced, max |dlogprob| %.3g",
	           what, n_ok, n_P, total_agree, total_ref, max_dlp);
}

static struct collect *alone;     /* each prompt alone, f32 weights and KV */

static void test_greedy(void)
{
	struct llm_engine *e = open_engine(model_dir, LLM_DTYPE_F32, 1, 1);
	if (!check(e != NULL, "open stories260K (F32 weights, F32 KV)"))
		return;
	alone = calloc((size_t)n_P, sizeof *alone);
	int ok = 1;
	for (int i = 0; i < n_P && ok; i++)
		ok = run_greedy(e, i, 1, &alone[i]);
	llm_engine_close(e);
	int n_ok;
	double max_dlp;
	report_run("f32 weights, f32 kv", alone, &n_ok, &max_dlp, 0);
	check(ok && n_ok == n_P, "greedy ids equal greedy.jsonl up to the first margin < 1e-3: %d/%d prompts", n_ok, n_P);
	check(ok && max_dlp <= LOGPROB_ATOL, "log-probs within %g of run.c (max %.3g)", LOGPROB_ATOL, max_dlp);
}

/* All prompts in one engine at once (mixed prefill and decode steps, small
 * step budget so prefill chunks and decodes share batches), 2 threads,
 * against ALONE: each prompt alone on a KV cache of the same dtype. */
static void test_batch_invariance(enum llm_dtype kvt, const struct collect *alone)
{
	if (!alone)
		return;
	struct llm_engine_opts o = LLM_ENGINE_OPTS_DEFAULT;
	o.kv_dtype = kvt;
	o.n_threads = 2;
	o.max_seqs = n_P;
	o.max_batch_tokens = 48;
	struct llm_engine *e = NULL;
	if (!check(llm_engine_open(&e, model_dir, &o) == LLM_OK, "open with 30 sequences, 2 threads")) {
		check_diag("%s", llm_errmsg());
		return;
	}
	struct collect *all = calloc((size_t)n_P, sizeof *all);
	int ok = run_greedy(e, 0, n_P, all);
	int same = 0;
	for (int i = 0; i < n_P; i++) {
		int eq = all[i].n == alone[i].n && !memcmp(all[i].ids, alone[i].ids, (size_t)all[i].n * 4)
		         && !memcmp(all[i].lp, alone[i].lp, (size_t)all[i].n * 4);
		if (!eq)
			check_diag("%s: together differs from alone", P[i].id);
		same += eq;
	}
	check(ok && same == n_P, "batch invariance, %s kv: 30 prompts together (48-token steps, 2 threads) "
	      "give the same ids and log-probs, bit for bit, as one at a time: %d/%d", llm_dtype_name(kvt), same, n_P);
	free(all);
	llm_engine_close(e);
}

/* llm_score: the reference continuation of a prompt scores the sum of its
 * reference log-probs and is greedy; two continuations share the context's
 * blocks (fork), and a changed continuation is not greedy. */
static void test_score(void)
{
	struct llm_engine *e = open_engine(model_dir, LLM_DTYPE_F32, 1, 2);
	if (!e)
		return;
	const struct prompt *p = &P[1];
	int n1 = 12;
	int32_t alt[12];
	memcpy(alt, p->ref, sizeof alt);
	alt[5] = alt[5] == 300 ? 301 : 300;
	const int32_t *cont[2] = { p->ref, alt };
	int ncont[2] = { n1, n1 };
	double lp[2];
	int g[2];
	enum llm_status s = llm_score(e, p->prompt, p->n_prompt, cont, ncont, 2, lp, g);
	double want = 0;
	for (int i = 0; i < n1; i++)
		want += p->logprob[i];
	check(s == LLM_OK && fabs(lp[0] - want) < n1 * LOGPROB_ATOL && g[0] == 1 && g[1] == 0 && lp[1] < lp[0],
	      "llm_score: reference continuation %.6f vs run.c %.6f, greedy %d; altered %.4f, greedy %d",
	      lp[0], want, g[0], lp[1], g[1]);
	check(llm_engine_kv(e)->n_free == llm_engine_kv(e)->n_block, "llm_score returns every KV block");
	llm_engine_close(e);
}

/* ---- perplexity -------------------------------------------------------- */

static double f32_story_nll = -1;

static void perplexity_of(const char *path, const char *what, enum llm_dtype kvt, double *nll_out,
                          int check_ref)
{
	char rp[1100];
	snprintf(rp, sizeof rp, "%s/stories260K/perplexity.json", test_ref_dir());
	json_t *root = json_load_file(rp, 0, NULL);
	if (!root) {
		check_skip("no perplexity.json", "perplexity %s", what);
		return;
	}
	struct llm_engine *e = open_engine(path, kvt, 0, 1);
	if (!e) {
		check(0, "open %s", what);
		json_decref(root);
		return;
	}
	int chunk = (int)json_integer_value(json_object_get(root, "chunk_tokens"));
	json_t *texts = json_object_get(root, "texts");
	size_t ti;
	json_t *t;
	json_array_foreach(texts, ti, t) {
		const char *name = json_string_value(json_object_get(t, "name"));
		int n;
		int32_t *ids = int_array(json_object_get(t, "ids"), &n);
		double ref = json_number_value(json_object_get(t, "total_nll"));
		double nll;
		int64_t count;
		float *lp = malloc((size_t)n * sizeof *lp);
		/* ids[0] is BOS; the scheme scores the text tokens after it */
		enum llm_status s = llm_perplexity(e, ids + 1, n - 1, chunk, ids[0], &nll, &count, lp);
		if (s) {
			check(0, "perplexity %s %s: %s", what, name, llm_errmsg());
		} else if (check_ref) {
			double *rlp = num_array(json_object_get(t, "logprobs"));
			double md = 0;
			for (int i = 0; i < n - 1; i++)
				if (fabs(lp[i] - rlp[i]) > md)
					md = fabs(lp[i] - rlp[i]);
			free(rlp);
			double rel = fabs(nll - ref) / ref;
			check(rel <= NLL_RTOL && count == json_integer_value(json_object_get(t, "token_count")),
			      "perplexity %s %s: NLL %.6f vs run.c %.6f (rel %.2g <= %g), %lld tokens, ppl %.4f, max |dlogprob| %.2g",
			      what, name, nll, ref, rel, NLL_RTOL, (long long)count, exp(nll / (double)count), md);
		} else {
			check_diag("perplexity %s %s: NLL %.6f (F32 run.c %.6f, %+.2f%%), ppl %.4f", what, name, nll, ref,
			           100.0 * (nll - ref) / ref, exp(nll / (double)count));
		}
		if (!s && ti == 0 && nll_out)
			*nll_out = nll;
		free(lp);
		free(ids);
	}
	llm_engine_close(e);
	json_decref(root);
}

/* ---- bad input --------------------------------------------------------- */

static void test_bad_input(void)
{
	struct llm_engine_opts o = LLM_ENGINE_OPTS_DEFAULT;
	o.n_ctx = 64;
	o.n_threads = 1;
	struct llm_engine *e = NULL;
	if (!check(llm_engine_open(&e, model_dir, &o) == LLM_OK, "open with a 64-token context"))
		return;
	int32_t longp[65];
	for (int i = 0; i < 65; i++)
		longp[i] = i ? 300 : 1;
	struct llm_sched_opts so = { .max_running = 4, .max_batch_tokens = 64 };
	struct llm_sched *sch = NULL;
	if (!check(llm_sched_open(&sch, e, &so) == LLM_OK, "a scheduler over it")) {
		llm_engine_close(e);
		return;
	}
	struct llm_request r = { .prompt = longp, .n_prompt = 65, .params = LLM_SAMPLE_DEFAULT, .on_token = NULL, .user = NULL };
	int id;
	enum llm_status s = llm_sched_add(sch, &r, &id);
	check(s == LLM_ERR_RANGE && strstr(llm_errmsg(), "exceeds the context"),
	      "a prompt longer than the context is refused: %s", llm_errmsg());
	/* vLLM's rule: a prompt must leave room for one new token */
	r.n_prompt = 64;
	s = llm_sched_add(sch, &r, &id);
	check(s == LLM_ERR_RANGE && strstr(llm_errmsg(), "prompt of 64 tokens + max_tokens 0 exceeds the context of 64"),
	      "a prompt as long as the context is refused: %s", llm_errmsg());
	r.n_prompt = 60;
	r.params.max_tokens = 5;
	s = llm_sched_add(sch, &r, &id);
	check(s == LLM_ERR_RANGE && strstr(llm_errmsg(), "prompt of 60 tokens + max_tokens 5 exceeds the context of 64"),
	      "prompt + max_tokens over the context is refused: %s", llm_errmsg());
	r.params.max_tokens = 0;
	int32_t bad[3] = { 1, 512, 3 };
	r.prompt = bad;
	r.n_prompt = 3;
	s = llm_sched_add(sch, &r, &id);
	check(s == LLM_ERR_RANGE && strstr(llm_errmsg(), "512"), "an unknown token id is refused: %s", llm_errmsg());
	bad[1] = -1;
	s = llm_sched_add(sch, &r, &id);
	check(s == LLM_ERR_RANGE, "a negative token id is refused: %s", llm_errmsg());
	/* the low-level forward checks too */
	struct llm_kv *kv = llm_engine_kv(e);
	int seq;
	llm_kv_seq_new(kv, &seq);
	int32_t tok[2] = { 1, 9999 }, pos[2] = { 0, 1 }, sq[2] = { seq, seq };
	struct llm_batch b = { 2, tok, pos, sq, NULL, NULL };
	const float *lg;
	int n_out;
	s = llm_engine_forward(e, &b, &lg, &n_out);
	check(s == LLM_ERR_RANGE && llm_kv_seq_len(kv, seq) == 0, "forward refuses id 9999 and leaves the cache: %s", llm_errmsg());
	tok[1] = 5;
	pos[1] = 2;
	s = llm_engine_forward(e, &b, &lg, &n_out);
	check(s == LLM_ERR_USAGE && llm_kv_seq_len(kv, seq) == 0, "forward refuses a gap in positions: %s", llm_errmsg());
	pos[1] = 1;
	s = llm_engine_forward(e, &b, &lg, &n_out);
	check(s == LLM_OK && n_out == 1 && llm_kv_seq_len(kv, seq) == 2, "then the corrected batch runs");
	llm_kv_seq_free(kv, seq);
	r.prompt = longp;
	r.n_prompt = 2;
	r.params.n_stop = 1;
	r.params.stop[0] = "x";
	s = llm_sched_add(sch, &r, &id);
	check(s == LLM_ERR_USAGE, "stop strings without a detokenizer are refused: %s", llm_errmsg());
	/* max_tokens 0: up to the context, n_ctx - prompt tokens */
	struct collect c;
	memset(&c, 0, sizeof c);
	r = (struct llm_request){ .prompt = longp, .n_prompt = 60, .params = LLM_SAMPLE_DEFAULT, .on_token = on_token, .user = &c };
	r.params.temperature = 0;
	r.params.ignore_eos = 1;
	s = test_sched_run(e, &r, 1, NULL);
	check(s == LLM_OK && c.n == 4 && c.finish == LLM_FINISH_LENGTH,
	      "max_tokens 0 with a 60-token prompt in a 64 context: 4 tokens, finish length (%d, %s)",
	      c.n, llm_finish_name(c.finish));
	llm_sched_close(sch);
	llm_engine_close(e);

	/* corrupt checkpoints */
	char d[1200], f[1300];
	snprintf(d, sizeof d, "%s/corrupt", test_tmpdir());
	mkdir(d, 0755);
	size_t len;
	char src[1200];
	snprintf(src, sizeof src, "%s/model.safetensors", model_dir);
	char *buf = test_read_file(src, &len);
	snprintf(src, sizeof src, "%s/config.json", model_dir);
	size_t clen;
	char *cfg = test_read_file(src, &clen);
	snprintf(f, sizeof f, "%s/config.json", d);
	FILE *fp = fopen(f, "w");
	fwrite(cfg, 1, clen, fp);
	fclose(fp);
	snprintf(f, sizeof f, "%s/model.safetensors", d);
	fp = fopen(f, "w");
	fwrite(buf, 1, len / 2, fp);         /* truncated */
	fclose(fp);
	s = llm_engine_open(&e, d, &o);
	check(s != LLM_OK && e == NULL && strstr(llm_errmsg(), "model.safetensors"),
	      "a truncated checkpoint is refused: %s", llm_errmsg());
	/* a config the engine does not support, with the field named */
	const char *edits[][3] = {
		{ "\"hidden_act\": \"silu\"", "\"hidden_act\": \"gelu\"", "hidden_act" },
		{ "\"rope_scaling\": null", "\"rope_scaling\": {\"rope_type\": \"dynamic\", \"factor\": 4}", "rope_scaling" },
		{ "\"model_type\": \"llama\"", "\"model_type\": \"phi3\"", "model_type: 'phi3'" },
		{ "\"num_key_value_heads\": 4", "\"num_key_value_heads\": 3", "num_key_value_heads" },
		{ "\"hidden_size\": 64", "\"hidden_size\": 96", "shape" },
	};
	fp = fopen(f, "w");
	fwrite(buf, 1, len, fp);
	fclose(fp);
	for (size_t k = 0; k < sizeof edits / sizeof *edits; k++) {
		char *at = strstr(cfg, edits[k][0]);
		if (!at) {
			check(0, "config edit %s", edits[k][2]);
			continue;
		}
		snprintf(f, sizeof f, "%s/config.json", d);
		fp = fopen(f, "w");
		fwrite(cfg, 1, (size_t)(at - cfg), fp);
		fputs(edits[k][1], fp);
		fputs(at + strlen(edits[k][0]), fp);
		fclose(fp);
		s = llm_engine_open(&e, d, &o);
		check(s != LLM_OK && strstr(llm_errmsg(), edits[k][2]), "config with %s is refused: %s",
		      edits[k][1], llm_errmsg());
	}
	free(cfg);
	free(buf);
}

/* ---- quantized checkpoints ----------------------------------------------- */

static int quantize(const char *args, const char *out)
{
	char cmd[3000];
	const char *bin = getenv("LLM_BIN");
	snprintf(cmd, sizeof cmd, "%s/llm-quantize %s %s %s 2>&1", bin && *bin ? bin : "bin", args, model_dir, out);
	int rc = system(cmd);
	if (rc)
		check_diag("'%s' failed (%d)", cmd, rc);
	return rc == 0;
}

/* The F32 checkpoint with every F32 tensor rounded to BF16 (through the
 * library's checkpoint writer): a true BF16 model for the BF16 kernels. */
static int write_bf16(const char *out)
{
	struct llm_ckpt ck;
	if (llm_ckpt_open(&ck, model_dir))
		return 0;
	struct llm_tensor *d = calloc(ck.n_tensor, sizeof *d);
	for (size_t i = 0; i < ck.n_tensor; i++) {
		d[i] = *ck.tensors[i];
		if (d[i].dtype == LLM_DTYPE_F32) {
			d[i].dtype = LLM_DTYPE_BF16;
			d[i].nbytes /= 2;
		}
		d[i].data = NULL;
	}
	struct llm_ckpt_writer *w;
	struct llm_ckpt_write_opts wo = { .force = 1 };
	int ok = llm_ckpt_write_begin(&w, out, d, ck.n_tensor, ck.aux, ck.n_aux, &wo) == LLM_OK;
	long k;
	while (ok && (k = llm_ckpt_write_next(w)) >= 0) {
		const struct llm_tensor *t = ck.tensors[k];
		if (t->dtype == LLM_DTYPE_F32) {
			size_t n = (size_t)llm_tensor_numel(t);
			uint16_t *b = malloc(n * 2);
			llm_from_f32(b, LLM_DTYPE_BF16, t->data, n);
			ok = llm_ckpt_write_data(w, b, n * 2) == LLM_OK;
			free(b);
		} else {
			ok = llm_ckpt_write_data(w, t->data, t->nbytes) == LLM_OK;
		}
	}
	if (ok)
		ok = llm_ckpt_write_commit(w) == LLM_OK;
	else
		llm_ckpt_write_abort(w);
	if (!ok)
		check_diag("bf16 checkpoint: %s", llm_errmsg());
	free(d);
	llm_ckpt_close(&ck);
	return ok;
}

static void report_model(const char *path, const char *name, enum llm_cpu_isa isa)
{
	struct llm_engine_opts o = LLM_ENGINE_OPTS_DEFAULT;
	o.n_threads = 1;
	o.isa = isa;
	o.max_seqs = 1;
	struct llm_engine *e = NULL;
	if (!check(llm_engine_open(&e, path, &o) == LLM_OK, "open %s (%s kernels)", name, llm_cpu_isa_name(isa)))
		return;
	struct collect *c = calloc((size_t)n_P, sizeof *c);
	int ok = 1;
	for (int i = 0; i < n_P && ok; i++)
		ok = run_greedy(e, i, 1, &c[i]);
	llm_engine_close(e);
	char what[128];
	snprintf(what, sizeof what, "%s (%s)", name, llm_cpu_isa_name(isa));
	if (ok)
		report_run(what, c, NULL, NULL, 1);
	free(c);
}

static void test_bf16(void)
{
	char out[1300];
	snprintf(out, sizeof out, "%s/bf16", test_tmpdir());
	if (!check(write_bf16(out), "write a BF16 copy of stories260K"))
		return;
	enum llm_cpu_isa best = llm_cpu_isa_detect();
	report_model(out, "bf16 weights", LLM_ISA_AVX512 <= best ? LLM_ISA_AVX512 : best);
	if (best >= LLM_ISA_AVX512BF16)
		report_model(out, "bf16 weights", LLM_ISA_AVX512BF16);
	double nll = -1;
	perplexity_of(out, "bf16", LLM_DTYPE_F32, &nll, 0);
}

/* At the avx512bf16 level an E4M3 element is bf16(code * scale), the value
 * llm-quantize --dequantize --dtype bf16 writes: the FP8 checkpoint and its
 * dequantized BF16 form give the same tokens and log-probabilities, bit for
 * bit (C: the FP8 runs of every prompt, whose plain lm_head --lm-head auto
 * quantized at load; the BF16 form's is quantized so too). */
static void same_as_dequantized(const char *fp8, const char *name, const struct collect *c)
{
	if (llm_cpu_isa_capped(NULL) < LLM_ISA_AVX512BF16) {   /* the engine's level: LLM_CPU_ISA caps it */
		check_skip("this CPU lacks AVX512_BF16 or LLM_CPU_ISA caps it", "%s = its dequantized BF16 form", name);
		return;
	}
	char deq[1400], cmd[4000];
	const char *bin = getenv("LLM_BIN");
	snprintf(deq, sizeof deq, "%s-bf16", fp8);
	snprintf(cmd, sizeof cmd, "%s/llm-quantize -q --dequantize --dtype bf16 %s %s 2>&1",
	         bin && *bin ? bin : "bin", fp8, deq);
	if (!check(system(cmd) == 0, "llm-quantize --dequantize --dtype bf16 %s", name))
		return;
	struct llm_engine *e = open_engine_head(deq, LLM_DTYPE_F32, 0, 1, LLM_HEAD_FP8);
	if (!check(e != NULL, "open %s dequantized", name))
		return;
	struct collect *d = calloc((size_t)n_P, sizeof *d);
	int ok = 1, same = 1;
	for (int i = 0; i < n_P && ok; i++) {
		ok = run_greedy(e, i, 1, &d[i]);
		same &= ok && d[i].n == c[i].n && !memcmp(d[i].ids, c[i].ids, (size_t)c[i].n * sizeof *c[i].ids) &&
		        !memcmp(d[i].lp, c[i].lp, (size_t)c[i].n * sizeof *c[i].lp);
	}
	llm_engine_close(e);
	free(d);
	check(ok && same, "%s at avx512bf16: tokens and log-probs of every prompt equal, bit for bit, "
	      "those of its dequantized BF16 checkpoint", name);
}

/* --weight-pages: the weights copied into huge pages give the same ids and
 * log-probs, bit for bit, as the file mapping in place; the copy holds
 * every weight and scale, and a tied lm_head stays the embedding's. Auto
 * reads the copy in the background and moves to it between two forwards:
 * the first prompt runs while it is read, the others after it took over
 * (llm_engine_weights_settle), all equal to the file mapping's. */
static void same_with_pages(const char *path, const char *name)
{
	struct collect *c[3] = { calloc((size_t)n_P, sizeof **c), calloc((size_t)n_P, sizeof **c),
	                         calloc((size_t)n_P, sizeof **c) };
	int ok = c[0] && c[1] && c[2], placed = 0, moved = -1;
	for (int k = 0; k < 3 && ok; k++) {
		struct llm_engine_opts o = LLM_ENGINE_OPTS_DEFAULT;
		o.weight_pages = k == 2 ? LLM_WEIGHTS_AUTO : k ? LLM_WEIGHTS_HUGE : LLM_WEIGHTS_MAP;
		o.max_seqs = n_P;
		o.max_batch_tokens = 64;
		struct llm_engine *e = NULL;
		if (llm_engine_open(&e, path, &o)) {
			check_diag("open %s: %s", name, llm_errmsg());
			ok = 0;
			break;
		}
		const struct llm_model *m = llm_engine_model(e);
		const uint8_t *lo = m->wmap, *hi = lo ? lo + m->wmap_len : NULL;
		int in = 0, n = 0;
		const struct llm_weight *ws[] = { &m->embed, &m->norm, &m->lm_head, &m->layers[0].wq,
		                                  &m->layers[0].attn_norm, &m->layers[m->cfg.n_layer - 1].w_down };
		for (size_t i = 0; i < sizeof ws / sizeof *ws; i++, n++) {
			const uint8_t *d = ws[i]->data, *sc = (const uint8_t *)ws[i]->scale;
			in += lo && d >= lo && d < hi && (!sc || (sc >= lo && sc < hi));
		}
		if (k == 0)
			placed = !m->wmap;
		else if (k == 1)
			placed = placed && in == n && (!m->cfg.tied || m->lm_head.data == m->embed.data ||
			                               (m->lm_head.dtype == LLM_DTYPE_E4M3 && m->embed.dtype != LLM_DTYPE_E4M3));
		if (k < 2) {
			ok = run_greedy(e, 0, n_P, c[k]);
		} else {
			int was_mapped = !m->wmap;
			ok = run_greedy(e, 0, 1, c[k]);
			llm_engine_weights_settle(e, 1);
			moved = was_mapped && !!m->wmap == llm_thp_available();
			ok = ok && run_greedy(e, 1, n_P - 1, c[k] + 1);
		}
		llm_engine_close(e);
	}
	int same = 0, same_auto = 0;
	for (int i = 0; ok && i < n_P; i++) {
		same += c[0][i].n == c[1][i].n && !memcmp(c[0][i].ids, c[1][i].ids, (size_t)c[0][i].n * 4)
		        && !memcmp(c[0][i].lp, c[1][i].lp, (size_t)c[0][i].n * 4);
		same_auto += c[0][i].n == c[2][i].n && !memcmp(c[0][i].ids, c[2][i].ids, (size_t)c[0][i].n * 4)
		             && !memcmp(c[0][i].lp, c[2][i].lp, (size_t)c[0][i].n * 4);
	}
	check(ok && placed, "%s: --weight-pages huge copies every weight and scale out of the file mapping "
	      "(map leaves them in it)", name);
	check(ok && same == n_P, "%s: weights in huge pages give the ids and log-probs of the file mapping, "
	      "bit for bit: %d/%d prompts", name, same, n_P);
	check(ok && moved == 1, "%s: --weight-pages auto opens on the file mapping and moves to the huge-page "
	      "copy read in the background (THP %s)", name, llm_thp_available() ? "on" : "off: stays mapped");
	check(ok && same_auto == n_P, "%s: auto, one prompt while the copy is read and the rest after it took "
	      "over, gives the file mapping's ids and log-probs bit for bit: %d/%d prompts", name, same_auto, n_P);
	free(c[0]);
	free(c[1]);
	free(c[2]);
}

static void test_quantized(void)
{
	char q[1200];
	const char *bin = getenv("LLM_BIN");
	snprintf(q, sizeof q, "%s/llm-quantize", bin && *bin ? bin : "bin");
	if (access(q, X_OK)) {
		check_skip("no llm-quantize built", "FP8 checkpoints");
		return;
	}
	/* the first three: llm-quantize's default set, the decoder projections
	 * only, so that their dequantized BF16 form is the same model at
	 * avx512bf16 (the embedding lookup of an FP8 table gives the f32 code *
	 * scale, its BF16 form the bf16 of it); the last: --fp8-vocab, the tied
	 * embedding (so the lm_head) in FP8 as well */
	static const struct { const char *args, *name; } v[] = {
		{ "--block 128x128", "fp8-128x128" },
		{ "--block 1x128", "fp8-1x128" },
		{ "--block 1xK", "fp8-1xK" },
		{ "--block 128x128 --fp8-vocab", "fp8-128x128+emb" },
	};
	for (size_t k = 0; k < sizeof v / sizeof *v; k++) {
		char out[1300];
		snprintf(out, sizeof out, "%s/%s", test_tmpdir(), v[k].name);
		if (!check(quantize(v[k].args, out), "llm-quantize %s", v[k].args))
			continue;
		struct llm_engine *e = open_engine(out, LLM_DTYPE_F32, 0, 1);
		if (!check(e != NULL, "open %s", v[k].name))
			continue;
		struct collect *c = calloc((size_t)n_P, sizeof *c);
		int ok = 1;
		for (int i = 0; i < n_P && ok; i++)
			ok = run_greedy(e, i, 1, &c[i]);
		llm_engine_close(e);
		if (ok)
			report_run(v[k].name, c, NULL, NULL, 1);
		if (ok && k < 3)       /* +emb: the embedding lookup is not a matmul; it keeps f32 */
			same_as_dequantized(out, v[k].name, c);
		if (k == 0 || k == 3)
			same_with_pages(out, v[k].name);
		free(c);
		double nll = -1;
		perplexity_of(out, v[k].name, LLM_DTYPE_F32, &nll, 0);
		if ((k == 0 || k == 3) && nll > 0 && f32_story_nll > 0) {
			double r = exp((nll - f32_story_nll) / 501.0) - 1;   /* ppl ratio - 1 */
			check(fabs(r) <= 0.05, "%s perplexity within 5%% of F32 on the story (%+.2f%%)", v[k].name, 100 * r);
		}
	}
}

/* rope_scaling linear and yarn on a random model (llm-quantize --random):
 * the engine's RoPE frequencies against Hugging Face's definitions written
 * out here (_compute_linear_scaling_rope_parameters: f / factor;
 * _compute_yarn_parameters: the correction range of beta_fast 32 and
 * beta_slow 1 rotations at the original context, floored and ceiled, a
 * linear ramp between f / factor and f), and the attention factor
 * 0.1 ln(factor) + 1 (or attention_factor) on cos and sin, which the
 * engine folds into the score divisor as its square. */
static void test_rope_scaling(void)
{
	const char *bin = getenv("LLM_BIN");
	char q[1200], cfg[1300], out[1300], cmd[4000];
	snprintf(q, sizeof q, "%s/llm-quantize", bin && *bin ? bin : "bin");
	if (access(q, X_OK)) {
		check_skip("no llm-quantize built", "rope_scaling linear and yarn");
		return;
	}
	static const char *scal[3] = {
		"{\"rope_type\": \"linear\", \"factor\": 4.0}",
		"{\"rope_type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 128}",
		"{\"type\": \"yarn\", \"factor\": 4.0, \"original_max_position_embeddings\": 128, \"attention_factor\": 1.0}",
	};
	for (int k = 0; k < 3; k++) {
		snprintf(cfg, sizeof cfg, "%s/rs%d.json", test_tmpdir(), k);
		FILE *f = fopen(cfg, "w");
		fprintf(f, "{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 96,"
		        " \"num_hidden_layers\": 1, \"num_attention_heads\": 2, \"num_key_value_heads\": 1,"
		        " \"vocab_size\": 64, \"max_position_embeddings\": 512, \"rope_theta\": 10000.0,"
		        " \"rope_scaling\": %s}", scal[k]);
		fclose(f);
		snprintf(out, sizeof out, "%s/rs%d", test_tmpdir(), k);
		snprintf(cmd, sizeof cmd, "%s --random %s --dtype f32 --seed 5 %s 2>&1", q, cfg, out);
		struct llm_model m;
		if (!check(system(cmd) == 0 && llm_model_open(&m, out) == LLM_OK, "rope_scaling %d: a random model opens", k)) {
			check_diag("%s", llm_errmsg());
			continue;
		}
		int d = 32, bad = 0;
		/* yarn's correction dims: d ln(128 / (2 pi r)) / (2 ln 10000), r = 32 and 1 */
		double lo = floor(d * log(128 / (2 * M_PI * 32)) / (2 * log(10000.0)));
		double hi = ceil(d * log(128 / (2 * M_PI * 1)) / (2 * log(10000.0)));
		lo = lo < 0 ? 0 : lo;
		hi = hi > d - 1 ? d - 1 : hi;
		for (int j = 0; j < d / 2; j++) {
			double f0 = 1.0 / pow(10000.0, 2.0 * j / d), want = f0 / 4;
			if (k > 0) {
				double ramp = (j - lo) / (hi - lo), ex = 1 - (ramp < 0 ? 0 : ramp > 1 ? 1 : ramp);
				want = f0 / 4 * (1 - ex) + f0 * ex;
			}
			bad += fabs(m.inv_freq[j] - want) > 1e-5 * want;
		}
		double af = k == 1 ? 0.1 * log(4.0) + 1 : 1.0;
		double div = llm_config_attn_div(&m.cfg), wdiv = sqrt(32.0) / (af * af);
		check(!bad && fabs(div - wdiv) < 1e-5 * wdiv, "rope_scaling %s: %d of 16 frequencies off, score divisor %.6f "
		      "(want %.6f)", scal[k], bad, div, wdiv);
		if (k == 1) {
			/* a backend without a family op (as CUDA lacks them) refuses the
			 * model before any compute, naming the op */
			struct llm_backend *be;
			if (llm_backend_open("cpu", NULL, &be) == LLM_OK) {
				check(llm_model_check_backend(&m, be) == LLM_OK, "qwen2 with yarn: the cpu backend runs it");
				struct llm_backend_ops ops = *be->ops;
				const struct llm_backend_ops *real = be->ops;
				ops.add_bias = NULL;
				be->ops = &ops;
				enum llm_status s = llm_model_check_backend(&m, be);
				check(s == LLM_ERR_UNSUPPORTED && strstr(llm_errmsg(), "add_bias"), "without add_bias: %s",
				      llm_errmsg());
				ops.add_bias = real->add_bias;
				ops.attention_ex = NULL;
				s = llm_model_check_backend(&m, be);
				check(s == LLM_ERR_UNSUPPORTED && strstr(llm_errmsg(), "attention_ex"), "without attention_ex: %s",
				      llm_errmsg());
				be->ops = real;
				llm_backend_close(be);
			}
		}
		llm_model_close(&m);
	}
}

/* A random Llama 3 style model (llm-quantize --random): untied lm_head,
 * GQA, explicit head_dim, rope_scaling llama3. Checks the scaled RoPE
 * frequencies band by band (Hugging Face _compute_llama3_parameters) and
 * batch invariance on its F32 and FP8 forms. */
static void test_llama3_random(void)
{
	const char *bin = getenv("LLM_BIN");
	char q[1200], cfg[1300], out[1300], cmd[4000];
	snprintf(q, sizeof q, "%s/llm-quantize", bin && *bin ? bin : "bin");
	if (access(q, X_OK)) {
		check_skip("no llm-quantize built", "random llama3 model");
		return;
	}
	snprintf(cfg, sizeof cfg, "%s/l3.json", test_tmpdir());
	FILE *f = fopen(cfg, "w");
	fputs("{\"model_type\": \"llama\", \"hidden_size\": 96, \"intermediate_size\": 160,"
	      " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"num_key_value_heads\": 1,"
	      " \"head_dim\": 32, \"vocab_size\": 300, \"max_position_embeddings\": 512,"
	      " \"rope_theta\": 500000.0, \"rms_norm_eps\": 1e-05, \"hidden_act\": \"silu\","
	      " \"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": [2, 3],"
	      " \"rope_scaling\": {\"factor\": 32.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,"
	      " \"original_max_position_embeddings\": 64, \"rope_type\": \"llama3\"}}", f);
	fclose(f);
	static const char *dt[2] = { "f32", "fp8" };
	for (int k = 0; k < 2; k++) {
		snprintf(out, sizeof out, "%s/l3-%s", test_tmpdir(), dt[k]);
		snprintf(cmd, sizeof cmd, "%s --random %s --dtype %s --seed 5 %s 2>&1", q, cfg, dt[k], out);
		if (!check(system(cmd) == 0, "llm-quantize --random (llama3 rope, untied, %s)", dt[k]))
			continue;
		struct llm_model m;
		if (!check(llm_model_open(&m, out) == LLM_OK, "open the random %s model", dt[k])) {
			check_diag("%s", llm_errmsg());
			continue;
		}
		int bands[3] = { 0 }, bad = 0;
		for (int j = 0; j < 16; j++) {
			double f0 = 1.0 / pow(500000.0, 2.0 * j / 32.0), wl = 2 * M_PI / f0, got = m.inv_freq[j];
			if (wl < 64 / 4.0) {
				bands[0]++;
				bad += fabs(got - f0) > 1e-6 * f0;
			} else if (wl > 64 / 1.0) {
				bands[1]++;
				bad += fabs(got - f0 / 32) > 1e-6 * f0 / 32;
			} else {
				bands[2]++;
				bad += !(got >= f0 / 32 * (1 - 1e-6) && got <= f0 * (1 + 1e-6));
			}
		}
		check(!bad && bands[0] && bands[1] && bands[2], "llama3 rope: %d high-frequency kept, %d low divided by 32, "
		      "%d smoothed in between", bands[0], bands[1], bands[2]);
		check(m.lm_head.data != m.embed.data && m.cfg.n_eos == 2, "untied lm_head, two EOS ids");
		llm_model_close(&m);
		/* batch invariance on this model: 3 prompts alone and together */
		struct llm_engine_opts o = LLM_ENGINE_OPTS_DEFAULT;
		o.n_threads = 2;
		o.max_batch_tokens = 16;
		struct llm_engine *e;
		if (!check(llm_engine_open(&e, out, &o) == LLM_OK, "engine on the random %s model", dt[k]))
			continue;
		int32_t pr[3][40];
		for (int i = 0; i < 3; i++)
			for (int t = 0; t < 40; t++)
				pr[i][t] = t ? 4 + (i * 37 + t * 11) % 290 : 1;
		struct collect c1[3], c3[3];
		struct llm_sample_params sp = LLM_SAMPLE_DEFAULT;
		sp.temperature = 0;
		sp.max_tokens = 30;
		sp.ignore_eos = 1;
		struct llm_request r3[3];
		for (int i = 0; i < 3; i++) {
			memset(&c1[i], 0, sizeof c1[i]);
			struct llm_request r = { .prompt = pr[i], .n_prompt = 10 + 15 * i, .params = sp, .on_token = on_token, .user = &c1[i] };
			test_sched_run(e, &r, 1, NULL);
		}
		for (int i = 0; i < 3; i++) {
			memset(&c3[i], 0, sizeof c3[i]);
			r3[i] = (struct llm_request){ .prompt = pr[i], .n_prompt = 10 + 15 * i, .params = sp, .on_token = on_token, .user = &c3[i] };
		}
		test_sched_run(e, r3, 3, NULL);
		int same = 1;
		for (int i = 0; i < 3; i++)
			same &= c1[i].n == 30 && c3[i].n == 30 && !memcmp(c1[i].ids, c3[i].ids, 30 * 4)
			        && !memcmp(c1[i].lp, c3[i].lp, 30 * 4);
		check(same, "random %s model: 3 prompts alone and together, same ids and log-probs", dt[k]);
		llm_engine_close(e);
	}
}

/* The sliding-window rules of config.c, layer by layer: Qwen2's
 * use_sliding_window (layers from max_window_layers on, default 28; or as
 * layer_types says), Mistral's every layer, Gemma 2's even layers; which
 * leave every layer windowed (the KV cache then releases blocks). */
static void test_window_rules(void)
{
	static const struct {
		const char *fields;     /* added to a 4-layer config of model_type TYPE */
		const char *type;
		const char *want;       /* each layer's window, then the all-layer one */
	} t[] = {
		{ "\"use_sliding_window\": true, \"sliding_window\": 64, \"max_window_layers\": 2", "qwen2", "0 0 64 64 / 0" },
		{ "\"use_sliding_window\": true, \"sliding_window\": 64, \"max_window_layers\": 0", "qwen2", "64 64 64 64 / 64" },
		{ "\"use_sliding_window\": true, \"sliding_window\": 64", "qwen2", "0 0 0 0 / 0" },   /* 28: none of 4 */
		{ "\"use_sliding_window\": true, \"max_window_layers\": 1", "qwen2", "0 4096 4096 4096 / 0" },
		{ "\"use_sliding_window\": false, \"sliding_window\": 64, \"max_window_layers\": 0", "qwen2", "0 0 0 0 / 0" },
		{ "\"use_sliding_window\": true, \"sliding_window\": null, \"max_window_layers\": 0", "qwen2", "0 0 0 0 / 0" },
		{ "\"use_sliding_window\": true, \"sliding_window\": 9000, \"max_window_layers\": 0", "qwen2", "0 0 0 0 / 0" },
		{ "\"use_sliding_window\": true, \"sliding_window\": 64, \"max_window_layers\": 0, \"layer_types\": "
		  "[\"full_attention\", \"sliding_attention\", \"full_attention\", \"sliding_attention\"]", "qwen2", "0 64 0 64 / 0" },
		{ "\"sliding_window\": 64", "mistral", "64 64 64 64 / 64" },
		{ "\"sliding_window\": 64", "gemma2", "64 0 64 0 / 0" },
	};
	for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
		char js[1024], got[128];
		snprintf(js, sizeof js, "{\"model_type\": \"%s\", \"hidden_size\": 64, \"intermediate_size\": 96, "
		         "\"num_hidden_layers\": 4, \"num_attention_heads\": 2, \"vocab_size\": 64, "
		         "\"max_position_embeddings\": 8192, %s}", t[i].type, t[i].fields);
		struct llm_config c;
		if (!check(llm_config_parse(&c, js, strlen(js), "config.json") == LLM_OK, "%s with %s parses: %s",
		           t[i].type, t[i].fields, llm_errmsg()))
			continue;
		int at = 0;
		for (int l = 0; l < 4; l++)
			at += snprintf(got + at, sizeof got - (size_t)at, "%d ", llm_config_window(&c, l));
		snprintf(got + at, sizeof got - (size_t)at, "/ %d", llm_config_window_all(&c));
		check(!strcmp(got, t[i].want), "%s with %s: windows %s (want %s)", t[i].type, t[i].fields, got, t[i].want);
	}
	static const char *bad[][2] = {
		{ "\"use_sliding_window\": 1", "use_sliding_window: not a boolean" },
		{ "\"use_sliding_window\": true, \"max_window_layers\": -1", "max_window_layers" },
		{ "\"use_sliding_window\": true, \"layer_types\": [\"full_attention\"]", "layer_types: not an array of 4" },
		{ "\"use_sliding_window\": true, \"layer_types\": [\"full_attention\", \"x\", \"full_attention\", "
		  "\"full_attention\"]", "layer_types[1]" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		char js[1024];
		snprintf(js, sizeof js, "{\"model_type\": \"qwen2\", \"hidden_size\": 64, \"intermediate_size\": 96, "
		         "\"num_hidden_layers\": 4, \"num_attention_heads\": 2, \"vocab_size\": 64, %s}", bad[i][0]);
		struct llm_config c;
		check(llm_config_parse(&c, js, strlen(js), "config.json") != LLM_OK && strstr(llm_errmsg(), bad[i][1])
		      && !strchr(llm_errmsg(), '\n'), "qwen2 with %s is refused in one line naming it: %s", bad[i][0],
		      llm_errmsg());
	}
	/* Qwen3Config has Qwen2Config's rule; Qwen3-MoE's config class has no
	 * max_window_layers, so it stays refused */
	const char *q3 = "{\"model_type\": \"qwen3\", \"hidden_size\": 64, \"intermediate_size\": 96, \"num_hidden_layers\": 4,"
	                 " \"num_attention_heads\": 2, \"vocab_size\": 64, \"use_sliding_window\": true, \"sliding_window\": 16,"
	                 " \"max_window_layers\": 3}";
	struct llm_config c;
	int ok = llm_config_parse(&c, q3, strlen(q3), "config.json") == LLM_OK;
	check(ok && llm_config_window(&c, 2) == 0 && llm_config_window(&c, 3) == 16 && llm_config_window_all(&c) == 0,
	      "qwen3 with use_sliding_window true, max_window_layers 3 of 4: layer 3 windowed (16), 2 global "
	      "(%d, %d): %s", ok ? llm_config_window(&c, 3) : -1, ok ? llm_config_window(&c, 2) : -1,
	      ok ? "parsed" : llm_errmsg());
	const char *q3m = "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"intermediate_size\": 96,"
	                  " \"moe_intermediate_size\": 32, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
	                  " \"num_hidden_layers\": 4, \"num_attention_heads\": 2, \"vocab_size\": 64,"
	                  " \"use_sliding_window\": true}";
	check(llm_config_parse(&c, q3m, strlen(q3m), "config.json") == LLM_ERR_UNSUPPORTED
	      && strstr(llm_errmsg(), "use_sliding_window: true is not supported for qwen3_moe"),
	      "qwen3_moe with use_sliding_window true is refused: %s", llm_errmsg());
}

/* A mixture of experts (llm-quantize --random of a small Qwen3-MoE config
 * whose layer 1 is dense by mlp_only_layers): its MoE fields, each layer's
 * weights (router and experts, or the dense MLP), --plan's expert bytes, a
 * refusal of bad MoE fields naming them, and a backend other than the cpu
 * refusing it at llm_model_check_backend in one line (the routing runs on
 * the host). */
static void test_moe(void)
{
	const char *bin = getenv("LLM_BIN");
	char q[1200], cfg[1300], out[1300], cmd[4000];
	snprintf(q, sizeof q, "%s/llm-quantize", bin && *bin ? bin : "bin");
	if (access(q, X_OK)) {
		check_skip("no llm-quantize built", "a random Qwen3-MoE model");
		return;
	}
	static const char *base = "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"intermediate_size\": 96,"
		" \"moe_intermediate_size\": 32, \"num_hidden_layers\": 3, \"num_attention_heads\": 2,"
		" \"num_key_value_heads\": 1, \"vocab_size\": 64, \"max_position_embeddings\": 128,"
		" \"num_experts\": 6, \"num_experts_per_tok\": 2, %s}";
	snprintf(cfg, sizeof cfg, "%s/moe.json", test_tmpdir());
	FILE *f = fopen(cfg, "w");
	fprintf(f, base, "\"mlp_only_layers\": [1]");
	fclose(f);
	snprintf(out, sizeof out, "%s/moe", test_tmpdir());
	snprintf(cmd, sizeof cmd, "%s --random %s --dtype fp8 --seed 5 %s 2>&1", q, cfg, out);
	struct llm_model m;
	if (!check(system(cmd) == 0 && llm_model_open(&m, out) == LLM_OK, "a random Qwen3-MoE model opens")) {
		check_diag("%s", llm_errmsg());
		return;
	}
	const struct llm_moe_config *e = &m.cfg.moe;
	check(e->n_expert == 6 && e->n_expert_used == 2 && e->d_ff_expert == 32 && !e->norm_topk &&
	      llm_moe_layer(&m.cfg, 0) && !llm_moe_layer(&m.cfg, 1) && llm_moe_layer(&m.cfg, 2),
	      "qwen3_moe: 6 experts, top 2 of 32 columns, norm_topk_prob false (the default), layer 1 dense");
	int ok = 1;
	for (int l = 0; l < 3; l++) {
		const struct llm_layer *L = &m.layers[l];
		if (l == 1) {
			ok &= !L->moe.router.data && L->w_gate.rows == 96 && L->w_down.cols == 96;
			continue;
		}
		ok &= L->moe.router.rows == 6 && L->moe.router.dtype != LLM_DTYPE_E4M3 && !L->w_gate.data;
		for (int x = 0; x < 6; x++)
			ok &= L->moe.expert[3 * x].rows == 32 && L->moe.expert[3 * x + 2].cols == 32 &&
			      L->moe.expert[3 * x + 1].dtype == LLM_DTYPE_E4M3;
	}
	check(ok, "qwen3_moe: layers 0 and 2 hold a plain router and 6 FP8 experts of 32, layer 1 the dense MLP of 96");
	/* 2 layers x 6 experts x 3 matrices of 32 x 64 codes, one scale each (a 128 x 128 block) */
	check(m.expert_bytes == 2 * 6 * 3 * (32 * 64 + 4), "qwen3_moe: %zu expert bytes", m.expert_bytes);
	struct llm_backend *be;
	if (llm_backend_open("cpu", NULL, &be) == LLM_OK) {
		check(llm_model_check_backend(&m, be) == LLM_OK, "qwen3_moe: the cpu backend runs it");
		struct llm_backend_ops ops = *be->ops;
		const struct llm_backend_ops *real = be->ops;
		ops.name = "cuda";
		be->ops = &ops;
		enum llm_status s = llm_model_check_backend(&m, be);
		check(s == LLM_ERR_UNSUPPORTED && strstr(llm_errmsg(), "mixture-of-experts") && !strchr(llm_errmsg(), '\n'),
		      "qwen3_moe: another backend refuses it in one line: %s", llm_errmsg());
		be->ops = real;
		llm_backend_close(be);
	}
	llm_model_close(&m);
	/* bad MoE fields: one line naming the field */
	static const char *bad[][2] = {
		{ "\"num_experts_per_tok\": 7", "num_experts_per_tok" },
		{ "\"norm_topk_prob\": 1", "norm_topk_prob" },
		{ "\"mlp_only_layers\": [3]", "mlp_only_layers" },
		{ "\"decoder_sparse_step\": 0", "decoder_sparse_step" },
	};
	for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
		char js[1024], fld[200];
		snprintf(fld, sizeof fld, "%s", bad[i][0]);
		if (!strncmp(fld, "\"num_experts_per_tok\"", 21))    /* replaces the base's own field */
			snprintf(js, sizeof js, "{\"model_type\": \"qwen3_moe\", \"hidden_size\": 64, \"intermediate_size\": 96,"
			         " \"num_hidden_layers\": 3, \"num_attention_heads\": 2, \"vocab_size\": 64,"
			         " \"num_experts\": 6, %s}", fld);
		else
			snprintf(js, sizeof js, base, fld);
		struct llm_config c;
		enum llm_status st = llm_config_parse(&c, js, strlen(js), "config.json");
		check(st != LLM_OK && strstr(llm_errmsg(), bad[i][1]), "qwen3_moe with %s is refused naming it: %s",
		      bad[i][0], llm_errmsg());
	}
}

int main(void)
{
	const char *models = test_models_dir(), *ref = test_ref_dir();
	test_window_rules();
	if (!models || !ref) {
		check_skip("no models in $LLM_TEST_MODELS or no $LLM_TEST_REF", "stories260K references");
		return check_done();
	}
	snprintf(model_dir, sizeof model_dir, "%s/stories260K", models);
	char f[1200];
	snprintf(f, sizeof f, "%s/model.safetensors", model_dir);
	if (access(f, R_OK) || !load_greedy(ref)) {
		check_skip("stories260K or greedy.jsonl absent", "stories260K references");
		return check_done();
	}
	test_greedy();
	test_batch_invariance(LLM_DTYPE_F32, alone);
	same_with_pages(model_dir, "stories260K");
	test_score();
	perplexity_of(model_dir, "f32", LLM_DTYPE_F32, &f32_story_nll, 1);
	/* the BF16 and FP8 KV caches: greedy agreement and perplexity reported;
	 * FP8 KV perplexity within 1% of F32 KV (the bar), and batch
	 * invariance on it */
	static const enum llm_dtype kvd[2] = { LLM_DTYPE_BF16, LLM_DTYPE_E4M3 };
	for (int k = 0; k < 2 && alone; k++) {
		struct llm_engine *e = open_engine(model_dir, kvd[k], 0, 1);
		struct collect *c = calloc((size_t)n_P, sizeof *c);
		int ok = e != NULL;
		for (int i = 0; i < n_P && ok; i++)
			ok = run_greedy(e, i, 1, &c[i]);
		char what[64];
		snprintf(what, sizeof what, "f32 weights, %s kv", llm_dtype_name(kvd[k]));
		if (ok)
			report_run(what, c, NULL, NULL, 1);
		llm_engine_close(e);
		if (kvd[k] == LLM_DTYPE_E4M3 && check(ok, "fp8 kv: every prompt alone"))
			test_batch_invariance(kvd[k], c);
		free(c);
		double nll = -1;
		perplexity_of(model_dir, what, kvd[k], &nll, 0);
		if (kvd[k] == LLM_DTYPE_E4M3 && f32_story_nll > 0) {
			double r = exp((nll - f32_story_nll) / 501.0) - 1;   /* ppl ratio - 1 */
			check(nll > 0 && fabs(r) <= 0.01, "fp8 kv perplexity within 1%% of f32 kv on the story (%+.3f%%)", 100 * r);
		}
	}
	test_bad_input();
	test_bf16();
	test_quantized();
	test_llama3_random();
	test_rope_scaling();
	test_moe();
	return check_done();
}
