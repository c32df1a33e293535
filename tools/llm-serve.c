/* tools/llm-serve.c: an OpenAI- and TGI-compatible HTTP server with
 * continuous batching (Dynamic SplitFuse), a paged KV cache with preemption
 * and prefix caching. The work is in libllm (server.c, scheduler.c, the KV
 * sizing in memplan.c); main parses flags, asks the library to size the KV
 * cache (or print the plan), starts the server and waits for
 * SIGTERM/SIGINT, then drains.
 *
 * Distributed (mpirun -np T*P over a checkpoint partitioned by
 * llm-repartition): rank 0 serves; the other ranks open their share of the
 * engine and follow rank 0's steps (llm_engine_serve_worker) until rank 0
 * stops them. Every rank sizes the KV cache from config.json alone, so the
 * block count (what the scheduler plans with) is the same on all of them. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>

#include "llm.h"
#include "server.h"

struct serve_cfg {
	const char *model, *host, *api_key, *api_key_file, *chat_template, *name, *port_file, *backend, *kv_dtype, *weight_pages, *lm_head, *speculate, *draft;
	struct llm_strlist lora;
	int64_t port, max_running, max_batch_tokens, kv_block_size, max_kv_tokens, ctx_size, prefix_cache, spec_tokens, spec_ngram;
	int64_t max_queue, threads, default_max_tokens, timeout, max_connections, max_conn_per_client, max_logprob_entries;
	size_t kv_memory, max_body, assume_memory;
	double drain_timeout, request_timeout, stall_timeout;
	int plan, check_weights, allow_unauth, runtime_lora;
};

static struct serve_cfg cfg = {
	.host = "127.0.0.1", .port = 8080, .backend = "auto", .kv_dtype = "bf16", .weight_pages = "auto", .lm_head = "auto",
	.max_running = 16, .max_batch_tokens = 256, .kv_block_size = 16, .prefix_cache = 8,
	.max_queue = 64, .max_body = 1 << 20, .drain_timeout = 30, .default_max_tokens = 16,
	.timeout = 30, .max_connections = 1000, .max_conn_per_client = 256, .request_timeout = 30, .stall_timeout = 120,
	.max_logprob_entries = 100000,
	.spec_tokens = LLM_SPEC_DEFAULT_TOKENS, .spec_ngram = LLM_SPEC_DEFAULT_NGRAM,
};

static struct llm_comm *world;   /* llm_comm_init: one rank unless under mpirun */

static const struct llm_opt opts[] = {
	LLM_STR('m', "model", "DIR", &cfg.model, "checkpoint directory or .safetensors file (required)"),
	LLM_STR(0, "host", "ADDR", &cfg.host, "address to bind; anything but loopback exposes the server"),
	LLM_INT(0, "port", "N", &cfg.port, "TCP port; 0 picks a free one (see --port-file)", 0, 65535),
	LLM_STR(0, "port-file", "FILE", &cfg.port_file, "write the bound port to FILE once listening"),
	LLM_STR(0, "api-key", "KEY", &cfg.api_key, "require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (all but /health); "
	        "without it and --api-key-file, the LLM_API_KEY environment variable"),
	LLM_STR(0, "api-key-file", "FILE", &cfg.api_key_file, "the API key is the first line of FILE (kept out of ps)"),
	LLM_FLAG(0, "allow-unauthenticated", &cfg.allow_unauth, "listen beyond loopback (--host) without an API key"),
	LLM_STR(0, "chat-template", "FILE", &cfg.chat_template, "Jinja chat template to use instead of the model's"),
	LLM_STR(0, "served-model-name", "NAME", &cfg.name, "model name in /v1/models and responses (default: the checkpoint's base name)"),
	LLM_INT(0, "max-running", "N", &cfg.max_running, "requests in the running batch at most", 1, 1024),
	LLM_INT(0, "max-batch-tokens", "N", &cfg.max_batch_tokens,
	        "SplitFuse token budget of one forward step (decodes first, then prompt chunks)", 1, 1 << 20),
	LLM_INT(0, "kv-block-size", "N", &cfg.kv_block_size, "token positions per KV block", 1, 4096),
	LLM_KV_MEMORY_OPT(&cfg.kv_memory, "--max-running full contexts, at most 90% of the memory free after the weights and activations"),
	LLM_SIZE(0, "assume-memory", "SIZE", &cfg.assume_memory, "size the default KV cache (and --plan) as if SIZE were "
	         "free (MemAvailable; on CUDA the device's free memory) instead of measuring it"),
	LLM_INT(0, "max-kv-tokens", "N", &cfg.max_kv_tokens, "KV cache size in token positions (instead of --kv-memory)", 0, INT32_MAX),
	LLM_STR(0, "kv-dtype", "TYPE", &cfg.kv_dtype, "KV cache dtype: bf16, f32 or fp8 (E4M3, a scale per token and head)"),
	LLM_INT('c', "ctx-size", "N", &cfg.ctx_size, "context length (0: the model's)", 0, INT32_MAX),
	LLM_INT(0, "prefix-cache", "N", &cfg.prefix_cache, "prompt prefixes kept for reuse (0: no prefix caching)", 0, 1024),
	LLM_SPEC_OPTS(&cfg.speculate, &cfg.spec_tokens, &cfg.spec_ngram, &cfg.draft),
	LLM_INT(0, "max-queue", "N", &cfg.max_queue, "requests waiting beyond the running ones; more get 429", 0, 1 << 20),
	LLM_SIZE(0, "max-body", "SIZE", &cfg.max_body, "largest request body; larger get 413"),
	LLM_INT(0, "max-logprob-entries", "N", &cfg.max_logprob_entries, "log-prob entries one request may be answered "
	        "with (choices x tokens with log-probs x (1 + alternatives), prompt and generated); more get 400; 0: no limit",
	        0, INT64_MAX),
	LLM_INT(0, "default-max-tokens", "N", &cfg.default_max_tokens, "max_tokens of /v1/completions when absent", 1, INT32_MAX),
	LLM_INT(0, "timeout", "SECONDS", &cfg.timeout,
	        "close a connection idle this long (nothing received or sent; not while its request waits for the engine); 0: never", 0, 86400),
	LLM_FLOAT(0, "request-timeout", "SECONDS", &cfg.request_timeout, "close a connection that has not delivered a whole "
	          "request (head and body) this long after it opened or had its last answer (408 if it never had one); 0: never",
	          0, 86400),
	LLM_INT(0, "max-connections", "N", &cfg.max_connections, "open connections at most; a new one beyond closes one "
	        "without a whole request (idle after an answer, else the slowest), or gets 503 when all are at work",
	        1, 1 << 20),
	LLM_INT(0, "max-conn-per-client", "N", &cfg.max_conn_per_client,
	        "open connections from one IP address at most (0: no limit); beyond it, as --max-connections among that "
	        "address's connections", 0, 1 << 20),
	LLM_FLOAT(0, "stall-timeout", "SECONDS", &cfg.stall_timeout, "/health answers 503 (\"stalled\") when the engine "
	          "has had work this long without finishing a step; 0: never", 0, 86400),
	LLM_FLOAT(0, "drain-timeout", "SECONDS", &cfg.drain_timeout, "on SIGTERM, time given to running requests", 0, 86400),
	LLM_STR(0, "backend", "NAME", &cfg.backend, "auto, cpu or cuda[:N]"),
	LLM_STR(0, "weight-pages", "MODE", &cfg.weight_pages, "where the CPU reads the weights: huge (copied into 2 MiB transparent huge pages), map (the checkpoint's file mapping, no copy) or auto (huge on the cpu backend, the copy read in the background)"),
	LLM_LIST(0, "lora", "[NAME=]DIR", &cfg.lora, "serve the PEFT LoRA adapter in DIR as NAME (default: DIR's base name; "
	         "repeatable; cpu backend): a request runs with it when its \"model\" (TGI: \"adapter_id\") names it, else with the base"),
	LLM_FLAG(0, "allow-runtime-lora", &cfg.runtime_lora, "take POST /v1/load_lora_adapter and /v1/unload_lora_adapter (cpu backend)"),
	LLM_INT('t', "threads", "N", &cfg.threads, "CPU threads (0: every CPU)", 0, 4096),
	LLM_FLAG(0, "plan", &cfg.plan, "print the memory plan as JSON without loading the weights, and exit"),
	LLM_STR(0, "lm-head", "MODE", &cfg.lm_head, "the lm_head in memory: fp8 (a BF16, F16 or F32 head quantized to FP8 E4M3 at load, one scale per row), file (as the checkpoint stores it) or auto (fp8 on the cpu backend when the checkpoint holds FP8 weights)"),
	LLM_FLAG(0, "check-weights", &cfg.check_weights, "scan every weight for NaN or Inf before serving; refuse to load if one holds any"),
};

static const struct llm_cli cli = {
	.usage = "llm-serve [options] -m DIR",
	.summary = "Serve a model over HTTP: OpenAI /v1/completions, /v1/chat/completions and /v1/responses,\n"
	           "Anthropic /v1/messages, TGI /generate, /health and Prometheus /metrics, with continuous\n"
	           "batching and a paged KV cache.",
	.example = "llm-serve -m models/smollm2-135m-fp8 --port 8080 --max-batch-tokens 512",
	.opts = opts, .n_opts = (int)(sizeof opts / sizeof *opts), .min_pos = 0, .max_pos = 0,
};

/* HOST names this machine only: localhost, 127.0.0.0/8, ::1 or
 * ::ffff:127.x.y.z. Anything else, a wildcard or a host name included, may
 * be reachable from other machines. */
static int host_is_loopback(const char *host)
{
	struct in_addr a4;
	struct in6_addr a6;
	if (!strcmp(host, "localhost"))
		return 1;
	if (inet_pton(AF_INET, host, &a4) == 1)
		return (ntohl(a4.s_addr) >> 24) == 127;
	if (inet_pton(AF_INET6, host, &a6) == 1)
		return IN6_IS_ADDR_LOOPBACK(&a6) || (IN6_IS_ADDR_V4MAPPED(&a6) && a6.s6_addr[12] == 127);
	return 0;
}

/* The API key: --api-key or --api-key-file (not both), else LLM_API_KEY;
 * NULL when none. *OWNED gets what to free. Exits 2 on a usage error, 1
 * on an unreadable file. */
static const char *api_key(char **owned)
{
	*owned = NULL;
	if (cfg.api_key && cfg.api_key_file)
		exit(llm_args_usage_error(&cli, "--api-key and --api-key-file are two ways to say one thing; give one"));
	if (cfg.api_key && !*cfg.api_key)
		exit(llm_args_usage_error(&cli, "--api-key: empty"));
	if (cfg.api_key && llm_server_key_flaw(cfg.api_key))
		exit(llm_args_usage_error(&cli, "--api-key: the key %s", llm_server_key_flaw(cfg.api_key)));
	if (cfg.api_key)
		return cfg.api_key;
	if (cfg.api_key_file) {
		if (llm_server_key_file(cfg.api_key_file, owned))
			llm_die("--api-key-file: %s", llm_errmsg());
		return *owned;
	}
	const char *e = getenv("LLM_API_KEY");
	if (e && !*e)
		exit(llm_args_usage_error(&cli, "LLM_API_KEY is set but empty; unset it or give the key"));
	if (e && llm_server_key_flaw(e))
		exit(llm_args_usage_error(&cli, "LLM_API_KEY: the key %s", llm_server_key_flaw(e)));
	return e;
}

/* End with MSG: naming the rank (and ending the job) when distributed. */
static _Noreturn void fatal(const char *msg)
{
	if (world && world->size > 1)
		llm_comm_die("%s", msg);
	llm_die("%s", msg);
}

/* Distributed: what cannot run over ranks, refused by rank 0 in one line;
 * every rank exits with STATUS. */
static int refuse_dist(void)
{
	const char *why = NULL;
	int status = 2;
	if (cfg.lora.n || cfg.runtime_lora)
		why = cfg.lora.n ? "--lora: a LoRA adapter on a distributed run is not supported: merge it (llm-finetune --merge) "
		      "and partition that" : "--allow-runtime-lora: a LoRA adapter on a distributed run is not supported: "
		      "merge it (llm-finetune --merge) and partition that";
	else if (cfg.plan)
		why = "--plan: run it in one process, without mpirun";
	else if (cfg.draft)
		why = "--speculate draft: run it in one process, without mpirun";
	else if (!llm_model_is_partitioned(cfg.model)) {
		why = "needs a checkpoint partitioned by llm-repartition --tp T --pp P (T x P = the ranks of mpirun -np)";
		status = 1;
	}
	if (!why)
		return 0;
	if (world->rank == 0)
		fprintf(stderr, "%s: %s%s%s\n", llm_progname(), status == 1 ? cfg.model : "", status == 1 ? ": " : "", why);
	llm_comm_finalize(world);
	return status;
}

/* Rank 0 lost another rank (the server has failed every request with 503
 * naming it): /health answers 503 for LOST_GRACE_S more seconds, so the
 * answers reach their clients and a health check sees the failure; then
 * the process ends without stopping the server, whose engine thread may
 * be waiting inside MPI for the lost rank forever. */
#define LOST_GRACE_S 5
static _Noreturn void lost_rank_exit(struct llm_server *srv, const sigset_t *set)
{
	const char *err;
	llm_server_state(srv, &err);
	struct timespec tick = { 0, 100 * 1000 * 1000 };
	for (double t0 = llm_now(); llm_now() - t0 < LOST_GRACE_S; )
		sigtimedwait(set, NULL, &tick);
	fprintf(stderr, "%s: %s\n", llm_progname(), err);
	fflush(stderr);
	_exit(1);
}

/* A rank other than 0: open this rank's share and follow rank 0's steps. */
static int serve_worker(const struct llm_engine_opts *eo)
{
	struct llm_engine *e;
	if (llm_engine_open(&e, cfg.model, eo) || llm_engine_serve_worker(e))
		llm_comm_die("%s", llm_errmsg());
	struct llm_serve_stats st;
	llm_engine_serve_stats(e, &st);
	if (world->rank == 1)
		LLM_INFO("llm-serve: rank 1: followed %lld steps (%lld KV operations, %lld tokens): %llu bytes from rank 0, "
		         "%.0f per step\n", (long long)st.steps, (long long)st.kv_ops, (long long)st.tokens,
		         (unsigned long long)st.bytes, st.steps ? (double)st.bytes / (double)st.steps : 0.0);
	llm_engine_close(e);
	if (llm_comm_finalize(world))
		llm_die("%s", llm_errmsg());
	return 0;
}

int main(int argc, char **argv)
{
	llm_set_progname(argv[0]);
	const char *pos[16];
	int n_pos;
	int rc = llm_args_parse(argc, argv, &cli, pos, &n_pos);
	if (rc != LLM_ARGS_OK)
		return rc == LLM_ARGS_EXIT ? 0 : 2;
	if (!cfg.model)
		return llm_args_usage_error(&cli, "-m DIR is required");
	if (llm_model_check_args(cfg.model, cfg.ctx_size))
		return llm_args_usage_error(&cli, "%s", llm_errmsg());
	enum llm_dtype kvd;
	enum llm_weight_pages wp;
	enum llm_lm_head head;
	if (llm_engine_flags_parse(cfg.kv_dtype, cfg.weight_pages, &kvd, &wp) || llm_lm_head_parse(cfg.lm_head, &head))
		return llm_args_usage_error(&cli, "%s", llm_errmsg());
	if (cfg.max_kv_tokens > 0 && cfg.kv_memory > 0)
		return llm_args_usage_error(&cli, LLM_KV_SIZE_TWICE);
	struct llm_spec_opts spec;
	if (llm_spec_opts_set(&spec, cfg.speculate, llm_args_given(&cfg.spec_tokens) ? cfg.spec_tokens : 0,
	                      llm_args_given(&cfg.spec_ngram) ? cfg.spec_ngram : 0, cfg.draft))
		return llm_args_usage_error(&cli, "%s", llm_errmsg());

	char *key_buf;
	const char *key = api_key(&key_buf);
	if (!key && !cfg.plan && !host_is_loopback(cfg.host)) {
		if (!cfg.allow_unauth)
			return llm_args_usage_error(&cli, "--host %s listens beyond loopback without an API key: give --api-key, "
			                            "--api-key-file or LLM_API_KEY, or --allow-unauthenticated", cfg.host);
		llm_warn("WARNING: --host %s: anyone who can reach this address can use the server (no API key, "
		         "--allow-unauthenticated)", cfg.host);
	}

	struct llm_server_opts so = {
		.model = cfg.model, .host = cfg.host, .port = (int)cfg.port, .api_key = key,
		.model_name = cfg.name, .max_queue = (int)cfg.max_queue, .max_body = cfg.max_body,
		.default_max_tokens = (int)cfg.default_max_tokens, .timeout = (unsigned)cfg.timeout,
		.max_connections = (unsigned)cfg.max_connections, .max_conn_per_client = (unsigned)cfg.max_conn_per_client,
		.request_timeout = cfg.request_timeout, .stall_timeout = cfg.stall_timeout,
		.max_logprob_entries = cfg.max_logprob_entries,
		.sched = { .max_running = (int)cfg.max_running, .max_batch_tokens = (int)cfg.max_batch_tokens,
		           .prefix_entries = (int)cfg.prefix_cache, .spec = spec },
	};
	struct llm_engine_opts eo = LLM_ENGINE_OPTS_DEFAULT;
	eo.backend = cfg.backend;
	eo.lora = cfg.lora.v;
	eo.n_lora = cfg.lora.n;
	eo.lora_runtime = cfg.runtime_lora;
	so.allow_runtime_lora = cfg.runtime_lora;
	eo.n_threads = (int)cfg.threads;
	eo.kv_dtype = kvd;
	eo.weight_pages = wp;
	eo.lm_head = head;
	eo.check_weights = cfg.check_weights;
	eo.kv_block_size = (int)cfg.kv_block_size;
	eo.max_seqs = (int)(cfg.max_running + cfg.prefix_cache);
	eo.max_batch_tokens = (int)cfg.max_batch_tokens;
	eo.max_logits = (int)cfg.max_running * (1 + (spec.mode ? spec.n_draft : 0));   /* a row per drafted token too */

	/* signals go to sigwait below, not to the server's threads (nor to
	 * MPI's: blocked before llm_comm_init starts them); ranks other than 0
	 * never take them: they stop when rank 0 says so */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	llm_server_fd_limit((unsigned)cfg.max_connections);   /* a descriptor per connection */
	if (llm_comm_init(&world, &argc, &argv))
		llm_die("%s", llm_errmsg());
	int dist = world->size > 1;
	if (dist && (rc = refuse_dist()))
		return rc;

	/* the plan: the model is mapped, not loaded; distributed, every rank
	 * sizes the cache from config.json alone, so all find the same */
	struct llm_model m = { 0 };
	if (dist ? llm_model_geometry(&m, cfg.model) : llm_model_open(&m, cfg.model))
		fatal(llm_errmsg());
	struct llm_mem_plan p;
	struct llm_kv_fit fit;
	struct llm_kv_size ks = { .tokens = cfg.max_kv_tokens, .bytes = cfg.kv_memory, .n_seq = (int)cfg.max_running,
	                          .assume = cfg.assume_memory, .backend = cfg.backend };
	enum llm_status ksz = llm_kv_size_opts(&m, (int)cfg.ctx_size, &ks, &eo, &p, &fit);
	if (ksz && ksz != LLM_ERR_RANGE)     /* the free memory could not be read */
		fatal(llm_errmsg());
	int64_t fits = ksz == LLM_OK, agreed[2] = { eo.kv_blocks, fits };
	if (dist && llm_comm_bcast(world, agreed, sizeof agreed, 0))   /* rank 0's memory decides for all */
		fatal(llm_errmsg());
	eo.kv_blocks = agreed[0], fits = agreed[1];
	if (!fits && world->rank == 0)
		llm_warn("%s", llm_errmsg());
	if (!dist)
		llm_model_close(&m);
	if (cfg.plan) {
		char *js = llm_mem_plan_json(cfg.model, &p, &fit, (int)cfg.max_running, (int)fits);
		if (!js)
			llm_die("out of memory");
		puts(js);
		free(js);
		return fits ? 0 : 1;
	}
	if (!fits) {
		if (dist)
			llm_comm_finalize(world);
		return 1;
	}
	if (dist && world->rank > 0)
		return serve_worker(&eo);
	char *tmpl = NULL;
	if (cfg.chat_template) {
		size_t len;
		if (llm_read_file(cfg.chat_template, &tmpl, &len))
			fatal(llm_errmsg());
		so.chat_template = tmpl;
	}
	so.eng = eo;

	struct llm_server *srv;
	if (llm_server_start(&srv, &so))
		fatal(llm_errmsg());
	int port = llm_server_port(srv);
	LLM_INFO("llm-serve: listening on http://%s:%d (loading %s)\n", cfg.host, port, cfg.model);
	if (cfg.port_file) {
		char line[32];
		int n = snprintf(line, sizeof line, "%d\n", port);
		if (llm_write_file_atomic(cfg.port_file, line, (size_t)n)) {
			char msg[600];
			snprintf(msg, sizeof msg, "%s", llm_errmsg());
			llm_server_stop(srv);
			fatal(msg);
		}
	}
	int announced = 0, sig = 0;
	struct timespec tick = { 0, 100 * 1000 * 1000 };
	for (;;) {
		const char *err;
		enum llm_server_state st = llm_server_state(srv, &err);
		if (st == LLM_SERVER_FAILED && llm_server_lost_rank(srv) >= 0)
			lost_rank_exit(srv, &set);
		if (st == LLM_SERVER_FAILED) {
			char msg[600];
			snprintf(msg, sizeof msg, "%s", err);
			llm_server_stop(srv);
			free(tmpl);
			fatal(msg);
		}
		if (st == LLM_SERVER_READY && !announced) {
			LLM_INFO("llm-serve: ready\n");
			announced = 1;
		}
		sig = sigtimedwait(&set, NULL, &tick);
		if (sig == SIGTERM || sig == SIGINT)
			break;
	}
	LLM_INFO("llm-serve: %s: draining (%d in flight, up to %.0f s)\n", sig == SIGTERM ? "SIGTERM" : "SIGINT",
	         llm_server_in_flight(srv), cfg.drain_timeout);
	llm_server_drain(srv);
	double t0 = llm_now();
	while (llm_server_in_flight(srv) > 0 && llm_now() - t0 < cfg.drain_timeout) {
		if (sigtimedwait(&set, NULL, &tick) > 0)
			break;           /* a second signal: stop now */
	}
	if (llm_server_lost_rank(srv) >= 0)
		lost_rank_exit(srv, &set);
	int left = llm_server_in_flight(srv);
	if (left)
		llm_warn("%d requests still running after the drain; cancelled", left);
	llm_server_stop(srv);     /* distributed: the other ranks stop too */
	free(key_buf);
	free(tmpl);
	LLM_INFO("llm-serve: stopped\n");
	if (llm_comm_finalize(world))
		llm_die("%s", llm_errmsg());
	return 0;
}
