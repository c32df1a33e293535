/* common/finetune.c: a LoRA fine-tuning run (see train.h): data, steps with
 * gradient accumulation, AdamW, progress, the loss log, the training state
 * and resuming, the adapter files.
 *
 * Determinism: a step's rows, dropout masks and learning rate are functions
 * of (seed, step) alone, and the trainer is deterministic, so a run resumed
 * from a saved state (parameters, AdamW moments, step) ends with the same
 * adapter, bit for bit, as one never interrupted. */
#define _GNU_SOURCE
#include "train.h"
#include "tokenizer.h"
#include "fileio.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include "banned.h"

#define STATE_MAGIC "LLMFTST1"
#define STATE_NAME "training_state.bin"

static const char *aux_get(void *ctx, const char *name, size_t *len)
{
	const struct llm_aux *a = llm_ckpt_aux(ctx, name);
	if (!a)
		return NULL;
	*len = a->len;
	return a->data;
}

enum llm_status llm_finetune_tokenizer(const struct llm_model *m, const char *path,
                                       struct llm_tokenizer **tk)
{
	if (llm_ckpt_aux(&m->ck, "tokenizer.json") && !m->ck.is_dir) {
		struct llm_tok_files f = { aux_get, (void *)&m->ck };
		return llm_tokenizer_open_mem(tk, path, &f);
	}
	if (m->ck.is_dir)
		return llm_tokenizer_open(tk, path);
	return llm_fail(LLM_ERR_FORMAT, "%s: no tokenizer.json in the checkpoint", path);
}

static void warn_line(const char *msg) { llm_warn("%s", msg); }

static uint64_t fnv(uint64_t h, const void *p, size_t n)
{
	const unsigned char *c = p;
	for (size_t i = 0; i < n; i++)
		h = (h ^ c[i]) * 0x100000001b3ull;
	return h;
}

static uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* Everything that shapes the trajectory: a resumed run must match it. */
static uint64_t fingerprint(const struct llm_finetune_opts *o, const struct llm_lora *lo,
                            const struct llm_dataset *d, int64_t steps)
{
	char buf[1024];
	const struct llm_adamw_opts *a = &o->adam;
	int n = snprintf(buf, sizeof buf, "%zu %d %a %a %u %d %d %d %lld %a %a %lld %a %a %a %a %a %llu %d %d",
	                 lo->n_params, lo->rank, (double)lo->alpha, (double)lo->dropout, lo->targets,
	                 o->seq_len, o->micro_batch, o->grad_accum, (long long)steps, a->lr, a->min_lr_ratio,
	                 (long long)a->warmup, a->beta1, a->beta2, a->eps, a->weight_decay, a->clip,
	                 (unsigned long long)o->seed, o->pack, o->data_o.train_on_prompt);
	uint64_t h = fnv(0xcbf29ce484222325ull, buf, (size_t)n);
	for (int i = 0; i < d->n; i++) {
		h = fnv(h, d->s[i].ids, (size_t)d->s[i].n * sizeof(int32_t));
		h = fnv(h, d->s[i].loss, (size_t)d->s[i].n);
	}
	return h;
}

struct state_hdr {
	char magic[8];
	uint64_t fingerprint;
	int64_t step;           /* updates done */
	int64_t adam_step;
	uint64_t n_params;
};

static enum llm_status state_save(const char *path, uint64_t fp, int64_t step, const struct llm_lora *lo,
                                  const struct llm_adamw *a)
{
	size_t n = lo->n_params, bytes = sizeof(struct state_hdr) + 3 * n * sizeof(float);
	char *buf = malloc(bytes);
	if (!buf)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	struct state_hdr h;
	memset(&h, 0, sizeof h);
	memcpy(h.magic, STATE_MAGIC, 8);
	h.fingerprint = fp;
	h.step = step;
	h.adam_step = a->step;
	h.n_params = n;
	memcpy(buf, &h, sizeof h);
	memcpy(buf + sizeof h, lo->params, n * sizeof(float));
	memcpy(buf + sizeof h + n * sizeof(float), a->m, n * sizeof(float));
	memcpy(buf + sizeof h + 2 * n * sizeof(float), a->v, n * sizeof(float));
	enum llm_status s = llm_write_file_atomic(path, buf, bytes);
	free(buf);
	return s;
}

static enum llm_status state_load(const char *path, uint64_t fp, int64_t *step, struct llm_lora *lo,
                                  struct llm_adamw *a)
{
	char *buf;
	size_t len;
	LLM_TRY(llm_read_file(path, &buf, &len));
	struct state_hdr h;
	size_t n = lo->n_params;
	enum llm_status s = LLM_OK;
	if (len < sizeof h) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: truncated", path);
		goto out;
	}
	memcpy(&h, buf, sizeof h);
	if (memcmp(h.magic, STATE_MAGIC, 8) || h.n_params != n || len != sizeof h + 3 * n * sizeof(float)) {
		s = llm_fail(LLM_ERR_FORMAT, "%s: not a training state of this adapter", path);
		goto out;
	}
	if (h.fingerprint != fp) {
		s = llm_fail(LLM_ERR_USAGE, "%s: the state was saved with other options or data; "
		             "resume with the same ones", path);
		goto out;
	}
	memcpy(lo->params, buf + sizeof h, n * sizeof(float));
	memcpy(a->m, buf + sizeof h + n * sizeof(float), n * sizeof(float));
	memcpy(a->v, buf + sizeof h + 2 * n * sizeof(float), n * sizeof(float));
	a->step = h.adam_step;
	*step = h.step;
out:
	free(buf);
	return s;
}

/* The log kept through step STEP (a resumed run rewrites what followed). */
static enum llm_status log_open(const char *path, int resume, int64_t step, FILE **f)
{
	static const char header[] = "step,loss,lr,grad_norm,tokens,tokens_per_s,elapsed_s\n";
	char *keep = NULL;
	size_t klen = 0;
	if (resume && llm_exists(path)) {
		char *buf;
		size_t len;
		LLM_TRY(llm_read_file(path, &buf, &len));
		keep = malloc(len + sizeof header);
		if (!keep) {
			free(buf);
			return llm_fail(LLM_ERR_NOMEM, "out of memory");
		}
		memcpy(keep, header, sizeof header - 1);
		klen = sizeof header - 1;
		for (char *p = buf, *e; p < buf + len; p = e + 1) {
			e = memchr(p, '\n', (size_t)(buf + len - p));
			if (!e)
				break;       /* a torn last line */
			long long s = strtoll(p, NULL, 10);
			if (s >= 1 && s <= step) {
				memcpy(keep + klen, p, (size_t)(e - p + 1));
				klen += (size_t)(e - p + 1);
			}
		}
		free(buf);
	}
	enum llm_status s = llm_write_file_atomic(path, keep ? keep : header, keep ? klen : sizeof header - 1);
	free(keep);
	if (s)
		return s;
	if (!(*f = fopen(path, "a")))
		return llm_fail(LLM_ERR_IO, "%s: %s", path, strerror(errno));
	return LLM_OK;
}

/* The global stream of packed rows: epoch after epoch. */
struct stream {
	const struct llm_dataset *d;
	int seq_len, pack;
	uint64_t seed;
	int64_t epoch, first;       /* the packed epoch and its first global row */
	struct llm_packed p;
};

static enum llm_status stream_row(struct stream *s, int64_t g, int *row)
{
	if (!s->p.tok || g < s->first) {
		llm_packed_free(&s->p);
		s->epoch = 0;
		s->first = 0;
		LLM_TRY(llm_dataset_pack(s->d, s->seq_len, s->pack, s->seed, 0, &s->p));
	}
	while (g >= s->first + s->p.n_row) {
		s->first += s->p.n_row;
		s->epoch++;
		llm_packed_free(&s->p);
		LLM_TRY(llm_dataset_pack(s->d, s->seq_len, s->pack, s->seed, s->epoch, &s->p));
		if (!s->p.n_row)
			return llm_fail(LLM_ERR_INTERNAL, "an epoch without rows");
	}
	*row = (int)(g - s->first);
	return LLM_OK;
}

static size_t peak_rss(void)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	return (size_t)ru.ru_maxrss * 1024;
}

static void fmt_time(char *buf, size_t n, double s)
{
	if (!(s >= 0) || s > 1e8)
		s = 0;
	long t = (long)(s + 0.5);
	snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
}

static void plot(const double *loss, int64_t n)
{
	enum { W = 60, HGT = 10 };
	if (n < 2)
		return;
	double lo = loss[0], hi = loss[0];
	for (int64_t i = 0; i < n; i++) {
		lo = fmin(lo, loss[i]);
		hi = fmax(hi, loss[i]);
	}
	if (hi - lo < 1e-12)
		hi = lo + 1e-12;
	char grid[HGT][W + 1];
	memset(grid, ' ', sizeof grid);
	for (int x = 0; x < W; x++) {
		int64_t a = x * n / W, b = (x + 1) * n / W;
		if (b <= a)
			b = a + 1;
		double m = 0;
		for (int64_t i = a; i < b && i < n; i++)
			m += loss[i];
		m /= (double)(b - a);
		int y = (int)((hi - m) / (hi - lo) * (HGT - 1) + 0.5);
		grid[y][x] = '*';
	}
	LLM_INFO("loss by step (1 to %lld):\n", (long long)n);
	for (int y = 0; y < HGT; y++) {
		grid[y][W] = 0;
		LLM_INFO("%9.4f |%s\n", hi - (hi - lo) * y / (HGT - 1), grid[y]);
	}
}

enum llm_status llm_finetune(const struct llm_finetune_opts *o, struct llm_finetune_result *r)
{
	memset(r, 0, sizeof *r);
	struct llm_model m;
	struct llm_tokenizer *tk = NULL;
	struct llm_dataset d = { 0 };
	struct llm_lora lo = { 0 };
	struct llm_trainer *tr = NULL;
	struct llm_adamw a = { 0 };
	struct stream st = { 0 };
	FILE *logf = NULL;
	double *losses = NULL;
	int32_t *stage = NULL;
	char *state_path = NULL;
	enum llm_status s;
	double t_load = llm_now();
	LLM_TRY(llm_model_open(&m, o->model));
	if ((s = llm_finetune_tokenizer(&m, o->model, &tk)))
		goto out;
	struct llm_data_opts dopt = o->data_o;
	dopt.seq_len = o->seq_len;
	if ((s = llm_dataset_load(&d, o->data, tk, &dopt, warn_line)))
		goto out;
	r->n_skipped = d.n_skipped;
	r->n_samples = d.n;
	if (d.n_skipped)
		llm_warn("%s: %d bad line%s skipped", o->data, d.n_skipped, d.n_skipped > 1 ? "s" : "");
	if (o->adapter) {
		if ((s = llm_lora_load(&lo, o->adapter, &m.cfg)))
			goto out;
	} else if ((s = llm_lora_init(&lo, &m.cfg, o->rank, (float)o->alpha, (float)o->dropout, o->targets,
	                              o->seed))) {
		goto out;
	}
	free(lo.base_model);
	lo.base_model = llm_strdup(o->model);
	/* the output: refuse to clobber an adapter before spending hours */
	state_path = llm_path_join(o->out, STATE_NAME);
	{
		char *am = llm_path_join(o->out, "adapter_model.safetensors");
		int exists = am && llm_exists(am);
		free(am);
		if (exists && !o->force && !o->resume) {
			s = llm_fail(LLM_ERR_EXISTS, "%s: holds an adapter already (--force replaces it)", o->out);
			goto out;
		}
		if (mkdir(o->out, 0755) && errno != EEXIST) {
			s = llm_fail(LLM_ERR_IO, "%s: cannot create directory: %s", o->out, strerror(errno));
			goto out;
		}
	}
	/* steps: --steps, or enough for --epochs passes over the packed rows */
	int64_t R = (int64_t)o->micro_batch * o->grad_accum, steps = o->steps;
	st.d = &d;
	st.seq_len = o->seq_len;
	st.pack = o->pack;
	st.seed = o->seed;
	if (!steps) {
		int64_t rows = 0;
		for (int64_t e = 0; e < o->epochs; e++) {
			struct llm_packed p;
			if ((s = llm_dataset_pack(&d, o->seq_len, o->pack, o->seed, e, &p)))
				goto out;
			rows += p.n_row;
			llm_packed_free(&p);
		}
		steps = (rows + R - 1) / R;
	}
	r->steps = steps;
	struct llm_train_opts to = { .seq_len = o->seq_len, .n_seq = o->micro_batch, .checkpoint = o->checkpoint,
	                             .n_threads = o->n_threads };
	if ((s = llm_trainer_open(&tr, &m, &lo, &to, NULL)))
		goto out;
	struct llm_adamw_opts ao = o->adam;
	ao.total = steps;
	if ((s = llm_adamw_init(&a, lo.n_params, &ao)))
		goto out;
	int nt = 0;
	for (int k = 0; k < LLM_LORA_N; k++)
		nt += lo.targets >> k & 1;
	llm_train_plan(&m.cfg, lo.n_params, lo.rank, nt, &to, to.n_threads > 0 ? to.n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN), &r->plan);
	r->weight_bytes = m.weight_bytes;
	uint64_t fp = fingerprint(o, &lo, &d, steps);
	int64_t step = 0;
	if (o->resume) {
		if (!llm_exists(state_path)) {
			s = llm_fail(LLM_ERR_IO, "%s: no training state to resume from", state_path);
			goto out;
		}
		if ((s = state_load(state_path, fp, &step, &lo, &a)))
			goto out;
		LLM_INFO("resuming at step %lld of %lld\n", (long long)step, (long long)steps);
	}
	r->start_step = step;
	if (o->log && (s = log_open(o->log, o->resume, step, &logf)))
		goto out;
	losses = calloc((size_t)(steps > 0 ? steps : 1), sizeof *losses);
	stage = malloc((size_t)4 * (size_t)o->micro_batch * (size_t)o->seq_len * sizeof *stage);
	if (!losses || !stage) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	LLM_INFO("%s: %d samples (%lld tokens, %lld in completions), %lld steps of %lld rows x %d tokens, "
	         "%zu LoRA parameters (rank %d), loaded in %.1f s\n", o->data, d.n, (long long)d.n_tok,
	         (long long)d.n_loss_tok, (long long)steps, (long long)R, o->seq_len, lo.n_params, lo.rank,
	         llm_now() - t_load);
	double t0 = llm_now();
	int64_t tokens = 0;
	float *grads = llm_trainer_grads(tr);
	for (; step < steps; step++) {
		/* the step's rows and its counted targets */
		int64_t count = 0;
		for (int64_t k = 0; k < R; k++) {
			int row;
			if ((s = stream_row(&st, step * R + k, &row)))
				goto out;
			for (int i = 0; i < st.p.used[row]; i++)
				count += st.p.tgt[(size_t)row * o->seq_len + (size_t)i] >= 0;
		}
		llm_trainer_zero_grad(tr);
		double loss = 0;
		int64_t got = 0;
		for (int mb = 0; mb < o->grad_accum; mb++) {
			/* stage micro_batch rows, trimmed to the longest one */
			int L = 1, rows[4096];
			int nr = o->micro_batch;
			for (int k = 0; k < nr; k++) {
				if ((s = stream_row(&st, step * R + (int64_t)mb * nr + k, &rows[k])))
					goto out;
				if (st.p.used[rows[k]] > L)
					L = st.p.used[rows[k]];
			}
			int32_t *tok = stage, *tgt = tok + (size_t)nr * L, *pos = tgt + (size_t)nr * L,
			        *start = pos + (size_t)nr * L;
			for (int k = 0; k < nr; k++) {
				int row;
				if ((s = stream_row(&st, step * R + (int64_t)mb * nr + k, &row)))
					goto out;
				size_t src = (size_t)row * o->seq_len, dst = (size_t)k * L;
				memcpy(tok + dst, st.p.tok + src, (size_t)L * sizeof *tok);
				memcpy(tgt + dst, st.p.tgt + src, (size_t)L * sizeof *tgt);
				memcpy(pos + dst, st.p.pos + src, (size_t)L * sizeof *pos);
				memcpy(start + dst, st.p.start + src, (size_t)L * sizeof *start);
				tokens += st.p.used[row];
			}
			struct llm_train_batch b = { nr, L, tok, tgt, pos, start };
			double ls;
			int64_t c;
			uint64_t key = mix(o->seed ^ mix((uint64_t)step * 4096 + (uint64_t)mb));
			if ((s = llm_trainer_step(tr, &b, count ? 1.0 / (double)count : 0.0, key,
			                          LLM_TRAIN_GRAD | LLM_TRAIN_DROPOUT, &ls, &c)))
				goto out;
			loss += ls;
			got += c;
		}
		double norm = llm_grad_norm(grads, lo.n_params), lr = llm_lr_at(&a.o, step);
		if (count)
			llm_adamw_update(&a, lo.params, grads, norm, lr);
		double mean = got ? loss / (double)got : 0.0;
		losses[step] = mean;
		if (step == r->start_step)
			r->first_loss = mean;
		r->last_loss = mean;
		double el = llm_now() - t0, tps = el > 0 ? (double)tokens / el : 0;
		int64_t done = step + 1 - r->start_step;
		char eta[32];
		fmt_time(eta, sizeof eta, el / (double)done * (double)(steps - step - 1));
		LLM_INFO("step %lld/%lld  loss %.4f  lr %.3e  |g| %.3f  %.0f tok/s  eta %s\n", (long long)(step + 1),
		         (long long)steps, mean, lr, norm, tps, eta);
		if (logf) {
			fprintf(logf, "%lld,%.6f,%.6e,%.6f,%lld,%.1f,%.3f\n", (long long)(step + 1), mean, lr, norm,
			        (long long)tokens, tps, el);
			fflush(logf);
		}
		if (o->save_every && (step + 1) % o->save_every == 0 && step + 1 < steps &&
		    (s = state_save(state_path, fp, step + 1, &lo, &a)))
			goto out;
	}
	double el = llm_now() - t0;
	r->tokens = tokens;
	r->tokens_per_s = el > 0 ? (double)tokens / el : 0;
	if ((s = llm_lora_save(&lo, o->out, 1)))
		goto out;
	unlink(state_path);
	llm_fsync_dir(o->out);
	if (o->plot)
		plot(losses, steps);
	r->peak_rss = peak_rss();
out:
	if (logf)
		fclose(logf);
	free(losses);
	free(stage);
	free(state_path);
	llm_packed_free(&st.p);
	llm_adamw_free(&a);
	llm_trainer_close(tr);
	llm_lora_free(&lo);
	llm_dataset_free(&d);
	llm_tokenizer_close(tk);
	llm_model_close(&m);
	return s;
}

enum llm_status llm_finetune_sample(const char *model, const char *adapter, const char *text,
                                    int n_new, int n_threads, char **out)
{
	*out = NULL;
	struct llm_model m;
	LLM_TRY(llm_model_open(&m, model));
	struct llm_tokenizer *tk = NULL;
	struct llm_lora lo = { 0 };
	struct llm_trainer *tr = NULL;
	int32_t *ids = NULL, *gen = NULL;
	size_t n = 0, len;
	int ng = 0;
	enum llm_status s;
	if ((s = llm_finetune_tokenizer(&m, model, &tk)))
		goto out;
	if (adapter)
		s = llm_lora_load(&lo, adapter, &m.cfg);
	else   /* no adapter: a rank-1 one with B = 0 changes nothing */
		s = llm_lora_init(&lo, &m.cfg, 1, 1.0f, 0.0f, 1u << LLM_LORA_Q, 0);
	if (s || (s = llm_tokenizer_encode(tk, text, strlen(text), true, &ids, &n)))
		goto out;
	int L = (int)n + n_new;
	if (L > m.cfg.max_ctx)
		L = m.cfg.max_ctx;
	struct llm_train_opts to = { .seq_len = L, .n_seq = 1, .n_threads = n_threads, .logit_chunk = 1 };
	if ((s = llm_trainer_open(&tr, &m, &lo, &to, NULL)))
		goto out;
	if (!(gen = malloc((size_t)(n_new > 0 ? n_new : 1) * sizeof *gen))) {
		s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		goto out;
	}
	if ((s = llm_trainer_greedy(tr, ids, (int)n, n_new, gen, &ng)))
		goto out;
	s = llm_tokenizer_decode(tk, gen, (size_t)ng, true, out, &len);
out:
	free(ids);
	free(gen);
	llm_trainer_close(tr);
	llm_lora_free(&lo);
	llm_tokenizer_close(tk);
	llm_model_close(&m);
	return s;
}
