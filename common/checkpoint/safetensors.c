/* common/checkpoint/safetensors.c: mmap and validate one safetensors file.
 *
 * Defined by the safetensors format: 8-byte little-endian header length,
 * a JSON header, a data region. Every check in safetensors.h is enforced
 * before any tensor is handed out; the first violation is reported as
 * "PATH: tensor 'NAME': reason". */
#define _GNU_SOURCE
#include "safetensors.h"
#include "fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

static int cmp_offset(const void *a, const void *b)
{
	const struct llm_tensor *x = a, *y = b;
	if (x->offset != y->offset)
		return x->offset < y->offset ? -1 : 1;
	/* zero-size tensors first at a shared offset */
	return (x->nbytes > y->nbytes) - (x->nbytes < y->nbytes);
}

static enum llm_status parse_tensor(const char *path, const char *name, json_t *v,
                                    size_t data_size, struct llm_tensor *t)
{
	if (!json_is_object(v))
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': entry is not an object", path, name);
	json_t *dt = json_object_get(v, "dtype"), *sh = json_object_get(v, "shape"),
	       *off = json_object_get(v, "data_offsets");
	if (!json_is_string(dt))
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': missing dtype", path, name);
	int d = llm_dtype_parse(json_string_value(dt));
	if (d < 0)
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': unknown dtype %s", path, name,
		                json_string_value(dt));
	if (!json_is_array(sh) || json_array_size(sh) > LLM_MAX_DIM)
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': shape is not an array of at most %d dimensions",
		                path, name, LLM_MAX_DIM);
	if (!json_is_array(off) || json_array_size(off) != 2 ||
	    !json_is_integer(json_array_get(off, 0)) || !json_is_integer(json_array_get(off, 1)))
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': data_offsets is not [begin, end]", path, name);
	t->dtype = (enum llm_dtype)d;
	t->n_dim = (int)json_array_size(sh);
	uint64_t numel = 1;
	for (int i = 0; i < t->n_dim; i++) {
		json_t *e = json_array_get(sh, (size_t)i);
		if (!json_is_integer(e) || json_integer_value(e) < 0)
			return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
			                path, name, i);
		t->shape[i] = json_integer_value(e);
		if (__builtin_mul_overflow(numel, (uint64_t)t->shape[i], &numel))
			return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': shape product overflows", path, name);
	}
	uint64_t bytes;
	if (__builtin_mul_overflow(numel, (uint64_t)llm_dtype_size(t->dtype), &bytes) || bytes > SIZE_MAX)
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': byte size overflows", path, name);
	json_int_t b = json_integer_value(json_array_get(off, 0)), e = json_integer_value(json_array_get(off, 1));
	if (b < 0 || e < b)
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': data_offsets [%lld, %lld] are not ordered",
		                path, name, (long long)b, (long long)e);
	if ((uint64_t)e > data_size)
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': data_offsets end %lld beyond the data region (%zu bytes)",
		                path, name, (long long)e, data_size);
	if ((uint64_t)(e - b) != bytes)
		return llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': %s%s needs %llu bytes but data_offsets span %lld",
		                path, name, llm_dtype_name(t->dtype), "", (unsigned long long)bytes,
		                (long long)(e - b));
	t->offset = (size_t)b;
	t->nbytes = (size_t)bytes;
	return LLM_OK;
}

/* A file whose header length is impossible and whose byte 8 does not open
 * a JSON header is another kind of file, named as such: a GGUF model by its
 * magic, anything else by how it starts (a config.json given for the
 * directory starts with '{'). A damaged safetensors file (byte 8 is '{')
 * keeps the header-length messages. */
static enum llm_status not_safetensors(const char *path, const uint8_t *p)
{
	if (!memcmp(p, "GGUF", 4))
		return llm_fail(LLM_ERR_FORMAT, "%s: a GGUF file; llm-tools read safetensors (Hugging Face layout): "
		                "convert it to safetensors", path);
	if (p[8] == '{')
		return LLM_OK;
	int text = 1;
	for (int i = 0; i < 8; i++)
		text &= (p[i] >= 0x20 && p[i] < 0x7f) || p[i] == '\n' || p[i] == '\r' || p[i] == '\t';
	char first[32];
	if (text)
		snprintf(first, sizeof first, "'%c'", p[0]);
	else
		snprintf(first, sizeof first, "bytes %02x %02x %02x %02x", p[0], p[1], p[2], p[3]);
	return llm_fail(LLM_ERR_FORMAT, "%s: not a safetensors file (it starts with %s): give the model directory",
	                path, first);
}

enum llm_status llm_st_parse(struct llm_st_file *f, const char *path, const void *buf, size_t size)
{
	enum llm_status s = LLM_OK;
	json_t *root = NULL;
	const uint8_t *p = buf;
	memset(f, 0, sizeof *f);
	f->path = llm_strdup(path);
	f->base = buf;
	f->size = size;
	if (size < 8)
		return llm_fail(LLM_ERR_FORMAT, "%s: truncated: %zu bytes, no header length", path, size);
	uint64_t hlen = 0;
	for (int i = 7; i >= 0; i--)
		hlen = hlen << 8 | p[i];
	if ((hlen > LLM_ST_MAX_HEADER || hlen > size - 8) && size > 8)
		LLM_TRY(not_safetensors(path, p));
	if (hlen > LLM_ST_MAX_HEADER)
		return llm_fail(LLM_ERR_FORMAT, "%s: header length %llu exceeds the %u-byte limit", path,
		                (unsigned long long)hlen, LLM_ST_MAX_HEADER);
	if (hlen > size - 8)
		return llm_fail(LLM_ERR_FORMAT, "%s: header length %llu runs past the end of the file (%zu bytes)",
		                path, (unsigned long long)hlen, size);
	if (hlen < 2)
		return llm_fail(LLM_ERR_FORMAT, "%s: header of %llu bytes is not a JSON object", path,
		                (unsigned long long)hlen);
	f->data_start = 8 + (size_t)hlen;
	size_t data_size = size - f->data_start;
	json_error_t err;
	root = json_loadb((const char *)p + 8, (size_t)hlen, JSON_REJECT_DUPLICATES, &err);
	if (!root) {
		const char *what = strstr(err.text, "duplicate") ? "duplicate tensor name in header" : "header is not valid JSON";
		return llm_fail(LLM_ERR_FORMAT, "%s: %s: %s at byte %d", path, what, err.text, err.position);
	}
	if (!json_is_object(root)) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: header is not a JSON object", path);
		goto out;
	}
	size_t n = json_object_size(root);
	f->tensors = calloc(n ? n : 1, sizeof *f->tensors);
	if (!f->tensors) {
		s = llm_fail(LLM_ERR_NOMEM, "%s: out of memory", path);
		goto out;
	}
	const char *key;
	json_t *v;
	json_object_foreach(root, key, v) {
		if (!strcmp(key, "__metadata__")) {
			if (!json_is_object(v)) {
				s = llm_fail(LLM_ERR_FORMAT, "%s: __metadata__ is not an object", path);
				goto out;
			}
			size_t m = json_object_size(v);
			f->meta_key = calloc(m + 1, sizeof(char *));
			f->meta_val = calloc(m + 1, sizeof(char *));
			if (!f->meta_key || !f->meta_val) {
				s = llm_fail(LLM_ERR_NOMEM, "%s: out of memory", path);
				goto out;
			}
			const char *mk;
			json_t *mv;
			json_object_foreach(v, mk, mv) {
				if (!json_is_string(mv)) {
					s = llm_fail(LLM_ERR_FORMAT, "%s: __metadata__ '%s' is not a string", path, mk);
					goto out;
				}
				f->meta_key[f->n_meta] = llm_strdup(mk);
				f->meta_val[f->n_meta] = malloc(json_string_length(mv) + 1);
				if (!f->meta_key[f->n_meta] || !f->meta_val[f->n_meta]) {
					f->n_meta++;
					s = llm_fail(LLM_ERR_NOMEM, "%s: out of memory", path);
					goto out;
				}
				memcpy(f->meta_val[f->n_meta], json_string_value(mv), json_string_length(mv) + 1);
				f->n_meta++;
			}
			continue;
		}
		struct llm_tensor *t = &f->tensors[f->n_tensor];
		t->name = llm_strdup(key);
		f->n_tensor++;
		if (!t->name) {
			s = llm_fail(LLM_ERR_NOMEM, "%s: out of memory", path);
			goto out;
		}
		s = parse_tensor(path, key, v, data_size, t);
		if (s)
			goto out;
	}
	if (f->n_tensor)
		qsort(f->tensors, f->n_tensor, sizeof *f->tensors, cmp_offset);
	size_t at = 0;
	for (size_t i = 0; i < f->n_tensor; i++) {
		struct llm_tensor *t = &f->tensors[i];
		if (t->offset < at) {
			s = llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': data_offsets [%zu, %zu] overlap the previous tensor (ends at %zu)",
			             path, t->name, t->offset, t->offset + t->nbytes, at);
			goto out;
		}
		if (t->offset > at) {
			f->gap_bytes = t->offset - at;
			s = llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': gap of %zu bytes before data_offsets begin %zu",
			             path, t->name, t->offset - at, t->offset);
			goto out;
		}
		at = t->offset + t->nbytes;
	}
	if (at != data_size) {
		f->gap_bytes = data_size - at;
		s = llm_fail(LLM_ERR_FORMAT, "%s: %zu bytes of data after the last tensor (data region %zu, tensors end at %zu)",
		             path, data_size - at, data_size, at);
		goto out;
	}
	/* Hand out pointers aligned to the element size; copy the rare
	 * misaligned tensor so kernels may load elements directly. */
	for (size_t i = 0; i < f->n_tensor; i++) {
		struct llm_tensor *t = &f->tensors[i];
		const uint8_t *d = p + f->data_start + t->offset;
		size_t al = llm_dtype_size(t->dtype);
		if (al > 1 && ((uintptr_t)d % al) && t->nbytes) {
			void **nc = realloc(f->copies, (f->n_copies + 1) * sizeof *nc);
			void *c = aligned_alloc(64, (t->nbytes + 63) & ~(size_t)63);
			if (!nc || !c) {
				free(c);
				if (nc)
					f->copies = nc;
				s = llm_fail(LLM_ERR_NOMEM, "%s: out of memory", path);
				goto out;
			}
			f->copies = nc;
			f->copies[f->n_copies++] = c;
			memcpy(c, d, t->nbytes);
			d = c;
		}
		t->data = d;
	}
out:
	json_decref(root);
	return s;
}

enum llm_status llm_st_open(struct llm_st_file *f, const char *path)
{
	memset(f, 0, sizeof *f);
	if (!strcmp(path, "-")) {
		char *buf;
		size_t len;
		LLM_TRY(llm_read_file("-", &buf, &len));
		enum llm_status s = llm_st_parse(f, "<stdin>", buf, len);
		f->base = (const uint8_t *)buf;
		f->mapped = 2;
		return s;
	}
	int fd = llm_open_regular(path);   /* a FIFO is refused, not waited on */
	if (fd < 0)
		return LLM_ERR_IO;
	struct stat st;
	if (fstat(fd, &st) != 0) {
		close(fd);
		return llm_fail(LLM_ERR_IO, "%s: %s", path, strerror(errno));
	}
	size_t size = (size_t)st.st_size;
	void *map = NULL;
	if (size) {
		map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
		if (map == MAP_FAILED) {
			int e = errno;
			close(fd);
			return llm_fail(LLM_ERR_IO, "%s: mmap: %s", path, strerror(e));
		}
	}
	close(fd);
	enum llm_status s = llm_st_parse(f, path, map ? map : "", size);
	f->base = map;
	f->mapped = map != NULL;
	return s;
}

void llm_st_close(struct llm_st_file *f)
{
	if (f->base && f->mapped == 1)
		munmap((void *)f->base, f->size);
	else if (f->mapped == 2)
		free((void *)f->base);
	for (size_t i = 0; i < f->n_tensor; i++)
		free(f->tensors[i].name);
	free(f->tensors);
	for (size_t i = 0; i < f->n_meta; i++) {
		free(f->meta_key[i]);
		free(f->meta_val[i]);
	}
	free(f->meta_key);
	free(f->meta_val);
	for (size_t i = 0; i < f->n_copies; i++)
		free(f->copies[i]);
	free(f->copies);
	free(f->path);
	memset(f, 0, sizeof *f);
}

const char *llm_st_meta(const struct llm_st_file *f, const char *key)
{
	for (size_t i = 0; i < f->n_meta; i++)
		if (!strcmp(f->meta_key[i], key))
			return f->meta_val[i];
	return NULL;
}

const struct llm_tensor *llm_st_find(const struct llm_st_file *f, const char *name)
{
	for (size_t i = 0; i < f->n_tensor; i++)
		if (!strcmp(f->tensors[i].name, name))
			return &f->tensors[i];
	return NULL;
}

void llm_st_release(const struct llm_st_file *f, const struct llm_tensor *t)
{
	const uint8_t *p = t->data;
	if (f->mapped != 1 || p < f->base || p >= f->base + f->size)
		return;              /* not in a mapping (stdin, an aligned copy) */
	uintptr_t pg = (uintptr_t)sysconf(_SC_PAGESIZE);
	uintptr_t b = ((uintptr_t)p + pg - 1) & ~(pg - 1), e = ((uintptr_t)p + t->nbytes) & ~(pg - 1);
	if (e > b)
		madvise((void *)b, e - b, MADV_DONTNEED);
}
