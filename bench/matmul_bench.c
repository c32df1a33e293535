/* bench/matmul_bench.c: the CPU matmul of one weight against a few tokens,
 * on one thread, without the rest of a forward: the kernel's own GFLOP/s,
 * the number the engine's step time is made of.
 *
 *   matmul_bench [--dtype e4m3|bf16] [--rows R] [--cols C]
 *                [--block BRxBC] [--tokens LIST] [--copies N] [--reps N]
 *   (options parsed by common/base/args.c: --help lists them)
 *
 * Defaults: e4m3, 576 x 576 (SmolLM2's q_proj), blocks 128x128, tokens
 * 1,2,4,8,16,32,256, 1 copy, 9 repetitions. --copies N cycles through N
 * copies of the weight, so with enough of them (their bytes past the last
 * level cache) every call reads its weight from memory, as a decode step
 * does; with 1 it is in cache and the arithmetic alone is timed. One line
 * a token count: the best of the repetitions (each a pass over the copies,
 * at least 50 ms), as microseconds a call, GFLOP/s (2 * rows * cols *
 * tokens a call) and GB/s of weight bytes, and a checksum of the first
 * token's outputs: the same on every line (a token's result does not depend
 * on the tokens beside it) and in every build at the same CPU level. The
 * weights and x are random from a fixed seed (llm_rng). The CPU level
 * is the best this machine has (LLM_CPU_ISA caps it, as in the engine).
 * Built with the tools: build/<tree>/bench/matmul_bench. Exit status: 0
 * ok, 1 out of memory, 2 usage. */
#include "args.h"
#include "backend.h"
#include "ckpt.h"
#include "dtype.h"
#include "sampler.h"
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t rng[4];
static float next_f(void)       /* uniform in [-1, 1) */
{
	return (float)(2.0 * llm_rng_uniform(rng) - 1.0);
}

int main(int argc, char **argv)
{
	int64_t rows = 576, cols = 576, copies = 1, reps = 9, br = 128, bc = 128;
	const char *dtype = "e4m3", *block = "128x128", *toks = "1,2,4,8,16,32,256";
	const struct llm_opt opts[] = {
		LLM_STR(0, "dtype", "T", &dtype, "weight type: e4m3 or bf16"),
		LLM_INT(0, "rows", "R", &rows, "weight rows", 1, 1 << 30),
		LLM_INT(0, "cols", "C", &cols, "weight columns", 1, 1 << 30),
		LLM_STR(0, "block", "BRxBC", &block, "E4M3 scale blocks"),
		LLM_STR(0, "tokens", "LIST", &toks, "token counts, comma-separated, 1..4096 each"),
		LLM_INT(0, "copies", "N", &copies, "copies of the weight cycled through (past the cache: from memory)", 1, 1 << 20),
		LLM_INT(0, "reps", "N", &reps, "repetitions, the best one shown", 1, 1 << 20),
	};
	const struct llm_cli cli = {
		.usage = "matmul_bench [options]",
		.summary = "The CPU matmul of one weight against 1..N tokens on one thread: time, GFLOP/s, GB/s, "
		           "and the first token's output checksum.",
		.example = "matmul_bench --rows 2048 --cols 2048 --copies 24 --tokens 1,2,4,16",
		.opts = opts, .n_opts = (int)(sizeof opts / sizeof *opts),
	};
	int np, rc = llm_args_parse(argc, argv, &cli, NULL, &np);
	if (rc)
		return rc == LLM_ARGS_EXIT ? 0 : 2;
	if (strcmp(dtype, "e4m3") && strcmp(dtype, "bf16"))
		return llm_args_usage_error(&cli, "--dtype: '%s' is not e4m3 or bf16", dtype);
	int fp8 = !strcmp(dtype, "e4m3");
	char *e;
	br = strtoll(block, &e, 10);
	bc = *e == 'x' ? strtoll(e + 1, &e, 10) : 0;
	if (br <= 0 || bc <= 0 || *e)
		return llm_args_usage_error(&cli, "--block: '%s' is not BRxBC, e.g. 128x128", block);
	int64_t ntok[64];
	int nn = 0;
	for (const char *p = toks; *p && nn < 64; ) {
		char one[16];
		size_t len = strcspn(p, ",");
		if (len == 0 || len >= sizeof one)
			return llm_args_usage_error(&cli, "--tokens: '%s' is not a list of counts 1..4096", toks);
		memcpy(one, p, len);
		one[len] = 0;
		if (llm_parse_int(one, 1, 4096, &ntok[nn++]))
			return llm_args_usage_error(&cli, "--tokens: '%s' is not a list of counts 1..4096", toks);
		p += len + (p[len] == ',');
	}
	llm_rng_seed(rng, 1);
	if (br > rows)
		br = rows;
	if (bc > cols)
		bc = cols;
	int64_t srows = (rows + br - 1) / br, scols = (cols + bc - 1) / bc, tmax = 0;
	for (int i = 0; i < nn; i++)
		tmax = ntok[i] > tmax ? ntok[i] : tmax;

	size_t el = fp8 ? 1 : 2, wbytes = (size_t)(rows * cols) * el;
	struct llm_weight *w = calloc((size_t)copies, sizeof *w);
	uint8_t *data = malloc(wbytes * (size_t)copies);
	float *scale = malloc((size_t)(srows * scols) * sizeof *scale);
	float *x = malloc((size_t)(tmax * cols) * sizeof *x);
	uint16_t *xb = malloc((size_t)(tmax * cols) * sizeof *xb);
	float *y = malloc((size_t)(tmax * rows) * sizeof *y);
	if (!w || !data || !scale || !x || !xb || !y) {
		fprintf(stderr, "matmul_bench: out of memory\n");
		return 1;
	}
	for (int64_t i = 0; i < srows * scols; i++)
		scale[i] = 0.01f * (1.0f + (float)llm_rng_uniform(rng));
	for (size_t i = 0; i < wbytes * (size_t)copies; i += el) {
		if (fp8) {
			uint8_t c = (uint8_t)(llm_rng_uniform(rng) * 256.0);
			data[i] = (c & 0x7f) == 0x7f ? 0 : c;   /* no NaN codes */
		} else {
			uint16_t h = llm_f32_to_bf16(next_f());
			memcpy(data + i, &h, 2);
		}
	}
	for (int64_t i = 0; i < tmax * cols; i++)
		x[i] = next_f();
	for (int64_t c = 0; c < copies; c++)
		w[c] = (struct llm_weight){ .name = "w", .dtype = fp8 ? LLM_DTYPE_E4M3 : LLM_DTYPE_BF16,
		                            .rows = rows, .cols = cols, .data = data + (size_t)c * wbytes,
		                            .scale = fp8 ? scale : NULL, .scale_rows = fp8 ? srows : 0,
		                            .scale_cols = fp8 ? scols : 0, .block_rows = fp8 ? br : 0,
		                            .block_cols = fp8 ? bc : 0 };
	int bad;
	enum llm_cpu_isa isa = llm_cpu_isa_capped(&bad);
	if (bad)
		return llm_args_usage_error(&cli, "LLM_CPU_ISA: '%s' is not scalar, avx2, avx512 or avx512bf16",
		                            getenv("LLM_CPU_ISA"));
	isa = llm_cpu_matmul_isa(isa, w[0].dtype);
	int bfx = isa == LLM_ISA_AVX512BF16;
	if (bfx)
		llm_cpu_x_to_bf16(xb, cols, x, cols, tmax, cols);
	printf("# matmul_bench: %s %lld x %lld, %lld cop%s (%.1f MB), CPU level %s, one thread\n",
	       fp8 ? "E4M3" : "BF16", (long long)rows, (long long)cols, (long long)copies, copies == 1 ? "y" : "ies",
	       (double)wbytes * (double)copies / 1e6, llm_cpu_isa_name(isa));
	if (fp8)
		printf("# scale blocks %lldx%lld\n", (long long)br, (long long)bc);
	printf("%6s %12s %10s %10s %18s\n", "tokens", "us/call", "GFLOP/s", "GB/s", "token 0 sum");
	for (int k = 0; k < nn; k++) {
		int64_t t = ntok[k];
		double best = 1e30;
		for (int64_t r = 0; r < reps; r++) {
			int64_t calls = 0;
			double t0 = llm_now(), el_s;
			do {
				for (int64_t c = 0; c < copies; c++, calls++) {
					if (bfx)
						llm_cpu_matmul_rows_bf16x(y, rows, xb, cols, t, &w[c], 0, rows);
					else
						llm_cpu_matmul_rows(isa, y, rows, x, cols, t, &w[c], 0, rows);
				}
				el_s = llm_now() - t0;
			} while (el_s < 0.05);
			if (el_s / (double)calls < best)
				best = el_s / (double)calls;
		}
		uint64_t sum = 0;
		for (int64_t i = 0; i < rows; i++) {
			uint32_t b;
			memcpy(&b, &y[i], 4);
			sum = sum * 1000003u + b;
		}
		double flop = 2.0 * (double)rows * (double)cols * (double)t;
		printf("%6lld %12.2f %10.1f %10.2f %18llx\n", (long long)t, best * 1e6, flop / best / 1e9,
		       (double)wbytes / best / 1e9, (unsigned long long)sum);
	}
	free(w);
	free(data);
	free(scale);
	free(x);
	free(xb);
	free(y);
	return 0;
}
