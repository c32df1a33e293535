/* tools/llm-generate.c: offline generation, scoring and perplexity from the
 * shell, and the tokenizer modes (--tokenize, --detokenize,
 * --apply-template) that need only the tokenizer files of -m. The work is in
 * libllm (generate.c: the engine with continuous batching; tokenizer.c,
 * jinja.c); main parses flags, picks one mode from the table below, turns
 * the input into requests and their events into output, and maps status to
 * the exit code (0 ok, 1 runtime error, 2 usage error).
 *
 * Distributed (mpirun -np T*P over a checkpoint partitioned by
 * llm-repartition): rank 0 alone reads the input, runs the mode and writes
 * standard output; the other ranks open the same engine and follow rank
 * 0's steps (generate.h: the step protocol llm-serve uses too). An error on
 * any rank ends the whole job with a message naming the rank. */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <sys/stat.h>
#include <time.h>

#include "llm.h"

struct generate_cfg {
	const char *model;            /* -m: model directory or .safetensors file */
	int tokenize, detokenize, apply_template;
	int no_special;               /* --tokenize: no BOS/EOS */
	int skip_special;             /* --detokenize: leave special tokens out */
	const char *chat_template;    /* FILE overriding the model's template */
	/* generation */
	const char *prompt, *prompt_file, *perplexity, *system, *backend, *kv_dtype, *lora, *weight_pages;
	struct llm_strlist stop, logit_bias;
	int64_t n_predict, min_tokens, n_ctx, threads, top_k, seed, parallel, batch_tokens, n_logprobs, prefix_cache;
	double temp, top_p, min_p, repeat_penalty, freq_penalty, presence_penalty;
	int json, score, chat, show_tokens, ignore_eos;
};

static struct generate_cfg cfg = {
	.n_predict = 128, .temp = 0.8, .top_k = 40, .top_p = 0.95, .min_p = 0.05, .repeat_penalty = 1.0,
	.seed = -1, .parallel = 8, .batch_tokens = 512, .prefix_cache = 8, .backend = "auto", .kv_dtype = "f32", .weight_pages = "auto",
};

static const struct llm_opt opts[] = {
	LLM_STR('m', "model", "DIR", &cfg.model,
	        "model directory or .safetensors file (the tokenizer files suffice for the tokenizer modes)"),
	LLM_FLAG(0, "tokenize", &cfg.tokenize, "read text on stdin, print its token ids as a JSON array"),
	LLM_FLAG(0, "detokenize", &cfg.detokenize, "read a JSON array of token ids on stdin, print the text"),
	LLM_FLAG(0, "apply-template", &cfg.apply_template,
	         "read a chat request (JSON: messages, add_generation_prompt, tools, template_kwargs) on stdin, print the prompt"),
	LLM_FLAG(0, "no-special", &cfg.no_special, "--tokenize: add no special tokens (BOS and the like)"),
	LLM_FLAG(0, "skip-special", &cfg.skip_special, "--detokenize: leave special tokens out of the text"),
	LLM_STR(0, "chat-template", "FILE", &cfg.chat_template, "use the Jinja chat template in FILE instead of the model's"),
	LLM_STR('p', "prompt", "TEXT", &cfg.prompt, "generate from this prompt (else -f, else one prompt per line of stdin)"),
	LLM_STR('f', "file", "FILE", &cfg.prompt_file, "generate from the text of FILE"),
	LLM_INT('n', "n-predict", "N", &cfg.n_predict, "tokens to generate at most (0: up to the context)", 0, INT32_MAX),
	LLM_INT('c', "ctx-size", "N", &cfg.n_ctx, "context length (0: the model's; --perplexity: the window)", 0, INT32_MAX),
	LLM_INT('t', "threads", "N", &cfg.threads, "CPU threads (0: all cores)", 0, 1024),
	LLM_FLOAT(0, "temp", "T", &cfg.temp, "temperature; 0 is greedy", 0, 100),
	LLM_INT(0, "top-k", "K", &cfg.top_k, "sample among the K most likely (0: off)", 0, INT32_MAX),
	LLM_FLOAT(0, "top-p", "P", &cfg.top_p, "nucleus sampling: the smallest set with probability P (1: off)", 0, 1),
	LLM_FLOAT(0, "min-p", "P", &cfg.min_p, "drop tokens below P times the top probability (0: off)", 0, 1),
	LLM_FLOAT(0, "repeat-penalty", "X", &cfg.repeat_penalty, "penalize tokens of the prompt and output (1: off)", 0, 100),
	LLM_FLOAT(0, "frequency-penalty", "X", &cfg.freq_penalty, "minus X times a token's count in the output", -2, 2),
	LLM_FLOAT(0, "presence-penalty", "X", &cfg.presence_penalty, "minus X once a token is in the output", -2, 2),
	LLM_INT(0, "seed", "N", &cfg.seed, "random seed of each request (-1: from the clock)", -1, INT64_MAX),
	LLM_LIST(0, "stop", "TEXT", &cfg.stop, "stop when the output contains TEXT (repeatable)"),
	LLM_FLAG(0, "ignore-eos", &cfg.ignore_eos, "keep generating past the end-of-sequence token"),
	LLM_INT(0, "min-tokens", "N", &cfg.min_tokens, "generate at least N tokens before EOS or a stop can end", 0, INT32_MAX),
	LLM_LIST(0, "logit-bias", "ID=BIAS", &cfg.logit_bias,
	         "add BIAS (-100 to 100; -100 all but bans) to token ID's logit (repeatable)"),
	LLM_INT(0, "logprobs", "N", &cfg.n_logprobs, "--json: the N most likely tokens and log-probs at each position", 0, 20),
	LLM_FLAG(0, "chat", &cfg.chat, "wrap the prompt as a user message in the model's chat template"),
	LLM_STR(0, "system", "TEXT", &cfg.system, "--chat: the system message"),
	LLM_FLAG(0, "show-tokens", &cfg.show_tokens, "print each generated token as 'id<TAB>text' per line"),
	LLM_FLAG(0, "json", &cfg.json, "one JSON object per prompt, in input order"),
	LLM_FLAG(0, "score", &cfg.score, "stdin JSONL {context, continuations}: log-likelihood of each continuation"),
	LLM_STR(0, "perplexity", "FILE", &cfg.perplexity, "token count, negative log-likelihood and perplexity of FILE in windows of -c"),
	LLM_INT(0, "parallel", "N", &cfg.parallel, "sequences generated together", 1, 4096),
	LLM_INT(0, "batch-tokens", "N", &cfg.batch_tokens, "tokens per forward step", 1, 1 << 20),
	LLM_INT(0, "prefix-cache", "N", &cfg.prefix_cache, "prompt prefixes kept for reuse across prompts (0: no prefix caching)", 0, 1024),
	LLM_STR(0, "kv-dtype", "TYPE", &cfg.kv_dtype, "KV cache dtype: f32 or bf16"),
	LLM_STR(0, "weight-pages", "MODE", &cfg.weight_pages, "where the CPU reads the weights: huge (copied into 2 MiB transparent huge pages), map (the checkpoint's file mapping, no copy) or auto (huge on the cpu backend)"),
	LLM_STR(0, "backend", "NAME", &cfg.backend, "compute backend: cpu, cuda or auto"),
	LLM_STR(0, "lora", "DIR", &cfg.lora, "apply the PEFT LoRA adapter in DIR (llm-finetune's output; cpu backend)"),
};

static const struct llm_cli cli = {
	.usage = "llm-generate [options] -m DIR",
	.summary = "Generate text with a model, from -p, -f or one prompt per line of stdin (text or JSONL);\n"
	           "score continuations (--score), measure perplexity (--perplexity), or run the tokenizer\n"
	           "and chat template alone (--tokenize, --detokenize, --apply-template).",
	.example = "llm-generate -m models/stories260K -p 'Once upon a time' -n 64 --temp 0",
	.opts = opts,
	.n_opts = sizeof opts / sizeof *opts,
	.min_pos = 0,
	.max_pos = 0,
};

static enum llm_status write_out(const char *s, size_t n)
{
	if (fwrite(s, 1, n, stdout) != n || fflush(stdout) != 0)
		return llm_fail(LLM_ERR_IO, "stdout: write failed");
	return LLM_OK;
}

/* ---- distributed runs ---------------------------------------------------- */

static struct llm_comm *world;    /* llm_comm_init: one rank unless under mpirun */

static int dist(void) { return world && world->size > 1; }
static int root(void) { return !world || world->rank == 0; }

/* End the job with the last message: naming the rank when distributed. */
static _Noreturn void die_msg(void)
{
	if (dist())
		llm_comm_die("%s", llm_errmsg());
	llm_die("%s", llm_errmsg());
}

/* Every rank reached this point with status S: when any failed, the lowest
 * failing rank ends the job with its message (so an input error that every
 * rank sees is reported once, by rank 0) and the others wait to be ended. */
static void agree(enum llm_status s)
{
	if (!dist()) {
		if (s)
			die_msg();
		return;
	}
	float *f = calloc((size_t)world->size, sizeof *f);
	if (!f)
		llm_comm_die("out of memory");
	f[world->rank] = s ? 1.0f : 0.0f;
	if (llm_comm_allreduce_sum_f32(world, f, (size_t)world->size))
		die_msg();
	int first = -1;
	for (int r = world->size - 1; r >= 0; r--)
		if (f[r] > 0)
			first = r;
	free(f);
	if (first < 0)
		return;
	if (first == world->rank)
		die_msg();
	llm_comm_barrier(world);   /* never completes: rank FIRST ends the job */
	exit(1);
}

/* Standard input (rank 0 alone reads it). */
static enum llm_status read_stdin(char **buf, size_t *len)
{
	return llm_read_file("-", buf, len);
}

/* -v: each rank's traffic (model.h), gathered to rank 0 and printed there. */
static void report_traffic(struct llm_engine *e)
{
	if (!dist() || llm_log_level < 2)
		return;
	const struct llm_model *m = llm_engine_model(e);
	const struct llm_model_dist *d = m->dist;
	struct llm_dist_stats *all = calloc((size_t)world->size, sizeof *all);
	if (!all || llm_comm_allgather(world, &d->stats, sizeof d->stats, all))
		die_msg();
	int T = d->grid.n_tp, P = d->grid.n_pp;
	for (int r = 0; root() && r < world->size; r++) {
		const struct llm_dist_stats *st = &all[r];
		double tok = st->tokens ? (double)st->tokens : 1;
		fprintf(stderr, "%s: rank %d (stage %d, tp %d): %llu steps (%llu micro-batches), %llu tokens; per token: stage boundary "
		        "sent %.0f B (unfused %.0f, unsliced %.0f), received %.0f B; tp all-reduce %.0f B, "
		        "all-gather %.0f B; logits to rank 0 %.0f B\n", llm_progname(), r, r / T, r % T,
		        (unsigned long long)st->steps, (unsigned long long)st->micro, (unsigned long long)st->tokens,
		        st->boundary_sent / tok,
		        st->boundary_unfused / tok, st->boundary_whole / tok, st->boundary_recvd / tok,
		        st->tp_allreduce / tok, st->tp_allgather / tok, st->logits_sent / tok);
	}
	/* the step protocol: every rank followed the steps rank 0 led */
	struct llm_serve_stats sst, *ss = calloc((size_t)world->size, sizeof *ss);
	llm_engine_serve_stats(e, &sst);
	if (!ss || llm_comm_allgather(world, &sst, sizeof sst, ss))
		die_msg();
	for (int r = 0; root() && r < world->size; r++)
		fprintf(stderr, "%s: step protocol: rank %d %s %lld steps of rank 0 (%lld KV operations, %lld tokens; %llu B)\n",
		        llm_progname(), r, r ? "followed" : "led", (long long)ss[r].steps, (long long)ss[r].kv_ops,
		        (long long)ss[r].tokens, (unsigned long long)ss[r].bytes);
	free(ss);
	if (root() && P > 1) {
		/* one boundary: stage 0 -> 1, summed over its T ranks */
		double sent = 0, unf = 0, whole = 0, tok = all[0].tokens ? (double)all[0].tokens : 1;
		for (int t = 0; t < T; t++) {
			sent += (double)all[t].boundary_sent;
			unf += (double)all[t].boundary_unfused;
			whole += (double)all[t].boundary_whole;
		}
		fprintf(stderr, "%s: stage boundary 0->1 per token, all %d TP ranks: %.0f B sent (fused, 1/T each); "
		        "%.0f B unfused (%.1fx); %.0f B unsliced (%.1fx)\n", llm_progname(), T, sent / tok, unf / tok,
		        sent > 0 ? unf / sent : 0.0, whole / tok, sent > 0 ? whole / sent : 0.0);
	}
	free(all);
}

/* ---- modes: each reads stdin and writes stdout */

static enum llm_status run_tokenize(struct llm_tokenizer *tk)
{
	char *text;
	size_t len;
	LLM_TRY(llm_read_file("-", &text, &len));
	int32_t *ids;
	size_t n;
	enum llm_status s = llm_tokenizer_encode(tk, text, len, !cfg.no_special, &ids, &n);
	free(text);
	if (s)
		return llm_fail_prefix(s, "stdin");
	int32_t bos = llm_tokenizer_bos(tk);
	if (n >= 2 && bos >= 0 && ids[0] == bos && ids[1] == bos)
		llm_warn("the ids start with two BOS tokens (the text has one and the tokenizer adds one); use --no-special");
	char *line = malloc(n * 12 + 4);
	size_t w = 0;
	if (!line) {
		free(ids);
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	line[w++] = '[';
	for (size_t i = 0; i < n; i++)
		w += (size_t)snprintf(line + w, 13, i ? ", %d" : "%d", ids[i]);
	line[w++] = ']';
	line[w++] = '\n';
	s = write_out(line, w);
	free(line);
	free(ids);
	return s;
}

static enum llm_status run_detokenize(struct llm_tokenizer *tk)
{
	char *text;
	size_t len;
	LLM_TRY(llm_read_file("-", &text, &len));
	json_error_t e;
	json_t *arr = json_loadb(text, len, 0, &e);
	free(text);
	if (!arr)
		return llm_fail(LLM_ERR_USAGE, "stdin: line %d: %s", e.line, e.text);
	enum llm_status s = LLM_OK;
	size_t n = json_is_array(arr) ? json_array_size(arr) : 0;
	int32_t *ids = malloc((n + 1) * sizeof *ids);
	if (!json_is_array(arr))
		s = llm_fail(LLM_ERR_USAGE, "stdin: expected a JSON array of token ids");
	else if (!ids)
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (size_t i = 0; !s && i < n; i++) {
		json_t *v = json_array_get(arr, i);
		if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX)
			s = llm_fail(LLM_ERR_USAGE, "stdin: element %zu is not a token id", i);
		else
			ids[i] = (int32_t)json_integer_value(v);
	}
	char *out = NULL;
	size_t olen;
	if (!s)
		s = llm_tokenizer_decode(tk, ids, n, cfg.skip_special, &out, &olen);
	if (!s)
		s = write_out(out, olen);
	free(out);
	free(ids);
	json_decref(arr);
	return s;
}

static enum llm_status run_apply_template(struct llm_tokenizer *tk)
{
	char *tmpl = NULL, *req, *out = NULL;
	size_t len;
	if (cfg.chat_template)
		LLM_TRY(llm_read_file(cfg.chat_template, &tmpl, &len));
	enum llm_status s = llm_read_file("-", &req, &len);
	if (!s) {
		s = llm_chat_render(tk, tmpl, req, &out, &len);
		if (s && cfg.chat_template)
			llm_fail_prefix(s, "%s", cfg.chat_template);
	}
	if (!s) {
		/* As apply_chat_template does, the prompt is encoded without adding
		 * special tokens; two BOS at its start are almost always a bug. */
		int32_t *ids;
		size_t n;
		int32_t bos = llm_tokenizer_bos(tk);
		if (bos >= 0 && !llm_tokenizer_encode(tk, out, len, false, &ids, &n)) {
			if (n >= 2 && ids[0] == bos && ids[1] == bos)
				llm_warn("the rendered prompt starts with two BOS tokens");
			free(ids);
		}
		s = write_out(out, len);
	}
	free(out);
	free(req);
	free(tmpl);
	return s;
}

/* ---- generation --------------------------------------------------------- */

static enum llm_status engine_open(struct llm_engine **e, int max_seqs, int kv_seqs)
{
	struct llm_engine_opts o = LLM_ENGINE_OPTS_DEFAULT;
	int kv = llm_dtype_parse_flag(cfg.kv_dtype);
	if (kv != LLM_DTYPE_F32 && kv != LLM_DTYPE_BF16)
		return llm_fail(LLM_ERR_USAGE, "--kv-dtype: '%s' is not f32 or bf16", cfg.kv_dtype);
	int wp = llm_weight_pages_parse(cfg.weight_pages);
	if (wp < 0)
		return llm_fail(LLM_ERR_USAGE, "--weight-pages: '%s' is not auto, map or huge", cfg.weight_pages);
	o.weight_pages = (enum llm_weight_pages)wp;
	o.backend = cfg.backend;
	o.lora_dir = cfg.lora;
	o.n_threads = (int)cfg.threads;
	o.kv_dtype = (enum llm_dtype)kv;
	o.n_ctx = (int)cfg.n_ctx;
	o.max_seqs = max_seqs;
	o.kv_seqs = kv_seqs;
	o.max_batch_tokens = (int)cfg.batch_tokens;
	double t0 = llm_now();
	LLM_TRY(llm_engine_open(e, cfg.model, &o));
	if (root())
		LLM_DEBUG("%s: model loaded in %.0f ms\n", llm_progname(), (llm_now() - t0) * 1e3);
	return LLM_OK;
}

/* Rank 0, its input read: tell the other ranks the engine's sequence
 * counts, open the engine everywhere, and lead their steps from here. */
static struct llm_engine *lead_open(int max_seqs, int kv_seqs)
{
	int32_t sizes[2] = { max_seqs, kv_seqs };
	if (dist() && llm_comm_bcast_idle(world, sizes, sizeof sizes, 0))
		die_msg();
	struct llm_engine *e = NULL;
	agree(engine_open(&e, max_seqs, kv_seqs));
	if (llm_engine_serve_begin(e))
		die_msg();
	return e;
}

/* Rank 0: the other ranks stop following; -v traffic; close. */
static void lead_close(struct llm_engine *e)
{
	if (llm_engine_serve_end(e))
		die_msg();
	report_traffic(e);
	llm_engine_close(e);
}

/* A rank other than 0: wait for rank 0's engine sizes (it reads the input
 * first), open the same engine and follow its steps until it is done. */
static void follow(void)
{
	int32_t sizes[2];
	if (llm_comm_bcast_idle(world, sizes, sizeof sizes, 0))
		die_msg();
	struct llm_engine *e = NULL;
	agree(engine_open(&e, sizes[0], sizes[1]));
	if (llm_engine_serve_worker(e))
		die_msg();
	report_traffic(e);
	llm_engine_close(e);
}

/* One prompt: its ids, parameters, and what came back. */
struct job {
	int32_t *prompt;
	size_t n_prompt;
	struct llm_sample_params p;
	char *stop_own[LLM_MAX_STOP];
	struct llm_logit_bias *bias_own;   /* a JSONL line's logit_bias */
	int32_t *ids;
	float *logprob;
	struct llm_logprob *top;       /* (n, n_logprobs) */
	size_t n, cap;
	char *text;
	size_t text_len, text_cap;
	enum llm_finish finish;
	double t_submit, t_first, t_end;
	int stream;                    /* write text to stdout as it comes */
};

static enum llm_status append_text(struct job *j, const char *t, size_t n)
{
	if (j->text_len + n + 1 > j->text_cap) {
		size_t cap = (j->text_len + n + 1) * 2;
		char *nt = realloc(j->text, cap);
		if (!nt)
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		j->text = nt;
		j->text_cap = cap;
	}
	memcpy(j->text + j->text_len, t, n);
	j->text_len += n;
	j->text[j->text_len] = 0;
	return LLM_OK;
}

static int on_token(void *user, const struct llm_token_event *ev)
{
	struct job *j = user;
	double now = llm_now();
	if (!j->n && ev->token >= 0)
		j->t_first = now;
	if (ev->token >= 0) {
		if (j->n == j->cap) {
			size_t cap = j->cap ? j->cap * 2 : 64;
			int32_t *ni = realloc(j->ids, cap * sizeof *ni);
			float *nl = ni ? realloc(j->logprob, cap * sizeof *nl) : NULL;
			if (ni)
				j->ids = ni;
			if (nl)
				j->logprob = nl;
			struct llm_logprob *nt = NULL;
			if (nl && j->p.n_logprobs) {
				nt = realloc(j->top, cap * (size_t)j->p.n_logprobs * sizeof *nt);
				if (nt)
					j->top = nt;
			}
			if (!ni || !nl || (j->p.n_logprobs && !nt))
				return 1;
			j->cap = cap;
		}
		j->ids[j->n] = ev->token;
		j->logprob[j->n] = ev->logprob;
		for (int k = 0; k < j->p.n_logprobs; k++)
			j->top[j->n * (size_t)j->p.n_logprobs + k] = k < ev->n_top ? ev->top[k] : (struct llm_logprob){ -1, -INFINITY };
		j->n++;
	}
	if (ev->text_len) {
		if (append_text(j, ev->text, ev->text_len))
			return 1;
		if (j->stream && !cfg.show_tokens) {
			fwrite(ev->text, 1, ev->text_len, stdout);
			fflush(stdout);
		}
	}
	if (cfg.show_tokens && j->stream && ev->token >= 0)
		printf("%d\t%.*s\n", ev->token, (int)ev->text_len, ev->text ? ev->text : "");
	if (ev->finish) {
		j->finish = ev->finish;
		j->t_end = now;
	}
	return 0;
}

/* --logit-bias, parsed once by main */
static struct llm_logit_bias cli_bias[sizeof cfg.logit_bias.v / sizeof *cfg.logit_bias.v];
static int n_cli_bias;

/* --chat-template FILE, read once when a line first needs it */
static char *template_src;

/* What a request starts from: the flags (a JSONL line's fields replace
 * them); one choice per line. */
static void job_env(struct llm_api_env *env, struct llm_tokenizer *tk, int line)
{
	*env = (struct llm_api_env){ .defaults = LLM_SAMPLE_DEFAULT, .tk = tk, .chat_template = template_src, .max_n = 1 };
	struct llm_sample_params *p = &env->defaults;
	p->temperature = (float)cfg.temp;
	p->top_k = (int)cfg.top_k;
	p->top_p = (float)cfg.top_p;
	p->min_p = (float)cfg.min_p;
	p->repetition_penalty = (float)cfg.repeat_penalty;
	p->frequency_penalty = (float)cfg.freq_penalty;
	p->presence_penalty = (float)cfg.presence_penalty;
	p->seed = cfg.seed >= 0 ? (uint64_t)cfg.seed : (uint64_t)time(NULL) ^ ((uint64_t)line << 32);
	p->max_tokens = (int)cfg.n_predict;
	p->n_logprobs = (int)cfg.n_logprobs;
	p->ignore_eos = cfg.ignore_eos;
	p->min_tokens = (int)cfg.min_tokens;
	for (int i = 0; i < cfg.stop.n && i < LLM_MAX_STOP; i++)   /* main refuses more */
		p->stop[p->n_stop++] = cfg.stop.v[i];
	p->n_bias = n_cli_bias;
	p->bias = n_cli_bias ? cli_bias : NULL;
}

/* J takes what RQ owns. */
static void job_take(struct job *j, struct llm_api_req *rq)
{
	j->prompt = rq->prompt;
	j->n_prompt = (size_t)rq->n_prompt;
	j->p = rq->p;
	memcpy(j->stop_own, rq->stops, sizeof j->stop_own);
	j->bias_own = rq->bias;
	free(rq->inputs);
}

/* A request of the flags and, when OBJ (a JSONL line) is given, its fields
 * and prompt (request.h: the rules llm-serve's OpenAI endpoints follow); an
 * error names the line and the field. */
static enum llm_status job_params(struct job *j, struct llm_tokenizer *tk, json_t *obj, int line)
{
	if (obj && cfg.chat_template && !template_src && json_object_get(obj, "messages")) {
		size_t len;
		enum llm_status s = llm_read_file(cfg.chat_template, &template_src, &len);
		if (s)
			return llm_fail_prefix(s, "stdin: line %d", line);
	}
	struct llm_api_env env;
	job_env(&env, tk, line);
	struct llm_api_req rq;
	enum llm_status s = llm_api_req_parse(&rq, LLM_API_JSONL, obj, &env);
	if (s)
		return line ? llm_fail_prefix(s, "stdin: line %d", line) : s;
	job_take(j, &rq);
	return LLM_OK;
}

/* The prompt of a plain text line, -p or -f (J's parameters set). */
static enum llm_status job_prompt(struct job *j, struct llm_tokenizer *tk, const char *text, int line)
{
	if (!tk)
		return llm_fail(LLM_ERR_USAGE, "%s: no tokenizer files: a text prompt needs tokenizer.json (prompt_ids work without)",
		                cfg.model);
	struct llm_api_env env;
	job_env(&env, tk, line);
	struct llm_api_req rq = { .p = j->p };
	enum llm_status s = llm_api_req_prompt_text(&rq, &env, "prompt", text, strlen(text), 1);
	if (s) {
		free(rq.prompt);
		return line ? llm_fail_prefix(s, "stdin: line %d", line) : s;
	}
	j->prompt = rq.prompt;
	j->n_prompt = (size_t)rq.n_prompt;
	return LLM_OK;
}

static enum llm_status chat_prompt(struct llm_tokenizer *tk, const char *user, char **out)
{
	json_t *msgs = json_array();
	if (cfg.system)
		json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "system", "content", cfg.system));
	json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content", user));
	json_t *req = json_pack("{s:o, s:b}", "messages", msgs, "add_generation_prompt", 1);
	char *rs = json_dumps(req, JSON_COMPACT), *tmpl = NULL;
	json_decref(req);
	size_t len;
	enum llm_status s = cfg.chat_template ? llm_read_file(cfg.chat_template, &tmpl, &len) : LLM_OK;
	if (!s)
		s = llm_chat_render(tk, tmpl, rs, out, &len);
	free(tmpl);
	free(rs);
	return s;
}

static void print_json(const struct job *j, int index)
{
	json_t *o = json_object(), *pids = json_array(), *ids = json_array();
	for (size_t i = 0; i < j->n_prompt; i++)
		json_array_append_new(pids, json_integer(j->prompt[i]));
	for (size_t i = 0; i < j->n; i++)
		json_array_append_new(ids, json_integer(j->ids[i]));
	json_object_set_new(o, "index", json_integer(index));
	json_object_set_new(o, "text", json_stringn(j->text ? j->text : "", j->text_len));
	json_object_set_new(o, "prompt_ids", pids);
	json_object_set_new(o, "ids", ids);
	json_object_set_new(o, "finish_reason", json_string(llm_finish_name(j->finish)));
	if (j->p.n_logprobs) {
		json_t *lp = json_array(), *tops = json_array();
		for (size_t i = 0; i < j->n; i++) {
			json_array_append_new(lp, json_real(j->logprob[i]));
			json_t *t = json_array();
			for (int k = 0; k < j->p.n_logprobs; k++) {
				const struct llm_logprob *e = &j->top[i * (size_t)j->p.n_logprobs + k];
				if (e->id >= 0)
					json_array_append_new(t, json_pack("{s:i, s:f}", "id", e->id, "logprob", e->logprob));
			}
			json_array_append_new(tops, t);
		}
		json_object_set_new(o, "logprobs", lp);
		json_object_set_new(o, "top_logprobs", tops);
	}
	double ttft = j->t_first > 0 ? j->t_first - j->t_submit : 0, gen = j->t_end - j->t_first;
	json_object_set_new(o, "timings", json_pack("{s:f, s:f, s:f, s:i, s:i}", "ttft_ms", ttft * 1e3,
	                    "prompt_tok_s", ttft > 0 ? j->n_prompt / ttft : 0.0,
	                    "gen_tok_s", gen > 0 && j->n > 1 ? (j->n - 1) / gen : 0.0,
	                    "prompt_tokens", (int)j->n_prompt, "tokens", (int)j->n));
	char *s = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII * 0);
	json_decref(o);
	if (s) {
		puts(s);
		free(s);
	}
}

static void job_free(struct job *j)
{
	free(j->prompt);
	free(j->ids);
	free(j->logprob);
	free(j->top);
	free(j->text);
	for (int i = 0; i < LLM_MAX_STOP; i++)
		free(j->stop_own[i]);
	free(j->bias_own);
}

/* Read the prompts: -p, -f, or one per line of stdin. */
static enum llm_status read_jobs(struct llm_tokenizer *tk, struct job **jobs, size_t *n_jobs)
{
	char *buf = NULL, *text = NULL;
	size_t len;
	enum llm_status s = LLM_OK;
	*jobs = NULL;
	*n_jobs = 0;
	if (cfg.prompt || cfg.prompt_file) {
		const char *p = cfg.prompt;
		if (!p) {
			LLM_TRY(llm_read_file(cfg.prompt_file, &buf, &len));
			p = buf;
		}
		if (cfg.chat)
			s = chat_prompt(tk, p, &text);
		struct job *j = calloc(1, sizeof *j);
		if (!j)
			s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		if (!s)
			s = job_params(j, tk, NULL, 0);
		if (!s) {
			if (cfg.chat)   /* the rendered template carries its own BOS */
				s = llm_tokenizer_encode(tk, text, strlen(text), false, &j->prompt, &j->n_prompt);
			else
				s = job_prompt(j, tk, p, 0);
		}
		free(buf);
		free(text);
		if (s) {
			if (j)
				job_free(j);
			free(j);
			return s;
		}
		*jobs = j;
		*n_jobs = 1;
		return LLM_OK;
	}
	LLM_TRY(read_stdin(&buf, &len));
	size_t cap = 16;
	struct job *js = calloc(cap, sizeof *js);
	int line = 0;
	for (char *p = buf, *nl; !s && js && p < buf + len; p = nl + 1) {
		nl = memchr(p, '\n', (size_t)(buf + len - p));
		if (!nl)
			nl = buf + len;
		*nl = 0;
		line++;
		if (nl > p && nl[-1] == '\r')
			nl[-1] = 0;
		if (!*p)
			continue;
		if (*n_jobs == cap) {
			struct job *nj = realloc(js, 2 * cap * sizeof *nj);
			if (!nj) {
				s = llm_fail(LLM_ERR_NOMEM, "out of memory");
				break;
			}
			memset(nj + cap, 0, cap * sizeof *nj);
			js = nj;
			cap *= 2;
		}
		struct job *j = &js[(*n_jobs)++];
		json_t *obj = NULL;
		if (*p == '{') {
			json_error_t e;
			obj = json_loads(p, 0, &e);
			if (!json_is_object(obj)) {
				json_decref(obj);
				s = llm_fail(LLM_ERR_USAGE, "stdin: line %d: not a JSON object: %s", line, e.text);
				break;
			}
		}
		s = job_params(j, tk, obj, line);
		if (!s && !obj)
			s = job_prompt(j, tk, p, line);
		json_decref(obj);
	}
	free(buf);
	if (!js)
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
	if (s) {
		for (size_t i = 0; js && i < *n_jobs; i++)
			job_free(&js[i]);
		free(js);
		*n_jobs = 0;
		return s;
	}
	if (!*n_jobs)
		return llm_fail(LLM_ERR_USAGE, "stdin: no prompts");
	*jobs = js;
	return LLM_OK;
}

static enum llm_status run_generate(struct llm_tokenizer *tk)
{
	struct job *jobs = NULL;
	size_t n = 0;
	if (read_jobs(tk, &jobs, &n))
		die_msg();
	int n_run = (int)((size_t)cfg.parallel < n ? (size_t)cfg.parallel : n);
	struct llm_engine *e = lead_open(n_run + (int)cfg.prefix_cache, n_run);
	struct llm_sched_opts so = { .max_running = n_run, .max_batch_tokens = (int)cfg.batch_tokens,
	                             .prefix_entries = (int)cfg.prefix_cache };
	if (tk)
		llm_sched_opts_tokenizer(&so, &llm_engine_model(e)->cfg, tk);
	struct llm_sched *sch = NULL;
	if (llm_sched_open(&sch, e, &so))
		die_msg();
	int single = !cfg.prompt && !cfg.prompt_file ? 0 : 1;
	for (size_t i = 0; i < n; i++) {
		struct llm_request r = { .prompt = jobs[i].prompt, .n_prompt = (int)jobs[i].n_prompt, .params = jobs[i].p, .on_token = on_token, .user = &jobs[i] };
		int id;
		jobs[i].stream = single && !cfg.json;
		jobs[i].t_submit = llm_now();
		enum llm_status s = llm_sched_add(sch, &r, &id);
		if (s && !single)
			llm_fail_prefix(s, "prompt %zu", i + 1);
		if (s)
			die_msg();
	}
	if (llm_sched_run(sch))
		die_msg();
	for (size_t i = 0; i < n; i++) {
		if (cfg.json)
			print_json(&jobs[i], (int)i);
		else if (!single)
			printf("%.*s\n", (int)jobs[i].text_len, jobs[i].text ? jobs[i].text : "");
		else if (!cfg.show_tokens)
			putchar('\n');
	}
	fflush(stdout);
	for (size_t i = 0; i < n && llm_log_level >= 2; i++) {
		const struct job *j = &jobs[i];
		double ttft = j->t_first - j->t_submit, gen = j->t_end - j->t_first;
		fprintf(stderr, "%s: prompt %zu: %zu prompt tokens, %.1f tok/s; %zu generated, %.1f tok/s; first token %.1f ms; %s\n",
		        llm_progname(), i + 1, j->n_prompt, ttft > 0 ? j->n_prompt / ttft : 0.0, j->n,
		        gen > 0 && j->n > 1 ? (j->n - 1) / gen : 0.0, ttft * 1e3, llm_finish_name(j->finish));
	}
	if (llm_log_level >= 2) {
		struct llm_sched_stats st;
		llm_sched_stats(sch, &st);
		fprintf(stderr, "%s: %lld steps; %lld prompt tokens computed, %lld taken from the prefix cache; "
		        "%lld generated; %lld preemptions\n", llm_progname(), (long long)st.steps,
		        (long long)st.prompt_tokens, (long long)st.prefix_hit_tokens, (long long)st.gen_tokens,
		        (long long)st.preemptions);
	}
	llm_sched_close(sch);
	for (size_t i = 0; i < n; i++)
		job_free(&jobs[i]);
	free(jobs);
	lead_close(e);
	return LLM_OK;
}

/* --score: {"context": ..., "continuations": [...]} per line. The
 * continuation's tokens are those of encode(context + continuation) after
 * the context's own tokens, as evaluation harnesses cut them. */
static enum llm_status run_score(struct llm_tokenizer *tk)
{
	char *buf;
	size_t len;
	if (read_stdin(&buf, &len))
		die_msg();
	struct llm_engine *e = lead_open(2, 2);
	enum llm_status s = LLM_OK;
	int line = 0;
	for (char *p = buf, *nl; !s && p < buf + len; p = nl + 1) {
		nl = memchr(p, '\n', (size_t)(buf + len - p));
		if (!nl)
			nl = buf + len;
		*nl = 0;
		line++;
		if (!*p)
			continue;
		json_error_t je;
		json_t *o = json_loads(p, 0, &je), *ctx = json_object_get(o, "context"), *conts = json_object_get(o, "continuations");
		if (!json_is_string(ctx) || !json_is_array(conts) || !json_array_size(conts)) {
			llm_fail(LLM_ERR_USAGE, "stdin: line %d: needs \"context\" (a string) and \"continuations\" (a non-empty array of strings)%s%s",
			         line, o ? "" : ": ", o ? "" : je.text);
			die_msg();
		}
		size_t nc = json_array_size(conts), n_ctx;
		int32_t *cids = NULL, **cont = calloc(nc, sizeof *cont);
		int *ncont = calloc(nc, sizeof *ncont), *greedy = calloc(nc, sizeof *greedy);
		double *lp = calloc(nc, sizeof *lp);
		s = cont && ncont && greedy && lp ? llm_tokenizer_encode(tk, json_string_value(ctx), json_string_length(ctx), true, &cids, &n_ctx)
		                                  : llm_fail(LLM_ERR_NOMEM, "out of memory");
		for (size_t i = 0; !s && i < nc; i++) {
			json_t *c = json_array_get(conts, i);
			if (!json_is_string(c)) {
				s = llm_fail(LLM_ERR_USAGE, "stdin: line %d: continuations[%zu] is not a string", line, i);
				break;
			}
			size_t lt = json_string_length(ctx) + json_string_length(c), nw;
			char *whole = malloc(lt + 1);
			int32_t *wids = NULL;
			snprintf(whole, lt + 1, "%s%s", json_string_value(ctx), json_string_value(c));
			s = llm_tokenizer_encode(tk, whole, lt, true, &wids, &nw);
			free(whole);
			if (!s && nw <= n_ctx)
				s = llm_fail(LLM_ERR_USAGE, "stdin: line %d: continuations[%zu] adds no token", line, i);
			if (!s) {
				ncont[i] = (int)(nw - n_ctx);
				cont[i] = malloc((size_t)ncont[i] * sizeof **cont);
				memcpy(cont[i], wids + n_ctx, (size_t)ncont[i] * sizeof **cont);
			}
			free(wids);
		}
		if (s) {
			llm_fail_prefix(s, "stdin: line %d", line);
			die_msg();
		}
		if (llm_score(e, cids, (int)n_ctx, (const int32_t *const *)cont, ncont, (int)nc, lp, greedy)) {
			llm_fail_prefix(LLM_ERR_INTERNAL, "stdin: line %d", line);
			die_msg();
		}
		{
			json_t *r = json_object(), *a = json_array(), *an = json_array(), *g = json_array(), *nt = json_array();
			for (size_t i = 0; i < nc; i++) {
				size_t chars = json_string_length(json_array_get(conts, i));
				json_array_append_new(a, json_real(lp[i]));
				json_array_append_new(an, json_real(chars ? lp[i] / (double)chars : lp[i]));
				json_array_append_new(g, json_boolean(greedy[i]));
				json_array_append_new(nt, json_integer(ncont[i]));
			}
			json_object_set_new(r, "index", json_integer(line - 1));
			json_object_set_new(r, "logprobs", a);
			json_object_set_new(r, "normalized", an);
			json_object_set_new(r, "greedy", g);
			json_object_set_new(r, "tokens", nt);
			char *js = json_dumps(r, JSON_COMPACT);
			json_decref(r);
			puts(js);
			free(js);
		}
		for (size_t i = 0; cont && i < nc; i++)
			free(cont[i]);
		free(cont);
		free(ncont);
		free(greedy);
		free(lp);
		free(cids);
		json_decref(o);
	}
	fflush(stdout);
	free(buf);
	lead_close(e);
	return s;
}

/* --perplexity FILE: windows of -c tokens, each [BOS] + chunk from position
 * 0, every chunk token scored (llama-perplexity's scheme). */
static enum llm_status run_perplexity(struct llm_tokenizer *tk)
{
	char *buf;
	size_t len, n;
	int32_t *ids;
	LLM_TRY(llm_read_file(cfg.perplexity, &buf, &len));
	enum llm_status s = llm_tokenizer_encode(tk, buf, len, false, &ids, &n);
	free(buf);
	if (s)
		return llm_fail_prefix(s, "%s", cfg.perplexity);
	struct llm_engine *e = lead_open(1, 1);
	int32_t bos = llm_tokenizer_bos(tk);
	int window = cfg.n_ctx ? (int)cfg.n_ctx : llm_engine_n_ctx(e);
	int chunk = bos >= 0 ? window - 1 : window;
	double nll = 0;
	int64_t count = 0;
	if (chunk < 1) {
		llm_fail(LLM_ERR_USAGE, "--ctx-size %d leaves no room for a token", window);
		die_msg();
	}
	if (llm_perplexity(e, ids, (int64_t)n, chunk, bos, &nll, &count, NULL))
		die_msg();
	{
		double ppl = count ? exp(nll / (double)count) : NAN;
		if (cfg.json)
			printf("{\"file\":\"%s\",\"tokens\":%lld,\"window\":%d,\"nll\":%.6f,\"ppl\":%.6f}\n", cfg.perplexity,
			       (long long)count, window, nll, ppl);
		else
			printf("%s: %lld tokens in windows of %d: nll %.6f, perplexity %.4f\n", cfg.perplexity,
			       (long long)count, window, nll, ppl);
	}
	free(ids);
	lead_close(e);
	return s;
}

/* One entry per mode; generation runs when no other is asked for. */
static const struct mode {
	const int *flag;
	const char *name;
	enum llm_status (*run)(struct llm_tokenizer *tk);
} modes[] = {
	{ &cfg.tokenize, "--tokenize", run_tokenize },
	{ &cfg.detokenize, "--detokenize", run_detokenize },
	{ &cfg.apply_template, "--apply-template", run_apply_template },
	{ &cfg.score, "--score", run_score },
	{ NULL, "--perplexity", run_perplexity },
};

int main(int argc, char **argv)
{
	const char *pos[16];
	int n_pos;
	int rc = llm_args_parse(argc, argv, &cli, pos, &n_pos);
	if (rc != LLM_ARGS_OK)
		return rc == LLM_ARGS_EXIT ? 0 : 2;
	const struct mode *mode = NULL;
	for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
		if (modes[i].flag ? *modes[i].flag : cfg.perplexity != NULL) {
			if (mode)
				return llm_args_usage_error(&cli, "%s and %s cannot be combined", mode->name, modes[i].name);
			mode = &modes[i];
		}
	static const struct mode generate = { NULL, "generation", run_generate };
	if (!mode)
		mode = &generate;
	if (mode != &generate && (cfg.prompt || cfg.prompt_file))
		return llm_args_usage_error(&cli, "-p and -f go with generation, not %s", mode->name);
	if (cfg.prompt && cfg.prompt_file)
		return llm_args_usage_error(&cli, "-p and -f cannot be combined");
	if (cfg.chat && mode != &generate)
		return llm_args_usage_error(&cli, "--chat goes with generation");
	if (cfg.system && !cfg.chat)
		return llm_args_usage_error(&cli, "--system goes with --chat");
	if (cfg.n_logprobs && !cfg.json)
		return llm_args_usage_error(&cli, "--logprobs goes with --json");
	if (!cfg.model)
		return llm_args_usage_error(&cli, "missing -m DIR");
	if (cfg.stop.n > LLM_MAX_STOP)
		return llm_args_usage_error(&cli, "--stop: %d strings, at most %d", cfg.stop.n, LLM_MAX_STOP);
	for (int i = 0; i < cfg.logit_bias.n; i++)
		if (llm_logit_bias_parse(cfg.logit_bias.v[i], &cli_bias[n_cli_bias++]))
			return llm_args_usage_error(&cli, "--logit-bias %s", llm_errmsg());
	if ((cfg.logit_bias.n || cfg.min_tokens) && mode != &generate)
		return llm_args_usage_error(&cli, "--logit-bias and --min-tokens go with generation");
	if (cfg.no_special && mode->run != run_tokenize)
		return llm_args_usage_error(&cli, "--no-special goes with --tokenize");
	if (cfg.skip_special && mode->run != run_detokenize)
		return llm_args_usage_error(&cli, "--skip-special goes with --detokenize");
	if (cfg.chat_template && mode->run != run_apply_template && mode != &generate)
		return llm_args_usage_error(&cli, "--chat-template goes with --apply-template or generation");
	if (llm_comm_init(&world, &argc, &argv))
		llm_die("%s", llm_errmsg());
	int tok_mode = mode->run == run_tokenize || mode->run == run_detokenize || mode->run == run_apply_template;
	if (!root()) {          /* the tokenizer modes run on rank 0 alone; the others follow its engine */
		if (!tok_mode)
			follow();
		if (llm_comm_finalize(world))
			llm_die("%s", llm_errmsg());
		return 0;
	}
	struct llm_tokenizer *tk = NULL;
	if (llm_tokenizer_open_model(&tk, cfg.model)) {
		/* generation from prompt_ids needs no tokenizer: a checkpoint
		 * without tokenizer files (random weights) still runs */
		char *tj = llm_path_join(cfg.model, "tokenizer.json");
		int absent = tj && !llm_exists(tj) && llm_is_dir(cfg.model);
		free(tj);
		if (mode != &generate || !absent || cfg.prompt || cfg.prompt_file)
			die_msg();
		tk = NULL;
	}
	enum llm_status s = mode->run(tk);
	if (tk)
		llm_tokenizer_close(tk);
	if (s)
		die_msg();
	if (llm_comm_finalize(world))
		llm_die("%s", llm_errmsg());
	return 0;
}
