/* tests/test_partition.c: partition planning and the partitioned checkpoint
 * (partition.h), read back through ckpt.c; the single-process communication
 * layer (comm.h).
 *
 * The slices are checked against the rules of partition.h computed here
 * independently from the whole tensors (not through the plan), so a wrong
 * rule cannot pass by agreeing with itself. */
#define _GNU_SOURCE
#include "llm.h"
#include "check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void test_range(void)
{
	int ok = 1;
	for (int64_t n = 0; n < 40 && ok; n++)
		for (int tp = 1; tp <= 9 && ok; tp++) {
			int64_t at = 0;
			for (int t = 0; t < tp; t++) {
				int64_t s, l;
				llm_part_range(n, tp, t, &s, &l);
				ok &= s == at && l >= n / tp && l <= n / tp + 1;
				at = s + l;
			}
			ok &= at == n;
		}
	check(ok, "llm_part_range: T consecutive ranges tile [0, N), sizes differ by at most one");
}

/* the best largest-stage cost, by trying every split (small cases) */
static int64_t brute(const int64_t *c, int n, int64_t fe, int64_t le, int pp, int first, int stage)
{
	if (stage == pp - 1) {
		int64_t s = le + (stage == 0 ? fe : 0);
		for (int i = first; i < n; i++)
			s += c[i];
		return first < n ? s : INT64_MAX;
	}
	int64_t best = INT64_MAX;
	for (int e = first + 1; e <= n - (pp - 1 - stage); e++) {
		int64_t s = stage == 0 ? fe : 0;
		for (int i = first; i < e; i++)
			s += c[i];
		int64_t r = brute(c, n, fe, le, pp, e, stage + 1);
		r = s > r ? s : r;
		best = r < best ? r : best;
	}
	return best;
}

static void test_balance(void)
{
	int64_t c[8] = { 10, 10, 10, 10, 10, 10, 10, 10 };
	int l0[5];
	enum llm_status s = llm_part_balance(c, 8, 0, 0, 4, l0);
	check(!s && l0[0] == 0 && l0[1] == 2 && l0[2] == 4 && l0[3] == 6 && l0[4] == 8,
	      "equal layers split equally over 4 stages");
	s = llm_part_balance(c, 8, 25, 15, 2, l0);
	check(!s && l0[1] == 3, "the embedding on stage 0 and the head on the last are counted (split at %d)", l0[1]);
	s = llm_part_balance(c, 3, 0, 0, 4, l0);
	check(s == LLM_ERR_USAGE && strstr(llm_errmsg(), "--pp 4 needs at least 4 layers"), "more stages than layers is refused");
	/* optimal against brute force, and every stage non-empty */
	uint64_t x = 88172645463325252ull;
	int ok = 1;
	for (int trial = 0; trial < 300 && ok; trial++) {
		int n = 1 + trial % 9, pp = 1 + trial % (n < 5 ? n : 5);
		int64_t cc[16], fe, le;
		for (int i = 0; i < n; i++) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			cc[i] = (int64_t)(x % 100);
		}
		fe = (int64_t)(x % 150), le = (int64_t)((x >> 20) % 150);
		int b[17];
		if (llm_part_balance(cc, n, fe, le, pp, b)) {
			ok = 0;
			break;
		}
		int64_t worst = 0;
		for (int p = 0; p < pp; p++) {
			ok &= b[p + 1] > b[p];
			int64_t sum = (p == 0 ? fe : 0) + (p == pp - 1 ? le : 0);
			for (int i = b[p]; i < b[p + 1]; i++)
				sum += cc[i];
			worst = sum > worst ? sum : worst;
		}
		ok &= b[0] == 0 && b[pp] == n && worst == brute(cc, n, fe, le, pp, 0, 0);
	}
	check(ok, "llm_part_balance is optimal (brute force, 300 random cases) with no empty stage");
}

/* A random checkpoint for CONFIG_JSON (8 heads, 2 kv heads, d_head 8, d_ff
 * 128, 3 layers, vocab 100: uneven vocab slices). */
static const char *make_model(const char *dir, const char *name, enum llm_dtype dt, int64_t bn, int64_t bk)
{
	static char out[600];
	char cfg[600];
	snprintf(cfg, sizeof cfg, "%s/cfg.json", dir);
	const char *js = "{\"architectures\": [\"LlamaForCausalLM\"], \"model_type\": \"llama\", \"hidden_size\": 64,"
	                 " \"intermediate_size\": 128, \"num_hidden_layers\": 3, \"num_attention_heads\": 8,"
	                 " \"num_key_value_heads\": 2, \"vocab_size\": 100, \"max_position_embeddings\": 64,"
	                 " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"hidden_act\": \"silu\","
	                 " \"tie_word_embeddings\": false, \"bos_token_id\": 1, \"eos_token_id\": 2}";
	llm_write_file_atomic(cfg, js, strlen(js));
	snprintf(out, sizeof out, "%s/%s", dir, name);
	struct llm_quant_opts q = { .block_rows = bn, .block_cols = bk, .out_dtype = dt, .seed = 5 };
	enum llm_status s = llm_quantize_random(cfg, out, &q);
	return check(!s, "random model %s (%s)", name, s ? llm_errmsg() : "ok") ? out : NULL;
}

/* Row range [r0, r1) x column range [c0, c1) of W equals slice S's data. */
static int same_box(const struct llm_tensor *w, const struct llm_tensor *s, int64_t r0, int64_t r1, int64_t c0, int64_t c1)
{
	size_t es = llm_dtype_size(w->dtype);
	int64_t cols = w->n_dim == 2 ? w->shape[1] : w->shape[0];
	if (llm_tensor_numel(s) != (r1 - r0) * (c1 - c0))
		return 0;
	for (int64_t r = r0; r < r1; r++)
		if (memcmp((const char *)w->data + (size_t)(r * cols + c0) * es,
		           (const char *)s->data + (size_t)((r - r0) * (c1 - c0)) * es, (size_t)(c1 - c0) * es))
			return 0;
	return 1;
}

/* Every rank's slices follow partition.h, checked from the whole tensors. */
static void check_rank_slices(const char *whole, const char *dir, int T, int P, const char *what)
{
	struct llm_ckpt w, r;
	if (llm_ckpt_open(&w, whole))
		return (void)check(0, "%s: open %s", what, whole);
	const int H = 8, K = 2, D = 8, F = 128, V = 100;
	int bad = 0, n_rank = T * P;
	uint64_t total = 0;
	for (int rank = 0; rank < n_rank && !bad; rank++) {
		if (llm_ckpt_open_rank(&r, dir, rank)) {
			check(0, "%s: open rank %d: %s", what, rank, llm_errmsg());
			bad = 1;
			break;
		}
		int t = rank % T, p = rank / T;
		const struct llm_partition *pt = r.part;
		bad |= !pt || pt->rank != rank || pt->ranks[rank].stage != p || pt->ranks[rank].tp_rank != t;
		for (size_t i = 0; i < r.n_tensor && !bad; i++) {
			const struct llm_tensor *s = r.tensors[i], *f = llm_ckpt_find(&w, s->name);
			total += s->nbytes;
			if (!f || (strstr(s->name, "_scale") && !llm_ckpt_find(&w, s->name))) {
				bad = 1;
				break;
			}
			const char *n = s->name;
			const char *sc = strstr(n, "_scale");
			char base[256];
			snprintf(base, sizeof base, "%.*s", sc ? (int)(sc - n) : (int)strlen(n), n);
			const struct llm_tensor *bw = llm_ckpt_find(&w, base);
			int64_t rows = bw->n_dim == 2 ? bw->shape[0] : 1, cols = bw->shape[bw->n_dim - 1];
			int64_t r0 = 0, r1 = rows, c0 = 0, c1 = cols;
			int64_t kv0 = T <= K ? t * (K / T) : t * K / T, nkv = T <= K ? K / T : 1;
			if (T > 1) {           /* the weight's box, by the rules of partition.h */
				if (strstr(base, "q_proj.weight"))
					r0 = t * (H / T) * D, r1 = r0 + (H / T) * D;
				else if (strstr(base, "k_proj.weight") || strstr(base, "v_proj.weight"))
					r0 = kv0 * D, r1 = (kv0 + nkv) * D;
				else if (strstr(base, "o_proj.weight"))
					c0 = t * (H / T) * D, c1 = c0 + (H / T) * D;
				else if (strstr(base, "gate_proj.weight") || strstr(base, "up_proj.weight"))
					r0 = t * (F / T), r1 = r0 + F / T;
				else if (strstr(base, "down_proj.weight"))
					c0 = t * (F / T), c1 = c0 + F / T;
				else if (!strcmp(base, "model.embed_tokens.weight") || !strcmp(base, "lm_head.weight"))
					r0 = (int64_t)t * V / T, r1 = (int64_t)(t + 1) * V / T;
			}
			if (sc) {              /* a scale: the blocks under that box */
				int64_t sr = f->n_dim == 2 ? f->shape[0] : llm_tensor_numel(f), scn = f->n_dim == 2 ? f->shape[1] : 1;
				int64_t bn = (rows + sr - 1) / sr, bk = (cols + scn - 1) / scn;
				r0 = sr > 1 ? r0 / bn : 0, r1 = sr > 1 ? (r1 + bn - 1) / bn : 1;
				c0 = scn > 1 ? c0 / bk : 0, c1 = scn > 1 ? (c1 + bk - 1) / bk : 1;
			}
			int layer = -1;
			if (!strncmp(n, "model.layers.", 13))
				layer = (int)strtol(n + 13, NULL, 10);
			if (layer >= 0 && (layer < pt->ranks[rank].layer_begin || layer >= pt->ranks[rank].layer_end))
				bad = 1;
			if (!bad && !same_box(f, s, r0, r1, c0, c1)) {
				check_diag("%s: rank %d: '%s' is not rows [%lld, %lld) x cols [%lld, %lld) of the whole", what,
				           rank, n, (long long)r0, (long long)r1, (long long)c0, (long long)c1);
				bad = 1;
			}
		}
		llm_ckpt_close(&r);
	}
	check(!bad, "%s: each rank's file holds exactly its slices (%llu bytes over %d ranks)", what,
	      (unsigned long long)total, n_rank);
	llm_ckpt_close(&w);
}

/* The merged view equals the original, tensor by tensor and in order. */
static void check_merged(const char *whole, const char *dir, const char *what)
{
	struct llm_ckpt a, b;
	if (llm_ckpt_open(&a, whole))
		return (void)check(0, "%s: open", what);
	enum llm_status s = llm_ckpt_open(&b, dir);
	if (!check(!s, "%s: the partitioned directory opens as a checkpoint (%s)", what, s ? llm_errmsg() : "ok")) {
		llm_ckpt_close(&a);
		return;
	}
	int same = a.n_tensor == b.n_tensor && b.part && b.n_file == 1;
	for (size_t i = 0; same && i < a.n_file; i++)
		for (size_t j = 0, k = 0; same && j < a.files[i].n_tensor; j++, k++) {
			const struct llm_tensor *x = &a.files[i].tensors[j], *y = &b.files[0].tensors[k];
			same = !strcmp(x->name, y->name) && x->dtype == y->dtype && x->n_dim == y->n_dim &&
			       !memcmp(x->shape, y->shape, sizeof x->shape) && x->nbytes == y->nbytes &&
			       !memcmp(x->data, y->data, x->nbytes);
		}
	check(same, "%s: the merged view has the original tensors, bytes and order", what);
	struct llm_weight wa, wb;
	s = llm_ckpt_weight(&b, "model.layers.1.mlp.down_proj.weight", &wb);
	s = s ? s : llm_ckpt_weight(&a, "model.layers.1.mlp.down_proj.weight", &wa);
	check(!s && wa.block_rows == wb.block_rows && wa.block_cols == wb.block_cols && wa.dtype == wb.dtype,
	      "%s: llm_ckpt_weight resolves the same weight and blocks from the merged view", what);
	check(!llm_ckpt_aux(&b, LLM_PART_FILE) && llm_ckpt_aux(&b, "config.json"),
	      "%s: side files without partition.json", what);
	llm_ckpt_close(&b);
	/* the lazy view reads any box of a split tensor */
	s = llm_ckpt_open_lazy(&b, dir);
	const struct llm_tensor *t = s ? NULL : llm_ckpt_find(&b, "model.layers.0.self_attn.o_proj.weight");
	const struct llm_tensor *o = llm_ckpt_find(&a, "model.layers.0.self_attn.o_proj.weight");
	if (t && o) {
		size_t es = llm_dtype_size(t->dtype);
		char *buf = malloc((size_t)(7 * 50) * es);
		s = llm_partition_read(&b, t, 3, 10, 5, 55, buf);
		struct llm_tensor box = *o;
		box.data = buf;
		box.n_dim = 2, box.shape[0] = 7, box.shape[1] = 50;
		check(!s && same_box(o, &box, 3, 10, 5, 55), "%s: llm_partition_read of rows 3-9 x cols 5-54 across slices", what);
		free(buf);
	} else {
		check(0, "%s: lazy open (%s)", what, llm_errmsg());
	}
	if (!s || t)
		llm_ckpt_close(&b);
	llm_ckpt_close(&a);
}

static void test_roundtrips(void)
{
	const char *tmp = test_tmpdir();
	struct { const char *name; enum llm_dtype dt; int64_t bn, bk; int tp, pp; } cases[] = {
		{ "bf16", LLM_DTYPE_BF16, 128, 128, 2, 3 },
		{ "bf16-kv", LLM_DTYPE_BF16, 128, 128, 4, 1 },   /* T > K: kv heads replicated */
		{ "bf16-t8", LLM_DTYPE_BF16, 128, 128, 8, 1 },
		{ "fp8-1xK", LLM_DTYPE_E4M3, 1, 0, 4, 2 },       /* per-channel scales split with rows */
		{ "fp8-32", LLM_DTYPE_E4M3, 32, 32, 2, 2 },      /* 32x32 blocks: boundaries at 32 */
	};
	for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
		const char *m = make_model(tmp, cases[i].name, cases[i].dt, cases[i].bn, cases[i].bk);
		if (!m)
			continue;
		char whole[700], part[760], back[800], what[128];
		snprintf(whole, sizeof whole, "%s", m);
		snprintf(part, sizeof part, "%s.tp%dpp%d", m, cases[i].tp, cases[i].pp);
		snprintf(back, sizeof back, "%s.back", part);
		snprintf(what, sizeof what, "%s tp%d x pp%d", cases[i].name, cases[i].tp, cases[i].pp);
		struct llm_part_opts o = { .tp = cases[i].tp, .pp = cases[i].pp };
		enum llm_status s = llm_repartition(whole, part, &o);
		if (!check(!s, "%s: partitioned (%s)", what, s ? llm_errmsg() : "ok"))
			continue;
		check_rank_slices(whole, part, cases[i].tp, cases[i].pp, what);
		check_merged(whole, part, what);
		struct llm_part_opts one = { .tp = 1, .pp = 1 };
		s = llm_repartition(part, back, &one);
		char a[900], b[900];
		snprintf(a, sizeof a, "%s/model.safetensors", whole);
		snprintf(b, sizeof b, "%s/model.safetensors", back);
		size_t la, lb;
		char *da = test_read_file(a, &la), *db = test_read_file(b, &lb);
		check(!s && da && db && la == lb && !memcmp(da, db, la), "%s: --tp 1 --pp 1 gives back the original file byte for byte", what);
		free(da), free(db);
	}
	/* a 32x32-block model refuses --tp 8 (q rows 64 / 8 = 8: inside a block) */
	char m[700], out[760];
	snprintf(m, sizeof m, "%s/fp8-32", tmp);
	snprintf(out, sizeof out, "%s/refused", tmp);
	struct llm_part_opts o = { .tp = 8, .pp = 1 };
	enum llm_status s = llm_repartition(m, out, &o);
	check(s == LLM_ERR_USAGE && strstr(llm_errmsg(), "32-row FP8 block") && !llm_exists(out),
	      "32x32 blocks refuse --tp 8 before writing: %s", llm_errmsg());
	/* a kv-head count that T neither divides nor is a multiple of */
	struct llm_part_opts o3 = { .tp = 3, .pp = 1 };
	s = llm_repartition(m, out, &o3);
	check(s == LLM_ERR_USAGE && strstr(llm_errmsg(), "8 attention heads"), "--tp 3 on 8 heads is refused: %s", llm_errmsg());

	/* tampered records are refused, naming what is wrong */
	char dir[700], path[800];
	snprintf(dir, sizeof dir, "%s/bf16.tp2pp3", tmp);
	struct llm_ckpt ck;
	s = llm_ckpt_open_rank(&ck, dir, 6);
	check(s == LLM_ERR_RANGE && strstr(llm_errmsg(), "no rank 6"), "llm_ckpt_open_rank past the last rank: %s", llm_errmsg());
	struct llm_partition *p;
	s = llm_partition_load(&p, dir);
	if (!s) {
		s = llm_partition_check_world(p, 4, dir);
		check(s == LLM_ERR_USAGE && strstr(llm_errmsg(), "= 6 ranks, but 4 were launched"),
		      "a world of 4 for a 6-rank partition is refused: %s", llm_errmsg());
		check(!llm_partition_check_world(p, 6, dir), "a world of 6 for a 6-rank partition is accepted");
		llm_partition_free(p);
	}
	snprintf(path, sizeof path, "%s/%s", dir, LLM_PART_FILE);
	size_t len;
	char *js = test_read_file(path, &len), *at = js ? strstr(js, "\"tp\": 2") : NULL;
	if (at) {
		at[6] = '3';       /* tp 3 x pp 3 = 9 ranks: the ranks list no longer fits */
		llm_write_file_atomic(path, js, len);
		s = llm_ckpt_open(&ck, dir);
		check(s == LLM_ERR_FORMAT && strstr(llm_errmsg(), LLM_PART_FILE), "a record that does not fit its ranks is refused: %s",
		      llm_errmsg());
		at[6] = '2';
		llm_write_file_atomic(path, js, len);
	}
	free(js);
	snprintf(path, sizeof path, "%s/rank-00003-pp1-tp1.safetensors", dir);
	char moved[820];
	snprintf(moved, sizeof moved, "%s.away", path);
	rename(path, moved);
	s = llm_ckpt_open(&ck, dir);
	check(s == LLM_ERR_IO && strstr(llm_errmsg(), "rank-00003-pp1-tp1"), "a missing rank file is named: %s", llm_errmsg());
	rename(moved, path);
	s = llm_ckpt_open(&ck, dir);
	check(!s, "restored, it opens again (%s)", s ? llm_errmsg() : "ok");
	if (!s)
		llm_ckpt_close(&ck);
}

static void test_comm_single(void)
{
	struct llm_comm *w;
	setenv("LLM_COMM", "single", 1);
	enum llm_status s = llm_comm_init(&w, NULL, NULL);
	if (!check(!s && w->size == 1 && w->rank == 0, "single-process world (%s)", s ? llm_errmsg() : "ok"))
		return;
	float x[3] = { 1, 2, 3 };
	check(!llm_comm_allreduce_sum_f32(w, x, 3) && x[0] == 1 && x[2] == 3, "all-reduce of one rank is the identity");
	char g[4];
	check(!llm_comm_allgather(w, "abcd", 4, g) && !memcmp(g, "abcd", 4), "all-gather of one rank copies");
	struct llm_grid gr;
	s = llm_grid_init(&gr, w, 1, 1);
	check(!s && gr.tp->size == 1 && gr.pp->size == 1 && gr.prev == -1 && gr.next == -1, "grid 1 x 1");
	if (!s)
		llm_grid_free(&gr);
	s = llm_grid_init(&gr, w, 2, 1);
	check(s == LLM_ERR_USAGE && strstr(llm_errmsg(), "needs 2 ranks, but 1 was launched"), "grid 2 x 1 on one rank: %s",
	      llm_errmsg());
	s = llm_comm_send(w, x, 4, 0, 0);
	check(s == LLM_ERR_INTERNAL && strstr(llm_errmsg(), "rank 0 of 1"), "a send to itself is refused naming the rank: %s",
	      llm_errmsg());
	check(w->stats.coll == 3 * sizeof(float) + 4 && w->stats.n_coll == 2, "collective byte counters");
	llm_comm_finalize(w);
	setenv("LLM_COMM", "bogus", 1);
	s = llm_comm_init(&w, NULL, NULL);
	check(s == LLM_ERR_USAGE, "LLM_COMM=bogus is refused: %s", llm_errmsg());
	unsetenv("LLM_COMM");
}

int main(void)
{
	test_range();
	test_balance();
	test_roundtrips();
	test_comm_single();
	return check_done();
}
