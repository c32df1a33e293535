/* common/engine/kvcache.h: the paged KV cache and the forward batch that addresses it.
 *
 * The pool holds n_block blocks, allocated once at start-up; a block holds
 * block_size token positions of K and V for every layer. A sequence owns a
 * block table: position p lives in block blk[p / block_size], slot
 * p % block_size. Blocks are reference counted, so a fork shares a prefix
 * (llm_score, prefix caching) and a write into a shared block first copies
 * it (copy on write). Nothing is allocated after llm_kv_init().
 *
 * Layout: k, v each (n_layer, n_block, n_kv_head, block_size, d_head),
 * row-major, of dtype F32, BF16 or E4M3: within a block, one KV head's rows
 * lie together, so attention (which reads one KV head's positions in
 * order) streams d_head * block_size contiguous elements a block. Measured
 * (decode attention alone, SmolLM2-135M's 30 layers x 3 KV heads of 64,
 * BF16, depth 1024, one AVX2 core): 4.0 ms a token against 6.4-8.5 ms with
 * the token's heads side by side (a head's 128 bytes every 384), which
 * neither the hardware nor software prefetch made sequential enough.
 * An E4M3 cache also holds one f32 scale per (token, head): ks, vs
 * (n_layer, n_block, n_kv_head, block_size);
 * element i of a head's row is e4m3(code_i) * scale (llm_kv_e4m3_row).
 * Why per (token, head) rather than per (block, head): a row is written
 * once, alone, and its scale depends on nothing else, so the cache is
 * append-only (a block scale would have to be fixed by the block's first
 * token, clipping later larger ones, or requantize earlier rows when a
 * larger one comes); for d_head 64 it costs 4 bytes per 64 (6%).
 * Measured on stories260K (story NLL, f32 KV 555.03): per (token, head)
 * 557.90 (+0.5%); a (block, head) scale fixed by the block's first row
 * 1373.8, and with that scale times 2, 4 or 16 for headroom 783.6, 744.9,
 * 771.9 (later rows clip or sink into E4M3's subnormals).
 *
 * Sliding window (window > 0: every layer of the model attends to the last
 * window positions only, Mistral's): a step whose first query of a
 * sequence is at position p needs no key before p - window + 1, so
 * llm_kv_prepare releases the blocks wholly before it (the table holds -1
 * there); a fork or a step that would need a released block is refused. */
#ifndef LLM_KVCACHE_H
#define LLM_KVCACHE_H

#include "status.h"
#include "dtype.h"

struct llm_backend;

/* One forward step: a flat list of tokens, each with its sequence and
 * position, with no padding. Prefill chunks of some sequences and decode
 * tokens of others mix freely. For each sequence, its tokens appear in
 * order at positions len, len+1, ... where len is the sequence's length
 * in the cache before the step. */
struct llm_batch {
	int n_tok;
	const int32_t *token;     /* (n_tok) ids in [0, n_vocab) */
	const int32_t *pos;       /* (n_tok) positions in the sequence */
	const int32_t *seq;       /* (n_tok) sequence ids from llm_kv_seq_new() */
	const int8_t *logits;     /* (n_tok) 1: produce logits for this token; NULL: last token only */
	const int32_t *adapter;   /* (n_tok) LoRA slot of the token's request (model.h): 0 the base;
	                             NULL: every token the base */
};

struct llm_kv_opts {
	int n_layer, n_kv_head, d_head;
	enum llm_dtype dtype;     /* LLM_DTYPE_F32, LLM_DTYPE_BF16 or LLM_DTYPE_E4M3 */
	int block_size;           /* positions per block (16) */
	int64_t n_block;          /* blocks in the pool */
	int max_seq;              /* sequence slots */
	int max_ctx;              /* positions per sequence */
};

struct llm_kv_seq {
	int used;
	int32_t len;              /* positions written */
	int32_t n_blk;            /* blocks in the table */
	int32_t *blk;             /* (max_ctx / block_size, rounded up); -1: released,
	                             out of the window */
};

struct llm_kv {
	int n_layer, n_kv_head, d_head, kv_dim, block_size, max_seq, max_ctx, max_blk;
	int64_t n_block;
	enum llm_dtype dtype;
	size_t elt;               /* bytes per element */
	struct llm_backend *be;   /* owns k, v */
	void *k, *v;              /* (n_layer, n_block, n_kv_head, block_size, d_head) */
	float *ks, *vs;           /* (n_layer, n_block, n_kv_head, block_size) E4M3 scales; else NULL */
	int window;               /* llm_kv_set_window; 0: none */
	int keep;                 /* llm_kv_set_keep: positions held behind the window besides */
	int32_t *ref;             /* (n_block) reference counts; 0: free */
	int32_t *free_list;       /* (n_block) stack of free blocks */
	int64_t n_free;
	struct llm_kv_seq *seq;   /* (max_seq) */
	int32_t *next;            /* (max_seq) scratch of llm_kv_prepare() */
	uint32_t *mark;           /* (max_seq) */
	uint32_t stamp;
};

/* Allocate the pool through BE (on the CPU, host memory). */
enum llm_status llm_kv_init(struct llm_kv *kv, struct llm_backend *be, const struct llm_kv_opts *o);
void llm_kv_free(struct llm_kv *kv);
/* Bytes of K+V per token position (all layers), and of the pool. */
size_t llm_kv_bytes_per_token(const struct llm_kv_opts *o);

/* Every layer attends to the last W positions only (0: all of them): from
 * now on llm_kv_prepare releases the blocks that fall out of the window. */
void llm_kv_set_window(struct llm_kv *kv, int w);
/* Hold N more positions behind the window than a step's first query reads:
 * a sequence may then be cut back (llm_kv_seq_truncate) up to N positions
 * before that query and go on. A draft model's cache needs it (its drafts
 * are decoded one position a step, and cut back when the model rejects
 * them: spec.h). */
void llm_kv_set_keep(struct llm_kv *kv, int n);
/* Whether a sequence forked from the first N positions of SEQ could go on:
 * the blocks its next position reads are all held (always, without a window). */
int llm_kv_can_fork(const struct llm_kv *kv, int seq, int32_t n);

/* A fresh empty sequence; LLM_ERR_RANGE when every slot is in use. */
enum llm_status llm_kv_seq_new(struct llm_kv *kv, int *seq);
/* Drop the sequence and its block references. Safe on an unused id. */
void llm_kv_seq_free(struct llm_kv *kv, int seq);
/* A new sequence sharing the first N positions of SRC (its blocks'
 * reference counts go up; nothing is copied until one side writes).
 * LLM_ERR_RANGE when the window released a block it would read
 * (llm_kv_can_fork). */
enum llm_status llm_kv_seq_fork(struct llm_kv *kv, int src, int32_t n, int *dst);
/* Forget positions >= N (blocks no longer needed are released). */
void llm_kv_seq_truncate(struct llm_kv *kv, int seq, int32_t n);
static inline int32_t llm_kv_seq_len(const struct llm_kv *kv, int seq) { return kv->seq[seq].len; }
/* Blocks that reserving N more positions of SEQ would take from the pool. */
int64_t llm_kv_blocks_needed(const struct llm_kv *kv, int seq, int32_t n);
/* Make positions [len, len + n) of SEQ writable: allocate blocks, copy a
 * shared last block. LLM_ERR_RANGE past max_ctx, LLM_ERR_NOMEM when the pool
 * is exhausted (then nothing changed). */
enum llm_status llm_kv_reserve(struct llm_kv *kv, int seq, int32_t n);
/* Check B against the cache (sequence ids open, positions contiguous from
 * each sequence's length, within max_ctx, no block it reads released by the
 * window), reserve its positions and, on success, advance the lengths and
 * release the blocks out of the window. Called by llm_model_forward()
 * before any compute. Errors name the token index. */
enum llm_status llm_kv_prepare(struct llm_kv *kv, const struct llm_batch *b);
/* Undo llm_kv_prepare() after a failed step: each sequence of B goes back
 * to the position of its first token in B. */
void llm_kv_unprepare(struct llm_kv *kv, const struct llm_batch *b);

/* Address of KV head H's row (d_head elements) at position POS of SEQ in
 * LAYER (K or V), as elements of kv->dtype. */
static inline size_t llm_kv_offset(const struct llm_kv *kv, int layer, int seq, int32_t pos, int h)
{
	int32_t blk = kv->seq[seq].blk[pos / kv->block_size];
	return ((((size_t)layer * (size_t)kv->n_block + (size_t)blk) * (size_t)kv->n_kv_head + (size_t)h)
	        * (size_t)kv->block_size + (size_t)(pos % kv->block_size)) * (size_t)kv->d_head;
}

/* Index in kv->ks / kv->vs of the scale of the head's row at element
 * offset OFF (llm_kv_offset's). */
static inline size_t llm_kv_scale_index(const struct llm_kv *kv, size_t off)
{
	return off / (size_t)kv->d_head;
}

/* One head's row X (d) as E4M3 codes C (d) and its scale: amax = max |x_i|,
 * scale = amax / 448, code_i = e4m3(x_i / scale) (nearest, ties to even;
 * the largest element lands on 448, E4M3's largest finite value). An
 * all-zero row stores scale 0 and codes 0 (no division by zero). The CPU
 * store, the plain reference and the CUDA store (kernels/attn_paged.cu)
 * give the same bytes. */
void llm_kv_e4m3_row(uint8_t *c, float *scale, const float *x, int d);

#endif
