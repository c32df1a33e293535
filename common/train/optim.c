/* common/train/optim.c: AdamW (Loshchilov & Hutter, "Decoupled Weight Decay
 * Regularization") with bias correction as torch.optim.AdamW, a linear
 * warmup then cosine learning-rate schedule, and global-norm gradient
 * clipping as torch.nn.utils.clip_grad_norm_ (scale clip / (norm + 1e-6)).
 * F32 state; the update of each element depends on that element alone, so
 * it is deterministic. */
#define _GNU_SOURCE
#include "train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

double llm_lr_at(const struct llm_adamw_opts *o, int64_t step)
{
	if (o->warmup > 0 && step < o->warmup)
		return o->lr * (double)(step + 1) / (double)o->warmup;
	double lo = o->lr * o->min_lr_ratio;
	int64_t span = o->total - o->warmup;
	if (span <= 0)
		return o->lr;
	double f = (double)(step - o->warmup) / (double)span;
	if (f > 1.0)
		f = 1.0;
	return lo + 0.5 * (o->lr - lo) * (1.0 + cos(M_PI * f));
}

enum llm_status llm_adamw_init(struct llm_adamw *a, size_t n, const struct llm_adamw_opts *o)
{
	memset(a, 0, sizeof *a);
	a->o = *o;
	a->n = n;
	a->m = calloc(n ? n : 1, sizeof(float));
	a->v = calloc(n ? n : 1, sizeof(float));
	if (!a->m || !a->v) {
		llm_adamw_free(a);
		return llm_fail(LLM_ERR_NOMEM, "optimizer: cannot allocate state for %zu parameters", n);
	}
	return LLM_OK;
}

void llm_adamw_free(struct llm_adamw *a)
{
	free(a->m);
	free(a->v);
	memset(a, 0, sizeof *a);
}

double llm_grad_norm(const float *g, size_t n)
{
	double s = 0;
	for (size_t i = 0; i < n; i++)
		s += (double)g[i] * (double)g[i];
	return sqrt(s);
}

void llm_adamw_update(struct llm_adamw *a, float *p, const float *g, double norm, double lr)
{
	const struct llm_adamw_opts *o = &a->o;
	float gs = 1.0f;
	if (o->clip > 0 && norm > o->clip)
		gs = (float)(o->clip / (norm + 1e-6));
	a->step++;
	float b1 = (float)o->beta1, b2 = (float)o->beta2;
	float c1 = (float)(1.0 - pow(o->beta1, (double)a->step));
	float c2s = (float)sqrt(1.0 - pow(o->beta2, (double)a->step));
	float step = (float)lr / c1, eps = (float)o->eps, decay = (float)(1.0 - lr * o->weight_decay);
	for (size_t i = 0; i < a->n; i++) {
		float gi = g[i] * gs;
		a->m[i] = b1 * a->m[i] + (1.0f - b1) * gi;
		a->v[i] = b2 * a->v[i] + (1.0f - b2) * gi * gi;
		p[i] *= decay;
		p[i] -= step * a->m[i] / (sqrtf(a->v[i]) / c2s + eps);
	}
}
