/* tests/test_fp8.c: the E4M3 codec against the OCP 8-bit floating point
 * specification, BF16/F16 conversions, and block quantization.
 *
 * The expected values are computed here from the spec's formula
 * (-1)^s * 2^(e-7) * (1 + m/8) for e > 0, (-1)^s * 2^-6 * m/8 for e = 0,
 * NaN for S.1111.111, independently of the table under test. */
#include "llm.h"
#include "check.h"

#include <math.h>

static double spec_value(int code)
{
	int s = code >> 7, e = (code >> 3) & 15, m = code & 7;
	if (e == 15 && m == 7)
		return NAN;
	double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
	return s ? -v : v;
}

/* The nearest finite E4M3 value by search, ties to the even code
 * (mantissa LSB 0); beyond 448 saturates. */
static int spec_encode(float x)
{
	if (isnan(x))
		return signbit(x) ? 0xff : 0x7f;
	int sign = signbit(x) ? 0x80 : 0;
	double a = fabs((double)x);
	if (a >= 448)
		return sign | 0x7e;
	int best = 0;
	double bd = INFINITY;
	for (int c = 0; c < 0x7f; c++) {
		double d = fabs(spec_value(c) - a);
		if (d < bd || (d == bd && !(c & 1))) {
			bd = d;
			best = c;
		}
	}
	return sign | best;
}

static uint64_t rng = 88172645463325252ull;
static uint32_t next32(void)
{
	rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
	return (uint32_t)(rng >> 16);
}

static void test_decode(void)
{
	int bad = 0;
	for (int c = 0; c < 256; c++) {
		double want = spec_value(c);
		float got = llm_e4m3_to_f32((uint8_t)c);
		int ok = isnan(want) ? isnan(got) : (double)got == want && !signbit(got) == !signbit(want);
		if (!ok && bad++ < 5)
			check_diag("code 0x%02x: got %g want %g", c, got, want);
	}
	check(!bad, "all 256 E4M3 codes decode to the spec value (%d wrong)", bad);
	check(llm_e4m3_to_f32(0x7e) == 448.0f && llm_e4m3_to_f32(0x01) == ldexpf(1, -9),
	      "max finite is 448, smallest subnormal 2^-9");
}

static int encode_ok(float x, int *nbad)
{
	int want = spec_encode(x), got = llm_f32_to_e4m3(x);
	/* both NaN codes are acceptable for NaN input as long as it is NaN */
	if (isnan(x) ? isnan(llm_e4m3_to_f32((uint8_t)got)) : got == want)
		return 1;
	if ((*nbad)++ < 5)
		check_diag("encode %.9g (0x%08x): got 0x%02x want 0x%02x", x, llm_f32_bits(x), got, want);
	return 0;
}

static void test_encode(void)
{
	int bad = 0;
	long n = 0;
	/* every code, and the midpoints and neighbours of every pair of codes */
	for (int c = 0; c < 0x7e; c++) {
		float lo = (float)spec_value(c), hi = (float)spec_value(c + 1), mid = (lo + hi) / 2;
		float pts[] = { lo, hi, mid, nextafterf(mid, 0), nextafterf(mid, 1000) };
		for (int i = 0; i < 5; i++) {
			encode_ok(pts[i], &bad);
			encode_ok(-pts[i], &bad);
			n += 2;
		}
	}
	check(!bad, "encoding of every code, midpoint and its neighbours (%ld cases, %d wrong)", n, bad);
	bad = 0;
	float sat[] = { 448, 449, 464, 465, 1e6f, INFINITY, 3.4e38f, nextafterf(448, 1000) };
	for (size_t i = 0; i < sizeof sat / sizeof *sat; i++) {
		int ok = llm_f32_to_e4m3(sat[i]) == 0x7e && llm_f32_to_e4m3(-sat[i]) == 0xfe;
		if (!ok && bad++ < 5)
			check_diag("saturation of %g: 0x%02x", sat[i], llm_f32_to_e4m3(sat[i]));
	}
	check(!bad, "values beyond 448 and infinities saturate to +-448");
	check(isnan(llm_e4m3_to_f32(llm_f32_to_e4m3(NAN))) && isnan(llm_e4m3_to_f32(llm_f32_to_e4m3(-NAN))),
	      "NaN encodes to a NaN code");
	check(llm_f32_to_e4m3(-0.0f) == 0x80 && llm_f32_to_e4m3(0.0f) == 0 &&
	      llm_f32_to_e4m3(ldexpf(1, -11)) == 0 && llm_f32_to_e4m3(ldexpf(3, -11)) == 0x01,
	      "signed zero and underflow round to nearest even");
	bad = 0;
	const long N = 2000000;
	for (long i = 0; i < N; i++) {
		/* half of them spread over all of float32, half in E4M3's range */
		uint32_t u = next32();
		float x = i & 1 ? llm_bits_f32(u) : ldexpf((float)(int32_t)u / 2147483648.0f, (int)(next32() % 24) - 14);
		encode_ok(x, &bad);
	}
	check(!bad, "%ld random floats encode as the nearest value, ties to even (%d wrong)", N, bad);
}

static void test_bf16_f16(void)
{
	int bad = 0;
	for (uint32_t h = 0; h < 65536; h++) {
		float f = llm_f16_to_f32((uint16_t)h);
		if (isnan(f))
			continue;
		if (llm_f32_to_f16(f) != h && bad++ < 5)
			check_diag("f16 0x%04x -> %g -> 0x%04x", h, f, llm_f32_to_f16(f));
		float b = llm_bf16_to_f32((uint16_t)h);
		if (!isnan(b) && llm_f32_to_bf16(b) != h && bad++ < 5)
			check_diag("bf16 0x%04x round trip", h);
	}
	check(!bad, "every F16 and BF16 value round-trips through f32");
	check(llm_f32_to_bf16(llm_bits_f32(0x3f808000u)) == 0x3f80 && llm_f32_to_bf16(llm_bits_f32(0x3f818000u)) == 0x3f82,
	      "BF16 rounds ties to even");
	check(llm_f32_to_f16(65520.0f) == 0x7c00 && llm_f32_to_f16(65519.0f) == 0x7bff &&
	      llm_f16_to_f32(0x0001) == ldexpf(1, -24),
	      "F16 overflow to inf, largest finite, subnormals");
}

static void test_band(void)
{
	float x[2 * 6] = { 0, 0, 1, -2, 0, 0,
	                   0, 0, 0.5f, 448, 0, 0 };
	uint8_t codes[12];
	float sc[3];
	llm_quantize_band(x, 2, 6, 2, codes, sc);
	check(sc[0] == 0 && codes[0] == 0 && codes[1] == 0 && codes[6] == 0 && codes[7] == 0,
	      "an all-zero block gets scale 0 and zero codes");
	check(sc[1] == 448.0f / 448.0f && llm_e4m3_to_f32(codes[3]) == -2.0f && llm_e4m3_to_f32(codes[9]) == 448.0f,
	      "scale = amax / 448 and the block's amax maps to 448");
	float y[128];
	for (int i = 0; i < 128; i++)
		y[i] = sinf((float)i) * 3.0f;
	uint8_t c2[128];
	float s2;
	llm_quantize_band(y, 1, 128, 128, c2, &s2);
	double worst = 0;
	for (int i = 0; i < 128; i++) {
		double q = llm_e4m3_to_f32(c2[i]) * s2, e = fabs(q - y[i]);
		/* half an ulp: 2^-4 relative for normals, 2^-10 * scale for subnormals */
		double bound = fmax(fabs(y[i]) * 0x1p-4, s2 * 0x1p-10) * (1 + 1e-6);
		worst = fmax(worst, e / bound);
	}
	check(worst <= 1.0, "block quantization error within half an E4M3 ulp (worst %.3f of the bound)", worst);
}

/* The dispatched (SIMD) block quantizer against scalar code written here:
 * identical codes and scales, on awkward shapes and values. */
static void test_band_simd(void)
{
	enum { R = 7, C = 301, BK = 37 };
	static float x[R * C];
	static uint8_t got[R * C], want[R * C];
	float gs[(C + BK - 1) / BK], ws[(C + BK - 1) / BK];
	int bad = 0;
	for (int trial = 0; trial < 200; trial++) {
		for (int i = 0; i < R * C; i++) {
			uint32_t u = next32();
			x[i] = ldexpf((float)(int32_t)u / 2147483648.0f, (int)(next32() % 40) - 30);
			if (trial % 7 == 0 && u % 97 == 0)
				x[i] = NAN;
			if (trial % 5 == 0 && u % 89 == 0)
				x[i] = 0;
		}
		if (trial % 11 == 0)              /* an all-zero block */
			for (int r = 0; r < R; r++)
				memset(&x[r * C + BK], 0, BK * sizeof(float));
		llm_quantize_band(x, R, C, BK, got, gs);
		for (int b = 0; b * BK < C; b++) {
			int c0 = b * BK, c1 = c0 + BK < C ? c0 + BK : C;
			float amax = 0;
			for (int r = 0; r < R; r++)
				for (int c = c0; c < c1; c++)
					amax = fabsf(x[r * C + c]) > amax ? fabsf(x[r * C + c]) : amax;
			ws[b] = isfinite(amax / 448.0f) ? amax / 448.0f : 0;
			for (int r = 0; r < R; r++)
				for (int c = c0; c < c1; c++)
					want[r * C + c] = ws[b] ? llm_f32_to_e4m3(x[r * C + c] / ws[b]) : 0;
			bad += memcmp(&gs[b], &ws[b], sizeof(float)) != 0;
		}
		bad += memcmp(got, want, sizeof got) != 0;
	}
	check(!bad, "dispatched block quantizer equals the scalar reference bit for bit (200 random 7x301 bands, 37-wide blocks)");
}

int main(void)
{
	test_band_simd();
	test_decode();
	test_encode();
	test_bf16_f16();
	test_band();
	return check_done();
}
