/* common/train/train_impl.h: the training forward and backward pass, written once
 * for a scalar type and included twice by train.c (a template by macro, so
 * the gradient check runs the very code that trains):
 *   REAL       float or double
 *   F(name)    name##_f32 or name##_f64
 *   TRAIN_F64  0 or 1
 * Not a public header: only train.c includes it.
 *
 * Shapes use n = n_seq * seq_len token slots, D = d_model, Q = n_head *
 * d_head, KV = n_kv_head * d_head, FF = d_ff, H = n_head, R = rank, V =
 * n_vocab. Every kernel splits independent outputs among threads and keeps
 * each reduction on one thread in a fixed order (see train.h). */

#if TRAIN_F64
#define SQRT_ sqrt
#define EXP_ exp
#define LOG_ log
#define COS_ cos
#define SIN_ sin
#define TANH_ tanh
#else
#define SQRT_ sqrtf
#define EXP_ expf
#define LOG_ logf
#define COS_ cosf
#define SIN_ sinf
#define TANH_ tanhf
#endif

/* One layer's saved activations, each (n, ...) row-major; the family's
 * (family.h) only where it has the trait, else NULL. */
struct F(act) {
	REAL *xn, *rstd1;           /* (n, D) rmsnorm(x_in), (n) its 1/rms */
	REAL *q, *k, *v;            /* (n, Q), (n, KV), (n, KV): q, k after RoPE */
	REAL *qr, *kr, *rq, *rk;    /* qk_norm: q, k before their per-head norm; (n, H), (n, KH) 1/rms */
	REAL *ao, *rstd3;           /* sandwich: (n, D) o_proj's output before post_attention_layernorm; (n) */
	REAL *dn, *rstd4;           /* sandwich: (n, D) down_proj's output before post_feedforward_layernorm */
	REAL *lse;                  /* (n, H) log-sum-exp of each attention row */
	REAL *att;                  /* (n, Q) attention output */
	REAL *xmid, *xm, *rstd2;    /* (n, D) residual after attention, its norm; (n) */
	REAL *g, *u, *h;            /* (n, FF) gate, up, act(gate) * up */
	REAL *lu[LLM_LORA_N];       /* (n, R) drop(x) A^T of each adapted projection */
	/* a mixture of experts (train_moe.h; gathered: (n K, ...), K = n_expert_used) */
	REAL *mlogit;               /* (n, E) router logits */
	REAL *mg, *mu, *mh, *mye;   /* gathered (n K, FE): each expert's gate, up, silu(gate) * up; (n K, D) its output */
	REAL *mlu[3];               /* gathered (n K, R) drop(x) A^T of the experts' gate, up, down */
};

struct F(state) {
	REAL *arena;
	REAL *params, *grads;       /* (n_params) */
	REAL *xres;                 /* (n_layer + 1, n, D) the residual stream */
	struct F(act) *acts;        /* (n_layer), or (1) with checkpointing */
	REAL *xf, *rstdf;           /* (n, D), (n) final norm */
	REAL *dres, *dxmid, *dxn, *datt, *dq, *dk, *dv, *dh, *dg, *du, *dlu;
	REAL *wvec;                 /* (D) a norm weight, dequantized */
	REAL *rcos, *rsin;          /* (seq_len, d_head / 2) RoPE table */
	REAL *lg_x, *lg, *lg_dx;    /* (C, D), (C, V), (C, D) one lm_head chunk */
	REAL *mxe, *mdye, *mdxe;    /* gathered (n K, D) an expert's input, output gradient, input gradient */
	REAL *mdh, *mdg, *mdu;      /* gathered (n K, FE) */
	REAL *mrw, *mdw;            /* (n K) each gathered row's routing weight and its gradient */
	REAL *mdlogit;              /* (n, E) the router logits' gradient */
	REAL *tscr;                 /* (nth, tscr_per) per-thread scratch */
	size_t tscr_per;
};

/* ---- frozen matmuls ------------------------------------------------------- */

struct F(mm_job) { REAL *y; const REAL *x; int64_t n; const struct llm_weight *w; struct llm_trainer *t; };

/* y (n, w->rows) = x (n, w->cols) . W^T */
static void F(mm_task)(void *ctx, int ith, int nth)
{
	struct F(mm_job) *j = ctx;
	int64_t b, e;
	split(j->w->rows, ith, nth, 4, &b, &e);
	if (b >= e)
		return;
#if TRAIN_F64
	struct F(state) *st = j->t->st;
	float *row = (float *)(st->tscr + (size_t)ith * st->tscr_per);
	for (int64_t r = b; r < e; r++) {
		llm_weight_row_f32(j->w, r, row);
		for (int64_t i = 0; i < j->n; i++) {
			const REAL *xr = j->x + i * j->w->cols;
			REAL s = 0;
			for (int64_t c = 0; c < j->w->cols; c++)
				s += xr[c] * (REAL)row[c];
			j->y[i * j->w->rows + r] = s;
		}
	}
#else
	/* the inference kernel: FP8/BF16 dequantized inside, a block at a time */
	llm_cpu_matmul_rows(j->t->isa, j->y, j->w->rows, j->x, j->w->cols, j->n, j->w, b, e);
#endif
}

static void F(mm)(struct llm_trainer *t, REAL *y, const REAL *x, int64_t n, const struct llm_weight *w)
{
	struct F(mm_job) j = { y, x, n, w, t };
	par(t, (double)n * (double)w->rows * (double)w->cols, F(mm_task), &j);
}

struct F(mmt_job) { REAL *dx; const REAL *dy; int64_t n; const struct llm_weight *w; int acc; struct llm_trainer *t; };

/* dx (n, w->cols) (+)= dy (n, w->rows) . W: each thread owns a band of
 * columns and walks W in tiles of MMT_TILE rows, dequantized once. */
static void F(mmt_task)(void *ctx, int ith, int nth)
{
	struct F(mmt_job) *j = ctx;
	struct F(state) *st = j->t->st;
	const struct llm_weight *w = j->w;
	int64_t c0, c1, rows = w->rows, cols = w->cols;
	split(cols, ith, nth, 16, &c0, &c1);
	if (c0 >= c1)
		return;
	int64_t nc = c1 - c0;
	float *tile = (float *)(st->tscr + (size_t)ith * st->tscr_per);
	if (!j->acc)
		for (int64_t i = 0; i < j->n; i++)
			memset(j->dx + i * cols + c0, 0, (size_t)nc * sizeof(REAL));
	for (int64_t r0 = 0; r0 < rows; r0 += MMT_TILE) {
		int64_t r1 = r0 + MMT_TILE < rows ? r0 + MMT_TILE : rows;
		for (int64_t r = r0; r < r1; r++)
			weight_slice(w, r, c0, c1, tile + (r - r0) * nc);
		for (int64_t i = 0; i < j->n; i++) {
			const REAL *dy = j->dy + i * rows;
			REAL *dx = j->dx + i * cols + c0;
			int64_t r = r0;
			for (; r + 4 <= r1; r += 4) {
				if (dy[r] == 0 && dy[r + 1] == 0 && dy[r + 2] == 0 && dy[r + 3] == 0)
					continue;
				const float *x4[4] = { tile + (r - r0) * nc, tile + (r + 1 - r0) * nc,
				                       tile + (r + 2 - r0) * nc, tile + (r + 3 - r0) * nc };
				F(axpy4)(j->t->isa, dx, dy + r, x4, nc);
			}
			for (; r < r1; r++) {
				REAL a = dy[r];
				const float *tr = tile + (r - r0) * nc;
				for (int64_t c = 0; c < nc; c++)
					dx[c] += a * (REAL)tr[c];
			}
		}
	}
}

static void F(mmt)(struct llm_trainer *t, REAL *dx, const REAL *dy, int64_t n,
                   const struct llm_weight *w, int acc)
{
	struct F(mmt_job) j = { dx, dy, n, w, acc, t };
	par(t, (double)n * (double)w->rows * (double)w->cols, F(mmt_task), &j);
}

/* ---- LoRA ------------------------------------------------------------------- */

struct F(lora_job) {
	struct llm_trainer *t;
	int layer, tg, drop;        /* drop: dropout masks apply */
	const REAL *A, *B;          /* (R, din), (dout, R) */
	REAL *dA, *dB;
	const REAL *x;              /* (n, din) input of the projection */
	REAL *y, *dx;               /* (n, dout) output += ; (n, din) input gradient += */
	const REAL *dy;             /* (n, dout) */
	REAL *lu, *dlu;             /* (n, R) */
	int64_t n, din, dout, R;
	REAL scale, inv_keep;
};

/* lu = drop(x) A^T; y += scale * lu B^T */
static void F(lora_fwd_task)(void *ctx, int ith, int nth)
{
	struct F(lora_job) *j = ctx;
	struct F(state) *st = j->t->st;
	REAL *xd = st->tscr + (size_t)ith * st->tscr_per;
	int64_t b, e;
	split(j->n, ith, nth, 1, &b, &e);
	for (int64_t i = b; i < e; i++) {
		const REAL *x = j->x + i * j->din;
		if (j->drop) {
			for (int64_t c = 0; c < j->din; c++)
				xd[c] = keep(j->t, j->layer, j->tg, i, c, j->din) ? x[c] * j->inv_keep : 0;
			x = xd;
		}
		REAL *lu = j->lu + i * j->R;
		for (int64_t k = 0; k < j->R; k++)
			lu[k] = F(dot)(j->t->isa, j->A + k * j->din, x, j->din);
		REAL *y = j->y + i * j->dout;
		for (int64_t o = 0; o < j->dout; o++) {
			const REAL *bb = j->B + o * j->R;
			REAL s = 0;
			for (int64_t k = 0; k < j->R; k++)
				s += bb[k] * lu[k];
			y[o] += j->scale * s;
		}
	}
}

/* dB += scale * dy^T lu (threads over output rows) */
static void F(lora_db_task)(void *ctx, int ith, int nth)
{
	struct F(lora_job) *j = ctx;
	int64_t b, e;
	split(j->dout, ith, nth, 1, &b, &e);
	for (int64_t o = b; o < e; o++) {
		REAL *db = j->dB + o * j->R;
		for (int64_t i = 0; i < j->n; i++) {
			REAL g = j->dy[i * j->dout + o];
			if (g == 0)
				continue;
			g *= j->scale;
			const REAL *lu = j->lu + i * j->R;
			for (int64_t k = 0; k < j->R; k++)
				db[k] += g * lu[k];
		}
	}
}

/* dlu = scale * dy B (threads over tokens) */
static void F(lora_dlu_task)(void *ctx, int ith, int nth)
{
	struct F(lora_job) *j = ctx;
	int64_t b, e;
	split(j->n, ith, nth, 1, &b, &e);
	for (int64_t i = b; i < e; i++) {
		const REAL *dy = j->dy + i * j->dout;
		REAL *dlu = j->dlu + i * j->R;
		for (int64_t k = 0; k < j->R; k++)
			dlu[k] = 0;
		for (int64_t o = 0; o < j->dout; o++) {
			REAL g = dy[o];
			if (g == 0)
				continue;
			const REAL *bb = j->B + o * j->R;
			for (int64_t k = 0; k < j->R; k++)
				dlu[k] += g * bb[k];
		}
		for (int64_t k = 0; k < j->R; k++)
			dlu[k] *= j->scale;
	}
}

/* dA += dlu^T drop(x) (threads over bands of input columns; per token, each
 * row of dA gets dlu[k] times the token's band) */
static void F(lora_da_task)(void *ctx, int ith, int nth)
{
	struct F(lora_job) *j = ctx;
	struct F(state) *st = j->t->st;
	REAL *xd = st->tscr + (size_t)ith * st->tscr_per;
	int64_t c0, c1;
	split(j->din, ith, nth, 16, &c0, &c1);
	if (c0 >= c1)
		return;
	for (int64_t i = 0; i < j->n; i++) {
		const REAL *x = j->x + i * j->din + c0, *dlu = j->dlu + i * j->R;
		if (j->drop) {
			for (int64_t c = c0; c < c1; c++)
				xd[c - c0] = keep(j->t, j->layer, j->tg, i, c, j->din) ? x[c - c0] * j->inv_keep : 0;
			x = xd;
		}
		for (int64_t k = 0; k < j->R; k++)
			if (dlu[k] != 0)
				F(axpy)(j->t->isa, j->dA + k * j->din + c0, dlu[k], x, c1 - c0);
	}
}

/* dx += drop'(dlu A) (threads over tokens; the row dlu A summed over k in
 * order, then masked) */
static void F(lora_dx_task)(void *ctx, int ith, int nth)
{
	struct F(lora_job) *j = ctx;
	struct F(state) *st = j->t->st;
	REAL *tmp = st->tscr + (size_t)ith * st->tscr_per;
	int64_t b, e;
	split(j->n, ith, nth, 1, &b, &e);
	for (int64_t i = b; i < e; i++) {
		const REAL *dlu = j->dlu + i * j->R;
		REAL *dx = j->dx + i * j->din;
		memset(tmp, 0, (size_t)j->din * sizeof(REAL));
		for (int64_t k = 0; k < j->R; k++)
			F(axpy)(j->t->isa, tmp, dlu[k], j->A + k * j->din, j->din);
		for (int64_t c = 0; c < j->din; c++) {
			if (!j->drop)
				dx[c] += tmp[c];
			else if (keep(j->t, j->layer, j->tg, i, c, j->din))
				dx[c] += tmp[c] * j->inv_keep;
		}
	}
}

static void F(lora_setup)(struct llm_trainer *t, struct F(lora_job) *j, int layer, int tg, int64_t n, int train)
{
	struct F(state) *st = t->st;
	const struct llm_lora *lo = t->lo;
	size_t off = llm_lora_off(lo, layer, tg);
	memset(j, 0, sizeof *j);
	j->t = t;
	j->layer = layer;
	j->tg = tg;
	j->din = lo->d_in[llm_lora_kind(tg)];
	j->dout = lo->d_out[llm_lora_kind(tg)];
	j->R = lo->rank;
	j->n = n;
	j->A = st->params + off;
	j->B = j->A + j->R * j->din;
	j->dA = st->grads + off;
	j->dB = j->dA + j->R * j->din;
	j->scale = (REAL)lo->scale;
	j->drop = train && lo->dropout > 0.0f;
	j->inv_keep = (REAL)1 / ((REAL)1 - (REAL)lo->dropout);
}

/* y (n, dout) = x W^T (+ the adapter of (layer, tg), saving lu) */
static void F(linear)(struct llm_trainer *t, const struct llm_weight *w, int layer, int tg,
                      const REAL *x, REAL *y, REAL *lu, int64_t n, int train)
{
	F(mm)(t, y, x, n, w);
	if (!llm_lora_has(t->lo, layer, tg))
		return;
	struct F(lora_job) j;
	F(lora_setup)(t, &j, layer, tg, n, train);
	j.x = x;
	j.y = y;
	j.lu = lu;
	par(t, (double)n * (double)j.R * (double)(j.din + j.dout), F(lora_fwd_task), &j);
}

/* Backward of F(linear) given dy: the adapter gradients, and with DX the
 * input gradient (written, or added when ACC). */
static void F(linear_bwd)(struct llm_trainer *t, const struct llm_weight *w, int layer, int tg,
                          const REAL *x, const REAL *dy, const REAL *lu, REAL *dx, int acc, int64_t n,
                          int train)
{
	struct F(state) *st = t->st;
	if (dx)
		F(mmt)(t, dx, dy, n, w, acc);
	if (!llm_lora_has(t->lo, layer, tg))
		return;
	struct F(lora_job) j;
	F(lora_setup)(t, &j, layer, tg, n, train);
	j.x = x;
	j.dy = dy;
	j.lu = (REAL *)lu;
	j.dlu = st->dlu;
	j.dx = dx;
	double work = (double)n * (double)j.R * (double)(j.din + j.dout);
	par(t, work, F(lora_db_task), &j);
	par(t, work, F(lora_dlu_task), &j);
	par(t, work, F(lora_da_task), &j);
	if (dx)
		par(t, work, F(lora_dx_task), &j);
}

/* ---- pointwise ops ------------------------------------------------------------ */

static void F(load_vec)(struct llm_trainer *t, const struct llm_weight *w)
{
	struct F(state) *st = t->st;
	float *tmp = (float *)st->tscr;
	llm_weight_row_f32(w, 0, tmp);
	for (int64_t i = 0; i < w->cols; i++)
		st->wvec[i] = (REAL)tmp[i];
}

struct F(norm_job) { REAL *y, *rstd; const REAL *x, *w, *dy; REAL *dx; int64_t n, d; float eps; };

static void F(norm_task)(void *ctx, int ith, int nth)
{
	struct F(norm_job) *j = ctx;
	int64_t b, e;
	split(j->n, ith, nth, 1, &b, &e);
	for (int64_t i = b; i < e; i++) {
		const REAL *x = j->x + i * j->d;
		REAL *y = j->y + i * j->d;
		REAL ss = 0;
		for (int64_t c = 0; c < j->d; c++)
			ss += x[c] * x[c];
		ss /= (REAL)j->d;
		ss += (REAL)j->eps;
		REAL r = (REAL)1 / SQRT_(ss);
		j->rstd[i] = r;
		for (int64_t c = 0; c < j->d; c++)
			y[c] = j->w[c] * (r * x[c]);
	}
}

/* dx = rstd * (w dy - xhat * mean(w dy . xhat)), xhat = x * rstd */
static void F(norm_bwd_task)(void *ctx, int ith, int nth)
{
	struct F(norm_job) *j = ctx;
	int64_t b, e;
	split(j->n, ith, nth, 1, &b, &e);
	for (int64_t i = b; i < e; i++) {
		const REAL *x = j->x + i * j->d, *dy = j->dy + i * j->d;
		REAL *dx = j->dx + i * j->d, r = j->rstd[i], dot = 0;
		for (int64_t c = 0; c < j->d; c++)
			dot += j->w[c] * dy[c] * x[c] * r;
		dot /= (REAL)j->d;
		for (int64_t c = 0; c < j->d; c++)
			dx[c] = r * (j->w[c] * dy[c] - x[c] * r * dot);
	}
}

static void F(rmsnorm)(struct llm_trainer *t, REAL *y, REAL *rstd, const REAL *x,
                       const struct llm_weight *w, int64_t n)
{
	struct F(state) *st = t->st;
	F(load_vec)(t, w);
	struct F(norm_job) j = { y, rstd, x, st->wvec, NULL, NULL, n, w->cols, t->m->cfg.rms_eps };
	par(t, 4.0 * (double)n * (double)w->cols, F(norm_task), &j);
}

/* dx = rmsnorm backward of dy (dx written) */
static void F(rmsnorm_bwd)(struct llm_trainer *t, REAL *dx, const REAL *dy, const REAL *x,
                           const REAL *rstd, const struct llm_weight *w, int64_t n)
{
	struct F(state) *st = t->st;
	F(load_vec)(t, w);
	struct F(norm_job) j = { NULL, (REAL *)rstd, x, st->wvec, dy, dx, n, w->cols, 0 };
	par(t, 6.0 * (double)n * (double)w->cols, F(norm_bwd_task), &j);
}

/* RoPE in place on x (n, nh * d_head), pairs (j, j + d_head/2) rotated by
 * pos * inv_freq[j]; DIR -1 applies the inverse rotation (the backward). */
static void F(rope)(struct llm_trainer *t, REAL *x, const int32_t *pos, int64_t n, int nh, int dir)
{
	struct F(state) *st = t->st;
	int dh = t->m->cfg.d_head, half = dh / 2;
	for (int64_t i = 0; i < n; i++) {
		REAL *xr = x + i * (int64_t)nh * dh;
		const REAL *cs = st->rcos + (int64_t)pos[i] * half, *sn = st->rsin + (int64_t)pos[i] * half;
		for (int h = 0; h < nh; h++) {
			REAL *p = xr + h * dh;
			for (int jj = 0; jj < half; jj++) {
				REAL c = cs[jj], s = dir > 0 ? sn[jj] : -sn[jj];
				REAL v0 = p[jj], v1 = p[jj + half];
				p[jj] = v0 * c - v1 * s;
				p[jj + half] = v0 * s + v1 * c;
			}
		}
	}
}

/* The gated MLP's activation (family.h act): h = act(g) * u, SwiGLU's
 * silu or GeGLU's tanh-approximated GELU, as model.c's CPU ops compute it;
 * with dh the backward: du = dh act(g), dg = dh u act'(g). */
struct F(glu_job) { REAL *h, *dg, *du; const REAL *g, *u, *dh; int64_t n; enum llm_act act; };

static void F(glu_task)(void *ctx, int ith, int nth)
{
	struct F(glu_job) *j = ctx;
	int64_t b, e;
	split(j->n, ith, nth, 64, &b, &e);
	for (int64_t i = b; i < e; i++) {
		REAL g = j->g[i], a, da;
		if (j->act == LLM_ACT_GELU_TANH) {
			/* gelu(g) = g/2 (1 + tanh(z)), z = sqrt(2/pi) (g + 0.044715 g^3);
			 * gelu'(g) = (1 + tanh z) / 2 + g/2 (1 - tanh^2 z) dz/dg */
			const REAL k0 = (REAL)0.7978845608, k1 = (REAL)0.044715;
			REAL th = TANH_(k0 * (g + k1 * g * g * g));
			a = (REAL)0.5 * g * ((REAL)1 + th);
			da = (REAL)0.5 * ((REAL)1 + th) +
			     (REAL)0.5 * g * ((REAL)1 - th * th) * k0 * ((REAL)1 + (REAL)3 * k1 * g * g);
		} else {
			/* silu(g) = g sig(g); silu'(g) = sig(g) (1 + g (1 - sig(g))) */
			REAL sg = (REAL)1 / ((REAL)1 + EXP_(-g));
			a = g * sg;
			da = sg * ((REAL)1 + g * ((REAL)1 - sg));
		}
		if (!j->dh) {
			j->h[i] = a * j->u[i];
			continue;
		}
		REAL dh = j->dh[i];
		j->du[i] = dh * a;
		j->dg[i] = dh * j->u[i] * da;
	}
}

/* y (n, w->cols) += the bias vector W (qkv_bias), after the projection and its adapter */
static void F(add_bias)(struct llm_trainer *t, REAL *y, const struct llm_weight *w, int64_t n)
{
	struct F(state) *st = t->st;
	float *b = (float *)(st->tscr);
	llm_weight_row_f32(w, 0, b);
	for (int64_t i = 0; i < n; i++)
		for (int64_t c = 0; c < w->cols; c++)
			y[i * w->cols + c] += (REAL)b[c];
}

/* ---- attention ---------------------------------------------------------------- */

/* The attention of layer l as the family scores it (model.c attend): q . k
 * times SCALE (1 / llm_config_attn_div: d_head^-0.5, query_pre_attn_scalar^-0.5,
 * the YaRN attention factor), capped as cap tanh(s / cap) where CAP > 0
 * (attn_softcap), over the keys of the token's own sample within the
 * layer's window WIN (keys at positions > pos - WIN; 0: every earlier one). */
struct F(attn_job) {
	struct llm_trainer *t; const struct llm_train_batch *b; struct F(act) *a; REAL *out;
	REAL scale, cap; int win;
};

static void F(attn_setup)(struct llm_trainer *t, struct F(attn_job) *j, int l, const struct llm_train_batch *b,
                          struct F(act) *a, REAL *out)
{
	const struct llm_config *c = &t->m->cfg;
	j->t = t;
	j->b = b;
	j->a = a;
	j->out = out;
	j->scale = (REAL)1 / (REAL)llm_config_attn_div(c);
	j->cap = (REAL)c->attn_softcap;
	j->win = llm_config_window(c, l);
}

/* The first slot token TI (of a sample starting at slot S0) attends to. */
static inline int F(attn_lo)(const struct F(attn_job) *j, int ti, int s0)
{
	return j->win > 0 && ti - j->win + 1 > s0 ? ti - j->win + 1 : s0;
}

/* One (row, head) per item: causal softmax over the token's own sample. */
static void F(attn_task)(void *ctx, int ith, int nth)
{
	struct F(attn_job) *j = ctx;
	struct F(state) *st = j->t->st;
	const struct llm_config *c = &j->t->m->cfg;
	int H = c->n_head, G = c->n_head / c->n_kv_head, dh = c->d_head, L = j->b->seq_len;
	int64_t Q = (int64_t)H * dh, KV = (int64_t)c->n_kv_head * dh;
	REAL scale = j->scale, cap = j->cap;
	REAL *p = st->tscr + (size_t)ith * st->tscr_per;
	int64_t b, e;
	split((int64_t)j->b->n_seq * H, ith, nth, 1, &b, &e);
	for (int64_t it = b; it < e; it++) {
		int64_t row = it / H;
		int h = (int)(it % H), g = h / G;
		for (int ti = 0; ti < L; ti++) {
			int64_t i = row * L + ti;
			int s0 = F(attn_lo)(j, ti, j->b->start[i]);
			const REAL *q = j->a->q + i * Q + h * dh;
			REAL m = -INFINITY;
			for (int s = s0; s <= ti; s++) {
				const REAL *k = j->a->k + (row * L + s) * KV + g * dh;
				REAL d = 0;
				for (int x = 0; x < dh; x++)
					d += q[x] * k[x];
				p[s] = d * scale;
				if (cap > 0)
					p[s] = TANH_(p[s] / cap) * cap;
				if (p[s] > m)
					m = p[s];
			}
			REAL sum = 0;
			for (int s = s0; s <= ti; s++) {
				p[s] = EXP_(p[s] - m);
				sum += p[s];
			}
			REAL *o = j->out + i * Q + h * dh;
			for (int x = 0; x < dh; x++)
				o[x] = 0;
			for (int s = s0; s <= ti; s++) {
				const REAL *v = j->a->v + (row * L + s) * KV + g * dh;
				REAL w = p[s] / sum;
				for (int x = 0; x < dh; x++)
					o[x] += w * v[x];
			}
			j->a->lse[i * H + h] = m + LOG_(sum);
		}
	}
}

/* One (row, kv head) per item, so dk and dv of a group have one writer:
 * p = exp(s - lse); dp = do . v; ds = p (dp - sum(p dp)) (times 1 - tanh^2
 * under a softcap); dq = scale ds k; dk += scale ds q; dv += p do. */
static void F(attn_bwd_task)(void *ctx, int ith, int nth)
{
	struct F(attn_job) *j = ctx;
	struct F(state) *st = j->t->st;
	const struct llm_config *c = &j->t->m->cfg;
	int H = c->n_head, KH = c->n_kv_head, G = H / KH, dh = c->d_head, L = j->b->seq_len;
	int64_t Q = (int64_t)H * dh, KV = (int64_t)KH * dh;
	REAL scale = j->scale, cap = j->cap;
	REAL *p = st->tscr + (size_t)ith * st->tscr_per, *dp = p + L, *dh_cap = dp + L;
	int64_t b, e;
	split((int64_t)j->b->n_seq * KH, ith, nth, 1, &b, &e);
	for (int64_t it = b; it < e; it++) {
		int64_t row = it / KH;
		int g = (int)(it % KH);
		for (int ti = 0; ti < L; ti++) {
			int64_t i = row * L + ti;
			memset(st->dk + i * KV + g * dh, 0, (size_t)dh * sizeof(REAL));
			memset(st->dv + i * KV + g * dh, 0, (size_t)dh * sizeof(REAL));
		}
		for (int h = g * G; h < (g + 1) * G; h++)
			for (int ti = 0; ti < L; ti++) {
				int64_t i = row * L + ti;
				int s0 = F(attn_lo)(j, ti, j->b->start[i]);
				const REAL *q = j->a->q + i * Q + h * dh, *dout = st->datt + i * Q + h * dh;
				REAL lse = j->a->lse[i * H + h], sum = 0;
				for (int s = s0; s <= ti; s++) {
					const REAL *k = j->a->k + (row * L + s) * KV + g * dh;
					const REAL *v = j->a->v + (row * L + s) * KV + g * dh;
					REAL d = 0, dv = 0;
					for (int x = 0; x < dh; x++) {
						d += q[x] * k[x];
						dv += dout[x] * v[x];
					}
					d *= scale;
					if (cap > 0) {   /* dp keeps the cap's derivative until ds */
						REAL th = TANH_(d / cap);
						d = th * cap;
						dh_cap[s] = (REAL)1 - th * th;
					}
					p[s] = EXP_(d - lse);
					dp[s] = dv;
					sum += p[s] * dv;
				}
				REAL *dq = st->dq + i * Q + h * dh;
				for (int x = 0; x < dh; x++)
					dq[x] = 0;
				for (int s = s0; s <= ti; s++) {
					int64_t js = row * L + s;
					const REAL *k = j->a->k + js * KV + g * dh;
					REAL *dk = st->dk + js * KV + g * dh, *dv = st->dv + js * KV + g * dh;
					REAL ds = p[s] * (dp[s] - sum) * scale;
					if (cap > 0)
						ds *= dh_cap[s];
					for (int x = 0; x < dh; x++) {
						dq[x] += ds * k[x];
						dk[x] += ds * q[x];
						dv[x] += p[s] * dout[x];
					}
				}
			}
	}
}

#include "train_moe.h"

/* ---- a layer ------------------------------------------------------------------- */

/* The layer as model.c runs it, the family's traits (family.h) where they
 * matter:
 *   xn = norm(x); q, k, v = proj(xn) (+ bias: qkv_bias); q, k = norm per head
 *   (qk_norm); q, k = rope(q, k); att = attention (the family's scale,
 *   softcap and the layer's window); ao = o(att) (normed: sandwich);
 *   xmid = x + ao; xm = norm(xmid); h = act(gate(xm)) * up(xm);
 *   dn = down(h) (normed: sandwich); xout = xmid + dn.
 * The (1 + w) norms (norm_plus_one) are in the weights (model.c adds the 1 at
 * load). The frozen vectors (biases, norms) have no gradient of their own;
 * the backward goes through them to the adapters of earlier projections. */
static void F(layer_fwd)(struct llm_trainer *t, int l, const struct llm_layer *W, struct F(act) *a,
                         const REAL *xin, REAL *xout, const struct llm_train_batch *b, int train)
{
	const struct llm_config *c = &t->m->cfg;
	const struct llm_family *f = c->fam;
	int64_t n = (int64_t)b->n_seq * b->seq_len, D = c->d_model, FF = c->d_ff;
	REAL *q = f->qk_norm ? a->qr : a->q, *k = f->qk_norm ? a->kr : a->k;
	F(rmsnorm)(t, a->xn, a->rstd1, xin, &W->attn_norm, n);
	F(linear)(t, &W->wq, l, LLM_LORA_Q, a->xn, q, a->lu[LLM_LORA_Q], n, train);
	F(linear)(t, &W->wk, l, LLM_LORA_K, a->xn, k, a->lu[LLM_LORA_K], n, train);
	F(linear)(t, &W->wv, l, LLM_LORA_V, a->xn, a->v, a->lu[LLM_LORA_V], n, train);
	if (f->qkv_bias) {
		F(add_bias)(t, q, &W->bq, n);
		F(add_bias)(t, k, &W->bk, n);
		F(add_bias)(t, a->v, &W->bv, n);
	}
	if (f->qk_norm) {              /* each head's d_head elements, before RoPE */
		F(rmsnorm)(t, a->q, a->rq, a->qr, &W->q_norm, n * c->n_head);
		F(rmsnorm)(t, a->k, a->rk, a->kr, &W->k_norm, n * c->n_kv_head);
	}
	F(rope)(t, a->q, b->pos, n, c->n_head, 1);
	F(rope)(t, a->k, b->pos, n, c->n_kv_head, 1);
	struct F(attn_job) aj;
	F(attn_setup)(t, &aj, l, b, a, a->att);
	par(t, (double)n * b->seq_len * c->n_head * c->d_head, F(attn_task), &aj);
	if (f->sandwich) {             /* the attention output normed before the residual add */
		F(linear)(t, &W->wo, l, LLM_LORA_O, a->att, a->ao, a->lu[LLM_LORA_O], n, train);
		F(rmsnorm)(t, a->xmid, a->rstd3, a->ao, &W->post_attn_norm, n);
	} else {
		F(linear)(t, &W->wo, l, LLM_LORA_O, a->att, a->xmid, a->lu[LLM_LORA_O], n, train);
	}
	for (int64_t i = 0; i < n * D; i++)
		a->xmid[i] += xin[i];
	F(rmsnorm)(t, a->xm, a->rstd2, a->xmid, &W->ffn_norm, n);
	if (W->moe.router.data) {           /* a mixture of experts (train_moe.h) */
		F(moe_fwd)(t, l, W, a, xout, n, train);
	} else {
		F(linear)(t, &W->w_gate, l, LLM_LORA_GATE, a->xm, a->g, a->lu[LLM_LORA_GATE], n, train);
		F(linear)(t, &W->w_up, l, LLM_LORA_UP, a->xm, a->u, a->lu[LLM_LORA_UP], n, train);
		struct F(glu_job) gj = { a->h, NULL, NULL, a->g, a->u, NULL, n * FF, f->act };
		par(t, 8.0 * (double)n * FF, F(glu_task), &gj);
		if (f->sandwich) {          /* the MLP output normed before the residual add */
			F(linear)(t, &W->w_down, l, LLM_LORA_DOWN, a->h, a->dn, a->lu[LLM_LORA_DOWN], n, train);
			F(rmsnorm)(t, xout, a->rstd4, a->dn, &W->post_ffn_norm, n);
		} else {
			F(linear)(t, &W->w_down, l, LLM_LORA_DOWN, a->h, xout, a->lu[LLM_LORA_DOWN], n, train);
		}
	}
	for (int64_t i = 0; i < n * D; i++)
		xout[i] += a->xmid[i];
}

/* dres: in, the gradient of the layer output; out (with NEED_DX), that of
 * its input. */
static void F(layer_bwd)(struct llm_trainer *t, int l, const struct llm_layer *W, struct F(act) *a,
                         const REAL *xin, const struct llm_train_batch *b, int need_dx, int train)
{
	struct F(state) *st = t->st;
	const struct llm_config *c = &t->m->cfg;
	const struct llm_family *f = c->fam;
	int64_t n = (int64_t)b->n_seq * b->seq_len, D = c->d_model, FF = c->d_ff;
	/* MLP (sandwich: dxn holds the gradient of down_proj's output first) */
	if (W->moe.router.data) {           /* a mixture of experts (train_moe.h) */
		F(moe_bwd)(t, l, W, a, n, train);
	} else {
		const REAL *ddn = st->dres;
		if (f->sandwich) {
			F(rmsnorm_bwd)(t, st->dxn, st->dres, a->dn, a->rstd4, &W->post_ffn_norm, n);
			ddn = st->dxn;
		}
		F(linear_bwd)(t, &W->w_down, l, LLM_LORA_DOWN, a->h, ddn, a->lu[LLM_LORA_DOWN], st->dh, 0, n, train);
		struct F(glu_job) gj = { NULL, st->dg, st->du, a->g, a->u, st->dh, n * FF, f->act };
		par(t, 8.0 * (double)n * FF, F(glu_task), &gj);
		F(linear_bwd)(t, &W->w_gate, l, LLM_LORA_GATE, a->xm, st->dg, a->lu[LLM_LORA_GATE], st->dxn, 0, n, train);
		F(linear_bwd)(t, &W->w_up, l, LLM_LORA_UP, a->xm, st->du, a->lu[LLM_LORA_UP], st->dxn, 1, n, train);
	}
	F(rmsnorm_bwd)(t, st->dxmid, st->dxn, a->xmid, a->rstd2, &W->ffn_norm, n);
	for (int64_t i = 0; i < n * D; i++)
		st->dxmid[i] += st->dres[i];
	/* attention (sandwich: dxn holds the gradient of o_proj's output) */
	const REAL *dao = st->dxmid;
	if (f->sandwich) {
		F(rmsnorm_bwd)(t, st->dxn, st->dxmid, a->ao, a->rstd3, &W->post_attn_norm, n);
		dao = st->dxn;
	}
	F(linear_bwd)(t, &W->wo, l, LLM_LORA_O, a->att, dao, a->lu[LLM_LORA_O], st->datt, 0, n, train);
	struct F(attn_job) aj;
	F(attn_setup)(t, &aj, l, b, a, NULL);
	par(t, 2.0 * (double)n * b->seq_len * c->n_head * c->d_head, F(attn_bwd_task), &aj);
	F(rope)(t, st->dq, b->pos, n, c->n_head, -1);
	F(rope)(t, st->dk, b->pos, n, c->n_kv_head, -1);
	if (f->qk_norm) {              /* in place: dq, dk become those of q, k before the norm */
		F(rmsnorm_bwd)(t, st->dq, st->dq, a->qr, a->rq, &W->q_norm, n * c->n_head);
		F(rmsnorm_bwd)(t, st->dk, st->dk, a->kr, a->rk, &W->k_norm, n * c->n_kv_head);
	}
	/* the biases add a constant: the gradient passes through unchanged */
	REAL *dxn = need_dx ? st->dxn : NULL;
	F(linear_bwd)(t, &W->wq, l, LLM_LORA_Q, a->xn, st->dq, a->lu[LLM_LORA_Q], dxn, 0, n, train);
	F(linear_bwd)(t, &W->wk, l, LLM_LORA_K, a->xn, st->dk, a->lu[LLM_LORA_K], dxn, 1, n, train);
	F(linear_bwd)(t, &W->wv, l, LLM_LORA_V, a->xn, st->dv, a->lu[LLM_LORA_V], dxn, 1, n, train);
	if (!need_dx)
		return;
	F(rmsnorm_bwd)(t, st->dres, st->dxn, xin, a->rstd1, &W->attn_norm, n);
	for (int64_t i = 0; i < n * D; i++)
		st->dres[i] += st->dxmid[i];
}

/* ---- the whole model -------------------------------------------------------------- */

static struct F(act) *F(act_of)(struct llm_trainer *t, int l)
{
	struct F(state) *st = t->st;
	return t->o.checkpoint ? &st->acts[0] : &st->acts[l];
}

/* Embedding, every layer, final norm (into xf). */
static enum llm_status F(forward)(struct llm_trainer *t, const struct llm_train_batch *b, int train)
{
	struct F(state) *st = t->st;
	const struct llm_config *c = &t->m->cfg;
	int64_t n = (int64_t)b->n_seq * b->seq_len, D = c->d_model;
	float *tmp = (float *)st->tscr;
	for (int64_t i = 0; i < n; i++) {
		llm_weight_row_f32(&t->m->embed, b->tok[i], tmp);
		for (int64_t x = 0; x < D; x++)   /* embed_scale: times sqrt(d_model) (else 1) */
			st->xres[i * D + x] = c->fam->embed_scale ? (REAL)tmp[x] * (REAL)c->embed_scale : (REAL)tmp[x];
	}
	for (int l = 0; l < c->n_layer; l++) {
		const struct llm_layer *W = fetch_layer(t, l);
		if (!W)
			return fetch_failed(l);
		F(layer_fwd)(t, l, W, F(act_of)(t, l), st->xres + (size_t)l * n * D,
		             st->xres + (size_t)(l + 1) * n * D, b, train);
		release_layer(t, l);
	}
	F(rmsnorm)(t, st->xf, st->rstdf, st->xres + (size_t)c->n_layer * n * D, &t->m->norm, n);
	return LLM_OK;
}

struct F(ce_job) { struct llm_trainer *t; const int32_t *tgt; int64_t rows; double gscale; int backward; double *loss; };

/* Per logit row: the final softcap (cap tanh(logit / cap), final_softcap)
 * where the model has one, loss = lse - logit[tgt]; with backward the row
 * becomes gscale * (softmax - onehot), times the cap's derivative 1 -
 * tanh^2. The sum of exp runs in double. */
static void F(ce_task)(void *ctx, int ith, int nth)
{
	struct F(ce_job) *j = ctx;
	struct F(state) *st = j->t->st;
	int64_t V = j->t->m->cfg.n_vocab, b, e;
	split(j->rows, ith, nth, 1, &b, &e);
	for (int64_t r = b; r < e; r++) {
		REAL *lg = st->lg + r * V, cap = (REAL)j->t->m->cfg.final_softcap;
		if (cap > 0)
			for (int64_t v = 0; v < V; v++)
				lg[v] = TANH_(lg[v] / cap) * cap;
		REAL m = lg[0];
		for (int64_t v = 1; v < V; v++)
			if (lg[v] > m)
				m = lg[v];
		double sum = 0;
		for (int64_t v = 0; v < V; v++)
			sum += exp((double)(lg[v] - m));
		double lse = (double)m + log(sum);
		j->loss[r] = lse - (double)lg[j->tgt[r]];
		if (!j->backward)
			continue;
		for (int64_t v = 0; v < V; v++) {
			REAL d = (REAL)(exp((double)lg[v] - lse) * j->gscale);
			if (v == j->tgt[r])
				d -= (REAL)j->gscale;
			if (cap > 0) {   /* lg[v] is cap tanh(x / cap): the tanh is lg[v] / cap */
				REAL th = lg[v] / cap;
				d *= (REAL)1 - th * th;
			}
			lg[v] = d;
		}
	}
}

static enum llm_status F(step)(struct llm_trainer *t, const struct llm_train_batch *b, double gscale,
                               int backward, int train, double *loss_sum, int64_t *n_count)
{
	struct F(state) *st = t->st;
	const struct llm_config *c = &t->m->cfg;
	int64_t n = (int64_t)b->n_seq * b->seq_len, D = c->d_model, C = t->chunk;
	LLM_TRY(F(forward)(t, b, train));
	/* lm_head and cross-entropy over the counted tokens, a chunk at a time;
	 * the gradient of xf gathers in dxn */
	if (backward)
		memset(st->dxn, 0, (size_t)(n * D) * sizeof(REAL));
	double loss = 0;
	int64_t cnt = 0;
	for (int64_t i0 = 0; i0 < n;) {
		int64_t rows = 0;
		for (; i0 < n && rows < C; i0++)
			if (b->tgt[i0] >= 0) {
				t->lg_idx[rows] = (int32_t)i0;
				t->lg_tgt[rows] = b->tgt[i0];
				memcpy(st->lg_x + rows * D, st->xf + i0 * D, (size_t)D * sizeof(REAL));
				rows++;
			}
		if (!rows)
			break;
		F(mm)(t, st->lg, st->lg_x, rows, &t->m->lm_head);
		struct F(ce_job) cj = { t, t->lg_tgt, rows, gscale, backward, t->lg_loss };
		par(t, 4.0 * (double)rows * c->n_vocab, F(ce_task), &cj);
		for (int64_t r = 0; r < rows; r++)
			loss += t->lg_loss[r];
		cnt += rows;
		if (!backward)
			continue;
		F(mmt)(t, st->lg_dx, st->lg, rows, &t->m->lm_head, 0);
		for (int64_t r = 0; r < rows; r++)
			memcpy(st->dxn + (int64_t)t->lg_idx[r] * D, st->lg_dx + r * D, (size_t)D * sizeof(REAL));
	}
	*loss_sum = loss;
	*n_count = cnt;
	if (!backward)
		return LLM_OK;
	F(rmsnorm_bwd)(t, st->dres, st->dxn, st->xres + (size_t)c->n_layer * n * D, st->rstdf, &t->m->norm, n);
	for (int l = c->n_layer - 1; l >= 0; l--) {
		const struct llm_layer *W = fetch_layer(t, l);
		if (!W)
			return fetch_failed(l);
		struct F(act) *a = F(act_of)(t, l);
		const REAL *xin = st->xres + (size_t)l * n * D;
		if (t->o.checkpoint)   /* recompute this layer's activations (same dropout masks) */
			F(layer_fwd)(t, l, W, a, xin, st->xres + (size_t)(l + 1) * n * D, b, train);
		F(layer_bwd)(t, l, W, a, xin, b, l > 0, train);
		release_layer(t, l);
	}
	return LLM_OK;
}

/* Carve the buffers out of one arena, in the order and sizes of
 * llm_train_plan(); returns the element count used (arena NULL: count only). */
static size_t F(carve)(struct llm_trainer *t, REAL *arena)
{
	struct F(state) *st = t->st;
	const struct llm_config *c = &t->m->cfg;
	const struct llm_lora *lo = t->lo;
	size_t n = (size_t)t->o.n_seq * (size_t)t->o.seq_len, D = (size_t)c->d_model;
	size_t Q = (size_t)c->n_head * (size_t)c->d_head, KV = (size_t)c->n_kv_head * (size_t)c->d_head;
	size_t FF = (size_t)dense_ff(c), H = (size_t)c->n_head, R = (size_t)lo->rank, C = (size_t)t->chunk;
	size_t V = (size_t)c->n_vocab, L = (size_t)t->o.seq_len, half = (size_t)c->d_head / 2;
	size_t E = (size_t)c->moe.n_expert, NK = n * (size_t)c->moe.n_expert_used, FE = (size_t)c->moe.d_ff_expert;
	REAL *p = arena;
	size_t used = 0;
#define TAKE(dst, cnt) do { size_t k_ = (cnt); if (arena) { (dst) = p; p += k_; } used += k_; } while (0)
	if (TRAIN_F64)
		TAKE(st->params, lo->n_params);
	else if (arena)
		st->params = (REAL *)(void *)lo->params;
	TAKE(st->grads, lo->n_params);
	TAKE(st->xres, ((size_t)c->n_layer + 1) * n * D);
	int n_acts = t->o.checkpoint ? 1 : c->n_layer;
	for (int l = 0; l < n_acts; l++) {
		struct F(act) dummy, *a = arena ? &st->acts[l] : &dummy;
		TAKE(a->xn, n * D);
		TAKE(a->rstd1, n);
		TAKE(a->q, n * Q);
		TAKE(a->k, n * KV);
		TAKE(a->v, n * KV);
		if (c->fam->qk_norm) {
			TAKE(a->qr, n * Q);
			TAKE(a->kr, n * KV);
			TAKE(a->rq, n * H);
			TAKE(a->rk, n * (size_t)c->n_kv_head);
		}
		if (c->fam->sandwich) {
			TAKE(a->ao, n * D);
			TAKE(a->rstd3, n);
			TAKE(a->dn, n * D);
			TAKE(a->rstd4, n);
		}
		TAKE(a->lse, n * H);
		TAKE(a->att, n * Q);
		TAKE(a->xmid, n * D);
		TAKE(a->xm, n * D);
		TAKE(a->rstd2, n);
		TAKE(a->g, n * FF);
		TAKE(a->u, n * FF);
		TAKE(a->h, n * FF);
		for (int tg = 0; tg < LLM_LORA_N; tg++)
			if (lo->targets >> tg & 1)
				TAKE(a->lu[tg], n * R);
		if (E) {
			TAKE(a->mlogit, n * E);
			TAKE(a->mg, NK * FE);
			TAKE(a->mu, NK * FE);
			TAKE(a->mh, NK * FE);
			TAKE(a->mye, NK * D);
			for (int k = 0; k < 3; k++)
				TAKE(a->mlu[k], NK * R);
		}
	}
	TAKE(st->xf, n * D);
	TAKE(st->rstdf, n);
	TAKE(st->dres, n * D);
	TAKE(st->dxmid, n * D);
	TAKE(st->dxn, n * D);
	TAKE(st->datt, n * Q);
	TAKE(st->dq, n * Q);
	TAKE(st->dk, n * KV);
	TAKE(st->dv, n * KV);
	TAKE(st->dh, n * FF);
	TAKE(st->dg, n * FF);
	TAKE(st->du, n * FF);
	TAKE(st->dlu, (E ? NK : n) * R);
	if (E) {
		TAKE(st->mxe, NK * D);
		TAKE(st->mdye, NK * D);
		TAKE(st->mdxe, NK * D);
		TAKE(st->mdh, NK * FE);
		TAKE(st->mdg, NK * FE);
		TAKE(st->mdu, NK * FE);
		TAKE(st->mrw, NK);
		TAKE(st->mdw, NK);
		TAKE(st->mdlogit, n * E);
	}
	TAKE(st->wvec, D);
	TAKE(st->rcos, L * half);
	TAKE(st->rsin, L * half);
	TAKE(st->lg_x, C * D);
	TAKE(st->lg, C * V);
	TAKE(st->lg_dx, C * D);
	if (arena)
		st->tscr_per = tscr_elems(c, L, R, sizeof(REAL), t->nth);
	TAKE(st->tscr, (size_t)t->nth * tscr_elems(c, L, R, sizeof(REAL), t->nth));
#undef TAKE
	return used;
}

static enum llm_status F(open)(struct llm_trainer *t)
{
	struct F(state) *st = calloc(1, sizeof *st);
	if (!st)
		return llm_fail(LLM_ERR_NOMEM, "trainer: out of memory");
	t->st = st;
	const struct llm_config *c = &t->m->cfg;
	st->acts = calloc(t->o.checkpoint ? 1 : (size_t)c->n_layer, sizeof *st->acts);
	size_t total = F(carve)(t, NULL);
	if (!st->acts || !(st->arena = calloc(total ? total : 1, sizeof(REAL))))
		return llm_fail(LLM_ERR_NOMEM, "trainer: cannot allocate %zu bytes of activations",
		                total * sizeof(REAL));
	F(carve)(t, st->arena);
	if (TRAIN_F64)
		for (size_t i = 0; i < t->lo->n_params; i++)
			st->params[i] = (REAL)t->lo->params[i];
	/* the RoPE table: angle and cos/sin in f32, as model.c computes them */
	int half = c->d_head / 2;
	for (int p = 0; p < t->o.seq_len; p++)
		for (int j = 0; j < half; j++) {
			float a = (float)p * t->m->inv_freq[j];
			st->rcos[(size_t)p * half + j] = (REAL)COS_((REAL)a);
			st->rsin[(size_t)p * half + j] = (REAL)SIN_((REAL)a);
		}
	return LLM_OK;
}

static void F(close)(struct llm_trainer *t)
{
	struct F(state) *st = t->st;
	if (!st)
		return;
	free(st->arena);
	free(st->acts);
	free(st);
	t->st = NULL;
}

/* Greedy next token after slot LAST of row 0 (forward only) into *ID. */
static enum llm_status F(argmax_last)(struct llm_trainer *t, const struct llm_train_batch *b, int64_t last,
                                      int32_t *id)
{
	struct F(state) *st = t->st;
	const struct llm_config *c = &t->m->cfg;
	LLM_TRY(F(forward)(t, b, 0));
	F(mm)(t, st->lg, st->xf + last * c->d_model, 1, &t->m->lm_head);
	if (c->final_softcap > 0)
		for (int32_t v = 0; v < c->n_vocab; v++)
			st->lg[v] = TANH_(st->lg[v] / (REAL)c->final_softcap) * (REAL)c->final_softcap;
	int32_t best = 0;
	for (int32_t v = 1; v < c->n_vocab; v++)
		if (st->lg[v] > st->lg[best])
			best = v;
	*id = best;
	return LLM_OK;
}

#undef SQRT_
#undef EXP_
#undef LOG_
#undef COS_
#undef SIN_
#undef TANH_
