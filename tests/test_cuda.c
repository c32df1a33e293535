/* tests/test_cuda.c: every op of the CUDA backend against the CPU backend
 * and against the plain reference (common/engine/cpu_ref.h: each definition in
 * double, rounded once), on the same seeded random inputs and on crafted
 * inputs whose result is exact; plus the registry's behaviour without a
 * device.
 *
 * Built in every build. Without CUDA support (make CUDA=0), or with it but
 * no device, each GPU check prints "ok - ... # SKIP <reason>", and the
 * checks that need no device still run (the "cuda" and "auto" specs).
 *
 * Tolerance table (op: bound, the reason):
 * - matmul E4M3, tensor-core tiles: |gpu - cpu| <= 2^-7 sum_c |x_c w_c|:
 *   x and code * scale are each rounded to bf16 (relative 2^-9 each, so a
 *   product is off by at most ~2^-8 of its magnitude), the sums are f32.
 * - matmul E4M3 GEMV and generic, F32, F16: |gpu - cpu| <= K 2^-23 sum|x w|:
 *   the same f32 products (code * scale rounded once, as the CPU), only the
 *   summation order differs (n 2^-24 is the worst case of reordering; the
 *   factor 2 covers fma against separate rounding).
 * - matmul BF16 (cuBLAS): 2^-7 sum|x w|: x is rounded to bf16.
 * - exact inputs (small integers, power-of-two scales): every path equals
 *   the CPU bit for bit, since every product and partial sum is exact.
 * - batch invariance (backend.h): a token alone or in a batch of 130 gives
 *   the same bits (the tile table switches tiles with M).
 * - rmsnorm, add_rmsnorm: atol 1e-6, rtol 1e-5 (f32 sum of squares, tree
 *   order against sequential).
 * - rope: atol 1e-5, rtol 1e-5 (CUDA cosf/sinf are within 2 ulp).
 * - swiglu: atol 1e-7, rtol 4e-6 (CUDA expf within 2 ulp, one division).
 * - add, gather, embed, kv_store (f32, bf16 and fp8 caches, fp8 scales included): exact.
 * - attention: atol 1e-5, rtol 1e-4 (online softmax against two-pass;
 *   scores through another dot order).
 * - argmax with repetition penalty: the same ids.
 * - rope_store (the fused op) against the GPU's own rope, rope, kv_store:
 *   exact (one rotation function, one store function).
 * - matmul_add (the residual add in the GEMM's epilogue) against the GPU's
 *   own matmul then add, and the forward with it against the forward
 *   without it: exact (the same f32 sum, then the same one add).
 * - CUDA graphs: a replayed decode step against the same step op by op on
 *   a backend with graphs off: exact (the same kernels, launched by the
 *   graph), and the graph backend's counts show captures and replays.
 * - sample (the backend's sample op against common/engine/sampler.c, each row's
 *   sampler state built twice from one seed, one copy drawing through
 *   llm_sampler_row, the other through llm_sampler_sample): greedy, the
 *   same ids (exact); sampled, the same ids too, since both use the same
 *   draw and the same f32 steps; only CUDA's double exp (1 ulp) may move a
 *   p_i's last bit, which changes an id only where the draw falls within
 *   ~1e-15 of a walk boundary (never over these ~3000 draws); log-probs
 *   atol 1e-6 (the CPU's AVX-512 sum is within 3e-7, the GPU's in double).
 * Against the plain reference the same table holds, bound for bound: each
 * bound covers the GPU op's own rounding (the reference is the exact
 * result within half an f32 ulp, nearer to it than the CPU's f32 ops), and
 * the exact and bit-for-bit cases stay exact (the reference's double sums
 * of exact f32 terms are exact too). The reference runs with f32 inputs
 * (llm_ref_matmul BF16_IN 0): the bf16 rounding of the tensor-core and
 * cuBLAS paths is inside their 2^-7 bound.
 *
 * The NCCL communicator (common/engine/comm_nccl.c, builds with NCCL): one rank on
 * device 0 (NCCL takes a communicator of one; two ranks on one GPU it
 * refuses), its id made here, or passed over MPI under mpirun -np 1; every
 * collective on device buffers gives the bytes the CPU communicator gives
 * on host buffers (exact: collectives copy, and a one-rank sum adds
 * nothing), and writes nothing past its output (guard bytes).
 * "test_cuda nccl" runs these checks alone (bench/gpu.sh step nccl).
 *
 * test_cuda [GROUP...]: only the named groups of checks, each one family
 * of kernels (matmul, matmul_other, rowwise, attention, argmax, sample,
 * rope_store, matmul_add, graphs, nccl), to rerun what a fix touched.
 * "sanitize": the smallest set that still launches every kernel (every
 * group but graphs and nccl, each on fewer shapes, batch sizes and draws),
 * what bench/gpu.sh runs under compute-sanitizer.
 *
 * A failing check's line ends with its first failure (check_note): the op
 * and configuration, the shape, the first differing element, expected
 * (the CPU) and got (the GPU), and the error against its bound, so that a
 * device session can fix a kernel from that line alone. */
#define _GNU_SOURCE
#include "check.h"
#include "backend.h"
#include "cpu_ref.h"
#include "kvcache.h"
#include "sampler.h"
#include "model.h"
#include "dtype.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#ifdef LLM_CUDA
#include "../kernels/llm_cuda.h"
#include "../kernels/cuda_kernels.h"
#endif
#ifdef LLM_NCCL
#include "comm.h"
#include <cuda_runtime_api.h>
#endif

/* Every GPU check by name, for the skip lines. */
static const char *const gpu_checks[] = {
	"matmul E4M3 every tile configuration against the CPU (bound table)",
	"matmul E4M3 exact inputs: every configuration equals the CPU bit for bit",
	"matmul E4M3 all 254 non-NaN codes decode exactly on every configuration",
	"matmul E4M3 batch invariance: a token alone or in a batch of 130, same bits",
	"matmul E4M3 block sizes the tiles cannot take fall back to the generic kernel",
	"matmul BF16 (cuBLAS), F16, F32 against the CPU",
	"matmul into host memory (the logits)",
	"rmsnorm and add_rmsnorm against the CPU",
	"rope (llama3-scaled inv_freq) against the CPU",
	"swiglu, add, gather, embed against the CPU",
	"kv_store f32, bf16 and fp8 caches equal the CPU's bytes (fp8: codes and scales)",
	"attention decode + prefill chunks, GQA, d_head 8/64/128, f32/bf16/fp8 KV against the CPU",
	"argmax with repetition penalty equals the CPU's choice",
	"matmul, every configuration and dtype above, against the plain reference (same bounds)",
	"rmsnorm, add_rmsnorm, rope, swiglu, add, gather, embed against the plain reference",
	"kv_store bytes and attention against the plain reference, positions to 277 (block 17)",
	"sample: greedy (ties, -0/+0, biases, min_tokens hold, penalties) equals the CPU sampler's ids",
	"sample: temperature, top-k, top-p, min-p, penalties, biases: the CPU sampler's ids, same draws",
	"sample: log-probs within 1e-6 of the CPU sampler's, NaN where not wanted",
	"sample: a row with a NaN or Inf logit chooses nothing, names the first such id; the CPU refuses it too",
	"rope_store (fused) equals rope, rope, kv_store on the GPU bit for bit: q, k, f32/bf16/fp8 caches and scales",
	"CUDA graphs: stories260K decode steps (3 and 2 sequences) captured and replayed give the eager logits bit for bit",
	"matmul_add equals matmul then add on the GPU bit for bit: every E4M3 configuration, BF16, F16, F32, strided x",
	"matmul_add in the forward: stories260K prompts and decode steps give the logits of matmul then add bit for bit",
};

/* The groups "test_cuda GROUP..." selects, and the group of each GPU
 * check above (the plain reference's checks go with the group whose
 * comparisons feed them). */
enum { G_MATMUL, G_MATMUL_OTHER, G_ROWWISE, G_ATTENTION, G_ARGMAX, G_SAMPLE, G_ROPE_STORE, G_MATMUL_ADD, G_GRAPHS,
       G_NCCL, G_COUNT };
static const char *const group_names[G_COUNT] = { "matmul", "matmul_other", "rowwise", "attention", "argmax", "sample",
                                                  "rope_store", "matmul_add", "graphs", "nccl" };
static const unsigned char gpu_check_group[] = {
	G_MATMUL, G_MATMUL, G_MATMUL, G_MATMUL, G_MATMUL, G_MATMUL_OTHER, G_MATMUL_OTHER, G_ROWWISE, G_ROWWISE,
	G_ROWWISE, G_ATTENTION, G_ATTENTION, G_ARGMAX, G_MATMUL, G_ROWWISE, G_ATTENTION, G_SAMPLE, G_SAMPLE, G_SAMPLE,
	G_SAMPLE, G_ROPE_STORE, G_GRAPHS, G_MATMUL_ADD, G_GRAPHS,
};
_Static_assert(sizeof gpu_check_group == sizeof gpu_checks / sizeof *gpu_checks, "a group for every GPU check");
static int selected[G_COUNT];   /* the groups this run checks */
static int small;               /* "sanitize": every kernel, fewest cases */
enum { NOTE_MAX = 400 };        /* a failure's note kept for a later check */

/* The NCCL communicator's checks, by name. */
static const char *const nccl_checks[] = {
	"nccl: a one-rank communicator on device 0 (its id made here, or over MPI under mpirun)",
	"nccl: all-reduce (sum) of device f32 equals the CPU communicator's bits",
	"nccl: all-gather out of place and in place equals the CPU communicator's bytes, guards intact",
	"nccl: all-gather of unequal parts (grouped broadcasts) equals the CPU communicator's, guards intact",
	"nccl: the stage boundary's 1/T slices all-gathered in place on the device equal the CPU's",
	"nccl: argmax pairs, broadcast, barrier and split equal the CPU communicator's",
	"nccl: byte and call counters equal the CPU communicator's for the same calls",
};

static void skip_nccl(const char *reason)
{
	for (size_t i = 0; i < sizeof nccl_checks / sizeof *nccl_checks; i++)
		check_skip(reason, "cuda: %s", nccl_checks[i]);
}

static void skip_all(const char *reason)
{
	for (size_t i = 0; i < sizeof gpu_checks / sizeof *gpu_checks; i++)
		if (selected[gpu_check_group[i]] || (i == 13 && selected[G_MATMUL_OTHER]))
			check_skip(reason, "cuda: %s", gpu_checks[i]);
	if (selected[G_NCCL])
		skip_nccl(reason);
}

#ifdef LLM_CUDA

/* The checks against the plain reference, gathered over the tests below. */
static int ref_matmul_bad, ref_rowwise_ok = 1, ref_attn_ok = 1;

static uint64_t rng = 0x9e3779b97f4a7c15ull;
static double urand(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (double)(rng >> 11) * 0x1.0p-53;
}
static float frand(void) { return (float)(urand() * 2 - 1); }

static struct llm_backend *cpu, *gpu;

/* A device copy of N host floats. */
static float *dev_f32(const float *h, size_t n)
{
	void *p = NULL;
	if (gpu->ops->alloc(gpu, n * sizeof(float), &p) || (h && gpu->ops->copy_in(gpu, p, h, n * sizeof(float)))) {
		check(0, "device buffer of %zu floats: %s", n, llm_errmsg());
		exit(1);
	}
	return p;
}

static void host_of(float *h, const float *d, size_t n)
{
	if (llm_cuda_copy_out(gpu, h, d, n * sizeof(float))) {
		check(0, "copy out: %s", llm_errmsg());
		exit(1);
	}
}

struct wbuf {
	struct llm_weight w;
	void *data;
	float *scale;
};

/* Random weight of DT (rows, cols); E4M3 blocks br x bc (0: whole dim).
 * EXACT: small integer values and power-of-two scales. */
static void make_weight(struct wbuf *b, enum llm_dtype dt, int64_t rows, int64_t cols,
                        int64_t br, int64_t bc, int exact)
{
	memset(b, 0, sizeof *b);
	size_t n = (size_t)(rows * cols);
	b->data = malloc(n * llm_dtype_size(dt));
	b->w.name = "test";
	b->w.dtype = dt;
	b->w.rows = rows;
	b->w.cols = cols;
	b->w.data = b->data;
	if (dt == LLM_DTYPE_E4M3) {
		br = br ? br : rows;
		bc = bc ? bc : cols;
		b->w.block_rows = br;
		b->w.block_cols = bc;
		b->w.scale_rows = (rows + br - 1) / br;
		b->w.scale_cols = (cols + bc - 1) / bc;
		b->scale = malloc((size_t)(b->w.scale_rows * b->w.scale_cols) * sizeof(float));
		for (int64_t i = 0; i < b->w.scale_rows * b->w.scale_cols; i++)
			b->scale[i] = exact ? ldexpf(1.0f, (int)(urand() * 6) - 3) : (float)(urand() * 0.01 + 1e-4);
		b->w.scale = b->scale;
	}
	for (size_t i = 0; i < n; i++) {
		float v = exact ? (float)((int)(urand() * 9) - 4) : frand();
		switch (dt) {
		case LLM_DTYPE_F32: ((float *)b->data)[i] = v; break;
		case LLM_DTYPE_F16: ((uint16_t *)b->data)[i] = llm_f32_to_f16(v); break;
		case LLM_DTYPE_BF16: ((uint16_t *)b->data)[i] = llm_f32_to_bf16(v); break;
		default: {
			uint8_t c = exact ? llm_f32_to_e4m3(v) : (uint8_t)(urand() * 256);
			if ((c & 0x7f) == 0x7f)
				c = 0x3f;          /* no NaN codes */
			((uint8_t *)b->data)[i] = c;
		}
		}
	}
}

static void free_weight(struct wbuf *b)
{
	free(b->data);
	free(b->scale);
	memset(b, 0, sizeof *b);
}

/* The first element over its bound in the last matmul_cmp: token t,
 * output r, the CPU's value (expected) and the GPU's (got). */
static struct { int64_t t, r; float got, ref; double bound; } mm_first;

/* The failure of a matmul case (printf-style label: op, configuration,
 * shape): a diagnostic, and the note of the check line that follows. */
static void mm_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void mm_fail(const char *fmt, ...)
{
	char what[300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(what, sizeof what, fmt, ap);
	va_end(ap);
	double e = fabs((double)mm_first.got - mm_first.ref);
	check_diag("%s: first bad [token %lld, output %lld] expected %.9g got %.9g (|err| %.3g, bound %.3g)", what,
	           (long long)mm_first.t, (long long)mm_first.r, mm_first.ref, mm_first.got, e, mm_first.bound);
	check_note("%s: first bad [token %lld, output %lld] expected %.9g got %.9g (|err| %.3g, bound %.3g)", what,
	           (long long)mm_first.t, (long long)mm_first.r, mm_first.ref, mm_first.got, e, mm_first.bound);
}

/* y = x . W^T on both backends; returns the worst |gpu - cpu| / bound with
 * bound = f * sum|x w| (+ tiny), and the number of elements over 1. With
 * EXACT, counts elements whose bits differ instead. GOT_OUT (may be NULL)
 * receives the GPU result. The first element over its bound: mm_first. */
static int64_t matmul_cmp(const struct wbuf *b, const float *x, int64_t m, double f, int exact,
                          double *worst, float *got_out)
{
	int64_t n = b->w.rows, k = b->w.cols;
	float *ref = malloc((size_t)(m * n) * sizeof(float)), *got = malloc((size_t)(m * n) * sizeof(float));
	float *row = malloc((size_t)k * sizeof(float)), *pref = malloc((size_t)(m * n) * sizeof(float));
	int64_t ref_bad = 0;
	float *dx = dev_f32(x, (size_t)(m * k)), *dy = dev_f32(NULL, (size_t)(m * n));
	int64_t bad = 0;
	*worst = 0;
	if (cpu->ops->matmul(cpu, llm_view_f32(ref, m, n), llm_view_f32((float *)x, m, k), &b->w)
	    || gpu->ops->matmul(gpu, llm_view_f32(dy, m, n), llm_view_f32(dx, m, k), &b->w)
	    || gpu->ops->sync(gpu)
	    || llm_ref_matmul(llm_view_f32(pref, m, n), llm_view_f32((float *)x, m, k), &b->w, 0)) {
		check_diag("matmul failed: %s", llm_errmsg());
		check_note("matmul %s %lldx%lld M %lld failed: %s", llm_dtype_name(b->w.dtype), (long long)n, (long long)k,
		           (long long)m, llm_errmsg());
		bad = m * n;
		goto out;
	}
	host_of(got, dy, (size_t)(m * n));
	for (int64_t r = 0; r < n; r++) {
		llm_weight_row_f32(&b->w, r, row);
		for (int64_t t = 0; t < m; t++) {
			float g = got[t * n + r], c = ref[t * n + r], pr = pref[t * n + r];
			if (exact) {
				if (llm_f32_bits(g) != llm_f32_bits(c) && !bad++)
					mm_first.t = t, mm_first.r = r, mm_first.got = g, mm_first.ref = c, mm_first.bound = 0;
				if (llm_f32_bits(g) != llm_f32_bits(pr))
					ref_bad++;
				continue;
			}
			double mag = 0;
			for (int64_t j = 0; j < k; j++)
				mag += fabs((double)x[t * k + j] * row[j]);
			double e = fabs((double)g - c) / (f * mag + 1e-30);
			if (!(e <= 1.0) && !bad++)
				mm_first.t = t, mm_first.r = r, mm_first.got = g, mm_first.ref = c, mm_first.bound = f * mag;
			if (!(fabs((double)g - pr) <= f * mag + 1e-30))
				ref_bad++;
			if (e > *worst || isnan(e))
				*worst = e;
		}
	}
	if (got_out)
		memcpy(got_out, got, (size_t)(m * n) * sizeof(float));
	if (ref_bad)
		check_diag("matmul %s %lldx%lld M %lld: %lld elements off the plain reference", llm_dtype_name(b->w.dtype),
		           (long long)n, (long long)k, (long long)m, (long long)ref_bad);
	ref_matmul_bad += ref_bad != 0;
out:
	gpu->ops->release(gpu, dx);
	gpu->ops->release(gpu, dy);
	free(ref);
	free(got);
	free(row);
	free(pref);
	return bad;
}

static float *rand_x(int64_t m, int64_t k, int exact)
{
	float *x = malloc((size_t)(m * k) * sizeof(float));
	for (int64_t i = 0; i < m * k; i++)
		x[i] = exact ? (float)((int)(urand() * 7) - 3) : frand();
	return x;
}

static void test_matmul_e4m3(void)
{
	static const struct { int64_t n, k, br, bc; } shapes[] = {
		{ 200, 256, 128, 128 },     /* N not a tile multiple, DeepSeek-style blocks */
		{ 96, 512, 1, 0 },          /* per output channel */
		{ 130, 96, 0, 0 },          /* per tensor */
		{ 64, 160, 32, 32 },
	};
	static const int64_t ms[] = { 1, 3, 8, 17, 70, 130 }, ms_small[] = { 1, 17, 130 };
	const int64_t *mv = small ? ms_small : ms;
	size_t n_m = small ? 3 : sizeof ms / sizeof *ms, n_shape = small ? 2 : sizeof shapes / sizeof *shapes;
	int bad_total = 0;
	double worst_all = 0;
	for (int cfg = 0; cfg < LLM_GEMM_CFG_COUNT; cfg++) {
		llm_cuda_gemm_force(gpu, cfg);
		for (size_t s = 0; s < n_shape; s++) {
			struct wbuf b;
			make_weight(&b, LLM_DTYPE_E4M3, shapes[s].n, shapes[s].k, shapes[s].br, shapes[s].bc, 0);
			for (size_t i = 0; i < n_m; i++) {
				float *x = rand_x(mv[i], shapes[s].k, 0);
				int mma = cfg >= LLM_GEMM_MMA_16x64 && cfg <= LLM_GEMM_MMA_128x128;
				double worst;
				int64_t bad = matmul_cmp(&b, x, mv[i], mma ? 0x1.0p-7 : (double)shapes[s].k * 0x1.0p-23,
				                         0, &worst, NULL);
				if (bad) {
					mm_fail("matmul E4M3 %s N %lld K %lld blocks %lldx%lld M %lld: %lld of %lld over the bound, "
					        "worst %.3g of it", llm_cuda_gemm_cfg_name(cfg), (long long)shapes[s].n,
					        (long long)shapes[s].k, (long long)shapes[s].br, (long long)shapes[s].bc,
					        (long long)mv[i], (long long)bad, (long long)(mv[i] * shapes[s].n), worst);
					bad_total++;
				}
				if (worst > worst_all)
					worst_all = worst;
				free(x);
			}
			llm_cuda_weights_drop(gpu);
			free_weight(&b);
		}
	}
	llm_cuda_gemm_force(gpu, -1);
	check(!bad_total, "cuda: %s (worst %.3f of the bound)", gpu_checks[0], worst_all);

	/* exact inputs */
	bad_total = 0;
	for (int cfg = 0; cfg < LLM_GEMM_CFG_COUNT; cfg++) {
		llm_cuda_gemm_force(gpu, cfg);
		struct wbuf b;
		make_weight(&b, LLM_DTYPE_E4M3, 72, 256, 32, 64, 1);
		for (int64_t m = 1; m <= 33; m += small ? 16 : 8) {
			float *x = rand_x(m, 256, 1);
			double worst;
			int64_t bad = matmul_cmp(&b, x, m, 0, 1, &worst, NULL);
			if (bad) {
				mm_fail("matmul E4M3 exact inputs %s N 72 K 256 blocks 32x64 M %lld: %lld elements differ in bits",
				        llm_cuda_gemm_cfg_name(cfg), (long long)m, (long long)bad);
				bad_total++;
			}
			free(x);
		}
		llm_cuda_weights_drop(gpu);
		free_weight(&b);
	}
	check(!bad_total, "cuda: %s", gpu_checks[1]);

	/* every code: W (256, 32), row r = code r at column 0; x = e_0 */
	bad_total = 0;
	{
		uint8_t *codes = calloc(256 * 32, 1);
		float scale = 0.125f, x[32] = { 1.0f }, *got = malloc(256 * sizeof(float));
		for (int r = 0; r < 256; r++)
			codes[r * 32] = (uint8_t)((r & 0x7f) == 0x7f ? 0 : r);
		struct llm_weight w = { "codes", LLM_DTYPE_E4M3, 256, 32, codes, &scale, 1, 1, 256, 32 };
		struct wbuf b = { w, NULL, NULL };
		for (int cfg = 0; cfg < LLM_GEMM_CFG_COUNT; cfg++) {
			llm_cuda_gemm_force(gpu, cfg);
			double worst;
			int64_t bad = matmul_cmp(&b, x, 1, 0, 1, &worst, got);
			for (int r = 0; r < 256 && !bad; r++)
				if (got[r] != llm_e4m3_table[codes[r * 32]] * scale) {
					mm_first.t = 0, mm_first.r = r, mm_first.got = got[r], mm_first.bound = 0;
					mm_first.ref = llm_e4m3_table[codes[r * 32]] * scale;
					bad++;
				}
			if (bad) {
				mm_fail("matmul E4M3 code table %s: code 0x%02x (row) decodes wrong", llm_cuda_gemm_cfg_name(cfg),
				        codes[mm_first.r * 32]);
				bad_total++;
			}
			llm_cuda_weights_drop(gpu);
		}
		free(codes);
		free(got);
	}
	llm_cuda_gemm_force(gpu, -1);
	check(!bad_total, "cuda: %s", gpu_checks[2]);

	/* batch invariance through the table (not in the sanitize set: the
	 * same kernels as above) */
	if (small)
		check_skip("the sanitize subset", "cuda: %s", gpu_checks[3]);
	else {
		struct wbuf b;
		int64_t n = 192, k = 384, m = 130;
		make_weight(&b, LLM_DTYPE_E4M3, n, k, 128, 128, 0);
		float *x = rand_x(m, k, 0), *all = malloc((size_t)(m * n) * sizeof(float));
		float *one = malloc((size_t)n * sizeof(float));
		double worst;
		matmul_cmp(&b, x, m, 0x1.0p-7, 0, &worst, all);
		int same = 1;
		for (int64_t t = 0; t < m; t += 13) {
			matmul_cmp(&b, x + t * k, 1, 0x1.0p-7, 0, &worst, one);
			for (int64_t r = 0; r < n && same; r++)
				if (llm_f32_bits(one[r]) != llm_f32_bits(all[t * n + r])) {
					check_note("matmul E4M3 N %lld K %lld blocks 128x128: token %lld alone, output %lld: "
					           "%.9g, in the batch of %lld: %.9g", (long long)n, (long long)k, (long long)t,
					           (long long)r, one[r], (long long)m, all[t * n + r]);
					same = 0;
				}
		}
		check(same, "cuda: %s", gpu_checks[3]);
		llm_cuda_weights_drop(gpu);
		free(x);
		free(all);
		free(one);
		free_weight(&b);
	}

	/* shapes only the generic kernel takes */
	{
		struct wbuf b;
		make_weight(&b, LLM_DTYPE_E4M3, 50, 200, 7, 50, 0);
		float *x = rand_x(5, 200, 0);
		double worst;
		int64_t bad = matmul_cmp(&b, x, 5, 200 * 0x1.0p-23, 0, &worst, NULL);
		if (bad)
			mm_fail("matmul E4M3 generic N 50 K 200 blocks 7x50 M 5: %lld over the bound", (long long)bad);
		check(!bad, "cuda: %s (worst %.3f)", gpu_checks[4], worst);
		llm_cuda_weights_drop(gpu);
		free(x);
		free_weight(&b);
	}
}

static void test_matmul_other(void)
{
	static const enum llm_dtype dts[] = { LLM_DTYPE_BF16, LLM_DTYPE_F16, LLM_DTYPE_F32 };
	int bad_total = 0;
	double worst_all = 0;
	for (size_t d = 0; d < 3; d++)
		for (int64_t m = 1; m <= 40; m += small ? 26 : 13) {
			struct wbuf b;
			make_weight(&b, dts[d], 100, 192, 0, 0, 0);
			float *x = rand_x(m, 192, 0);
			double worst;
			int64_t bad = matmul_cmp(&b, x, m, dts[d] == LLM_DTYPE_BF16 ? 0x1.0p-7 : 192 * 0x1.0p-23, 0,
			                         &worst, NULL);
			if (bad) {
				mm_fail("matmul %s N 100 K 192 M %lld: %lld over the bound", llm_dtype_name(dts[d]), (long long)m,
				        (long long)bad);
				bad_total++;
			}
			if (worst > worst_all)
				worst_all = worst;
			llm_cuda_weights_drop(gpu);
			free(x);
			free_weight(&b);
		}
	check(!bad_total, "cuda: %s (worst %.3f of the bound)", gpu_checks[5], worst_all);

	/* output straight into host memory, with a row stride */
	struct wbuf b;
	make_weight(&b, LLM_DTYPE_E4M3, 300, 128, 128, 128, 0);
	float *x = rand_x(3, 128, 0), *dx = dev_f32(x, 3 * 128);
	float ref[3 * 300], got[3 * 310];
	for (int i = 0; i < 3 * 310; i++)
		got[i] = -7.0f;
	cpu->ops->matmul(cpu, llm_view_f32(ref, 3, 300), llm_view_f32(x, 3, 128), &b.w);
	struct llm_view y = { got, LLM_DTYPE_F32, 3, 300, 310 };
	enum llm_status s = gpu->ops->matmul(gpu, y, llm_view_f32(dx, 3, 128), &b.w);
	int ok = s == LLM_OK;
	if (!ok)
		check_note("matmul into host memory: %s", llm_errmsg());
	for (int t = 0; t < 3 && ok; t++) {
		if (got[t * 310 + 305] != -7.0f) {
			check_note("matmul into host memory E4M3 N 300 K 128 M 3: wrote past the row, [%d, 305] is %.9g", t,
			           got[t * 310 + 305]);
			ok = 0;
		}
		for (int r = 0; r < 300 && ok; r++)
			if (fabsf(got[t * 310 + r] - ref[t * 300 + r]) > 1e-2f * (1 + fabsf(ref[t * 300 + r]))) {
				check_note("matmul into host memory E4M3 N 300 K 128 M 3: first bad [token %d, output %d] "
				           "expected %.9g got %.9g", t, r, ref[t * 300 + r], got[t * 310 + r]);
				ok = 0;
			}
	}
	check(ok, "cuda: %s", gpu_checks[6]);
	gpu->ops->release(gpu, dx);
	llm_cuda_weights_drop(gpu);
	free(x);
	free_weight(&b);
}

/* Compare a device result of N floats with a host reference. */
static int close_dev(const char *name, const float *d, const float *ref, size_t n, double atol, double rtol)
{
	float *h = malloc(n * sizeof(float));
	host_of(h, d, n);
	int ok = check_close(name, h, ref, n, atol, rtol);
	free(h);
	return ok;
}

static void test_rowwise(void)
{
	enum { T = 5, D = 576, H = 9, DH = 64, F = 1536, V = 300 };
	float *x = rand_x(T, D, 0), *y = rand_x(T, D, 0), out[T * D], xr[T * D];
	float *pr = malloc((size_t)T * F * sizeof(float)), *px = malloc((size_t)T * D * sizeof(float));
	int rok = 1;                     /* against the plain reference */
	struct wbuf nw;
	make_weight(&nw, LLM_DTYPE_BF16, 1, D, 0, 0, 0);
	float *dx = dev_f32(x, T * D), *dy = dev_f32(y, T * D), *dout = dev_f32(NULL, T * D);
	int ok = 1;
	/* rmsnorm */
	cpu->ops->rmsnorm(cpu, llm_view_f32(out, T, D), llm_view_f32(x, T, D), &nw.w, 1e-5f);
	ok &= gpu->ops->rmsnorm(gpu, llm_view_f32(dout, T, D), llm_view_f32(dx, T, D), &nw.w, 1e-5f) == LLM_OK;
	ok &= close_dev("rmsnorm", dout, out, T * D, 1e-6, 1e-5);
	rok &= llm_ref_rmsnorm(llm_view_f32(pr, T, D), llm_view_f32(x, T, D), &nw.w, 1e-5f) == LLM_OK;
	rok &= close_dev("rmsnorm against the plain reference", dout, pr, T * D, 1e-6, 1e-5);
	/* in place */
	ok &= gpu->ops->rmsnorm(gpu, llm_view_f32(dx, T, D), llm_view_f32(dx, T, D), &nw.w, 1e-5f) == LLM_OK;
	ok &= close_dev("rmsnorm in place", dx, out, T * D, 1e-6, 1e-5);
	/* fused add + rmsnorm against add then rmsnorm */
	gpu->ops->copy_in(gpu, dx, x, sizeof xr);
	memcpy(xr, x, sizeof xr);
	cpu->ops->add(cpu, llm_view_f32(xr, T, D), llm_view_f32(y, T, D));
	cpu->ops->rmsnorm(cpu, llm_view_f32(out, T, D), llm_view_f32(xr, T, D), &nw.w, 1e-5f);
	ok &= llm_cuda_add_rmsnorm(gpu, llm_view_f32(dout, T, D), llm_view_f32(dx, T, D), llm_view_f32(dy, T, D),
	                           &nw.w, 1e-5f) == LLM_OK;
	ok &= close_dev("add_rmsnorm: x", dx, xr, T * D, 0, 0);
	ok &= close_dev("add_rmsnorm: out", dout, out, T * D, 1e-6, 1e-5);
	memcpy(px, x, sizeof xr);
	rok &= llm_ref_add_rmsnorm(llm_view_f32(pr, T, D), llm_view_f32(px, T, D), llm_view_f32(y, T, D), &nw.w,
	                           1e-5f) == LLM_OK;
	rok &= close_dev("add_rmsnorm: x against the plain reference", dx, px, T * D, 0, 0);
	rok &= close_dev("add_rmsnorm: out against the plain reference", dout, pr, T * D, 1e-6, 1e-5);
	check(ok, "cuda: %s", gpu_checks[7]);

	/* rope: llama3-scaled frequencies (theta 500000, factor 8, low 1, high 4, 8192) */
	float inv[DH / 2];
	for (int j = 0; j < DH / 2; j++) {
		double f = pow(500000.0, -2.0 * j / DH), wl = 2 * M_PI / f;
		if (wl > 8192 / 1.0)
			f /= 8;
		else if (wl >= 8192 / 4.0) {
			double sm = (8192 / wl - 1) / (4 - 1);
			f = (1 - sm) * f / 8 + sm * f;
		}
		inv[j] = (float)f;
	}
	int32_t pos[T] = { 0, 1, 17, 4095, 131071 };
	float *q = rand_x(T, H * DH, 0), qr[T * H * DH];
	float *dq = dev_f32(q, T * H * DH);
	memcpy(qr, q, sizeof qr);
	cpu->ops->rope(cpu, llm_view_f32(qr, T, H * DH), pos, H, DH, inv);
	ok = gpu->ops->rope(gpu, llm_view_f32(dq, T, H * DH), pos, H, DH, inv) == LLM_OK;
	ok &= close_dev("rope", dq, qr, T * H * DH, 1e-5, 1e-5);
	memcpy(pr, q, sizeof qr);
	rok &= llm_ref_rope(llm_view_f32(pr, T, H * DH), pos, H, DH, inv) == LLM_OK;
	rok &= close_dev("rope against the plain reference", dq, pr, T * H * DH, 1e-5, 1e-5);
	check(ok, "cuda: %s", gpu_checks[8]);

	/* swiglu, add, gather, embed */
	float *g = rand_x(T, F, 0), *u = rand_x(T, F, 0), sw[T * F];
	for (int i = 0; i < T * F; i++)
		g[i] *= 12;              /* reach the tails of silu */
	float *dg = dev_f32(g, T * F), *du = dev_f32(u, T * F);
	cpu->ops->swiglu(cpu, llm_view_f32(sw, T, F), llm_view_f32(g, T, F), llm_view_f32(u, T, F));
	ok = gpu->ops->swiglu(gpu, llm_view_f32(dg, T, F), llm_view_f32(dg, T, F), llm_view_f32(du, T, F)) == LLM_OK;
	ok &= close_dev("swiglu", dg, sw, T * F, 1e-7, 4e-6);
	rok &= llm_ref_swiglu(llm_view_f32(pr, T, F), llm_view_f32(g, T, F), llm_view_f32(u, T, F)) == LLM_OK;
	rok &= close_dev("swiglu against the plain reference", dg, pr, T * F, 1e-7, 4e-6);
	gpu->ops->copy_in(gpu, dx, x, sizeof xr);
	memcpy(xr, x, sizeof xr);
	cpu->ops->add(cpu, llm_view_f32(xr, T, D), llm_view_f32(y, T, D));
	ok &= gpu->ops->add(gpu, llm_view_f32(dx, T, D), llm_view_f32(dy, T, D)) == LLM_OK;
	ok &= close_dev("add", dx, xr, T * D, 0, 0);
	memcpy(px, x, sizeof xr);
	rok &= llm_ref_add(llm_view_f32(px, T, D), llm_view_f32(y, T, D)) == LLM_OK;
	rok &= close_dev("add against the plain reference", dx, px, T * D, 0, 0);
	int32_t idx[3] = { 4, 0, 2 };
	cpu->ops->gather(cpu, llm_view_f32(out, 3, D), llm_view_f32(xr, T, D), idx);
	ok &= gpu->ops->gather(gpu, llm_view_f32(dout, 3, D), llm_view_f32(dx, T, D), idx) == LLM_OK;
	ok &= close_dev("gather", dout, out, 3 * D, 0, 0);
	rok &= llm_ref_gather(llm_view_f32(pr, 3, D), llm_view_f32(px, T, D), idx) == LLM_OK;
	rok &= close_dev("gather against the plain reference", dout, pr, 3 * D, 0, 0);
	static const enum llm_dtype edt[] = { LLM_DTYPE_BF16, LLM_DTYPE_E4M3, LLM_DTYPE_F32 };
	int32_t tok[T] = { 0, 299, 17, 17, 150 };
	for (int e = 0; e < 3; e++) {
		struct wbuf emb;
		make_weight(&emb, edt[e], V, D, 1, 128, 0);
		cpu->ops->embed(cpu, llm_view_f32(out, T, D), tok, &emb.w);
		ok &= gpu->ops->embed(gpu, llm_view_f32(dout, T, D), tok, &emb.w) == LLM_OK;
		ok &= close_dev("embed", dout, out, T * D, 0, 0);
		rok &= llm_ref_embed(llm_view_f32(pr, T, D), tok, &emb.w) == LLM_OK;
		rok &= close_dev("embed against the plain reference", dout, pr, T * D, 0, 0);
		llm_cuda_weights_drop(gpu);
		free_weight(&emb);
	}
	int32_t badtok = V;
	ok &= gpu->ops->embed(gpu, llm_view_f32(dout, 1, D), &badtok, &nw.w) == LLM_ERR_RANGE;
	check(ok, "cuda: %s", gpu_checks[9]);
	ref_rowwise_ok &= rok;

	void *bufs[] = { dx, dy, dout, dq, dg, du };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++)
		gpu->ops->release(gpu, bufs[i]);
	llm_cuda_weights_drop(gpu);
	free_weight(&nw);
	free(x);
	free(y);
	free(q);
	free(g);
	free(u);
	free(pr);
	free(px);
}

/* The same batches through both backends' caches: K/V bytes, then attention. */
static char kv_note[NOTE_MAX];   /* the first cache that differs (test_attention) */
static int attn_case(enum llm_dtype kvdt, int n_head, int n_kv_head, int d_head, int *kv_same)
{
	struct llm_kv_opts ko = { 2, n_kv_head, d_head, kvdt, 16, 64, 4, 320 };
	struct llm_kv kc, kg, kr;        /* kr: the plain reference's cache (host) */
	int ok = llm_kv_init(&kc, cpu, &ko) == LLM_OK && llm_kv_init(&kg, gpu, &ko) == LLM_OK
	         && llm_kv_init(&kr, cpu, &ko) == LLM_OK;
	if (!ok) {
		check_diag("kv init: %s", llm_errmsg());
		return 0;
	}
	int sa, sb, sc;
	llm_kv_seq_new(&kc, &sa);
	llm_kv_seq_new(&kc, &sb);
	llm_kv_seq_new(&kc, &sc);
	llm_kv_seq_new(&kg, &sa);
	llm_kv_seq_new(&kg, &sb);
	llm_kv_seq_new(&kg, &sc);
	llm_kv_seq_new(&kr, &sa);
	llm_kv_seq_new(&kr, &sb);
	llm_kv_seq_new(&kr, &sc);
	int dq = n_head * d_head, dkv = n_kv_head * d_head;
	/* step 1: prefill A (37) and B (5); step 2: decode A, a chunk of B (3),
	 * prefill C (20); steps 3 to 6: chunks of 60 of A and a decode of C, so
	 * A reaches position 277, 17 blocks into its table */
	struct { int n; int32_t seq[64], pos[64]; } steps[6] = { { 0 } };
	for (int i = 0; i < 37; i++, steps[0].n++) {
		steps[0].seq[steps[0].n] = sa;
		steps[0].pos[steps[0].n] = i;
	}
	for (int i = 0; i < 5; i++, steps[0].n++) {
		steps[0].seq[steps[0].n] = sb;
		steps[0].pos[steps[0].n] = i;
	}
	steps[1].seq[0] = sa;
	steps[1].pos[0] = 37;
	steps[1].n = 1;
	for (int i = 0; i < 3; i++, steps[1].n++) {
		steps[1].seq[steps[1].n] = sb;
		steps[1].pos[steps[1].n] = 5 + i;
	}
	for (int i = 0; i < 20; i++, steps[1].n++) {
		steps[1].seq[steps[1].n] = sc;
		steps[1].pos[steps[1].n] = i;
	}
	for (int s = 2; s < 6; s++) {
		for (int i = 0; i < 60; i++, steps[s].n++) {
			steps[s].seq[steps[s].n] = sa;
			steps[s].pos[steps[s].n] = 38 + 60 * (s - 2) + i;
		}
		steps[s].seq[steps[s].n] = sc;
		steps[s].pos[steps[s].n++] = 20 + s - 2;
	}
	int32_t tok[64] = { 0 };
	for (int s = 0; s < 6 && ok; s++) {
		int n = steps[s].n;
		struct llm_batch b = { n, tok, steps[s].pos, steps[s].seq, NULL, NULL };
		ok &= llm_kv_prepare(&kc, &b) == LLM_OK && llm_kv_prepare(&kg, &b) == LLM_OK
		      && llm_kv_prepare(&kr, &b) == LLM_OK;
		float *q = rand_x(n, dq, 0), *k = rand_x(n, dkv, 0), *v = rand_x(n, dkv, 0);
		float *dqb = dev_f32(q, (size_t)n * dq), *dk = dev_f32(k, (size_t)n * dkv), *dv = dev_f32(v, (size_t)n * dkv);
		float *ref = malloc((size_t)n * dq * sizeof(float)), *dout = dev_f32(NULL, (size_t)n * dq);
		float *pref = malloc((size_t)n * dq * sizeof(float));
		for (int l = 0; l < 2 && ok; l++) {
			ok &= cpu->ops->kv_store(cpu, &kc, l, &b, llm_view_f32(k, n, dkv), llm_view_f32(v, n, dkv)) == LLM_OK;
			ok &= gpu->ops->kv_store(gpu, &kg, l, &b, llm_view_f32(dk, n, dkv), llm_view_f32(dv, n, dkv)) == LLM_OK;
			ok &= cpu->ops->attention(cpu, llm_view_f32(ref, n, dq), llm_view_f32(q, n, dq), &kc, l, &b, n_head) == LLM_OK;
			ok &= gpu->ops->attention(gpu, llm_view_f32(dout, n, dq), llm_view_f32(dqb, n, dq), &kg, l, &b, n_head) == LLM_OK;
			if (!ok)
				check_diag("attention: %s", llm_errmsg());
			char name[96];
			snprintf(name, sizeof name, "attention %s %d/%d heads d %d step %d layer %d",
			         llm_dtype_name(kvdt), n_head, n_kv_head, d_head, s, l);
			ok &= close_dev(name, dout, ref, (size_t)n * dq, 1e-5, 1e-4);
			/* the plain reference: its own store, then its attention */
			int rok = llm_ref_kv_store(&kr, l, &b, llm_view_f32(k, n, dkv), llm_view_f32(v, n, dkv)) == LLM_OK
			          && llm_ref_attention(llm_view_f32(pref, n, dq), llm_view_f32(q, n, dq), &kr, l, &b,
			                               n_head) == LLM_OK;
			if (!rok)
				check_diag("plain reference: %s", llm_errmsg());
			snprintf(name, sizeof name, "attention %s %d/%d heads d %d step %d layer %d, plain reference",
			         llm_dtype_name(kvdt), n_head, n_kv_head, d_head, s, l);
			ref_attn_ok &= rok && close_dev(name, dout, pref, (size_t)n * dq, 1e-5, 1e-4);
		}
		free(q);
		free(k);
		free(v);
		free(ref);
		free(pref);
		gpu->ops->release(gpu, dqb);
		gpu->ops->release(gpu, dk);
		gpu->ops->release(gpu, dv);
		gpu->ops->release(gpu, dout);
	}
	/* the caches: same block assignment on both sides, so the same bytes */
	size_t bytes = (size_t)ko.n_layer * (size_t)ko.n_block * (size_t)ko.block_size * (size_t)dkv * kc.elt;
	char *hk = malloc(bytes), *hv = malloc(bytes);
	llm_cuda_copy_out(gpu, hk, kg.k, bytes);
	llm_cuda_copy_out(gpu, hv, kg.v, bytes);
	if (memcmp(hk, kc.k, bytes) || memcmp(hv, kc.v, bytes)) {
		int kd = memcmp(hk, kc.k, bytes) != 0;
		const char *g = kd ? hk : hv, *c = kd ? (const char *)kc.k : (const char *)kc.v;
		size_t at = 0;
		while (at < bytes && g[at] == c[at])
			at++;
		if (!kv_note[0])
			snprintf(kv_note, NOTE_MAX, "kv_store %s %d/%d heads d %d: the %s cache differs from the CPU's from "
			         "byte %zu of %zu (element %zu, expected byte 0x%02x got 0x%02x)", llm_dtype_name(kvdt), n_head,
			         n_kv_head, d_head, kd ? "K" : "V", at, bytes, at / kc.elt, (unsigned char)c[at],
			         (unsigned char)g[at]);
		*kv_same = 0;
	}
	if (memcmp(hk, kr.k, bytes) || memcmp(hv, kr.v, bytes)) {
		check_diag("kv_store %s %d/%d heads d %d: the cache differs from the plain reference's",
		           llm_dtype_name(kvdt), n_head, n_kv_head, d_head);
		ref_attn_ok = 0;
	}
	if (kg.ks) {              /* fp8: the scales, one f32 per (token, head) */
		size_t sb = bytes / (size_t)d_head * sizeof(float);
		float *hs = malloc(sb), *hvs = malloc(sb);
		llm_cuda_copy_out(gpu, hs, kg.ks, sb);
		llm_cuda_copy_out(gpu, hvs, kg.vs, sb);
		if (memcmp(hs, kc.ks, sb) || memcmp(hvs, kc.vs, sb)) {
			int kd = memcmp(hs, kc.ks, sb) != 0;
			const float *g = kd ? hs : hvs, *c = kd ? kc.ks : kc.vs;
			size_t at = 0;
			while (at < sb / sizeof(float) && llm_f32_bits(g[at]) == llm_f32_bits(c[at]))
				at++;
			if (!kv_note[0])
				snprintf(kv_note, NOTE_MAX, "kv_store fp8 %d/%d heads d %d: the %s scales differ from the CPU's at "
				         "scale %zu: expected %.9g got %.9g", n_head, n_kv_head, d_head, kd ? "K" : "V", at, c[at],
				         g[at]);
			*kv_same = 0;
		}
		free(hs);
		free(hvs);
	}
	free(hk);
	free(hv);
	llm_kv_free(&kc);
	llm_kv_free(&kg);
	llm_kv_free(&kr);
	return ok;
}

static void test_attention(void)
{
	static const struct { int h, kvh, d; } cases[] = { { 8, 4, 8 }, { 9, 3, 64 }, { 8, 2, 128 }, { 4, 4, 96 } };
	int ok = 1, kv_same = 1;
	static const enum llm_dtype kdt[3] = { LLM_DTYPE_F32, LLM_DTYPE_BF16, LLM_DTYPE_E4M3 };
	for (int dt = 0; dt < 3; dt++)
		for (size_t i = small ? 1 : 0; i < (small ? 3 : sizeof cases / sizeof *cases); i++)
			ok &= attn_case(kdt[dt], cases[i].h, cases[i].kvh, cases[i].d, &kv_same);
	check(ok, "cuda: %s", gpu_checks[11]);     /* its note: the first comparison that failed */
	if (kv_note[0])
		check_note("%s", kv_note);
	check(kv_same, "cuda: %s", gpu_checks[10]);
}

static void test_argmax(void)
{
	enum { R = 3, NV = 49152 };
	float *l = rand_x(R, NV, 0);
	uint8_t *seen = calloc(R * NV, 1);
	l[0 * NV + 777] = 5.0f;                 /* row 0: a clear winner */
	l[1 * NV + 100] = l[1 * NV + 40000] = 4.0f;   /* row 1: a tie: the lowest id */
	l[2 * NV + 5] = 6.0f;                   /* row 2: penalized below the runner-up */
	l[2 * NV + 9] = 3.5f;
	seen[2 * NV + 5] = 1;
	float *dl = dev_f32(l, R * NV);
	uint8_t *dseen;
	gpu->ops->alloc(gpu, R * NV, (void **)&dseen);
	gpu->ops->copy_in(gpu, dseen, seen, R * NV);
	int32_t ids[R] = { -1, -1, -1 };
	int ok = llm_cuda_argmax(gpu, ids, llm_view_f32(dl, R, NV), dseen, 2.0f) == LLM_OK;
	check(ok && ids[0] == 777 && ids[1] == 100 && ids[2] == 9,
	      "cuda: %s (got %d %d %d, want 777 100 9)", gpu_checks[12], ids[0], ids[1], ids[2]);
	gpu->ops->release(gpu, dl);
	gpu->ops->release(gpu, dseen);
	free(l);
	free(seen);
}

/* A device buffer's N bytes equal host REF's, else a diagnostic. */
static int same_dev_bytes(const char *what, const void *d, const void *ref, size_t n)
{
	char *h = malloc(n);
	int same = !llm_cuda_copy_out(gpu, h, d, n) && !memcmp(h, ref, n);
	if (!same) {
		size_t at = 0;
		while (at < n && h[at] == ((const char *)ref)[at])
			at++;
		check_diag("rope_store: %s differs from byte %zu of %zu", what, at, n);
		if (at + 4 <= n && at % 4 == 0 && strchr("qk", what[0]) && !what[1])
			check_note("rope_store: %s differs from the separate ops at float %zu of %zu: expected %.9g got %.9g",
			           what, at / 4, n / 4, ((const float *)ref)[at / 4], ((const float *)h)[at / 4]);
		else
			check_note("rope_store: %s differs from the separate ops from byte %zu of %zu", what, at, n);
	}
	free(h);
	return same;
}

/* Two GPU caches, the same batches: one through rope, rope and kv_store,
 * the other through rope_store; q, k and both caches compared. */
static int rope_store_case(enum llm_dtype kvdt, int n_head, int n_kv_head, int d_head)
{
	struct llm_kv_opts ko = { 2, n_kv_head, d_head, kvdt, 16, 64, 4, 320 };
	struct llm_kv ka, kb;
	if (llm_kv_init(&ka, gpu, &ko) || llm_kv_init(&kb, gpu, &ko)) {
		check_diag("kv init: %s", llm_errmsg());
		return 0;
	}
	int sa, sb, ok = 1, dq = n_head * d_head, dkv = n_kv_head * d_head, half = d_head / 2;
	llm_kv_seq_new(&ka, &sa);
	llm_kv_seq_new(&ka, &sb);
	llm_kv_seq_new(&kb, &sa);
	llm_kv_seq_new(&kb, &sb);
	float *freq = malloc((size_t)half * sizeof *freq);
	for (int j = 0; j < half; j++)
		freq[j] = powf(10000.0f, -2.0f * (float)j / (float)d_head);
	/* step 0: prefill A (21) and B (5); step 1: one decode token each */
	int32_t seq[26], pos[26], tok[26] = { 0 };
	for (int st = 0; st < 2 && ok; st++) {
		int n = 0;
		for (int i = 0; i < (st ? 1 : 21); i++, n++) {
			seq[n] = sa;
			pos[n] = st ? 21 : i;
		}
		for (int i = 0; i < (st ? 1 : 5); i++, n++) {
			seq[n] = sb;
			pos[n] = st ? 5 : i;
		}
		struct llm_batch b = { n, tok, pos, seq, NULL, NULL };
		ok &= llm_kv_prepare(&ka, &b) == LLM_OK && llm_kv_prepare(&kb, &b) == LLM_OK;
		float *q = rand_x(n, dq, 0), *k = rand_x(n, dkv, 0), *v = rand_x(n, dkv, 0);
		float *q1 = dev_f32(q, (size_t)n * dq), *k1 = dev_f32(k, (size_t)n * dkv);
		float *q2 = dev_f32(q, (size_t)n * dq), *k2 = dev_f32(k, (size_t)n * dkv), *dv = dev_f32(v, (size_t)n * dkv);
		for (int l = 0; l < 2 && ok; l++) {
			ok &= gpu->ops->rope(gpu, llm_view_f32(q1, n, dq), pos, n_head, d_head, freq) == LLM_OK
			      && gpu->ops->rope(gpu, llm_view_f32(k1, n, dkv), pos, n_kv_head, d_head, freq) == LLM_OK
			      && gpu->ops->kv_store(gpu, &ka, l, &b, llm_view_f32(k1, n, dkv), llm_view_f32(dv, n, dkv)) == LLM_OK;
			ok &= gpu->ops->rope_store(gpu, llm_view_f32(q2, n, dq), llm_view_f32(k2, n, dkv),
			                           llm_view_f32(dv, n, dkv), &kb, l, &b, n_head, n_kv_head, d_head,
			                           freq) == LLM_OK;
			if (!ok)
				check_diag("rope_store: %s", llm_errmsg());
		}
		float *h1 = malloc((size_t)n * dq * sizeof(float));
		host_of(h1, q1, (size_t)n * dq);
		ok &= same_dev_bytes("q", q2, h1, (size_t)n * dq * sizeof(float));
		host_of(h1, k1, (size_t)n * dkv);
		ok &= same_dev_bytes("k", k2, h1, (size_t)n * dkv * sizeof(float));
		free(h1);
		free(q);
		free(k);
		free(v);
		gpu->ops->release(gpu, q1);
		gpu->ops->release(gpu, k1);
		gpu->ops->release(gpu, q2);
		gpu->ops->release(gpu, k2);
		gpu->ops->release(gpu, dv);
	}
	size_t bytes = (size_t)ko.n_layer * (size_t)ko.n_block * (size_t)ko.block_size * (size_t)dkv * ka.elt;
	char *h = malloc(bytes);
	ok &= !llm_cuda_copy_out(gpu, h, ka.k, bytes) && same_dev_bytes("the K cache", kb.k, h, bytes);
	ok &= !llm_cuda_copy_out(gpu, h, ka.v, bytes) && same_dev_bytes("the V cache", kb.v, h, bytes);
	if (ka.ks) {
		size_t sbytes = bytes / (size_t)d_head * sizeof(float);
		char *hs = malloc(sbytes);
		ok &= !llm_cuda_copy_out(gpu, hs, ka.ks, sbytes) && same_dev_bytes("the K scales", kb.ks, hs, sbytes);
		ok &= !llm_cuda_copy_out(gpu, hs, ka.vs, sbytes) && same_dev_bytes("the V scales", kb.vs, hs, sbytes);
		free(hs);
	}
	if (!ok) {
		check_diag("rope_store %s %d/%d heads d %d", llm_dtype_name(kvdt), n_head, n_kv_head, d_head);
		check_note("rope_store %s %d/%d heads d %d", llm_dtype_name(kvdt), n_head, n_kv_head, d_head);
	}
	free(h);
	free(freq);
	llm_kv_free(&ka);
	llm_kv_free(&kb);
	return ok;
}

static void test_rope_store(void)
{
	static const struct { int h, kvh, d; } cases[] = { { 8, 4, 64 }, { 6, 2, 8 }, { 4, 4, 96 }, { 2, 1, 128 } };
	static const enum llm_dtype kdt[3] = { LLM_DTYPE_F32, LLM_DTYPE_BF16, LLM_DTYPE_E4M3 };
	int ok = gpu->ops->rope_store != NULL;
	for (int dt = 0; dt < 3 && ok; dt++)
		for (size_t i = 0; i < (small ? 1 : sizeof cases / sizeof *cases); i++)
			ok &= rope_store_case(kdt[dt], cases[i].h, cases[i].kvh, cases[i].d);
	check(ok, "cuda: %s", gpu_checks[20]);
}

/* matmul_add against matmul into a buffer then add, on the GPU, bit for
 * bit: each E4M3 configuration forced in turn (where it can run the
 * weight), BF16 (cuBLAS, then the add kernel), F16 and F32 (generic); the
 * residual rows XS floats apart, the columns past N left alone. */
static void test_matmul_add(void)
{
	static const enum llm_dtype dts[] = { LLM_DTYPE_E4M3, LLM_DTYPE_BF16, LLM_DTYPE_F16, LLM_DTYPE_F32 };
	static const int64_t ms[] = { 1, 5, 8, 17, 130 };
	const int64_t n = 200, k = 256, xs = n + 3;
	int ok = gpu->ops->matmul_add != NULL, cases = 0;
	for (size_t d = 0; d < sizeof dts / sizeof *dts && ok; d++) {
		int n_cfg = dts[d] == LLM_DTYPE_E4M3 ? LLM_GEMM_CFG_COUNT : 1;
		for (int cfg = 0; cfg < n_cfg && ok; cfg++)
			for (size_t mi = 0; mi < sizeof ms / sizeof *ms && ok; mi += small ? 3 : 1) {
				int64_t m = ms[mi];
				struct wbuf b;
				make_weight(&b, dts[d], n, k, 128, 128, 0);
				float *a = rand_x(m, k, 0), *r = rand_x(m, xs, 0);
				float *h1 = malloc((size_t)(m * xs) * sizeof(float)), *h2 = malloc((size_t)(m * xs) * sizeof(float));
				float *da = dev_f32(a, (size_t)(m * k)), *dy = dev_f32(NULL, (size_t)(m * n));
				float *r1 = dev_f32(r, (size_t)(m * xs)), *r2 = dev_f32(r, (size_t)(m * xs));
				struct llm_view v1 = { r1, LLM_DTYPE_F32, m, n, xs }, v2 = { r2, LLM_DTYPE_F32, m, n, xs };
				llm_cuda_gemm_force(gpu, dts[d] == LLM_DTYPE_E4M3 ? cfg : -1);
				if (gpu->ops->matmul(gpu, llm_view_f32(dy, m, n), llm_view_f32(da, m, k), &b.w)
				    || gpu->ops->add(gpu, v1, llm_view_f32(dy, m, n))
				    || gpu->ops->matmul_add(gpu, v2, llm_view_f32(da, m, k), &b.w) || gpu->ops->sync(gpu)) {
					check_diag("matmul_add %s: %s", llm_dtype_name(dts[d]), llm_errmsg());
					check_note("matmul_add %s cfg %d M %lld: %s", llm_dtype_name(dts[d]), cfg, (long long)m,
					           llm_errmsg());
					ok = 0;
				} else {
					host_of(h1, r1, (size_t)(m * xs));
					host_of(h2, r2, (size_t)(m * xs));
					int same = !memcmp(h1, h2, (size_t)(m * xs) * sizeof(float));
					for (int64_t t = 0; t < m && same; t++)
						for (int64_t c = n; c < xs; c++)
							same &= llm_f32_bits(h2[t * xs + c]) == llm_f32_bits(r[t * xs + c]);
					if (!same) {
						int64_t at = 0;
						while (at < m * xs && llm_f32_bits(h1[at]) == llm_f32_bits(h2[at]))
							at++;
						const char *cn = dts[d] == LLM_DTYPE_E4M3 ? llm_cuda_gemm_cfg_name(cfg) : "-";
						check_diag("matmul_add %s %s M %lld: differs from matmul then add", llm_dtype_name(dts[d]),
						           cn, (long long)m);
						if (at < m * xs)
							check_note("matmul_add %s %s N %lld K %lld M %lld (residual stride %lld): first "
							           "differing [token %lld, column %lld] expected (matmul then add) %.9g got "
							           "%.9g%s", llm_dtype_name(dts[d]), cn, (long long)n, (long long)k,
							           (long long)m, (long long)xs, (long long)(at / xs), (long long)(at % xs),
							           h1[at], h2[at], at % xs >= n ? " (a column past N: must be left alone)" : "");
					}
					ok &= same;
				}
				llm_cuda_gemm_force(gpu, -1);
				gpu->ops->release(gpu, da);
				gpu->ops->release(gpu, dy);
				gpu->ops->release(gpu, r1);
				gpu->ops->release(gpu, r2);
				llm_cuda_weights_drop(gpu);
				free(a), free(r), free(h1), free(h2);
				free_weight(&b);
				cases++;
			}
	}
	check(ok, "cuda: %s (%d cases)", gpu_checks[22], cases);
}

/* One backend's side of the graph check: the model's cache, scratch and
 * device logits. */
struct gside {
	struct llm_backend *be;
	struct llm_kv kv;
	struct llm_scratch s;
	float *dlog;
};

static int gside_open(struct gside *g, struct llm_model *m, int graphs)
{
	memset(g, 0, sizeof *g);
	struct llm_kv_opts ko = { m->layer_end - m->layer_begin, m->n_kv_head_loc, m->cfg.d_head, LLM_DTYPE_F32,
	                          16, 64, 4, 128 };
	if (llm_backend_open("cuda", NULL, &g->be) || llm_model_check_backend(m, g->be) || llm_kv_init(&g->kv, g->be, &ko)
	    || llm_scratch_init(&g->s, m, g->be, 32, 32)
	    || g->be->ops->alloc(g->be, (size_t)32 * (size_t)m->cfg.n_vocab * sizeof(float), (void **)&g->dlog)) {
		check_diag("graphs: open: %s", llm_errmsg());
		return 0;
	}
	llm_cuda_graphs(g->be, graphs);
	return 1;
}

static void gside_close(struct gside *g)
{
	if (!g->be)
		return;
	if (g->dlog)
		g->be->ops->release(g->be, g->dlog);
	llm_scratch_free(&g->s);
	if (g->kv.ref)
		llm_kv_free(&g->kv);
	llm_backend_close(g->be);
}

/* The first logit of N (rows of NV) where GOT's bits differ from WANT's,
 * into NOTE (NOTE_MAX bytes) unless it holds a note already. */
static void first_diff(char *note, const char *what, const float *want, const float *got, size_t n, int nv)
{
	size_t at = 0;
	while (at < n && llm_f32_bits(got[at]) == llm_f32_bits(want[at]))
		at++;
	if (at < n && !note[0])
		snprintf(note, NOTE_MAX, "%s: first differing logit [row %zu, id %zu] expected %.9g got %.9g", what,
		         at / (size_t)nv, at % (size_t)nv, want[at], got[at]);
}

static void test_graphs(void)
{
	const char *models = test_models_dir();
	char dir[1100];
	if (!models) {
		check_skip("no models in $LLM_TEST_MODELS", "cuda: %s", gpu_checks[21]);
		check_skip("no models in $LLM_TEST_MODELS", "cuda: %s", gpu_checks[23]);
		return;
	}
	snprintf(dir, sizeof dir, "%s/stories260K", models);
	struct llm_model m;
	if (llm_model_open(&m, dir)) {
		check_skip("no stories260K", "cuda: %s (%s)", gpu_checks[21], llm_errmsg());
		check_skip("no stories260K", "cuda: %s", gpu_checks[23]);
		return;
	}
	/* graphs on; graphs off; graphs off and the ops table without
	 * matmul_add (the forward then calls matmul and add) */
	struct gside gg = { 0 }, ge = { 0 }, gn = { 0 };
	static struct llm_backend_ops nofuse;
	char gnote[NOTE_MAX] = "", fnote[NOTE_MAX] = "";   /* the first difference of each check */
	int ok = gside_open(&gg, &m, 1) && gside_open(&ge, &m, 0) && gside_open(&gn, &m, 0), nv = m.cfg.n_vocab;
	int same = 1, steps = 0, fused = ok && ge.be->ops->matmul_add, fused_same = 1;
	if (ok) {
		nofuse = *gn.be->ops;
		nofuse.matmul_add = NULL;
		gn.be->ops = &nofuse;
	}
	int seq[3];
	for (int i = 0; i < 3 && ok; i++)
		ok = !llm_kv_seq_new(&gg.kv, &seq[i]) && !llm_kv_seq_new(&ge.kv, &seq[i]) && !llm_kv_seq_new(&gn.kv, &seq[i]);
	/* the prompts, one batch (not a decode step: run op by op on both) */
	int32_t tok[15], pos[15], sq[15], last[3];
	int8_t want[15];
	for (int i = 0; i < 15; i++) {
		tok[i] = 1 + (i * 37) % (nv - 1);
		pos[i] = i % 5;
		sq[i] = seq[i / 5];
		want[i] = i % 5 == 4;
	}
	float *hl = malloc((size_t)32 * nv * sizeof(float)), *he = malloc((size_t)32 * nv * sizeof(float));
	float *hn = malloc((size_t)32 * nv * sizeof(float));
	int n_out = 0;
	struct llm_batch pb = { 15, tok, pos, sq, want, NULL };
	ok = ok && !llm_model_forward(&m, gg.be, &gg.kv, &gg.s, &pb, gg.dlog, &n_out)
	     && !llm_model_forward(&m, gn.be, &gn.kv, &gn.s, &pb, gn.dlog, &n_out)
	     && !llm_model_forward(&m, ge.be, &ge.kv, &ge.s, &pb, ge.dlog, &n_out) && n_out == 3;
	if (ok) {
		host_of(he, ge.dlog, (size_t)3 * nv);
		host_of(hn, gn.dlog, (size_t)3 * nv);
		if (memcmp(hn, he, (size_t)3 * nv * sizeof(float))) {
			check_diag("matmul_add: the prompts' logits differ from matmul then add");
			first_diff(fnote, "matmul_add in the forward: the prompts' logits (stories260K)", he, hn, (size_t)3 * nv,
			           nv);
			fused_same = 0;
		}
		for (int i = 0; i < 3; i++)
			last[i] = llm_argmax(he + (size_t)i * nv, nv);
	}
	/* decode: 3 sequences, then 2, then 3 again, ...: each size runs op by
	 * op once, is captured once, then replayed */
	static const int width[12] = { 3, 3, 3, 2, 2, 3, 2, 3, 3, 2, 2, 3 };
	int32_t p[3] = { 5, 5, 5 };
	for (int st = 0; st < 12 && ok; st++) {
		int n = width[st];
		for (int i = 0; i < n; i++) {
			tok[i] = last[i];
			pos[i] = p[i]++;
			sq[i] = seq[i];
		}
		struct llm_batch db = { n, tok, pos, sq, NULL, NULL };
		for (int i = 0; i < n; i++)
			want[i] = 1;
		db.logits = want;
		ok = !llm_model_forward(&m, gg.be, &gg.kv, &gg.s, &db, gg.dlog, &n_out) && n_out == n
		     && !llm_model_forward(&m, gn.be, &gn.kv, &gn.s, &db, gn.dlog, &n_out) && n_out == n
		     && !llm_model_forward(&m, ge.be, &ge.kv, &ge.s, &db, ge.dlog, &n_out) && n_out == n;
		if (!ok) {
			check_diag("graphs: step %d: %s", st, llm_errmsg());
			break;
		}
		host_of(hl, gg.dlog, (size_t)n * nv);
		host_of(he, ge.dlog, (size_t)n * nv);
		if (memcmp(hl, he, (size_t)n * nv * sizeof(float))) {
			if (same) {
				char what[120];
				snprintf(what, sizeof what, "CUDA graphs: decode step %d (%d sequences), replayed against op by op", st,
				         n);
				check_diag("graphs: step %d (%d sequences): the logits differ from the op-by-op run", st, n);
				first_diff(gnote, what, he, hl, (size_t)n * nv, nv);
			}
			same = 0;
		}
		host_of(hn, gn.dlog, (size_t)n * nv);
		if (memcmp(hn, he, (size_t)n * nv * sizeof(float))) {
			if (fused_same) {
				char what[120];
				snprintf(what, sizeof what, "matmul_add in the forward: decode step %d (%d sequences)", st, n);
				check_diag("matmul_add: step %d (%d sequences): the logits differ from matmul then add", st, n);
				first_diff(fnote, what, he, hn, (size_t)n * nv, nv);
			}
			fused_same = 0;
		}
		for (int i = 0; i < n; i++)
			last[i] = llm_argmax(he + (size_t)i * nv, nv);
		steps++;
	}
	long cap = 0, rep = 0, redo = 0;
	if (gg.be)
		llm_cuda_graph_stats(gg.be, &cap, &rep, &redo);
	if (gnote[0])
		check_note("%s", gnote);
	check(ok && same && steps == 12 && cap == 2 && rep == 8 && redo == 0,
	      "cuda: %s (%d steps; captured %ld, replayed %ld, run again %ld)", gpu_checks[21], steps, cap, rep, redo);
	if (fnote[0])
		check_note("%s", fnote);
	check(ok && fused && fused_same && steps == 12, "cuda: %s (%d decode steps)", gpu_checks[23], steps);
	free(hl);
	free(he);
	free(hn);
	gside_close(&gg);
	gside_close(&ge);
	gside_close(&gn);
	llm_model_close(&m);
}

/* One parameter set of the sampler checks. */
struct sample_case {
	const char *name;
	struct llm_sample_params p;
	int n_hold;                  /* EOS-like ids held until min_tokens */
	int ties;                    /* logits on a coarse grid: many ties, -0 and +0 */
};

/* R rows, each its own request: STEPS draws, each accepted into both copies
 * of the row's sampler, so penalties and the hold change as they go. */
static void sample_case_run(const struct sample_case *sc, int *ids_ok, int *lp_ok, int *n_draws, char *ids_note,
                            char *lp_note)
{
	enum { R = 6, NV = 4099 };
	const int STEPS = small ? 6 : 40;
	static const struct llm_logit_bias bias[3] = { { 7, 3.5f }, { 7, 1.25f }, { 4000, -100.0f } };
	static const int32_t hold[2] = { 2, 3 };
	struct llm_sampler host[R], dev[R];
	struct llm_sample_row row[R];
	int32_t ids[R];
	float lp[R];
	float *l = malloc((size_t)R * NV * sizeof(float)), *dl = dev_f32(NULL, (size_t)R * NV);
	for (int r = 0; r < R; r++) {
		struct llm_sample_params p = sc->p;
		p.seed = 1000 + (uint64_t)r;
		if (p.n_bias) {
			p.bias = bias;
			p.n_bias = 3;
		}
		if (llm_sampler_init(&host[r], &p, NV) || llm_sampler_init(&dev[r], &p, NV)) {
			check(0, "sample %s: sampler: %s", sc->name, llm_errmsg());
			exit(1);
		}
		llm_sampler_hold(&host[r], hold, sc->n_hold);
		llm_sampler_hold(&dev[r], hold, sc->n_hold);
		int32_t prompt[5] = { 11, 12, 11, 4095, (int32_t)(r * 97) };
		llm_sampler_prompt(&host[r], prompt, 5);
		llm_sampler_prompt(&dev[r], prompt, 5);
	}
	for (int step = 0; step < STEPS; step++) {
		for (size_t i = 0; i < (size_t)R * NV; i++)
			l[i] = sc->ties ? (float)((int)(urand() * 9) - 4) * 0.5f : frand() * 6.0f;
		if (sc->ties)            /* -0 and +0 tie on the CPU: the lower id wins */
			for (int r = 0; r < R; r++)
				l[(size_t)r * NV + 5] = -0.0f;
		if (step % 3 == 0)       /* recent outputs strong, so the penalties decide */
			for (int r = 0; r < R; r++)
				for (int k = 0; k < dev[r].n_seen && k < 8; k++)
					l[(size_t)r * NV + dev[r].seen_id[k]] = 4.0f + (float)k * 0.25f;
		if (gpu->ops->copy_in(gpu, dl, l, (size_t)R * NV * sizeof(float))) {
			check(0, "sample: copy in: %s", llm_errmsg());
			exit(1);
		}
		for (int r = 0; r < R; r++)
			llm_sampler_row(&dev[r], &row[r]);
		if (gpu->ops->sample(gpu, llm_view_f32(dl, R, NV), row, ids, lp)) {
			check(0, "sample %s: %s", sc->name, llm_errmsg());
			*ids_ok = 0;
			break;
		}
		for (int r = 0; r < R; r++) {
			struct llm_sample_out so;
			if (llm_sampler_sample(&host[r], l + (size_t)r * NV, &so)) {
				check(0, "sample %s: the CPU sampler: %s", sc->name, llm_errmsg());
				exit(1);
			}
			(*n_draws)++;
			if (ids[r] != so.token) {
				if (*ids_ok) {
					check_diag("sample %s: step %d row %d: gpu id %d, cpu id %d", sc->name, step, r,
					           ids[r], so.token);
					if (!ids_note[0])
						snprintf(ids_note, NOTE_MAX, "sample %s (rows %d, vocabulary %d): step %d row %d: expected "
						         "id %d (cpu, logit %.9g) got %d (logit %.9g)", sc->name, R, NV, step, r, so.token,
						         l[(size_t)r * NV + so.token], ids[r],
						         ids[r] >= 0 && ids[r] < NV ? l[(size_t)r * NV + ids[r]] : NAN);
				}
				*ids_ok = 0;
			}
			int lp_same = sc->p.skip_logprob ? isnan(lp[r]) : fabsf(lp[r] - so.logprob) <= 1e-6f;
			if (!lp_same) {
				if (*lp_ok) {
					check_diag("sample %s: step %d row %d: gpu log-prob %.9g, cpu %.9g", sc->name, step, r,
					           lp[r], so.logprob);
					if (!lp_note[0])
						snprintf(lp_note, NOTE_MAX, "sample %s: step %d row %d, id %d: expected log-prob %.9g got "
						         "%.9g", sc->name, step, r, so.token, so.logprob, lp[r]);
				}
				*lp_ok = 0;
			}
			llm_sampler_accept(&host[r], so.token);
			llm_sampler_accept(&dev[r], so.token);
		}
	}
	for (int r = 0; r < R; r++) {
		llm_sampler_free(&host[r]);
		llm_sampler_free(&dev[r]);
	}
	gpu->ops->release(gpu, dl);
	free(l);
}

static void test_sample(void)
{
	static const struct sample_case greedy[] = {
		{ "greedy", { .top_p = 1, .repetition_penalty = 1 }, 0, 0 },
		{ "greedy ties", { .top_p = 1, .repetition_penalty = 1 }, 0, 1 },
		{ "greedy penalties biases hold", { .top_p = 1, .repetition_penalty = 1.3f, .frequency_penalty = 0.7f,
		  .presence_penalty = 0.4f, .n_bias = 1, .min_tokens = 10 }, 2, 0 },
		{ "greedy ties penalties", { .top_p = 1, .repetition_penalty = 2.0f, .frequency_penalty = -0.5f,
		  .skip_logprob = 1 }, 0, 1 },
	};
	static const struct sample_case sampled[] = {
		{ "t 1", { .temperature = 1, .top_p = 1, .repetition_penalty = 1 }, 0, 0 },
		{ "t 0.7 top-k 40", { .temperature = 0.7f, .top_k = 40, .top_p = 1, .repetition_penalty = 1 }, 0, 0 },
		{ "t 1.3 top-p 0.9", { .temperature = 1.3f, .top_p = 0.9f, .repetition_penalty = 1 }, 0, 0 },
		{ "t 1 min-p 0.05", { .temperature = 1, .top_p = 1, .min_p = 0.05f, .repetition_penalty = 1 }, 0, 0 },
		{ "t 0.05 ties top-k 1", { .temperature = 0.05f, .top_k = 1, .top_p = 1, .repetition_penalty = 1 }, 0, 1 },
		{ "t 0.8 ties top-p 0.5", { .temperature = 0.8f, .top_p = 0.5f, .repetition_penalty = 1,
		  .skip_logprob = 1 }, 0, 1 },
		{ "t 0.9 everything", { .temperature = 0.9f, .top_k = 200, .top_p = 0.95f, .min_p = 0.02f,
		  .repetition_penalty = 1.2f, .frequency_penalty = 0.3f, .presence_penalty = 0.2f, .n_bias = 1,
		  .min_tokens = 5 }, 2, 0 },
	};
	int g_ok = 1, s_ok = 1, lp_ok = 1, n_g = 0, n_s = 0;
	char g_note[NOTE_MAX] = "", s_note[NOTE_MAX] = "", lp_note[NOTE_MAX] = "";
	/* sanitize: the cases that reach every kernel (penalties, biases,
	 * the hold; top-k, top-p, min-p) */
	for (size_t i = small ? 2 : 0; i < (small ? 3 : sizeof greedy / sizeof *greedy); i++)
		sample_case_run(&greedy[i], &g_ok, &lp_ok, &n_g, g_note, lp_note);
	for (size_t i = small ? 6 : 0; i < sizeof sampled / sizeof *sampled; i++)
		sample_case_run(&sampled[i], &s_ok, &lp_ok, &n_s, s_note, lp_note);
	if (g_note[0])
		check_note("%s", g_note);
	check(g_ok, "cuda: %s (%d draws)", gpu_checks[16], n_g);
	if (s_note[0])
		check_note("%s", s_note);
	check(s_ok, "cuda: %s (%d draws)", gpu_checks[17], n_s);
	if (lp_note[0])
		check_note("%s", lp_note);
	check(lp_ok, "cuda: %s", gpu_checks[18]);

	/* non-finite logits: row 0 NaN at 17 and Inf at 30, row 1 -Inf at 3, row 2 fine */
	enum { NV = 1000 };
	float *l = rand_x(3, NV, 0);
	l[17] = NAN;
	l[30] = INFINITY;
	l[NV + 3] = -INFINITY;
	float *dl = dev_f32(l, 3 * NV);
	struct llm_sample_params p = { .temperature = 1, .top_p = 1, .repetition_penalty = 1 };
	struct llm_sampler sm;
	struct llm_sample_row row[3];
	int32_t ids[3];
	float lp[3];
	int ok = !llm_sampler_init(&sm, &p, NV);
	for (int r = 0; r < 3; r++)
		llm_sampler_row(&sm, &row[r]);
	ok = ok && !gpu->ops->sample(gpu, llm_view_f32(dl, 3, NV), row, ids, lp);
	ok = ok && ids[0] == -1 - 17 && isnan(lp[0]) && ids[1] == -1 - 3 && lp[1] == -INFINITY && ids[2] >= 0;
	struct llm_sample_out so;
	ok = ok && llm_sampler_sample(&sm, l, &so) == LLM_ERR_RANGE && strstr(llm_errmsg(), "at token 17")
	     && llm_sampler_sample(&sm, l + NV, &so) == LLM_ERR_RANGE;
	check(ok, "cuda: %s (ids %d %d %d)", gpu_checks[19], ids[0], ids[1], ids[2]);
	llm_sampler_free(&sm);
	gpu->ops->release(gpu, dl);
	free(l);
}

#ifdef LLM_NCCL
/* Device memory for the communicator: plain cudaMalloc and synchronous
 * copies, then a device-wide wait, so that the communicator's own stream
 * finds the bytes there. */
static void *nccl_dev(const void *h, size_t n)
{
	void *p = NULL;
	if (cudaMalloc(&p, n ? n : 1) != cudaSuccess || (h && cudaMemcpy(p, h, n, cudaMemcpyHostToDevice) != cudaSuccess)
	    || cudaDeviceSynchronize() != cudaSuccess) {
		check(0, "device buffer of %zu bytes: %s", n, cudaGetErrorString(cudaGetLastError()));
		exit(1);
	}
	return p;
}

static void nccl_put(void *d, const void *h, size_t n)
{
	if (cudaMemcpy(d, h, n, cudaMemcpyHostToDevice) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess)
		check_diag("cudaMemcpy to the device failed");
}

/* Whether device D holds the N bytes of host REF. */
static int nccl_same(const char *what, const void *d, const void *ref, size_t n)
{
	unsigned char *h = malloc(n ? n : 1);
	int ok = cudaMemcpy(h, d, n, cudaMemcpyDeviceToHost) == cudaSuccess && !memcmp(h, ref, n);
	if (!ok) {
		size_t i = 0;
		while (i < n && h[i] == ((const unsigned char *)ref)[i])
			i++;
		check_diag("%s: the device's bytes differ from the CPU communicator's from byte %zu of %zu", what, i, n);
		check_note("nccl %s: the device's bytes differ from the CPU communicator's from byte %zu of %zu", what, i, n);
	}
	free(h);
	return ok;
}

static void test_nccl(void)
{
	struct llm_comm *world = NULL, *nc = NULL, *sub = NULL;
	if (llm_comm_init(&world, NULL, NULL)) {
		check(0, "cuda: %s: %s", nccl_checks[0], llm_errmsg());
		return;
	}
	enum llm_status s = llm_comm_nccl_open(world, 0, &nc);
	check(!s && !strcmp(nc->ops->name, "nccl") && nc->size == world->size && nc->rank == world->rank,
	      "cuda: %s (%s, %d rank(s) from a %s world)", nccl_checks[0], s ? llm_errmsg() : "opened",
	      world->size, world->ops->name);
	if (s) {
		for (size_t i = 1; i < sizeof nccl_checks / sizeof *nccl_checks; i++)
			check_skip("the NCCL communicator did not open", "cuda: %s", nccl_checks[i]);
		llm_comm_finalize(world);
		return;
	}
	int R = world->size, me = world->rank, ok;
	enum { GUARD = 256 };

	/* all-reduce: an odd length, random values */
	size_t n = 1000003;
	float *h = rand_x(1, (int64_t)n, 0), *ref = malloc(n * sizeof *ref);
	memcpy(ref, h, n * sizeof *ref);
	float *d = nccl_dev(h, n * sizeof *h);
	ok = !llm_comm_allreduce_sum_f32(world, ref, n);
	ok &= !llm_comm_allreduce_sum_f32(nc, d, n) || (check_diag("%s", llm_errmsg()), 0);
	check(ok && nccl_same("all-reduce", d, ref, n * sizeof *ref), "cuda: %s", nccl_checks[1]);

	/* all-gather: an odd byte count per rank, guard bytes after the output */
	size_t nb = 4099 * 4 + 3, tot = (size_t)R * nb + GUARD;
	unsigned char *send = malloc(nb), *hr = malloc(tot);
	for (size_t i = 0; i < nb; i++)
		send[i] = (unsigned char)(urand() * 256);
	memset(hr, 0xa5, tot);
	unsigned char *dsend = nccl_dev(send, nb), *dr = nccl_dev(hr, tot);
	ok = !llm_comm_allgather(world, send, nb, hr);
	ok &= !llm_comm_allgather(nc, dsend, nb, dr) || (check_diag("%s", llm_errmsg()), 0);
	ok &= nccl_same("all-gather", dr, hr, tot);
	memset(hr, 0xa5, tot);                              /* in place: the part already there */
	memcpy(hr + (size_t)me * nb, send, nb);
	nccl_put(dr, hr, tot);
	ok &= !llm_comm_allgather(world, hr + (size_t)me * nb, nb, hr);
	ok &= !llm_comm_allgather(nc, dr + (size_t)me * nb, nb, dr) || (check_diag("%s", llm_errmsg()), 0);
	check(ok && nccl_same("all-gather in place", dr, hr, tot), "cuda: %s", nccl_checks[2]);
	cudaFree(dr);

	/* unequal parts: rank r gives (r + 1) * 1001 + 7 bytes */
	size_t *counts = malloc((size_t)R * sizeof *counts), vt = GUARD;
	for (int r = 0; r < R; r++)
		vt += counts[r] = (size_t)(r + 1) * 1001 + 7;
	unsigned char *hv = malloc(vt);
	memset(hv, 0x5a, vt);
	unsigned char *dv = nccl_dev(hv, vt);
	ok = !llm_comm_allgatherv(world, send, hv, counts);
	ok &= !llm_comm_allgatherv(nc, dsend, dv, counts) || (check_diag("%s", llm_errmsg()), 0);
	check(ok && nccl_same("all-gather of parts", dv, hv, vt), "cuda: %s", nccl_checks[3]);
	cudaFree(dv);

	/* the boundary: N = n_tok * d_model, each rank's slice in place, the
	 * rest of the buffer stale (NaN) until the gather */
	int64_t ne = 7 * 576 + 5, a, len;
	float *bx = rand_x(1, ne, 0), *bref = malloc((size_t)ne * sizeof *bref);
	llm_comm_slice(ne, R, me, &a, &len);
	for (int64_t i = 0; i < ne; i++)
		bref[i] = i >= a && i < a + len ? bx[i] : NAN;
	float *dx = nccl_dev(bref, (size_t)ne * sizeof *bref);
	ok = !llm_comm_allgather_slices(world, bref, ne);
	ok &= !llm_comm_allgather_slices(nc, dx, ne) || (check_diag("%s", llm_errmsg()), 0);
	ok &= R > 1 || !memcmp(bref, bx, (size_t)ne * sizeof *bx);   /* one rank: its slice is the whole */
	check(ok && nccl_same("boundary slices", dx, bref, (size_t)ne * sizeof *bref), "cuda: %s (N %lld, %d rank(s))",
	      nccl_checks[4], (long long)ne, R);
	cudaFree(dx);

	/* argmax pairs, broadcast from rank 0, barrier, a split and its all-reduce */
	enum { NP = 37 };
	float pv[NP];
	int32_t pi[NP];
	for (int i = 0; i < NP; i++)
		pv[i] = (float)(int)(urand() * 5), pi[i] = (int32_t)(urand() * 1000);
	float *dpv = nccl_dev(pv, sizeof pv);
	int32_t *dpi = nccl_dev(pi, sizeof pi);
	ok = !llm_comm_argmax_f32(world, pv, pi, NP);
	ok &= !llm_comm_argmax_f32(nc, dpv, dpi, NP) || (check_diag("%s", llm_errmsg()), 0);
	ok &= nccl_same("argmax values", dpv, pv, sizeof pv) && nccl_same("argmax indices", dpi, pi, sizeof pi);
	ok &= !llm_comm_bcast(world, send, nb, 0);
	ok &= !llm_comm_bcast(nc, dsend, nb, 0) || (check_diag("%s", llm_errmsg()), 0);
	ok &= nccl_same("broadcast", dsend, send, nb);
	ok &= !llm_comm_barrier(nc) || (check_diag("%s", llm_errmsg()), 0);
	s = llm_comm_split(nc, me % 2, me, &sub);
	ok &= (!s && sub->ops == nc->ops && sub->size == (R + 1 - me % 2) / 2) || (check_diag("split: %s", llm_errmsg()), 0);
	if (!s) {
		memcpy(ref, h, n * sizeof *ref);
		nccl_put(d, h, n * sizeof *h);
		ok &= !llm_comm_allreduce_sum_f32(sub, d, n) || (check_diag("%s", llm_errmsg()), 0);
		ok &= R > 1 || nccl_same("all-reduce on the split", d, ref, n * sizeof *ref);
	}
	check(ok, "cuda: %s", nccl_checks[5]);
	check(nc->stats.coll == world->stats.coll && nc->stats.n_coll == world->stats.n_coll,
	      "cuda: %s (%llu bytes in %llu calls; CPU %llu in %llu)", nccl_checks[6],
	      (unsigned long long)nc->stats.coll, (unsigned long long)nc->stats.n_coll,
	      (unsigned long long)world->stats.coll, (unsigned long long)world->stats.n_coll);

	llm_comm_free(sub);
	llm_comm_free(nc);
	cudaFree(d);
	cudaFree(dsend);
	cudaFree(dpv);
	cudaFree(dpi);
	free(h), free(ref), free(send), free(hr), free(counts), free(hv), free(bx), free(bref);
	llm_comm_finalize(world);
}
#endif

#endif /* LLM_CUDA */

/* The groups of the arguments into selected[] (none: every group;
 * "sanitize": every group but graphs and nccl, small); 0 on a bad name. */
static int select_groups(int argc, char **argv)
{
	for (int g = 0; g < G_COUNT; g++)
		selected[g] = argc < 2;
	for (int i = 1; i < argc; i++) {
		int g = 0;
		if (!strcmp(argv[i], "sanitize")) {
			small = 1;
			for (g = 0; g < G_COUNT; g++)
				selected[g] |= g != G_GRAPHS && g != G_NCCL;
			continue;
		}
		while (g < G_COUNT && strcmp(argv[i], group_names[g]))
			g++;
		if (g == G_COUNT)
			return 0;
		selected[g] = 1;
	}
	return 1;
}

int main(int argc, char **argv)
{
	struct llm_backend *be = NULL;
	if (!select_groups(argc, argv)) {
		fprintf(stderr, "usage: test_cuda [sanitize | GROUP...]; groups:");
		for (int g = 0; g < G_COUNT; g++)
			fprintf(stderr, " %s", group_names[g]);
		fprintf(stderr, "\n");
		return 2;
	}
	int gpu_groups = 0;         /* any group besides nccl */
	for (int g = 0; g < G_COUNT; g++)
		gpu_groups |= g != G_NCCL && selected[g];
	if (small)
		check_diag("the sanitize subset: every kernel on fewer shapes, batch sizes and draws (no graphs, no nccl)");
#ifndef LLM_CUDA
	if (!gpu_groups) {
		skip_nccl("built without CUDA support (make CUDA=0)");
		return check_done();
	}
	enum llm_status s = llm_backend_open("cuda", NULL, &be);
	check(s == LLM_ERR_UNSUPPORTED && strstr(llm_errmsg(), "built without CUDA support"),
	      "backend cuda in a CPU-only build is a clear error: %s", llm_errmsg());
	s = llm_backend_open("auto", NULL, &be);
	check(s == LLM_OK && !strcmp(be->ops->name, "cpu"), "backend auto opens the CPU in a CPU-only build");
	llm_backend_close(be);
	skip_all("built without CUDA support (make CUDA=0)");
	return check_done();
#else
	int n_dev = llm_cuda_device_count();
#ifdef LLM_NCCL
	if (!n_dev) {
		struct llm_comm *nc = NULL;
		enum llm_status ns = llm_comm_nccl_open(NULL, 0, &nc);
		check(ns == LLM_ERR_UNSUPPORTED && strstr(llm_errmsg(), "no CUDA device"),
		      "nccl: a communicator without a device is a clear error: %s", llm_errmsg());
	} else {
		struct llm_comm *nc = NULL;
		enum llm_status ns = llm_comm_nccl_open(NULL, 1023, &nc);
		check(ns == LLM_ERR_USAGE && strstr(llm_errmsg(), "device 1023"),
		      "nccl: a communicator on a device that is not there is a clear error: %s", llm_errmsg());
	}
	if (!gpu_groups) {
		if (n_dev)
			test_nccl();
		else
			skip_nccl("no CUDA device");
		return check_done();
	}
#else
	if (!gpu_groups) {
		skip_nccl("built without NCCL (make NCCL=0, or no nccl.h found)");
		return check_done();
	}
#endif
	enum llm_status s = llm_backend_open("auto", NULL, &be);
	check(s == LLM_OK && !strcmp(be->ops->name, n_dev ? "cuda" : "cpu"),
	      "backend auto opens %s with %d CUDA device(s) (%s)", n_dev ? "cuda" : "the CPU", n_dev,
	      be ? be->ops->name : llm_errmsg());
	llm_backend_close(be);
	be = NULL;
	if (!n_dev) {
		s = llm_backend_open("cuda", NULL, &be);
		check(s == LLM_ERR_UNSUPPORTED && strstr(llm_errmsg(), "no CUDA device"),
		      "backend cuda without a device is a clear error: %s", llm_errmsg());
		s = llm_backend_open("cuda:3", NULL, &be);
		check(s == LLM_ERR_UNSUPPORTED, "backend cuda:3 without a device: %s", llm_errmsg());
		skip_all("no CUDA device");
		return check_done();
	}
	s = llm_backend_open("cuda:1023", NULL, &be);
	check(s == LLM_ERR_USAGE, "backend cuda:1023 names a device that is not there: %s", llm_errmsg());
	/* the reference: an f32 CPU level (the avx512bf16 level rounds x and
	 * code * scale to bf16, which the table above does not assume) */
	struct llm_backend_opts co = LLM_BACKEND_OPTS_DEFAULT;
	co.isa = llm_cpu_isa_detect() < LLM_ISA_AVX512 ? llm_cpu_isa_detect() : LLM_ISA_AVX512;
	if (llm_backend_open("cpu", &co, &cpu) || llm_backend_open("cuda", NULL, &gpu)) {
		check(0, "open the cpu and cuda backends: %s", llm_errmsg());
		return check_done();
	}
	if (selected[G_MATMUL])
		test_matmul_e4m3();
	if (selected[G_MATMUL_OTHER])
		test_matmul_other();
	if (selected[G_ROWWISE])
		test_rowwise();
	if (selected[G_ATTENTION])
		test_attention();
	if (selected[G_ARGMAX])
		test_argmax();
	if (selected[G_SAMPLE])
		test_sample();
	if (selected[G_ROPE_STORE])
		test_rope_store();
	if (selected[G_MATMUL_ADD])
		test_matmul_add();
	if (selected[G_GRAPHS])
		test_graphs();
	if (selected[G_MATMUL] || selected[G_MATMUL_OTHER])
		check(!ref_matmul_bad, "cuda: %s (%d cases off)", gpu_checks[13], ref_matmul_bad);
	if (selected[G_ROWWISE])
		check(ref_rowwise_ok, "cuda: %s", gpu_checks[14]);
	if (selected[G_ATTENTION])
		check(ref_attn_ok, "cuda: %s", gpu_checks[15]);
	llm_backend_close(gpu);
	llm_backend_close(cpu);
	if (selected[G_NCCL]) {
#ifdef LLM_NCCL
		test_nccl();
#else
		skip_nccl("built without NCCL (make NCCL=0, or no nccl.h found)");
#endif
	}
	return check_done();
#endif
}
