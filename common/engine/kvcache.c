/* common/engine/kvcache.c: paged KV cache (see kvcache.h).
 *
 * Block bookkeeping is host-side and O(blocks touched); the pool itself is
 * allocated through the backend so a device backend can hold it. */
#include "kvcache.h"
#include "backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

size_t llm_kv_bytes_per_token(const struct llm_kv_opts *o)
{
	size_t sc = o->dtype == LLM_DTYPE_E4M3 ? sizeof(float) : 0;   /* a scale per (token, head) */
	return 2 * (size_t)o->n_layer * (size_t)o->n_kv_head * ((size_t)o->d_head * llm_dtype_size(o->dtype) + sc);
}

void llm_kv_e4m3_row(uint8_t *c, float *scale, const float *x, int d)
{
	float amax = 0.0f;
	for (int i = 0; i < d; i++) {
		float a = fabsf(x[i]);
		amax = a > amax ? a : amax;
	}
	float s = amax / 448.0f;
	*scale = s;
	for (int i = 0; i < d; i++)
		c[i] = s > 0.0f ? llm_f32_to_e4m3(x[i] / s) : 0;
}

enum llm_status llm_kv_init(struct llm_kv *kv, struct llm_backend *be, const struct llm_kv_opts *o)
{
	memset(kv, 0, sizeof *kv);
	if (o->dtype != LLM_DTYPE_F32 && o->dtype != LLM_DTYPE_BF16 && o->dtype != LLM_DTYPE_E4M3)
		return llm_fail(LLM_ERR_UNSUPPORTED, "kv cache: dtype %s (f32, bf16 or fp8)",
		                llm_dtype_name(o->dtype));
	if (o->block_size < 1 || o->block_size > 4096 || o->n_block < 1 || o->n_block > INT32_MAX
	    || o->max_seq < 1 || o->max_ctx < 1 || o->n_layer < 1 || o->n_kv_head < 1 || o->d_head < 1)
		return llm_fail(LLM_ERR_USAGE, "kv cache: bad geometry (block %d, blocks %lld, seqs %d, ctx %d)",
		                o->block_size, (long long)o->n_block, o->max_seq, o->max_ctx);
	kv->n_layer = o->n_layer;
	kv->n_kv_head = o->n_kv_head;
	kv->d_head = o->d_head;
	kv->kv_dim = o->n_kv_head * o->d_head;
	kv->block_size = o->block_size;
	kv->max_seq = o->max_seq;
	kv->max_ctx = o->max_ctx;
	kv->max_blk = (o->max_ctx + o->block_size - 1) / o->block_size;
	kv->n_block = o->n_block;
	kv->dtype = o->dtype;
	kv->elt = llm_dtype_size(o->dtype);
	kv->be = be;
	size_t bytes = (size_t)o->n_layer * (size_t)o->n_block * (size_t)o->block_size
	               * (size_t)kv->kv_dim * kv->elt;
	enum llm_status s;
	if ((s = be->ops->alloc(be, bytes, &kv->k)) || (s = be->ops->alloc(be, bytes, &kv->v))) {
		llm_kv_free(kv);
		return llm_fail_prefix(s, "kv cache: %zu bytes", 2 * bytes);
	}
	if (o->dtype == LLM_DTYPE_E4M3) {
		size_t sb = bytes / (size_t)o->d_head * sizeof(float);
		if ((s = be->ops->alloc(be, sb, (void **)&kv->ks)) || (s = be->ops->alloc(be, sb, (void **)&kv->vs))) {
			llm_kv_free(kv);
			return llm_fail_prefix(s, "kv cache: %zu bytes of scales", 2 * sb);
		}
	}
	kv->ref = calloc((size_t)o->n_block, sizeof *kv->ref);
	kv->free_list = malloc((size_t)o->n_block * sizeof *kv->free_list);
	kv->seq = calloc((size_t)o->max_seq, sizeof *kv->seq);
	kv->next = calloc((size_t)o->max_seq, sizeof *kv->next);
	kv->mark = calloc((size_t)o->max_seq, sizeof *kv->mark);
	if (!kv->ref || !kv->free_list || !kv->seq || !kv->next || !kv->mark)
		goto nomem;
	for (int i = 0; i < o->max_seq; i++)
		if (!(kv->seq[i].blk = malloc((size_t)kv->max_blk * sizeof(int32_t))))
			goto nomem;
	/* stack: pop from the end, lowest block ids first */
	for (int64_t i = 0; i < o->n_block; i++)
		kv->free_list[i] = (int32_t)(o->n_block - 1 - i);
	kv->n_free = o->n_block;
	return LLM_OK;
nomem:
	llm_kv_free(kv);
	return llm_fail(LLM_ERR_NOMEM, "kv cache: out of memory");
}

void llm_kv_free(struct llm_kv *kv)
{
	if (kv->be) {
		if (kv->k)
			kv->be->ops->release(kv->be, kv->k);
		if (kv->v)
			kv->be->ops->release(kv->be, kv->v);
		if (kv->ks)
			kv->be->ops->release(kv->be, kv->ks);
		if (kv->vs)
			kv->be->ops->release(kv->be, kv->vs);
	}
	if (kv->seq)
		for (int i = 0; i < kv->max_seq; i++)
			free(kv->seq[i].blk);
	free(kv->seq);
	free(kv->ref);
	free(kv->free_list);
	free(kv->next);
	free(kv->mark);
	memset(kv, 0, sizeof *kv);
}

static void block_unref(struct llm_kv *kv, int32_t b)
{
	if (b >= 0 && --kv->ref[b] == 0)
		kv->free_list[kv->n_free++] = b;
}

void llm_kv_set_window(struct llm_kv *kv, int w)
{
	kv->window = w > 0 ? w : 0;
}

void llm_kv_set_keep(struct llm_kv *kv, int n)
{
	kv->keep = n > 0 ? n : 0;
}

/* The first block a query at position POS reads under the window (0: none) */
static int32_t window_block(const struct llm_kv *kv, int32_t pos)
{
	return kv->window && pos - kv->window + 1 > 0 ? (pos - kv->window + 1) / kv->block_size : 0;
}

/* Whether the blocks of S from the one a query at POS first reads to the
 * one holding position END - 1 are all held */
static int window_held(const struct llm_kv *kv, const struct llm_kv_seq *s, int32_t pos, int32_t end)
{
	int32_t last = end > 0 ? (end - 1) / kv->block_size : -1;
	for (int32_t i = window_block(kv, pos); i <= last && i < s->n_blk; i++)
		if (s->blk[i] < 0)
			return 0;
	return 1;
}

int llm_kv_can_fork(const struct llm_kv *kv, int seq, int32_t n)
{
	return window_held(kv, &kv->seq[seq], n, n);
}

enum llm_status llm_kv_seq_new(struct llm_kv *kv, int *seq)
{
	for (int i = 0; i < kv->max_seq; i++)
		if (!kv->seq[i].used) {
			kv->seq[i].used = 1;
			kv->seq[i].len = 0;
			kv->seq[i].n_blk = 0;
			*seq = i;
			return LLM_OK;
		}
	return llm_fail(LLM_ERR_RANGE, "kv cache: all %d sequence slots in use", kv->max_seq);
}

void llm_kv_seq_free(struct llm_kv *kv, int seq)
{
	if (seq < 0 || seq >= kv->max_seq || !kv->seq[seq].used)
		return;
	struct llm_kv_seq *s = &kv->seq[seq];
	for (int32_t i = 0; i < s->n_blk; i++)
		block_unref(kv, s->blk[i]);
	s->used = 0;
	s->len = 0;
	s->n_blk = 0;
}

enum llm_status llm_kv_seq_fork(struct llm_kv *kv, int src, int32_t n, int *dst)
{
	if (src < 0 || src >= kv->max_seq || !kv->seq[src].used)
		return llm_fail(LLM_ERR_USAGE, "kv cache: fork of unknown sequence %d", src);
	if (n < 0 || n > kv->seq[src].len)
		return llm_fail(LLM_ERR_RANGE, "kv cache: fork of %d positions from a sequence of %d",
		                n, kv->seq[src].len);
	if (!llm_kv_can_fork(kv, src, n))
		return llm_fail(LLM_ERR_RANGE, "kv cache: fork of %d positions: the window of %d released blocks "
		                "it reads", n, kv->window);
	LLM_TRY(llm_kv_seq_new(kv, dst));
	struct llm_kv_seq *s = &kv->seq[src], *d = &kv->seq[*dst];
	d->n_blk = (n + kv->block_size - 1) / kv->block_size;
	for (int32_t i = 0; i < d->n_blk; i++) {
		d->blk[i] = s->blk[i];
		if (d->blk[i] >= 0)
			kv->ref[d->blk[i]]++;
	}
	d->len = n;
	return LLM_OK;
}

void llm_kv_seq_truncate(struct llm_kv *kv, int seq, int32_t n)
{
	if (seq < 0 || seq >= kv->max_seq || !kv->seq[seq].used || n < 0)
		return;
	struct llm_kv_seq *s = &kv->seq[seq];
	int32_t keep = (n + kv->block_size - 1) / kv->block_size;
	while (s->n_blk > keep)
		block_unref(kv, s->blk[--s->n_blk]);
	if (n < s->len)
		s->len = n;
}

int64_t llm_kv_blocks_needed(const struct llm_kv *kv, int seq, int32_t n)
{
	const struct llm_kv_seq *s = &kv->seq[seq];
	int32_t need = (s->len + n + kv->block_size - 1) / kv->block_size;
	int64_t k = need > s->n_blk ? need - s->n_blk : 0;
	/* a shared, partly filled last block is copied before the first write */
	if (n > 0 && s->len % kv->block_size && s->n_blk > 0 && kv->ref[s->blk[s->len / kv->block_size]] > 1)
		k++;
	return k;
}

/* Through the backend: the blocks live in its memory (device memory on CUDA). */
static enum llm_status block_copy(struct llm_kv *kv, int32_t dst, int32_t src)
{
	size_t blk = (size_t)kv->block_size * (size_t)kv->kv_dim * kv->elt;
	for (int l = 0; l < kv->n_layer; l++) {
		size_t off_d = ((size_t)l * (size_t)kv->n_block + (size_t)dst) * blk;
		size_t off_s = ((size_t)l * (size_t)kv->n_block + (size_t)src) * blk;
		LLM_TRY(kv->be->ops->copy_in(kv->be, (char *)kv->k + off_d, (char *)kv->k + off_s, blk));
		LLM_TRY(kv->be->ops->copy_in(kv->be, (char *)kv->v + off_d, (char *)kv->v + off_s, blk));
		if (kv->ks) {             /* (n_kv_head, block_size) f32 per block; E4M3's elt is 1, so off / d_head indexes them */
			size_t sb = (size_t)kv->block_size * (size_t)kv->n_kv_head, od = off_d / (size_t)kv->d_head;
			size_t os = off_s / (size_t)kv->d_head;
			LLM_TRY(kv->be->ops->copy_in(kv->be, kv->ks + od, kv->ks + os, sb * sizeof(float)));
			LLM_TRY(kv->be->ops->copy_in(kv->be, kv->vs + od, kv->vs + os, sb * sizeof(float)));
		}
	}
	return LLM_OK;
}

enum llm_status llm_kv_reserve(struct llm_kv *kv, int seq, int32_t n)
{
	struct llm_kv_seq *s = &kv->seq[seq];
	if (n <= 0)
		return LLM_OK;
	if ((int64_t)s->len + n > kv->max_ctx)
		return llm_fail(LLM_ERR_RANGE, "kv cache: sequence %d: %lld positions exceed the context of %d",
		                seq, (long long)s->len + n, kv->max_ctx);
	int64_t need = llm_kv_blocks_needed(kv, seq, n);
	if (need > kv->n_free)
		return llm_fail(LLM_ERR_NOMEM, "kv cache: full (%lld blocks needed, %lld free of %lld)",
		                (long long)need, (long long)kv->n_free, (long long)kv->n_block);
	if (s->len % kv->block_size) {
		int32_t i = s->len / kv->block_size, old = s->blk[i];
		if (kv->ref[old] > 1) {             /* copy on write */
			int32_t b = kv->free_list[kv->n_free - 1];
			if (kv->be->ops->sync)
				kv->be->ops->sync(kv->be);
			LLM_TRY(block_copy(kv, b, old));
			kv->n_free--;
			kv->ref[b] = 1;
			block_unref(kv, old);
			s->blk[i] = b;
		}
	}
	int32_t want = (s->len + n + kv->block_size - 1) / kv->block_size;
	while (s->n_blk < want) {
		int32_t b = kv->free_list[--kv->n_free];
		kv->ref[b] = 1;
		s->blk[s->n_blk++] = b;
	}
	return LLM_OK;
}

enum llm_status llm_kv_prepare(struct llm_kv *kv, const struct llm_batch *b)
{
	uint32_t stamp = ++kv->stamp;
	if (stamp == 0) {                 /* wrapped: clear the marks */
		memset(kv->mark, 0, (size_t)kv->max_seq * sizeof *kv->mark);
		stamp = kv->stamp = 1;
	}
	for (int i = 0; i < b->n_tok; i++) {
		int s = b->seq[i];
		if (s < 0 || s >= kv->max_seq || !kv->seq[s].used)
			return llm_fail(LLM_ERR_USAGE, "batch token %d: sequence %d is not open", i, s);
		if (kv->mark[s] != stamp) {
			kv->mark[s] = stamp;
			kv->next[s] = kv->seq[s].len;
			if (!window_held(kv, &kv->seq[s], b->pos[i], kv->seq[s].len))
				return llm_fail(LLM_ERR_USAGE, "batch token %d: sequence %d at position %d reads blocks "
				                "the window of %d released", i, s, b->pos[i], kv->window);
		}
		if (b->pos[i] != kv->next[s])
			return llm_fail(LLM_ERR_USAGE, "batch token %d: position %d of sequence %d, expected %d",
			                i, b->pos[i], s, kv->next[s]);
		if (b->pos[i] >= kv->max_ctx)
			return llm_fail(LLM_ERR_RANGE, "batch token %d: position %d is past the context of %d",
			                i, b->pos[i], kv->max_ctx);
		kv->next[s]++;
	}
	/* each sequence's first token of the step (at its length): no query
	 * of this step or a later one reads a key before its window (positions
	 * only grow from here; a truncation back is refused above), so those
	 * blocks go back, before the step's new ones are taken: a sequence
	 * holds at most its window, the step's tokens and two partly used
	 * blocks (and KEEP positions more, for a truncation back that far) */
	int i;
	for (i = 0; kv->window && i < b->n_tok; i++) {
		struct llm_kv_seq *q = &kv->seq[b->seq[i]];
		if (q->len == b->pos[i])
			for (int32_t k = window_block(kv, b->pos[i] - kv->keep) - 1; k >= 0 && q->blk[k] >= 0; k--) {
				block_unref(kv, q->blk[k]);
				q->blk[k] = -1;
			}
	}
	enum llm_status st = LLM_OK;
	for (i = 0; i < b->n_tok; i++) {
		int s = b->seq[i];
		if (kv->mark[s] != stamp)
			continue;                 /* already reserved */
		kv->mark[s] = stamp - 1;      /* (stamps only grow, so this is "done") */
		if ((st = llm_kv_reserve(kv, s, kv->next[s] - kv->seq[s].len)))
			break;
	}
	if (st) {                         /* release what the earlier sequences took */
		for (int j = 0; j < i; j++)
			llm_kv_seq_truncate(kv, b->seq[j], kv->seq[b->seq[j]].len);
		return st;
	}
	for (i = 0; i < b->n_tok; i++)
		if (kv->seq[b->seq[i]].len < b->pos[i] + 1)
			kv->seq[b->seq[i]].len = b->pos[i] + 1;
	return LLM_OK;
}

void llm_kv_unprepare(struct llm_kv *kv, const struct llm_batch *b)
{
	for (int i = b->n_tok - 1; i >= 0; i--)
		llm_kv_seq_truncate(kv, b->seq[i], b->pos[i]);
}
