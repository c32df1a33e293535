/* common/engine/lora.h: LoRA adapters (Hu et al. 2021, "LoRA: Low-Rank Adaptation
 * of Large Language Models") on the linear layers of a Llama decoder, and
 * their files in the layout Hugging Face PEFT writes and loads.
 *
 * An adapted linear layer computes y = W x + (alpha / r) B (A drop(x)),
 * W (d_out, d_in) frozen, A (r, d_in), B (d_out, r); drop() is inverted
 * dropout with probability `dropout` during training only. A starts
 * Kaiming-uniform (bound 1/sqrt(d_in), as PEFT's kaiming_uniform_(a=sqrt(5)))
 * and B at zero, so a fresh adapter leaves the model unchanged.
 *
 * Files (PEFT, save_pretrained of a LoraConfig with task_type CAUSAL_LM):
 *   adapter_config.json          peft_type LORA, r, lora_alpha, lora_dropout,
 *                                target_modules, bias "none", fan_in_fan_out
 *                                false, task_type CAUSAL_LM, ...
 *   adapter_model.safetensors    F32 tensors named
 *     base_model.model.model.layers.N.self_attn.q_proj.lora_A.weight (r, d_in)
 *     base_model.model.model.layers.N.self_attn.q_proj.lora_B.weight (d_out, r)
 *   (mlp.gate_proj, mlp.up_proj, mlp.down_proj likewise; a mixture of
 *   experts' expert E: layers.N.block_sparse_moe.experts.E.w1 (gate), w3
 *   (up), w2 (down) in Mixtral, layers.N.mlp.experts.E.gate_proj, up_proj,
 *   down_proj in Qwen3-MoE, target_modules naming w1, w3, w2 or gate_proj,
 *   up_proj, down_proj as the model names them).
 * Reference: peft/tuners/lora/{config,layer}.py, peft/utils/save_and_load.py. */
#ifndef LLM_LORA_H
#define LLM_LORA_H

#include "status.h"
#include "ckpt.h"
#include "config.h"

enum llm_lora_target {
	LLM_LORA_Q, LLM_LORA_K, LLM_LORA_V, LLM_LORA_O,
	LLM_LORA_GATE, LLM_LORA_UP, LLM_LORA_DOWN, LLM_LORA_N
};
#define LLM_LORA_ALL ((1u << LLM_LORA_N) - 1)

/* "q_proj", "k_proj", ... "down_proj" (the Hugging Face module names). */
const char *llm_lora_target_name(int t);
/* "self_attn" or "mlp": the module that holds target T. */
const char *llm_lora_target_parent(int t);
/* Parse a comma list of q,k,v,o,gate,up,down (or q_proj ... down_proj, or
 * "all") into a bit mask (1 << LLM_LORA_Q | ...). LLM_ERR_USAGE naming the
 * unknown item. */
enum llm_status llm_lora_parse_targets(const char *s, unsigned *mask);

/* A layer's adapted matrices are its slots: slot t < LLM_LORA_N is
 * projection t (on a mixture-of-experts layer gate, up and down are
 * absent: it has no dense MLP), and on a mixture-of-experts layer slot
 * LLM_LORA_N + 3 e + k is expert e's gate (k 0), up (1) or down (2), which
 * targets gate, up and down name too (PEFT's target_modules match every
 * module of that name: Mixtral's experts' w1, w3, w2, Qwen3-MoE's
 * experts' and dense layers' gate_proj, up_proj, down_proj). The router
 * (gate) is never a target. A slot's shape is its kind's: kind t for a
 * projection, LLM_LORA_N + k for an expert's. */
#define LLM_LORA_KINDS (LLM_LORA_N + 3)

static inline int llm_lora_slot(int expert, int t)
{
	return expert < 0 ? t : LLM_LORA_N + 3 * expert + (t - LLM_LORA_GATE);
}
static inline int llm_lora_kind(int slot) { return slot < LLM_LORA_N ? slot : LLM_LORA_N + (slot - LLM_LORA_N) % 3; }
/* The target (enum llm_lora_target) of a slot, and its expert (-1: none). */
static inline int llm_lora_slot_target(int slot)
{
	return slot < LLM_LORA_N ? slot : LLM_LORA_GATE + (slot - LLM_LORA_N) % 3;
}
static inline int llm_lora_slot_expert(int slot) { return slot < LLM_LORA_N ? -1 : (slot - LLM_LORA_N) / 3; }

struct llm_lora {
	int rank;                   /* r */
	float alpha;                /* lora_alpha */
	float dropout;              /* lora_dropout, in [0, 1) */
	unsigned targets;           /* bit mask of enum llm_lora_target */
	float scale;                /* alpha / rank */
	int n_layer;
	int n_expert;               /* experts of a mixture-of-experts layer; 0: a dense model */
	int n_slot;                 /* slots a layer: LLM_LORA_N + 3 * n_expert */
	enum llm_moe_names moe_names;   /* how the experts' modules are named (config.h) */
	int64_t d_in[LLM_LORA_KINDS], d_out[LLM_LORA_KINDS];   /* by kind */
	/* (n_layer * n_slot) offset into params of A (rank, d_in), followed
	 * by B (d_out, rank); SIZE_MAX where the slot is not adapted. */
	size_t *off;
	size_t n_params;
	float *params;              /* (n_params) every A and B, f32 */
	char *base_model;           /* base_model_name_or_path, may be NULL */
};

/* A fresh adapter for a model of config C: A seeded Kaiming-uniform, B zero.
 * LLM_ERR_USAGE for rank < 1, dropout outside [0, 1) or no target. */
enum llm_status llm_lora_init(struct llm_lora *lo, const struct llm_config *c, int rank,
                              float alpha, float dropout, unsigned targets, uint64_t seed);
void llm_lora_free(struct llm_lora *lo);

static inline size_t llm_lora_off(const struct llm_lora *lo, int layer, int slot)
{
	return lo->off[(size_t)layer * (size_t)lo->n_slot + (size_t)slot];
}
static inline int llm_lora_has_slot(const struct llm_lora *lo, int layer, int slot)
{
	return lo && llm_lora_off(lo, layer, slot) != (size_t)-1;
}
static inline int llm_lora_has(const struct llm_lora *lo, int layer, int t)
{
	return llm_lora_has_slot(lo, layer, t);
}
/* A (rank, d_in) and B (d_out, rank) of (LAYER, SLOT); only when llm_lora_has_slot. */
static inline float *llm_lora_slot_a(const struct llm_lora *lo, int layer, int slot)
{
	return lo->params + llm_lora_off(lo, layer, slot);
}
static inline float *llm_lora_slot_b(const struct llm_lora *lo, int layer, int slot)
{
	return llm_lora_slot_a(lo, layer, slot) + (size_t)lo->rank * (size_t)lo->d_in[llm_lora_kind(slot)];
}
/* The same of projection T (a slot below LLM_LORA_N). */
static inline float *llm_lora_a(const struct llm_lora *lo, int layer, int t) { return llm_lora_slot_a(lo, layer, t); }
static inline float *llm_lora_b(const struct llm_lora *lo, int layer, int t) { return llm_lora_slot_b(lo, layer, t); }

/* The PEFT name of the tensor holding parameter I of LO's params into NAME
 * (N bytes), and I's index in it into *AT; 0 when no tensor holds I. */
int llm_lora_param_name(const struct llm_lora *lo, size_t i, char *name, size_t n, size_t *at);

/* The inference hook, segmented: for each of the N_ROWS rows i listed in
 * ROWS (NULL: rows 0 .. n_rows - 1), Y row i (stride Y_STRIDE, d_out) +=
 * scale * (X A^T) B^T of X row i (stride X_STRIDE, d_in), the adapter of
 * (LAYER, T); nothing when that layer is not adapted. A batch whose rows
 * use several adapters calls it once per adapter with that adapter's rows
 * (the base's rows skip it). F32, single-threaded, each output row from its
 * own input row in a fixed order (batch invariant: a row gives the same
 * bits whichever rows come with it). The engine calls it right after the
 * frozen matmul of that projection. */
void llm_lora_apply(const struct llm_lora *lo, int layer, int t, float *y, int64_t y_stride,
                    const float *x, int64_t x_stride, const int32_t *rows, int64_t n_rows);
/* The same for any slot (an expert's projection: X and Y its gathered rows). */
void llm_lora_apply_slot(const struct llm_lora *lo, int layer, int slot, float *y, int64_t y_stride,
                         const float *x, int64_t x_stride, const int32_t *rows, int64_t n_rows);

#define LLM_LORA_NAME_MAX 64       /* an adapter name's bytes, its NUL included */
/* Split an adapter SPEC "NAME=DIR" or "DIR" (the name: DIR's base name,
 * trailing slashes left out) into NAME (N bytes, at most LLM_LORA_NAME_MAX) and *DIR (into SPEC).
 * LLM_ERR_USAGE naming the spec when the name is empty,
 * longer than N - 1 bytes or holds a control byte. */
enum llm_status llm_lora_spec_split(const char *spec, char *name, size_t n, const char **dir);

/* Write the adapter as PEFT does into directory DIR (created if needed):
 * adapter_config.json and adapter_model.safetensors, each atomically.
 * LLM_ERR_EXISTS when DIR already holds an adapter and FORCE is 0. */
enum llm_status llm_lora_save(const struct llm_lora *lo, const char *dir, int force);
/* Read a PEFT LoRA adapter directory for a model of config C. Refused with
 * the field named: use_dora, use_rslora, fan_in_fan_out, bias other than
 * "none", rank_pattern/alpha_pattern, layers_to_transform, modules outside
 * the seven projections (and the experts' as C names them), a mixture of
 * experts' router (gate) or all-linear (which takes the router), shapes
 * that do not fit C. Tensors F32, F16 or BF16,
 * every value finite (a NaN or Inf is LLM_ERR_RANGE naming the tensor and
 * the index). Files that are not regular (a FIFO) are refused, not waited
 * on. */
enum llm_status llm_lora_load(struct llm_lora *lo, const char *dir, const struct llm_config *c);

/* Write checkpoint OUT = BASE with W + scale * B A in every adapted weight
 * (the atomic checkpoint writer; side files copied). F32, F16 and BF16
 * weights keep their dtype; FP8 E4M3 weights are written dequantized as F32
 * (and config.json loses quantization_config), since re-quantizing would
 * change the merged weights. */
enum llm_status llm_lora_merge(const struct llm_lora *lo, const char *base, const char *out,
                               const struct llm_ckpt_write_opts *w);

#endif
