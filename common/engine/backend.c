/* common/engine/backend.c: the backend registry ("auto", "cpu", "cuda[:N]") and CPU
 * feature detection.
 *
 * A spec names one backend; nothing falls back silently: "cuda" in a build
 * without CUDA fails with "built without CUDA support". "auto" is the one
 * spec that chooses: CUDA when built with it and a device opens, else the CPU.
 *
 * The CUDA backend (kernels/, with cuBLAS) is a shared library,
 * libllm_cuda.so, loaded on the first "cuda" or "auto" (dlopen), so that a
 * program on the CPU backend never maps the CUDA libraries. It is looked
 * for in ../lib beside the program (the build tree's and make install's
 * layout), then beside the program, then on the loader's path
 * (LD_LIBRARY_PATH); "cuda" without it is an error naming it. "auto" first
 * asks whether the driver (libcuda.so.1) is there at all: without it there
 * is no device, and nothing more is loaded. The library takes a few of
 * this library's functions from the program (kernels/imports.list, which
 * the Makefile exports from every program). */
#define _GNU_SOURCE
#include "backend.h"

#include "args.h"
#include "comm.h"
#include <stdlib.h>
#include <string.h>
#ifdef LLM_CUDA
#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>
#endif
#include "banned.h"

#ifdef LLM_CUDA
#define CUDA_LIB "libllm_cuda.so"

/* What libllm_cuda.so takes from the program (kernels/imports.list): named
 * here so that every program that can load it links them in. */
__attribute__((used)) static const void *const cuda_imports[] = {
	(const void *)llm_fail, (const void *)llm_fail_prefix, (const void *)llm_dtype_name, (const void *)llm_dtype_size,
	(const void *)llm_comm_bcast, (const void *)llm_comm_world,
};

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static const struct llm_backend_ops *cuda_ops;   /* NULL: not loaded, cuda_why says why */
static int (*cuda_count)(void);                  /* llm_cuda_device_count */
static int (*cuda_mem)(int, size_t *);           /* llm_cuda_mem_free */
static char cuda_why[2 * PATH_MAX + 256];

/* dlopen PATH and take its two symbols; 0 on success, else cuda_why set */
static int cuda_try(const char *path)
{
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!h) {
		snprintf(cuda_why, sizeof cuda_why, "%s", dlerror());
		return -1;
	}
	cuda_ops = dlsym(h, "llm_cuda_ops");
	*(void **)&cuda_count = dlsym(h, "llm_cuda_device_count");
	*(void **)&cuda_mem = dlsym(h, "llm_cuda_mem_free");
	if (!cuda_ops || !cuda_count) {
		snprintf(cuda_why, sizeof cuda_why, "%s: llm_cuda_ops or llm_cuda_device_count missing", path);
		cuda_ops = NULL;
		dlclose(h);
		return -1;
	}
	return 0;
}

static void cuda_load(void)
{
	char exe[PATH_MAX], path[PATH_MAX + 64];
	ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
	char *slash = n > 0 ? memrchr(exe, '/', (size_t)n) : NULL;
	const char *dir = ".";
	if (slash) {
		*slash = 0;
		dir = exe;
	}
	/* a library that is there but does not load (a CUDA library missing)
	 * is reported as such, not as absent */
	static const char *const where[] = { "%s/../lib/" CUDA_LIB, "%s/" CUDA_LIB };
	for (size_t i = 0; i < sizeof where / sizeof *where; i++) {
		snprintf(path, sizeof path, where[i], dir);
		if (!access(path, F_OK)) {
			cuda_try(path);
			return;
		}
	}
	if (cuda_try(CUDA_LIB))
		snprintf(cuda_why, sizeof cuda_why, CUDA_LIB " not found in %s/../lib, %s or the loader's path "
		         "(build with make CUDA=1, or install it beside the program)", dir, dir);
}

/* The CUDA backend's ops, loading it on first use; NULL with the reason in
 * the error message when it cannot be loaded. */
static const struct llm_backend_ops *cuda_backend(const char *spec)
{
	pthread_once(&cuda_once, cuda_load);
	if (!cuda_ops)
		llm_fail(LLM_ERR_UNSUPPORTED, "backend '%s': %s", spec, cuda_why);
	return cuda_ops;
}

/* auto: is there a device? Without the driver there is none, and the CUDA
 * libraries are not loaded at all. */
static int cuda_present(void)
{
	void *drv = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_LOCAL);
	if (!drv)
		return 0;
	dlclose(drv);
	return cuda_backend("auto") && cuda_count() > 0;
}
#endif

int llm_backend_cuda_devices(void)
{
#ifdef LLM_CUDA
	return cuda_present() ? cuda_count() : 0;
#else
	return 0;
#endif
}

enum llm_status llm_backend_cuda_mem_free(int dev, size_t *bytes)
{
	*bytes = 0;
#ifdef LLM_CUDA
	if (!cuda_backend("cuda"))
		return LLM_ERR_UNSUPPORTED;
	if (!cuda_mem || cuda_mem(dev, bytes))
		return llm_fail(LLM_ERR_IO, "cuda:%d: cudaMemGetInfo failed", dev);
	return LLM_OK;
#else
	(void)dev;
	return llm_fail(LLM_ERR_UNSUPPORTED, "built without CUDA support");
#endif
}

const char *llm_op_name(enum llm_op op)
{
	static const char *n[LLM_OP_COUNT] = {
		"embed", "rmsnorm", "matmul", "rope", "kv_store", "attention", "swiglu", "add", "gather",
	};
	return (unsigned)op < LLM_OP_COUNT ? n[op] : "?";
}

enum llm_status llm_backend_open(const char *spec, const struct llm_backend_opts *o,
                                 struct llm_backend **out)
{
	static const struct llm_backend_opts defaults = LLM_BACKEND_OPTS_DEFAULT;
	const struct llm_backend_ops *ops = NULL;
	struct llm_backend_opts opts = o ? *o : defaults;
	*out = NULL;
	if (!spec || !*spec)
		spec = "auto";
	if (!strcmp(spec, "cpu")) {
		ops = &llm_cpu_ops;
	} else if (!strcmp(spec, "cuda") || !strncmp(spec, "cuda:", 5)) {
#ifdef LLM_CUDA
		if (spec[4] == ':') {
			int64_t d;
			if (llm_parse_int(spec + 5, 0, 1023, &d))
				return llm_fail(LLM_ERR_USAGE, "backend '%s': bad device number", spec);
			opts.device = (int)d;
		}
		if (!(ops = cuda_backend(spec)))
			return LLM_ERR_UNSUPPORTED;
#else
		return llm_fail(LLM_ERR_UNSUPPORTED, "backend '%s': built without CUDA support", spec);
#endif
	} else if (!strcmp(spec, "auto")) {
#ifdef LLM_CUDA
		ops = cuda_present() ? cuda_ops : &llm_cpu_ops;
#else
		ops = &llm_cpu_ops;
#endif
	} else {
		return llm_fail(LLM_ERR_USAGE, "backend '%s': unknown (auto, cpu, cuda, cuda:N)", spec);
	}
	struct llm_backend *be = calloc(1, sizeof *be);
	if (!be)
		return llm_fail(LLM_ERR_NOMEM, "backend: out of memory");
	be->ops = ops;
	enum llm_status s = ops->init(be, &opts);
	if (s && !strcmp(spec, "auto") && ops != &llm_cpu_ops) {
		/* auto: CUDA when a device answers, else the CPU */
		memset(be, 0, sizeof *be);
		be->ops = &llm_cpu_ops;
		s = llm_cpu_ops.init(be, &opts);
	}
	if (s) {
		free(be);
		return s;
	}
	*out = be;
	return LLM_OK;
}

void llm_backend_close(struct llm_backend *be)
{
	if (!be)
		return;
	if (be->ops && be->ops->fini)
		be->ops->fini(be);
	free(be);
}

enum llm_status llm_backend_require(struct llm_backend *be, enum llm_op op,
                                    enum llm_dtype w, enum llm_dtype act)
{
	if (!be->ops->supports(op, w, act))
		return llm_fail(LLM_ERR_UNSUPPORTED, "backend %s: op %s with %s weights and %s activations",
		                be->ops->name, llm_op_name(op), llm_dtype_name(w), llm_dtype_name(act));
	return LLM_OK;
}
