/* tools/llm-bench.c: measure a server under load (llm-bench serve URL) or a
 * model's prompt and generation throughput (llm-bench model CKPT). The work
 * is in libllm (bench.c); main parses flags, builds the prompts, calls one
 * run per rate, concurrency or batch size, and prints the rows. */
#define _GNU_SOURCE
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "llm.h"
#include "bench.h"

static const char *rates = NULL, *concs = NULL, *trace = NULL, *format = "table", *plot = NULL;
static const char *api_key = NULL, *model = NULL, *backends = "auto", *batches = "1", *title = NULL;
static const char *weight_pages = "auto", *kv_dtype = "bf16", *lm_head = "auto";
static int64_t input_len = 128, output_len = 64, requests = 64, seed = 1, shared_prefix = 0, id_range = 500;
static int64_t n_prompt = 512, n_gen = 128, n_depth = 0, reps = 3, threads = 0;
static double duration = 0, slo_ttft = 2000, slo_itl = 250, timeout_s = 600, min_tok_s = 0;
static double temperature = 0, top_p = 1;
static struct llm_progress pg;   /* progress and the summary on stderr; -q: none */

static const struct llm_opt opts[] = {
	LLM_STR(0, "rate", "LIST", &rates, "serve: Poisson arrival rates in req/s, e.g. 1,2,4,8 (inf: all at once); sweep[:R]: R (0.25), 2R, 4R... until saturation"),
	LLM_STR(0, "concurrency", "LIST", &concs, "serve: fixed numbers of concurrent clients instead, e.g. 1,16"),
	LLM_INT(0, "input-len", "N", &input_len, "serve: synthetic prompt length in tokens", 1, 1 << 20),
	LLM_INT(0, "output-len", "N", &output_len, "serve: tokens to generate per request", 1, 1 << 20),
	LLM_INT(0, "shared-prefix", "N", &shared_prefix, "serve: the first N prompt tokens are the same in every request", 0, 1 << 20),
	LLM_INT(0, "id-range", "N", &id_range, "serve: synthetic prompt ids are drawn from [3, N)", 4, INT32_MAX),
	LLM_STR(0, "trace", "FILE", &trace, "serve: JSONL of {\"prompt\": text or ids, \"output_len\": N} instead"),
	LLM_INT(0, "requests", "N", &requests, "serve: requests per rate or concurrency", 1, 1 << 24),
	LLM_FLOAT(0, "duration", "SECONDS", &duration, "serve: stop sending after this long (0: no limit)", 0, 1e7),
	LLM_FLOAT(0, "slo-ttft", "MS", &slo_ttft, "serve: goodput counts requests with TTFT at most this", 0, 1e9),
	LLM_FLOAT(0, "slo-itl", "MS", &slo_itl, "serve: ... and TPOT at most this", 0, 1e9),
	LLM_FLOAT(0, "timeout", "SECONDS", &timeout_s, "serve: per-request timeout", 0.001, 1e7),
	LLM_FLOAT(0, "temperature", "T", &temperature, "serve: sampling temperature sent with every request (0: greedy)", 0, 100),
	LLM_FLOAT(0, "top-p", "P", &top_p, "serve: top_p sent with every request", 1e-6, 1),
	LLM_STR(0, "model", "NAME", &model, "serve: model name to send (default: the server's /v1/models)"),
	LLM_STR(0, "api-key", "KEY", &api_key, "serve: send Authorization: Bearer KEY"),
	LLM_INT(0, "seed", "N", &seed, "serve: seed of the arrivals and synthetic prompts", 0, INT64_MAX),
	LLM_STR(0, "plot", "FILE", &plot, "serve --rate: draw rate against latency and throughput (.svg or .png, gnuplot)"),
	LLM_STR(0, "title", "TEXT", &title, "serve: title of the plot"),
	LLM_INT('p', "n-prompt", "N", &n_prompt, "model: prompt tokens of the pp test (0: skip)", 0, 1 << 20),
	LLM_INT('n', "n-gen", "N", &n_gen, "model: generated tokens of the tg test (0: skip)", 0, 1 << 20),
	LLM_INT('d', "depth", "N", &n_depth, "model: context each test starts after (one untimed prefill per sequence, shared by every run)", 0, 1 << 20),
	LLM_STR('b', "batch", "LIST", &batches, "model: sequences decoding together in the tg test, e.g. 1,4,16"),
	LLM_INT('r', "repetitions", "N", &reps, "model: repetitions (after one warm-up)", 1, 1000),
	LLM_STR(0, "backend", "LIST", &backends, "model: backends to measure, e.g. cpu,cuda"),
	LLM_INT('t', "threads", "N", &threads, "model: CPU threads (0: every CPU)", 0, 4096),
	LLM_STR(0, "kv-dtype", "TYPE", &kv_dtype, "model: KV cache dtype: bf16, f32 or fp8 (E4M3, a scale per token and head)"),
	LLM_STR(0, "weight-pages", "MODE", &weight_pages, "model: where the CPU reads the weights: huge, map or auto (llm-generate(1))"),
	LLM_STR(0, "lm-head", "MODE", &lm_head, "model: the lm_head in memory: fp8, file or auto (llm-generate(1))"),
	LLM_STR(0, "format", "FMT", &format, "table, csv or jsonl"),
	LLM_FLOAT(0, "min-tok-s", "X", &min_tok_s, "gate: exit 3 when the best output tok/s is below X", 0, 1e12),
};

static const struct llm_cli cli = {
	.usage = "llm-bench [options] serve URL | model CKPT",
	.summary = "Benchmark a running server under load (serve: Poisson arrivals or fixed concurrency,\n"
	           "TTFT/ITL/TPOT/e2e percentiles, goodput) or a model's prompt and generation tokens/s (model).\n"
	           "The report goes to standard output; progress and a closing summary to standard error (-q: neither).",
	.example = "llm-bench serve http://127.0.0.1:8080 --rate 1,2,4,8 --input-len 2048 --output-len 256 --plot rates.svg",
	.opts = opts, .n_opts = (int)(sizeof opts / sizeof *opts), .min_pos = 2, .max_pos = 2,
};

static int split_list(const char *s, double *v, int max, int allow_inf)
{
	char buf[512];
	snprintf(buf, sizeof buf, "%s", s);
	int n = 0;
	for (char *save, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (n == max)
			return -1;
		if (allow_inf && !strcmp(t, "inf"))
			v[n++] = INFINITY;
		else if (llm_parse_float(t, &v[n]) || !(v[n] > 0))
			return -1;
		else
			n++;
	}
	return n;
}

static void header(const char *what, const char *arg)
{
	char commit[64] = "unknown", cpu[256] = "unknown";
	FILE *p = popen("git rev-parse --short HEAD 2>/dev/null", "r");
	if (p) {
		if (fgets(commit, sizeof commit, p))
			commit[strcspn(commit, "\n")] = 0;
		pclose(p);
	}
	FILE *f = fopen("/proc/cpuinfo", "r");
	char line[512];
	while (f && fgets(line, sizeof line, f))
		if (!strncmp(line, "model name", 10) && strchr(line, ':')) {
			snprintf(cpu, sizeof cpu, "%s", strchr(line, ':') + 2);
			cpu[strcspn(cpu, "\n")] = 0;
			break;
		}
	if (f)
		fclose(f);
	printf("# llm-bench %s %s\n# commit: %s\n# device (this machine): %s, %ld CPUs\n", what, arg, commit, cpu,
	       sysconf(_SC_NPROCESSORS_ONLN));
}

static int load_trace(const char *path, struct llm_bench_prompt **out, int *n)
{
	FILE *f = fopen(path, "r");
	if (!f) {
		llm_fail(LLM_ERR_IO, "%s: cannot open", path);
		return -1;
	}
	char *line = NULL;
	size_t cap = 0;
	int ln = 0, cnt = 0;
	struct llm_bench_prompt *p = NULL;
	while (getline(&line, &cap, f) > 0) {
		ln++;
		if (strspn(line, " \t\r\n") == strlen(line))
			continue;
		json_error_t e;
		json_t *o = json_loads(line, 0, &e);
		json_t *pr = json_object_get(o, "prompt"), *ol = json_object_get(o, "output_len");
		if (!o || !(json_is_string(pr) || json_is_array(pr)) || !json_is_integer(ol) || json_integer_value(ol) < 1) {
			llm_fail(LLM_ERR_FORMAT, "%s: line %d: expected {\"prompt\": text or ids, \"output_len\": N}", path, ln);
			json_decref(o);
			free(line);
			fclose(f);
			return -1;
		}
		p = realloc(p, (size_t)(cnt + 1) * sizeof *p);
		memset(&p[cnt], 0, sizeof *p);
		p[cnt].output_len = (int)json_integer_value(ol);
		if (json_is_string(pr)) {
			p[cnt].text = llm_strdup(json_string_value(pr));
		} else {
			p[cnt].n_ids = (int)json_array_size(pr);
			p[cnt].ids = malloc((size_t)p[cnt].n_ids * sizeof(int32_t) + 1);
			for (int i = 0; i < p[cnt].n_ids; i++)
				p[cnt].ids[i] = (int32_t)json_integer_value(json_array_get(pr, (size_t)i));
		}
		cnt++;
		json_decref(o);
	}
	free(line);
	fclose(f);
	if (cnt == 0) {
		llm_fail(LLM_ERR_FORMAT, "%s: no requests", path);
		return -1;
	}
	*out = p;
	*n = cnt;
	return 0;
}

static int cmp_rate(const void *a, const void *b)
{
	double x = ((const struct llm_bench_serve_result *)a)->rate, y = ((const struct llm_bench_serve_result *)b)->rate;
	return (x > y) - (x < y);
}

static int run_serve(const char *url, enum llm_bench_format fmt)
{
	double list[64], sweep = 0;
	int n_list = 0, conc_mode = concs != NULL;
	if (rates && concs)
		return llm_args_usage_error(&cli, "--rate and --concurrency are two kinds of runs; give one");
	if (rates && !strncmp(rates, "sweep", 5)) {
		sweep = 0.25;
		if ((rates[5] && rates[5] != ':') || (rates[5] == ':' && (llm_parse_float(rates + 6, &sweep) || !(sweep > 0))))
			return llm_args_usage_error(&cli, "--rate sweep[:R]: R a positive rate in req/s");
		list[0] = sweep;
		n_list = 1;
	} else if ((n_list = split_list(conc_mode ? concs : rates ? rates : "inf", list, 64, !conc_mode)) < 1)
		return llm_args_usage_error(&cli, "--%s: expected a comma-separated list of positive numbers",
		                            conc_mode ? "concurrency" : "rate");
	if (shared_prefix >= input_len && !trace)
		return llm_args_usage_error(&cli, "--shared-prefix %lld must be below --input-len %lld",
		                            (long long)shared_prefix, (long long)input_len);
	struct llm_bench_prompt *pr = NULL;
	int n_pr = 0;
	if (trace) {
		if (load_trace(trace, &pr, &n_pr))
			llm_die("%s", llm_errmsg());
	} else {
		/* synthetic: distinct random ids per request after a shared prefix */
		n_pr = (int)requests;
		pr = calloc((size_t)n_pr, sizeof *pr);
		uint64_t x = (uint64_t)seed * 0x2545F4914F6CDD1Dull + 7;
		int32_t *prefix = malloc((size_t)shared_prefix * sizeof(int32_t) + 4);
		for (int64_t i = 0; i < shared_prefix; i++) {
			x ^= x << 13; x ^= x >> 7; x ^= x << 17;
			prefix[i] = 3 + (int32_t)(x % (uint64_t)(id_range - 3));
		}
		for (int k = 0; k < n_pr; k++) {
			pr[k].n_ids = (int)input_len;
			pr[k].output_len = (int)output_len;
			pr[k].ids = malloc((size_t)input_len * sizeof(int32_t));
			memcpy(pr[k].ids, prefix, (size_t)shared_prefix * sizeof(int32_t));
			for (int64_t i = shared_prefix; i < input_len; i++) {
				x ^= x << 13; x ^= x >> 7; x ^= x << 17;
				pr[k].ids[i] = 3 + (int32_t)(x % (uint64_t)(id_range - 3));
			}
		}
		free(prefix);
	}
	struct llm_bench_serve_opts o = {
		.url = url, .model = model, .api_key = api_key, .n_requests = (int)requests, .duration = duration,
		.slo_ttft_ms = slo_ttft, .slo_itl_ms = slo_itl, .seed = (uint64_t)seed, .prompts = pr, .n_prompts = n_pr,
		.timeout = timeout_s, .progress = &pg, .temperature = temperature, .top_p = top_p,
	};
	char *name = NULL;
	if (llm_bench_serve_model(&o, &name))
		llm_die("%s", llm_errmsg());
	header("serve", url);
	if (trace)
		printf("# config: model %s, trace %s (%d prompts), %lld requests per run", name, trace, n_pr, (long long)requests);
	else
		printf("# config: model %s, input %lld tokens (%lld shared), output %lld tokens, %lld requests per run%s",
		       name, (long long)input_len, (long long)shared_prefix, (long long)output_len, (long long)requests,
		       duration > 0 ? ", duration-bounded" : "");
	if (temperature > 0)
		printf(", temperature %g, top_p %g", temperature, top_p);
	else
		printf(", greedy");
	printf("\n");
	printf("# definitions: TTFT = send to first streamed token; ITL = gaps between streamed tokens (pooled); "
	       "TPOT = (e2e - TTFT)/(tokens - 1) per request; e2e = send to end; tokens counted from the server's "
	       "token_ids; goodput = req/s with TTFT <= %g ms and TPOT <= %g ms; #wrong = not 200/429, no [DONE] or "
	       "a token count other than asked; percentiles are nearest-rank\n", slo_ttft, slo_itl);
	llm_bench_serve_header(stdout, fmt);
	fflush(stdout);
	struct llm_bench_serve_result res[64];
	int wrong = 0, sent = 0, done = 0, slo_miss = 0;
	double best = 0;
	for (int i = 0; i < n_list; i++) {
		enum llm_status st = conc_mode ? llm_bench_serve_run(&o, 0, (int)list[i], &res[i])
		                               : llm_bench_serve_run(&o, list[i], 0, &res[i]);
		llm_progress_clear(&pg);
		if (st)
			llm_die("%s", llm_errmsg());
		llm_bench_serve_row(stdout, fmt, &res[i]);
		fflush(stdout);
		wrong += res[i].wrong;
		sent += res[i].sent;
		done += res[i].completed;
		if (res[i].out_tok_s > best)
			best = res[i].out_tok_s;
		if (sweep > 0) {   /* the next rate: double until saturation, or the SLO missed twice running */
			slo_miss = llm_bench_serve_realtime(&res[i], 1, slo_ttft, slo_itl) < 0 ? slo_miss + 1 : 0;
			if (llm_bench_serve_keeps_up(&res[i]) && slo_miss < 2 && n_list < 12)
				list[n_list++] = list[i] * 2;
			else if (i == n_list - 1 && n_list < 13) {
				/* once: halfway (geometric) between the highest rate that met the SLO and the next */
				int rt = llm_bench_serve_realtime(res, n_list, slo_ttft, slo_itl);
				double nxt = INFINITY;
				for (int k = 0; rt >= 0 && k < n_list; k++)
					if (res[k].rate > res[rt].rate && res[k].rate < nxt)
						nxt = res[k].rate;
				if (rt >= 0 && isfinite(nxt) && nxt > res[rt].rate * 1.2 && sweep > 0) {
					list[n_list++] = sqrt(res[rt].rate * nxt);
					sweep = -1;      /* no more after this one */
				}
			}
		}
	}
	int rt = -1;                 /* the real-time rate's run (rates sorted) */
	if (!conc_mode) {
		qsort(res, (size_t)n_list, sizeof *res, cmp_rate);
		rt = llm_bench_serve_realtime(res, n_list, slo_ttft, slo_itl);
		if (rt >= 0)
			printf("# real-time (p99 TTFT <= %g ms, p99 ITL <= %g ms, every request answered, the rate kept up with): up to %g req/s offered, "
			       "%.1f output tok/s\n", slo_ttft, slo_itl, res[rt].rate, res[rt].out_tok_s);
		else
			printf("# real-time (p99 TTFT <= %g ms, p99 ITL <= %g ms, every request answered, the rate kept up with): none of the rates\n",
			       slo_ttft, slo_itl);
		if (sweep != 0 && !llm_bench_serve_keeps_up(&res[n_list - 1]))
			printf("# saturation: at %g req/s offered, %.2f req/s completed\n", res[n_list - 1].rate,
			       res[n_list - 1].req_s);
	}
	printf("# summary: %d runs, best %.1f output tok/s, %d wrong\n", n_list, best, wrong);
	fflush(stdout);
	double el = llm_progress_elapsed(&pg);
	llm_progress_end(&pg, "%d run%s, %d requests sent, %d done, %d wrong in %.1f s, %.2f req/s", n_list,
	                 n_list == 1 ? "" : "s", sent, done, wrong, el, el > 0 ? done / el : 0);
	int rc = wrong ? 3 : 0;
	if (min_tok_s > 0 && best < min_tok_s) {
		llm_warn("best output %.1f tok/s is below --min-tok-s %g", best, min_tok_s);
		rc = 3;
	}
	if (plot) {
		char t[300];
		snprintf(t, sizeof t, "%s", title ? title : name);
		if (conc_mode)
			llm_warn("--plot draws --rate runs; skipped for --concurrency");
		else if (llm_bench_serve_plot(plot, res, n_list, t, rt >= 0 ? res[rt].rate : 0))
			llm_die("%s", llm_errmsg());
	}
	for (int k = 0; k < n_pr; k++) {
		free(pr[k].ids);
		free(pr[k].text);
	}
	free(pr);
	free(name);
	return rc;
}

static int run_model(const char *ckpt, enum llm_bench_format fmt)
{
	double bl[64];
	int nb = split_list(batches, bl, 64, 0);
	if (nb < 1)
		return llm_args_usage_error(&cli, "--batch: expected a comma-separated list of positive integers");
	enum llm_dtype kvd;
	enum llm_weight_pages wp;
	enum llm_lm_head head;
	if (llm_engine_flags_parse(kv_dtype, weight_pages, &kvd, &wp) || llm_lm_head_parse(lm_head, &head))
		return llm_args_usage_error(&cli, "%s", llm_errmsg());
	char bbuf[256];
	snprintf(bbuf, sizeof bbuf, "%s", backends);
	header("model", ckpt);
	printf("# config: -p %lld -n %lld -d %lld -b %s -r %lld -t %lld --kv-dtype %s --weight-pages %s --lm-head %s; tokens/s as mean and sample deviation over the repetitions\n",
	       (long long)n_prompt, (long long)n_gen, (long long)n_depth, batches, (long long)reps, (long long)threads, kv_dtype,
	       weight_pages, lm_head);
	if (fmt == LLM_BENCH_TABLE)
		printf("%-10s %-8s %8s %-18s %12s %10s %7s\n%-10s %-8s %8s %-18s %12s %10s %7s\n", "backend", "threads",
		       "batch", "test", "tok/s", "sd", "#wrong", "", "", "", "", "(tok/s)", "(tok/s)", "");
	else if (fmt == LLM_BENCH_CSV)
		printf("backend,threads,batch,test,tok_s,sd,wrong\n");
	int wrong = 0, n_tests = 0;
	double best = 0;
	for (char *save, *be = strtok_r(bbuf, ",", &save); be; be = strtok_r(NULL, ",", &save)) {
		for (int i = 0; i < nb; i++) {
			struct llm_bench_model_opts o = { .backend = be, .n_threads = (int)threads, .n_prompt = i ? 0 : (int)n_prompt,
			                                  .n_gen = (int)n_gen, .batch = (int)bl[i], .reps = (int)reps,
			                                  .n_depth = (int)n_depth, .kv_dtype = kvd, .weight_pages = wp, .lm_head = (int)head,
			                                  .progress = &pg };
			struct llm_bench_model_result r[2];
			int n_r;
			int st = llm_bench_model(ckpt, &o, r, &n_r);
			llm_progress_clear(&pg);
			if (st)
				llm_die("%s", llm_errmsg());
			n_tests += n_r;
			for (int k = 0; k < n_r; k++) {
				int b = strncmp(r[k].test, "pp", 2) ? (int)bl[i] : 1;
				if (fmt == LLM_BENCH_JSONL)
					printf("{\"backend\": \"%s\", \"threads\": %lld, \"batch\": %d, \"test\": \"%s\", \"tok_s\": %.6g, "
					       "\"sd\": %.6g, \"wrong\": %d}\n", be, (long long)threads, b, r[k].test, r[k].mean, r[k].sd, r[k].wrong);
				else if (fmt == LLM_BENCH_CSV)
					printf("%s,%lld,%d,%s,%.6g,%.6g,%d\n", be, (long long)threads, b, r[k].test, r[k].mean, r[k].sd, r[k].wrong);
				else
					printf("%-10s %-8lld %8d %-18s %12.2f %10.2f %7d\n", be, (long long)threads, b, r[k].test, r[k].mean,
					       r[k].sd, r[k].wrong);
				fflush(stdout);
				wrong += r[k].wrong;
				if (r[k].test[0] == 't' && r[k].mean > best)
					best = r[k].mean;
			}
		}
	}
	printf("# summary: best generation %.2f tok/s, %d wrong\n", best, wrong);
	fflush(stdout);
	llm_progress_end(&pg, "%d test%s of %lld repetition%s (and a warm-up each), %d wrong in %.1f s", n_tests,
	                 n_tests == 1 ? "" : "s", (long long)reps, reps == 1 ? "" : "s", wrong, llm_progress_elapsed(&pg));
	if (min_tok_s > 0 && best < min_tok_s) {
		llm_warn("best generation %.2f tok/s is below --min-tok-s %g", best, min_tok_s);
		return 3;
	}
	return wrong ? 3 : 0;
}

int main(int argc, char **argv)
{
	llm_set_progname(argv[0]);
	const char *pos[16];
	int n_pos;
	int rc = llm_args_parse(argc, argv, &cli, pos, &n_pos);
	if (rc != LLM_ARGS_OK)
		return rc == LLM_ARGS_EXIT ? 0 : 2;
	enum llm_bench_format fmt = !strcmp(format, "table") ? LLM_BENCH_TABLE : !strcmp(format, "csv") ? LLM_BENCH_CSV :
	                            !strcmp(format, "jsonl") ? LLM_BENCH_JSONL : (enum llm_bench_format)-1;
	if ((int)fmt < 0)
		return llm_args_usage_error(&cli, "--format: '%s' is not table, csv or jsonl", format);
	if (llm_progress_init(&pg, llm_log_level >= 1 ? stderr : NULL))
		return llm_args_usage_error(&cli, "%s", llm_errmsg());
	if (!strcmp(pos[0], "serve"))
		return run_serve(pos[1], fmt);
	if (!strcmp(pos[0], "model"))
		return run_model(pos[1], fmt);
	return llm_args_usage_error(&cli, "'%s' is not serve or model", pos[0]);
}
