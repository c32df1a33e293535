/* tools/llm-generate.c: offline generation, scoring and perplexity from the
 * shell, and the tokenizer modes (--tokenize, --detokenize, --apply-template)
 * that need only the tokenizer files of -m. The work is in libllm (jobs.c,
 * score.c, textmode.c over the scheduler and the engine); main parses flags,
 * picks one mode from the table below, calls the library, writes what it
 * returns and maps status to the exit code (0 ok, 1 runtime error, 2 usage).
 * Distributed (mpirun over a checkpoint partitioned by llm-repartition):
 * rank 0 alone reads the input, runs the mode and writes standard output;
 * the other ranks follow its steps (generate.h: llm-serve's protocol). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "llm.h"

struct generate_cfg {
	const char *model, *chat_template;   /* -m DIR; a template FILE overriding the model's */
	int tokenize, detokenize, apply_template, no_special, skip_special;   /* the tokenizer modes */
	const char *prompt, *prompt_file, *perplexity, *system, *backend, *kv_dtype, *weight_pages, *lm_head, *json_schema, *grammar, *speculate, *draft;
	struct llm_strlist stop, logit_bias, lora;
	int64_t n_predict, min_tokens, n_ctx, threads, top_k, seed, parallel, batch_tokens, n_logprobs, prefix_cache, eval_tokens, max_kv_tokens, spec_tokens, spec_ngram;
	size_t kv_memory;
	double temp, top_p, min_p, repeat_penalty, freq_penalty, presence_penalty;
	int json, score, eval, jsonl, hellaswag, skip_bad, chat, show_tokens, ignore_eos, echo, check_weights;
};

static struct generate_cfg cfg = {
	.n_predict = 128, .spec_tokens = LLM_SPEC_DEFAULT_TOKENS, .spec_ngram = LLM_SPEC_DEFAULT_NGRAM, .temp = 0.8, .top_k = 40, .top_p = 0.95, .min_p = 0.05, .repeat_penalty = 1.0,
	.seed = -1, .parallel = 8, .batch_tokens = 512, .prefix_cache = 8, .backend = "auto", .kv_dtype = "bf16", .weight_pages = "auto", .lm_head = "auto", .eval_tokens = 2048,
};

static const struct llm_opt opts[] = {
	LLM_STR('m', "model", "DIR", &cfg.model,
	        "model directory or .safetensors file (the tokenizer files suffice for the tokenizer modes)"),
	LLM_FLAG(0, "tokenize", &cfg.tokenize, "read text on stdin, print its token ids as a JSON array"),
	LLM_FLAG(0, "detokenize", &cfg.detokenize, "read a JSON array of token ids on stdin, print the text"),
	LLM_FLAG(0, "apply-template", &cfg.apply_template, "read a chat request (JSON: messages, add_generation_prompt, tools, template_kwargs) on stdin, print the prompt"),
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
	LLM_LIST(0, "logit-bias", "ID=BIAS", &cfg.logit_bias, "add BIAS (-100 to 100; -100 all but bans) to token ID's logit (repeatable)"),
	LLM_STR(0, "json-schema", "FILE", &cfg.json_schema, "every output is JSON valid for the JSON Schema in FILE (a JSONL line's own field replaces it)"),
	LLM_STR(0, "grammar", "FILE", &cfg.grammar, "every output is a sentence of the grammar in FILE (EBNF, man page)"),
	LLM_INT(0, "logprobs", "N", &cfg.n_logprobs, "--json: the N most likely tokens and log-probs at each position", 0, 20),
	LLM_FLAG(0, "chat", &cfg.chat, "wrap the prompt as a user message in the model's chat template"),
	LLM_STR(0, "system", "TEXT", &cfg.system, "--chat: the system message"),
	LLM_FLAG(0, "show-tokens", &cfg.show_tokens, "print each generated token as 'id<TAB>text' per line"),
	LLM_FLAG('e', "echo", &cfg.echo, "start each output's text with the prompt's (--show-tokens lists generated tokens only)"),
	LLM_FLAG(0, "json", &cfg.json, "one JSON object per prompt, in input order"),
	LLM_FLAG(0, "score", &cfg.score, "stdin JSONL {context, continuations}: log-likelihood of each continuation"),
	LLM_FLAG(0, "eval", &cfg.eval, "stdin JSONL {context, endings, label}: multiple choice with accuracy (man page)"),
	LLM_FLAG(0, "hellaswag", &cfg.hellaswag, "--eval/--score: HellaSwag release fields, lm-eval's preprocessing"),
	LLM_FLAG(0, "skip-bad", &cfg.skip_bad, "--eval/--score/--jsonl: skip bad items (counted) instead of failing"),
	LLM_INT(0, "eval-batch-tokens", "N", &cfg.eval_tokens, "--eval/--jsonl: tokens of a batch of items at least (theta)", 1, INT32_MAX),
	LLM_STR(0, "perplexity", "FILE", &cfg.perplexity, "token count, negative log-likelihood and perplexity of FILE in windows of -c"),
	LLM_FLAG(0, "jsonl", &cfg.jsonl, "--perplexity: FILE is JSONL, a document {\"text\": ...} per line, each scored alone, batched as --eval"),
	LLM_INT(0, "parallel", "N", &cfg.parallel, "sequences computed together (prompts, --score continuations, --perplexity windows)", 1, 4096),
	LLM_INT(0, "batch-tokens", "N", &cfg.batch_tokens, "tokens per forward step", 1, 1 << 20),
	LLM_KV_MEMORY_OPT(&cfg.kv_memory, "--parallel x the longest prompt with its -n (4096 at least), in 90% of free memory"), LLM_MAX_KV_TOKENS_OPT(&cfg.max_kv_tokens),
	LLM_INT(0, "prefix-cache", "N", &cfg.prefix_cache, "prompt prefixes kept for reuse across prompts (0: no prefix caching)", 0, 1024), LLM_SPEC_OPTS(&cfg.speculate, &cfg.spec_tokens, &cfg.spec_ngram, &cfg.draft),
	LLM_STR(0, "kv-dtype", "TYPE", &cfg.kv_dtype, "KV cache dtype: bf16, f32 or fp8 (E4M3, a scale per token and head)"),
	LLM_STR(0, "weight-pages", "MODE", &cfg.weight_pages, "where the CPU reads the weights: huge (copied into 2 MiB transparent huge pages), map (the checkpoint's file mapping, no copy) or auto (huge on the cpu backend, the copy read in the background)"),
	LLM_STR(0, "backend", "NAME", &cfg.backend, "compute backend: cpu, cuda or auto"),
	LLM_LIST(0, "lora", "[NAME=]DIR", &cfg.lora, "load the PEFT LoRA adapter in DIR (llm-finetune's output; cpu backend) as NAME (default: DIR's base name; repeatable); lines run with the first unless their \"model\" names another or the model"),
	LLM_STR(0, "lm-head", "MODE", &cfg.lm_head, "the lm_head in memory: fp8 (a BF16, F16 or F32 head quantized to FP8 E4M3 at load, one scale per row), file (as the checkpoint stores it) or auto (fp8 on the cpu backend when the checkpoint holds FP8 weights)"),
	LLM_FLAG(0, "check-weights", &cfg.check_weights, "scan every weight for NaN or Inf before generating; refuse to load if one holds any"),
};

static const struct llm_cli cli = {
	.usage = "llm-generate [options] -m DIR",
	.summary = "Generate text with a model, from -p, -f or one prompt per line of stdin (text or JSONL);\n"
	           "score continuations (--score), measure perplexity (--perplexity), or run the tokenizer\n"
	           "and chat template alone (--tokenize, --detokenize, --apply-template).",
	.example = "llm-generate -m models/stories260K -p 'Once upon a time' -n 64 --temp 0",
	.opts = opts, .n_opts = sizeof opts / sizeof *opts, .min_pos = 0, .max_pos = 0,
};

static struct llm_comm *world; static struct llm_spec_opts spec; static struct llm_engine *draft_e;   /* llm_comm_init: one rank unless under mpirun; --speculate (main) */
static size_t n_done, n_total; static const char *done_what = "prompts done";   /* an interrupted run's report */

static int dist(void) { return world && world->size > 1; }
static int root(void) { return !world || world->rank == 0; }

/* End the job with the last message: naming the rank when distributed. */
static _Noreturn void die_msg(void)
{
	if (dist())
		llm_comm_die("%s", llm_errmsg());
	llm_die("%s", llm_errmsg());
}

/* The engine of the flags, sized by rank 0 (max_seqs, kv_seqs). */
static struct llm_engine_opts engine_opts(int max_seqs, int kv_seqs)
{
	struct llm_engine_opts o = LLM_ENGINE_OPTS_DEFAULT;
	llm_engine_flags_parse(cfg.kv_dtype, cfg.weight_pages, &o.kv_dtype, &o.weight_pages);   /* main checked */
	llm_lm_head_parse(cfg.lm_head, &o.lm_head);
	o.max_logits = cfg.score || cfg.eval || cfg.perplexity ? (int)cfg.batch_tokens : spec.mode ? (int)cfg.parallel * (1 + spec.n_draft) : 0;   /* the flags': the same on every rank */
	o.backend = cfg.backend, o.lora = cfg.lora.v, o.n_lora = cfg.lora.n, o.n_threads = (int)cfg.threads, o.n_ctx = (int)cfg.n_ctx;
	o.max_seqs = max_seqs, o.kv_seqs = kv_seqs, o.max_batch_tokens = (int)cfg.batch_tokens, o.check_weights = cfg.check_weights;
	return o;
}

/* Opening failed on rank FIRST: it reports, the others wait to be ended. */
static _Noreturn void open_failed(int first)
{
	if (!dist() || first == world->rank)
		die_msg();
	llm_comm_barrier(world);   /* never completes: rank FIRST ends the job */
	exit(1);
}

/* Rank 0, its input read: size the KV cache (NEED: the longest sequence; 0: unknown), open the engine on every rank and lead. */
static struct llm_engine *lead_open(int max_seqs, int kv_seqs, int64_t need)
{
	struct llm_engine_opts o = engine_opts(max_seqs, kv_seqs);
	struct llm_engine *e;
	int first = 0;
	if (llm_kv_size_generate(cfg.model, cfg.max_kv_tokens, cfg.kv_memory, need, &o) || llm_engine_lead_open(&e, cfg.model, &o, &first))
		open_failed(first);
	return e;
}

/* -v, distributed (LLM_DIST=always on one rank too): every rank's traffic, printed by rank 0 (collective). */
static void lead_close(struct llm_engine *e)
{
	struct llm_buf t = { 0 };
	if (llm_engine_lead_close(e, world && llm_log_level >= 2 ? &t : NULL))
		die_msg();
	fputs(t.len ? t.p : "", stderr), llm_buf_free(&t);
}

/* A rank other than 0: follow rank 0's engine until it is done. */
static void follow(void)
{
	struct llm_engine_opts o = engine_opts(0, 0);
	struct llm_buf t = { 0 }; int first;
	if (llm_engine_follow(cfg.model, &o, llm_log_level >= 2 ? &t : NULL, &first))
		first >= 0 ? open_failed(first) : die_msg();
	llm_buf_free(&t);
}

/* A scheduler of the flags over E, with TK's detokenizer and EOS ids. */
static struct llm_sched *sched_open(struct llm_engine *e, int n_run, int prefix, struct llm_tokenizer *tk)
{
	struct llm_engine_opts d = engine_opts(n_run, n_run);   /* --speculate draft: the draft's engine (finish closes it), one process only */
	if (spec.mode == LLM_SPEC_DRAFT && (dist() ? llm_fail(LLM_ERR_USAGE, "--speculate draft runs in one process") : llm_sched_draft_open(&draft_e, e, spec.draft, &d))) die_msg();
	struct llm_sched_opts so = { .max_running = n_run, .max_batch_tokens = (int)cfg.batch_tokens, .prefix_entries = prefix, .spec = spec, .draft = draft_e };
	if (tk)
		llm_sched_opts_tokenizer(&so, &llm_engine_model(e)->cfg, tk);
	struct llm_sched *s = NULL;
	if (llm_sched_open(&s, e, &so)) die_msg();
	return s;
}

/* ---- modes: each reads its input, writes stdout ----------------------------- */

static char *template_src;   /* --chat-template FILE, read by main */

/* --tokenize, --detokenize, --apply-template: stdin to stdout */
static enum llm_status text_mode(struct llm_tokenizer *tk, enum llm_text_mode m, int flag)
{
	return llm_text_mode_stdin(m, tk, template_src, cfg.chat_template, flag, stdout);
}
static enum llm_status run_tokenize(struct llm_tokenizer *tk) { return text_mode(tk, LLM_TEXT_TOKENIZE, !cfg.no_special); }
static enum llm_status run_detokenize(struct llm_tokenizer *tk) { return text_mode(tk, LLM_TEXT_DETOKENIZE, cfg.skip_special); }
static enum llm_status run_apply_template(struct llm_tokenizer *tk) { return text_mode(tk, LLM_TEXT_TEMPLATE, 0); }

static struct llm_logit_bias cli_bias[sizeof cfg.logit_bias.v / sizeof *cfg.logit_bias.v];   /* --logit-bias, */
static int n_cli_bias;                                                                        /* parsed by main */

/* What a request starts from: the flags (a JSONL line's fields replace
 * them); one choice per line. */
static void flags_env(struct llm_api_env *env, struct llm_tokenizer *tk)
{
	struct llm_sample_params p = {
		.temperature = (float)cfg.temp, .top_k = (int)cfg.top_k, .top_p = (float)cfg.top_p, .min_p = (float)cfg.min_p,
		.repetition_penalty = (float)cfg.repeat_penalty, .frequency_penalty = (float)cfg.freq_penalty,
		.presence_penalty = (float)cfg.presence_penalty, .max_tokens = (int)cfg.n_predict,
		.seed = cfg.seed >= 0 ? (uint64_t)cfg.seed : (uint64_t)time(NULL), .n_logprobs = (int)cfg.n_logprobs,
		.ignore_eos = cfg.ignore_eos, .min_tokens = (int)cfg.min_tokens, .n_bias = n_cli_bias,
		.bias = n_cli_bias ? cli_bias : NULL,
	};
	for (int i = 0; i < cfg.stop.n && i < LLM_MAX_STOP; i++)   /* main refuses more */
		p.stop[p.n_stop++] = cfg.stop.v[i];
	*env = (struct llm_api_env){ .defaults = p, .tk = tk, .chat_template = template_src, .max_n = 1 };
	if (llm_api_env_guide(env, cfg.json_schema, cfg.grammar) || llm_jobs_env_lora(env, cfg.lora.v, cfg.lora.n, cfg.model)) die_msg();   /* --json-schema, --grammar, --lora */
}

/* -p / -f streams the text (or --show-tokens the ids) as it comes. */
static void stream(void *user, struct llm_job *j, const struct llm_token_event *ev)
{
	(void)user, (void)j;
	if (cfg.show_tokens && ev->token >= 0)
		printf("%d\t%.*s\n", ev->token, (int)ev->text_len, ev->text ? ev->text : "");
	else if (!cfg.show_tokens)
		fwrite(ev->text ? ev->text : "", 1, ev->text_len, stdout);
	fflush(stdout);
}

/* -v: what the scheduler did; then it goes, and the engine. */
static void finish(struct llm_sched *sch, struct llm_engine *e)
{
	char line[300];
	llm_sched_summary(sch, line, sizeof line);
	LLM_DEBUG("%s: %s\n", llm_progname(), line);
	llm_sched_close(sch), lead_close(e), llm_engine_close(draft_e);
}

/* A finished job's result: its text line (-p streamed it: the newline) or --json its object; -v its summary. */
static void put(void *user, size_t i)
{
	struct llm_job *j = (struct llm_job *)user + i;
	char *js = cfg.json ? llm_job_json(j, i) : NULL, line[300];
	if (js || !(cfg.prompt || cfg.prompt_file) || !cfg.show_tokens)
		printf("%s\n", js ? js : cfg.prompt || cfg.prompt_file ? "" : j->text.p ? j->text.p : "");
	free(js), fflush(stdout);
	if (llm_log_level >= 2)
		llm_job_summary(j, i, line, sizeof line), fprintf(stderr, "%s: %s\n", llm_progname(), line);
}

static enum llm_status run_generate(struct llm_tokenizer *tk)
{
	llm_signals_catch();   /* Ctrl-C: the finished results, then exit 128 + the signal (main) */
	struct llm_api_env env;
	flags_env(&env, tk);
	struct llm_job *jobs = NULL;
	size_t n = 1, len;
	char *buf = NULL;
	int single = cfg.prompt || cfg.prompt_file;
	if ((cfg.prompt_file || !single) && llm_read_file(single ? cfg.prompt_file : "-", &buf, &len))
		die_msg();
	if ((single ? !(jobs = calloc(1, sizeof *jobs)) ? llm_fail(LLM_ERR_NOMEM, "out of memory")
	                                                : llm_job_text(jobs, cfg.prompt ? cfg.prompt : buf, cfg.chat, cfg.system, &env)
	            : llm_jobs_read(buf, len, &env, cfg.seed < 0, &jobs, &n)) || (cfg.echo && llm_jobs_echo(jobs, n, tk)))
		die_msg();
	free(buf);
	jobs[0].on_event = single && !cfg.json ? stream : NULL;
	int n_run = (int)((size_t)cfg.parallel < n ? (size_t)cfg.parallel : n);
	struct llm_engine *e = lead_open(n_run + (int)cfg.prefix_cache, n_run, llm_jobs_kv_need(jobs, n));
	struct llm_sched *sch = sched_open(e, n_run, (int)cfg.prefix_cache, tk);
	struct llm_jobs_out out = { .done = put, .user = jobs, .stop = &llm_interrupt, .gaps = cfg.json };   /* text lines stop at a gap */
	if (llm_jobs_run(sch, jobs, n, !single, &out))
		die_msg();
	n_done = out.n_done, n_total = n;
	finish(sch, e), llm_jobs_free(jobs, n), llm_api_env_guide_free(&env);
	return LLM_OK;
}

/* --score / --eval: items read and tokenised in threads while the engine
 * loads, a context computed once and forked by its endings, results in input
 * order (eval.h); --eval batches by the DP and ends on a summary. */
static void put_line(void *user, const char *line) { (void)user, puts(line), fflush(stdout); }
static enum llm_status run_score(struct llm_tokenizer *tk)
{
	llm_signals_catch();   /* Ctrl-C: the items scored, then exit 128 + the signal (main) */
	struct llm_eval_opts o = { .hellaswag = cfg.hellaswag, .skip_bad = cfg.skip_bad, .labels = cfg.eval, .sort = cfg.eval || cfg.jsonl,
	                           .theta = (int)cfg.eval_tokens, .step_tokens = (int)cfg.batch_tokens, .max_seqs = (int)cfg.parallel,
	                           .documents = cfg.jsonl };
	struct llm_eval *ev;
	if (llm_eval_start(&ev, cfg.jsonl ? cfg.perplexity : "-", tk, &o))
		die_msg();
	struct llm_engine *e = lead_open((int)cfg.parallel, (int)cfg.parallel, 0);
	llm_eval_window(ev, cfg.n_ctx ? (int)cfg.n_ctx : llm_engine_n_ctx(e));
	struct llm_sched *sch = sched_open(e, (int)cfg.parallel, 0, NULL);
	if (llm_eval_run(ev, sch, &llm_interrupt, put_line, NULL, &n_done))
		die_msg();
	n_total = llm_eval_count(ev), done_what = cfg.jsonl ? "documents scored" : "items scored";
	for (int json = 0; (cfg.eval || cfg.jsonl) && !llm_interrupt && json <= cfg.json; json++) {   /* stderr; --json: stdout too */
		char line[1200];
		llm_eval_summary(ev, e, json, line, sizeof line), json ? puts(line) : fprintf(stderr, "%s: %s\n", llm_progname(), line);
	}
	finish(sch, e), llm_eval_free(ev);
	return LLM_OK;
}

/* --perplexity FILE: windows of -c tokens, each [BOS] + chunk from position
 * 0, every chunk token scored (llama-perplexity's scheme); the windows run
 * --parallel at a time. --jsonl: documents, the evaluation job's way. */
static enum llm_status run_perplexity(struct llm_tokenizer *tk)
{
	char *buf, line[1200];
	size_t len;
	if (cfg.jsonl)
		return run_score(tk);
	LLM_TRY(llm_read_file(cfg.perplexity, &buf, &len));
	struct llm_engine *e = lead_open((int)cfg.parallel, (int)cfg.parallel, 0);
	struct llm_ppl_result r;
	if (llm_perplexity_text(e, tk, cfg.perplexity, buf, len, (int)cfg.n_ctx, &r))
		die_msg();
	llm_ppl_result_line(&r, cfg.perplexity, cfg.json, line, sizeof line);
	puts(line), free(buf), lead_close(e);
	return LLM_OK;
}

/* One entry per mode (TOK: the tokenizer alone); generation runs when no other is asked for. */
static const struct mode { const int *flag; const char *name; enum llm_status (*run)(struct llm_tokenizer *); int tok; } modes[] = {
	{ &cfg.tokenize, "--tokenize", run_tokenize, 1 },
	{ &cfg.detokenize, "--detokenize", run_detokenize, 1 },
	{ &cfg.apply_template, "--apply-template", run_apply_template, 1 },
	{ &cfg.score, "--score", run_score, 0 },
	{ &cfg.eval, "--eval", run_score, 0 },
	{ NULL, "--perplexity", run_perplexity, 0 },
};

int main(int argc, char **argv)
{
	const char *pos[16];
	int n_pos, rc = llm_args_parse(argc, argv, &cli, pos, &n_pos);
	if (rc != LLM_ARGS_OK)
		return rc == LLM_ARGS_EXIT ? 0 : 2;
	const struct mode *mode = NULL;
	for (size_t i = 0; i < sizeof modes / sizeof *modes; i++)
		if (modes[i].flag ? *modes[i].flag : cfg.perplexity != NULL) {
			if (mode)
				return llm_args_usage_error(&cli, "%s and %s cannot be combined", mode->name, modes[i].name);
			mode = &modes[i];
		}
	static const struct mode generate = { NULL, "generation", run_generate, 0 };
	mode = mode ? mode : &generate;
	int gen = mode == &generate;
	const struct { int bad; const char *msg; } rules[] = {   /* usage errors, in this order */
		{ !gen && (cfg.prompt || cfg.prompt_file), "-p and -f go with generation" },
		{ cfg.prompt && cfg.prompt_file, "-p and -f cannot be combined" }, { cfg.json_schema && cfg.grammar, "--json-schema and --grammar cannot be combined" },
		{ cfg.chat && !gen, "--chat goes with generation" }, { cfg.system && !cfg.chat, "--system goes with --chat" },
		{ cfg.n_logprobs && !cfg.json, "--logprobs goes with --json" },
		{ !cfg.model || llm_model_check_args(cfg.model, cfg.n_ctx), cfg.model ? llm_errmsg() : "missing -m DIR" },
		{ cfg.prompt && !*cfg.prompt, "-p '': an empty prompt (from BOS alone: {\"prompt_ids\": [BOS]} on stdin)" },
		{ cfg.stop.n > LLM_MAX_STOP, "--stop: more strings than the 8 a request takes" },
		{ cfg.kv_memory && cfg.max_kv_tokens, LLM_KV_SIZE_TWICE },
		{ (cfg.logit_bias.n || cfg.min_tokens || cfg.echo || cfg.json_schema || cfg.grammar || cfg.speculate) && !gen,
		  "--logit-bias, --min-tokens, --echo, --json-schema, --grammar and --speculate go with generation" },
		{ cfg.hellaswag && mode->run != run_score, "--hellaswag goes with --eval or --score" },
		{ cfg.skip_bad && mode->run != run_score && !cfg.jsonl, "--skip-bad goes with --eval, --score or --jsonl" },
		{ cfg.jsonl && !cfg.perplexity, "--jsonl goes with --perplexity" },
		{ cfg.no_special && mode->run != run_tokenize, "--no-special goes with --tokenize" },
		{ cfg.skip_special && mode->run != run_detokenize, "--skip-special goes with --detokenize" },
		{ cfg.chat_template && mode->run != run_apply_template && !gen,
		  "--chat-template goes with --apply-template or generation" },
	};
	for (size_t i = 0; i < sizeof rules / sizeof *rules; i++)
		if (rules[i].bad)
			return llm_args_usage_error(&cli, "%s", rules[i].msg);
	struct llm_engine_opts eo;
	if (llm_engine_flags_parse(cfg.kv_dtype, cfg.weight_pages, &eo.kv_dtype, &eo.weight_pages) ||
	    llm_lm_head_parse(cfg.lm_head, &eo.lm_head))
		return llm_args_usage_error(&cli, "%s", llm_errmsg());
	if (llm_spec_opts_set(&spec, cfg.speculate, llm_args_given(&cfg.spec_tokens) ? cfg.spec_tokens : 0,
	                      llm_args_given(&cfg.spec_ngram) ? cfg.spec_ngram : 0, cfg.draft))
		return llm_args_usage_error(&cli, "%s", llm_errmsg());
	for (int i = 0; i < cfg.logit_bias.n; i++)
		if (llm_logit_bias_parse(cfg.logit_bias.v[i], &cli_bias[n_cli_bias++]))
			return llm_args_usage_error(&cli, "--logit-bias %s", llm_errmsg());
	size_t tlen;
	if (cfg.chat_template && llm_read_file(cfg.chat_template, &template_src, &tlen))
		llm_die("%s", llm_errmsg());
	if (llm_comm_init(&world, &argc, &argv))
		llm_die("%s", llm_errmsg());
	if (!root()) {          /* the tokenizer modes run on rank 0 alone; the others follow its engine */
		if (!mode->tok)
			follow();
		if (llm_comm_finalize(world))
			llm_die("%s", llm_errmsg());
		return 0;
	}
	/* generation from prompt_ids needs no tokenizer: a checkpoint without
	 * tokenizer files (random weights) still runs */
	struct llm_tokenizer *tk = NULL;
	int absent;
	if (llm_tokenizer_open_optional(&tk, cfg.model, &absent) && (!gen || !absent || cfg.prompt || cfg.prompt_file))
		die_msg();
	enum llm_status s = mode->run(tk);
	llm_tokenizer_close(tk), free(template_src);
	if (s)
		die_msg();
	if (llm_comm_finalize(world))
		llm_die("%s", llm_errmsg());
	if (llm_interrupt)   /* the modes that catch signals wrote what was done */
		fprintf(stderr, "%s: interrupted: %zu of %zu %s, results written\n", llm_progname(), n_done, n_total, done_what);
	return llm_interrupt ? 128 + llm_interrupt : 0;
}
