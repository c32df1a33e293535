/* common/partition.h: tensor x pipeline partitioning of a Llama checkpoint:
 * the plan (which rank holds which slice of which tensor), the partitioned
 * checkpoint on disk (written by llm-repartition, read by every tool through
 * ckpt.c), and the split the distributed forward pass computes with.
 *
 * Guarantees: a plan is checked completely before anything is written (a
 * refusal names the tensor and the sizes); slices are byte copies, so
 * partitioning and merging back (--tp 1 --pp 1) return the original tensor
 * bytes; a partitioned checkpoint opened whole (llm_ckpt_open) shows the same
 * tensors, names, shapes and bytes as the checkpoint it came from.
 * Layout on disk: man/llm-checkpoint.5 ("Partitioned checkpoints").
 *
 * ---- The split (what the distributed forward pass of issue 6 computes) ----
 *
 * T = --tp, P = --pp; rank r = p * T + t for stage p (0 .. P-1) and TP rank t
 * (0 .. T-1), so the T ranks of a stage are consecutive (one node under
 * mpirun's default by-slot mapping). Stage p holds layers [layer0[p],
 * layer0[p+1]); the embedding lives on stage 0, model.norm and lm_head on
 * stage P-1 (with tied embeddings and no lm_head.weight, stage P-1 also holds
 * model.embed_tokens.weight, its lm_head). Config: H heads, K kv heads, D =
 * d_head, F = d_ff, V = n_vocab. Rank t of a stage holds:
 *
 *   q_proj        rows  [t*H/T*D, (t+1)*H/T*D)   its query heads h in [t*H/T, (t+1)*H/T)
 *   k_proj,v_proj rows  T <= K: [t*K/T*D, (t+1)*K/T*D), kv heads [t*K/T, (t+1)*K/T);
 *                       T >  K: [g*D, (g+1)*D) with g = t*K/T (one kv head,
 *                       replicated on T/K ranks). Either way local query head i
 *                       uses local kv head i / (H/K) (T > K: always head 0), as
 *                       in the single-process model.
 *   o_proj        cols  the columns of its query heads (row-parallel)
 *   gate, up      rows  [t*F/T, (t+1)*F/T)
 *   down_proj     cols  [t*F/T, (t+1)*F/T)            (row-parallel)
 *   embed_tokens, lm_head rows [v0(t), v0(t+1)), v0(t) = floor(t*V/T)
 *   norms         whole (replicated)
 *   FP8 "<w>_scale_inv"/"<w>_scale": the scale blocks of its slice (block
 *                 rows or columns); replicated when the weight has a single
 *                 block along the split dimension.
 *   Requirements (refused otherwise): T | H; T | K or K | T; T | F; each
 *   shard boundary on an FP8 block boundary of its weight; P <= n_layer.
 *
 * Forward on rank (p, t), activations x (n_tok, d_model) f32, replicated on
 * the T ranks of a stage:
 *   stage 0:  x[i] = row tok[i] - v0(t) of its embed slice when the token is
 *             in its vocab range, else 0; all-reduce(sum) over the TP group
 *             (exact: one non-zero addend per element).
 *   per layer: xb = rmsnorm(x); q, k, v = xb . W^T with its slices; RoPE per
 *             head as before; the KV cache holds its stage's layers and its
 *             local kv heads only; attention over its local heads; o =
 *             attn . Wo_slice^T is a partial sum (n_tok, d_model):
 *             all-reduce(sum) over TP, then x += o. FFN the same: partial =
 *             (silu(xb.Wg^T) * xb.Wu^T) . Wd_slice^T, all-reduce, x += .
 *   stage boundary: x is the one tensor sent (the residual stream already
 *             holds the layer output: "residual and hidden state fused").
 *             With T > 1, rank t sends only elements [t*N/T, (t+1)*N/T) of
 *             the flat x (N = n_tok * d_model; any T) to rank (p+1)*T + t,
 *             which all-gathers the T pieces inside its stage (model.c
 *             stage_send/stage_recv): T times fewer bytes on the
 *             link between stages.
 *   last stage: xn = rmsnorm(x); logits slice = xn . LM_slice^T (n_tok,
 *             V_t); the T slices go to world rank 0, which puts them in
 *             vocabulary order and samples (a distributed greedy argmax by
 *             llm_comm_argmax would give the same ids: ties to the lowest id,
 *             as the single-process argmax).
 *   The sums of the all-reduce are in another order than the single-process
 *   dot products, so logits agree within f32 rounding, not bit for bit.
 */
#ifndef LLM_PARTITION_H
#define LLM_PARTITION_H

#include "ckpt.h"

#define LLM_PART_FILE "partition.json"   /* the record, in the checkpoint directory */
#define LLM_PART_META "llm_partition"    /* the record, in each rank file's __metadata__ */
#define LLM_PART_MAX_RANKS 4096

/* Where a tensor of a rank file lies in the whole tensor. */
struct llm_slice {
	int dim;                 /* split dimension: 0 (rows) or the last; -1 whole */
	int64_t start, len;      /* range along dim, in elements (scales: in blocks) */
	int64_t full;            /* the whole tensor's extent along dim */
};

struct llm_part_rank {
	int rank, stage, tp_rank;
	int layer_begin, layer_end;   /* [begin, end) */
	char *file;                   /* file name inside the checkpoint directory */
	uint64_t bytes;               /* tensor bytes in the file */
};

struct llm_part_src;              /* pieces of a partitioned checkpoint (partition.c) */

/* The partition record (partition.json, or one rank file's metadata). */
struct llm_partition {
	int tp, pp, n_layer, n_rank;
	int *layer0;                  /* (pp + 1): stage p holds [layer0[p], layer0[p+1]) */
	struct llm_part_rank *ranks;  /* (n_rank), index = rank; read from one file: only
	                                 ranks[rank] is filled */
	size_t n_tensor;
	struct llm_tensor *tensors;   /* (n_tensor) the whole model in its original order:
	                                 name, dtype, full shape, nbytes; data NULL */
	int *split;                   /* (n_tensor) split dimension, -1: never split */
	/* one rank's view (llm_ckpt_open_rank, or a rank file opened alone) */
	int rank;                     /* -1: the whole checkpoint */
	size_t n_slice;
	char **slice_name;            /* (n_slice) sorted; tensors not listed are whole */
	struct llm_slice *slice;      /* (n_slice) */
	struct llm_part_src *src;     /* open rank files behind a merged view */
};

/* ---- planning and writing: llm-repartition ----------------------------- */

struct llm_part_opts {
	int tp, pp;                   /* >= 1 */
	const int *layers;            /* (pp) layers per stage, or NULL: balanced */
	int dry_run;                  /* check and print the plan on stdout; write nothing */
	int progress;                 /* progress line on stderr */
	struct llm_ckpt_write_opts write;   /* force; max_shard_size for --tp 1 --pp 1 */
};

/* Repartition IN (a checkpoint, partitioned or not) into OUT for tp x pp
 * ranks; tp = pp = 1 writes a plain Hugging Face checkpoint (directory,
 * .safetensors file or "-"), otherwise OUT is a directory with one file per
 * rank plus partition.json and the side files. Every check runs before
 * anything is written; OUT appears only when complete. Peak memory is one
 * chunk (8 MB) plus the writer's buffer. Statuses: LLM_ERR_USAGE for a plan
 * the model does not allow (heads, blocks, layers), LLM_ERR_EXISTS, and
 * those of reading and writing. */
enum llm_status llm_repartition(const char *in, const char *out, const struct llm_part_opts *o);

/* Split N into T near-equal consecutive ranges: range t is
 * [floor(t*N/T), floor((t+1)*N/T)). */
void llm_part_range(int64_t n, int tp, int t, int64_t *start, int64_t *len);

/* Contiguous layers per stage minimizing the largest stage cost, where
 * stage 0 also costs FIRST_EXTRA and stage P-1 LAST_EXTRA; every stage gets
 * at least one layer (needs pp <= n_layer). Ties go to the earlier split.
 * LAYER0 (pp + 1) receives the boundaries. */
enum llm_status llm_part_balance(const int64_t *cost, int n_layer, int64_t first_extra,
                                 int64_t last_extra, int pp, int *layer0);

/* ---- reading (called by ckpt.c) ---------------------------------------- */

/* Whether the directory PATH holds partition.json. */
int llm_partition_is_dir(const char *path);
/* Parse DIR/partition.json (the ranks and the whole-model tensor list). */
enum llm_status llm_partition_load(struct llm_partition **p, const char *dir);
/* Parse a rank file's LLM_PART_META metadata (its rank and slices). */
enum llm_status llm_partition_from_meta(struct llm_partition **p, const struct llm_st_file *f);
void llm_partition_free(struct llm_partition *p);
/* Open the rank files of DIR and fill CK (zeroed, path set) with one virtual
 * file holding the whole tensors in their original order: tensors held
 * whole by some rank point into its mapping; split tensors are assembled
 * into heap copies when ASSEMBLE, else left with data NULL (read them with
 * llm_partition_read). Sets ck->part. Side files are left to the caller. */
enum llm_status llm_partition_open_view(struct llm_ckpt *ck, const char *dir, int assemble);
/* Copy rows [r0, r1) x columns [c0, c1) of whole tensor T of a view opened
 * by llm_ckpt_open_lazy (T viewed as 2-D: rows = shape[0] for 2-D tensors, 1
 * for 1-D) into DST, row-major and c1 - c0 wide. */
enum llm_status llm_partition_read(const struct llm_ckpt *ck, const struct llm_tensor *t,
                                   int64_t r0, int64_t r1, int64_t c0, int64_t c1, void *dst);
/* Attach the loaded record P to CK, a rank file opened alone whose metadata
 * record is ck->part: checks they agree (rank, tp, pp, file) and keeps the
 * slices. Takes P in every case. */
enum llm_status llm_partition_attach(struct llm_ckpt *ck, struct llm_partition *p, int rank);
/* This rank's slice of tensor NAME, or NULL when it holds NAME whole. */
const struct llm_slice *llm_partition_slice(const struct llm_partition *p, const char *name);
/* LLM_ERR_USAGE naming PATH when the partition needs other than SIZE ranks. */
enum llm_status llm_partition_check_world(const struct llm_partition *p, int size, const char *path);

#endif
