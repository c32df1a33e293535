/* bench/cpu_bandwidth.c: the memory read bandwidth of this machine, the
 * roofline bench/engine.sh divides decode's bytes per token by.
 *
 *   cpu_bandwidth [THREADS [MIB [PASSES]]]     (defaults: 1, 1024, 7)
 *
 * THREADS threads each read their own contiguous slice of one MIB-MiB buffer
 * (touched first, so every page is resident), summing 64-bit words so the
 * loads cannot be dropped; a pass ends when every thread has read its slice.
 * It prints one JSON line: the best pass's GB/s (10^9 bytes per second) and
 * the median, the way decode reads weights: a streaming read of far more
 * bytes than the caches hold. Build: cc -O2 -march=native -pthread. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct slice {
	const uint64_t *p;	/* (n,) words of this thread's slice */
	size_t n;
	uint64_t sum;
	pthread_barrier_t *go;
};

static double now_s(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec * 1e-9;
}

/* Eight independent sums so the adds are not one dependency chain. */
static void *slice_read(void *arg)
{
	struct slice *s = arg;
	uint64_t a[8] = { 0 };
	pthread_barrier_wait(s->go);
	for (size_t i = 0; i + 8 <= s->n; i += 8)
		for (int k = 0; k < 8; k++)
			a[k] += s->p[i + k];
	for (int k = 0; k < 8; k++)
		s->sum += a[k];
	return NULL;
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

int main(int argc, char **argv)
{
	int nt = argc > 1 ? atoi(argv[1]) : 1;
	size_t mib = argc > 2 ? (size_t)atol(argv[2]) : 1024;
	int passes = argc > 3 ? atoi(argv[3]) : 7;
	if (nt < 1 || nt > 256 || mib < 1 || passes < 1 || passes > 100) {
		fprintf(stderr, "usage: cpu_bandwidth [THREADS [MIB [PASSES]]]\n");
		return 2;
	}
	size_t bytes = mib << 20, words = bytes / 8;
	uint64_t *buf = aligned_alloc(4096, bytes);	/* (words,) */
	if (!buf) {
		fprintf(stderr, "cpu_bandwidth: cannot allocate %zu MiB\n", mib);
		return 1;
	}
	memset(buf, 1, bytes);
	double gbs[100];
	uint64_t total = 0;
	for (int r = 0; r < passes; r++) {
		pthread_barrier_t go;
		pthread_barrier_init(&go, NULL, (unsigned)nt + 1);
		struct slice s[256];
		pthread_t th[256];
		size_t per = words / (size_t)nt / 8 * 8;
		for (int t = 0; t < nt; t++) {
			s[t] = (struct slice){ buf + per * (size_t)t, per, 0, &go };
			pthread_create(&th[t], NULL, slice_read, &s[t]);
		}
		double t0 = now_s();
		pthread_barrier_wait(&go);
		for (int t = 0; t < nt; t++) {
			pthread_join(th[t], NULL);
			total += s[t].sum;
		}
		gbs[r] = (double)(per * (size_t)nt * 8) / (now_s() - t0) / 1e9;
		pthread_barrier_destroy(&go);
	}
	double best = 0;
	for (int r = 0; r < passes; r++)
		best = gbs[r] > best ? gbs[r] : best;
	qsort(gbs, (size_t)passes, sizeof gbs[0], cmp_double);
	printf("{\"threads\": %d, \"mib\": %zu, \"passes\": %d, \"best_gb_s\": %.2f, "
	       "\"median_gb_s\": %.2f, \"check\": %llu}\n", nt, mib, passes, best,
	       gbs[passes / 2], (unsigned long long)(total & 0xff));
	free(buf);
	return 0;
}
