/* common/jobs/bench.h: llm-bench's engine: a load generator for an OpenAI-style
 * server (open-loop Poisson arrivals or fixed concurrency, streamed
 * completions, latency percentiles, goodput under an SLO) and a
 * llama-bench style prompt/generation throughput measurement of a model.
 *
 * Definitions (printed with the numbers):
 *   TTFT  send to the first streamed token;
 *   ITL   gaps between consecutive streamed tokens (all requests pooled);
 *   TPOT  (e2e - TTFT) / (tokens - 1), per request;
 *   e2e   send to the end of the response;
 *   goodput  requests per second with TTFT <= slo_ttft and TPOT <= slo_itl;
 *   accept   speculative decoding's accepted share of the drafted tokens
 *            during the run, from the server's /metrics before and after
 *            (vLLM's vllm:spec_decode_num_{draft,accepted}_tokens_total);
 *            NaN when nothing was drafted or the server has no such counters.
 * Tokens are counted from the server's token ids ("token_ids" of each
 * streamed choice), not from the text. A request is wrong when the status
 * is not 200 or 429, the stream does not end with [DONE], or it carries a
 * token count other than the one asked for (ignore_eos is set).
 *
 * Loopback or any http:// URL; no TLS. The library never prints to stdout:
 * the tool passes the stream to write to. */
#ifndef LLM_BENCH_H
#define LLM_BENCH_H

#include <stdio.h>
#include "status.h"
#include "progress.h"

struct llm_bench_prompt {
	int32_t *ids;              /* token ids (synthetic), or NULL */
	int n_ids;
	char *text;                /* a text prompt (trace), or NULL */
	int output_len;
};

struct llm_bench_serve_opts {
	const char *url;           /* http://HOST:PORT (a path prefix is allowed) */
	const char *model;         /* NULL: ask /v1/models */
	const char *api_key;
	int n_requests;            /* per run */
	double duration;           /* seconds; 0: no limit (arrivals stop after it) */
	double slo_ttft_ms, slo_itl_ms;
	uint64_t seed;             /* arrivals */
	const struct llm_bench_prompt *prompts;
	int n_prompts;             /* used round robin */
	double timeout;            /* per request, seconds */
	struct llm_progress *progress;  /* NULL, or requests done of the run (progress.h) */
	double temperature, top_p; /* sent with every request (temperature 0: greedy; top_p 0 is sent as 1) */
};

struct llm_bench_serve_result {
	double rate;               /* offered req/s (0: fixed concurrency) */
	int concurrency;
	int sent, completed, rejected, wrong;
	double wall;               /* first send to last end, s */
	double req_s, out_tok_s, goodput;
	int64_t out_tokens;
	double ttft[3], itl[3], tpot[3], e2e[3];   /* p50, p90, p99 in ms */
	double itl_median_ms;
	double spec_accept;        /* % of drafted tokens accepted (see accept above); NaN: none */
};

/* The model name the server reports (malloc'ed into *name). */
enum llm_status llm_bench_serve_model(const struct llm_bench_serve_opts *o, char **name);
/* One run: Poisson arrivals at RATE req/s (CONCURRENCY 0), or CONCURRENCY
 * clients each sending the next request when the last is done (RATE 0). */
enum llm_status llm_bench_serve_run(const struct llm_bench_serve_opts *o, double rate, int concurrency,
                                    struct llm_bench_serve_result *r);

enum llm_bench_format { LLM_BENCH_TABLE, LLM_BENCH_CSV, LLM_BENCH_JSONL };
/* Write the column-name and units rows (table/csv), one row, the summary. */
void llm_bench_serve_header(FILE *out, enum llm_bench_format f);
void llm_bench_serve_row(FILE *out, enum llm_bench_format f, const struct llm_bench_serve_result *r);
/* The real-time rate (the seed's definition: TTFT under SLO_TTFT_MS and ITL
 * under SLO_ITL_MS, here at p99, with every request answered and the rate
 * kept up with, llm_bench_serve_keeps_up): the index of the highest offered
 * rate of R[0..n) whose run met it, -1 for none. */
int llm_bench_serve_realtime(const struct llm_bench_serve_result *r, int n, double slo_ttft_ms, double slo_itl_ms);
/* Whether the server kept up with the run's offered rate: completed req/s at
 * least 80% of it, none refused. A sweep doubles the rate until this fails
 * (saturation) or the SLO does twice in a row. */
int llm_bench_serve_keeps_up(const struct llm_bench_serve_result *r);
/* Plot arrival rate against latency and throughput with gnuplot into PATH
 * (.svg or .png); DATA keeps the numbers next to it (PATH.dat). REALTIME:
 * the rate to mark (a vertical line, the knee), or 0. */
enum llm_status llm_bench_serve_plot(const char *path, const struct llm_bench_serve_result *r, int n,
                                     const char *title, double realtime);

/* ---- model throughput (llama-bench style) ------------------------------ */

struct llm_bench_model_opts {
	const char *backend;
	int n_threads;
	int n_prompt, n_gen;       /* -p, -n (0: skip that test) */
	int n_depth;               /* -d: context each test starts after (untimed prefill) */
	int kv_dtype;              /* enum llm_dtype of the KV cache; 0: the engine's default */
	int batch;                 /* sequences decoding together in the generation test */
	int reps;
	int weight_pages;           /* enum llm_weight_pages */
	int lm_head;                /* enum llm_lm_head */
	struct llm_progress *progress;  /* NULL, or repetitions done of the call (progress.h) */
};

struct llm_bench_model_result {
	char test[56];             /* "pp512", "tg128 x4", "tg128 x4 @ d1024" (room for any ints) */
	double mean, sd;           /* tokens/s */
	int wrong;                 /* non-finite logits seen */
};

/* Run the prompt and generation tests on CKPT; R gets up to 2 results. */
enum llm_status llm_bench_model(const char *ckpt, const struct llm_bench_model_opts *o,
                                struct llm_bench_model_result *r, int *n_r);

#endif
