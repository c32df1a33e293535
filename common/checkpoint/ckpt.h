/* common/checkpoint/ckpt.h: the llm-tools checkpoint (see man/llm-checkpoint.5).
 *
 * A checkpoint is a Hugging Face model directory (config.json, tokenizer
 * files, model.safetensors or model-0000i-of-0000n.safetensors with
 * model.safetensors.index.json), or one .safetensors file whose __metadata__
 * carries the side files as strings keyed by file name, or that same stream
 * on standard input/output ("-").
 *
 * FP8 weights: "<name>.weight" F8_E4M3 (d_out, d_in) with
 * "<name>.weight_scale_inv" F32 (ceil(d_out/bn), ceil(d_in/bk)): the block
 * multiplier, value = code * scale; config.json carries quantization_config
 * {quant_method: fp8, fmt: e4m3, activation_scheme: dynamic,
 * weight_block_size: [bn, bk], modules_to_not_convert}. Checkpoints with
 * "<name>.weight_scale" per tensor or per output channel (compressed-tensors,
 * fbgemm_fp8) are read too; input_scale tensors are not used. */
#ifndef LLM_CKPT_H
#define LLM_CKPT_H

#include "progress.h"
#include "safetensors.h"

/* A side file carried through unchanged (config.json, tokenizer.json ...). */
struct llm_aux {
	char *name;
	char *data;     /* NUL-terminated */
	size_t len;
};

struct llm_partition;             /* below */

struct llm_ckpt {
	char *path;
	int is_dir;
	size_t n_file;
	struct llm_st_file *files;
	size_t n_tensor;
	struct llm_tensor **tensors;   /* sorted by name */
	size_t n_aux;
	struct llm_aux *aux;
	float **scale_copies;          /* f32 copies of non-f32 scales */
	size_t n_scale_copies;
	struct llm_partition *part;    /* a partitioned checkpoint's record, else NULL */
};

/* Open a checkpoint: directory, .safetensors file or "-". Validates every
 * file and the index (each indexed tensor present in its file, no tensor
 * twice across shards). Side files are read from the directory or from the
 * metadata. */
enum llm_status llm_ckpt_open(struct llm_ckpt *ck, const char *path);
void llm_ckpt_close(struct llm_ckpt *ck);

/* Partitioned checkpoints (llm-repartition; partition.h, llm-checkpoint(5)).
 * llm_ckpt_open on such a directory gives the merged view: the whole tensors
 * of the original model, in its order, ck->part set (split tensors are
 * assembled into heap copies; tensors some rank holds whole point into its
 * mapping). llm_ckpt_open on one rank's file gives that rank's slices, with
 * ck->part holding its record. */
/* As llm_ckpt_open, but split tensors of a partitioned checkpoint keep data
 * NULL: read them a range at a time with llm_partition_read (streaming). */
enum llm_status llm_ckpt_open_lazy(struct llm_ckpt *ck, const char *path);
/* Open only rank RANK's file of the partitioned checkpoint DIR (what one
 * process of a distributed run maps): its slices, the side files of DIR,
 * ck->part with the whole record (rank, stages, slices). LLM_ERR_RANGE when
 * the checkpoint has no such rank. */
enum llm_status llm_ckpt_open_rank(struct llm_ckpt *ck, const char *dir, int rank);
const struct llm_tensor *llm_ckpt_find(const struct llm_ckpt *ck, const char *name);
/* A side file by name ("config.json"), or NULL. */
const struct llm_aux *llm_ckpt_aux(const struct llm_ckpt *ck, const char *name);
/* Drop the pages of tensor T from this process's resident set once it is
 * no longer needed (a streaming pass); the page cache keeps them. */
void llm_ckpt_release(const struct llm_ckpt *ck, const struct llm_tensor *t);
/* One copy of checkpoint bytes: N bytes from SRC (inside one of the
 * checkpoint's files, or any memory) to DST. */
struct llm_ckpt_copy {
	void *dst;
	const void *src;
	size_t n;
};
/* Copy every job with up to N_THREADS threads (0: the online CPUs, at most
 * 8): bytes inside a mapped file are read with pread, from the page cache
 * (or the disk) straight into DST as cat reads them, so the file mapping's
 * pages are never faulted in; other bytes are memcpy'd. The threads take
 * 4 MiB pieces in job order, so a file is read front to back. LLM_ERR_IO
 * naming the file on a read error or a short read (DST then partly
 * written). STOP (NULL: none), set by another thread: no piece is started
 * after it is seen, and the copy fails with LLM_ERR_USAGE. */
enum llm_status llm_ckpt_copy_out(const struct llm_ckpt *ck, const struct llm_ckpt_copy *jobs,
                                  size_t n_jobs, int n_threads, const _Atomic int *stop);
/* Whether any tensor is F8_E4M3 (the checkpoint is quantized). */
int llm_ckpt_is_fp8(const struct llm_ckpt *ck);
/* Scan every float tensor of CK (F32, F16, BF16, E4M3 codes, scales) for
 * NaN or infinite values, in one streaming pass over the mapping (pages
 * dropped from the resident set behind it). LLM_ERR_RANGE naming the file,
 * the first bad tensor (name order) and the index of its first bad value;
 * *N_VALUES (may be NULL) gets the number of values checked. */
enum llm_status llm_ckpt_check_finite(const struct llm_ckpt *ck, size_t *n_values);

/* A weight matrix as the kernels see it. For E4M3, element (r, c) is
 * code(r, c) * scale[(r / block_rows) * scale_cols + c / block_cols]. */
struct llm_weight {
	const char *name;
	enum llm_dtype dtype;        /* F32, F16, BF16 or E4M3 */
	int64_t rows, cols;          /* (d_out, d_in); a vector is 1 x n */
	const void *data;            /* rows x cols, row-major */
	const float *scale;          /* E4M3: (scale_rows, scale_cols) */
	int64_t scale_rows, scale_cols;
	int64_t block_rows, block_cols;
};
/* The FP8 scale rules, stated once (llm_ckpt_weight and the partition
 * planner use them): the scale tensor of the E4M3 weight NAME of ROWS x COLS
 * is "<NAME>_scale_inv" or else "<NAME>_scale"; a 2-D "_scale_inv" holds
 * blocks of config.json's quantization_config.weight_block_size, or when
 * config.json has none, blocks derived from the two shapes; otherwise one
 * element is a per-tensor scale and ROWS elements ((rows) or (rows, 1)) are
 * per output channel. *SCALE gets the scale tensor, *BN x *BK the weight
 * elements one scale covers. LLM_ERR_FORMAT naming the tensor when the scale
 * is missing or its shape fits none of these. */
enum llm_status llm_ckpt_fp8_scale(const struct llm_ckpt *ck, const char *name, int64_t rows, int64_t cols,
                                   const struct llm_tensor **scale, int64_t *bn, int64_t *bk);
/* Resolve NAME (e.g. "model.layers.0.mlp.up_proj.weight") and its scale
 * tensor, whichever layout the checkpoint uses. */
enum llm_status llm_ckpt_weight(struct llm_ckpt *ck, const char *name, struct llm_weight *w);
/* Bytes of W's elements, and of its scales (E4M3; else 0). */
size_t llm_weight_data_bytes(const struct llm_weight *w);
size_t llm_weight_scale_bytes(const struct llm_weight *w);

/* ---- writing ---------------------------------------------------------- */

struct llm_ckpt_write_opts {
	size_t max_shard_size;   /* bytes per shard, directories only (0: 5 GB) */
	int force;               /* replace an existing OUT */
	struct llm_progress *progress;  /* NULL, or counts bytes, tensors, files written and ticks */
};

struct llm_ckpt_writer;

/* Plan the output: OUT is a directory, a .safetensors file or "-". DESCS
 * (name, dtype, shape; data ignored) and AUX are copied. Nothing is visible
 * at OUT until llm_ckpt_write_commit(). Tensors are then written in the
 * order given by llm_ckpt_write_next(). */
enum llm_status llm_ckpt_write_begin(struct llm_ckpt_writer **w, const char *out,
                                     const struct llm_tensor *descs, size_t n_desc,
                                     const struct llm_aux *aux, size_t n_aux,
                                     const struct llm_ckpt_write_opts *opts);
/* Index into DESCS of the next tensor to write, or -1 when all are written. */
long llm_ckpt_write_next(struct llm_ckpt_writer *w);
/* Append bytes of the current tensor; may be called several times. */
enum llm_status llm_ckpt_write_data(struct llm_ckpt_writer *w, const void *data, size_t n);
/* fsync and rename into place; frees W. */
enum llm_status llm_ckpt_write_commit(struct llm_ckpt_writer *w);
/* Remove everything written; frees W. Safe on NULL. */
void llm_ckpt_write_abort(struct llm_ckpt_writer *w);

/* ---- partitioned checkpoints ----------------------------------------
 * Written by llm-repartition (partition.h, which also states the split);
 * read here, as part of opening a checkpoint (ckpt_part.c). */

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

struct llm_part_src;              /* pieces of a partitioned checkpoint (ckpt_part.c) */

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

/* ---- reading partitioned checkpoints (ckpt_part.c) ---------------------- */

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
/* T as the 2-D matrix slices cut (llm_partition_read): COLS the last
 * dimension, ROWS the rest; whether a split along DIM cuts T's rows. */
void llm_partition_view2d(const struct llm_tensor *t, int64_t *rows, int64_t *cols);
int llm_partition_split_rows(const struct llm_tensor *t, int dim);
/* Drop the source pages of T, a tensor of CK (a merged view or not), from
 * the resident set (streaming), as llm_ckpt_release. */
void llm_partition_release(const struct llm_ckpt *ck, const struct llm_tensor *t);

#endif
