/* common/serve/memplan.c: KV cache sizing and the printed memory plan, and the
 * checks of -m and --ctx-size before a model is loaded (see memplan.h). */
#define _GNU_SOURCE
#include "memplan.h"
#include "fileio.h"
#include "backend.h"
#include "args.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

/* B bytes for people: MiB from 1 GiB up, else KiB, rounded up (a size a
 * message says is needed is enough). */
static void human(size_t b, char *out, size_t n)
{
	if (b >= (1u << 30))
		snprintf(out, n, "%lluMiB", (unsigned long long)((b + (1u << 20) - 1) >> 20));
	else
		snprintf(out, n, "%lluKiB", (unsigned long long)((b + 1023) >> 10));
}

enum llm_status llm_mem_free(const char *backend, size_t *bytes, const char **source)
{
	*bytes = 0;
	*source = "MemAvailable";
	if (!backend)
		backend = "auto";
	int cuda = !strcmp(backend, "cuda") || !strncmp(backend, "cuda:", 5);
#ifdef LLM_CUDA
	/* the hook for the GPU: its free memory, with the weights not yet
	 * uploaded (not run on a device here yet: the CPU path is the tested one) */
	if (cuda || (!strcmp(backend, "auto") && llm_backend_cuda_devices() > 0)) {
		int64_t dev = 0;
		*source = "cudaMemGetInfo";
		if (backend[4] == ':' && llm_parse_int(backend + 5, 0, INT32_MAX, &dev))
			return llm_fail(LLM_ERR_USAGE, "backend '%s': bad device number", backend);
		if (llm_backend_cuda_mem_free((int)dev, bytes))
			return llm_fail_prefix(LLM_ERR_IO, "backend %s", backend);
		return LLM_OK;
	}
#else
	if (cuda)
		return llm_fail(LLM_ERR_USAGE, "backend '%s': built without CUDA support", backend);
#endif
	if (!(*bytes = llm_mem_available()))
		return llm_fail(LLM_ERR_IO, "/proc/meminfo: no MemAvailable to size the KV cache from: "
		                "give --kv-memory or --max-kv-tokens");
	return LLM_OK;
}

enum llm_status llm_kv_size_opts(const struct llm_model *m, int ctx_size, const struct llm_kv_size *sz,
                                 struct llm_engine_opts *o, struct llm_mem_plan *p, struct llm_kv_fit *fit_out)
{
	struct llm_kv_fit fit_here, *fit = fit_out ? fit_out : &fit_here;
	memset(fit, 0, sizeof *fit);
	int n_ctx = ctx_size > 0 && ctx_size < m->cfg.max_ctx ? ctx_size : m->cfg.max_ctx;
	o->n_ctx = n_ctx;
	o->kv_blocks = 1;
	llm_mem_plan(m, o, p);       /* the bytes of a position under O, and of the rest */
	size_t per_tok = p->kv_bytes_per_token, bs = (size_t)p->kv_block_size, blk_bytes = per_tok * bs;
	int64_t need = sz->need > 0 && sz->need < n_ctx ? sz->need : n_ctx;
	/* windowed on every layer (Mistral's; Qwen2's from layer 0): a sequence
	 * holds at most its window, a step's tokens and two partly used blocks
	 * at once (llm_kv_prepare releases the blocks behind the window; the
	 * scheduler admits by the same bound), whatever its length */
	fit->window = llm_config_window_all(&m->cfg);
	int64_t most = fit->window ? (int64_t)fit->window + p->max_batch_tokens + 2 * (int64_t)bs : 0;
	int64_t hold = most && need > most ? most : need;
	int64_t need_blocks = (hold + (int64_t)bs - 1) / (int64_t)bs;
	fit->need = need;
	fit->hold = hold;
	fit->most = most;
	int64_t blocks;
	const char *knob;
	char have[200], what[160], need_s[64];
	if (sz->need_what)
		snprintf(what, sizeof what, "%s of %lld", sz->need_what, (long long)need);
	else
		snprintf(what, sizeof what, "one context of %d", n_ctx);
	if (hold < need) {
		size_t at = strlen(what);
		snprintf(what + at, sizeof what - at, " (%lld at once under its sliding window of %d)", (long long)hold,
		         fit->window);
	}
	if (sz->tokens > 0) {
		blocks = (sz->tokens + (int64_t)bs - 1) / (int64_t)bs;
		knob = "--max-kv-tokens";
		snprintf(have, sizeof have, "%lld", (long long)sz->tokens);
		snprintf(need_s, sizeof need_s, "%lld", (long long)hold);
	} else if (sz->bytes > 0) {
		blocks = (int64_t)(sz->bytes / blk_bytes);
		knob = "--kv-memory";
		human(sz->bytes, have, sizeof have);
		human((size_t)need_blocks * blk_bytes, need_s, sizeof need_s);
	} else {
		/* the default: what the machine has, after everything else the
		 * engine holds (the weights are mapped, not yet resident: all count) */
		size_t avail;
		const char *src = "--assume-memory";
		if (sz->assume)
			avail = sz->assume;
		else
			LLM_TRY(llm_mem_free(sz->backend, &avail, &src));
		size_t other = p->weight_bytes + p->scratch_bytes + p->logits_bytes;
		fit->measured = 1;
		fit->available = avail;
		fit->source = src;
		fit->budget = avail > other ? (size_t)(LLM_KV_MEM_FRACTION * (double)(avail - other)) : 0;
		int64_t per = sz->seq_tokens > 0 && sz->seq_tokens < n_ctx ? sz->seq_tokens : n_ctx;
		if (most && per > most)
			per = most;
		int64_t full = (int64_t)(sz->n_seq > 0 ? sz->n_seq : 1) * ((per + (int64_t)bs - 1) / (int64_t)bs);
		int64_t cap = (int64_t)(fit->budget / blk_bytes);
		fit->budget_seqs = cap / need_blocks;
		blocks = full < cap ? full : cap;
		knob = NULL;
		char a[32], o_s[32], b[32];
		human(avail, a, sizeof a), human(other, o_s, sizeof o_s), human(fit->budget, b, sizeof b);
		snprintf(have, sizeof have, "%s %s less %s of weights and activations leaves %s for the KV cache (%.0f%%):",
		         src, a, o_s, b, 100 * LLM_KV_MEM_FRACTION);
	}
	o->kv_blocks = blocks > 0 ? blocks : 1;
	llm_mem_plan(m, o, p);
	if (blocks < 1) {            /* no room at all: the plan says so, not one block */
		o->kv_blocks = p->kv_blocks = 0;
		p->total -= p->kv_bytes;
		p->kv_bytes = 0;
	}
	fit->seqs = blocks / need_blocks;
	if (blocks >= need_blocks)
		return LLM_OK;
	fit->short_bytes = (size_t)(need_blocks - blocks) * blk_bytes;
	long long held = (long long)(blocks > 0 ? blocks * (int64_t)bs : 0);
	char ctx_hint[64] = "";
	if (!sz->need_what && held > 0)
		snprintf(ctx_hint, sizeof ctx_hint, ", or --ctx-size %lld", held);
	if (knob)
		return llm_fail(LLM_ERR_RANGE, "%s %s holds %lld tokens, less than %s: need %s %s%s",
		                knob, have, held, what, knob, need_s, ctx_hint);
	char sh[32];
	human(fit->short_bytes, sh, sizeof sh);
	return llm_fail(LLM_ERR_RANGE, "%s %lld tokens, less than %s: %s short (give --kv-memory or --max-kv-tokens "
	                "to size the cache yourself%s)", have, held, what, sh, ctx_hint);
}

/* V as a JSON number, or null when not HAS */
static const char *num_or_null(int has, unsigned long long v, char *buf, size_t n)
{
	if (!has)
		return "null";
	snprintf(buf, n, "%llu", v);
	return buf;
}

char *llm_mem_plan_json(const char *model, const struct llm_mem_plan *p, const struct llm_kv_fit *fit,
                        int max_running, int fits)
{
	int64_t kv_tokens = p->kv_blocks * p->kv_block_size;
	/* under a window on every layer a context of any length needs only
	 * fit->most positions at once */
	int64_t longest = fit->most && kv_tokens >= fit->most ? p->n_ctx : kv_tokens < p->n_ctx ? kv_tokens : p->n_ctx;
	int64_t seq_kv = fit->most && fit->most < p->n_ctx ? fit->most : p->n_ctx;
	char av[32], bu[32], bs[32], src[48] = "null";
	if (fit->measured)
		snprintf(src, sizeof src, "\"%s\"", fit->source);
	char *out = NULL;
	/* the bytes of weights one token reads: all but the experts it is not routed to */
	size_t active = p->n_expert ? p->weight_bytes - p->expert_bytes +
	                (size_t)((double)p->expert_bytes * p->n_expert_used / p->n_expert) : p->weight_bytes;
	if (asprintf(&out, "{\"model\": \"%s\", \"weight_bytes\": %zu, \"experts\": %d, \"experts_per_token\": %d, "
	             "\"expert_bytes\": %zu, \"active_weight_bytes\": %zu, \"kv_bytes_per_token\": %zu, \"kv_block_size\": %d, "
	             "\"kv_blocks\": %lld, \"kv_bytes\": %zu, \"kv_tokens\": %lld, \"activation_bytes\": %zu, "
	             "\"logits_bytes\": %zu, \"total_bytes\": %zu, \"n_ctx\": %d, \"max_running\": %d, "
	             "\"max_batch_tokens\": %d, \"sliding_window\": %d, \"seq_kv_tokens\": %lld, "
	             "\"max_context_that_fits\": %lld, \"seqs_that_fit\": %lld, "
	             "\"memory_available\": %s, \"memory_source\": %s, \"kv_memory_fraction\": %.2f, "
	             "\"kv_budget_bytes\": %s, \"seqs_memory_holds\": %s, \"short_bytes\": %zu, \"fits\": %s}",
	             model, p->weight_bytes, p->n_expert, p->n_expert_used, p->expert_bytes, active, p->kv_bytes_per_token, p->kv_block_size, (long long)p->kv_blocks,
	             p->kv_bytes, (long long)kv_tokens, p->scratch_bytes, p->logits_bytes, p->total, p->n_ctx,
	             max_running, p->max_batch_tokens, fit->window, (long long)seq_kv, (long long)longest,
	             (long long)fit->seqs, num_or_null(fit->measured, fit->available, av, sizeof av), src,
	             LLM_KV_MEM_FRACTION, num_or_null(fit->measured, fit->budget, bu, sizeof bu),
	             num_or_null(fit->measured, (unsigned long long)fit->budget_seqs, bs, sizeof bs), fit->short_bytes,
	             fits ? "true" : "false") < 0)
		return NULL;
	return out;
}

enum llm_status llm_kv_size_generate(const char *path, int64_t tokens, size_t bytes, int64_t need,
                                     struct llm_engine_opts *o)
{
	if (!tokens && !bytes && need <= 0)
		return LLM_OK;       /* no prompt lengths known: the engine's default pool */
	struct llm_model m = { 0 };
	int part = llm_model_is_partitioned(path);
	LLM_TRY(part ? llm_model_geometry(&m, path) : llm_model_open(&m, path));
	const char *what = need > 0 ? "the longest prompt with its output" : "one position";
	struct llm_kv_size sz = {
		.tokens = tokens, .bytes = bytes, .need = need > 0 ? need : 1, .backend = o->backend,
		.n_seq = o->kv_seqs > 0 && o->kv_seqs < o->max_seqs ? o->kv_seqs : o->max_seqs,
		.need_what = what,
	};
	sz.seq_tokens = sz.need > 4096 ? sz.need : 4096;   /* the pool of old, or more */
	struct llm_mem_plan p;
	enum llm_status s = llm_kv_size_opts(&m, o->n_ctx, &sz, o, &p, NULL);
	if (!part)
		llm_model_close(&m);
	return s;
}

enum llm_status llm_model_geometry(struct llm_model *m, const char *dir)
{
	char *path = llm_path_join(dir, "config.json"), *json = NULL;
	size_t len;
	enum llm_status s = path ? llm_read_file(path, &json, &len) : llm_fail(LLM_ERR_NOMEM, "out of memory");
	if (!s)
		s = llm_config_parse(&m->cfg, json, len, path);
	if (!s) {
		m->layer_begin = 0;
		m->layer_end = m->cfg.n_layer;
		m->n_kv_head_loc = m->cfg.n_kv_head;
	}
	free(json);
	free(path);
	return s;
}

enum llm_status llm_model_check_args(const char *model, int64_t ctx_size)
{
	if (!strcmp(model, "-"))
		return llm_fail(LLM_ERR_USAGE, "-m -: %s reads a checkpoint from a path, not a stream "
		                "(llm-quantize, llm-repartition, llm-finetune and llm-bench read one)", llm_progname());
	if (ctx_size <= 0)
		return LLM_OK;
	struct llm_ckpt ck;
	struct llm_config c;
	if (llm_ckpt_open_lazy(&ck, model))
		return LLM_OK;
	const struct llm_aux *cj = llm_ckpt_aux(&ck, "config.json");
	enum llm_status s = LLM_OK;
	if (cj && !llm_config_parse(&c, cj->data, cj->len, "config.json") && ctx_size > c.max_ctx)
		s = llm_fail(LLM_ERR_USAGE, "--ctx-size %lld exceeds the model's context of %d (max_position_embeddings)",
		             (long long)ctx_size, c.max_ctx);
	llm_ckpt_close(&ck);
	return s;
}
