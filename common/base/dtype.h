/* common/base/dtype.h: element types and scalar conversions.
 *
 * E4M3 is the OCP 8-bit floating point format (OCP 8-bit Floating Point
 * Specification, "E4M3"): 1 sign bit, 4 exponent bits with bias 7, 3 mantissa
 * bits; no infinities; S.1111.111 is NaN; the largest finite value is
 * S.1111.110 = 448; exponent field 0 encodes subnormals m/8 * 2^-6.
 * BF16 is the upper half of an IEEE binary32; F16 is IEEE binary16.
 * All float -> narrow conversions round to nearest, ties to even. */
#ifndef LLM_DTYPE_H
#define LLM_DTYPE_H

#include <stdint.h>
#include <string.h>
#include <stddef.h>

enum llm_dtype {
	LLM_DTYPE_F32, LLM_DTYPE_F16, LLM_DTYPE_BF16, LLM_DTYPE_E4M3,
	LLM_DTYPE_E5M2, LLM_DTYPE_F64, LLM_DTYPE_I64, LLM_DTYPE_I32,
	LLM_DTYPE_I16, LLM_DTYPE_I8, LLM_DTYPE_U8, LLM_DTYPE_BOOL,
	LLM_DTYPE_COUNT
};

/* Safetensors spelling ("F32", "BF16", "F8_E4M3", ...); -1 when unknown. */
int llm_dtype_parse(const char *s);
const char *llm_dtype_name(enum llm_dtype t);
size_t llm_dtype_size(enum llm_dtype t);
/* Lowercase user spelling for flags: "f32", "f16", "bf16", "fp8"/"e4m3". */
int llm_dtype_parse_flag(const char *s);

static inline uint32_t llm_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float llm_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

static inline float llm_bf16_to_f32(uint16_t h) { return llm_bits_f32((uint32_t)h << 16); }
static inline uint16_t llm_f32_to_bf16(float f)
{
	uint32_t u = llm_f32_bits(f);
	if ((u & 0x7fffffffu) > 0x7f800000u)      /* NaN: keep it a quiet NaN */
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1);           /* round to nearest even */
	return (uint16_t)(u >> 16);
}

float llm_f16_to_f32(uint16_t h);
uint16_t llm_f32_to_f16(float f);

/* E4M3 decode table: llm_e4m3_table[code] (NaN for 0x7f and 0xff). */
extern const float llm_e4m3_table[256];
static inline float llm_e4m3_to_f32(uint8_t c) { return llm_e4m3_table[c]; }

/* Nearest E4M3, ties to even; |x| > 448 (and +-inf) saturates to +-448;
 * NaN gives 0x7f with the sign of x. */
static inline uint8_t llm_f32_to_e4m3(float x)
{
	uint32_t u = llm_f32_bits(x);
	uint8_t sign = (uint8_t)((u >> 24) & 0x80);
	uint32_t a = u & 0x7fffffffu;
	if (a > 0x7f800000u)
		return sign | 0x7f;
	if (a >= 0x43e00000u)                     /* >= 448: saturate */
		return sign | 0x7e;
	if (a < 0x3c800000u) {                    /* < 2^-6: subnormal, step 2^-9 */
		/* adding 2^23 leaves the rounded integer a*2^9 in the low bits */
		float t = llm_bits_f32(a) * 512.0f + 8388608.0f;
		return sign | (uint8_t)(llm_f32_bits(t) - 0x4b000000u);
	}
	/* normal: round the 23-bit mantissa to 3 bits, carry may bump exponent */
	a += 0x7ffffu + ((a >> 20) & 1);
	uint32_t code = (a >> 20) - ((127 - 7) << 3);
	return sign | (uint8_t)(code > 0x7e ? 0x7e : code);
}

/* The first index of the N elements of type T at P that are NaN or
 * infinite, or -1 (F32, F16, BF16, E4M3 and E5M2; -1 for integer types).
 * One streaming pass, vectorized. */
int64_t llm_first_nonfinite(const void *p, enum llm_dtype t, size_t n);

/* Convert n elements of type t at src to f32. */
void llm_to_f32(float *dst, const void *src, enum llm_dtype t, size_t n);
/* Convert n f32 to type t (F32, F16 or BF16). */
void llm_from_f32(void *dst, enum llm_dtype t, const float *src, size_t n);

#endif
