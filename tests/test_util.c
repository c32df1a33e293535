/* tests/test_util.c: the engine's small shared parts: the growable buffer
 * and array growth (buf.h), the hash and seeding PRNG (hash.h), and the
 * thread pool (pool.h).
 *
 * The hash values are the published ones: FNV-1a 64 test vectors (Fowler,
 * Noll, Vo) and the first outputs of splitmix64 from seed 0 (the reference
 * splitmix64.c of Vigna); they are what seeded sampling, random checkpoints
 * and data fingerprints are pinned by. */
#define _GNU_SOURCE
#include "llm.h"
#include "buf.h"
#include "hash.h"
#include "pool.h"
#include "check.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static void test_buf(void)
{
	struct llm_buf b = { 0 };
	int ok = !llm_buf_append(&b, "", 0) && b.p && b.len == 0 && b.p[0] == 0;
	check(ok, "buf: an empty append gives an empty C string");
	char want[5000];
	size_t grows = 0, cap = b.cap;
	ok = 1;
	for (int i = 0; i < 5000; i++) {
		want[i] = (char)('a' + i % 26);
		ok &= !llm_buf_append(&b, &want[i], 1);
		if (b.cap != cap) {
			grows++;
			ok &= b.cap >= 2 * cap;
			cap = b.cap;
		}
	}
	ok &= b.len == 5000 && !memcmp(b.p, want, 5000) && b.p[5000] == 0 && strlen(b.p) == 5000;
	check(ok && grows <= 7, "buf: 5000 one-byte appends keep every byte and grow %zu times, doubling", grows);
	ok = !llm_buf_append_str(&b, "xyz") && b.len == 5003 && !strcmp(b.p + 5000, "xyz");
	char *p = b.p;
	ok &= !llm_buf_reserve(&b, 10) && b.p == p && b.cap == cap;
	check(ok, "buf: append_str; a smaller reserve changes nothing");
	enum llm_status s = llm_buf_reserve(&b, SIZE_MAX);
	ok = s == LLM_ERR_NOMEM && b.p == p && b.cap == cap && b.len == 5003 && !strcmp(b.p + 5000, "xyz");
	s = llm_buf_append(&b, "q", SIZE_MAX - 1);
	ok &= s == LLM_ERR_NOMEM && b.p == p && b.len == 5003;
	check(ok, "buf: an impossible size fails with LLM_ERR_NOMEM and leaves the buffer whole (%s)", llm_errmsg());
	llm_buf_free(&b);
	check(!b.p && !b.len && !b.cap && !llm_buf_append(&b, "ab", 2) && !strcmp(b.p, "ab"),
	      "buf: free leaves an empty buffer that works again");
	llm_buf_free(&b);
	llm_buf_free(&b);

	int32_t *a = NULL;
	size_t acap = 0;
	ok = 1;
	for (int32_t i = 0; i < 100000; i++) {
		ok &= !LLM_ARRAY_RESERVE(a, acap, (size_t)i + 1) && acap > (size_t)i;
		a[i] = i * 7;
	}
	for (int32_t i = 0; i < 100000; i++)
		ok &= a[i] == i * 7;
	int32_t *was = a;
	s = LLM_ARRAY_RESERVE(a, acap, SIZE_MAX / 2);
	ok &= s == LLM_ERR_NOMEM && a == was && a[99999] == 99999 * 7;
	check(ok, "array: 100000 int32 grown one at a time keep their values; an overflowing size fails, array kept");
	free(a);
}

/* llm_read_file from a FIFO (no size known: the 64 KiB start, then doubling) */
static void test_read_pipe(void)
{
	char path[4096];
	snprintf(path, sizeof path, "%s/fifo", test_tmpdir());
	if (mkfifo(path, 0600)) {
		check_skip("mkfifo failed", "read_file: a pipe of 300000 bytes");
		return;
	}
	enum { N = 300000 };
	pid_t pid = fork();
	if (pid == 0) {
		FILE *f = fopen(path, "w");
		for (int i = 0; f && i < N; i++)
			fputc('0' + i % 10, f);
		_exit(f && !fclose(f) ? 0 : 1);
	}
	char *buf = NULL;
	size_t len = 0;
	enum llm_status s = llm_read_file(path, &buf, &len);
	int st = -1;
	waitpid(pid, &st, 0);
	int ok = !s && len == N && buf[N] == 0 && st == 0;
	for (size_t i = 0; ok && i < N; i++)
		ok = buf[i] == '0' + (int)(i % 10);
	check(ok, "read_file: a pipe of %d bytes comes back whole and NUL-terminated", N);
	free(buf);
}

static void test_hash(void)
{
	uint64_t e = llm_hash_fnv1a(LLM_FNV1A_INIT, "", 0), a = llm_hash_fnv1a(LLM_FNV1A_INIT, "a", 1);
	uint64_t fb = llm_hash_fnv1a(LLM_FNV1A_INIT, "foobar", 6);
	check(e == 0xcbf29ce484222325ull && a == 0xaf63dc4c8601ec8cull && fb == 0x85944171f73967e8ull,
	      "fnv1a: the published vectors for \"\", \"a\", \"foobar\"");
	check(llm_hash_fnv1a(llm_hash_fnv1a(LLM_FNV1A_INIT, "foo", 3), "bar", 3) == fb,
	      "fnv1a: chained over two buffers = over their concatenation");
	uint64_t s = 0, r[3];
	for (int i = 0; i < 3; i++)
		r[i] = llm_rng_splitmix64(&s);
	check(r[0] == 0xe220a8397b1dcdafull && r[1] == 0x6e789e6aa1b965f4ull && r[2] == 0x06c45d188009454full
	      && s == 3 * LLM_SPLITMIX_GAMMA, "splitmix64: the reference's first outputs from seed 0");
	check(llm_hash_u64(0) == r[0] && llm_hash_u64(LLM_SPLITMIX_GAMMA) == r[1]
	      && llm_hash_mix64(LLM_SPLITMIX_GAMMA) == r[0], "hash_u64 and mix64: the stream's step, state not kept");
	uint64_t st[4];
	llm_rng_seed(st, 0);
	check(st[0] == r[0] && st[1] == r[1] && st[2] == r[2], "sampler: the xoshiro state is seeded by splitmix64");
	/* fmix: x ^= x >> 33, x *= 0xff51afd7ed558ccd, x ^= x >> 33, worked by hand on 1 << 33 */
	uint64_t m = ((uint64_t)1 << 33 ^ 1) * 0xff51afd7ed558ccdull;
	check(llm_hash_fmix((uint64_t)1 << 33) == (m ^ m >> 33) && llm_hash_fmix(0) == 0,
	      "fmix: xor-shift 33, multiply, xor-shift 33");
}

/* ---- pool ----------------------------------------------------------------- */

struct count_job {
	_Atomic int *hits;     /* (n_chunk) */
	_Atomic int bad;       /* calls with the wrong n_chunk */
	int n_chunk;
	pthread_t caller;
	_Atomic int on_caller;
	int slow;              /* each chunk takes a millisecond */
};

static void count_task(void *ctx, int chunk, int n_chunk)
{
	struct count_job *j = ctx;
	if (j->slow) {
		struct timespec ts = { 0, 1000 * 1000 };
		nanosleep(&ts, NULL);
	}
	if (pthread_equal(pthread_self(), j->caller))
		atomic_fetch_add(&j->on_caller, 1);
	if (n_chunk != j->n_chunk || chunk < 0 || chunk >= n_chunk)
		atomic_fetch_add(&j->bad, 1);
	else
		atomic_fetch_add(&j->hits[chunk], 1);
}

/* Run N_CHUNK chunks (SLOW: see count_job); 1 when each ran once. */
static int run_count_slow(struct llm_pool *p, int n_chunk, int *on_caller, int slow)
{
	struct count_job j = { .n_chunk = n_chunk, .caller = pthread_self(), .slow = slow };
	j.hits = calloc((size_t)n_chunk + 1, sizeof *j.hits);
	llm_pool_run(p, n_chunk, count_task, &j);
	int ok = atomic_load(&j.bad) == 0;
	for (int i = 0; i < n_chunk; i++)
		ok &= atomic_load(&j.hits[i]) == 1;
	if (on_caller)
		*on_caller = atomic_load(&j.on_caller);
	free(j.hits);
	return ok;
}

static int run_count(struct llm_pool *p, int n_chunk, int *on_caller)
{
	return run_count_slow(p, n_chunk, on_caller, 0);
}

/* Per chunk, a sum over its rows into its own slot of scratch: the result
 * must not depend on the thread count. */
struct sum_job { const float *x; int64_t rows, cols; double *out; float *scratch; };

static void sum_task(void *ctx, int chunk, int n_chunk)
{
	struct sum_job *j = ctx;
	int64_t per = (j->rows + n_chunk - 1) / n_chunk, b = chunk * per, e = b + per < j->rows ? b + per : j->rows;
	float *acc = j->scratch + (size_t)chunk * (size_t)j->cols;
	for (int64_t r = b; r < e; r++) {
		for (int64_t c = 0; c < j->cols; c++)
			acc[c] = j->x[r * j->cols + c] * (float)(c + 1);
		float s = 0;
		for (int64_t c = 0; c < j->cols; c++)
			s += acc[c];
		j->out[r] = s;
	}
}

static void test_pool(void)
{
	struct llm_pool *p = (struct llm_pool *)1;
	check(llm_pool_open(&p, 0) == LLM_ERR_USAGE && !p && llm_pool_open(&p, LLM_POOL_MAX_CHUNKS + 1) == LLM_ERR_USAGE,
	      "pool: 0 or too many threads is a usage error");
	llm_pool_close(NULL);
	if (llm_pool_open(&p, 1)) {
		check(0, "pool: open 1 thread: %s", llm_errmsg());
		return;
	}
	int oc = 0;
	check(llm_pool_threads(p) == 1 && run_count(p, 37, &oc) && oc == 37, "pool of 1: every chunk on the caller");
	llm_pool_close(p);

	if (llm_pool_open(&p, 4)) {
		check(0, "pool: open 4 threads: %s", llm_errmsg());
		return;
	}
	int ok = llm_pool_threads(p) == 4 && run_count(p, 0, &oc) && oc == 0 && run_count(p, 1, &oc) && oc == 1;
	check(ok, "pool of 4: no chunk runs nothing; one chunk runs on the caller");
	ok = 1;
	for (int k = 0; k < 3000 && ok; k++)
		ok = run_count(p, 2 + k % 97, NULL);
	check(ok, "pool of 4: 3000 jobs back to back, each chunk once");
	ok = 1;
	for (int k = 0; k < 20 && ok; k++)
		ok = run_count_slow(p, 8, NULL, 1);
	check(ok, "pool of 4: a job of slow chunks returns only when every chunk is done");
	struct timespec ts = { 0, 50 * 1000 * 1000 };
	nanosleep(&ts, NULL);     /* the workers go to sleep */
	ok = run_count(p, LLM_POOL_MAX_CHUNKS, NULL) && run_count(p, 4, NULL);
	check(ok, "pool of 4: after the workers sleep, jobs of %d and 4 chunks run each chunk once",
	      LLM_POOL_MAX_CHUNKS);

	enum { R = 333, C = 257 };
	float *x = malloc(sizeof(float) * R * C), *scr = malloc(sizeof(float) * 16 * C);
	double ref[R], got[R];
	uint64_t s = 42;
	for (int i = 0; i < R * C; i++)
		x[i] = (float)((double)(llm_rng_splitmix64(&s) >> 11) * 0x1.0p-53 - 0.5);
	struct sum_job j1 = { x, R, C, ref, scr };
	sum_task(&j1, 0, 1);
	ok = 1;
	for (int n = 2; n <= 16; n++) {
		struct sum_job j = { x, R, C, got, scr };
		llm_pool_run(p, n, sum_task, &j);
		ok &= !memcmp(got, ref, sizeof ref);
	}
	check(ok, "pool of 4: row sums with per-chunk scratch, 2 to 16 chunks: the same bits as one thread");
	free(x);
	free(scr);
	llm_pool_close(p);
}

int main(void)
{
	test_buf();
	test_read_pipe();
	test_hash();
	test_pool();
	return check_done();
}
