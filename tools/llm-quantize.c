/* tools/llm-quantize.c: safetensors (BF16/F16/F32) <-> FP8 E4M3 with
 * group-wise scales; also writes seeded random-weight checkpoints. */
#define _POSIX_C_SOURCE 200809L
#include "llm.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int parse_block(const char *s, struct llm_quant_opts *q)
{
	char *x = strchr(s, 'x');
	if (!x)
		return -1;
	char rows[32];
	size_t n = (size_t)(x - s);
	if (n == 0 || n >= sizeof rows)
		return -1;
	memcpy(rows, s, n);
	rows[n] = 0;
	if (llm_parse_int(rows, 1, 1 << 20, &q->block_rows))
		return -1;
	if (!strcmp(x + 1, "K")) {
		if (q->block_rows != 1)
			return -1;
		q->block_cols = 0;
		return 0;
	}
	return llm_parse_int(x + 1, 1, 1 << 20, &q->block_cols) ? -1 : 0;
}

int main(int argc, char **argv)
{
	struct llm_quant_opts q = { .block_rows = 128, .block_cols = 128, .out_dtype = LLM_DTYPE_BF16 };
	const char *block = "128x128", *dtype = NULL, *random_cfg = NULL;
	int64_t seed = 0;
	int dequant = 0, stats = 0, json = 0, force = 0, check = 0;
	size_t max_shard = 5000000000u;
	const struct llm_opt opts[] = {
		LLM_STR('b', "block", "RxC", &block, "scale group of the decoder linears: 128x128, 1x128 (row groups), any RxC, or 1xK (per channel, written in the compressed-tensors layout)"),
		LLM_FLAG('d', "dequantize", &dequant, "FP8 back to a plain checkpoint"),
		LLM_STR(0, "dtype", "TYPE", &dtype, "output dtype: bf16, f16 or f32 (--dequantize); also fp8 (--random; default bf16)"),
		LLM_STR(0, "include", "REGEX", &q.include, "quantize the tensors whose names match (default: the decoder linear weights)"),
		LLM_FLAG(0, "fp8-vocab", &q.fp8_vocab, "the embedding and lm_head in FP8 too, one scale per row: a smaller file that only llm-tools load"),
		LLM_STR(0, "exclude", "REGEX", &q.exclude, "never quantize the tensors whose names match"),
		LLM_FLAG('s', "stats", &stats, "per-tensor relative RMS and max abs error of the quantization (table on stderr)"),
		LLM_FLAG(0, "json", &json, "with --stats: JSONL on stdout"),
		LLM_STR(0, "random", "CONFIG", &random_cfg, "no IN: write a random-weight checkpoint of this config.json"),
		LLM_INT(0, "seed", "N", &seed, "seed of --random", 0, INT64_MAX),
		LLM_STR(0, "tokenizer", "DIR", &q.tokenizer_dir, "with --random: copy the tokenizer files of DIR"),
		LLM_SIZE(0, "max-shard-size", "SIZE", &max_shard, "largest shard of a directory output (5GB, 500MB, 2GiB ...)"),
		LLM_FLAG('f', "force", &force, "replace an existing OUT"),
		LLM_FLAG(0, "check", &check, "no OUT: scan every tensor of IN for NaN or Inf, name the first bad one (exit 1)"),
	};
	const struct llm_cli cli = {
		.usage = "llm-quantize [options] IN OUT",
		.summary = "Quantize a Hugging Face checkpoint to FP8 E4M3 with group-wise scales, or back.\n"
		           "IN and OUT are directories, .safetensors files or - (standard input/output);\n"
		           "with --random CONFIG, IN is omitted; with --check, OUT is. Progress and a\n"
		           "closing summary go to standard error (-q: neither).",
		.example = "llm-quantize --block 128x128 models/tinyllama models/tinyllama-fp8",
		.opts = opts, .n_opts = (int)(sizeof opts / sizeof *opts), .min_pos = 1, .max_pos = 2,
	};
	const char *pos[16];
	int n_pos;
	int rc = llm_args_parse(argc, argv, &cli, pos, &n_pos);
	if (rc != LLM_ARGS_OK)
		return rc == LLM_ARGS_EXIT ? 0 : 2;
	if (check) {            /* the weights' numbers, nothing written */
		if (n_pos != 1 || random_cfg || dequant || stats)
			return llm_args_usage_error(&cli, "--check takes only IN");
		struct llm_ckpt ck;
		size_t nv = 0;
		if (llm_ckpt_open(&ck, pos[0]))
			llm_die("%s", llm_errmsg());
		enum llm_status s = llm_ckpt_check_finite(&ck, &nv);
		size_t nt = ck.n_tensor;
		llm_ckpt_close(&ck);
		if (s)
			llm_die("%s", llm_errmsg());
		LLM_INFO("%s: %zu tensors, %zu values, all finite\n", pos[0], nt, nv);
		return 0;
	}
	if (n_pos != (random_cfg ? 1 : 2))
		return llm_args_usage_error(&cli, random_cfg ? "--random takes only OUT" : "need IN and OUT");
	if (parse_block(block, &q))
		return llm_args_usage_error(&cli, "--block: '%s' is not RxC (128x128, 1x128, 1xK)", block);
	if (dtype) {
		int t = llm_dtype_parse_flag(dtype);
		int ok = t == LLM_DTYPE_BF16 || t == LLM_DTYPE_F16 || t == LLM_DTYPE_F32 ||
		         (t == LLM_DTYPE_E4M3 && random_cfg);
		if (!ok)
			return llm_args_usage_error(&cli, "--dtype: '%s' is not %s", dtype,
			                            random_cfg ? "bf16, f16, f32 or fp8" : "bf16, f16 or f32");
		if (!dequant && !random_cfg)
			return llm_args_usage_error(&cli, "--dtype goes with --dequantize or --random");
		q.out_dtype = (enum llm_dtype)t;
	}
	if (json && !stats)
		return llm_args_usage_error(&cli, "--json goes with --stats");
	if (stats && dequant)
		return llm_args_usage_error(&cli, "--stats measures quantization; it does not go with --dequantize");
	const char *out = pos[n_pos - 1];
	if (json && !strcmp(out, "-"))
		return llm_args_usage_error(&cli, "--stats --json writes to stdout, so OUT cannot be -");
	q.dequantize = dequant;
	q.stats = stats ? (json ? 2 : 1) : 0;
	q.seed = (uint64_t)seed;
	q.write.force = force;
	q.write.max_shard_size = max_shard;
	struct llm_progress pg;          /* progress and the summary on stderr; -q: none */
	if (llm_progress_init(&pg, llm_log_level >= 1 ? stderr : NULL))
		return llm_args_usage_error(&cli, "%s", llm_errmsg());
	q.write.progress = &pg;
	char stale[4096];         /* what killed runs left at OUT (their *.tmp.PID) */
	int n_stale = llm_tmp_sweep(out, 0, stale, sizeof stale);
	if (n_stale)
		LLM_INFO("%s: removed %d stale temporar%s of killed runs (%s%s)\n", llm_progname(), n_stale,
		         n_stale > 1 ? "ies" : "y", stale, n_stale > 1 ? ", ..." : "");
	enum llm_status s = random_cfg ? llm_quantize_random(random_cfg, out, &q)
	                               : llm_quantize(pos[0], out, &q);
	if (s) {
		llm_progress_clear(&pg);
		llm_die("%s", llm_errmsg());
	}
	llm_progress_end_write(&pg, out);
	return 0;
}
