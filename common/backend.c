/* common/backend.c: the backend registry ("auto", "cpu", "cuda[:N]") and CPU
 * feature detection.
 *
 * A spec names one backend; nothing falls back silently: "cuda" in a build
 * without CUDA fails with "built without CUDA support". "auto" is the one
 * spec that chooses: CUDA when built with it and a device opens, else the CPU. */
#include "backend.h"

#include "args.h"
#include <stdlib.h>
#include <string.h>
#include "banned.h"

#ifdef LLM_CUDA
int llm_cuda_device_count(void);   /* kernels/cuda_ops.c: 0 without a device or driver */
#endif

static const char *isa_names[LLM_ISA_COUNT] = {
	[LLM_ISA_SCALAR] = "scalar", [LLM_ISA_AVX2] = "avx2",
	[LLM_ISA_AVX512] = "avx512", [LLM_ISA_AVX512BF16] = "avx512bf16",
};

const char *llm_cpu_isa_name(enum llm_cpu_isa isa)
{
	if (isa == LLM_ISA_AUTO)
		return "auto";
	return (unsigned)isa < LLM_ISA_COUNT ? isa_names[isa] : "?";
}

int llm_cpu_isa_parse(const char *s)
{
	if (!strcmp(s, "auto"))
		return LLM_ISA_AUTO;
	for (int i = 0; i < LLM_ISA_COUNT; i++)
		if (!strcmp(s, isa_names[i]))
			return i;
	return -2;
}

enum llm_cpu_isa llm_cpu_isa_detect(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_cpu_init();
	int avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
	/* F16C has no __builtin_cpu_supports name in gcc 12: every AVX2 CPU has it */
	int avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw")
	             && __builtin_cpu_supports("avx512vl");
	if (avx512 && __builtin_cpu_supports("avx512bf16"))
		return LLM_ISA_AVX512BF16;
	if (avx512)
		return LLM_ISA_AVX512;
	if (avx2)
		return LLM_ISA_AVX2;
#endif
	return LLM_ISA_SCALAR;
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
		ops = &llm_cuda_ops;
#else
		return llm_fail(LLM_ERR_UNSUPPORTED, "backend '%s': built without CUDA support", spec);
#endif
	} else if (!strcmp(spec, "auto")) {
#ifdef LLM_CUDA
		ops = llm_cuda_device_count() > 0 ? &llm_cuda_ops : &llm_cpu_ops;
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
