/* kernels/bench_gemm.c: llm-bench gemm and the offline tile sweep: the
 * fused FP8 GEMM (gemm_fp8.cu) against cuBLAS BF16 on the linear shapes of
 * Llama 3.1 8B and 70B (llm_cuda.h documents both entry points).
 *
 * Method (/work/.library/device/METHOD.md): inputs are random (never
 * zeros), every launch is checked, timing is by CUDA events around each
 * run after a warm-up, the median is reported, and the weights rotate over
 * enough copies to exceed twice the L2 cache so the numbers are not L2
 * numbers. Both sides read bf16 activations (the GEMV configuration reads
 * f32, as the backend runs it) and the same weight values: cuBLAS gets the
 * E4M3 weights dequantized to bf16 by the same rounding the fused kernel
 * does in registers. Each row counts output elements (of the first 64 rows)
 * where the two disagree beyond 1e-2 |ref| + 1e-3 max|ref|. */
#include "llm_cuda.h"
#include "cuda_kernels.h"
#include "cuda_check.h"
#include "tune_table.h"

#include <cuda_runtime_api.h>
#include <cublas_v2.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include "banned.h"

const struct llm_gemm_shape llm_gemm_shapes_llama31[] = {
	{ "8B.q_o", 4096, 4096 },     { "8B.kv", 1024, 4096 },      { "8B.gate_up", 14336, 4096 },
	{ "8B.down", 4096, 14336 },   { "8B.lm_head", 128256, 4096 },
	{ "70B.q_o", 8192, 8192 },    { "70B.kv", 1024, 8192 },     { "70B.gate_up", 28672, 8192 },
	{ "70B.down", 8192, 28672 },  { "70B.lm_head", 128256, 8192 },
};
const size_t llm_gemm_n_shapes_llama31 = sizeof llm_gemm_shapes_llama31 / sizeof *llm_gemm_shapes_llama31;

static const int64_t default_m[] = { 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192 };

#define MAX_COPIES 8
#define FILL_CHUNK ((size_t)16 << 20)

struct bench {
	cudaStream_t st;
	cublasHandle_t blas;
	cudaEvent_t e0, e1;
	int ncopy;
	struct llm_cuda_mat w[MAX_COPIES];
	void *codes[MAX_COPIES], *wbf[MAX_COPIES];
	float *scale[MAX_COPIES];
	float *x32, *y8, *yb;
	uint16_t *xbf;
	float *times;
	int iters, warmup;
};

static uint64_t rs = 0x853c49e6748fea9bull;
static uint32_t rnd(void)
{
	rs ^= rs << 13;
	rs ^= rs >> 7;
	rs ^= rs << 17;
	return (uint32_t)(rs >> 32);
}

/* N bytes at device P from a repeating random host pattern. KIND 0: E4M3
 * codes (no NaN), 1: f32 in [-1, 1), 2: f32 block scales in [1e-4, 1e-2). */
static enum llm_status fill(void *p, size_t n, int kind)
{
	size_t chunk = n < FILL_CHUNK ? n : FILL_CHUNK;
	unsigned char *h = malloc(chunk);
	if (!h)
		return llm_fail(LLM_ERR_NOMEM, "bench gemm: out of memory");
	if (kind == 0) {
		for (size_t i = 0; i < chunk; i++) {
			h[i] = (unsigned char)rnd();
			if ((h[i] & 0x7f) == 0x7f)
				h[i] = 0x3f;
		}
	} else {
		float *f = (float *)h;
		for (size_t i = 0; i < chunk / 4; i++) {
			double u = rnd() * 0x1.0p-32;
			f[i] = kind == 1 ? (float)(2 * u - 1) : (float)(1e-4 + u * 1e-2);
		}
	}
	enum llm_status s = LLM_OK;
	for (size_t off = 0; off < n && !s; off += chunk) {
		size_t len = n - off < chunk ? n - off : chunk;
		cudaError_t e = cudaMemcpy((char *)p + off, h, len, cudaMemcpyHostToDevice);
		if (e != cudaSuccess)
			s = llm_fail(LLM_ERR_CUDA, "bench gemm: upload: %s", cudaGetErrorString(e));
	}
	free(h);
	return s;
}

static void bench_free_shape(struct bench *b)
{
	for (int i = 0; i < MAX_COPIES; i++) {
		if (b->codes[i])
			cudaFree(b->codes[i]);
		if (b->scale[i])
			cudaFree(b->scale[i]);
		if (b->wbf[i])
			cudaFree(b->wbf[i]);
		b->codes[i] = b->wbf[i] = NULL;
		b->scale[i] = NULL;
	}
	void **bufs[] = { (void **)&b->x32, (void **)&b->y8, (void **)&b->yb, (void **)&b->xbf };
	for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) {
		if (*bufs[i])
			cudaFree(*bufs[i]);
		*bufs[i] = NULL;
	}
}

/* Weights (ncopy copies, 128 x 128 block scales) and activation buffers for
 * SHAPE and up to MMAX rows. */
static enum llm_status bench_shape(struct bench *b, const struct llm_gemm_shape *sh, int64_t mmax, size_t l2)
{
	size_t wb = (size_t)sh->n * (size_t)sh->k;
	b->ncopy = (int)((2 * l2 + wb - 1) / wb);
	b->ncopy = b->ncopy < 1 ? 1 : b->ncopy > MAX_COPIES ? MAX_COPIES : b->ncopy;
	int64_t sr = (sh->n + 127) / 128, sc = (sh->k + 127) / 128;
	for (int i = 0; i < b->ncopy; i++) {
		LLM_CUDA_TRY(cudaMalloc(&b->codes[i], wb));
		LLM_CUDA_TRY(cudaMalloc((void **)&b->scale[i], (size_t)(sr * sc) * sizeof(float)));
		LLM_CUDA_TRY(cudaMalloc(&b->wbf[i], wb * 2));
		LLM_TRY(fill(b->codes[i], wb, 0));
		LLM_TRY(fill(b->scale[i], (size_t)(sr * sc) * sizeof(float), 2));
		struct llm_cuda_mat w = { LLM_DTYPE_E4M3, sh->n, sh->k, b->codes[i], b->scale[i], sr, sc, 128, 128 };
		b->w[i] = w;
		LLM_CUDA_TRY(llm_cuda_e4m3_to_bf16(b->wbf[i], &b->w[i], b->st));
	}
	LLM_CUDA_TRY(cudaMalloc((void **)&b->x32, (size_t)(mmax * sh->k) * 4));
	LLM_CUDA_TRY(cudaMalloc((void **)&b->xbf, (size_t)(mmax * sh->k) * 2));
	LLM_CUDA_TRY(cudaMalloc((void **)&b->y8, (size_t)(mmax * sh->n) * 4));
	LLM_CUDA_TRY(cudaMalloc((void **)&b->yb, (size_t)(mmax * sh->n) * 4));
	LLM_TRY(fill(b->x32, (size_t)(mmax * sh->k) * 4, 1));
	LLM_CUDA_TRY(llm_cuda_f32_to_bf16(b->xbf, b->x32, sh->k, mmax, sh->k, b->st));
	LLM_CUDA_TRY(cudaStreamSynchronize(b->st));
	return LLM_OK;
}

static enum llm_status run_fp8(struct bench *b, int cfg, int64_t m, int copy)
{
	const struct llm_cuda_mat *w = &b->w[copy];
	LLM_CUDA_TRY(llm_cuda_gemm_e4m3((enum llm_cuda_gemm_cfg)cfg, b->y8, w->rows, b->x32, w->cols, b->xbf,
	                                m, w, 0, b->st));
	return LLM_OK;
}

static enum llm_status run_bf16(struct bench *b, int64_t m, int copy)
{
	const struct llm_cuda_mat *w = &b->w[copy];
	const float one = 1.0f, zero = 0.0f;
	LLM_CUBLAS_TRY(cublasGemmEx(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)w->rows, (int)m, (int)w->cols,
	                            &one, b->wbf[copy], CUDA_R_16BF, (int)w->cols, b->xbf, CUDA_R_16BF,
	                            (int)w->cols, &zero, b->yb, CUDA_R_32F, (int)w->rows,
	                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	return LLM_OK;
}

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return x < y ? -1 : x > y;
}

/* Median microseconds of FP8 (cfg >= 0) or cuBLAS (cfg < 0) at M. */
static enum llm_status time_it(struct bench *b, int cfg, int64_t m, double *us)
{
	int n = b->warmup + b->iters;
	for (int i = 0; i < n; i++) {
		int copy = i % b->ncopy;
		LLM_CUDA_TRY(cudaEventRecord(b->e0, b->st));
		LLM_TRY(cfg >= 0 ? run_fp8(b, cfg, m, copy) : run_bf16(b, m, copy));
		LLM_CUDA_TRY(cudaEventRecord(b->e1, b->st));
		LLM_CUDA_TRY(cudaEventSynchronize(b->e1));
		float ms;
		LLM_CUDA_TRY(cudaEventElapsedTime(&ms, b->e0, b->e1));
		if (i >= b->warmup)
			b->times[i - b->warmup] = ms;
	}
	qsort(b->times, (size_t)b->iters, sizeof(float), cmp_float);
	*us = 1e3 * b->times[b->iters / 2];
	return LLM_OK;
}

/* Elements of the first 64 rows where FP8 and cuBLAS disagree. */
static enum llm_status count_wrong(struct bench *b, int cfg, int64_t m, int64_t *wrong)
{
	int64_t n = b->w[0].rows, rows = m < 64 ? m : 64;
	LLM_TRY(run_fp8(b, cfg, m, 0));
	LLM_TRY(run_bf16(b, m, 0));
	LLM_CUDA_TRY(cudaStreamSynchronize(b->st));
	float *g = malloc((size_t)(rows * n) * sizeof(float)), *r = malloc((size_t)(rows * n) * sizeof(float));
	if (!g || !r) {
		free(g);
		free(r);
		return llm_fail(LLM_ERR_NOMEM, "bench gemm: out of memory");
	}
	cudaError_t e = cudaMemcpy(g, b->y8, (size_t)(rows * n) * sizeof(float), cudaMemcpyDeviceToHost);
	if (e == cudaSuccess)
		e = cudaMemcpy(r, b->yb, (size_t)(rows * n) * sizeof(float), cudaMemcpyDeviceToHost);
	if (e != cudaSuccess) {
		free(g);
		free(r);
		return llm_fail(LLM_ERR_CUDA, "bench gemm: copy back: %s", cudaGetErrorString(e));
	}
	double mx = 0;
	for (int64_t i = 0; i < rows * n; i++)
		if (fabs(r[i]) > mx)
			mx = fabs(r[i]);
	*wrong = 0;
	for (int64_t i = 0; i < rows * n; i++)
		if (!(fabs((double)g[i] - r[i]) <= 1e-2 * fabs(r[i]) + 1e-3 * mx))
			(*wrong)++;
	free(g);
	free(r);
	return LLM_OK;
}

static enum llm_status bench_open(struct bench *b, const struct llm_gemm_bench_opts *o, size_t *l2,
                                  char *device, size_t name_len)
{
	int n = 0;
	memset(b, 0, sizeof *b);
	if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
		(void)cudaGetLastError();
		return llm_fail(LLM_ERR_UNSUPPORTED, "bench gemm: no CUDA device");
	}
	if (o->device < 0 || o->device >= n)
		return llm_fail(LLM_ERR_USAGE, "bench gemm: device %d of %d", o->device, n);
	struct cudaDeviceProp p;
	LLM_CUDA_TRY(cudaSetDevice(o->device));
	LLM_CUDA_TRY(cudaGetDeviceProperties(&p, o->device));
	if (device)
		snprintf(device, name_len, "%s (sm_%d%d, %d SMs)", p.name, p.major, p.minor, p.multiProcessorCount);
	*l2 = (size_t)p.l2CacheSize;
	b->warmup = o->warmup > 0 ? o->warmup : 5;
	b->iters = o->iters > 0 ? o->iters : 50;
	if (!(b->times = malloc((size_t)b->iters * sizeof(float))))
		return llm_fail(LLM_ERR_NOMEM, "bench gemm: out of memory");
	LLM_CUDA_TRY(cudaStreamCreateWithFlags(&b->st, cudaStreamNonBlocking));
	LLM_CUBLAS_TRY(cublasCreate(&b->blas));
	LLM_CUBLAS_TRY(cublasSetStream(b->blas, b->st));
	LLM_CUDA_TRY(cudaEventCreate(&b->e0));
	LLM_CUDA_TRY(cudaEventCreate(&b->e1));
	return LLM_OK;
}

static void bench_close(struct bench *b)
{
	bench_free_shape(b);
	if (b->blas)
		cublasDestroy(b->blas);
	if (b->e0)
		cudaEventDestroy(b->e0);
	if (b->e1)
		cudaEventDestroy(b->e1);
	if (b->st)
		cudaStreamDestroy(b->st);
	free(b->times);
}

static void lists(const struct llm_gemm_bench_opts *o, const struct llm_gemm_shape **sh, size_t *nsh,
                  const int64_t **m, size_t *nm, int64_t *mmax)
{
	*sh = o->shapes ? o->shapes : llm_gemm_shapes_llama31;
	*nsh = o->shapes ? o->n_shapes : llm_gemm_n_shapes_llama31;
	*m = o->m ? o->m : default_m;
	*nm = o->m ? o->n_m : sizeof default_m / sizeof *default_m;
	*mmax = 1;
	for (size_t i = 0; i < *nm; i++)
		if ((*m)[i] > *mmax)
			*mmax = (*m)[i];
}

enum llm_status llm_cuda_bench_gemm(const struct llm_gemm_bench_opts *o, struct llm_gemm_bench_row **rows,
                                    size_t *n_rows, char *device, size_t name_len)
{
	struct bench b;
	size_t l2, nsh, nm;
	const struct llm_gemm_shape *sh;
	const int64_t *ms;
	int64_t mmax;
	*rows = NULL;
	*n_rows = 0;
	lists(o, &sh, &nsh, &ms, &nm, &mmax);
	enum llm_status s = bench_open(&b, o, &l2, device, name_len);
	struct llm_gemm_bench_row *out = calloc(nsh * nm > 0 ? nsh * nm : 1, sizeof *out);
	if (!s && !out)
		s = llm_fail(LLM_ERR_NOMEM, "bench gemm: out of memory");
	size_t k = 0;
	for (size_t i = 0; i < nsh && !s; i++) {
		s = bench_shape(&b, &sh[i], mmax, l2);
		for (size_t j = 0; j < nm && !s; j++) {
			struct llm_gemm_bench_row *r = &out[k];
			int cfg = o->cfg >= 0 && o->cfg < LLM_GEMM_CFG_COUNT ? o->cfg : -1;
			if (cfg < 0 || !llm_cuda_gemm_cfg_ok((enum llm_cuda_gemm_cfg)cfg, &b.w[0], ms[j]))
				cfg = (int)llm_cuda_gemm_pick(&b.w[0], ms[j]);
			r->shape = sh[i].name;
			r->m = ms[j];
			r->n = sh[i].n;
			r->k = sh[i].k;
			r->cfg = cfg;
			if ((s = time_it(&b, cfg, ms[j], &r->us_fp8)) || (s = time_it(&b, -1, ms[j], &r->us_bf16))
			    || (s = count_wrong(&b, cfg, ms[j], &r->n_wrong)))
				break;
			double t = r->us_fp8 * 1e-6, xb = cfg == LLM_GEMM_GEMV || cfg == LLM_GEMM_GENERIC ? 4 : 2;
			r->speedup = r->us_bf16 / r->us_fp8;
			r->tflops_fp8 = 2.0 * (double)r->m * (double)r->n * (double)r->k / t * 1e-12;
			r->gbs_fp8 = ((double)r->n * (double)r->k * (1 + 4.0 / (128 * 128))
			              + (double)r->m * (double)r->k * xb + (double)r->m * (double)r->n * 4) / t * 1e-9;
			k++;
		}
		bench_free_shape(&b);
	}
	bench_close(&b);
	if (s) {
		free(out);
		return s;
	}
	*rows = out;
	*n_rows = k;
	return LLM_OK;
}

enum llm_status llm_cuda_gemm_sweep(const struct llm_gemm_bench_opts *o, FILE *out)
{
	struct bench b;
	size_t l2, nsh, nm;
	const struct llm_gemm_shape *sh;
	const int64_t *ms;
	int64_t mmax;
	char dev[300] = "";
	lists(o, &sh, &nsh, &ms, &nm, &mmax);
	enum llm_status s = bench_open(&b, o, &l2, dev, sizeof dev);
	if (!s) {
		time_t now = time(NULL);
		char date[32];
		strftime(date, sizeof date, "%Y-%m-%d", gmtime(&now));
		fprintf(out, "/* kernels/tune_table.h: tile configurations of the fused FP8 GEMM per\n"
		             " * weight shape (n = d_out, k = d_in) and activation rows M, written by\n"
		             " * llm_cuda_gemm_sweep() (kernels/bench_gemm.c) on %s, %s:\n"
		             " * the fastest tensor-core tile of each (shape, M), median of %d event-timed\n"
		             " * runs over rotating weight copies. GEMV rows are never written: its f32\n"
		             " * numerics would break batch invariance against the MMA tiles (see the\n"
		             " * notes of the default table in git history). Rows are tried in order; the\n"
		             " * first whose n and k match (0 = any), m_max >= M and configuration can run\n"
		             " * the weight wins; otherwise the generic kernel runs. */\n"
		             "#ifndef LLM_TUNE_TABLE_H\n#define LLM_TUNE_TABLE_H\n\n#include \"cuda_kernels.h\"\n\n"
		             "struct llm_gemm_tune {\n\tint64_t n, k;\n\tint64_t m_max;\n\tenum llm_cuda_gemm_cfg cfg;\n};\n\n"
		             "#define LLM_GEMM_TUNE_DEVICE \"%s\"\n\n"
		             "static const struct llm_gemm_tune llm_gemm_tune_table[] = {\n",
		        dev, date, b.iters, dev);
	}
	static const char *cfg_enum[LLM_GEMM_CFG_COUNT] = { "LLM_GEMM_GEMV", "LLM_GEMM_MMA_16x64",
	                                                    "LLM_GEMM_MMA_64x128", "LLM_GEMM_MMA_128x128",
	                                                    "LLM_GEMM_GENERIC" };
	for (size_t i = 0; i < nsh && !s; i++) {
		s = bench_shape(&b, &sh[i], mmax, l2);
		int run_cfg = -1;
		for (size_t j = 0; j < nm && !s; j++) {
			int best = -1;
			double best_us = 0;
			for (int c = LLM_GEMM_MMA_16x64; c <= LLM_GEMM_MMA_128x128 && !s; c++) {
				double us;
				if (!llm_cuda_gemm_cfg_ok((enum llm_cuda_gemm_cfg)c, &b.w[0], ms[j]))
					continue;
				if ((s = time_it(&b, c, ms[j], &us)))
					break;
				if (best < 0 || us < best_us) {
					best = c;
					best_us = us;
				}
			}
			if (s || best < 0)
				continue;
			/* one row per run of equal choices, ending at the run's last M */
			int last = j + 1 == nm;
			if (run_cfg >= 0 && run_cfg != best)
				fprintf(out, "\t{ %lld, %lld, %lld, %s },\n", (long long)sh[i].n, (long long)sh[i].k,
				        (long long)ms[j - 1], cfg_enum[run_cfg]);
			run_cfg = best;
			if (last)
				fprintf(out, "\t{ %lld, %lld, INT64_MAX, %s },   /* %s */\n", (long long)sh[i].n,
				        (long long)sh[i].k, cfg_enum[run_cfg], sh[i].name);
		}
		bench_free_shape(&b);
	}
	if (!s)
		fprintf(out, "\t/* any other shape */\n\t{ 0, 0, 64, LLM_GEMM_MMA_16x64 },\n"
		             "\t{ 0, 0, 512, LLM_GEMM_MMA_64x128 },\n\t{ 0, 0, INT64_MAX, LLM_GEMM_MMA_128x128 },\n"
		             "};\n\n#endif\n");
	bench_close(&b);
	return s;
}
