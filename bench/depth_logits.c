/* bench/depth_logits.c: llama.cpp's next-token distribution at chosen
 * positions of one token sequence, the reference bench/depth.sh compares
 * llm-generate's top log-probs with at long context.
 *
 *   depth_logits BACKEND_DIR MODEL.gguf IDS_FILE POS[,POS...] [THREADS [FA]]
 *
 * BACKEND_DIR: the folder of the prebuilt libggml-cpu-*.so backends (node-
 * llama-cpp's bins/linux-x64); MODEL.gguf: the model; IDS_FILE: the token ids
 * as JSON, a plain array or {"prompt_ids": [...]} (every integer after the
 * first '[' is an id, in order); POS: 0-based positions, each below the
 * sequence length; THREADS: CPU threads (default 1); FA: 1 turns llama.cpp's
 * flash attention on (default 0: off, so attention is ggml's plain
 * mul_mat / soft_max / mul_mat, in F32 over the F32 cache).
 *
 * The sequence ids[0 .. max POS] is decoded as one sequence, in llama_decode
 * calls of 512 tokens (n_ubatch 512), with logits requested only at the
 * chosen positions; the KV cache is F32 (type_k = type_v = GGML_TYPE_F32) and
 * the context exactly as long as needed (rounded up by llama.cpp). For each
 * position, in the order given, one JSON line on stdout:
 *   {"pos": P, "top": [[id, logprob], ...]}   (10 entries, most likely first)
 * where logprob is log softmax of the F32 logits, computed in double (max
 * subtracted first), and ties in logit keep the lower id first.
 * The distribution at P is the model's prediction of token P+1 having seen
 * ids[0..P], as llm-generate's first top_logprobs entry is for the prompt
 * ids[0..P]. Exit status: 0 ok, 1 llama.cpp failed, 2 usage or a bad file.
 * Build (bench/depth.sh does): cc -O2 -I LLAMA/include -I LLAMA/ggml/include
 * depth_logits.c -lllama -lggml -lggml-base -lm. */
#include <errno.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "llama.h"
#include "ggml-backend.h"
#include "../common/base/banned.h"

#define TOP 10
#define CHUNK 512	/* tokens per llama_decode call */

/* quiet: warnings and errors only (with their continuation lines), unless DEPTH_DEBUG is set */
static void quiet(enum ggml_log_level l, const char *s, void *u)
{
	static int shown;
	(void)u;
	if (l != GGML_LOG_LEVEL_CONT)
		shown = l == GGML_LOG_LEVEL_WARN || l == GGML_LOG_LEVEL_ERROR || getenv("DEPTH_DEBUG");
	if (shown)
		fputs(s, stderr);
}

/* parse_long: the whole of s as a base-10 integer in [lo, hi], else -1 */
static int parse_long(const char *s, long lo, long hi, long *out)
{
	char *end;
	errno = 0;
	long v = strtol(s, &end, 10);
	if (errno || end == s || *end || v < lo || v > hi)
		return -1;
	*out = v;
	return 0;
}

/* read_ids: the integers of the file after its first '['; *n set; NULL on error */
static llama_token *read_ids(const char *path, int *n)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "depth_logits: %s: %s\n", path, strerror(errno));
		return NULL;
	}
	int c, cap = 1 << 16, len = 0;
	llama_token *ids = malloc(sizeof(*ids) * (size_t)cap);
	while ((c = fgetc(f)) != EOF && c != '[')
		;
	long v = -1;
	while (ids && (c = fgetc(f)) != EOF) {
		if (c >= '0' && c <= '9') {
			v = (v < 0 ? 0 : v * 10) + (c - '0');
			if (v > INT32_MAX) {
				fprintf(stderr, "depth_logits: %s: id %ld too large\n", path, v);
				free(ids);
				ids = NULL;
			}
			continue;
		}
		if (v >= 0) {
			if (len == cap) {
				cap *= 2;
				llama_token *p = realloc(ids, sizeof(*ids) * (size_t)cap);
				if (!p) {
					free(ids);
					ids = NULL;
					break;
				}
				ids = p;
			}
			ids[len++] = (llama_token)v;
			v = -1;
		}
		if (c == ']')
			break;
	}
	fclose(f);
	if (ids && len == 0) {
		fprintf(stderr, "depth_logits: %s: no token ids after '['\n", path);
		free(ids);
		ids = NULL;
	}
	*n = len;
	return ids;
}

/* print_top: the TOP most likely ids of logits (n_vocab,) f32 and their log-probs */
static void print_top(int pos, const float *logits, int n_vocab)
{
	double mx = -INFINITY, sum = 0;
	for (int i = 0; i < n_vocab; i++)
		if (logits[i] > mx)
			mx = logits[i];
	for (int i = 0; i < n_vocab; i++)
		sum += exp((double)logits[i] - mx);
	double lse = mx + log(sum);
	int top[TOP], k = 0;
	for (int i = 0; i < n_vocab; i++) {
		/* insertion into the sorted top list; an equal logit stays after */
		int j = k < TOP ? k++ : TOP;
		while (j > 0 && logits[i] > logits[top[j - 1]]) {
			if (j < TOP)
				top[j] = top[j - 1];
			j--;
		}
		if (j < TOP)
			top[j] = i;
	}
	printf("{\"pos\": %d, \"top\": [", pos);
	for (int j = 0; j < k; j++)
		printf("%s[%d, %.9g]", j ? ", " : "", top[j], (double)logits[top[j]] - lse);
	printf("]}\n");
	fflush(stdout);
}

int main(int argc, char **argv)
{
	if (argc < 5 || argc > 7) {
		fprintf(stderr, "usage: depth_logits BACKEND_DIR MODEL.gguf IDS_FILE POS[,POS...] [THREADS [FA]]\n");
		return 2;
	}
	long threads = 1, fa = 0;
	if (argc > 5 && parse_long(argv[5], 1, 1024, &threads) < 0) {
		fprintf(stderr, "depth_logits: THREADS '%s': expected 1 to 1024\n", argv[5]);
		return 2;
	}
	if (argc > 6 && parse_long(argv[6], 0, 1, &fa) < 0) {
		fprintf(stderr, "depth_logits: FA '%s': expected 0 or 1\n", argv[6]);
		return 2;
	}
	int n_ids;
	llama_token *ids = read_ids(argv[3], &n_ids);
	if (!ids)
		return 2;
	/* the positions, in the order given */
	int n_pos = 1;
	for (const char *s = argv[4]; *s; s++)
		n_pos += *s == ',';
	int *pos = malloc(sizeof(*pos) * (size_t)n_pos), max_pos = 0;
	char *list = strdup(argv[4]);
	if (!pos || !list)
		return 1;
	char *save = NULL, *tok = strtok_r(list, ",", &save);
	for (int i = 0; i < n_pos; i++, tok = strtok_r(NULL, ",", &save)) {
		long p;
		if (!tok || parse_long(tok, 0, n_ids - 1, &p) < 0) {
			fprintf(stderr, "depth_logits: POS '%s': expected positions 0 to %d, comma-separated\n",
			        argv[4], n_ids - 1);
			return 2;
		}
		pos[i] = (int)p;
		if (pos[i] > max_pos)
			max_pos = pos[i];
	}
	free(list);

	llama_log_set(quiet, NULL);
	ggml_backend_load_all_from_path(argv[1]);
	llama_backend_init();
	struct llama_model_params mp = llama_model_default_params();
	mp.n_gpu_layers = 0;
	struct llama_model *model = llama_model_load_from_file(argv[2], mp);
	if (!model) {
		fprintf(stderr, "depth_logits: %s: llama.cpp could not load it\n", argv[2]);
		return 1;
	}
	const struct llama_vocab *vocab = llama_model_get_vocab(model);
	int n_vocab = llama_vocab_n_tokens(vocab);
	for (int i = 0; i <= max_pos; i++)
		if (ids[i] < 0 || ids[i] >= n_vocab) {
			fprintf(stderr, "depth_logits: %s: id %d at %d is past the vocabulary (%d)\n",
			        argv[3], ids[i], i, n_vocab);
			return 2;
		}
	struct llama_context_params cp = llama_context_default_params();
	cp.n_ctx = (uint32_t)max_pos + 1;
	cp.n_batch = CHUNK;
	cp.n_ubatch = CHUNK;
	cp.n_seq_max = 1;
	cp.n_threads = (int32_t)threads;
	cp.n_threads_batch = (int32_t)threads;
	cp.type_k = GGML_TYPE_F32;
	cp.type_v = GGML_TYPE_F32;
	cp.flash_attn_type = fa ? LLAMA_FLASH_ATTN_TYPE_ENABLED : LLAMA_FLASH_ATTN_TYPE_DISABLED;
	struct llama_context *ctx = llama_init_from_model(model, cp);
	if (!ctx) {
		fprintf(stderr, "depth_logits: llama.cpp could not make a context of %d positions\n", max_pos + 1);
		return 1;
	}
	/* want[i]: position i's logits are asked for; row[i]: its row in the batch */
	char *want = calloc((size_t)max_pos + 1, 1);
	int *row = malloc(sizeof(*row) * ((size_t)max_pos + 1));
	float **keep = calloc((size_t)max_pos + 1, sizeof(*keep));	/* (n_vocab,) f32 per wanted position */
	if (!want || !row || !keep)
		return 1;
	for (int i = 0; i < n_pos; i++)
		want[pos[i]] = 1;
	struct llama_batch b = llama_batch_init(CHUNK, 0, 1);
	for (int at = 0; at <= max_pos; at += CHUNK) {
		int n = max_pos + 1 - at < CHUNK ? max_pos + 1 - at : CHUNK;
		b.n_tokens = n;
		for (int i = 0; i < n; i++) {
			b.token[i] = ids[at + i];
			b.pos[i] = at + i;
			b.n_seq_id[i] = 1;
			b.seq_id[i][0] = 0;
			b.logits[i] = want[at + i];
			row[at + i] = i;
		}
		int rc = llama_decode(ctx, b);
		if (rc) {
			fprintf(stderr, "depth_logits: llama_decode at position %d: status %d\n", at, rc);
			return 1;
		}
		for (int i = 0; i < n; i++) {
			if (!want[at + i] || keep[at + i])
				continue;
			const float *l = llama_get_logits_ith(ctx, row[at + i]);
			keep[at + i] = malloc(sizeof(float) * (size_t)n_vocab);
			if (!l || !keep[at + i]) {
				fprintf(stderr, "depth_logits: no logits at position %d\n", at + i);
				return 1;
			}
			memcpy(keep[at + i], l, sizeof(float) * (size_t)n_vocab);
		}
	}
	for (int i = 0; i < n_pos; i++)
		print_top(pos[i], keep[pos[i]], n_vocab);
	llama_batch_free(b);
	llama_free(ctx);
	llama_model_free(model);
	llama_backend_free();
	return 0;
}
