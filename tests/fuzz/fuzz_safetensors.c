/* tests/fuzz/fuzz_safetensors.c: libFuzzer harness for the safetensors
 * validator. Every input must be either accepted with all invariants of
 * safetensors.h holding, or refused with a status; never a crash.
 *   make fuzz && build-fuzz/fuzz_safetensors -max_total_time=600 tests/data/malformed */
#include "llm.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct llm_st_file f;
	llm_log_level = 0;
	if (llm_st_parse(&f, "fuzz", data, size) == LLM_OK) {
		/* invariants: tensors inside the file, contiguous, sizes agree */
		size_t at = f.data_start;
		for (size_t i = 0; i < f.n_tensor; i++) {
			const struct llm_tensor *t = &f.tensors[i];
			if (f.data_start + t->offset != at || at + t->nbytes > size ||
			    (size_t)llm_tensor_numel(t) * llm_dtype_size(t->dtype) != t->nbytes)
				__builtin_trap();
			at += t->nbytes;
			volatile uint8_t sink = 0;
			if (t->nbytes)
				sink ^= ((const uint8_t *)t->data)[t->nbytes - 1];
			(void)sink;
		}
		if (at != size)
			__builtin_trap();
	}
	llm_st_close(&f);
	return 0;
}
