/* common/engine/lora.c: LoRA adapter layout, initialization, the inference hook,
 * PEFT adapter files and merging into a checkpoint (see lora.h). */
#define _GNU_SOURCE
#include "lora.h"
#include "config.h"
#include "backend.h"
#include "fileio.h"
#include "hash.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include "banned.h"

#define LORA_MAX_RANK 4096

static const char *const target_names[LLM_LORA_N] = {
	"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"
};
static const char *const target_short[LLM_LORA_N] = { "q", "k", "v", "o", "gate", "up", "down" };

const char *llm_lora_target_name(int t) { return t >= 0 && t < LLM_LORA_N ? target_names[t] : "?"; }
const char *llm_lora_target_parent(int t) { return t <= LLM_LORA_O ? "self_attn" : "mlp"; }

static int target_parse1(const char *s, size_t n)
{
	for (int t = 0; t < LLM_LORA_N; t++)
		if ((strlen(target_short[t]) == n && !strncmp(s, target_short[t], n)) ||
		    (strlen(target_names[t]) == n && !strncmp(s, target_names[t], n)))
			return t;
	return -1;
}

enum llm_status llm_lora_parse_targets(const char *s, unsigned *mask)
{
	*mask = 0;
	if (!strcmp(s, "all")) {
		*mask = LLM_LORA_ALL;
		return LLM_OK;
	}
	while (*s) {
		const char *e = strchr(s, ',');
		size_t n = e ? (size_t)(e - s) : strlen(s);
		int t = target_parse1(s, n);
		if (t < 0)
			return llm_fail(LLM_ERR_USAGE, "target '%.*s' is not one of q,k,v,o,gate,up,down", (int)n, s);
		*mask |= 1u << t;
		s += n + (e ? 1 : 0);
	}
	if (!*mask)
		return llm_fail(LLM_ERR_USAGE, "no LoRA target given");
	return LLM_OK;
}

/* ---- layout ------------------------------------------------------------- */

/* The module name of target T in a model named NAMES: a mixture of experts
 * in Mixtral's names calls its experts' gate, up and down w1, w3, w2 (it
 * has no dense MLP to name). */
static const char *module_name(int t, int n_expert, enum llm_moe_names names)
{
	static const char *const mixtral[3] = { "w1", "w3", "w2" };
	if (n_expert && names == LLM_MOE_NAMES_MIXTRAL && t >= LLM_LORA_GATE)
		return mixtral[t - LLM_LORA_GATE];
	return target_names[t];
}

static enum llm_status layout(struct llm_lora *lo, const struct llm_config *c, int rank, float alpha,
                              float dropout, unsigned targets)
{
	memset(lo, 0, sizeof *lo);
	if (rank < 1 || rank > LORA_MAX_RANK)
		return llm_fail(LLM_ERR_USAGE, "LoRA rank %d is outside [1, %d]", rank, LORA_MAX_RANK);
	if (!(dropout >= 0.0f && dropout < 1.0f))
		return llm_fail(LLM_ERR_USAGE, "LoRA dropout %g is outside [0, 1)", (double)dropout);
	if (!(targets & LLM_LORA_ALL))
		return llm_fail(LLM_ERR_USAGE, "no LoRA target given");
	lo->rank = rank;
	lo->alpha = alpha;
	lo->dropout = dropout;
	lo->targets = targets & LLM_LORA_ALL;
	lo->scale = alpha / (float)rank;
	lo->n_layer = c->n_layer;
	lo->n_expert = c->moe.n_expert;
	lo->n_slot = LLM_LORA_N + 3 * lo->n_expert;
	lo->moe_names = c->moe.names;
	int64_t dq = (int64_t)c->n_head * c->d_head, dkv = (int64_t)c->n_kv_head * c->d_head, fe = c->moe.d_ff_expert;
	int64_t din[LLM_LORA_KINDS] = { c->d_model, c->d_model, c->d_model, dq, c->d_model, c->d_model, c->d_ff,
	                                c->d_model, c->d_model, fe };
	int64_t dout[LLM_LORA_KINDS] = { dq, dkv, dkv, c->d_model, c->d_ff, c->d_ff, c->d_model, fe, fe, c->d_model };
	memcpy(lo->d_in, din, sizeof din);
	memcpy(lo->d_out, dout, sizeof dout);
	size_t n_off = (size_t)c->n_layer * (size_t)lo->n_slot;
	lo->off = malloc(n_off * sizeof *lo->off);
	if (!lo->off)
		return llm_fail(LLM_ERR_NOMEM, "LoRA: out of memory");
	size_t n = 0;
	for (int l = 0; l < c->n_layer; l++)
		for (int sl = 0; sl < lo->n_slot; sl++) {
			int t = llm_lora_slot_target(sl), k = llm_lora_kind(sl);
			/* a mixture-of-experts layer's MLP targets are its experts' */
			int here = sl < LLM_LORA_N ? t < LLM_LORA_GATE || !llm_moe_layer(c, l) : llm_moe_layer(c, l);
			size_t *o = &lo->off[(size_t)l * (size_t)lo->n_slot + (size_t)sl];
			if (!(lo->targets >> t & 1) || !here) {
				*o = (size_t)-1;
				continue;
			}
			*o = n;
			n += (size_t)rank * (size_t)(din[k] + dout[k]);
		}
	lo->n_params = n;
	if (!(lo->params = calloc(n ? n : 1, sizeof(float)))) {
		llm_lora_free(lo);
		return llm_fail(LLM_ERR_NOMEM, "LoRA: cannot allocate %zu parameters", n);
	}
	return LLM_OK;
}

enum llm_status llm_lora_init(struct llm_lora *lo, const struct llm_config *c, int rank,
                              float alpha, float dropout, unsigned targets, uint64_t seed)
{
	LLM_TRY(layout(lo, c, rank, alpha, dropout, targets));
	uint64_t st = seed;                 /* the splitmix64 stream of the A initialization */
	for (int l = 0; l < lo->n_layer; l++)
		for (int sl = 0; sl < lo->n_slot; sl++) {
			if (!llm_lora_has_slot(lo, l, sl))
				continue;
			float *a = llm_lora_slot_a(lo, l, sl);
			int64_t din = lo->d_in[llm_lora_kind(sl)];
			double bound = 1.0 / sqrt((double)din);
			for (int64_t i = 0; i < (int64_t)rank * din; i++) {
				double u = (double)(llm_rng_splitmix64(&st) >> 11) * 0x1.0p-53;   /* [0, 1) */
				a[i] = (float)((2.0 * u - 1.0) * bound);
			}
		}
	return LLM_OK;
}

void llm_lora_free(struct llm_lora *lo)
{
	free(lo->off);
	free(lo->params);
	free(lo->base_model);
	memset(lo, 0, sizeof *lo);
}

/* sum a[i] b[i] over N: 8 partial sums (lane i % 8), then tree-summed, an
 * order fixed by N alone, which the compiler can keep in vector registers
 * (a single running sum it may not reorder, and ran scalar) */
static float dot(const float *a, const float *b, int64_t n)
{
	float p[8] = { 0 };
	int64_t i = 0;
	for (; i + 8 <= n; i += 8)
		for (int j = 0; j < 8; j++)
			p[j] += a[i + j] * b[i + j];
	for (int j = 0; i < n; i++, j++)
		p[j] += a[i] * b[i];
	return ((p[0] + p[4]) + (p[2] + p[6])) + ((p[1] + p[5]) + (p[3] + p[7]));
}

void llm_lora_apply(const struct llm_lora *lo, int layer, int t, float *y, int64_t y_stride,
                    const float *x, int64_t x_stride, const int32_t *rows, int64_t n_rows)
{
	llm_lora_apply_slot(lo, layer, t, y, y_stride, x, x_stride, rows, n_rows);
}

void llm_lora_apply_slot(const struct llm_lora *lo, int layer, int slot, float *y, int64_t y_stride,
                         const float *x, int64_t x_stride, const int32_t *rows, int64_t n_rows)
{
	if (!llm_lora_has_slot(lo, layer, slot))
		return;
	const float *A = llm_lora_slot_a(lo, layer, slot), *B = llm_lora_slot_b(lo, layer, slot);
	int64_t r = lo->rank, din = lo->d_in[llm_lora_kind(slot)], dout = lo->d_out[llm_lora_kind(slot)];
	int64_t chunk = LORA_MAX_RANK / r;     /* rows whose (rank) intermediates fit u */
	float u[LORA_MAX_RANK];                 /* (chunk, rank) scale * x A^T */
	/* A chunk of rows goes through A row by row, then B row by row, so each
	 * adapter row is read once per chunk rather than once per token; every
	 * sum runs over its own row in the same order whatever the chunk, so a
	 * row's result does not depend on the others (batch invariance). */
	for (int64_t i0 = 0; i0 < n_rows; i0 += chunk) {
		int64_t nc = n_rows - i0 < chunk ? n_rows - i0 : chunk;
		for (int64_t k = 0; k < r; k++) {
			const float *ak = A + k * din;
			for (int64_t i = 0; i < nc; i++) {
				const float *xr = x + (rows ? rows[i0 + i] : i0 + i) * x_stride;
				u[i * r + k] = lo->scale * dot(ak, xr, din);
			}
		}
		for (int64_t o = 0; o < dout; o++) {
			const float *bo = B + o * r;
			for (int64_t i = 0; i < nc; i++) {
				y[(rows ? rows[i0 + i] : i0 + i) * y_stride + o] += dot(bo, u + i * r, r);
			}
		}
	}
}

/* ---- PEFT files --------------------------------------------------------- */

/* "model.layers.N.self_attn.q_proj" and the like: the module of (LAYER,
 * SLOT) into BUF */
static void module_path(const struct llm_lora *lo, char *buf, size_t n, int layer, int slot)
{
	int t = llm_lora_slot_target(slot), e = llm_lora_slot_expert(slot);
	if (e < 0)
		snprintf(buf, n, "model.layers.%d.%s.%s", layer, llm_lora_target_parent(t), target_names[t]);
	else
		snprintf(buf, n, "model.layers.%d.%s.experts.%d.%s", layer,
		         lo->moe_names == LLM_MOE_NAMES_MIXTRAL ? "block_sparse_moe" : "mlp", e,
		         module_name(t, lo->n_expert, lo->moe_names));
}

static void tensor_name(const struct llm_lora *lo, char *buf, size_t n, int layer, int slot, int is_b)
{
	char mod[128];
	module_path(lo, mod, sizeof mod, layer, slot);
	snprintf(buf, n, "base_model.model.%s.lora_%c.weight", mod, is_b ? 'B' : 'A');
}

int llm_lora_param_name(const struct llm_lora *lo, size_t i, char *name, size_t n, size_t *at)
{
	for (int l = 0; l < lo->n_layer; l++)
		for (int sl = 0; sl < lo->n_slot; sl++) {
			if (!llm_lora_has_slot(lo, l, sl))
				continue;
			int k = llm_lora_kind(sl);
			size_t a0 = llm_lora_off(lo, l, sl), na = (size_t)lo->rank * (size_t)lo->d_in[k];
			size_t nb = (size_t)lo->d_out[k] * (size_t)lo->rank;
			if (i >= a0 && i < a0 + na + nb) {
				int b = i >= a0 + na;
				tensor_name(lo, name, n, l, sl, b);
				*at = i - a0 - (b ? na : 0);
				return 1;
			}
		}
	return 0;
}

static enum llm_status mkdir_p1(const char *dir)
{
	if (mkdir(dir, 0755) && errno != EEXIST)
		return llm_fail(LLM_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
	if (!llm_is_dir(dir))
		return llm_fail(LLM_ERR_IO, "%s: exists and is not a directory", dir);
	return LLM_OK;
}

enum llm_status llm_lora_save(const struct llm_lora *lo, const char *dir, int force)
{
	LLM_TRY(mkdir_p1(dir));
	char *st = llm_path_join(dir, "adapter_model.safetensors");
	char *cj = llm_path_join(dir, "adapter_config.json");
	size_t n = 0;
	for (int l = 0; l < lo->n_layer; l++)
		for (int sl = 0; sl < lo->n_slot; sl++)
			n += llm_lora_has_slot(lo, l, sl) ? 2 : 0;
	struct llm_tensor *d = calloc(n ? n : 1, sizeof *d);
	const float **src = calloc(n ? n : 1, sizeof *src);
	enum llm_status s = LLM_OK;
	struct llm_ckpt_writer *w = NULL;
	json_t *root = NULL, *tm = NULL;
	char *js = NULL;
	if (!st || !cj || !d || !src) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	if (!force && (llm_exists(st) || llm_exists(cj))) {
		s = llm_fail(LLM_ERR_EXISTS, "%s: holds an adapter already (--force replaces it)", dir);
		goto out;
	}
	size_t k = 0;
	for (int l = 0; l < lo->n_layer; l++)
		for (int sl = 0; sl < lo->n_slot; sl++) {
			if (!llm_lora_has_slot(lo, l, sl))
				continue;
			int kd = llm_lora_kind(sl);
			for (int b = 0; b < 2; b++, k++) {
				char name[192];
				tensor_name(lo, name, sizeof name, l, sl, b);
				d[k].name = llm_strdup(name);
				d[k].dtype = LLM_DTYPE_F32;
				d[k].n_dim = 2;
				d[k].shape[0] = b ? lo->d_out[kd] : lo->rank;
				d[k].shape[1] = b ? lo->rank : lo->d_in[kd];
				d[k].nbytes = (size_t)(d[k].shape[0] * d[k].shape[1]) * sizeof(float);
				src[k] = b ? llm_lora_slot_b(lo, l, sl) : llm_lora_slot_a(lo, l, sl);
				if (!d[k].name) {
					s = llm_fail(LLM_ERR_NOMEM, "out of memory");
					goto out;
				}
			}
		}
	struct llm_ckpt_write_opts wo = { .force = 1 };
	if ((s = llm_ckpt_write_begin(&w, st, d, n, NULL, 0, &wo)))
		goto out;
	long i;
	while (!s && (i = llm_ckpt_write_next(w)) >= 0)
		s = llm_ckpt_write_data(w, src[i], d[i].nbytes);
	if (s)
		goto out;
	s = llm_ckpt_write_commit(w);
	w = NULL;
	if (s)
		goto out;
	/* adapter_config.json: the fields of PEFT's LoraConfig, sorted as
	 * save_pretrained writes them (json.dumps(indent=2, sort_keys=True)) */
	tm = json_array();
	for (int t = 0; t < LLM_LORA_N; t++)
		if (lo->targets >> t & 1)
			json_array_append_new(tm, json_string(module_name(t, lo->n_expert, lo->moe_names)));
	root = json_object();
	json_object_set_new(root, "alpha_pattern", json_object());
	json_object_set_new(root, "auto_mapping", json_null());
	json_object_set_new(root, "base_model_name_or_path",
	                    lo->base_model ? json_string(lo->base_model) : json_null());
	json_object_set_new(root, "bias", json_string("none"));
	json_object_set_new(root, "fan_in_fan_out", json_false());
	json_object_set_new(root, "inference_mode", json_true());
	json_object_set_new(root, "init_lora_weights", json_true());
	json_object_set_new(root, "layers_pattern", json_null());
	json_object_set_new(root, "layers_to_transform", json_null());
	/* an integer alpha is written as an integer, as Python would */
	if (lo->alpha == floorf(lo->alpha) && fabsf(lo->alpha) < 1e9f)
		json_object_set_new(root, "lora_alpha", json_integer((json_int_t)lo->alpha));
	else
		json_object_set_new(root, "lora_alpha", json_real(lo->alpha));
	json_object_set_new(root, "lora_dropout", json_real((double)lo->dropout));
	json_object_set_new(root, "modules_to_save", json_null());
	json_object_set_new(root, "peft_type", json_string("LORA"));
	json_object_set_new(root, "r", json_integer(lo->rank));
	json_object_set_new(root, "rank_pattern", json_object());
	json_object_set_new(root, "revision", json_null());
	json_object_set_new(root, "target_modules", tm);
	tm = NULL;
	json_object_set_new(root, "task_type", json_string("CAUSAL_LM"));
	json_object_set_new(root, "use_dora", json_false());
	json_object_set_new(root, "use_rslora", json_false());
	js = json_dumps(root, JSON_INDENT(2) | JSON_SORT_KEYS | JSON_REAL_PRECISION(9));
	if (!js) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	size_t jl = strlen(js);
	char *text = malloc(jl + 2);
	if (!text) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	memcpy(text, js, jl);
	text[jl] = '\n';
	s = llm_write_file_atomic(cj, text, jl + 1);
	free(text);
out:
	llm_ckpt_write_abort(w);
	json_decref(root);
	json_decref(tm);
	free(js);
	for (size_t j = 0; d && j < n; j++)
		free(d[j].name);
	free(d);
	free(src);
	free(st);
	free(cj);
	return s;
}

/* "model.layers.N." then a module of LO's model then SUFFIX ->
 * layer and slot (NAME starting past PREFIX); 0 on success, 1 when the
 * module is a mixture of experts' router, -1 otherwise. */
static int parse_module(const struct llm_lora *lo, const char *name, const char *prefix, const char *suffix,
                        int *layer, int *slot)
{
	const char *p = "model.layers.";
	size_t np = strlen(prefix);
	if (strncmp(name, prefix, np) || strncmp(name + np, p, strlen(p)))
		return -1;
	const char *s = name + np + strlen(p);
	char *e;
	errno = 0;
	long l = strtol(s, &e, 10);
	if (e == s || *e != '.' || l < 0 || l > 1 << 20 || errno)
		return -1;
	char want[128];
	for (int k = 0; k < LLM_LORA_N; k++) {
		snprintf(want, sizeof want, ".%s.%s%s", llm_lora_target_parent(k), target_names[k], suffix);
		if (!strcmp(e, want)) {
			*layer = (int)l;
			*slot = k;
			return 0;
		}
	}
	if (!lo->n_expert)
		return -1;
	const char *moe = lo->moe_names == LLM_MOE_NAMES_MIXTRAL ? ".block_sparse_moe." : ".mlp.";
	if (strncmp(e, moe, strlen(moe)))
		return -1;
	s = e + strlen(moe);
	if (!strncmp(s, "gate", 4) && !strcmp(s + 4, suffix))
		return 1;
	if (strncmp(s, "experts.", 8))
		return -1;
	s += 8;
	errno = 0;
	long x = strtol(s, &e, 10);
	if (e == s || *e != '.' || x < 0 || x >= lo->n_expert || errno)
		return -1;
	for (int t = LLM_LORA_GATE; t <= LLM_LORA_DOWN; t++) {
		snprintf(want, sizeof want, ".%s%s", module_name(t, lo->n_expert, lo->moe_names), suffix);
		if (!strcmp(e, want)) {
			*layer = (int)l;
			*slot = llm_lora_slot((int)x, t);
			return 0;
		}
	}
	return -1;
}

/* "base_model.model.model.layers.N.MODULE.lora_X.weight" -> layer, slot,
 * X; as parse_module. */
static int parse_tensor_name(const struct llm_lora *lo, const char *name, int *layer, int *slot, int *is_b)
{
	int r = parse_module(lo, name, "base_model.model.", ".lora_A.weight", layer, slot);
	*is_b = 0;
	if (r < 0) {
		r = parse_module(lo, name, "base_model.model.", ".lora_B.weight", layer, slot);
		*is_b = 1;
	}
	return r;
}

/* Target module NAME of target_modules for a model of config C: its
 * target, or -1 with the message set. A mixture of experts' MLP modules are
 * named as the model names them (w1, w3, w2 in Mixtral) and its router
 * (gate) is refused. */
static int module_target(const char *path, const char *name, const struct llm_config *c)
{
	int n_e = c->moe.n_expert;
	if (n_e && !strcmp(name, "gate")) {
		llm_fail(LLM_ERR_UNSUPPORTED, "%s: target_modules: 'gate' is the router of the experts, which is not a "
		         "LoRA target", path);
		return -1;
	}
	for (int t = 0; t < LLM_LORA_N; t++)
		if (!strcmp(name, module_name(t, n_e, c->moe.names)) || (!n_e && !strcmp(name, target_short[t])))
			return t;
	if (n_e)
		llm_fail(LLM_ERR_UNSUPPORTED, "%s: target_modules: '%s' is not a projection of a %s model (q_proj, k_proj, "
		         "v_proj, o_proj, %s, %s, %s)", path, name, c->fam->model_type,
		         module_name(LLM_LORA_GATE, n_e, c->moe.names), module_name(LLM_LORA_UP, n_e, c->moe.names),
		         module_name(LLM_LORA_DOWN, n_e, c->moe.names));
	else
		llm_fail(LLM_ERR_UNSUPPORTED, "%s: target_modules: '%s' is not a Llama projection", path, name);
	return -1;
}

static enum llm_status load_config(const char *path, json_t *root, const struct llm_config *c, int *rank,
                                   float *alpha, float *dropout, unsigned *targets)
{
	json_t *v;
	const char *pt = json_string_value(json_object_get(root, "peft_type"));
	if (!pt || strcmp(pt, "LORA"))
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: peft_type: %s is not LORA", path, pt ? pt : "missing");
	v = json_object_get(root, "r");
	if (!json_is_integer(v))
		return llm_fail(LLM_ERR_FORMAT, "%s: r: missing or not an integer", path);
	*rank = (int)json_integer_value(v);
	v = json_object_get(root, "lora_alpha");
	*alpha = v ? (float)json_number_value(v) : 8.0f;
	if (v && !json_is_number(v))
		return llm_fail(LLM_ERR_FORMAT, "%s: lora_alpha: not a number", path);
	v = json_object_get(root, "lora_dropout");
	*dropout = json_is_number(v) ? (float)json_number_value(v) : 0.0f;
	static const char *const must_false[] = { "use_dora", "use_rslora", "fan_in_fan_out" };
	for (size_t i = 0; i < sizeof must_false / sizeof *must_false; i++)
		if (json_is_true(json_object_get(root, must_false[i])))
			return llm_fail(LLM_ERR_UNSUPPORTED, "%s: %s: true is not supported", path, must_false[i]);
	const char *bias = json_string_value(json_object_get(root, "bias"));
	if (bias && strcmp(bias, "none"))
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: bias: '%s' is not supported (none)", path, bias);
	static const char *const must_empty[] = { "rank_pattern", "alpha_pattern" };
	for (size_t i = 0; i < 2; i++) {
		v = json_object_get(root, must_empty[i]);
		if (v && !json_is_null(v) && json_object_size(v))
			return llm_fail(LLM_ERR_UNSUPPORTED, "%s: %s: per-module ranks are not supported", path, must_empty[i]);
	}
	v = json_object_get(root, "layers_to_transform");
	if (v && !json_is_null(v))
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: layers_to_transform: not supported", path);
	v = json_object_get(root, "modules_to_save");
	if (v && !json_is_null(v) && json_array_size(v))
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: modules_to_save: not supported", path);
	v = json_object_get(root, "target_modules");
	*targets = 0;
	if (json_is_array(v)) {
		size_t i;
		json_t *e;
		json_array_foreach(v, i, e) {
			const char *s = json_string_value(e);
			int t = module_target(path, s ? s : "?", c);
			if (t < 0)
				return LLM_ERR_UNSUPPORTED;   /* module_target said why */
			*targets |= 1u << t;
		}
	} else if (json_is_string(v) && !strcmp(json_string_value(v), "all-linear")) {
		if (c->moe.n_expert)
			return llm_fail(LLM_ERR_UNSUPPORTED, "%s: target_modules: all-linear takes the router (gate) of the "
			                "experts too, which is not a LoRA target: list the modules", path);
		*targets = LLM_LORA_ALL;
	} else if (json_is_string(v)) {
		return llm_fail(LLM_ERR_UNSUPPORTED, "%s: target_modules: regex '%s' is not supported",
		                path, json_string_value(v));
	} else {
		return llm_fail(LLM_ERR_FORMAT, "%s: target_modules: missing", path);
	}
	return LLM_OK;
}

/* T's shape as "AxB" (a static buffer: for one message at a time). */
static const char *shape_text(const struct llm_tensor *t)
{
	static _Thread_local char b[96];
	size_t n = 0;
	b[0] = 0;
	for (int i = 0; i < t->n_dim && n < sizeof b; i++)
		n += (size_t)snprintf(b + n, sizeof b - n, "%s%lld", i ? "x" : "", (long long)t->shape[i]);
	return b;
}

enum llm_status llm_lora_load(struct llm_lora *lo, const char *dir, const struct llm_config *c)
{
	memset(lo, 0, sizeof *lo);
	char *cj = llm_path_join(dir, "adapter_config.json");
	char *stp = llm_path_join(dir, "adapter_model.safetensors");
	char *buf = NULL;
	size_t len;
	json_t *root = NULL;
	struct llm_ckpt ck = { 0 };
	int ck_open = 0;
	unsigned char *seen = NULL;
	enum llm_status s;
	if (!cj || !stp) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	if ((s = llm_read_regular_file(cj, &buf, &len)))   /* a FIFO is refused, not waited on */
		goto out;
	json_error_t err;
	if (!(root = json_loadb(buf, len, 0, &err)) || !json_is_object(root)) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: line %d: %s", cj, err.line, root ? "not an object" : err.text);
		goto out;
	}
	int rank = 0;
	float alpha = 0, dropout = 0;
	unsigned targets = 0;
	if ((s = load_config(cj, root, c, &rank, &alpha, &dropout, &targets)))
		goto out;
	if ((s = layout(lo, c, rank, alpha, dropout, targets))) {
		s = llm_fail_prefix(s, "%s", cj);
		goto out;
	}
	const char *bm = json_string_value(json_object_get(root, "base_model_name_or_path"));
	lo->base_model = bm ? llm_strdup(bm) : NULL;
	if ((s = llm_ckpt_open(&ck, stp)))
		goto out;
	ck_open = 1;
	seen = calloc((size_t)c->n_layer * (size_t)lo->n_slot * 2, 1);
	if (!seen) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	for (size_t i = 0; i < ck.n_tensor; i++) {
		const struct llm_tensor *tt = ck.tensors[i];
		int l = 0, sl = 0, b = 0, pr = parse_tensor_name(lo, tt->name, &l, &sl, &b);
		if (pr) {
			s = llm_fail(LLM_ERR_UNSUPPORTED, pr > 0 ? "%s: tensor '%s': the router of the experts is not a LoRA "
			             "target" : "%s: tensor '%s' is not a LoRA A/B of a projection of this model", stp, tt->name);
			goto out;
		}
		if (l >= c->n_layer || !(targets >> llm_lora_slot_target(sl) & 1) || !llm_lora_has_slot(lo, l, sl)) {
			s = llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': %s", stp, tt->name,
			             l >= c->n_layer ? "layer beyond the model" : !(targets >> llm_lora_slot_target(sl) & 1)
			             ? "module not in target_modules" : "no such module in this layer (dense or experts)");
			goto out;
		}
		int t = llm_lora_kind(sl);
		int64_t rows = b ? lo->d_out[t] : rank, cols = b ? rank : lo->d_in[t];
		if (tt->n_dim != 2 || tt->shape[0] != rows || tt->shape[1] != cols) {
			s = llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s': shape %s does not fit the model and rank r %d "
			             "(want %lldx%lld)", stp, tt->name, shape_text(tt), rank, (long long)rows, (long long)cols);
			goto out;
		}
		if (tt->dtype != LLM_DTYPE_F32 && tt->dtype != LLM_DTYPE_F16 && tt->dtype != LLM_DTYPE_BF16) {
			s = llm_fail(LLM_ERR_UNSUPPORTED, "%s: tensor '%s': dtype %s (F32, F16 or BF16)", stp,
			             tt->name, llm_dtype_name(tt->dtype));
			goto out;
		}
		float *dst = b ? llm_lora_slot_b(lo, l, sl) : llm_lora_slot_a(lo, l, sl);
		llm_to_f32(dst, tt->data, tt->dtype, (size_t)(rows * cols));
		/* checked as --check-weights checks weights: a NaN or Inf would
		 * change every output it touches without a word */
		for (size_t k = 0; k < (size_t)(rows * cols); k++)
			if (!isfinite(dst[k])) {
				s = llm_fail(LLM_ERR_RANGE, "%s: tensor '%s': %s at index %zu (of %zu %s values): an adapter must be "
				             "finite", stp, tt->name, isnan(dst[k]) ? "NaN" : dst[k] > 0 ? "+Inf" : "-Inf", k,
				             (size_t)(rows * cols), llm_dtype_name(tt->dtype));
				goto out;
			}
		seen[((size_t)l * (size_t)lo->n_slot + (size_t)sl) * 2 + (size_t)b] = 1;
	}
	/* PEFT adapts every layer of each target module: all must be there */
	for (int l = 0; l < c->n_layer; l++)
		for (int sl = 0; sl < lo->n_slot; sl++)
			for (int b = 0; b < 2 && llm_lora_has_slot(lo, l, sl); b++)
				if (!seen[((size_t)l * (size_t)lo->n_slot + (size_t)sl) * 2 + (size_t)b]) {
					char name[192];
					tensor_name(lo, name, sizeof name, l, sl, b);
					s = llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s' is missing", stp, name);
					goto out;
				}
out:
	if (ck_open)
		llm_ckpt_close(&ck);
	free(seen);
	json_decref(root);
	free(buf);
	free(cj);
	free(stp);
	if (s)
		llm_lora_free(lo);
	return s;
}

/* ---- merge -------------------------------------------------------------- */

/* Whether NAME is the scale of an E4M3 weight of CK (dropped by the merge). */
static int is_fp8_scale(const struct llm_ckpt *ck, const char *name)
{
	static const char *const suf[] = { "_scale_inv", "_scale" };
	for (int i = 0; i < 2; i++) {
		size_t n = strlen(name), k = strlen(suf[i]);
		if (n <= k || strcmp(name + n - k, suf[i]))
			continue;
		char w[512];
		if (n - k >= sizeof w)
			return 0;
		memcpy(w, name, n - k);
		w[n - k] = 0;
		const struct llm_tensor *t = llm_ckpt_find(ck, w);
		if (t && t->dtype == LLM_DTYPE_E4M3)
			return 1;
	}
	return 0;
}

enum llm_status llm_lora_merge(const struct llm_lora *lo, const char *base, const char *out,
                               const struct llm_ckpt_write_opts *wo)
{
	struct llm_ckpt ck;
	LLM_TRY(llm_ckpt_open(&ck, base));
	enum llm_status s = LLM_OK;
	struct llm_tensor *d = calloc(ck.n_tensor + 1, sizeof *d);
	const struct llm_tensor **src = calloc(ck.n_tensor + 1, sizeof *src);
	struct llm_aux *aux = calloc(ck.n_aux + 1, sizeof *aux);
	char *cfg_new = NULL;
	float *row = NULL, *u = NULL;
	void *conv = NULL;
	struct llm_ckpt_writer *w = NULL;
	if (!d || !src || !aux) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	const struct llm_aux *cj = llm_ckpt_aux(&ck, "config.json");
	struct llm_config c;
	if (!cj) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: no config.json", base);
		goto out;
	}
	if ((s = llm_config_parse(&c, cj->data, cj->len, base)))
		goto out;
	if (c.n_layer != lo->n_layer || c.d_model != lo->d_in[LLM_LORA_Q] || c.d_ff != lo->d_out[LLM_LORA_UP] ||
	    c.moe.n_expert != lo->n_expert || c.moe.d_ff_expert != lo->d_out[LLM_LORA_N + 1]) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: the adapter was made for another model shape", base);
		goto out;
	}
	size_t n = 0;
	int64_t maxcol = 1;
	for (size_t i = 0; i < ck.n_tensor; i++) {
		const struct llm_tensor *t = ck.tensors[i];
		if (is_fp8_scale(&ck, t->name))
			continue;
		d[n] = *t;
		d[n].data = NULL;
		if (t->dtype == LLM_DTYPE_E4M3) {
			d[n].dtype = LLM_DTYPE_F32;
			d[n].nbytes = (size_t)llm_tensor_numel(t) * sizeof(float);
		}
		if (t->n_dim == 2 && t->shape[1] > maxcol)
			maxcol = t->shape[1];
		src[n++] = t;
	}
	/* side files; config.json loses quantization_config when FP8 goes away */
	for (size_t i = 0; i < ck.n_aux; i++)
		aux[i] = ck.aux[i];
	if (llm_ckpt_is_fp8(&ck)) {
		json_t *root = json_loadb(cj->data, cj->len, JSON_PRESERVE_ORDER, NULL);
		if (root) {
			json_object_del(root, "quantization_config");
			json_object_set_new(root, "torch_dtype", json_string("float32"));
			cfg_new = json_dumps(root, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
			json_decref(root);
		}
		if (!cfg_new) {
			s = llm_fail(LLM_ERR_NOMEM, "out of memory");
			goto out;
		}
		for (size_t i = 0; i < ck.n_aux; i++)
			if (!strcmp(aux[i].name, "config.json")) {
				aux[i].data = cfg_new;
				aux[i].len = strlen(cfg_new);
			}
	}
	row = malloc((size_t)maxcol * sizeof(float));
	u = malloc((size_t)lo->rank * sizeof(float));
	conv = malloc((size_t)maxcol * sizeof(float));
	if (!row || !u || !conv) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	if (wo && wo->progress) {
		for (size_t i = 0; i < ck.n_tensor; i++)
			wo->progress->bytes_in += ck.tensors[i]->nbytes;
		wo->progress->items_in = ck.n_tensor;
	}
	if ((s = llm_ckpt_write_begin(&w, out, d, n, aux, ck.n_aux, wo)))
		goto out;
	long i;
	while (!s && (i = llm_ckpt_write_next(w)) >= 0) {
		const struct llm_tensor *t = src[i];
		int l = 0, sl = 0;
		int adapted = !parse_module(lo, t->name, "", ".weight", &l, &sl) && l < lo->n_layer &&
		              llm_lora_has_slot(lo, l, sl);
		int kd = llm_lora_kind(sl);
		if (!adapted && t->dtype != LLM_DTYPE_E4M3) {
			s = llm_ckpt_write_data(w, t->data, t->nbytes);
			continue;
		}
		struct llm_weight wt;
		if ((s = llm_ckpt_weight(&ck, t->name, &wt)))
			break;
		if (adapted && (wt.rows != lo->d_out[kd] || wt.cols != lo->d_in[kd])) {
			s = llm_fail(LLM_ERR_FORMAT, "%s: tensor '%s' does not fit the adapter", base, t->name);
			break;
		}
		/* row r of W + scale * B A: B row r times A, in f32 */
		for (int64_t r = 0; !s && r < wt.rows; r++) {
			llm_weight_row_f32(&wt, r, row);
			if (adapted) {
				const float *A = llm_lora_slot_a(lo, l, sl), *B = llm_lora_slot_b(lo, l, sl);
				for (int64_t c = 0; c < wt.cols; c++) {
					float acc = 0.0f;
					for (int k = 0; k < lo->rank; k++)
						acc += B[r * lo->rank + k] * A[(int64_t)k * wt.cols + c];
					row[c] += lo->scale * acc;
				}
			}
			llm_from_f32(conv, d[i].dtype, row, (size_t)wt.cols);
			s = llm_ckpt_write_data(w, conv, (size_t)wt.cols * llm_dtype_size(d[i].dtype));
		}
	}
	if (!s) {
		s = llm_ckpt_write_commit(w);
		w = NULL;
	}
out:
	llm_ckpt_write_abort(w);
	free(d);
	free(src);
	free(aux);
	free(cfg_new);
	free(row);
	free(u);
	free(conv);
	llm_ckpt_close(&ck);
	return s;
}

/* ---- names ------------------------------------------------------------- */

enum llm_status llm_lora_spec_split(const char *spec, char *name, size_t n, const char **dir)
{
	const char *eq = strchr(spec, '=');
	const char *nb, *ne;
	if (eq) {
		nb = spec;
		ne = eq;
		*dir = eq + 1;
	} else {
		*dir = spec;
		ne = spec + strlen(spec);
		while (ne > spec + 1 && ne[-1] == '/')
			ne--;
		nb = ne;
		while (nb > spec && nb[-1] != '/')
			nb--;
	}
	size_t len = (size_t)(ne - nb);
	if (!len || !**dir)
		return llm_fail(LLM_ERR_USAGE, "'%s': an adapter needs a name and a directory (NAME=DIR or DIR)", spec);
	if (len >= n)
		return llm_fail(LLM_ERR_USAGE, "'%s': the adapter name is longer than %zu bytes", spec, n - 1);
	for (size_t i = 0; i < len; i++)
		if ((unsigned char)nb[i] < 0x20 || nb[i] == 0x7f)
			return llm_fail(LLM_ERR_USAGE, "'%s': the adapter name holds a control byte", spec);
	memcpy(name, nb, len);
	name[len] = 0;
	return LLM_OK;
}
