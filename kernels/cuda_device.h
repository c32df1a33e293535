/* kernels/cuda_device.h: device helpers shared by the .cu files of kernels/
 * (CUDA C++ only): E4M3 decode and weight element access.
 *
 * Reference: common/base/dtype.h (E4M3 = OCP FP8 E4M3, bias 7, subnormals m/8 *
 * 2^-6) and llm_weight_row_f32() in common/engine/cpu_matmul.c (code * block
 * scale, one f32 rounding). */
#ifndef LLM_CUDA_DEVICE_H
#define LLM_CUDA_DEVICE_H

#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <stdint.h>
#include "cuda_kernels.h"
#include "../common/base/dtype.h"

/* Two E4M3 codes in bits 0-7 and 16-23 of V -> their values * 2^-8 as f32,
 * exactly: sign to bit 15, exponent and mantissa to bits 13-7 of an IEEE
 * half (exponent bias 15 against 7: a factor 2^-8; E4M3 subnormals become
 * half subnormals with the same factor). Code 0x7f (NaN) reads as 480 * 2^-8
 * (the quantizer never writes it). */
static __device__ __forceinline__ float2 e4m3x2_scaled(uint32_t v)
{
	uint32_t h = ((v & 0x00800080u) << 8) | ((v & 0x007f007fu) << 7);
	__half2 hh = *reinterpret_cast<__half2 *>(&h);
	return __half22float2(hh);
}

/* W[r, c] as f32, any dtype; E4M3 as code * 2^-8 * (scale * 2^8), which is
 * code * scale rounded once, the CPU's product. */
static __device__ __forceinline__ float weight_at(const struct llm_cuda_mat &w, int64_t r, int64_t c)
{
	size_t i = (size_t)r * (size_t)w.cols + (size_t)c;
	switch (w.dtype) {
	case LLM_DTYPE_F32: return ((const float *)w.data)[i];
	case LLM_DTYPE_F16: return __half2float(((const __half *)w.data)[i]);
	case LLM_DTYPE_BF16: return __bfloat162float(((const __nv_bfloat16 *)w.data)[i]);
	default: {
		float s = w.scale[(r / w.block_rows) * w.scale_cols + c / w.block_cols];
		return e4m3x2_scaled(((const uint8_t *)w.data)[i]).x * (s * 256.0f);
	}
	}
}

static __device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v += __shfl_xor_sync(0xffffffffu, v, o);
	return v;
}

static __device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
	for (int o = 16; o > 0; o >>= 1)
		v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
	return v;
}

/* RoPE on pair (j, j + half) of the head row P, in place: the angle
 * pos * inv_freq[j] in f32, CUDA's cosf/sinf of it (within 2 ulp; glibc's
 * within 1), then the CPU's products and sums (rope_row in
 * common/engine/backend_cpu.c), each rounded: __f*_rn, so nvcc fuses nothing the
 * CPU's -std=c11 build does not. The rope op and the fused rope_store
 * both rotate through this one function: the same bits. */
static __device__ __forceinline__ void rope_pair(float *p, int j, int half, int32_t pos, const float *inv_freq)
{
	float a = __fmul_rn((float)pos, inv_freq[j]);
	float c = cosf(a), s = sinf(a);
	float v0 = p[j], v1 = p[j + half];
	p[j] = __fsub_rn(__fmul_rn(v0, c), __fmul_rn(v1, s));
	p[j + half] = __fadd_rn(__fmul_rn(v0, s), __fmul_rn(v1, c));
}

static inline unsigned llm_grid_1d(int64_t n, int threads)
{
	int64_t b = (n + threads - 1) / threads;
	return (unsigned)(b < 1 ? 1 : b > 65535 ? 65535 : b);
}

#endif
