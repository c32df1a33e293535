/* common/train/dataset.c: instruction-tuning data in JSONL (see train.h): the
 * instruction format (Alpaca's fields: instruction, input, output) and the
 * chat format (messages, rendered with the model's chat template as
 * transformers' apply_chat_template does), tokenized with a loss mask on
 * the completion tokens; shuffling and sequence packing. */
#define _GNU_SOURCE
#include "train.h"
#include "tokenizer.h"
#include "jinja.h"
#include "fileio.h"
#include "buf.h"
#include "hash.h"

#include <ctype.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

/* A growing token list with its loss flags. */
struct toks { int32_t *ids; uint8_t *loss; int n; size_t cap_ids, cap_loss; };

static enum llm_status toks_add(struct toks *t, const int32_t *ids, size_t n, int loss)
{
	size_t need = (size_t)t->n + n;
	if (need > (size_t)1 << 29)              /* n stays an int */
		return llm_fail(LLM_ERR_RANGE, "sample too long");
	LLM_TRY(LLM_ARRAY_RESERVE(t->ids, t->cap_ids, need));
	LLM_TRY(LLM_ARRAY_RESERVE(t->loss, t->cap_loss, need));
	for (size_t i = 0; i < n; i++) {
		t->ids[t->n] = ids[i];
		t->loss[t->n++] = (uint8_t)loss;
	}
	return LLM_OK;
}

static enum llm_status toks_text(struct toks *t, const struct llm_tokenizer *tk, const char *s, size_t len,
                                 int loss)
{
	if (!len)
		return LLM_OK;
	int32_t *ids;
	size_t n;
	LLM_TRY(llm_tokenizer_encode(tk, s, len, false, &ids, &n));
	enum llm_status st = toks_add(t, ids, n, loss);
	free(ids);
	return st;
}

/* Errors that a bad line causes (skippable), as opposed to I/O or memory. */
static int line_error(enum llm_status s)
{
	return s == LLM_ERR_FORMAT || s == LLM_ERR_USAGE || s == LLM_ERR_RANGE || s == LLM_ERR_UNSUPPORTED;
}

static enum llm_status get_str(json_t *o, const char *key, int required, const char **out)
{
	json_t *v = json_object_get(o, key);
	*out = NULL;
	if (!v || json_is_null(v)) {
		if (required)
			return llm_fail(LLM_ERR_FORMAT, "no \"%s\"", key);
		return LLM_OK;
	}
	if (!json_is_string(v))
		return llm_fail(LLM_ERR_FORMAT, "\"%s\" is not a string", key);
	*out = json_string_value(v);
	return LLM_OK;
}

static enum llm_status instruction_sample(json_t *o, const struct llm_tokenizer *tk, struct toks *t)
{
	const char *ins, *inp, *out;
	LLM_TRY(get_str(o, "instruction", 1, &ins));
	LLM_TRY(get_str(o, "input", 0, &inp));
	LLM_TRY(get_str(o, "output", 1, &out));
	if (!*out)
		return llm_fail(LLM_ERR_FORMAT, "empty completion (\"output\" is \"\")");
	size_t li = strlen(ins), ln = inp ? strlen(inp) : 0;
	char *prompt = malloc(li + ln + 3);
	if (!prompt)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	size_t k = 0;
	memcpy(prompt + k, ins, li);
	k += li;
	if (ln) {
		prompt[k++] = '\n';
		memcpy(prompt + k, inp, ln);
		k += ln;
	}
	prompt[k++] = '\n';
	enum llm_status s = LLM_OK;
	int32_t bos = llm_tokenizer_bos(tk), eos = llm_tokenizer_eos(tk);
	if (llm_tokenizer_adds_bos(tk) && bos >= 0)
		s = toks_add(t, &bos, 1, 0);
	if (!s)
		s = toks_text(t, tk, prompt, k, 0);
	if (!s)
		s = toks_text(t, tk, out, strlen(out), 1);
	if (!s && eos >= 0)
		s = toks_add(t, &eos, 1, 1);
	free(prompt);
	return s;
}

/* Render MSGS[0..n) with the chat template; *out malloc'ed. */
static enum llm_status render(const struct llm_tokenizer *tk, const char *tmpl, json_t *msgs, size_t n,
                              int gen_prompt, char **out, size_t *len)
{
	json_t *req = json_object(), *part = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append(part, json_array_get(msgs, i));
	json_object_set_new(req, "messages", part);
	json_object_set_new(req, "add_generation_prompt", json_boolean(gen_prompt));
	char *js = json_dumps(req, JSON_COMPACT);
	json_decref(req);
	if (!js)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	enum llm_status s = llm_chat_render(tk, tmpl, js, out, len);
	free(js);
	return s;
}

/* Each assistant message: the text the template adds after the generation
 * prompt is the completion; the text before it is prompt. */
static enum llm_status chat_sample(json_t *o, const struct llm_tokenizer *tk, const char *tmpl,
                                   struct toks *t)
{
	json_t *msgs = json_object_get(o, "messages");
	if (!json_is_array(msgs) || !json_array_size(msgs))
		return llm_fail(LLM_ERR_FORMAT, "\"messages\" is not a non-empty array");
	if (!tmpl && !llm_tokenizer_chat_template(tk))
		return llm_fail(LLM_ERR_USAGE, "chat format, but the model has no chat template (--chat-template FILE)");
	size_t done = 0;       /* bytes of the conversation text already tokenized */
	int n_asst = 0;
	enum llm_status s = LLM_OK;
	char *prev = NULL;
	for (size_t i = 0; i < json_array_size(msgs) && !s; i++) {
		json_t *m = json_array_get(msgs, i);
		const char *role, *content;
		if (!json_is_object(m))
			return llm_fail(LLM_ERR_FORMAT, "message %zu is not an object", i);
		LLM_TRY(get_str(m, "role", 1, &role));
		if (!json_is_string(json_object_get(m, "content")))
			return llm_fail(LLM_ERR_FORMAT, "message %zu: \"content\" is not a string", i);
		content = json_string_value(json_object_get(m, "content"));
		if (strcmp(role, "assistant"))
			continue;
		if (!*content)
			return llm_fail(LLM_ERR_FORMAT, "empty completion (message %zu has no content)", i);
		char *p = NULL, *f = NULL;
		size_t lp, lf;
		if ((s = render(tk, tmpl, msgs, i, 1, &p, &lp)) || (s = render(tk, tmpl, msgs, i + 1, 0, &f, &lf))) {
			free(p);
			break;
		}
		if (lp < done || lf < lp || memcmp(f, p, lp) || (prev && memcmp(p, prev, done))) {
			s = llm_fail(LLM_ERR_FORMAT, "chat template: the conversation up to message %zu does not "
			             "extend the rendering before it; cannot tell prompt from completion", i);
		} else {
			s = toks_text(t, tk, p + done, lp - done, 0);
			if (!s)
				s = toks_text(t, tk, f + lp, lf - lp, 1);
			done = lf;
			n_asst++;
		}
		free(p);
		free(prev);
		prev = f;
	}
	free(prev);
	if (!s && !n_asst)
		s = llm_fail(LLM_ERR_FORMAT, "no assistant message: nothing to learn");
	return s;
}

static void sample_free(struct llm_sample *s)
{
	free(s->ids);
	free(s->loss);
}

void llm_dataset_free(struct llm_dataset *d)
{
	for (int i = 0; i < d->n; i++)
		sample_free(&d->s[i]);
	free(d->s);
	memset(d, 0, sizeof *d);
}

enum llm_status llm_dataset_load(struct llm_dataset *d, const char *path,
                                 const struct llm_tokenizer *tk, const struct llm_data_opts *o,
                                 void (*warn)(const char *msg))
{
	memset(d, 0, sizeof *d);
	char *buf, *tmpl = NULL;
	size_t len;
	LLM_TRY(llm_read_file(path, &buf, &len));
	enum llm_status s = LLM_OK;
	if (o->chat_template) {
		size_t tl;
		if ((s = llm_read_file(o->chat_template, &tmpl, &tl))) {
			free(buf);
			return s;
		}
	}
	size_t cap = 0;
	int line = 0;
	for (char *p = buf, *e; p < buf + len && !s; p = e + 1) {
		e = memchr(p, '\n', (size_t)(buf + len - p));
		if (!e)
			e = buf + len;
		line++;
		char *q = p;
		while (q < e && isspace((unsigned char)*q))
			q++;
		if (q == e)
			continue;
		json_error_t err;
		json_t *root = json_loadb(p, (size_t)(e - p), 0, &err);
		struct toks t = { 0 };
		if (!root)
			s = llm_fail(LLM_ERR_FORMAT, "not JSON: %s (column %d)", err.text, err.column);
		else if (!json_is_object(root))
			s = llm_fail(LLM_ERR_FORMAT, "not a JSON object");
		else if (json_object_get(root, "messages"))
			s = chat_sample(root, tk, tmpl, &t);
		else if (json_object_get(root, "instruction") || json_object_get(root, "output"))
			s = instruction_sample(root, tk, &t);
		else
			s = llm_fail(LLM_ERR_FORMAT, "neither {\"instruction\", \"output\"} nor {\"messages\"}");
		json_decref(root);
		if (!s && t.n > o->seq_len + 1)
			s = llm_fail(LLM_ERR_RANGE, "sample of %d tokens is longer than --seq-len %d (+1)", t.n, o->seq_len);
		if (!s && o->train_on_prompt)
			for (int i = 1; i < t.n; i++)
				t.loss[i] = 1;
		if (!s && t.n) {
			t.loss[0] = 0;      /* the first token is never predicted */
			s = LLM_ARRAY_RESERVE(d->s, cap, (size_t)d->n + 1);
			if (!s) {
				struct llm_sample smp = { t.ids, t.loss, t.n, line };
				d->s[d->n++] = smp;
				d->n_tok += t.n;
				for (int i = 0; i < t.n; i++)
					d->n_loss_tok += t.loss[i];
				t.ids = NULL;
				t.loss = NULL;
			}
		}
		free(t.ids);
		free(t.loss);
		if (s && line_error(s)) {
			s = llm_fail_prefix(s, "%s:%d", path, line);
			if (o->skip_bad) {
				if (warn)
					warn(llm_errmsg());
				d->n_skipped++;
				s = LLM_OK;
			}
		}
	}
	free(buf);
	free(tmpl);
	if (!s && !d->n)
		s = llm_fail(LLM_ERR_FORMAT, "%s: no training samples%s", path, d->n_skipped ? " (all skipped)" : "");
	if (s)
		llm_dataset_free(d);
	return s;
}

/* ---- packing ----------------------------------------------------------------- */

void llm_packed_free(struct llm_packed *p)
{
	free(p->tok);
	memset(p, 0, sizeof *p);
}

enum llm_status llm_dataset_pack(const struct llm_dataset *d, int seq_len, int pack, uint64_t seed,
                                 int64_t epoch, struct llm_packed *p)
{
	memset(p, 0, sizeof *p);
	int *order = malloc((size_t)d->n * sizeof *order);
	if (!order)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	for (int i = 0; i < d->n; i++)
		order[i] = i;
	uint64_t st = llm_hash_u64(seed ^ llm_hash_u64((uint64_t)epoch));
	for (int i = d->n - 1; i > 0; i--) {       /* Fisher-Yates */
		st = llm_hash_u64(st);
		int j = (int)(st % (uint64_t)(i + 1));
		int x = order[i];
		order[i] = order[j];
		order[j] = x;
	}
	/* rows: in order, a new row when the next sample does not fit */
	int rows = 0, used = seq_len;
	for (int i = 0; i < d->n; i++) {
		int need = d->s[order[i]].n - 1;
		if (need < 1)
			continue;
		if (!pack || used + need > seq_len) {
			rows++;
			used = 0;
		}
		used += need;
	}
	size_t cells = (size_t)rows * (size_t)seq_len;
	p->tok = malloc((4 * cells + (size_t)rows + 1) * sizeof(int32_t));
	if (!p->tok) {
		free(order);
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	}
	p->tgt = p->tok + cells;
	p->pos = p->tgt + cells;
	p->start = p->pos + cells;
	p->used = p->start + cells;
	p->n_row = rows;
	p->seq_len = seq_len;
	for (size_t k = 0; k < cells; k++) {     /* free slots: alone, not counted */
		p->tok[k] = 0;
		p->tgt[k] = -1;
		p->pos[k] = 0;
		p->start[k] = (int32_t)(k % (size_t)seq_len);
	}
	int row = -1;
	used = seq_len;
	for (int i = 0; i < d->n; i++) {
		const struct llm_sample *s = &d->s[order[i]];
		int need = s->n - 1;
		if (need < 1)
			continue;
		if (!pack || used + need > seq_len) {
			row++;
			used = 0;
		}
		p->used[row] = used + need;
		size_t base = (size_t)row * (size_t)seq_len;
		for (int k = 0; k < need; k++) {
			size_t c = base + (size_t)used + (size_t)k;
			p->tok[c] = s->ids[k];
			p->tgt[c] = s->loss[k + 1] ? s->ids[k + 1] : -1;
			p->pos[c] = k;
			p->start[c] = used;
			p->n_count += s->loss[k + 1];
		}
		used += need;
	}
	free(order);
	return LLM_OK;
}
