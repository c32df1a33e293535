/* common/base/dtype.c: dtype names, sizes and bulk conversions. */
#include "dtype.h"
#include <math.h>

static const struct { const char *st, *flag; size_t size; } info[LLM_DTYPE_COUNT] = {
	[LLM_DTYPE_F32]  = { "F32", "f32", 4 },
	[LLM_DTYPE_F16]  = { "F16", "f16", 2 },
	[LLM_DTYPE_BF16] = { "BF16", "bf16", 2 },
	[LLM_DTYPE_E4M3] = { "F8_E4M3", "fp8", 1 },
	[LLM_DTYPE_E5M2] = { "F8_E5M2", "e5m2", 1 },
	[LLM_DTYPE_F64]  = { "F64", "f64", 8 },
	[LLM_DTYPE_I64]  = { "I64", "i64", 8 },
	[LLM_DTYPE_I32]  = { "I32", "i32", 4 },
	[LLM_DTYPE_I16]  = { "I16", "i16", 2 },
	[LLM_DTYPE_I8]   = { "I8", "i8", 1 },
	[LLM_DTYPE_U8]   = { "U8", "u8", 1 },
	[LLM_DTYPE_BOOL] = { "BOOL", "bool", 1 },
};

int llm_dtype_parse(const char *s)
{
	for (int i = 0; i < LLM_DTYPE_COUNT; i++)
		if (!strcmp(s, info[i].st))
			return i;
	return -1;
}

int llm_dtype_parse_flag(const char *s)
{
	if (!strcmp(s, "e4m3") || !strcmp(s, "f8") || !strcmp(s, "fp8"))
		return LLM_DTYPE_E4M3;
	if (!strcmp(s, "fp32") || !strcmp(s, "float32"))
		return LLM_DTYPE_F32;
	if (!strcmp(s, "fp16") || !strcmp(s, "float16"))
		return LLM_DTYPE_F16;
	if (!strcmp(s, "bfloat16"))
		return LLM_DTYPE_BF16;
	for (int i = 0; i < LLM_DTYPE_COUNT; i++)
		if (!strcmp(s, info[i].flag))
			return i;
	return -1;
}

const char *llm_dtype_name(enum llm_dtype t)
{
	return (unsigned)t < LLM_DTYPE_COUNT ? info[t].st : "?";
}

size_t llm_dtype_size(enum llm_dtype t)
{
	return (unsigned)t < LLM_DTYPE_COUNT ? info[t].size : 0;
}

float llm_f16_to_f32(uint16_t h)
{
	uint32_t sign = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
	if (e == 0x1f)
		return llm_bits_f32(sign | 0x7f800000u | (m << 13));
	if (e == 0) {                              /* zero or subnormal: m * 2^-24 */
		float v = (float)m * 5.9604644775390625e-8f;
		return sign ? -v : v;
	}
	return llm_bits_f32(sign | ((e + 112) << 23) | (m << 13));
}

uint16_t llm_f32_to_f16(float f)
{
	uint32_t u = llm_f32_bits(f), sign = (u >> 16) & 0x8000, a = u & 0x7fffffffu;
	if (a > 0x7f800000u)
		return (uint16_t)(sign | 0x7e00);
	if (a >= 0x477ff000u)                      /* rounds to >= 65536: inf */
		return (uint16_t)(sign | 0x7c00);
	if (a < 0x38800000u) {                     /* < 2^-14: subnormal, step 2^-24 */
		float t = llm_bits_f32(a) * 16777216.0f + 8388608.0f;
		return (uint16_t)(sign | (llm_f32_bits(t) - 0x4b000000u));
	}
	a += 0xfffu + ((a >> 13) & 1);
	return (uint16_t)(sign | ((a >> 13) - ((127 - 15) << 10)));
}

/* The table is built from the bit patterns, by the format's definition. */
#define E4M3_NORMAL(e, m) ((1.0f + (m) / 8.0f) * (float)(1u << (e)) / 128.0f)
#define E4M3_ROW(e) E4M3_NORMAL(e,0), E4M3_NORMAL(e,1), E4M3_NORMAL(e,2), E4M3_NORMAL(e,3), \
                    E4M3_NORMAL(e,4), E4M3_NORMAL(e,5), E4M3_NORMAL(e,6), E4M3_NORMAL(e,7)
#define E4M3_SUB  0.0f, 1/512.0f, 2/512.0f, 3/512.0f, 4/512.0f, 5/512.0f, 6/512.0f, 7/512.0f
#define E4M3_POS  E4M3_SUB, E4M3_ROW(1), E4M3_ROW(2), E4M3_ROW(3), E4M3_ROW(4), E4M3_ROW(5), \
                  E4M3_ROW(6), E4M3_ROW(7), E4M3_ROW(8), E4M3_ROW(9), E4M3_ROW(10), E4M3_ROW(11), \
                  E4M3_ROW(12), E4M3_ROW(13), E4M3_ROW(14), \
                  E4M3_NORMAL(15,0), E4M3_NORMAL(15,1), E4M3_NORMAL(15,2), E4M3_NORMAL(15,3), \
                  E4M3_NORMAL(15,4), E4M3_NORMAL(15,5), E4M3_NORMAL(15,6), NAN
#define NEG(x) (-(x))
const float llm_e4m3_table[256] = {
	E4M3_POS,
	-0.0f, -1/512.0f, -2/512.0f, -3/512.0f, -4/512.0f, -5/512.0f, -6/512.0f, -7/512.0f,
#define E4M3_NROW(e) NEG(E4M3_NORMAL(e,0)), NEG(E4M3_NORMAL(e,1)), NEG(E4M3_NORMAL(e,2)), \
	NEG(E4M3_NORMAL(e,3)), NEG(E4M3_NORMAL(e,4)), NEG(E4M3_NORMAL(e,5)), NEG(E4M3_NORMAL(e,6)), \
	NEG(E4M3_NORMAL(e,7))
	E4M3_NROW(1), E4M3_NROW(2), E4M3_NROW(3), E4M3_NROW(4), E4M3_NROW(5), E4M3_NROW(6),
	E4M3_NROW(7), E4M3_NROW(8), E4M3_NROW(9), E4M3_NROW(10), E4M3_NROW(11), E4M3_NROW(12),
	E4M3_NROW(13), E4M3_NROW(14),
	NEG(E4M3_NORMAL(15,0)), NEG(E4M3_NORMAL(15,1)), NEG(E4M3_NORMAL(15,2)), NEG(E4M3_NORMAL(15,3)),
	NEG(E4M3_NORMAL(15,4)), NEG(E4M3_NORMAL(15,5)), NEG(E4M3_NORMAL(15,6)), -NAN,
};

void llm_to_f32(float *dst, const void *src, enum llm_dtype t, size_t n)
{
	switch (t) {
	case LLM_DTYPE_F32: memcpy(dst, src, n * 4); break;
	case LLM_DTYPE_BF16: { const uint16_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = llm_bf16_to_f32(s[i]); break; }
	case LLM_DTYPE_F16: { const uint16_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = llm_f16_to_f32(s[i]); break; }
	case LLM_DTYPE_E4M3: { const uint8_t *s = src; for (size_t i = 0; i < n; i++) dst[i] = llm_e4m3_table[s[i]]; break; }
	case LLM_DTYPE_F64: { const double *s = src; for (size_t i = 0; i < n; i++) dst[i] = (float)s[i]; break; }
	default: for (size_t i = 0; i < n; i++) dst[i] = NAN; break;
	}
}

void llm_from_f32(void *dst, enum llm_dtype t, const float *src, size_t n)
{
	switch (t) {
	case LLM_DTYPE_F32: memcpy(dst, src, n * 4); break;
	case LLM_DTYPE_BF16: { uint16_t *d = dst; for (size_t i = 0; i < n; i++) d[i] = llm_f32_to_bf16(src[i]); break; }
	case LLM_DTYPE_F16: { uint16_t *d = dst; for (size_t i = 0; i < n; i++) d[i] = llm_f32_to_f16(src[i]); break; }
	case LLM_DTYPE_E4M3: { uint8_t *d = dst; for (size_t i = 0; i < n; i++) d[i] = llm_f32_to_e4m3(src[i]); break; }
	default: break;
	}
}

/* An element is NaN or infinite when its exponent field is all ones (E4M3:
 * only S.1111.111, it has no infinities). Each 4096-element block ORs the
 * test (a loop of a fixed count, which the compiler vectorizes at -O2;
 * a count it does not know kept it scalar); the index is looked for only in
 * a block that has one. The words are read through may_alias types: the
 * logits are floats. */
typedef uint16_t __attribute__((may_alias)) u16_alias;
typedef uint32_t __attribute__((may_alias)) u32_alias;
typedef uint64_t __attribute__((may_alias)) u64_alias;
#define FIRST_NONFINITE(type, mask, bad_of)                                    \
	do {                                                                       \
		const type *u_ = p;                                                    \
		for (size_t b = 0; b < n; b += 4096) {                                 \
			size_t e = n - b < 4096 ? n : b + 4096;                            \
			type any = 0;                                                      \
			if (e - b == 4096)      /* a fixed count: vectorized at -O2 */     \
				for (size_t i = 0; i < 4096; i++)                              \
					any |= (type)((u_[b + i] & (mask)) == (bad_of));           \
			else                                                               \
				for (size_t i = b; i < e; i++)                                 \
					any |= (type)((u_[i] & (mask)) == (bad_of));               \
			for (size_t i = b; any && i < e; i++)                              \
				if ((u_[i] & (mask)) == (bad_of))                              \
					return (int64_t)i;                                         \
		}                                                                      \
		return -1;                                                             \
	} while (0)

int64_t llm_first_nonfinite(const void *p, enum llm_dtype t, size_t n)
{
	switch (t) {
	case LLM_DTYPE_F32:  FIRST_NONFINITE(u32_alias, 0x7f800000u, 0x7f800000u);
	case LLM_DTYPE_F16:  FIRST_NONFINITE(u16_alias, 0x7c00u, 0x7c00u);
	case LLM_DTYPE_BF16: FIRST_NONFINITE(u16_alias, 0x7f80u, 0x7f80u);
	case LLM_DTYPE_E4M3: FIRST_NONFINITE(uint8_t, 0x7fu, 0x7fu);
	case LLM_DTYPE_E5M2: FIRST_NONFINITE(uint8_t, 0x7cu, 0x7cu);
	case LLM_DTYPE_F64:  FIRST_NONFINITE(u64_alias, 0x7ff0000000000000ull, 0x7ff0000000000000ull);
	default:             return -1;
	}
}
