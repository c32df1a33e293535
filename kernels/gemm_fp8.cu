/* kernels/gemm_fp8.cu: y = x . W^T on the GPU, the FP8 weights dequantized
 * inside the kernels; the CUDA side of the backend's matmul op, and of
 * matmul_add (y += x . W^T from every kernel's epilogue: the same f32 sum,
 * then the add op's one f32 add, so the same bits as matmul then add).
 *
 * Reference: llm_cpu_matmul_rows() (common/engine/cpu_matmul.c): W element (r, c)
 * is e4m3(code) * scale[(r / block_rows) * scale_cols + c / block_cols], f32
 * accumulation. Kernels:
 * - gemm_e4m3_bf16_mma_kernel<BM, BN, WM, WN>: tensor cores (mma.sync
 *   m16n8k16, BF16 in, F32 accumulate; sm_80 and later). Both operand tiles
 *   are fetched with cp.async into two shared-memory stages (the next tile
 *   loads while the current one is multiplied); x (bf16) goes to registers
 *   with ldmatrix, W stays 1 byte per element in shared memory and each
 *   thread dequantizes its own B fragment in registers: two codes -> half2 by
 *   bit operations (exact, value * 2^-8), -> f32, one multiply by the block
 *   scale * 2^8, one rounding to bf16. Error against the CPU's f32
 *   levels: x and code * scale each rounded to bf16 (relative 2^-9 each),
 *   f32 sums; the avx512bf16 level rounds both the same way, so against it
 *   only the summation order differs.
 * - gemv_e4m3_f32_kernel: decode-sized M (<= 8): one warp per weight row,
 *   16 codes per 16-byte load, f32 activations, code * scale rounded exactly
 *   as the CPU does it; only the summation order differs.
 * - matmul_generic_f32_kernel: any dtype, shape and block size; one warp per
 *   output element (the fallback, and the path for F32/F16 weights).
 * BF16 weights go to cuBLAS (cuda_ops.c). Which tile shape runs for which
 * (N, K, M) comes from the offline sweep table kernels/tune_table.h. */
#include "cuda_device.h"

#define GEMM_BK 32                   /* K per shared-memory stage */
#define GEMM_A_LD (GEMM_BK + 8)      /* bf16 per A row: 80 B, ldmatrix rows hit distinct banks */
#define GEMM_B_LD (GEMM_BK + 16)     /* bytes per W row: 48 B, fragment loads hit distinct banks */
#define GEMV_MAX_M 8

/* ---- E4M3 decode (cuda_device.h: e4m3x2_scaled, weight_at) -------------- */

/* Two adjacent codes (low byte first) -> packed bf16x2 of code * scale,
 * SCALE256 being the block scale * 2^8. */
static __device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t two_codes, float scale256)
{
	float2 f = e4m3x2_scaled(__byte_perm(two_codes, 0u, 0x4140));
	__nv_bfloat162 b = __floats2bfloat162_rn(f.x * scale256, f.y * scale256);
	return *reinterpret_cast<uint32_t *>(&b);
}

/* ---- PTX wrappers ---------------------------------------------------------- */

static __device__ __forceinline__ void cp_async16(void *smem, const void *gmem, bool valid)
{
	unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	int n = valid ? 16 : 0;          /* 0: fill the 16 bytes with zeros */
	asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(s), "l"(gmem), "r"(n));
}
static __device__ __forceinline__ void cp_async_commit(void) { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> static __device__ __forceinline__ void cp_async_wait(void)
{
	asm volatile("cp.async.wait_group %0;\n" :: "n"(N));
}

static __device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem)
{
	unsigned s = (unsigned)__cvta_generic_to_shared(smem);
	asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
	             : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s));
}

/* D = A (16x16 bf16, row) . B (16x8 bf16, col) + D, f32 accumulators. */
static __device__ __forceinline__ void mma_bf16_16816(float d[4], const uint32_t a[4], const uint32_t b[2])
{
	asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
	             "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
	             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
	             : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* The store of every kernel here: y = v, or (ADD) y = y + v: the f32 sum
 * of the matmul, then the one add the add op does (add.cu), so matmul_add
 * gives the bits of matmul then add. */
static __device__ __forceinline__ void epilogue(float *y, float v, int add)
{
	*y = add ? *y + v : v;
}

/* ---- fused FP8 GEMM (tensor cores) ---------------------------------------
 * Block tile BM x BN over (M, N), K in steps of GEMM_BK; warps tile it in
 * WM x WN pieces, each a grid of (WM/16) x (WN/8) mma tiles. Requirements
 * (llm_cuda_gemm_cfg_ok): K % 32 == 0 and block_cols % 32 == 0 (or one
 * scale block spanning K), so one scale per weight row per stage. */
template <int BM, int BN, int WM, int WN>
__global__ void __launch_bounds__((BM / WM) * (BN / WN) * 32)
gemm_e4m3_bf16_mma_kernel(float *__restrict__ y, int64_t ys, const __nv_bfloat16 *__restrict__ x,
                          int M, struct llm_cuda_mat w, int add)
{
	constexpr int NWN = BN / WN, NT = (BM / WM) * NWN * 32;
	constexpr int MI = WM / 16, NI = WN / 8;
	__shared__ __align__(16) __nv_bfloat16 As[2][BM][GEMM_A_LD];
	__shared__ __align__(16) uint8_t Bs[2][BN][GEMM_B_LD];

	const int N = (int)w.rows, K = (int)w.cols;
	const int tid = threadIdx.x, lane = tid & 31, wid = tid >> 5;
	const int g = lane >> 2, tig = lane & 3;
	const int wm0 = (wid / NWN) * WM, wn0 = (wid % NWN) * WN;
	const int m0 = blockIdx.y * BM, n0 = blockIdx.x * BN;
	const uint8_t *codes = (const uint8_t *)w.data;
	const int bc = (int)w.block_cols;

	/* this thread's B rows (one per ni): where their scales start */
	const float *srow[NI];
#pragma unroll
	for (int ni = 0; ni < NI; ni++) {
		int n = n0 + wn0 + ni * 8 + g;
		srow[ni] = n < N ? w.scale + (int64_t)(n / w.block_rows) * w.scale_cols : nullptr;
	}

	float acc[MI][NI][4];
#pragma unroll
	for (int mi = 0; mi < MI; mi++)
#pragma unroll
		for (int ni = 0; ni < NI; ni++)
#pragma unroll
			for (int e = 0; e < 4; e++)
				acc[mi][ni][e] = 0.0f;

	auto load_stage = [&](int st, int k0) {
		for (int c = tid; c < BM * (GEMM_BK / 8); c += NT) {          /* 16 B = 8 bf16 */
			int r = c / (GEMM_BK / 8), col = (c % (GEMM_BK / 8)) * 8;
			int m = m0 + r;
			const __nv_bfloat16 *src = x + (int64_t)(m < M ? m : 0) * K + k0 + col;
			cp_async16(&As[st][r][col], src, m < M);
		}
		for (int c = tid; c < BN * (GEMM_BK / 16); c += NT) {         /* 16 B = 16 codes */
			int r = c / (GEMM_BK / 16), col = (c % (GEMM_BK / 16)) * 16;
			int n = n0 + r;
			const uint8_t *src = codes + (int64_t)(n < N ? n : 0) * K + k0 + col;
			cp_async16(&Bs[st][r][col], src, n < N);
		}
		cp_async_commit();
	};

	const int KT = K / GEMM_BK;
	float sc[NI];                    /* block scale * 2^8 of each B row, this stage */
	load_stage(0, 0);
	for (int kt = 0; kt < KT; kt++) {
		const int st = kt & 1, k0 = kt * GEMM_BK;
#pragma unroll
		for (int ni = 0; ni < NI; ni++)
			sc[ni] = srow[ni] ? __ldg(srow[ni] + k0 / bc) * 256.0f : 0.0f;
		if (kt + 1 < KT) {
			load_stage(st ^ 1, k0 + GEMM_BK);
			cp_async_wait<1>();
		} else {
			cp_async_wait<0>();
		}
		__syncthreads();
#pragma unroll
		for (int ks = 0; ks < GEMM_BK; ks += 16) {
			uint32_t a[MI][4], b[NI][2];
#pragma unroll
			for (int mi = 0; mi < MI; mi++)   /* lanes 0-15: rows at k, 16-31: rows at k + 8 */
				ldmatrix_x4(a[mi], &As[st][wm0 + mi * 16 + (lane & 15)][ks + (lane >> 4) * 8]);
#pragma unroll
			for (int ni = 0; ni < NI; ni++) {   /* B (k, n): k = 2 tig (+1), +8; n = g */
				const uint8_t *p = &Bs[st][wn0 + ni * 8 + g][ks + tig * 2];
				b[ni][0] = e4m3x2_bf16x2(*(const uint16_t *)p, sc[ni]);
				b[ni][1] = e4m3x2_bf16x2(*(const uint16_t *)(p + 8), sc[ni]);
			}
#pragma unroll
			for (int mi = 0; mi < MI; mi++)
#pragma unroll
				for (int ni = 0; ni < NI; ni++)
					mma_bf16_16816(acc[mi][ni], a[mi], b[ni]);
		}
		__syncthreads();             /* stage st is refilled next iteration */
	}

	/* D fragment: (row g, cols 2 tig, 2 tig + 1), (row g + 8, same cols) */
#pragma unroll
	for (int mi = 0; mi < MI; mi++)
#pragma unroll
		for (int ni = 0; ni < NI; ni++) {
			int n = n0 + wn0 + ni * 8 + tig * 2;
#pragma unroll
			for (int h = 0; h < 2; h++) {
				int m = m0 + wm0 + mi * 16 + g + h * 8;
				if (m >= M)
					continue;
				float *yr = y + (int64_t)m * ys;
				if (n < N)
					epilogue(yr + n, acc[mi][ni][2 * h], add);
				if (n + 1 < N)
					epilogue(yr + n + 1, acc[mi][ni][2 * h + 1], add);
			}
		}
}

/* ---- GEMV for decode-sized M ---------------------------------------------
 * One warp per weight row; lane l reads codes [16 l, 16 l + 16) of every
 * 512-element stretch (one 16-byte load), so a warp streams its row once,
 * coalesced; x rows come through L1/L2 (every warp reads the same x).
 * Requirements: K % 16 == 0, block_cols % 16 == 0 (or one block), x rows
 * 16-byte aligned. */
__global__ void __launch_bounds__(256)
gemv_e4m3_f32_kernel(float *__restrict__ y, int64_t ys, const float *__restrict__ x, int64_t xs,
                     int M, struct llm_cuda_mat w, int add)
{
	const int lane = threadIdx.x & 31;
	const int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	if (r >= w.rows)
		return;
	const int K = (int)w.cols, bc = (int)w.block_cols;
	const uint8_t *wr = (const uint8_t *)w.data + r * K;
	const float *srow = w.scale + (r / w.block_rows) * w.scale_cols;
	float acc[GEMV_MAX_M];
#pragma unroll
	for (int m = 0; m < GEMV_MAX_M; m++)
		acc[m] = 0.0f;
	for (int k = lane * 16; k < K; k += 32 * 16) {
		uint4 q = __ldg((const uint4 *)(wr + k));
		float s = __ldg(srow + k / bc) * 256.0f;
		float wf[16];
		uint32_t words[4] = { q.x, q.y, q.z, q.w };
#pragma unroll
		for (int i = 0; i < 4; i++) {
			float2 lo = e4m3x2_scaled(__byte_perm(words[i], 0u, 0x4140));
			float2 hi = e4m3x2_scaled(__byte_perm(words[i], 0u, 0x4342));
			wf[4 * i + 0] = lo.x * s;
			wf[4 * i + 1] = lo.y * s;
			wf[4 * i + 2] = hi.x * s;
			wf[4 * i + 3] = hi.y * s;
		}
#pragma unroll
		for (int m = 0; m < GEMV_MAX_M; m++) {
			if (m >= M)
				break;
			const float4 *xp = (const float4 *)(x + m * xs + k);
#pragma unroll
			for (int i = 0; i < 4; i++) {
				float4 xv = __ldg(xp + i);
				acc[m] = fmaf(wf[4 * i + 0], xv.x, acc[m]);
				acc[m] = fmaf(wf[4 * i + 1], xv.y, acc[m]);
				acc[m] = fmaf(wf[4 * i + 2], xv.z, acc[m]);
				acc[m] = fmaf(wf[4 * i + 3], xv.w, acc[m]);
			}
		}
	}
#pragma unroll
	for (int m = 0; m < GEMV_MAX_M; m++) {
		if (m >= M)
			break;
		float v = warp_sum(acc[m]);
		if (lane == 0)
			epilogue(y + m * ys + r, v, add);
	}
}

/* ---- fallback: one warp per output element --------------------------------- */
__global__ void __launch_bounds__(256)
matmul_generic_f32_kernel(float *__restrict__ y, int64_t ys, const float *__restrict__ x, int64_t xs,
                          struct llm_cuda_mat w, int add)
{
	const int lane = threadIdx.x & 31;
	const int64_t r = (int64_t)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
	const int64_t m = blockIdx.y;
	if (r >= w.rows)
		return;
	const float *xm = x + m * xs;
	float acc = 0.0f;
	for (int64_t c = lane; c < w.cols; c += 32)
		acc = fmaf(weight_at(w, r, c), xm[c], acc);
	acc = warp_sum(acc);
	if (lane == 0)
		epilogue(y + m * ys + r, acc, add);
}

__global__ void f32_to_bf16_kernel(__nv_bfloat16 *dst, const float *src, int64_t ss, int64_t rows, int64_t cols)
{
	int64_t n = rows * cols;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x) {
		int64_t r = i / cols, c = i % cols;
		dst[i] = __float2bfloat16_rn(src[r * ss + c]);
	}
}

__global__ void e4m3_to_bf16_kernel(__nv_bfloat16 *dst, struct llm_cuda_mat w)
{
	int64_t n = w.rows * w.cols;
	for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
		dst[i] = __float2bfloat16_rn(weight_at(w, i / w.cols, i % w.cols));
}

/* ---- launchers ----------------------------------------------------------- */

extern "C" const char *llm_cuda_gemm_cfg_name(enum llm_cuda_gemm_cfg c)
{
	static const char *n[LLM_GEMM_CFG_COUNT] = { "gemv", "mma16x64", "mma64x128", "mma128x128", "generic" };
	return (unsigned)c < LLM_GEMM_CFG_COUNT ? n[c] : "?";
}

extern "C" int llm_cuda_gemm_cfg_ok(enum llm_cuda_gemm_cfg c, const struct llm_cuda_mat *w, int64_t m)
{
	if (c == LLM_GEMM_GENERIC)
		return 1;
	if (w->dtype != LLM_DTYPE_E4M3 || m < 1 || w->rows > INT32_MAX || w->cols > INT32_MAX
	    || m > INT32_MAX || w->block_rows < 1 || w->block_cols < 1)
		return 0;
	int one_block = w->block_cols >= w->cols;
	if (c == LLM_GEMM_GEMV)
		return m <= GEMV_MAX_M && w->cols % 16 == 0 && (one_block || w->block_cols % 16 == 0);
	if ((unsigned)c >= LLM_GEMM_CFG_COUNT)
		return 0;
	return w->cols % GEMM_BK == 0 && (one_block || w->block_cols % GEMM_BK == 0);
}

template <int BM, int BN, int WM, int WN>
static void launch_mma(float *y, int64_t ys, const uint16_t *xbf, int64_t m,
                       const struct llm_cuda_mat *w, int add, cudaStream_t stream)
{
	dim3 grid((unsigned)((w->rows + BN - 1) / BN), (unsigned)((m + BM - 1) / BM));
	gemm_e4m3_bf16_mma_kernel<BM, BN, WM, WN><<<grid, (BM / WM) * (BN / WN) * 32, 0, stream>>>(
		y, ys, (const __nv_bfloat16 *)xbf, (int)m, *w, add);
}

extern "C" cudaError_t llm_cuda_matmul_generic(float *y, int64_t ys, const float *x, int64_t xs, int64_t m,
                                               const struct llm_cuda_mat *w, int add, cudaStream_t stream)
{
	if (m < 1 || m > 65535)
		return cudaErrorInvalidValue;
	dim3 grid((unsigned)((w->rows + 7) / 8), (unsigned)m);
	matmul_generic_f32_kernel<<<grid, 256, 0, stream>>>(y, ys, x, xs, *w, add);
	return cudaGetLastError();
}

extern "C" cudaError_t llm_cuda_gemm_e4m3(enum llm_cuda_gemm_cfg cfg, float *y, int64_t ys,
                                          const float *x32, int64_t xs, const uint16_t *xbf,
                                          int64_t m, const struct llm_cuda_mat *w, int add, cudaStream_t stream)
{
	if (!llm_cuda_gemm_cfg_ok(cfg, w, m))
		return cudaErrorInvalidValue;
	/* one scale block over all of K: any block_cols >= cols reads column 0 */
	struct llm_cuda_mat wk = *w;
	if (wk.block_cols >= wk.cols)
		wk.block_cols = wk.cols + GEMM_BK;   /* k / block_cols == 0 for every k < cols */
	switch (cfg) {
	case LLM_GEMM_GEMV:
		if (((uintptr_t)x32 | (uintptr_t)(xs * 4)) % 16)
			return llm_cuda_matmul_generic(y, ys, x32, xs, m, w, add, stream);
		gemv_e4m3_f32_kernel<<<(unsigned)((wk.rows + 7) / 8), 256, 0, stream>>>(y, ys, x32, xs, (int)m, wk, add);
		break;
	case LLM_GEMM_MMA_16x64:   launch_mma<16, 64, 16, 16>(y, ys, xbf, m, &wk, add, stream); break;
	case LLM_GEMM_MMA_64x128:  launch_mma<64, 128, 32, 64>(y, ys, xbf, m, &wk, add, stream); break;
	case LLM_GEMM_MMA_128x128: launch_mma<128, 128, 64, 32>(y, ys, xbf, m, &wk, add, stream); break;
	default:
		return llm_cuda_matmul_generic(y, ys, x32, xs, m, w, add, stream);
	}
	return cudaGetLastError();
}

extern "C" cudaError_t llm_cuda_f32_to_bf16(uint16_t *dst, const float *src, int64_t ss, int64_t rows,
                                            int64_t cols, cudaStream_t stream)
{
	f32_to_bf16_kernel<<<llm_grid_1d(rows * cols, 256), 256, 0, stream>>>((__nv_bfloat16 *)dst, src, ss, rows, cols);
	return cudaGetLastError();
}

extern "C" cudaError_t llm_cuda_e4m3_to_bf16(uint16_t *dst, const struct llm_cuda_mat *w, cudaStream_t stream)
{
	e4m3_to_bf16_kernel<<<llm_grid_1d(w->rows * w->cols, 256), 256, 0, stream>>>((__nv_bfloat16 *)dst, *w);
	return cudaGetLastError();
}

/* ---- the tile table -------------------------------------------------------- */
#include "tune_table.h"

extern "C" enum llm_cuda_gemm_cfg llm_cuda_gemm_pick(const struct llm_cuda_mat *w, int64_t m)
{
	for (size_t i = 0; i < sizeof llm_gemm_tune_table / sizeof *llm_gemm_tune_table; i++) {
		const struct llm_gemm_tune *t = &llm_gemm_tune_table[i];
		if ((t->n && t->n != w->rows) || (t->k && t->k != w->cols) || m > t->m_max)
			continue;
		if (llm_cuda_gemm_cfg_ok(t->cfg, w, m))
			return t->cfg;
	}
	return LLM_GEMM_GENERIC;
}
