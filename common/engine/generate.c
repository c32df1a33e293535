/* common/engine/generate.c: the engine (see generate.h): the model, its backend,
 * the paged KV cache and the activations, one forward step at a time, and
 * the step protocol of a distributed run (rank 0 plans and broadcasts, the
 * other ranks replay). Requests, their scheduling and sampling are the
 * scheduler's (scheduler.c); scoring and perplexity are in score.c. */
#include "generate.h"
#include "lora.h"
#include "buf.h"
#include "fileio.h"
#include "args.h"
#include "comm.h"

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

struct llm_engine {
	struct llm_model model;
	struct llm_lora lora[LLM_LORA_SLOTS + 1];   /* slot 0 unused (the base); model.lora[i]
	                                               points at lora[i] when slot i is in use */
	char lora_name[LLM_LORA_SLOTS + 1][LLM_LORA_NAME_MAX];   /* "": a free slot */
	char *lora_dir[LLM_LORA_SLOTS + 1];
	struct llm_backend *be;
	struct llm_kv kv;
	struct llm_scratch scratch;
	struct llm_engine_opts o;
	int n_ctx;
	float *logits;              /* (max_logits, n_vocab) */
	float *dlogits;             /* (max_logits, n_vocab) in the backend's memory, where it has a
	                             * sample op and the run is one process; else NULL */
	struct llm_comm *world;     /* NULL: a single process */
	int root;                   /* this rank plans the steps (rank 0, or alone) */
	/* distributed serving (llm_engine_serve_begin): rank 0 journals its KV
	 * operations and broadcasts them with each forward batch */
	int serving;
	int32_t *jr;                /* (4 * cap_jr) op, a, b, c of each journaled KV operation */
	int n_jr, jr_nomem;
	size_t cap_jr;
	char *sbuf;                 /* (sbuf_cap) a step's payload */
	size_t sbuf_cap;
	struct llm_serve_stats sst;
	/* --weight-pages auto: the huge-page copy is read on a thread of its
	 * own after the first forward, while steps go on from the file
	 * mapping, and takes over between two forwards (wcopy_settle) */
	enum { WCOPY_NONE, WCOPY_PENDING, WCOPY_RUNNING } wcopy_state;
	struct llm_model_copy *wcopy;
	pthread_t wcopy_th;
	atomic_int wcopy_done;
	enum llm_status wcopy_status;
};

const char *llm_finish_name(enum llm_finish f)
{
	static const char *n[] = { "none", "length", "stop", "eos", "cancel", "error" };
	return (unsigned)f < sizeof n / sizeof *n ? n[f] : "?";
}

/* ---- open / close ------------------------------------------------------ */

static void resolve_opts(const struct llm_model *m, const struct llm_engine_opts *in,
                         struct llm_engine_opts *o, int *n_ctx)
{
	static const struct llm_engine_opts def = LLM_ENGINE_OPTS_DEFAULT;
	*o = in ? *in : def;
	if (!o->backend)
		o->backend = "auto";
	if (o->kv_block_size <= 0)
		o->kv_block_size = 16;
	if (o->max_seqs <= 0)
		o->max_seqs = 8;
	if (o->max_batch_tokens <= 0)
		o->max_batch_tokens = 512;
	*n_ctx = o->n_ctx > 0 && o->n_ctx < m->cfg.max_ctx ? o->n_ctx : m->cfg.max_ctx;
	/* default pool: kv_seqs (else max_seqs) sequences of min(n_ctx, 4096)
	 * positions (one request may still use up to the whole pool) */
	int per = *n_ctx < 4096 ? *n_ctx : 4096;
	int64_t per_seq = (per + o->kv_block_size - 1) / o->kv_block_size;
	if (o->kv_blocks <= 0)
		o->kv_blocks = per_seq * (o->kv_seqs > 0 && o->kv_seqs < o->max_seqs ? o->kv_seqs : o->max_seqs);
	if (o->max_logits <= 0)
		o->max_logits = o->max_seqs > 64 ? o->max_seqs : 64;
	if (o->max_logits > o->max_batch_tokens)
		o->max_logits = o->max_batch_tokens;
}

static struct llm_kv_opts kv_opts(const struct llm_model *m, const struct llm_engine_opts *o, int n_ctx)
{
	struct llm_kv_opts k = {   /* this rank's layers and kv heads (all in one process) */
		.n_layer = m->layer_end - m->layer_begin, .n_kv_head = m->n_kv_head_loc, .d_head = m->cfg.d_head,
		.dtype = o->kv_dtype, .block_size = o->kv_block_size, .n_block = o->kv_blocks,
		.max_seq = o->max_seqs + 2,   /* + 2 for llm_score / llm_perplexity */
		.max_ctx = n_ctx,
	};
	return k;
}

/* Whether the engine quantizes M's lm_head at load on backend BE ("cpu",
 * "cuda"): an FP8 model's plain lm_head (the layout the peers load) is
 * quantized on the CPU as llm-quantize --fp8-vocab would write it, so decode
 * reads a byte per weight of the head, not two (SmolLM2-135M shape, tied
 * head a third of the weights: bench/results/lm-head-2026-11-28.txt). */
static int head_fp8(const struct llm_model *m, const struct llm_engine_opts *o, const char *be)
{
	if (!m->lm_head.data || m->lm_head.dtype == LLM_DTYPE_E4M3)
		return 0;
	return o->lm_head == LLM_HEAD_FP8 ||
	       (o->lm_head == LLM_HEAD_AUTO && !strcmp(be, "cpu") && llm_ckpt_is_fp8(&m->ck));
}

void llm_mem_plan(const struct llm_model *m, const struct llm_engine_opts *in, struct llm_mem_plan *p)
{
	struct llm_engine_opts o;
	int n_ctx;
	resolve_opts(m, in, &o, &n_ctx);
	struct llm_kv_opts k = kv_opts(m, &o, n_ctx);
	memset(p, 0, sizeof *p);
	p->weight_bytes = m->weight_bytes;
	p->n_expert = m->cfg.moe.n_expert;
	p->n_expert_used = m->cfg.moe.n_expert_used;
	p->expert_bytes = m->expert_bytes;
	/* the head quantized at load: its codes and scales, in place of a plain
	 * head of its own (a tied one stays, as the embedding) */
	const char *be = !strcmp(o.backend, "auto") ? (llm_backend_cuda_devices() > 0 ? "cuda" : "cpu") : o.backend;
	if (head_fp8(m, &o, be)) {
		const struct llm_weight *h = &m->lm_head;
		if (h->data != m->embed.data)
			p->weight_bytes -= llm_weight_data_bytes(h);
		p->weight_bytes += (size_t)(h->rows * h->cols) + (size_t)h->rows * sizeof(float);
	}
	p->kv_bytes_per_token = llm_kv_bytes_per_token(&k);
	p->kv_blocks = o.kv_blocks;
	p->kv_block_size = o.kv_block_size;
	p->kv_bytes = p->kv_bytes_per_token * (size_t)o.kv_block_size * (size_t)o.kv_blocks;
	p->scratch_bytes = llm_scratch_bytes(&m->cfg, o.max_batch_tokens, o.max_logits);
	p->logits_bytes = (size_t)o.max_logits * (size_t)m->cfg.n_vocab * sizeof(float);
	p->total = p->weight_bytes + p->kv_bytes + p->scratch_bytes + p->logits_bytes;
	p->n_ctx = n_ctx;
	p->max_seqs = o.max_seqs;
	p->max_batch_tokens = o.max_batch_tokens;
}

int llm_weight_pages_parse(const char *s)
{
	return !strcmp(s, "auto") ? LLM_WEIGHTS_AUTO : !strcmp(s, "map") ? LLM_WEIGHTS_MAP
	       : !strcmp(s, "huge") ? LLM_WEIGHTS_HUGE : -1;
}

enum llm_status llm_lm_head_parse(const char *s, enum llm_lm_head *h)
{
	int v = !strcmp(s, "auto") ? LLM_HEAD_AUTO : !strcmp(s, "file") ? LLM_HEAD_FILE
	        : !strcmp(s, "fp8") ? LLM_HEAD_FP8 : -1;
	if (v < 0)
		return llm_fail(LLM_ERR_USAGE, "--lm-head: '%s' is not auto, file or fp8", s);
	*h = (enum llm_lm_head)v;
	return LLM_OK;
}

enum llm_status llm_engine_flags_parse(const char *kv_dtype, const char *weight_pages, enum llm_dtype *kv,
                                       enum llm_weight_pages *wp)
{
	int k = llm_dtype_parse_flag(kv_dtype), w = llm_weight_pages_parse(weight_pages);
	if (k != LLM_DTYPE_F32 && k != LLM_DTYPE_BF16 && k != LLM_DTYPE_E4M3)
		return llm_fail(LLM_ERR_USAGE, "--kv-dtype: '%s' is not f32, bf16 or fp8", kv_dtype);
	if (w < 0)
		return llm_fail(LLM_ERR_USAGE, "--weight-pages: '%s' is not auto, map or huge", weight_pages);
	*kv = (enum llm_dtype)k;
	*wp = (enum llm_weight_pages)w;
	return LLM_OK;
}

/* The device of this rank for "--backend cuda" under mpirun: its rank
 * among the ranks of its node (the launcher's variable: Open MPI, MPICH,
 * Slurm; else the world rank) modulo the devices it sees, so the ranks of
 * one node spread over its GPUs ("cuda:N" names one for every rank). */
static int local_device(void)
{
	static const char *const vars[] = { "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID" };
	int64_t r = -1;
	for (size_t i = 0; i < sizeof vars / sizeof *vars && r < 0; i++) {
		const char *v = getenv(vars[i]);
		if (v && llm_parse_int(v, 0, 1 << 20, &r))
			r = -1;
	}
	if (r < 0)
		r = llm_comm_world() ? llm_comm_world()->rank : 0;
	int n = llm_backend_cuda_devices();
	return n > 0 ? (int)(r % n) : 0;
}

enum llm_status llm_engine_open(struct llm_engine **out, const char *path,
                                const struct llm_engine_opts *in)
{
	*out = NULL;
	struct llm_engine *e = calloc(1, sizeof *e);
	if (!e)
		return llm_fail(LLM_ERR_NOMEM, "engine: out of memory");
	enum llm_status s;
	struct llm_comm *w = in && in->comm ? in->comm : llm_comm_world();
	int always;
	e->root = 1;
	if ((s = llm_dist_always(&always)))
		goto fail;
	if (w && (w->size > 1 || always)) {     /* LLM_DIST=always: one rank too */
		if (w->size == 1 && !llm_model_is_partitioned(path)) {
			if ((s = llm_model_open_one_rank(&e->model, path, w)))
				goto fail;
		} else if (!llm_model_is_partitioned(path)) {
			s = llm_fail(LLM_ERR_USAGE, "%s: a run over %d ranks needs a checkpoint partitioned by "
			             "llm-repartition --tp T --pp P (T x P = %d)", path, w->size, w->size);
			goto fail;
		} else if ((s = llm_model_open_dist(&e->model, path, w))) {
			goto fail;
		}
		e->world = w;
		e->root = w->rank == 0;
	} else if ((s = llm_model_open(&e->model, path))) {
		goto fail;
	}
	resolve_opts(&e->model, in, &e->o, &e->n_ctx);
	if (e->o.check_weights && (s = llm_ckpt_check_finite(&e->model.ck, NULL)))
		goto fail;
	if ((e->world || e->o.n_lora || e->o.lora_runtime) && !strcmp(e->o.backend, "auto"))
		e->o.backend = "cpu";       /* what these run on */
	if (e->o.kv_dtype != LLM_DTYPE_F32 && e->o.kv_dtype != LLM_DTYPE_BF16 && e->o.kv_dtype != LLM_DTYPE_E4M3) {
		s = llm_fail(LLM_ERR_USAGE, "kv dtype: %s (f32, bf16 or fp8)", llm_dtype_name(e->o.kv_dtype));
		goto fail;
	}
	struct llm_backend_opts bo = LLM_BACKEND_OPTS_DEFAULT;
	bo.n_threads = e->o.n_threads;
	bo.isa = e->o.isa;
	if (e->world && !strcmp(e->o.backend, "cuda"))
		bo.device = local_device();
	if ((s = llm_backend_open(e->o.backend, &bo, &e->be)))
		goto fail;
	if (head_fp8(&e->model, &e->o, e->be->ops->name) && (s = llm_model_fp8_head(&e->model, NULL)))
		goto fail;
	for (int i = 0; i < e->o.n_lora; i++) {
		char name[LLM_LORA_NAME_MAX];
		const char *dir;
		if ((s = llm_lora_spec_split(e->o.lora[i], name, sizeof name, &dir)) ||
		    (s = llm_engine_lora_load(e, name, dir, NULL)))
			goto fail;
	}
	if ((s = llm_model_check_backend(&e->model, e->be)) || (s = llm_model_dist_bind(&e->model, e->be)))
		goto fail;
	/* The CPU reads weights where they lie: 2 MiB pages make batched steps
	 * about a tenth faster (SmolLM2-135M FP8, 16 sequences) for a copy at
	 * start (about 30 ms per 160 MB, more where the kernel must compact
	 * memory for huge pages). Auto copies only what fits twice in the
	 * memory available, so the copy never pushes the machine into swap. */
	int wp = e->o.weight_pages;
	if (wp == LLM_WEIGHTS_AUTO)
		wp = !strcmp(e->be->ops->name, "cpu") && llm_thp_available()
		     && e->model.weight_bytes <= llm_mem_available() / 2 ? LLM_WEIGHTS_HUGE : LLM_WEIGHTS_MAP;
	if (wp == LLM_WEIGHTS_HUGE && e->o.weight_pages == LLM_WEIGHTS_AUTO)
		e->wcopy_state = WCOPY_PENDING;   /* the first token does not wait for it */
	else if (wp == LLM_WEIGHTS_HUGE && (s = llm_model_copy_weights(&e->model)))
		goto fail;
	struct llm_kv_opts ko = kv_opts(&e->model, &e->o, e->n_ctx);
	if ((s = llm_kv_init(&e->kv, e->be, &ko)))
		goto fail;
	/* every layer windowed (Mistral's; Qwen2's from layer 0): the blocks
	 * out of the window go back */
	llm_kv_set_window(&e->kv, llm_config_window_all(&e->model.cfg));
	llm_kv_set_keep(&e->kv, e->o.kv_keep);
	if ((s = llm_scratch_init(&e->scratch, &e->model, e->be, e->o.max_batch_tokens, e->o.max_logits)))
		goto fail;
	e->logits = malloc((size_t)e->o.max_logits * (size_t)e->model.cfg.n_vocab * sizeof(float));
	if (!e->logits) {
		s = llm_fail(LLM_ERR_NOMEM, "engine: out of memory");
		goto fail;
	}
	const char *dsv = getenv("LLM_CUDA_SAMPLE");   /* 0: sample on the host, as the CPU backend */
	if (e->be->ops->sample && !e->world && !(dsv && !strcmp(dsv, "0"))
	    && (s = e->be->ops->alloc(e->be, (size_t)e->o.max_logits * (size_t)e->model.cfg.n_vocab * sizeof(float),
	                              (void **)&e->dlogits)))
		goto fail;
	*out = e;
	return LLM_OK;
fail:
	llm_engine_close(e);
	return s;
}

static void *wcopy_main(void *arg)
{
	struct llm_engine *e = arg;
	/* one reader: the forward keeps the other CPUs */
	e->wcopy_status = llm_model_copy_read(&e->model, e->wcopy, 1);
	atomic_store(&e->wcopy_done, 1);
	return NULL;
}

/* Start the pending copy. A copy that cannot start (no memory for it, no
 * thread) is given up: the weights stay where they are, which is correct,
 * only slower for batched steps. */
static void wcopy_start(struct llm_engine *e)
{
	if (e->wcopy_state != WCOPY_PENDING)
		return;
	e->wcopy_state = WCOPY_NONE;
	if (llm_model_copy_begin(&e->model, &e->wcopy))
		return;
	atomic_store(&e->wcopy_done, 0);
	if (pthread_create(&e->wcopy_th, NULL, wcopy_main, e)) {
		llm_model_copy_abort(e->wcopy);
		e->wcopy = NULL;
		return;
	}
	e->wcopy_state = WCOPY_RUNNING;
}

/* Between forwards: a finished copy takes over (a failed one is dropped);
 * with WAIT, a pending or running copy is waited for. */
static void wcopy_settle(struct llm_engine *e, int wait)
{
	if (e->wcopy_state != WCOPY_RUNNING || (!wait && !atomic_load(&e->wcopy_done)))
		return;
	pthread_join(e->wcopy_th, NULL);
	if (e->wcopy_status == LLM_OK)
		llm_model_copy_commit(&e->model, e->wcopy);
	else
		llm_model_copy_abort(e->wcopy);
	e->wcopy = NULL;
	e->wcopy_state = WCOPY_NONE;
}

void llm_engine_weights_settle(struct llm_engine *e, int wait)
{
	wcopy_start(e);
	wcopy_settle(e, wait);
}

void llm_engine_close(struct llm_engine *e)
{
	if (!e)
		return;
	if (e->wcopy_state == WCOPY_RUNNING) {
		llm_model_copy_stop(e->wcopy);
		pthread_join(e->wcopy_th, NULL);
		llm_model_copy_abort(e->wcopy);
	}
	free(e->logits);
	if (e->dlogits)
		e->be->ops->release(e->be, e->dlogits);
	free(e->jr);
	free(e->sbuf);
	llm_scratch_free(&e->scratch);
	if (e->kv.ref)
		llm_kv_free(&e->kv);
	llm_backend_close(e->be);
	llm_model_close(&e->model);
	for (int i = 1; i <= LLM_LORA_SLOTS; i++) {
		llm_lora_free(&e->lora[i]);
		free(e->lora_dir[i]);
	}
	free(e);
}

/* ---- LoRA adapters ------------------------------------------------------ */

/* The checks of an adapter NAME for E: a free slot into *FREE_SLOT. */
static enum llm_status lora_check(struct llm_engine *e, const char *name, int *free_slot)
{
	*free_slot = 0;
	size_t len = strlen(name);
	if (!len || len >= LLM_LORA_NAME_MAX || strchr(name, '='))
		return llm_fail(LLM_ERR_USAGE, "adapter name '%s': 1 to %d bytes, no '='", name, LLM_LORA_NAME_MAX - 1);
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)name[i] < 0x20 || name[i] == 0x7f)
			return llm_fail(LLM_ERR_USAGE, "adapter name: holds a control byte");
	if (e->world)
		return llm_fail(LLM_ERR_UNSUPPORTED, "adapter '%s': a LoRA adapter on a distributed run is not supported: "
		                "merge it into the checkpoint (llm-finetune --merge) and partition that", name);
	if (e->be && strcmp(e->be->ops->name, "cpu"))
		return llm_fail(LLM_ERR_UNSUPPORTED, "adapter '%s': backend %s: a LoRA adapter is applied on the cpu "
		                "backend only: use --backend cpu, or merge it (llm-finetune --merge)", name,
		                e->be->ops->name);
	for (int i = 1; i <= LLM_LORA_SLOTS; i++) {
		if (!strcmp(e->lora_name[i], name))
			return llm_fail(LLM_ERR_EXISTS, "adapter '%s': the name is in use (%s)", name, e->lora_dir[i]);
		if (!*free_slot && !e->lora_name[i][0])
			*free_slot = i;
	}
	if (!*free_slot)
		return llm_fail(LLM_ERR_RANGE, "adapter '%s': all %d adapter slots are in use (unload one first)",
		                name, LLM_LORA_SLOTS);
	return LLM_OK;
}

enum llm_status llm_engine_lora_load(struct llm_engine *e, const char *name, const char *dir, int *slot)
{
	if (slot)
		*slot = 0;
	int free_slot;
	LLM_TRY(lora_check(e, name, &free_slot));
	struct llm_lora lo;
	enum llm_status s = llm_lora_load(&lo, dir, &e->model.cfg);
	if (s)
		return llm_fail_prefix(s, "adapter '%s'", name);
	if ((s = llm_engine_lora_add(e, name, dir, &lo, slot)))
		llm_lora_free(&lo);
	return s;
}

enum llm_status llm_engine_lora_add(struct llm_engine *e, const char *name, const char *dir, struct llm_lora *lo,
                                    int *slot)
{
	if (slot)
		*slot = 0;
	int free_slot;
	LLM_TRY(lora_check(e, name, &free_slot));
	if (lo->n_layer != e->model.cfg.n_layer)
		return llm_fail(LLM_ERR_USAGE, "adapter '%s': read for a model of %d layers, not %d", name, lo->n_layer,
		                e->model.cfg.n_layer);
	size_t len = strlen(name);
	char *d = llm_strdup(dir);
	if (!d)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	e->lora[free_slot] = *lo;
	memset(lo, 0, sizeof *lo);
	e->lora_dir[free_slot] = d;
	memcpy(e->lora_name[free_slot], name, len + 1);
	e->model.lora[free_slot] = &e->lora[free_slot];
	if (free_slot > e->model.n_lora)
		e->model.n_lora = free_slot;
	if (slot)
		*slot = free_slot;
	return LLM_OK;
}

void llm_engine_lora_unload(struct llm_engine *e, int slot)
{
	if (slot < 1 || slot > LLM_LORA_SLOTS || !e->lora_name[slot][0])
		return;
	e->model.lora[slot] = NULL;
	llm_lora_free(&e->lora[slot]);
	free(e->lora_dir[slot]);
	e->lora_dir[slot] = NULL;
	e->lora_name[slot][0] = 0;
	while (e->model.n_lora > 0 && !e->model.lora[e->model.n_lora])
		e->model.n_lora--;
}

int llm_engine_lora_default(const struct llm_engine *e)
{
	return e->o.n_lora > 0 && e->lora_name[1][0] ? 1 : 0;
}

int llm_engine_lora_find(const struct llm_engine *e, const char *name)
{
	for (int i = 1; name && *name && i <= LLM_LORA_SLOTS; i++)
		if (!strcmp(e->lora_name[i], name))
			return i;
	return 0;
}

const char *llm_engine_lora_name(const struct llm_engine *e, int slot)
{
	return slot >= 1 && slot <= LLM_LORA_SLOTS && e->lora_name[slot][0] ? e->lora_name[slot] : NULL;
}

const char *llm_engine_lora_dir(const struct llm_engine *e, int slot)
{
	return llm_engine_lora_name(e, slot) ? e->lora_dir[slot] : NULL;
}

int llm_engine_lora_rank(const struct llm_engine *e, int slot)
{
	return llm_engine_lora_name(e, slot) ? e->lora[slot].rank : 0;
}

void llm_engine_plan(const struct llm_engine *e, struct llm_mem_plan *p)
{
	llm_mem_plan(&e->model, &e->o, p);
}

struct llm_model *llm_engine_model(struct llm_engine *e) { return &e->model; }
struct llm_backend *llm_engine_backend(struct llm_engine *e) { return e->be; }
struct llm_kv *llm_engine_kv(struct llm_engine *e) { return &e->kv; }
int llm_engine_n_ctx(const struct llm_engine *e) { return e->n_ctx; }

/* ---- distributed serving ------------------------------------------------ */

/* A step of rank 0, broadcast to the other ranks: this header, then (STEP)
 * a payload of n_ops x 4 int32 KV operations, then n_tok int32 tokens,
 * positions and sequences, then n_tok int8 logit flags when has_logits. */
enum { SERVE_STOP = 0x53544f50, SERVE_STEP = 0x53544550 };
enum { KVOP_NEW = 1, KVOP_FORK, KVOP_FREE, KVOP_RESERVE, KVOP_TRUNCATE };
struct serve_hdr {
	int32_t cmd, n_ops, n_tok, has_logits;
	int64_t n_free;             /* rank 0's free KV blocks after the operations */
};

/* Room for one more journal entry (before the operation is applied, so an
 * operation that succeeds is always journaled). */
static int jr_room(struct llm_engine *e)
{
	if (llm_array_reserve(&e->jr, &e->cap_jr, (size_t)e->n_jr + 1, 4 * sizeof *e->jr)) {
		e->jr_nomem = 1;     /* the next forward fails: the ranks would diverge */
		return -1;
	}
	return 0;
}

static void jr_add(struct llm_engine *e, int32_t op, int32_t a, int32_t b, int32_t c)
{
	if ((size_t)e->n_jr >= e->cap_jr)
		return;              /* jr_room failed: jr_nomem is set */
	int32_t *q = e->jr + 4 * (size_t)e->n_jr++;
	q[0] = op;
	q[1] = a;
	q[2] = b;
	q[3] = c;
}

enum llm_status llm_engine_kv_new(struct llm_engine *e, int *seq)
{
	if (e->serving)
		jr_room(e);
	LLM_TRY(llm_kv_seq_new(&e->kv, seq));
	if (e->serving)
		jr_add(e, KVOP_NEW, *seq, 0, 0);
	return LLM_OK;
}

enum llm_status llm_engine_kv_fork(struct llm_engine *e, int src, int32_t n, int *dst)
{
	if (e->serving)
		jr_room(e);
	LLM_TRY(llm_kv_seq_fork(&e->kv, src, n, dst));
	if (e->serving)
		jr_add(e, KVOP_FORK, src, n, *dst);
	return LLM_OK;
}

void llm_engine_kv_free(struct llm_engine *e, int seq)
{
	if (seq < 0 || seq >= e->kv.max_seq || !e->kv.seq[seq].used)
		return;
	if (e->serving)
		jr_room(e);
	llm_kv_seq_free(&e->kv, seq);
	if (e->serving)
		jr_add(e, KVOP_FREE, seq, 0, 0);
}

enum llm_status llm_engine_kv_reserve(struct llm_engine *e, int seq, int32_t n)
{
	if (e->serving)
		jr_room(e);
	LLM_TRY(llm_kv_reserve(&e->kv, seq, n));
	if (e->serving)
		jr_add(e, KVOP_RESERVE, seq, n, 0);
	return LLM_OK;
}

void llm_engine_kv_truncate(struct llm_engine *e, int seq, int32_t n)
{
	if (e->serving)
		jr_room(e);
	llm_kv_seq_truncate(&e->kv, seq, n);
	if (e->serving)
		jr_add(e, KVOP_TRUNCATE, seq, n, 0);
}

static size_t payload_bytes(const struct serve_hdr *h)
{
	return 16 * (size_t)h->n_ops + 12 * (size_t)h->n_tok + (h->has_logits ? (size_t)h->n_tok : 0);
}

static enum llm_status sbuf_room(struct llm_engine *e, size_t n)
{
	if (LLM_ARRAY_RESERVE(e->sbuf, e->sbuf_cap, n))
		return llm_fail(LLM_ERR_NOMEM, "engine: out of memory for a serving step of %zu bytes", n);
	return LLM_OK;
}

static enum llm_status serve_bcast(struct llm_engine *e, void *buf, size_t n)
{
	e->sst.bytes += n;
	return llm_comm_bcast(e->world, buf, n, 0);
}

/* A step header: what an idle server's workers wait for, sleeping. */
static enum llm_status serve_bcast_hdr(struct llm_engine *e, struct serve_hdr *h)
{
	e->sst.bytes += sizeof *h;
	return llm_comm_bcast_idle(e->world, h, sizeof *h, 0);
}

/* Rank 0: the journal and batch B to every rank, before the forward. */
static enum llm_status serve_send(struct llm_engine *e, const struct llm_batch *b)
{
	if (e->jr_nomem)
		return llm_fail(LLM_ERR_NOMEM, "engine: out of memory for the KV journal of a distributed server");
	struct serve_hdr h = { SERVE_STEP, e->n_jr, b->n_tok, b->logits != NULL, e->kv.n_free };
	size_t n = (size_t)b->n_tok, need = payload_bytes(&h);
	LLM_TRY(sbuf_room(e, need));
	char *q = e->sbuf;
	memcpy(q, e->jr, 16 * (size_t)e->n_jr);
	q += 16 * (size_t)e->n_jr;
	memcpy(q, b->token, 4 * n);
	memcpy(q + 4 * n, b->pos, 4 * n);
	memcpy(q + 8 * n, b->seq, 4 * n);
	if (b->logits)
		memcpy(q + 12 * n, b->logits, n);
	LLM_TRY(serve_bcast_hdr(e, &h));
	LLM_TRY(serve_bcast(e, e->sbuf, need));
	e->sst.steps++;
	e->sst.kv_ops += e->n_jr;
	e->sst.tokens += b->n_tok;
	e->n_jr = 0;
	return LLM_OK;
}

enum llm_status llm_engine_serve_begin(struct llm_engine *e)
{
	if (!e->world || !e->root || e->serving)
		return LLM_OK;
	LLM_TRY(sbuf_room(e, 16 * 64 + 13 * (size_t)e->o.max_batch_tokens));
	if (jr_room(e))
		return llm_fail(LLM_ERR_NOMEM, "engine: out of memory");
	LLM_TRY(llm_comm_barrier(e->world));    /* every rank has its engine */
	e->serving = 1;
	e->n_jr = 0;
	return LLM_OK;
}

enum llm_status llm_engine_serve_end(struct llm_engine *e)
{
	if (!e->serving)
		return LLM_OK;
	e->serving = 0;
	struct serve_hdr h = { SERVE_STOP, 0, 0, 0, 0 };
	return serve_bcast_hdr(e, &h);
}

/* A rank other than 0: apply rank 0's journal to this rank's cache. */
static enum llm_status replay(struct llm_engine *e, const int32_t *op, int n)
{
	int r = e->world->rank;
	for (int i = 0; i < n; i++, op += 4) {
		int got = -1;
		enum llm_status s = LLM_OK;
		switch (op[0]) {
		case KVOP_NEW:
			s = llm_kv_seq_new(&e->kv, &got);
			if (!s && got != op[1])
				s = llm_fail(LLM_ERR_INTERNAL, "rank %d: KV sequence %d where rank 0 has %d", r, got, op[1]);
			break;
		case KVOP_FORK:
			s = llm_kv_seq_fork(&e->kv, op[1], op[2], &got);
			if (!s && got != op[3])
				s = llm_fail(LLM_ERR_INTERNAL, "rank %d: KV fork %d where rank 0 has %d", r, got, op[3]);
			break;
		case KVOP_FREE:
			llm_kv_seq_free(&e->kv, op[1]);
			break;
		case KVOP_RESERVE:
			s = llm_kv_reserve(&e->kv, op[1], op[2]);
			break;
		case KVOP_TRUNCATE:
			llm_kv_seq_truncate(&e->kv, op[1], op[2]);
			break;
		default:
			s = llm_fail(LLM_ERR_INTERNAL, "rank %d: unknown KV operation %d from rank 0", r, op[0]);
		}
		if (s) {
			char msg[300];
			snprintf(msg, sizeof msg, "%s", llm_errmsg());
			return llm_fail(s, "rank %d: replaying KV operation %d of a step: %s", r, i, msg);
		}
	}
	return LLM_OK;
}

enum llm_status llm_engine_serve_worker(struct llm_engine *e)
{
	if (!e->world || e->root)
		return llm_fail(LLM_ERR_USAGE, "engine: serve_worker is for ranks other than 0 of a distributed run");
	int r = e->world->rank;
	LLM_TRY(llm_comm_barrier(e->world));    /* rank 0's llm_engine_serve_begin */
	for (;;) {
		struct serve_hdr h;
		LLM_TRY(serve_bcast_hdr(e, &h));
		if (h.cmd == SERVE_STOP)
			return LLM_OK;
		if (h.cmd != SERVE_STEP || h.n_ops < 0 || h.n_tok < 1 || h.n_tok > e->o.max_batch_tokens)
			return llm_fail(LLM_ERR_INTERNAL, "rank %d: bad step header from rank 0 (%d KV operations, %d tokens)",
			                r, h.n_ops, h.n_tok);
		size_t need = payload_bytes(&h), n = (size_t)h.n_tok;
		LLM_TRY(sbuf_room(e, need));
		LLM_TRY(serve_bcast(e, e->sbuf, need));
		LLM_TRY(replay(e, (const int32_t *)e->sbuf, h.n_ops));
		if (e->kv.n_free != h.n_free)
			return llm_fail(LLM_ERR_INTERNAL, "rank %d: KV cache out of step with rank 0: %lld free blocks, rank 0 has %lld",
			                r, (long long)e->kv.n_free, (long long)h.n_free);
		const char *q = e->sbuf + 16 * (size_t)h.n_ops;
		/* the payload is 4-byte aligned up to the flags: sbuf is malloc'd */
		struct llm_batch b = { h.n_tok, (const int32_t *)q, (const int32_t *)(q + 4 * n),
		                       (const int32_t *)(q + 8 * n), h.has_logits ? (const int8_t *)(q + 12 * n) : NULL,
		                       NULL /* adapters: refused on distributed runs */ };
		int n_out;
		wcopy_settle(e, 0);
		LLM_TRY(llm_model_forward(&e->model, e->be, &e->kv, &e->scratch, &b, e->logits, &n_out));
		wcopy_start(e);
		e->sst.steps++;
		e->sst.kv_ops += h.n_ops;
		e->sst.tokens += h.n_tok;
	}
}

void llm_engine_serve_stats(const struct llm_engine *e, struct llm_serve_stats *st)
{
	*st = e->sst;
}

enum llm_status llm_engine_forward(struct llm_engine *e, const struct llm_batch *b,
                                   const float **logits, int *n_out)
{
	*logits = e->logits;
	if (e->serving)
		LLM_TRY(serve_send(e, b));
	wcopy_settle(e, 0);
	LLM_TRY(llm_model_forward(&e->model, e->be, &e->kv, &e->scratch, b, e->logits, n_out));
	wcopy_start(e);
	return LLM_OK;
}

void llm_engine_host_for(struct llm_engine *e, int n, void (*fn)(void *ctx, int i, int n), void *ctx)
{
	if (e->be->ops->host_for && n > 1) {
		e->be->ops->host_for(e->be, n, fn, ctx);
		return;
	}
	for (int i = 0; i < n; i++)
		fn(ctx, i, n);
}

int llm_engine_can_sample(const struct llm_engine *e)
{
	return e->dlogits != NULL && !e->serving;
}

enum llm_status llm_engine_forward_sample(struct llm_engine *e, const struct llm_batch *b,
                                          const struct llm_sample_row *rows, int32_t *ids, float *logprob,
                                          int *n_out)
{
	if (!llm_engine_can_sample(e))
		return llm_fail(LLM_ERR_UNSUPPORTED, "engine: the %s backend does not sample (or the run is distributed)",
		                e->be->ops->name);
	LLM_TRY(llm_model_forward(&e->model, e->be, &e->kv, &e->scratch, b, e->dlogits, n_out));
	if (*n_out == 0)
		return LLM_OK;
	return e->be->ops->sample(e->be, llm_view_f32(e->dlogits, *n_out, e->model.cfg.n_vocab), rows, ids, logprob);
}

/* One line of text to B (formatted, newline added); 0 on success. */
static int out_line(struct llm_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int out_line(struct llm_buf *b, const char *fmt, ...)
{
	char line[600];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof line - 1, fmt, ap);
	va_end(ap);
	if (n < 0)
		return -1;
	if ((size_t)n > sizeof line - 2)
		n = (int)sizeof line - 2;
	line[n++] = '\n';
	return llm_buf_append(b, line, (size_t)n) ? -1 : 0;
}

enum llm_status llm_engine_traffic(struct llm_engine *e, struct llm_buf *out)
{
	struct llm_comm *w = e->world;
	const struct llm_model_dist *d = e->model.dist;
	if (!w || !d)
		return LLM_OK;
	struct llm_dist_stats *all = calloc((size_t)w->size, sizeof *all);
	struct llm_serve_stats *ss = calloc((size_t)w->size, sizeof *ss);
	enum llm_status s = all && ss ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "out of memory");
	if (!s)
		s = llm_comm_allgather(w, &d->stats, sizeof d->stats, all);
	if (!s)
		s = llm_comm_allgather(w, &e->sst, sizeof e->sst, ss);
	int T = d->grid.n_tp, P = d->grid.n_pp, bad = 0;
	const char *me = llm_progname();
	for (int r = 0; !s && e->root && r < w->size; r++) {
		const struct llm_dist_stats *st = &all[r];
		double tok = st->tokens ? (double)st->tokens : 1;
		bad |= out_line(out, "%s: rank %d (stage %d, tp %d): %llu steps (%llu micro-batches), %llu tokens; per token: "
		                "stage boundary sent %.0f B (unfused %.0f, unsliced %.0f), received %.0f B; tp all-reduce "
		                "%.0f B, all-gather %.0f B; logits to rank 0 %.0f B", me, r, r / T, r % T,
		                (unsigned long long)st->steps, (unsigned long long)st->micro, (unsigned long long)st->tokens,
		                st->boundary_sent / tok, st->boundary_unfused / tok, st->boundary_whole / tok,
		                st->boundary_recvd / tok, st->tp_allreduce / tok, st->tp_allgather / tok, st->logits_sent / tok);
	}
	/* the step protocol: every rank followed the steps rank 0 led */
	for (int r = 0; !s && e->root && r < w->size; r++)
		bad |= out_line(out, "%s: step protocol: rank %d %s %lld steps of rank 0 (%lld KV operations, %lld tokens; %llu B)",
		                me, r, r ? "followed" : "led", (long long)ss[r].steps, (long long)ss[r].kv_ops,
		                (long long)ss[r].tokens, (unsigned long long)ss[r].bytes);
	if (!s && e->root && P > 1) {
		/* one boundary: stage 0 -> 1, summed over its T ranks */
		double sent = 0, unf = 0, whole = 0, tok = all[0].tokens ? (double)all[0].tokens : 1;
		for (int t = 0; t < T; t++) {
			sent += (double)all[t].boundary_sent;
			unf += (double)all[t].boundary_unfused;
			whole += (double)all[t].boundary_whole;
		}
		bad |= out_line(out, "%s: stage boundary 0->1 per token, all %d TP ranks: %.0f B sent (fused, 1/T each); "
		                "%.0f B unfused (%.1fx); %.0f B unsliced (%.1fx)", me, T, sent / tok, unf / tok,
		                sent > 0 ? unf / sent : 0.0, whole / tok, sent > 0 ? whole / sent : 0.0);
	}
	if (!s && bad)
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
	free(all);
	free(ss);
	return s;
}

/* ---- tools over ranks: rank 0 leads, the others follow ------------------- */

/* Open on every rank (collective); on failure *FIRST is the lowest failing
 * rank, whose message this rank holds when it is this one. */
static enum llm_status open_all(struct llm_engine **e, const char *path, const struct llm_engine_opts *o,
                                struct llm_comm *w, int *first)
{
	enum llm_status s = llm_engine_open(e, path, o);
	char msg[600];
	snprintf(msg, sizeof msg, "%s", s ? llm_errmsg() : "");
	enum llm_status c = llm_comm_first_failing(w, s != LLM_OK, first);
	if (c)
		return c;
	if (*first < 0)
		return LLM_OK;
	llm_engine_close(*e);
	*e = NULL;
	if (w && w->size > 1 && *first != w->rank)
		return llm_fail(LLM_ERR_COMM, "rank %d failed to open %s", *first, path);
	return llm_fail(s, "%s", msg);
}

enum llm_status llm_engine_lead_open(struct llm_engine **e, const char *path, const struct llm_engine_opts *o,
                                     int *first)
{
	struct llm_comm *w = o->comm ? o->comm : llm_comm_world();
	*e = NULL;
	*first = 0;
	if (w && w->size > 1) {
		int64_t sizes[3] = { o->max_seqs, o->kv_seqs, o->kv_blocks };   /* rank 0's sizing */
		LLM_TRY(llm_comm_bcast_idle(w, sizes, sizeof sizes, 0));
	}
	LLM_TRY(open_all(e, path, o, w, first));
	return llm_engine_serve_begin(*e);
}

enum llm_status llm_engine_lead_close(struct llm_engine *e, struct llm_buf *traffic)
{
	enum llm_status s = llm_engine_serve_end(e);
	if (!s && traffic)
		s = llm_engine_traffic(e, traffic);
	llm_engine_close(e);
	return s;
}

enum llm_status llm_engine_follow(const char *path, const struct llm_engine_opts *o, struct llm_buf *traffic,
                                  int *first)
{
	struct llm_comm *w = o->comm ? o->comm : llm_comm_world();
	struct llm_engine_opts mine = *o;
	int64_t sizes[3];
	*first = -1;
	LLM_TRY(llm_comm_bcast_idle(w, sizes, sizeof sizes, 0));
	mine.max_seqs = (int)sizes[0];
	mine.kv_seqs = (int)sizes[1];
	mine.kv_blocks = sizes[2];
	struct llm_engine *e = NULL;
	LLM_TRY(open_all(&e, path, &mine, w, first));
	enum llm_status s = llm_engine_serve_worker(e);
	if (!s && traffic)
		s = llm_engine_traffic(e, traffic);
	llm_engine_close(e);
	return s;
}
