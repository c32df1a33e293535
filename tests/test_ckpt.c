/* tests/test_ckpt.c: safetensors validation, the checkpoint writer
 * (single file, shards + index, atomic rename), FP8 scale layouts, and the
 * quantization round trip on the real stories260K model. */
#define _GNU_SOURCE
#include "llm.h"
#include "check.h"

#include <dirent.h>
#include <math.h>
#include <sys/stat.h>
#include <unistd.h>

static void test_malformed(void)
{
	const char *dir = "tests/data/malformed";
	DIR *d = opendir(dir);
	if (!check(d != NULL, "malformed corpus present in %s", dir))
		return;
	struct dirent *e;
	int n = 0, bad = 0;
	while ((e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[512];
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		struct llm_st_file f;
		enum llm_status s = llm_st_open(&f, path);
		llm_st_close(&f);
		n++;
		if ((s != LLM_ERR_FORMAT || !strstr(llm_errmsg(), path)) && bad++ < 5)
			check_diag("%s: status %s, message '%s'", e->d_name, llm_status_name(s), llm_errmsg());
	}
	closedir(d);
	check(!bad && n >= 20, "%d malformed files refused with a format error naming the file", n);
	/* the corpus a 10-minute libFuzzer run (80M inputs, no crash) left, kept
	 * as regression inputs: each must parse or be refused, never crash */
	d = opendir("tests/data/fuzz");
	n = 0;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[512];
		snprintf(path, sizeof path, "tests/data/fuzz/%s", e->d_name);
		struct llm_st_file f;
		llm_st_open(&f, path);
		llm_st_close(&f);
		n++;
	}
	if (d)
		closedir(d);
	check(n > 0, "%d inputs from the fuzzer's corpus parse or are refused without crashing", n);
}

static struct llm_tensor desc(const char *name, enum llm_dtype t, int64_t r, int64_t c)
{
	struct llm_tensor d = { .name = (char *)name, .dtype = t, .n_dim = c ? 2 : 1, .shape = { r, c } };
	d.nbytes = (size_t)llm_tensor_numel(&d) * llm_dtype_size(t);
	return d;
}

static enum llm_status write_all(const char *out, struct llm_tensor *d, size_t n, void **data,
                                 const struct llm_aux *aux, size_t n_aux, size_t max_shard)
{
	struct llm_ckpt_writer *w;
	struct llm_ckpt_write_opts o = { .max_shard_size = max_shard };
	LLM_TRY(llm_ckpt_write_begin(&w, out, d, n, aux, n_aux, &o));
	long i;
	while ((i = llm_ckpt_write_next(w)) >= 0) {
		enum llm_status s = llm_ckpt_write_data(w, data[i], d[i].nbytes);
		if (s) {
			llm_ckpt_write_abort(w);
			return s;
		}
	}
	return llm_ckpt_write_commit(w);
}

static void test_writer(void)
{
	const char *tmp = test_tmpdir();
	char out[512], path[600];
	float a[6] = { 1, 2, 3, 4, 5, 6 };
	uint16_t b[3] = { 0x3f80, 0x4000, 0xc040 };
	uint8_t c[5] = { 1, 2, 3, 4, 5 };
	void *data[3] = { a, b, c };
	struct llm_tensor d[3] = { desc("a", LLM_DTYPE_F32, 2, 3), desc("b", LLM_DTYPE_BF16, 3, 0),
	                           desc("c", LLM_DTYPE_U8, 5, 0) };
	struct llm_aux aux[1] = { { "config.json", "{\"hidden_size\": 3}\n", 19 } };
	/* shards of at most 12 bytes: a (24 B) alone, b + c (11 B) together */
	snprintf(out, sizeof out, "%s/sharded", tmp);
	enum llm_status s = write_all(out, d, 3, data, aux, 1, 12);
	check(!s, "write a sharded directory (%s)", s ? llm_errmsg() : "ok");
	snprintf(path, sizeof path, "%s/model.safetensors.index.json", out);
	struct stat st;
	check(stat(path, &st) == 0, "sharded output has model.safetensors.index.json");
	snprintf(path, sizeof path, "%s/model-00002-of-00002.safetensors", out);
	check(stat(path, &st) == 0, "shards are named model-0000i-of-0000n.safetensors");
	struct llm_ckpt ck;
	s = llm_ckpt_open(&ck, out);
	if (check(!s, "read the sharded directory back (%s)", s ? llm_errmsg() : "ok")) {
		const struct llm_tensor *ta = llm_ckpt_find(&ck, "a"), *tb = llm_ckpt_find(&ck, "b"),
		                        *tc = llm_ckpt_find(&ck, "c");
		check(ck.n_file == 2 && ta && tb && tc && !memcmp(ta->data, a, 24) && !memcmp(tb->data, b, 6) &&
		      !memcmp(tc->data, c, 5), "tensors read back equal across shards");
		const struct llm_aux *x = llm_ckpt_aux(&ck, "config.json");
		check(x && !strcmp(x->data, aux[0].data), "side files carried unchanged");
		llm_ckpt_close(&ck);
	}
	/* a single file carries the side files in __metadata__ */
	snprintf(out, sizeof out, "%s/one.safetensors", tmp);
	s = write_all(out, d, 3, data, aux, 1, 0);
	s = s ? s : llm_ckpt_open(&ck, out);
	if (check(!s, "single-file checkpoint written and read (%s)", s ? llm_errmsg() : "ok")) {
		const struct llm_aux *x = llm_ckpt_aux(&ck, "config.json");
		check(x && !strcmp(x->data, aux[0].data), "side files ride in __metadata__ of a single file");
		check(((uintptr_t)llm_ckpt_find(&ck, "a")->data & 3) == 0, "F32 data is 4-byte aligned in the mapping");
		llm_ckpt_close(&ck);
	}
	/* an existing OUT is not replaced without force; nothing half-written remains */
	s = write_all(out, d, 3, data, aux, 1, 0);
	check(s == LLM_ERR_EXISTS, "an existing output is refused without --force");
	DIR *dd = opendir(tmp);
	struct dirent *e;
	int leftovers = 0;
	while (dd && (e = readdir(dd)))
		leftovers += strstr(e->d_name, ".tmp.") != NULL;
	if (dd)
		closedir(dd);
	check(!leftovers, "no temporary files left behind");
	/* an index naming a missing tensor is refused */
	snprintf(path, sizeof path, "%s/sharded/model.safetensors.index.json", tmp);
	const char *idx = "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", \"zz\": \"model-00002-of-00002.safetensors\"}}";
	llm_write_file_atomic(path, idx, strlen(idx));
	snprintf(out, sizeof out, "%s/sharded", tmp);
	s = llm_ckpt_open(&ck, out);
	check(s == LLM_ERR_FORMAT && strstr(llm_errmsg(), "zz"), "an index naming a missing tensor is refused: %s", llm_errmsg());
	const char *idx2 = "{\"weight_map\": {\"a\": \"../../etc/passwd\"}}";
	llm_write_file_atomic(path, idx2, strlen(idx2));
	s = llm_ckpt_open(&ck, out);
	check(s == LLM_ERR_FORMAT, "an index naming a file outside the directory is refused: %s", llm_errmsg());
}

/* FP8 scales in the compressed-tensors layout: per tensor and per channel. */
static void test_scale_layouts(void)
{
	const char *tmp = test_tmpdir();
	char out[512];
	uint8_t w[4 * 8];
	for (int i = 0; i < 32; i++)
		w[i] = llm_f32_to_e4m3((float)(i % 7) - 3);
	float per_tensor = 0.5f;
	uint16_t per_channel[4] = { 0x3f80, 0x4000, 0x4040, 0x4080 };   /* bf16 1, 2, 3, 4 */
	void *data[4] = { w, &per_tensor, w, per_channel };
	struct llm_tensor d[4] = {
		desc("t.weight", LLM_DTYPE_E4M3, 4, 8), desc("t.weight_scale", LLM_DTYPE_F32, 1, 0),
		desc("c.weight", LLM_DTYPE_E4M3, 4, 8), desc("c.weight_scale", LLM_DTYPE_BF16, 4, 1),
	};
	snprintf(out, sizeof out, "%s/ct.safetensors", tmp);
	struct llm_ckpt ck;
	enum llm_status s = write_all(out, d, 4, data, NULL, 0, 0);
	s = s ? s : llm_ckpt_open(&ck, out);
	if (!check(!s, "compressed-tensors style checkpoint opens (%s)", s ? llm_errmsg() : "ok"))
		return;
	struct llm_weight wt, wc;
	s = llm_ckpt_weight(&ck, "t.weight", &wt);
	check(!s && wt.block_rows == 4 && wt.block_cols == 8 && wt.scale[0] == 0.5f,
	      "per-tensor weight_scale resolves to one 4x8 block");
	s = llm_ckpt_weight(&ck, "c.weight", &wc);
	check(!s && wc.block_rows == 1 && wc.block_cols == 8 && wc.scale[3] == 4.0f,
	      "per-channel BF16 weight_scale resolves to 1x8 blocks in f32");
	llm_ckpt_close(&ck);
}

static void test_stories_roundtrip(void)
{
	const char *models = test_models_dir();
	char in[512];
	if (models)
		snprintf(in, sizeof in, "%s/stories260K", models);
	struct stat st;
	if (!models || stat(in, &st) != 0) {
		check_skip("no stories260K in $LLM_TEST_MODELS", "quantization round trip on stories260K");
		return;
	}
	struct llm_ckpt src;
	if (!check(!llm_ckpt_open(&src, in), "open %s (%s)", in, llm_errmsg()))
		return;
	/* the default set (the decoder linears), and with fp8_vocab the tied
	 * embedding too */
	static const struct { int64_t r, c; const char *name; int vocab; } blocks[] = {
		{ 128, 128, "128x128", 0 }, { 1, 128, "1x128", 0 }, { 1, 0, "1xK", 0 }, { 16, 32, "16x32", 0 },
		{ 128, 128, "128x128+vocab", 1 }, { 1, 0, "1xK+vocab", 1 } };
	for (size_t b = 0; b < sizeof blocks / sizeof *blocks; b++) {
		char out[600], back[600];
		snprintf(out, sizeof out, "%s/fp8-%s", test_tmpdir(), blocks[b].name);
		snprintf(back, sizeof back, "%s/f32-%s", test_tmpdir(), blocks[b].name);
		struct llm_quant_opts o = { .block_rows = blocks[b].r, .block_cols = blocks[b].c, .fp8_vocab = blocks[b].vocab };
		enum llm_status s = llm_quantize(in, out, &o);
		struct llm_ckpt q;
		s = s ? s : llm_ckpt_open(&q, out);
		if (!check(!s, "quantize stories260K with %s blocks (%s)", blocks[b].name, s ? llm_errmsg() : "ok"))
			continue;
		int nq = 0, nbad = 0, ncopy_bad = 0, nvocab_row = 0;
		double worst = 0;
		for (size_t i = 0; i < src.n_tensor; i++) {
			const struct llm_tensor *t = src.tensors[i];
			const struct llm_tensor *u = llm_ckpt_find(&q, t->name);
			if (!u) {
				nbad++;
				continue;
			}
			if (u->dtype != LLM_DTYPE_E4M3) {
				ncopy_bad += u->nbytes != t->nbytes || memcmp(u->data, t->data, t->nbytes);
				continue;
			}
			struct llm_weight w;
			if (llm_ckpt_weight(&q, t->name, &w)) {
				nbad++;
				continue;
			}
			nq++;
			/* the embedding (and lm_head) take one scale per row whatever
			 * the block, so any vocabulary split keeps their scales whole */
			if (!strcmp(t->name, "model.embed_tokens.weight") || !strcmp(t->name, "lm_head.weight"))
				nvocab_row += w.block_rows == 1 && w.block_cols == w.cols && w.scale_cols == 1;
			const float *x = t->data;
			for (int64_t r = 0; r < w.rows; r++)
				for (int64_t c = 0; c < w.cols; c++) {
					float sc = w.scale[(r / w.block_rows) * w.scale_cols + c / w.block_cols];
					double v = llm_e4m3_to_f32(((const uint8_t *)w.data)[r * w.cols + c]) * sc;
					double xv = x[r * w.cols + c];
					/* E4M3 keeps 3 mantissa bits: half an ulp is 2^-4 of |x| for
					 * normals, 2^-10 of the scale in the subnormal range */
					double bound = fmax(fabs(xv) * 0x1p-4, sc * 0x1p-10) * (1 + 1e-6) + 1e-30;
					worst = fmax(worst, fabs(v - xv) / bound);
				}
		}
		check(nq == 35 + blocks[b].vocab && !nbad && !ncopy_bad, "%s: 35 decoder linears%s quantized, other tensors "
		      "copied bit-exact (%d, %d missing, %d differ)", blocks[b].name, blocks[b].vocab ? " and the embedding" : "",
		      nq, nbad, ncopy_bad);
		check(nvocab_row == blocks[b].vocab, "%s: the (tied) embedding %s (%d)", blocks[b].name,
		      blocks[b].vocab ? "has one scale per row" : "keeps its dtype", nvocab_row);
		check(worst <= 1.0, "%s: every element within half an E4M3 ulp of the original (worst %.3f of the bound)",
		      blocks[b].name, worst);
		/* dequantize to f32: exactly code * scale */
		struct llm_quant_opts dq = { .dequantize = 1, .out_dtype = LLM_DTYPE_F32 };
		struct llm_ckpt r;
		s = llm_quantize(out, back, &dq);
		s = s ? s : llm_ckpt_open(&r, back);
		if (check(!s, "%s: dequantize to f32 (%s)", blocks[b].name, s ? llm_errmsg() : "ok")) {
			int diff = 0;
			for (size_t i = 0; i < q.n_tensor; i++) {
				struct llm_weight w;
				const struct llm_tensor *t = q.tensors[i];
				if (t->dtype != LLM_DTYPE_E4M3 || llm_ckpt_weight(&q, t->name, &w))
					continue;
				const struct llm_tensor *u = llm_ckpt_find(&r, t->name);
				const float *y = u && u->dtype == LLM_DTYPE_F32 ? u->data : NULL;
				for (int64_t k = 0; y && k < w.rows * w.cols; k++) {
					float sc = w.scale[(k / w.cols / w.block_rows) * w.scale_cols + (k % w.cols) / w.block_cols];
					diff += y[k] != llm_e4m3_to_f32(((const uint8_t *)w.data)[k]) * sc;
				}
				diff += !y;
			}
			check(!diff && r.n_tensor == src.n_tensor && !llm_ckpt_is_fp8(&r),
			      "%s: dequantized f32 equals code x scale, same tensor set as the original", blocks[b].name);
			llm_ckpt_close(&r);
		}
		llm_ckpt_close(&q);
	}
	llm_ckpt_close(&src);
}

/* llm_ckpt_copy_out: a tensor of several 4 MiB pieces and a small one read
 * from the file by 1 and 3 threads, a job from the heap memcpy'd, all
 * byte-exact; a stop set beforehand reads nothing; a file cut short under
 * its mapping is a read error naming it. */
static void test_copy_out(void)
{
	const char *tmp = test_tmpdir();
	char out[512];
	size_t nb = (9u << 20) + 77;
	uint8_t *big = malloc(nb), small[5] = { 9, 8, 7, 6, 5 }, heap[100];
	uint8_t *dst = malloc(nb + 5 + sizeof heap);
	if (!check(big && dst, "copy_out: memory"))
		return;
	for (size_t i = 0; i < nb; i++)
		big[i] = (uint8_t)(i * 2654435761u >> 13);
	for (size_t i = 0; i < sizeof heap; i++)
		heap[i] = (uint8_t)(200 - i);
	void *data[2] = { big, small };
	struct llm_tensor d[2] = { desc("big", LLM_DTYPE_U8, (int64_t)nb, 0), desc("small", LLM_DTYPE_U8, 5, 0) };
	snprintf(out, sizeof out, "%s/copy.safetensors", tmp);
	struct llm_ckpt ck;
	enum llm_status s = write_all(out, d, 2, data, NULL, 0, 0);
	s = s ? s : llm_ckpt_open(&ck, out);
	if (!check(!s, "copy_out: checkpoint written and opened (%s)", s ? llm_errmsg() : "ok")) {
		free(big);
		free(dst);
		return;
	}
	struct llm_ckpt_copy jobs[3] = {
		{ dst, llm_ckpt_find(&ck, "big")->data, nb },
		{ dst + nb, llm_ckpt_find(&ck, "small")->data, 5 },
		{ dst + nb + 5, heap, sizeof heap },
	};
	int threads[2] = { 1, 3 }, same = 1;
	for (int k = 0; k < 2; k++) {
		memset(dst, 0, nb + 5 + sizeof heap);
		s = llm_ckpt_copy_out(&ck, jobs, 3, threads[k], NULL);
		same &= !s && !memcmp(dst, big, nb) && !memcmp(dst + nb, small, 5) && !memcmp(dst + nb + 5, heap, sizeof heap);
	}
	check(same, "copy_out: 9 MiB in pieces, a small tensor and heap bytes, 1 and 3 threads, byte-exact");
	_Atomic int stop = 1;
	memset(dst, 0, nb);
	s = llm_ckpt_copy_out(&ck, jobs, 3, 1, &stop);
	uint8_t zero[64] = { 0 };
	check(s == LLM_ERR_USAGE && !memcmp(dst, zero, sizeof zero),
	      "copy_out: a stop already set starts no piece and fails (%s)", s ? llm_errmsg() : "ok");
	if (truncate(out, 4096) == 0) {
		s = llm_ckpt_copy_out(&ck, jobs, 1, 2, NULL);
		check(s == LLM_ERR_IO && strstr(llm_errmsg(), "copy.safetensors"),
		      "copy_out: a file cut short is a read error naming it: %s", llm_errmsg());
	}
	llm_ckpt_close(&ck);
	free(big);
	free(dst);
}

int main(void)
{
	llm_log_level = 0;
	test_malformed();
	test_writer();
	test_scale_layouts();
	test_copy_out();
	test_stories_roundtrip();
	return check_done();
}
