/* common/engine/model.h: the model: config.json (config.h), weights, forward
 * pass, for the families of family.h (Llama and the families that change it
 * in the ways that table lists: one forward reading the traits).
 *
 * Supported (anything else is refused at load with the field named): the
 * families config.h lists (a mixture of experts: moe.h, on the cpu
 * backend), grouped-query attention (num_key_value_heads
 * dividing num_attention_heads), any head_dim, tied or untied embeddings,
 * rope_scaling null or of a type the family allows.
 * Weights F32, F16, BF16 or FP8 E4M3 with block, row-group or per-channel
 * scales, read in place from the checkpoint mapping.
 *
 * The reference for the numerics is llama2.c run.c (see backend_cpu.c). */
#ifndef LLM_MODEL_H
#define LLM_MODEL_H

#include "status.h"
#include "config.h"
#include "ckpt.h"
#include "backend.h"
#include "kvcache.h"
#include "comm.h"
#include "moe.h"

#define LLM_LORA_SLOTS 32         /* LoRA adapters a model serves at once */

struct llm_layer {
	struct llm_weight attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
	/* the families' own (family.h), F32 vectors held by the model (vecs),
	 * unset where the family has none: */
	struct llm_weight bq, bk, bv;             /* qkv_bias: (dq), (dkv), (dkv) */
	struct llm_weight q_norm, k_norm;         /* qk_norm: (d_head) each */
	struct llm_weight post_attn_norm, post_ffn_norm;   /* sandwich: (d_model) each;
	                                             ffn_norm is then pre_feedforward_layernorm */
	struct llm_moe_weights moe;   /* a mixture-of-experts layer (llm_moe_layer): the router
	                                 and experts, and no w_gate, w_up, w_down */
};
/* Weight I (0 .. LLM_LAYER_WEIGHTS - 1) of a layer, in the order above. */
#define LLM_LAYER_WEIGHTS 9
const struct llm_weight *llm_layer_weight(const struct llm_layer *L, int i);

/* What crossed the links of a distributed forward pass, on one rank
 * (bytes; "per token" is over stats.tokens). The counterfactuals are what
 * the same steps would have sent with the residual and the hidden state
 * sent apart (unfused, 2x), and with every TP rank sending all of x to its
 * peer instead of its 1/T slice (whole, T x). */
struct llm_dist_stats {
	uint64_t steps, tokens;     /* forward steps and tokens run */
	uint64_t micro;             /* pipeline micro-batches run (= steps without a pipeline) */
	uint64_t boundary_sent;     /* to the next stage (this rank's slice of x) */
	uint64_t boundary_recvd;    /* from the previous stage */
	uint64_t boundary_unfused;  /* counterfactual: residual + hidden state, sliced */
	uint64_t boundary_whole;    /* counterfactual: fused, not sliced (all of x) */
	uint64_t tp_allreduce;      /* handed to TP all-reduces (embedding, o_proj, down_proj) */
	uint64_t tp_allgather;      /* handed to the in-stage all-gather of x */
	uint64_t logits_sent;       /* vocabulary slices of logits sent to rank 0 */
};

/* A rank's share of a distributed model (partition.h, "The split"). */
struct llm_model_dist {
	struct llm_grid grid;       /* world, tp and pp communicators */
	int first, last;            /* this rank is on the first / last stage */
	int n_micro;                /* most pipeline micro-batches per step (P > 1): 2P, or
	                               $LLM_PP_MICRO; each holds >= 32 tokens (model.c) */
	int always;                 /* $LLM_DIST=always: the tensor-parallel collectives
	                               run in a one-rank TP group too (llm_dist_always) */
	int64_t *v0;                /* (tp + 1) vocabulary slice bounds of the TP ranks */
	struct llm_dist_stats stats;
	/* llm_model_dist_bind, on a backend with comm_open (CUDA: NCCL): the
	 * TP all-reduce/all-gather and the stage boundary on its device
	 * memory; NULL: host memory through grid.tp and grid.pp (MPI). The
	 * step protocol, tokens and logits stay on the host, through MPI. */
	struct llm_backend *dbe;
	struct llm_comm *dtp, *dpp;
	float *zero;                /* (d_model) host zeros: embed rows of other slices */
};

struct llm_model {
	struct llm_config cfg;
	struct llm_ckpt ck;         /* the mapping the weights point into */
	struct llm_weight embed, norm, lm_head;   /* distributed: embed on the first stage,
	                                             norm and lm_head on the last, else unset */
	struct llm_layer *layers;   /* (n_layer) indexed by global layer; distributed:
	                               only [layer_begin, layer_end) are set */
	float *inv_freq;            /* (d_head / 2) RoPE frequencies, scaling applied */
	float *vecs;                /* the F32 vectors of the family's weights that are
	                               converted at load: biases, q/k norms, and every
	                               norm of a norm_plus_one family, as 1 + w */
	int attn_ex;                /* the family's attention needs attention_ex */
	enum llm_dtype wdtype;      /* dtype of the decoder linear weights */
	size_t weight_bytes;        /* bytes of all weights and scales (this rank's) */
	size_t expert_bytes;        /* of weight_bytes, the experts' (moe.h; routers not counted) */
	/* This process's share of the model: the whole model in a single
	 * process; a distributed rank's layers, heads, FFN columns and vocabulary
	 * slice (partition.h). The KV cache holds these layers and kv heads. */
	int layer_begin, layer_end;
	int n_head_loc, n_kv_head_loc, d_ff_loc;
	int d_ff_expert_loc;        /* this process's share of an expert's FFN (moe.d_ff_expert) */
	struct llm_weight *experts; /* (n_layer, n_expert, 3) the layers' moe.expert arrays */
	int64_t vocab_begin, n_vocab_loc;
	struct llm_model_dist *dist;   /* NULL: a single process */
	/* LoRA adapters applied on top of the frozen projections (lora.h),
	 * owned by the caller, chosen per batch token (llm_batch.adapter):
	 * slot 0 is the base (always NULL), slots 1 .. n_lora hold an adapter
	 * or NULL (a free slot, which no token may name). Needs activations in
	 * host memory (the CPU backend) and the whole model in this process. */
	const struct llm_lora *lora[LLM_LORA_SLOTS + 1];
	int n_lora;
	void *wmap;                 /* llm_model_copy_weights: the copy's mapping */
	size_t wmap_len;
	void *head_fp8;             /* llm_model_fp8_head: the lm_head's codes and scales (heap) */
};

/* Open the checkpoint at PATH (directory, .safetensors or "-"), parse its
 * config.json and resolve every weight, checking shapes. */
enum llm_status llm_model_open(struct llm_model *m, const char *path);
void llm_model_close(struct llm_model *m);

/* Open rank WORLD->rank's file of the partitioned checkpoint DIR for a
 * distributed forward pass over WORLD (collective: builds the tp x pp grid
 * first, so a rank that then fails on its own file leaves no other rank
 * inside a collective). LLM_ERR_USAGE naming both counts when the checkpoint
 * was partitioned for another number of ranks. llm_model_forward then runs this rank's share and
 * exchanges activations (partition.h); logits land on world rank 0 only. */
enum llm_status llm_model_open_dist(struct llm_model *m, const char *dir, struct llm_comm *world);
/* $LLM_DIST: "always" sets *ALWAYS: a one-rank world runs the distributed
 * engine too (llm_engine_open: a partitioned checkpoint through
 * llm_model_open_dist, a plain one through llm_model_open_one_rank), and a
 * one-rank TP group runs its collectives (the embedding's and the
 * row-parallel all-reduces, the boundary's in-stage all-gather) instead of
 * skipping them as identities, and no GEMM epilogue fuses the residual
 * add: the path of a T > 1 node, on one process and one device (bench/gpu.sh
 * step mpi_cuda). Unset or empty: 0. Another value: LLM_ERR_USAGE naming it. */
enum llm_status llm_dist_always(int *always);
/* The plain checkpoint PATH as rank 0 of a 1 x 1 grid over WORLD (one
 * rank; llm-repartition --tp 1 --pp 1 writes plain checkpoints): the whole
 * model is its share, and with d->always set every collective of the
 * distributed forward runs (LLM_DIST=always). Collective over WORLD. */
enum llm_status llm_model_open_one_rank(struct llm_model *m, const char *path, struct llm_comm *world);
/* Distributed on a backend with comm_open (backend.h): open its
 * communicators over the grid's TP and PP groups (collective over the
 * world: every rank calls it), so that activations stay in its memory;
 * nothing to do in a single process or on a backend without it (the CPU).
 * llm_model_close frees them. */
enum llm_status llm_model_dist_bind(struct llm_model *m, struct llm_backend *be);
/* Copy every weight and scale this process uses out of the checkpoint's
 * file mapping into one anonymous mapping advised for transparent huge pages
 * (2 MiB pages: a batched CPU step streams every weight, and 4 KiB pages
 * miss the TLB on each), read-only, and point the weights at it; the file's
 * pages are given back. Same bytes, so the same results. For backends that
 * read weights from host memory (cpu); a second call does nothing. */
enum llm_status llm_model_copy_weights(struct llm_model *m);
/* Quantize this process's lm_head (or its slice), when it is F32, F16 or
 * BF16, to FP8 E4M3 in memory with one scale per row (amax / 448, as
 * llm-quantize --fp8-vocab writes it: the same codes and scales), so the
 * CPU's decode reads a byte per weight of the head instead of two; a tied
 * embedding keeps its dtype for the lookup and the head becomes its own
 * copy. *DONE (may be NULL): 1 when it quantized, 0 when the head was FP8
 * already or this process has none. Call before llm_model_copy_weights. */
enum llm_status llm_model_fp8_head(struct llm_model *m, int *done);
/* The same copy in three parts, so the reading can run on another thread
 * while the model keeps computing from the file mapping:
 * begin maps the copy and lists the jobs (the weights' pointers then must
 * not change until commit or abort); read fills it (touches neither the
 * model's weights nor anything the forward writes, so it may run during a
 * forward; 4 MiB at a time, each with N_THREADS readers); commit points the
 * weights at the copy and gives the file's pages back, between forwards;
 * abort drops a copy that is not committed. */
struct llm_model_copy;
enum llm_status llm_model_copy_begin(struct llm_model *m, struct llm_model_copy **c);
enum llm_status llm_model_copy_read(const struct llm_model *m, struct llm_model_copy *c, int n_threads);
void llm_model_copy_commit(struct llm_model *m, struct llm_model_copy *c);
void llm_model_copy_abort(struct llm_model_copy *c);
/* From another thread: a read under way returns within 4 MiB. */
void llm_model_copy_stop(struct llm_model_copy *c);
/* Whether the kernel hands out transparent huge pages on request
 * (/sys/kernel/mm/transparent_hugepage/enabled is always or madvise). */
int llm_thp_available(void);
/* MemAvailable of /proc/meminfo in bytes; 0 when unknown. */
size_t llm_mem_available(void);
/* Whether PATH is a partitioned checkpoint (a directory with partition.json). */
int llm_model_is_partitioned(const char *path);

/* Activation buffers for batches of up to max_tok tokens, of which up to
 * max_logits ask for logits; allocated once through the backend. */
struct llm_scratch {
	int max_tok, max_logits;
	struct llm_backend *be;
	float *x, *xb, *q, *k, *v, *att, *hb, *hb2;   /* (max_tok, ...) */
	float *xl;                  /* (max_logits, d_model) */
	int32_t *rows;              /* (max_logits) batch rows that want logits */
	int32_t *sub;               /* (4, max_logits) their token, pos, seq, LoRA slot: the last layer's batch (in rows' block) */
	int32_t *lrows;             /* (max_tok) batch rows grouped by LoRA slot (the base's left out) */
	int lgroup[LLM_LORA_SLOTS + 1], lstart[LLM_LORA_SLOTS + 2];   /* the step's slots with rows,
	                               group g's rows at lrows[lstart[g] .. lstart[g + 1]) */
	int n_lgroup;
	int32_t *lsub;              /* (max_tok) an expert's gathered rows of one adapter */
	/* distributed only (host memory: distributed runs use the CPU backend) */
	int32_t *tok_loc;           /* (max_tok) token ids within this rank's vocabulary slice */
	float *lbuf;                /* (max_logits, largest vocabulary slice) logits slices */
	struct llm_moe_scratch moe; /* a mixture of experts' activations */
};
enum llm_status llm_scratch_init(struct llm_scratch *s, const struct llm_model *m,
                                 struct llm_backend *be, int max_tok, int max_logits);
void llm_scratch_free(struct llm_scratch *s);
size_t llm_scratch_bytes(const struct llm_config *c, int max_tok, int max_logits);

/* One forward step over batch B (see kvcache.h for its rules): writes K/V of
 * every token into KV and, for each token whose logits flag is set (in batch
 * order), one row of LOGITS (n_out, n_vocab) f32; *N_OUT (may be NULL) gets
 * the row count. Distributed (m->dist): collective over the world, every
 * rank calls it with the same batch; only world rank 0 receives LOGITS (the
 * other ranks' buffers are left as they were, *N_OUT is set everywhere). Checks first, computes nothing on error: an unknown token
 * id or a position past the context is LLM_ERR_RANGE, a bad sequence or
 * position order LLM_ERR_USAGE, more logit rows than the scratch holds
 * LLM_ERR_USAGE, a full cache LLM_ERR_NOMEM, a token naming an empty LoRA
 * slot LLM_ERR_RANGE. Each adapter's low-rank term is computed for its own
 * tokens only (llm_lora_apply over the slot's rows), so a step mixing
 * adapters costs the frozen matmuls once. */
enum llm_status llm_model_forward(struct llm_model *m, struct llm_backend *be, struct llm_kv *kv,
                                  struct llm_scratch *s, const struct llm_batch *b,
                                  float *logits, int *n_out);

/* Check that BE runs every op this model needs (before any compute). */
enum llm_status llm_model_check_backend(const struct llm_model *m, struct llm_backend *be);

#endif
