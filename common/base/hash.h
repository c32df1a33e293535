/* common/base/hash.h: the engine's one non-cryptographic hash and its one
 * seeding PRNG, as static inline functions.
 *
 *   llm_hash_fnv1a   FNV-1a 64 (Fowler, Noll, Vo): offset basis
 *                    LLM_FNV1A_INIT, prime 0x100000001b3; chainable, so
 *                    several buffers hash as their concatenation.
 *   llm_hash_fmix    a finalizer for a table index from an FNV value
 *                    (whose high bits reach the low bits poorly): the
 *                    first round of MurmurHash3's fmix64.
 *   llm_hash_mix64   splitmix64's output function (Stafford's variant 13):
 *                    a bijection of 64 bits, each output bit depending on
 *                    every input bit.
 *   llm_rng_splitmix64  one step of splitmix64 (Steele, Lea, Flood 2014):
 *                    the state advances by the golden gamma and its mix is
 *                    the output. Seeds the xoshiro streams (sampler.c) and
 *                    the seeded initializations and masks.
 *   llm_hash_u64     the step's output from state Z, the state not kept:
 *                    a hash of one word (keys from a seed and a counter).
 *
 * The values are part of what the project pins (seeded sampling, random
 * checkpoints, adapter initialization, data fingerprints): they never
 * change. */
#ifndef LLM_HASH_H
#define LLM_HASH_H

#include <stddef.h>
#include <stdint.h>

#define LLM_FNV1A_INIT 0xcbf29ce484222325ull       /* FNV-1a 64 offset basis */
#define LLM_SPLITMIX_GAMMA 0x9e3779b97f4a7c15ull   /* 2^64 / golden ratio, odd */

/* H extended by the N bytes at P (H = LLM_FNV1A_INIT to start). */
static inline uint64_t llm_hash_fnv1a(uint64_t h, const void *p, size_t n)
{
	const unsigned char *c = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ c[i]) * 0x100000001b3ull;
	return h;
}

/* xor-shift, multiply, xor-shift (fmix64's first round): the high bits of
 * H reach the low bits a table index takes. */
static inline uint64_t llm_hash_fmix(uint64_t h)
{
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	return h ^ (h >> 33);
}

static inline uint64_t llm_hash_mix64(uint64_t z)
{
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The next output of the splitmix64 stream whose state is *S. */
static inline uint64_t llm_rng_splitmix64(uint64_t *s)
{
	return llm_hash_mix64(*s += LLM_SPLITMIX_GAMMA);
}

/* llm_rng_splitmix64 of a copy of Z. */
static inline uint64_t llm_hash_u64(uint64_t z)
{
	return llm_hash_mix64(z + LLM_SPLITMIX_GAMMA);
}

#endif
