/* common/jobs/eval.c: the evaluation job (eval.h): items read and tokenised in
 * threads while the caller loads the model, sorted and cut into batches by
 * a dynamic program, scored through the scheduler (a context once, its
 * endings forked), written in input order, and summarised with accuracy,
 * standard errors and the time split from process start.
 *
 * Item rules follow lm-eval's multiple-choice scoring: an ending's tokens
 * are those of encode(context + ending) past the context's; the
 * normalised score is the log-likelihood over the ending's characters
 * (Python's len(): code points); pred is the argmax of the raw
 * log-likelihoods, pred_norm of the normalised ones (first on ties). */
#define _GNU_SOURCE
#include "eval.h"
#include "tokenizer.h"
#include "buf.h"
#include "fileio.h"

#include <ctype.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include "banned.h"

struct eval_line {              /* one input line as the readers left it */
	char *text;                 /* NULL: empty */
	struct llm_eval_item it;
	enum llm_status st;
	char *err;                  /* st's message (malloc'd) */
};

struct llm_eval {
	struct llm_eval_opts o;
	const struct llm_tokenizer *tk;
	char *file, *buf;
	size_t len;
	struct eval_line *lines;    /* (n_lines) */
	size_t n_lines;
	enum llm_status read_st;    /* reading the file */
	char *read_err;
	pthread_t reader;
	int started, joined;
	struct llm_eval_item *items;   /* (n) the good items, in input order (moved from lines) */
	size_t n, skipped, n_prefills;
	int64_t tokens, computed0, computed;   /* planned; prompt tokens counter at start and end */
	int window;                 /* documents: positions of a window (llm_eval_window) */
	size_t n_batch;
	/* clock (llm_now): process start, start, file read, tokenised, run
	 * entered (the model loaded), readers joined, planned, end */
	double t_proc, t_start, t_read, t_tok, t_run, t_joined, t_planned, t_end;
};

int64_t llm_utf8_chars(const char *s, size_t len)
{
	int64_t n = 0;
	for (size_t i = 0; i < len; i++)
		n += ((unsigned char)s[i] & 0xC0) != 0x80;
	return n;
}

/* The process's start on llm_now()'s clock: its age from /proc/self/stat
 * (field 22, clock ticks since boot) against CLOCK_BOOTTIME. */
static double process_start(void)
{
	double now = llm_now();
	char buf[1024];
	FILE *f = fopen("/proc/self/stat", "r");
	size_t k = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
	if (f)
		fclose(f);
	buf[k] = 0;
	char *p = strrchr(buf, ')');   /* the command name may hold spaces */
	unsigned long long start = 0;
	for (int field = 2; p && *p && field < 22; p++)
		field += *p == ' ';
	if (!p || sscanf(p, "%llu", &start) != 1)
		return now;
	struct timespec ts;
	clock_gettime(CLOCK_BOOTTIME, &ts);
	double age = (double)ts.tv_sec + ts.tv_nsec * 1e-9 - (double)start / (double)sysconf(_SC_CLK_TCK);
	return age > 0 ? now - age : now;
}

/* ---- reading an item -------------------------------------------------------- */

/* lm-eval's HellaSwag cleanup of text T (in place): strip ASCII white space,
 * " [title]" to ". ", drop every "[...]" (shortest), each "  " to " " (one
 * pass, left to right, as Python's str.replace). */
static void hs_clean(char *t)
{
	size_t n = strlen(t), a = 0;
	while (n && isspace((unsigned char)t[n - 1]))
		t[--n] = 0;
	while (isspace((unsigned char)t[a]))
		a++;
	memmove(t, t + a, n - a + 1);
	char *w = t;
	for (char *r = t; *r; ) {   /* " [title]" -> ". " (shrinks: in place) */
		if (!strncmp(r, " [title]", 8))
			memcpy(w, ". ", 2), w += 2, r += 8;
		else
			*w++ = *r++;
	}
	*w = 0;
	w = t;
	for (char *r = t; *r; ) {
		char *close = *r == '[' ? strchr(r, ']') : NULL;
		if (close)
			r = close + 1;
		else
			*w++ = *r++;
	}
	*w = 0;
	w = t;
	for (char *r = t; *r; ) {
		if (r[0] == ' ' && r[1] == ' ')
			r++;
		*w++ = *r++;
	}
	*w = 0;
}

static char *cat(const char *a, const char *b, const char *c, const char *d)
{
	size_t na = strlen(a), nb = strlen(b), nc = strlen(c), nd = strlen(d);
	char *s = malloc(na + nb + nc + nd + 1);
	if (s) {
		memcpy(s, a, na), memcpy(s + na, b, nb), memcpy(s + na + nb, c, nc), memcpy(s + na + nb + nc, d, nd);
		s[na + nb + nc + nd] = 0;
	}
	return s;
}

static const char *str_field(json_t *o, const char *a, const char *b)
{
	json_t *v = json_object_get(o, a);
	if (!v && b)
		v = json_object_get(o, b);
	return json_is_string(v) ? json_string_value(v) : NULL;
}

/* The context of item O as a heap string: "context" or "ctx"; with
 * HELLASWAG, activity_label + ": " + ctx_a + " " + ctx_b capitalised
 * (ASCII: first letter upper, the rest lower, as Python's str.capitalize),
 * cleaned. */
static enum llm_status item_context(json_t *o, int hellaswag, char **out)
{
	if (!hellaswag) {
		const char *c = str_field(o, "context", "ctx");
		if (!c)
			return llm_fail(LLM_ERR_USAGE, "needs \"context\" (or \"ctx\"), a string");
		return (*out = llm_strdup(c)) ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	const char *al = str_field(o, "activity_label", NULL), *ca = str_field(o, "ctx_a", NULL);
	const char *cb = str_field(o, "ctx_b", NULL);
	if (!al || !ca || !cb)
		return llm_fail(LLM_ERR_USAGE, "--hellaswag needs \"activity_label\", \"ctx_a\" and \"ctx_b\" (strings)");
	char *b = llm_strdup(cb);
	for (char *p = b; p && *p; p++)
		*p = (char)(p == b ? toupper((unsigned char)*p) : tolower((unsigned char)*p));
	char *s = b ? cat(al, ": ", ca, " ") : NULL, *t = s ? cat(s, b, "", "") : NULL;
	free(b), free(s);
	if (!t)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	hs_clean(t);
	*out = t;
	return LLM_OK;
}

static enum llm_status item_label(json_t *o, int n, int *label)
{
	json_t *l = json_object_get(o, "label");
	*label = -1;
	if (!l || json_is_null(l))
		return LLM_OK;
	long long v = -1;
	if (json_is_integer(l))
		v = json_integer_value(l);
	else if (json_is_string(l)) {
		const char *s = json_string_value(l);
		char *e;
		v = *s && isdigit((unsigned char)*s) ? strtoll(s, &e, 10) : -1;
		if (v >= 0 && *e)
			v = -1;
	}
	if (!json_is_integer(l) && v < 0)
		return llm_fail(LLM_ERR_USAGE, "label: not an ending index (an integer or a string of digits)");
	if (v < 0 || v >= n)
		return llm_fail(LLM_ERR_USAGE, "label: %lld is out of range (%d endings)", v, n);
	*label = (int)v;
	return LLM_OK;
}

static void item_free(struct llm_eval_item *it)
{
	for (int k = 0; it->end && k < it->n; k++)
		free(it->end[k]);
	free(it->end), free(it->n_end), free(it->chars), free(it->res), free(it->ctx);
	memset(it, 0, sizeof *it);
}

/* A document: "text" (or a JSON string alone), tokenised without special
 * tokens into IT->ctx until llm_eval_run cuts it into windows. */
static enum llm_status doc_read(struct llm_eval_item *it, json_t *o, const struct llm_tokenizer *tk)
{
	json_t *t = json_is_object(o) ? json_object_get(o, "text") : o;
	if (!json_is_string(t))
		return llm_fail(LLM_ERR_USAGE, "needs \"text\", a string (or the line a JSON string)");
	if (!json_string_length(t))
		return llm_fail(LLM_ERR_USAGE, "text is empty");
	size_t n;
	it->doc = 1;
	LLM_TRY(llm_tokenizer_encode(tk, json_string_value(t), json_string_length(t), false, &it->ctx, &n));
	it->n_ctx = (int)n;
	return LLM_OK;
}

static enum llm_status item_read(struct llm_eval_item *it, json_t *o, const struct llm_eval_opts *opt,
                                 const struct llm_tokenizer *tk)
{
	it->label = -1;
	if (opt->documents)
		return doc_read(it, o, tk);
	if (!json_is_object(o))
		return llm_fail(LLM_ERR_USAGE, "not a JSON object");
	json_t *ends = json_object_get(o, "endings");
	if (!ends)
		ends = json_object_get(o, "continuations");
	if (!json_is_array(ends) || !json_array_size(ends))
		return llm_fail(LLM_ERR_USAGE, "needs \"endings\" (or \"continuations\"), a non-empty array of strings");
	size_t nc = json_array_size(ends);
	it->n = (int)nc;
	if (opt->labels)
		LLM_TRY(item_label(o, it->n, &it->label));
	it->end = calloc(nc, sizeof *it->end);
	it->n_end = calloc(nc, sizeof *it->n_end);
	it->chars = calloc(nc, sizeof *it->chars);
	it->res = calloc(nc, sizeof *it->res);
	if (!it->end || !it->n_end || !it->chars || !it->res)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	char *ctx;
	LLM_TRY(item_context(o, opt->hellaswag, &ctx));
	size_t n_ctx, lc = strlen(ctx);
	enum llm_status s = llm_tokenizer_encode(tk, ctx, lc, true, &it->ctx, &n_ctx);
	it->n_ctx = (int)n_ctx;
	it->tokens = (int64_t)n_ctx - 1;
	for (size_t i = 0; !s && i < nc; i++) {
		json_t *c = json_array_get(ends, i);
		if (!json_is_string(c) || !json_string_length(c)) {
			s = llm_fail(LLM_ERR_USAGE, "endings[%zu] is %s", i, json_is_string(c) ? "empty" : "not a string");
			break;
		}
		/* --hellaswag: the cleaned ending after one space, normalised by
		 * the cleaned ending's characters (lm-eval's choice) */
		char *e = opt->hellaswag ? llm_strdup(json_string_value(c)) : NULL, *whole;
		if (e)
			hs_clean(e);
		const char *end = e ? e : json_string_value(c);
		whole = cat(ctx, e ? " " : "", end, "");
		int32_t *wids = NULL;
		size_t nw = 0;
		it->chars[i] = (int)llm_utf8_chars(end, strlen(end));
		s = !whole ? llm_fail(LLM_ERR_NOMEM, "out of memory")
		           : llm_tokenizer_encode(tk, whole, strlen(whole), true, &wids, &nw);
		if (!s && (nw <= n_ctx || !it->chars[i]))
			s = llm_fail(LLM_ERR_USAGE, "endings[%zu] %s", i, it->chars[i] ? "adds no token" : "is empty");
		if (!s && !(it->end[i] = malloc((nw - n_ctx) * sizeof **it->end)))
			s = llm_fail(LLM_ERR_NOMEM, "out of memory");
		if (!s) {
			it->n_end[i] = (int)(nw - n_ctx);
			memcpy(it->end[i], wids + n_ctx, (nw - n_ctx) * sizeof **it->end);
			it->tokens += it->n_end[i];
		}
		free(wids), free(whole), free(e);
	}
	free(ctx);
	return s;
}

/* ---- the reading threads ---------------------------------------------------- */

struct tok_arg {
	struct llm_eval *ev;
	size_t t, n_thr;
};

static void *tok_main(void *arg)
{
	struct tok_arg *a = arg;
	struct llm_eval *ev = a->ev;
	for (size_t i = a->t; i < ev->n_lines; i += a->n_thr) {
		struct eval_line *l = &ev->lines[i];
		if (!l->text)
			continue;
		json_error_t je;
		json_t *o = json_loads(l->text, ev->o.documents ? JSON_DECODE_ANY : 0, &je);
		l->it.line = (int)i + 1;
		l->st = o ? item_read(&l->it, o, &ev->o, ev->tk) : llm_fail(LLM_ERR_USAGE, "not JSON: %s", je.text);
		json_decref(o);
		if (l->st) {
			l->err = llm_strdup(llm_errmsg());
			item_free(&l->it);
			l->it.line = (int)i + 1;
		}
	}
	return NULL;
}

static void *reader_main(void *arg)
{
	struct llm_eval *ev = arg;
	size_t cap = 0;
	ev->read_st = llm_read_file(ev->file, &ev->buf, &ev->len);
	for (char *at = ev->buf, *p; !ev->read_st && (p = llm_next_line(&at, ev->buf + ev->len)); ) {
		if ((ev->read_st = LLM_ARRAY_RESERVE(ev->lines, cap, ev->n_lines + 1)))
			break;
		memset(&ev->lines[ev->n_lines], 0, sizeof *ev->lines);
		ev->lines[ev->n_lines++].text = *p ? p : NULL;
	}
	if (ev->read_st) {
		ev->read_err = llm_strdup(llm_errmsg());
		return NULL;
	}
	ev->t_read = llm_now();
	size_t n_thr = (size_t)ev->o.threads;
	struct tok_arg args[8];
	pthread_t th[8];
	int started[8] = { 0 };
	for (size_t t = 0; t < n_thr; t++)
		args[t] = (struct tok_arg){ ev, t, n_thr };
	for (size_t t = 1; t < n_thr; t++)   /* a thread that does not start: this one does its lines */
		started[t] = !pthread_create(&th[t], NULL, tok_main, &args[t]);
	tok_main(&args[0]);
	for (size_t t = 1; t < n_thr; t++) {
		if (started[t])
			pthread_join(th[t], NULL);
		else
			tok_main(&args[t]);
	}
	ev->t_tok = llm_now();
	return NULL;
}

enum llm_status llm_eval_start(struct llm_eval **out, const char *file, const struct llm_tokenizer *tk,
                               const struct llm_eval_opts *o)
{
	struct llm_eval *ev = calloc(1, sizeof *ev);
	if (!ev || !(ev->file = llm_strdup(file))) {
		free(ev);
		return llm_fail(LLM_ERR_NOMEM, "eval: out of memory");
	}
	ev->t_proc = process_start();
	ev->t_start = llm_now();
	ev->o = *o;
	ev->tk = tk;
	if (ev->o.threads <= 0) {
		long c = sysconf(_SC_NPROCESSORS_ONLN);
		ev->o.threads = c < 1 ? 1 : (int)c;
	}
	ev->o.threads = ev->o.threads > 8 ? 8 : ev->o.threads;
	json_object_seed(0);         /* before the threads: jansson seeds its hash once */
	ev->started = !pthread_create(&ev->reader, NULL, reader_main, ev);
	*out = ev;
	return ev->started ? LLM_OK : llm_fail(LLM_ERR_NOMEM, "eval: cannot start the reading thread");
}

/* Join the readers and keep the good items (bad: the first fails, unless skip_bad). */
static enum llm_status collect(struct llm_eval *ev)
{
	if (ev->started && !ev->joined)
		pthread_join(ev->reader, NULL);
	ev->joined = 1;
	if (ev->read_st)
		return llm_fail(ev->read_st, "%s", ev->read_err ? ev->read_err : "eval: reading failed");
	size_t good = 0;
	for (size_t i = 0; i < ev->n_lines; i++) {
		struct eval_line *l = &ev->lines[i];
		if (l->text && l->st && !ev->o.skip_bad)
			return llm_fail(l->st, "%s: line %zu: %s", strcmp(ev->file, "-") ? ev->file : "stdin", i + 1, l->err);
		good += l->text && !l->st;
		ev->skipped += l->text && l->st;
	}
	ev->items = calloc(good ? good : 1, sizeof *ev->items);
	if (!ev->items)
		return llm_fail(LLM_ERR_NOMEM, "eval: out of memory");
	for (size_t i = 0; i < ev->n_lines; i++)
		if (ev->lines[i].text && !ev->lines[i].st) {
			ev->items[ev->n++] = ev->lines[i].it;
			memset(&ev->lines[i].it, 0, sizeof ev->lines[i].it);
		}
	return LLM_OK;
}

size_t llm_eval_count(const struct llm_eval *ev)
{
	return ev ? ev->n : 0;
}

void llm_eval_window(struct llm_eval *ev, int window)
{
	ev->window = window;
}

/* Documents: each one's tokens (held in ctx since reading) cut into windows,
 * its endings, as llm_perplexity cuts a text: with BOS, the context is BOS
 * and a window holds window - 1 tokens; without, window tokens, each
 * window its own context. */
static enum llm_status cut_windows(struct llm_eval *ev)
{
	int32_t bos = llm_tokenizer_bos(ev->tk);
	int lead = bos >= 0, chunk = ev->window - lead;
	if (chunk < 1)
		return llm_fail(LLM_ERR_USAGE, "--ctx-size %d leaves no room for a token", ev->window);
	for (size_t i = 0; i < ev->n; i++) {
		struct llm_eval_item *it = &ev->items[i];
		int32_t *ids = it->ctx;
		int n = it->n_ctx, nw = (n + chunk - 1) / chunk;
		size_t na = nw ? (size_t)nw : 1;
		it->ctx = lead ? malloc(sizeof *it->ctx) : NULL;
		it->n_ctx = lead;
		it->n = nw;
		it->end = calloc(na, sizeof *it->end), it->n_end = calloc(na, sizeof *it->n_end);
		it->chars = calloc(na, sizeof *it->chars), it->res = calloc(na, sizeof *it->res);
		int ok = it->end && it->n_end && it->chars && it->res && (!lead || it->ctx);
		if (ok && lead)
			it->ctx[0] = bos;
		for (int k = 0; ok && k < nw; k++) {
			int m = n - k * chunk < chunk ? n - k * chunk : chunk;
			if (!(it->end[k] = malloc((size_t)m * sizeof **it->end)))
				ok = 0;
			else
				memcpy(it->end[k], ids + (size_t)k * (size_t)chunk, (size_t)m * sizeof *ids);
			it->n_end[k] = m;
			it->chars[k] = 1;
			it->tokens += m + lead;
		}
		free(ids);
		if (!ok)
			return llm_fail(LLM_ERR_NOMEM, "eval: out of memory");
	}
	return LLM_OK;
}

/* ---- the batches -------------------------------------------------------------- */

enum llm_status llm_eval_plan(const int64_t *tokens, const int *seqs, const size_t *order, size_t n,
                              int64_t theta, int step, int max_seqs, size_t *end, size_t *n_batch)
{
	/* best[j]: the least cost of cutting order[0 .. j); from[j] the start of its last batch */
	double *best = malloc((n + 1) * sizeof *best);
	size_t *from = malloc((n + 1) * sizeof *from);
	if (!best || !from) {
		free(best), free(from);
		return llm_fail(LLM_ERR_NOMEM, "eval: out of memory");
	}
	step = step < 1 ? 1 : step;
	best[0] = 0;
	for (size_t j = 1; j <= n; j++) {
		best[j] = HUGE_VAL;
		from[j] = j - 1;
		int64_t t = 0;
		long sq = 0;
		for (size_t i = j; i-- > 0; ) {
			t += tokens[order[i]];
			sq += seqs[order[i]];
			if (sq > max_seqs && i + 1 < j)
				break;                  /* more sequences than run at once */
			/* below theta only when it holds all the rest or cannot grow */
			int full = t >= theta || j == n || sq + seqs[order[j]] > max_seqs;
			double c = best[i] + (double)((t + step - 1) / step) + 1;
			if (full && c < best[j])
				best[j] = c, from[j] = i;
		}
	}
	size_t nb = 0;
	for (size_t j = n; j > 0; j = from[j])
		end[nb++] = j;
	for (size_t a = 0, b = nb ? nb - 1 : 0; a < b; a++, b--) {
		size_t x = end[a];
		end[a] = end[b], end[b] = x;
	}
	*n_batch = nb;
	free(best), free(from);
	return LLM_OK;
}

static const int64_t *sort_key;
static int by_tokens(const void *a, const void *b)
{
	size_t x = *(const size_t *)a, y = *(const size_t *)b;
	int64_t tx = sort_key[x], ty = sort_key[y];
	return tx != ty ? (tx < ty ? -1 : 1) : (x > y) - (x < y);
}

/* ---- the run ------------------------------------------------------------------ */

/* The tokens ending K of IT scores: a window that is its own context
 * does not score its first. */
static int to_score(const struct llm_eval_item *it, int k)
{
	return it->n_end[k] - (it->doc && !it->n_ctx);
}

static int item_scored(const struct llm_eval_item *it)
{
	for (int k = 0; k < it->n; k++)
		if (it->res[k].n_scored < to_score(it, k))
			return 0;
	return 1;
}

static int64_t computed(const struct llm_sched *s)
{
	struct llm_sched_stats st;
	llm_sched_stats(s, &st);
	return st.prompt_tokens;
}

/* Queue the N items ORDER[..] names: every context first, then every
 * ending (the scheduler admits in order, and an ending waits for its
 * context: item by item, one context would start per step). */
static enum llm_status queue_batch(struct llm_eval *ev, struct llm_sched *s, const size_t *order, size_t n, int *parents)
{
	enum llm_status st = LLM_OK;
	for (size_t i = 0; !st && i < n; i++) {
		struct llm_eval_item *it = &ev->items[order[i]];
		parents[order[i]] = -1;
		if (it->n_ctx)
			st = llm_sched_score_context(s, it->ctx, it->n_ctx, &parents[order[i]]);
		ev->n_prefills += parents[order[i]] >= 0;
	}
	for (size_t i = 0; !st && i < n; i++) {
		struct llm_eval_item *it = &ev->items[order[i]];
		if (it->n_ctx)
			st = llm_sched_score_conts(s, parents[order[i]], it->ctx, it->n_ctx, (const int32_t *const *)it->end,
			                           it->n_end, it->n, it->res);
		for (int k = 0; !it->n_ctx && !st && k < it->n; k++) {   /* windows that are their own context */
			int m = it->n_end[k] - 1;
			const int32_t *cont = it->end[k] + 1;
			if (m > 0)
				st = llm_sched_score_conts(s, -1, it->end[k], 1, &cont, &m, 1, &it->res[k]);
		}
	}
	return st ? llm_fail_prefix(st, "eval") : LLM_OK;
}

enum llm_status llm_eval_run(struct llm_eval *ev, struct llm_sched *s, const volatile sig_atomic_t *stop,
                             void (*put)(void *user, const char *json), void *user, size_t *n_done)
{
	*n_done = 0;
	ev->t_run = llm_now();
	LLM_TRY(collect(ev));
	if (ev->o.documents)
		LLM_TRY(cut_windows(ev));
	ev->t_joined = llm_now();
	size_t n = ev->n, *order = malloc((n ? n : 1) * sizeof *order), *end = malloc((n ? n : 1) * sizeof *end);
	int64_t *tokens = malloc((n ? n : 1) * sizeof *tokens);
	int *seqs = malloc((n ? n : 1) * sizeof *seqs), *parents = malloc((n ? n : 1) * sizeof *parents);
	enum llm_status st = !order || !end || !tokens || !seqs || !parents ? llm_fail(LLM_ERR_NOMEM, "eval: out of memory") : LLM_OK;
	for (size_t i = 0; !st && i < n; i++) {
		order[i] = i;
		tokens[i] = ev->items[i].tokens;
		seqs[i] = ev->items[i].n + (ev->items[i].n_ctx > 1);
		ev->tokens += tokens[i];
	}
	if (!st && ev->o.sort && n) {
		sort_key = tokens;
		qsort(order, n, sizeof *order, by_tokens);
		st = llm_eval_plan(tokens, seqs, order, n, ev->o.theta, ev->o.step_tokens, ev->o.max_seqs, end, &ev->n_batch);
	} else {
		/* input order: batches of as many items as --parallel sequences
		 * hold, so the contexts held for their endings stay bounded */
		long sq = 0;
		for (size_t i = 0; !st && i < n; i++) {
			if (i && sq + seqs[i] > ev->o.max_seqs)
				end[ev->n_batch++] = i, sq = 0;
			sq += seqs[i];
		}
		if (n)
			end[ev->n_batch++] = n;
	}
	ev->t_planned = llm_now();
	ev->computed0 = computed(s);
	int64_t queued = 0;
	size_t b = 0, next = 0;
	int pending = 1;
	while (!st && *n_done < n) {
		if (stop && *stop)
			break;
		/* the next batch goes in when the queued ones have less than a step left */
		while (!st && b < ev->n_batch && queued - (computed(s) - ev->computed0) < ev->o.step_tokens) {
			st = queue_batch(ev, s, order + next, end[b] - next, parents);
			for (; next < end[b]; next++)
				queued += ev->items[order[next]].tokens;
			b++;
			pending = 1;
		}
		if (!st && pending)
			st = llm_sched_step(s, &pending);
		for (; !st && *n_done < n && item_scored(&ev->items[*n_done]); ++*n_done) {
			char *js = llm_eval_item_json(&ev->items[*n_done]);
			if (!js)
				st = llm_fail(LLM_ERR_NOMEM, "eval: out of memory");
			else
				put(user, js);
			free(js);
		}
		if (!st && !pending && b == ev->n_batch && *n_done < n)   /* every request scores all its tokens */
			st = llm_fail(LLM_ERR_INTERNAL, "eval: line %d: the scheduler finished it unscored",
			              ev->items[*n_done].line);
	}
	ev->computed = computed(s) - ev->computed0;
	ev->t_end = llm_now();
	free(order), free(end), free(tokens), free(seqs), free(parents);
	return st;
}

/* ---- output ------------------------------------------------------------------- */

static int argmax(const double *v, int n)
{
	int k = 0;
	for (int i = 1; i < n; i++)
		if (v[i] > v[k])
			k = i;
	return k;
}

/* The raw and normalised scores of IT into RAW and NORM (n each). */
static void item_scores(const struct llm_eval_item *it, double *raw, double *norm)
{
	for (int i = 0; i < it->n; i++) {
		raw[i] = it->res[i].logprob;
		norm[i] = raw[i] / (double)it->chars[i];   /* chars >= 1: empty endings are refused */
	}
}

/* A document's scored tokens and negative log-likelihood, summed in
 * window order as llm_perplexity sums them. */
static int64_t doc_nll(const struct llm_eval_item *it, double *nll)
{
	int64_t t = 0;
	*nll = 0;
	for (int k = 0; k < it->n; k++) {
		*nll -= it->res[k].logprob;
		t += to_score(it, k) > 0 ? to_score(it, k) : 0;
	}
	return t;
}

static char *doc_json(const struct llm_eval_item *it)
{
	double nll;
	int64_t t = doc_nll(it, &nll);
	json_t *r = json_object();
	json_object_set_new(r, "index", json_integer(it->line - 1));
	json_object_set_new(r, "tokens", json_integer(t));
	json_object_set_new(r, "windows", json_integer(it->n));
	json_object_set_new(r, "nll", json_real(nll));
	json_object_set_new(r, "ppl", t ? json_real(exp(nll / (double)t)) : json_null());
	char *js = json_dumps(r, JSON_COMPACT | JSON_REAL_PRECISION(17));
	json_decref(r);
	return js;
}

char *llm_eval_item_json(const struct llm_eval_item *it)
{
	if (it->doc)
		return doc_json(it);
	double *raw = malloc(2 * (size_t)it->n * sizeof *raw);
	if (!raw)
		return NULL;
	double *norm = raw + it->n;
	item_scores(it, raw, norm);
	json_t *r = json_object(), *a = json_array(), *an = json_array(), *g = json_array(), *nt = json_array();
	for (int i = 0; i < it->n; i++) {
		json_array_append_new(a, json_real(raw[i]));
		json_array_append_new(an, json_real(norm[i]));
		json_array_append_new(g, json_boolean(it->res[i].is_greedy));
		json_array_append_new(nt, json_integer(it->n_end[i]));
	}
	int p = argmax(raw, it->n), pn = argmax(norm, it->n);
	json_object_set_new(r, "index", json_integer(it->line - 1));
	json_object_set_new(r, "logprobs", a);
	json_object_set_new(r, "normalized", an);
	json_object_set_new(r, "greedy", g);
	json_object_set_new(r, "tokens", nt);
	json_object_set_new(r, "context_tokens", json_integer(it->n_ctx));
	json_object_set_new(r, "pred", json_integer(p));
	json_object_set_new(r, "pred_norm", json_integer(pn));
	if (it->label >= 0) {
		json_object_set_new(r, "label", json_integer(it->label));
		json_object_set_new(r, "correct", json_boolean(p == it->label));
		json_object_set_new(r, "correct_norm", json_boolean(pn == it->label));
	}
	char *js = json_dumps(r, JSON_COMPACT | JSON_REAL_PRECISION(17));
	json_decref(r);
	free(raw);
	return js;
}

/* The mean of the K hits of N 0/1 samples and its standard error: the
 * sample standard deviation over sqrt(N) (lm-eval's mean_stderr). */
static void mean_se(size_t k, size_t n, double *mean, double *se)
{
	*mean = n ? (double)k / (double)n : NAN;
	double var = n > 1 ? ((double)k * (1 - *mean) * (1 - *mean) + (double)(n - k) * *mean * *mean) / (double)(n - 1) : NAN;
	*se = n > 1 ? sqrt(var / (double)n) : NAN;
}

/* The summary of documents: tokens, nll and perplexity over all of them
 * (token-weighted), documents and tokens per second, the time split. */
static void doc_summary(struct llm_eval *ev, int json, char *bline, double bubble, int pp, char *out, size_t n)
{
	int64_t tok = 0;
	double nll = 0;
	for (size_t i = 0; i < ev->n; i++) {
		double d;
		if (item_scored(&ev->items[i]))
			tok += doc_nll(&ev->items[i], &d), nll += d;
	}
	double ppl = tok ? exp(nll / (double)tok) : NAN;
	double total = ev->t_end - ev->t_proc, init = ev->t_planned - ev->t_proc, compute = ev->t_end - ev->t_planned;
	double load = ev->t_run - ev->t_start, tk = ev->t_tok - ev->t_start, wait = ev->t_joined - ev->t_run;
	double dps = total > 0 ? (double)ev->n / total : 0, tps = total > 0 ? (double)tok / total : 0;
	if (json)
		snprintf(out, n, "{\"summary\":true,\"documents\":%zu,\"skipped\":%zu,\"window\":%d,\"tokens\":%lld,"
		         "\"nll\":%.6f,\"ppl\":%.6f,\"documents_per_s\":%.3f,\"tokens_per_s\":%.1f,\"batches\":%zu,"
		         "\"computed_tokens\":%lld,\"init_s\":%.3f,\"load_s\":%.3f,\"tokenize_s\":%.3f,\"wait_s\":%.3f,"
		         "\"compute_s\":%.3f,\"total_s\":%.3f,\"pp_stages\":%d,\"pipeline_bubble\":%.4f}",
		         ev->n, ev->skipped, ev->window, (long long)tok, nll, tok ? ppl : 0, dps, tps, ev->n_batch,
		         (long long)ev->computed, init, load, tk, wait, compute, total, pp, bubble);
	else
		snprintf(out, n, "%zu documents (%zu skipped): %lld tokens in windows of %d: nll %.6f, perplexity %.4f; "
		         "%.2f documents/s, %.0f tokens/s; %zu batches; init %.2f s (load %.2f s, tokenise %.2f s, "
		         "then waited %.2f s), compute %.2f s, total %.2f s%s",
		         ev->n, ev->skipped, (long long)tok, ev->window, nll, ppl, dps, tps, ev->n_batch, init, load, tk,
		         wait, compute, total, bline);
}

void llm_eval_summary(struct llm_eval *ev, struct llm_engine *e, int json, char *out, size_t n)
{
	const struct llm_model_dist *d = e ? llm_engine_model(e)->dist : NULL;
	int pp = d ? d->grid.n_pp : 1;
	double bubble = pp > 1 && d->stats.steps ? (double)(pp - 1) * (double)d->stats.steps /
	                ((double)d->stats.micro + (double)(pp - 1) * (double)d->stats.steps) : 0;
	size_t lab = 0, hit = 0, hit_n = 0;
	for (size_t i = 0; i < ev->n; i++) {
		const struct llm_eval_item *it = &ev->items[i];
		if (it->label < 0 || !item_scored(it))
			continue;
		double *r = malloc(2 * (size_t)it->n * sizeof *r);
		if (!r)
			continue;
		double *nm = r + it->n;
		item_scores(it, r, nm);
		lab++;
		hit += argmax(r, it->n) == it->label;
		hit_n += argmax(nm, it->n) == it->label;
		free(r);
	}
	double acc, acc_se, accn, accn_se;
	mean_se(hit, lab, &acc, &acc_se);
	mean_se(hit_n, lab, &accn, &accn_se);
	double total = ev->t_end - ev->t_proc, init = ev->t_planned - ev->t_proc, compute = ev->t_end - ev->t_planned;
	double load = ev->t_run - ev->t_start, tok = ev->t_tok - ev->t_start, wait = ev->t_joined - ev->t_run;
	double sched = ev->t_planned - ev->t_joined, overlap = load < tok ? load : tok;
	double ips = total > 0 ? (double)ev->n / total : 0;
	char bline[80] = "";
	if (pp > 1)
		snprintf(bline, sizeof bline, "; %d pipeline stages, bubble %.1f%%", pp, 100 * bubble);
	if (ev->o.documents) {
		doc_summary(ev, json, bline, bubble, pp, out, n);
		return;
	}
	if (json)
		snprintf(out, n, "{\"summary\":true,\"items\":%zu,\"skipped\":%zu,\"labelled\":%zu,\"acc\":%.6f,"
		         "\"acc_stderr\":%.6f,\"acc_norm\":%.6f,\"acc_norm_stderr\":%.6f,\"items_per_s\":%.3f,"
		         "\"batches\":%zu,\"context_prefills\":%zu,\"tokens\":%lld,\"computed_tokens\":%lld,"
		         "\"init_s\":%.3f,\"load_s\":%.3f,\"tokenize_s\":%.3f,\"overlap_s\":%.3f,\"wait_s\":%.3f,"
		         "\"schedule_s\":%.3f,\"compute_s\":%.3f,\"total_s\":%.3f,\"pp_stages\":%d,\"pipeline_bubble\":%.4f}",
		         ev->n, ev->skipped, lab, isnan(acc) ? 0 : acc, isnan(acc_se) ? 0 : acc_se, isnan(accn) ? 0 : accn,
		         isnan(accn_se) ? 0 : accn_se, ips, ev->n_batch, ev->n_prefills, (long long)ev->tokens,
		         (long long)ev->computed, init, load, tok, overlap, wait, sched, compute, total, pp, bubble);
	else
		snprintf(out, n, "%zu items (%zu skipped, %zu labelled): acc %.4f +- %.4f, acc_norm %.4f +- %.4f; "
		         "%.2f items/s; %zu batches, %lld tokens computed; init %.2f s (load %.2f s, tokenise %.2f s "
		         "overlapped with it for %.2f s, then waited %.2f s, schedule %.3f s), compute %.2f s, total %.2f s%s",
		         ev->n, ev->skipped, lab, acc, acc_se, accn, accn_se, ips, ev->n_batch, (long long)ev->computed,
		         init, load, tok, overlap, wait, sched, compute, total, bline);
}

void llm_eval_free(struct llm_eval *ev)
{
	if (!ev)
		return;
	if (ev->started && !ev->joined)
		pthread_join(ev->reader, NULL);
	for (size_t i = 0; i < ev->n_lines; i++)
		item_free(&ev->lines[i].it), free(ev->lines[i].err);
	for (size_t i = 0; i < ev->n; i++)
		item_free(&ev->items[i]);
	free(ev->items), free(ev->lines), free(ev->buf), free(ev->read_err), free(ev->file);
	free(ev);
}
