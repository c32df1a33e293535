/* bench/gpu_bandwidth.c: the device memory bandwidth the decode roofline
 * divides by (bench/gpu.sh, step decode): the median of ITERS event-timed
 * device-to-device copies of a buffer far larger than the L2 cache, after
 * WARMUP copies, counted as bytes read plus bytes written per second. A
 * decode step mostly reads; a copy reads and writes the same number of
 * bytes, so this is the rate of mixed traffic the memory sustains, the
 * figure a bandwidth roofline of the device uses. One JSON object on
 * stdout. Exit status: 0 ok, 1 no device or a CUDA error, 2 usage. */
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llm.h"
#include "banned.h"

#define WARMUP 3

static int cmp_float(const void *a, const void *b)
{
	float x = *(const float *)a, y = *(const float *)b;
	return (x > y) - (x < y);
}

static int fail(const char *what, cudaError_t e)
{
	fprintf(stderr, "gpu_bandwidth: %s: %s\n", what, cudaGetErrorString(e));
	return 1;
}

int main(int argc, char **argv)
{
	int64_t mib = 2048, iters = 20;
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--mib") && i + 1 < argc && !llm_parse_int(argv[i + 1], 1, 1 << 20, &mib))
			i++;
		else if (!strcmp(argv[i], "--iters") && i + 1 < argc && !llm_parse_int(argv[i + 1], 1, 10000, &iters))
			i++;
		else {
			fprintf(stderr, "usage: gpu_bandwidth [--mib N] [--iters N]\n");
			return 2;
		}
	}
	int n = 0;
	cudaError_t e = cudaGetDeviceCount(&n);
	if (e != cudaSuccess || n == 0) {
		fprintf(stderr, "gpu_bandwidth: no CUDA device\n");
		return 1;
	}
	struct cudaDeviceProp p;
	if ((e = cudaGetDeviceProperties(&p, 0)) != cudaSuccess)
		return fail("cudaGetDeviceProperties", e);
	size_t bytes = (size_t)mib << 20;   /* per buffer; two buffers */
	void *a = NULL, *b = NULL;
	cudaEvent_t e0, e1;
	float *ms = malloc((size_t)iters * sizeof *ms);
	if (!ms)
		return 1;
	if ((e = cudaMalloc(&a, bytes)) != cudaSuccess || (e = cudaMalloc(&b, bytes)) != cudaSuccess)
		return fail("cudaMalloc", e);
	if ((e = cudaMemset(a, 0x5a, bytes)) != cudaSuccess || (e = cudaEventCreate(&e0)) != cudaSuccess
	    || (e = cudaEventCreate(&e1)) != cudaSuccess)
		return fail("setup", e);
	for (int64_t i = 0; i < WARMUP + iters; i++) {
		if ((e = cudaEventRecord(e0, 0)) != cudaSuccess
		    || (e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0)) != cudaSuccess
		    || (e = cudaEventRecord(e1, 0)) != cudaSuccess || (e = cudaEventSynchronize(e1)) != cudaSuccess)
			return fail("copy", e);
		if (i >= WARMUP && (e = cudaEventElapsedTime(&ms[i - WARMUP], e0, e1)) != cudaSuccess)
			return fail("cudaEventElapsedTime", e);
	}
	qsort(ms, (size_t)iters, sizeof *ms, cmp_float);
	double med = ms[iters / 2] * 1e-3;
	printf("{\"device\": \"%s\", \"sm\": %d%d, \"l2_bytes\": %d, \"buffer_bytes\": %zu, \"iters\": %lld, "
	       "\"median_s\": %.9f, \"copy_gbs\": %.1f, \"method\": \"cudaMemcpyAsync device to device, "
	       "(bytes read + bytes written) / median time\"}\n",
	       p.name, p.major, p.minor, p.l2CacheSize, bytes, (long long)iters, med, 2.0 * (double)bytes / med * 1e-9);
	cudaFree(a);
	cudaFree(b);
	free(ms);
	return 0;
}
