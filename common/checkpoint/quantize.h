/* common/checkpoint/quantize.h: FP8 E4M3 block quantization of checkpoints, and back.
 *
 * Group-wise scales: a weight (d_out, d_in) is cut into blocks of
 * block_rows x block_cols (the last ones partial); each block stores
 * scale = amax / 448 and codes e4m3(x / scale) (round to nearest even,
 * saturating); an all-zero block stores scale 0 and zero codes.
 *
 * The output is in a layout the peers load (llm-checkpoint(5)): blocks as
 * the "fp8" method ("<name>.weight_scale_inv", weight_block_size), per
 * channel (block_cols 0) as "compressed-tensors" ("<name>.weight_scale"
 * (d_out, 1), strategy "channel"); quantization_config lists the linear
 * modules left plain. */
#ifndef LLM_QUANTIZE_H
#define LLM_QUANTIZE_H

#include "ckpt.h"

struct llm_quant_opts {
	int64_t block_rows, block_cols;  /* block shape; block_cols 0: whole row (1xK, block_rows 1 or 0) */
	int dequantize;                  /* FP8 -> out_dtype instead */
	enum llm_dtype out_dtype;        /* dequantize/random: F32, F16 or BF16 (E4M3 for random fp8) */
	const char *include;             /* regex of tensor names to quantize (NULL: decoder linears) */
	int fp8_vocab;                   /* 1: the embedding and lm_head too (a file peers do not load) */
	const char *exclude;             /* regex of names never quantized (NULL: none) */
	int stats;                       /* 1: table on stderr, 2: JSONL on stdout */
	int threads;                     /* worker threads (0: all cores) */
	struct llm_ckpt_write_opts write;  /* .progress: NULL or the tool's (progress.h) */
	/* random checkpoints */
	uint64_t seed;
	const char *tokenizer_dir;       /* side files to copy into a random checkpoint */
};

/* The default set of quantized tensors: the linear weights of the decoder
 * layers (q, k, v, o, gate, up, down, and each expert's gate, up and down:
 * Qwen3-MoE's mlp.experts.E.*_proj, Mixtral's block_sparse_moe.experts.E.w1,
 * w3, w2), what transformers' and vLLM's fp8 loaders quantize; the
 * embedding, lm_head and the experts' routers stay in their dtype, lm_head
 * and the routers named in quantization_config.modules_to_not_convert. */
#define LLM_QUANT_DEFAULT_INCLUDE \
	"^model\\.layers\\.[0-9]+\\.(self_attn\\.(q|k|v|o)_proj|mlp\\.(experts\\.[0-9]+\\.)?(gate|up|down)_proj|" \
	"block_sparse_moe\\.experts\\.[0-9]+\\.w[123])\\.weight$"
/* The routers of mixture-of-experts layers (Qwen3-MoE's mlp.gate, Mixtral's
 * block_sparse_moe.gate): linears the peers' fp8 loaders keep plain
 * (vLLM builds them unquantized: they pick the experts). */
#define LLM_QUANT_ROUTER "^model\\.layers\\.[0-9]+\\.(mlp|block_sparse_moe)\\.gate\\.weight$"
/* What fp8_vocab (llm-quantize --fp8-vocab) adds, with one scale per row:
 * a file that only llm-tools load, marked so in quantization_config
 * ("llm_tools_fp8_vocab": the modules in FP8 that the peers keep plain). */
#define LLM_QUANT_VOCAB_INCLUDE "^model\\.embed_tokens\\.weight$|^lm_head\\.weight$"

/* Quantize (or dequantize) checkpoint IN into OUT. */
enum llm_status llm_quantize(const char *in, const char *out, const struct llm_quant_opts *o);
/* Write a seeded random-weight Llama checkpoint for CONFIG (a config.json). */
enum llm_status llm_quantize_random(const char *config, const char *out, const struct llm_quant_opts *o);

/* Quantize one band of ROWS x COLS floats (rows <= block_rows) into codes
 * and the band's row of scales (ceil(cols / block_cols) values). */
void llm_quantize_band(const float *x, int64_t rows, int64_t cols, int64_t block_cols,
                       uint8_t *codes, float *scales);

#endif
