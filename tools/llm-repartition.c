/* tools/llm-repartition.c: split a checkpoint into one file per rank for
 * tensor x pipeline parallelism, or merge one back (--tp 1 --pp 1). */
#define _POSIX_C_SOURCE 200809L
#include "llm.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* "4,4,3" -> counts (exactly PP of them). */
static int parse_layers(const char *s, int pp, int *out)
{
	int n = 0;
	while (*s) {
		const char *e = strchr(s, ',');
		size_t len = e ? (size_t)(e - s) : strlen(s);
		char num[32];
		int64_t v;
		if (n >= pp || len == 0 || len >= sizeof num)
			return -1;
		memcpy(num, s, len);
		num[len] = 0;
		if (llm_parse_int(num, 1, 1 << 20, &v))
			return -1;
		out[n++] = (int)v;
		s += len + (e ? 1 : 0);
		if (e && !*s)
			return -1;
	}
	return n == pp ? 0 : -1;
}

int main(int argc, char **argv)
{
	int64_t tp = 1, pp = 1;
	const char *layers = NULL;
	int force = 0, dry = 0;
	size_t max_shard = 5000000000u;
	const struct llm_opt opts[] = {
		LLM_INT(0, "tp", "T", &tp, "tensor-parallel ranks per stage (must divide the heads)", 1, LLM_PART_MAX_RANKS),
		LLM_INT(0, "pp", "P", &pp, "pipeline stages (at most the number of layers)", 1, LLM_PART_MAX_RANKS),
		LLM_STR(0, "layers", "N1,N2,...", &layers, "layers per stage, first to last (default: balanced by bytes)"),
		LLM_FLAG('n', "dry-run", &dry, "check and print the plan (rank, stage, layers, bytes, file); write nothing"),
		LLM_SIZE(0, "max-shard-size", "SIZE", &max_shard, "with --tp 1 --pp 1: largest shard of a directory output"),
		LLM_FLAG('f', "force", &force, "replace an existing OUT"),
	};
	const struct llm_cli cli = {
		.usage = "llm-repartition [options] IN OUT --tp T --pp P",
		.summary = "Write a partitioned checkpoint, one safetensors file per rank (stage p, TP rank t),\n"
		           "for tensor x pipeline parallel runs (mpirun -np T*P); --tp 1 --pp 1 merges one\n"
		           "back into the Hugging Face layout, bit-exact. IN is any checkpoint. Progress and\n"
		           "a closing summary go to standard error (-q: neither).",
		.example = "llm-repartition models/llama-8b-fp8 models/llama-8b-tp2pp2 --tp 2 --pp 2",
		.opts = opts, .n_opts = (int)(sizeof opts / sizeof *opts), .min_pos = 2, .max_pos = 2,
	};
	const char *pos[16];
	int n_pos;
	int rc = llm_args_parse(argc, argv, &cli, pos, &n_pos);
	if (rc != LLM_ARGS_OK)
		return rc == LLM_ARGS_EXIT ? 0 : 2;
	int counts[LLM_PART_MAX_RANKS];
	if (layers && parse_layers(layers, (int)pp, counts))
		return llm_args_usage_error(&cli, "--layers: '%s' is not %lld positive counts separated by commas",
		                            layers, (long long)pp);
	if (tp * pp > LLM_PART_MAX_RANKS)
		return llm_args_usage_error(&cli, "--tp %lld x --pp %lld is more than %d ranks", (long long)tp,
		                            (long long)pp, LLM_PART_MAX_RANKS);
	struct llm_progress pg;          /* progress and the summary on stderr; -q, --dry-run: none */
	if (llm_progress_init(&pg, llm_log_level >= 1 && !dry ? stderr : NULL))
		return llm_args_usage_error(&cli, "%s", llm_errmsg());
	struct llm_part_opts o = {
		.tp = (int)tp, .pp = (int)pp, .layers = layers ? counts : NULL, .dry_run = dry,
		.write = { .force = force, .max_shard_size = max_shard, .progress = &pg },
	};
	char stale[4096];         /* what killed runs left at OUT (their *.tmp.PID) */
	int n_stale = llm_tmp_sweep(dry ? NULL : pos[1], 0, stale, sizeof stale);
	if (n_stale)
		LLM_INFO("%s: removed %d stale temporar%s of killed runs (%s%s)\n", llm_progname(), n_stale,
		         n_stale > 1 ? "ies" : "y", stale, n_stale > 1 ? ", ..." : "");
	enum llm_status s = llm_repartition(pos[0], pos[1], &o);
	if (s) {    /* a plan the model does not allow is exit 1 too: it names tensor and sizes */
		llm_progress_clear(&pg);
		llm_die("%s", llm_errmsg());
	}
	llm_progress_end_write(&pg, pos[1]);
	return 0;
}
