/* common/train/train.h: LoRA fine-tuning on a frozen base: the training forward
 * and backward pass (train.c), the optimizer (optim.c) and the training data
 * (dataset.c).
 *
 * The forward pass is the one of model.c (Hugging Face LlamaForCausalLM):
 * per layer h = x + o(attn(rope(q(n)), rope(k(n)), v(n))), n = rmsnorm(x);
 * x' = h + down(silu(gate(m)) * up(m)), m = rmsnorm(h); logits =
 * lm_head(rmsnorm(x)); loss = mean over counted tokens of -log softmax;
 * with the changes of the model's dense family (family.h) read where they
 * matter, as model.c reads them: q/k/v biases (qwen2), per-head q and k
 * norms (qwen3), sliding windows (mistral; gemma2's even layers), the
 * embedding scale, (1 + w) norms, GeGLU, attention and final logit
 * softcaps, query_pre_attn_scalar and the norms after attention and MLP
 * (gemma2), and rope_scaling's frequencies and YaRN attention factor.
 * A mixture of experts (Mixtral, Qwen3-MoE) has moe.c's FFN in place of the
 * MLP (train_moe.h: the router frozen, the top-k choice a constant, the
 * gradient through the routing weights and each chosen expert). Every
 * projection and expert may carry a LoRA adapter (lora.h). The backward pass goes through all of it
 * (RMSNorm, RoPE, grouped-query causal attention with its scale, softcap
 * and window, SwiGLU or GeGLU, the family's norms, tied or untied lm_head,
 * the final softcap, cross-entropy) and produces the gradient of the LoRA
 * parameters only: the biases and norm weights are frozen and the gradient
 * flows through them; the base weights are frozen and read in place
 * from the checkpoint mapping (F32, F16, BF16 or FP8 E4M3 dequantized per
 * block inside the kernels, as inference does; no dequantized copy of a
 * matrix exists). Activations and math are F32 (the reference); a double
 * precision instance of the same code serves the gradient check.
 *
 * Memory: the residual stream at every layer boundary is kept; with
 * activation checkpointing the rest of a layer's activations are recomputed
 * in the backward pass from it, one layer at a time, so one layer's worth is
 * held instead of n_layer. Logits exist only for a chunk of the counted
 * tokens at a time. Everything is allocated at open (llm_train_plan()).
 *
 * Determinism: every output element is computed by one thread with a fixed
 * reduction order, so results do not depend on the thread count, and a
 * resumed run reproduces an uninterrupted one bit for bit. */
#ifndef LLM_TRAIN_H
#define LLM_TRAIN_H

#include "status.h"
#include "model.h"
#include "lora.h"

struct llm_tokenizer;

/* ---- batches -------------------------------------------------------------- */

/* N_SEQ rows of SEQ_LEN token slots. Each row packs whole samples; a token
 * attends to the tokens of its own sample only ([start, t] of its row), at
 * RoPE positions counted from its sample's start, so a packed sample trains
 * exactly as it would alone. */
struct llm_train_batch {
	int n_seq, seq_len;
	const int32_t *tok;     /* (n_seq, seq_len) input ids */
	const int32_t *tgt;     /* (n_seq, seq_len) next-token target; -1: not counted */
	const int32_t *pos;     /* (n_seq, seq_len) position within its sample */
	const int32_t *start;   /* (n_seq, seq_len) slot of its sample's first token */
	/* (n_seq) or NULL: an id for each row, which makes the dropout masks a
	 * function of (key, row id, slot) instead of (key, slot in this batch),
	 * so the same row gets the same masks in any micro-batch on any rank */
	const int64_t *row;
};

/* ---- trainer -------------------------------------------------------------- */

struct llm_train_opts {
	int seq_len, n_seq;     /* the largest batch: n_seq rows of seq_len */
	int checkpoint;         /* activation checkpointing per layer */
	int n_threads;          /* 0: every online CPU (F32 only; F64 runs on one) */
	int f64;                /* double precision (the gradient check) */
	int logit_chunk;        /* counted tokens per lm_head chunk (0: 64) */
};

/* Bytes the trainer allocates (besides the mapped base weights and the
 * adapter parameters it is given), per category. */
struct llm_train_plan {
	size_t params;          /* the LoRA parameters (owned by struct llm_lora) */
	size_t grads;           /* their gradient */
	size_t optimizer;       /* AdamW m and v (optim.c, not the trainer) */
	size_t checkpoints;     /* residual stream at the n_layer + 1 layer boundaries */
	size_t layer_acts;      /* saved layer activations: n_layer layers, or 1 with checkpointing */
	size_t workspace;       /* backward gradients of one layer, final norm */
	size_t logits;          /* one chunk of logits and its gathered rows */
	size_t threads;         /* per-thread scratch */
	size_t total;           /* the sum of all the above */
};
/* What llm_trainer_open(C, LO, O) allocates, without allocating; LO gives the
 * parameter count (n_params) and rank. N_THREADS as resolved (>= 1). */
void llm_train_plan(const struct llm_config *c, size_t n_params, int rank, int n_targets,
                    const struct llm_train_opts *o, int n_threads, struct llm_train_plan *p);

struct llm_trainer;

/* Frozen weights of one layer, fetched just before the layer runs and
 * released right after (the hook for sharded or off-loaded base weights).
 * NULL fetch: the model's own layers. The layer returned carries every
 * weight the family reads (llm_layer: biases, q/k norms, sandwich norms
 * too; one without them fails the step). A fetch that fails returns NULL
 * with the message set; the step then returns LLM_ERR_COMM. */
struct llm_layer_source {
	const struct llm_layer *(*fetch)(void *ctx, int layer);
	void (*release)(void *ctx, int layer);
	void *ctx;
};

/* Build a trainer for model M (borrowed, with its mapping) and adapter LO
 * (borrowed: F32 trains LO->params in place; F64 trains its own double
 * copy, llm_trainer_params()). LLM_ERR_USAGE for bad sizes or an adapter
 * that does not fit the model, LLM_ERR_NOMEM. */
enum llm_status llm_trainer_open(struct llm_trainer **t, const struct llm_model *m,
                                 struct llm_lora *lo, const struct llm_train_opts *o,
                                 const struct llm_layer_source *src);
void llm_trainer_close(struct llm_trainer *t);

/* What llm_trainer_step() does besides the forward pass and the loss. */
enum {
	LLM_TRAIN_GRAD = 1,       /* backward: add the gradient */
	LLM_TRAIN_DROPOUT = 2,    /* apply the LoRA dropout (training mode) */
};

/* Forward (and with LLM_TRAIN_GRAD, backward) over batch B: *LOSS_SUM gets
 * the sum over counted tokens of -log p(target) in nats, *N_COUNT their
 * number, and the gradient buffer gets GSCALE * d(loss_sum)/d(params) added
 * (so accumulate micro-batches with GSCALE = 1 / tokens of the whole step).
 * With LLM_TRAIN_DROPOUT, DROPOUT_KEY selects the dropout masks (a
 * counter-based hash of key, layer, target, token and column: the same key
 * gives the same masks, also when a checkpointed layer is recomputed).
 * LLM_ERR_RANGE for a token id outside the vocabulary, LLM_ERR_USAGE for a
 * batch larger than opened for or inconsistent positions. */
enum llm_status llm_trainer_step(struct llm_trainer *t, const struct llm_train_batch *b,
                                 double gscale, uint64_t dropout_key, int flags,
                                 double *loss_sum, int64_t *n_count);
/* The parameters trained and their gradient: float * (F32) or double *
 * (F64), llm_trainer_n_params() elements in the layout of struct llm_lora. */
void *llm_trainer_params(struct llm_trainer *t);
void *llm_trainer_grads(struct llm_trainer *t);
size_t llm_trainer_n_params(const struct llm_trainer *t);
void llm_trainer_zero_grad(struct llm_trainer *t);
/* Greedy continuation of PROMPT (N_PROMPT ids) by up to N_NEW tokens,
 * stopping after an EOS id of the model; OUT gets the new ids, *N_OUT their
 * count. Recomputes the whole sequence per token (a check, not a server). */
enum llm_status llm_trainer_greedy(struct llm_trainer *t, const int32_t *prompt, int n_prompt,
                                   int n_new, int32_t *out, int *n_out);

/* ---- exposed for the tests: one op forward and backward, double ---------- */

/* RMSNorm of N rows of D: y = w * x / sqrt(mean(x^2) + eps); backward gives
 * dx from dy (w from the F32 vector W). */
void llm_train_rmsnorm_f64(double *y, double *rstd, const double *x, const struct llm_weight *w,
                           int64_t n, int64_t d, float eps);
void llm_train_rmsnorm_bwd_f64(double *dx, const double *dy, const double *x, const double *rstd,
                               const struct llm_weight *w, int64_t n, int64_t d);

/* ---- optimizer (optim.c) --------------------------------------------------- */

struct llm_adamw_opts {
	double lr;              /* peak learning rate */
	double min_lr_ratio;    /* cosine decays to lr * min_lr_ratio */
	int64_t warmup;         /* linear warmup steps (from lr / warmup) */
	int64_t total;          /* steps in the run (the cosine period ends here) */
	double beta1, beta2, eps;
	double weight_decay;    /* decoupled (AdamW), on every LoRA parameter */
	double clip;            /* global gradient-norm clip; 0: none */
};

struct llm_adamw {
	struct llm_adamw_opts o;
	size_t n;
	float *m, *v;           /* (n) first and second moments */
	int64_t step;           /* updates done */
};

/* Learning rate of update STEP (0-based): linear warmup over `warmup` steps
 * to lr, then cosine from lr to lr * min_lr_ratio at step `total`. */
double llm_lr_at(const struct llm_adamw_opts *o, int64_t step);
enum llm_status llm_adamw_init(struct llm_adamw *a, size_t n, const struct llm_adamw_opts *o);
void llm_adamw_free(struct llm_adamw *a);
/* L2 norm of G (accumulated in double, in order). */
double llm_grad_norm(const float *g, size_t n);
/* One update of P from gradient G with learning rate LR: G is scaled by
 * clip / norm when NORM exceeds the clip, then Adam with bias correction
 * and decoupled weight decay. Increments a->step. */
void llm_adamw_update(struct llm_adamw *a, float *p, const float *g, double norm, double lr);

/* ---- data (dataset.c) ------------------------------------------------------ */

/* One tokenized sample: ids[0..n) with loss[i] = 1 where predicting ids[i]
 * counts (completion tokens, or every token after the first with
 * train_on_prompt). */
struct llm_sample {
	int32_t *ids;
	uint8_t *loss;
	int n;
	int line;               /* 1-based line of the JSONL file */
};

struct llm_dataset {
	struct llm_sample *s;
	int n;
	int n_skipped;          /* bad lines skipped (skip_bad) */
	int64_t n_tok, n_loss_tok;
};

struct llm_data_opts {
	int seq_len;            /* a sample needs at most seq_len + 1 tokens */
	int train_on_prompt;    /* count the prompt tokens too */
	int skip_bad;           /* skip and count bad lines instead of failing */
	const char *chat_template;   /* overrides the tokenizer's (chat format) */
};

/* Read JSONL file PATH: each line an object, either
 *   {"instruction": ..., "input": ... (optional), "output": ...}: the prompt
 *   is the instruction, a newline and the input if any, then a newline; the
 *   completion is the output followed by EOS; BOS first when the tokenizer
 *   adds one; or
 *   {"messages": [{"role": ..., "content": ...}, ...]}: rendered with the
 *   chat template; the tokens of each assistant message (what the template
 *   adds after the generation prompt) are the completion.
 * Blank lines are ignored. A bad line (not JSON, neither format, an empty
 * completion, longer than seq_len + 1 tokens) is LLM_ERR_FORMAT
 * "PATH:LINE: reason", or with skip_bad counted in n_skipped and that
 * message passed to WARN (may be NULL). No sample at all is an error. */
enum llm_status llm_dataset_load(struct llm_dataset *d, const char *path,
                                 const struct llm_tokenizer *tk, const struct llm_data_opts *o,
                                 void (*warn)(const char *msg));
void llm_dataset_free(struct llm_dataset *d);

/* Samples shuffled by (SEED, EPOCH) (Fisher-Yates) and packed in that order
 * into rows of SEQ_LEN slots, a new row when the next sample does not fit
 * (PACK 0: one sample per row); a sample of n tokens takes n - 1 slots
 * (inputs ids[0..n-1), targets ids[1..n)). Free slots hold token 0 with
 * target -1, each a sample of its own. */
struct llm_packed {
	int n_row, seq_len;
	int32_t *tok, *tgt, *pos, *start;   /* (n_row, seq_len) */
	int32_t *used;                      /* (n_row) slots holding sample tokens */
	int64_t n_count;                    /* counted targets */
};
enum llm_status llm_dataset_pack(const struct llm_dataset *d, int seq_len, int pack, uint64_t seed,
                                 int64_t epoch, struct llm_packed *p);
void llm_packed_free(struct llm_packed *p);

/* ---- the frozen base of a run: sharded or off-loaded (finetune.c) ----------- */

/* ZeRO-3 style sharding (Rajbhandari et al. 2020, stage 3, for the frozen
 * weights only): each decoder layer's weights and scales, laid out back to
 * back (each piece 64-byte aligned) as the layer's blob, are split into N
 * equal byte ranges; rank r keeps range r in its own memory and drops the
 * checkpoint pages of the layer, and before each use of the layer (forward,
 * backward, recomputation) the ranks all-gather the blob into one working
 * buffer: the bytes are the checkpoint's exactly, so results do not change.
 * The embeddings, final norm and lm_head are not sharded (every rank holds
 * them). Off-loading keeps the first round(FRACTION x n_layer) decoder
 * layers (their shards, when sharded) in host memory and copies a layer into
 * the working buffer when it is used; on the CPU backend host memory is the
 * only memory, so this is the bookkeeping (and the copy) a GPU backend
 * needs, not a saving. */
struct llm_frozen_plan {
	size_t decoder;         /* bytes of all decoder layers' weights and scales (whole model) */
	size_t other;           /* embeddings, final norm, lm_head (whole model, held by every rank) */
	size_t resident;        /* per rank: frozen bytes held in (device) memory */
	size_t offloaded;       /* per rank: frozen bytes held in host memory, copied in per use */
	size_t buffer;          /* per rank: the working layer buffer (0: layers are used in place) */
	int n_offloaded;        /* decoder layers [0, n_offloaded) are off-loaded */
};
/* Whether SHARD and OFFLOAD can hold M's frozen weights: LLM_ERR_UNSUPPORTED
 * naming PATH for a mixture of experts (its experts are not in a layer's
 * blob), else LLM_OK. */
enum llm_status llm_frozen_check(const struct llm_model *m, const char *path, int shard, double offload);
/* The frozen-weight memory of one of RANKS ranks for model M (headers
 * only: no weight is read), with SHARD and OFFLOAD in [0, 1]. */
void llm_frozen_plan(const struct llm_model *m, int ranks, int shard, double offload,
                     struct llm_frozen_plan *p);
/* The resident bytes of M's input embedding table in a run over the
 * samples of D (pad id 0 included): a separate (untied) table is a file
 * mapping of which only the rows the tokens use are read, each bringing in
 * the fault-around window of the kernel (64 KiB, aligned) it lies in; a
 * table tied to the lm_head is read whole. D NULL: the whole table. *TABLE:
 * the table's bytes. */
size_t llm_embed_resident(const struct llm_model *m, const struct llm_dataset *d, size_t *table);

/* ---- a fine-tuning run (finetune.c) ---------------------------------------- */

struct llm_finetune_opts {
	const char *model;          /* base checkpoint */
	const char *data;           /* JSONL */
	const char *out;            /* adapter directory */
	const char *adapter;        /* start from this adapter (NULL: a fresh one) */
	int rank;
	double alpha, dropout;
	unsigned targets;
	struct llm_data_opts data_o;   /* seq_len is taken from seq_len below */
	int pack;
	int seq_len, micro_batch, grad_accum;
	int64_t epochs, steps;      /* steps 0: as many as EPOCHS passes take */
	struct llm_adamw_opts adam; /* total is set from the step count */
	uint64_t seed;
	int checkpoint, n_threads;
	int64_t save_every;         /* 0: never */
	int resume, force;
	const char *log;            /* CSV of the loss curve, NULL: none */
	int plot;                   /* an ASCII plot of the loss on stderr at the end */
	/* Several ranks (data parallel): every rank of COMM calls llm_finetune
	 * with the same options; each step's micro_batch x grad_accum rows are
	 * split into equal contiguous slices (the count must be a multiple of
	 * the ranks), each rank computes its slice's gradient, one all-reduce
	 * sums them, and every rank takes the same AdamW step. Rank 0 alone
	 * writes the adapter, the log and the state, and prints progress.
	 * NULL: one process. */
	struct llm_comm *comm;
	int shard_base;             /* shard the frozen decoder weights across the ranks */
	double offload_base;        /* share of the decoder layers off-loaded to host memory */
};

struct llm_finetune_result {
	int64_t steps, start_step;  /* the run's step count; where it resumed */
	double first_loss, last_loss;   /* mean over the first and last step of this run */
	double tokens_per_s;        /* sample tokens (not padding) per second, this run */
	int64_t tokens;
	size_t peak_rss;            /* bytes, getrusage */
	struct llm_train_plan plan; /* what the trainer and optimizer allocated */
	size_t weight_bytes;        /* the base weights (mapped) */
	int n_skipped;              /* bad lines skipped */
	int n_samples;
	int n_ranks;
	size_t peak_rss_max;        /* the largest peak RSS of the ranks */
	struct llm_frozen_plan frozen;   /* the frozen weights per rank */
	uint64_t gathered, copied_in;    /* bytes all-gathered from other ranks, copied into the buffer */
	int peer_failed;            /* another rank failed first and reports it: wait to be ended */
};

/* Train a LoRA adapter on O->data and write it to O->out (PEFT layout), with
 * progress on stderr (llm_log level 1), the training state in
 * OUT/training_state.bin every save_every steps (written atomically;
 * removed when the run completes), resumable with resume (the options must
 * match: LLM_ERR_USAGE otherwise) to the same adapter bit for bit (with the
 * same number of ranks; with another, up to the summation order).
 * LLM_ERR_EXISTS when OUT holds an adapter and neither force nor resume.
 * Several ranks: collective over O->comm. An error before the first step
 * (options, data, files) is agreed on: the lowest failing rank returns it
 * and the others return LLM_ERR_COMM with r->peer_failed set. An error
 * during the steps returns on the failing rank alone, whose caller must end
 * the job (llm_comm_die), since the others wait in a collective. */
enum llm_status llm_finetune(const struct llm_finetune_opts *o, struct llm_finetune_result *r);

/* Greedy continuation of TEXT (encoded with BOS as the tokenizer adds it)
 * by model MODEL with the adapter in directory ADAPTER (NULL: the base
 * alone); *OUT (malloc'ed) gets the decoded new text. */
enum llm_status llm_finetune_sample(const char *model, const char *adapter, const char *text,
                                    int n_new, int n_threads, char **out);

/* The tokenizer of a checkpoint: its directory's files, or the side files
 * carried in a single .safetensors (M's mapping). */
enum llm_status llm_finetune_tokenizer(const struct llm_model *m, const char *path,
                                       struct llm_tokenizer **tk);

#endif
