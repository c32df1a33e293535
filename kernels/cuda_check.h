/* kernels/cuda_check.h: turn CUDA runtime and cuBLAS errors into a status
 * and a one-line message (STYLE.md section 6). Library side only: the
 * macros return from the calling function. */
#ifndef LLM_CUDA_CHECK_H
#define LLM_CUDA_CHECK_H

#include <cuda_runtime_api.h>
#include <cublas_api.h>
#include "status.h"

#define LLM_CUDA_TRY(call) do { cudaError_t e_ = (call); if (e_ != cudaSuccess)           \
	return llm_fail(LLM_ERR_CUDA, "%s:%d: %s: %s", __FILE__, __LINE__, #call,         \
	                cudaGetErrorString(e_)); } while (0)

#define LLM_CUBLAS_TRY(call) do { cublasStatus_t e_ = (call); if (e_ != CUBLAS_STATUS_SUCCESS) \
	return llm_fail(LLM_ERR_CUDA, "%s:%d: %s: %s", __FILE__, __LINE__, #call,         \
	                cublasGetStatusString(e_)); } while (0)

#endif
