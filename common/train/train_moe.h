/* common/train/train_moe.h: the mixture-of-experts FFN (Mixtral, Qwen3-MoE)
 * of the training forward and backward pass, a part of train_impl.h's
 * template (included by it, so written once for float and double; REAL and
 * F() as there). The forward is moe.c's (moe.h):
 *   p = softmax(router . m) in double, the top k experts by p (equal p:
 *   the lower index first), w_j = p_j / sum of the top k's p (norm_topk)
 *   or p_j, y = sum_j w_j down_j(silu(gate_j(m)) * up_j(m)),
 * each expert over the rows routed to it (gathered), the contributions of a
 * row added in ascending expert order. The router is frozen and the top-k
 * choice is a constant of the step (a step function of the logits: no
 * gradient), but the gradient flows through the routing weights: with
 * g_j = dL/dw_j = dy . expert_j(m),
 *   norm_topk: w is the softmax over the top k's logits, so dL/dlogit_i =
 *     w_i (g_i - sum_j w_j g_j) for a chosen i and 0 for the others;
 *   otherwise: dL/dlogit_i = p_i ([i chosen] g_i - sum_j p_j g_j) for every i;
 * and dL/dm gets dlogit . router besides each chosen expert's input
 * gradient (through its frozen gate, up and down and their LoRA terms).
 * An expert's adapter (lora.h slots) sees only the rows routed to it; its
 * dropout masks follow each row's token (trainer.rowmap).
 *
 * Shapes: n token slots, D = d_model, E = n_expert, K = n_expert_used, FE =
 * d_ff_expert, R = rank; "gathered" arrays are (n K, ...), expert e's rows
 * at positions [start[e], start[e + 1]), each ascending in batch row. */

/* Route the N rows of LOGIT (n, E): the chosen experts and their weights,
 * and the gathered order (t->msel (n, K), t->mwt (n, K), t->mrows (n K)
 * batch row of each position, t->mstart (E + 1); RW (n K) the weight of
 * each position). As moe.c's route(). */
static void F(moe_route)(struct llm_trainer *t, const REAL *logit, int64_t n, REAL *rw)
{
	const struct llm_moe_config *mc = &t->m->cfg.moe;
	int E = mc->n_expert, K = mc->n_expert_used;
	int32_t *start = t->mstart;
	memset(start, 0, ((size_t)E + 1) * sizeof *start);
	for (int64_t i = 0; i < n; i++) {
		const REAL *lg = logit + i * E;
		int32_t *sel = t->msel + i * K;
		double mx = (double)lg[0], sum = 0, top = 0;
		for (int e = 1; e < E; e++)
			if ((double)lg[e] > mx)
				mx = (double)lg[e];
		for (int e = 0; e < E; e++)
			sum += exp((double)lg[e] - mx);
		for (int j = 0; j < K; j++) {
			int best = -1;
			for (int e = 0; e < E; e++) {
				int taken = 0;
				for (int q = 0; q < j; q++)
					taken |= sel[q] == e;
				if (!taken && (best < 0 || lg[e] > lg[best]))
					best = e;
			}
			sel[j] = best;
			top += exp((double)lg[best] - mx) / sum;
			start[best + 1]++;
		}
		for (int j = 0; j < K; j++) {
			double p = exp((double)lg[sel[j]] - mx) / sum;
			t->mwt[i * K + j] = mc->norm_topk ? p / top : p;
		}
	}
	for (int e = 0; e < E; e++)
		start[e + 1] += start[e];
	int32_t *at = t->mstart + E + 1;          /* (E) the next free position of each expert */
	memcpy(at, start, (size_t)E * sizeof *at);
	for (int64_t i = 0; i < n; i++)
		for (int j = 0; j < K; j++) {
			int32_t q = at[t->msel[i * K + j]]++;
			t->mrows[q] = (int32_t)i;
			rw[q] = (REAL)t->mwt[i * K + j];
		}
}

/* Expert E's projection PROJ (0 gate, 1 up, 2 down) over its gathered rows
 * [A, A + NE): y = x W^T + its adapter's term. */
static void F(moe_linear)(struct llm_trainer *t, const struct llm_layer *W, int l, int e, int proj,
                          const REAL *x, REAL *y, REAL *lu, int32_t a, int32_t ne, int train)
{
	t->rowmap = t->mrows + a;
	F(linear)(t, &W->moe.expert[3 * e + proj], l, llm_lora_slot(e, LLM_LORA_GATE + proj), x, y, lu, ne, train);
	t->rowmap = NULL;
}

static void F(moe_linear_bwd)(struct llm_trainer *t, const struct llm_layer *W, int l, int e, int proj,
                              const REAL *x, const REAL *dy, const REAL *lu, REAL *dx, int acc, int32_t a,
                              int32_t ne, int train)
{
	t->rowmap = t->mrows + a;
	F(linear_bwd)(t, &W->moe.expert[3 * e + proj], l, llm_lora_slot(e, LLM_LORA_GATE + proj), x, dy, lu, dx, acc,
	              ne, train);
	t->rowmap = NULL;
}

/* Y (n, D) = the MoE FFN of layer L (weights W) over a->xm, saving in A
 * what the backward needs. */
static void F(moe_fwd)(struct llm_trainer *t, int l, const struct llm_layer *W, struct F(act) *a, REAL *y,
                       int64_t n, int train)
{
	struct F(state) *st = t->st;
	const struct llm_config *c = &t->m->cfg;
	int E = c->moe.n_expert;
	int64_t D = c->d_model, FE = c->moe.d_ff_expert, R = t->lo->rank;
	F(mm)(t, a->mlogit, a->xm, n, &W->moe.router);
	F(moe_route)(t, a->mlogit, n, st->mrw);
	int64_t nk = n * c->moe.n_expert_used;
	for (int64_t q = 0; q < nk; q++)
		memcpy(st->mxe + q * D, a->xm + (int64_t)t->mrows[q] * D, (size_t)D * sizeof(REAL));
	memset(y, 0, (size_t)(n * D) * sizeof(REAL));
	for (int e = 0; e < E; e++) {
		int32_t q0 = t->mstart[e], ne = t->mstart[e + 1] - q0;
		if (ne == 0)
			continue;                 /* an expert no row chose is not computed */
		const REAL *xe = st->mxe + q0 * D;
		REAL *g = a->mg + q0 * FE, *u = a->mu + q0 * FE, *h = a->mh + q0 * FE, *ye = a->mye + q0 * D;
		F(moe_linear)(t, W, l, e, 0, xe, g, a->mlu[0] ? a->mlu[0] + q0 * R : NULL, q0, ne, train);
		F(moe_linear)(t, W, l, e, 1, xe, u, a->mlu[1] ? a->mlu[1] + q0 * R : NULL, q0, ne, train);
		struct F(glu_job) sj = { h, NULL, NULL, g, u, NULL, ne * FE, t->m->cfg.fam->act };
		par(t, 8.0 * (double)ne * FE, F(glu_task), &sj);
		F(moe_linear)(t, W, l, e, 2, h, ye, a->mlu[2] ? a->mlu[2] + q0 * R : NULL, q0, ne, train);
		/* each row's contributions in ascending expert order, from zero */
		for (int32_t q = q0; q < q0 + ne; q++) {
			REAL *yr = y + (int64_t)t->mrows[q] * D, w = st->mrw[q];
			const REAL *yq = a->mye + (int64_t)q * D;
			for (int64_t x = 0; x < D; x++)
				yr[x] += w * yq[x];
		}
	}
}

/* The backward of F(moe_fwd): st->dres (n, D) the gradient of its output;
 * st->dxn (n, D) gets (written) that of a->xm; the adapters' gradients are
 * added. */
static void F(moe_bwd)(struct llm_trainer *t, int l, const struct llm_layer *W, struct F(act) *a, int64_t n,
                       int train)
{
	struct F(state) *st = t->st;
	const struct llm_config *c = &t->m->cfg;
	const struct llm_moe_config *mc = &c->moe;
	int E = mc->n_expert, K = mc->n_expert_used;
	int64_t D = c->d_model, FE = mc->d_ff_expert, R = t->lo->rank, nk = n * K;
	F(moe_route)(t, a->mlogit, n, st->mrw);
	for (int64_t q = 0; q < nk; q++) {
		const REAL *dy = st->dres + (int64_t)t->mrows[q] * D, *ye = a->mye + q * D;
		REAL *dye = st->mdye + q * D, w = st->mrw[q], g = 0;
		for (int64_t x = 0; x < D; x++) {
			dye[x] = w * dy[x];
			g += dy[x] * ye[x];
		}
		st->mdw[q] = g;                   /* dL/dw of this (row, expert) */
		memcpy(st->mxe + q * D, a->xm + (int64_t)t->mrows[q] * D, (size_t)D * sizeof(REAL));
	}
	for (int e = 0; e < E; e++) {
		int32_t q0 = t->mstart[e], ne = t->mstart[e + 1] - q0;
		if (ne == 0)
			continue;
		const REAL *xe = st->mxe + q0 * D;
		REAL *dh = st->mdh + q0 * FE, *dg = st->mdg + q0 * FE, *du = st->mdu + q0 * FE, *dxe = st->mdxe + q0 * D;
		F(moe_linear_bwd)(t, W, l, e, 2, a->mh + q0 * FE, st->mdye + q0 * D, a->mlu[2] ? a->mlu[2] + q0 * R : NULL,
		                  dh, 0, q0, ne, train);
		struct F(glu_job) sj = { NULL, dg, du, a->mg + q0 * FE, a->mu + q0 * FE, dh, ne * FE, t->m->cfg.fam->act };
		par(t, 8.0 * (double)ne * FE, F(glu_task), &sj);
		F(moe_linear_bwd)(t, W, l, e, 0, xe, dg, a->mlu[0] ? a->mlu[0] + q0 * R : NULL, dxe, 0, q0, ne, train);
		F(moe_linear_bwd)(t, W, l, e, 1, xe, du, a->mlu[1] ? a->mlu[1] + q0 * R : NULL, dxe, 1, q0, ne, train);
	}
	/* the experts' input gradients, each row's in ascending expert order */
	memset(st->dxn, 0, (size_t)(n * D) * sizeof(REAL));
	for (int64_t q = 0; q < nk; q++) {
		REAL *dx = st->dxn + (int64_t)t->mrows[q] * D;
		const REAL *dq = st->mdxe + q * D;
		for (int64_t x = 0; x < D; x++)
			dx[x] += dq[x];
	}
	/* the routing weights' softmax (and renormalisation) to the logits */
	int32_t *pos = t->mstart + E + 1;         /* (E) each expert's next position, as moe_route gave them */
	memcpy(pos, t->mstart, (size_t)E * sizeof *pos);
	for (int64_t i = 0; i < n; i++) {
		const REAL *lg = a->mlogit + i * E;
		REAL *dl = st->mdlogit + i * E;
		const int32_t *sel = t->msel + i * K;
		double *gj = t->mgj, mx = (double)lg[0], sum = 0, dot = 0;
		for (int j = 0; j < K; j++)
			gj[j] = (double)st->mdw[pos[sel[j]]++];
		if (mc->norm_topk) {
			for (int j = 0; j < K; j++)
				dot += t->mwt[i * K + j] * gj[j];
			for (int e = 0; e < E; e++)
				dl[e] = 0;
			for (int j = 0; j < K; j++)
				dl[sel[j]] = (REAL)(t->mwt[i * K + j] * (gj[j] - dot));
			continue;
		}
		for (int e = 1; e < E; e++)
			if ((double)lg[e] > mx)
				mx = (double)lg[e];
		for (int e = 0; e < E; e++)
			sum += exp((double)lg[e] - mx);
		for (int j = 0; j < K; j++)
			dot += exp((double)lg[sel[j]] - mx) / sum * gj[j];
		for (int e = 0; e < E; e++)
			dl[e] = (REAL)(-exp((double)lg[e] - mx) / sum * dot);
		for (int j = 0; j < K; j++)
			dl[sel[j]] += (REAL)(exp((double)lg[sel[j]] - mx) / sum * gj[j]);
	}
	F(mmt)(t, st->dxn, st->mdlogit, n, &W->moe.router, 1);
}
