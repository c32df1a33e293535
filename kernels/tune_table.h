/* kernels/tune_table.h: which tile configuration of the fused FP8 GEMM runs
 * for a weight of N rows (d_out) and K columns (d_in) with M activation
 * rows. Read by llm_cuda_gemm_pick() (gemm_fp8.cu) at each matmul; nothing is
 * tuned at run time.
 *
 * The table is produced offline by the sweep (llm_cuda_gemm_sweep() in
 * kernels/bench_gemm.c; the driver is bench/gemm_sweep.c): for every linear
 * shape of the models we serve and every M of a ladder it times each
 * configuration that can run (median of event-timed repeats over rotating
 * weight copies) and writes the fastest as one row of this file.
 *
 * THIS TABLE IS THE UNMEASURED DEFAULT. No GPU was available when the
 * kernels were written, so only shape-independent rows exist, chosen by
 * arithmetic, not by timing:
 * - M <= 64: 16 x 64 tiles: the smallest tensor-core tile, the most blocks
 *   (decode batches);
 * - M <= 512: 64 x 128 tiles (4 warps of 32 x 64);
 * - larger: 128 x 128 tiles (8 warps of 64 x 32), the most reuse per byte.
 * Batch invariance (common/engine/backend.h): a token's output must not depend on
 * the batch it came in. The three MMA tiles give the same bits for a row
 * (each output is one accumulator fed the same mma.sync k-steps in the same
 * order), so the table may switch among them with M. GEMV (f32 activations
 * and sums) and GENERIC round differently: a table must never mix them with
 * the MMA tiles for one (n, k), so the table has no GEMV row (the sweep
 * never writes one; llm_cuda_bench_gemm() with cfg = LLM_GEMM_GEMV times
 * it, to show what a decode kernel of the MMA family must reach).
 * Rows are tried in order; the first whose n and k match (0 = any) and whose
 * m_max >= M, and whose configuration can run the weight
 * (llm_cuda_gemm_cfg_ok), wins; otherwise the generic kernel runs. */
#ifndef LLM_TUNE_TABLE_H
#define LLM_TUNE_TABLE_H

#include "cuda_kernels.h"

struct llm_gemm_tune {
	int64_t n, k;                /* weight shape (d_out, d_in); 0: any */
	int64_t m_max;               /* largest M this row covers */
	enum llm_cuda_gemm_cfg cfg;
};

#define LLM_GEMM_TUNE_DEVICE "none (unmeasured default)"

static const struct llm_gemm_tune llm_gemm_tune_table[] = {
	/* sweep rows for specific (n, k) go here, before the defaults */
	{ 0, 0, 64, LLM_GEMM_MMA_16x64 },
	{ 0, 0, 512, LLM_GEMM_MMA_64x128 },
	{ 0, 0, INT64_MAX, LLM_GEMM_MMA_128x128 },
};

#endif
