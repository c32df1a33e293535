/* common/checkpoint/safetensors.h: one safetensors file, read through mmap with strict
 * validation, and the tensor descriptor shared by readers and writers.
 *
 * Format (safetensors spec): u64 little-endian header length N, N bytes of
 * JSON {name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__":
 * {str: str}}, then the data region. Offsets are relative to the data region.
 * Validation guarantees on success: every dtype known, prod(shape) * size ==
 * end - begin with no overflow, offsets inside the file, the tensors cover the
 * data region contiguously without overlap, names unique, header valid UTF-8
 * JSON, N within the file and below LLM_ST_MAX_HEADER. */
#ifndef LLM_SAFETENSORS_H
#define LLM_SAFETENSORS_H

#include "status.h"
#include "dtype.h"

#define LLM_MAX_DIM 8
#define LLM_ST_MAX_HEADER (100u << 20)   /* 100 MB, as the reference reader */

struct llm_tensor {
	char *name;
	enum llm_dtype dtype;
	int n_dim;
	int64_t shape[LLM_MAX_DIM];
	const void *data;    /* in the mapping; aligned to the element size */
	size_t nbytes;
	size_t offset;       /* begin, relative to the data region */
	int file;            /* index of the file in its checkpoint */
};

static inline int64_t llm_tensor_numel(const struct llm_tensor *t)
{
	int64_t n = 1;
	for (int i = 0; i < t->n_dim; i++)
		n *= t->shape[i];
	return n;
}

struct llm_st_file {
	char *path;
	const uint8_t *base;      /* the whole file (mapping or heap buffer) */
	size_t size;
	int mapped;               /* 1: mmap, 2: heap (stdin), 0: borrowed */
	size_t data_start;        /* 8 + header length */
	size_t n_tensor;
	struct llm_tensor *tensors;   /* in offset order */
	size_t n_meta;
	char **meta_key, **meta_val;  /* __metadata__ */
	void **copies;            /* aligned copies of misaligned tensors */
	size_t n_copies;
	size_t gap_bytes;         /* open failed on data no tensor covers (between tensors or
	                           * after the last: one dropped from the header?): how
	                           * many bytes; else 0 */
};

/* Open and validate PATH ("-": standard input, read into memory).
 * Errors name the file and, where there is one, the tensor. */
enum llm_status llm_st_open(struct llm_st_file *f, const char *path);
/* Validate an in-memory file (BUF is borrowed and must outlive F). */
enum llm_status llm_st_parse(struct llm_st_file *f, const char *path,
                             const void *buf, size_t size);
void llm_st_close(struct llm_st_file *f);
const char *llm_st_meta(const struct llm_st_file *f, const char *key);
const struct llm_tensor *llm_st_find(const struct llm_st_file *f, const char *name);
/* Drop the pages that hold only tensor T of F from this process's
 * resident set (MADV_DONTNEED) once it is no longer needed; the page cache
 * keeps them. Nothing when F is not a mapping (stdin, a copy). */
void llm_st_release(const struct llm_st_file *f, const struct llm_tensor *t);

#endif
