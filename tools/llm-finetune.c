/* tools/llm-finetune.c: LoRA fine-tuning on a frozen base (F32, BF16 or
 * FP8); also --merge (adapter into a checkpoint), --plan (memory per rank,
 * without loading the weights) and --sample (greedy text with an adapter).
 * The work is in libllm (train.c, finetune.c, lora.c). */
#define _GNU_SOURCE
#include "llm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct plan_row { const char *key, *label; size_t bytes; };

/* --plan: the memory of one rank, as a table (or JSON) on stdout. */
static int print_plan(const char *model, const struct llm_finetune_opts *o, int64_t ranks, int shard,
                      double offload, int json)
{
	struct llm_model m;
	if (llm_model_open(&m, model) || llm_frozen_check(&m, model, shard, offload))   /* reads no weight */
		llm_die("%s", llm_errmsg());
	struct llm_lora lo;
	if (llm_lora_init(&lo, &m.cfg, o->rank, (float)o->alpha, (float)o->dropout, o->targets, 0))
		llm_die("%s", llm_errmsg());
	int nt = 0;
	for (int k = 0; k < LLM_LORA_N; k++)
		nt += o->targets >> k & 1;
	int nth = o->n_threads > 0 ? o->n_threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
	struct llm_train_opts to = { .seq_len = o->seq_len, .n_seq = o->micro_batch, .checkpoint = o->checkpoint };
	struct llm_train_plan p;
	llm_train_plan(&m.cfg, lo.n_params, lo.rank, nt, &to, nth, &p);
	/* frozen weights: all per rank, or with --shard-base 1/N of the decoder
	 * layers plus the buffer one layer is gathered into (finetune.c) */
	struct llm_frozen_plan fz;
	llm_frozen_plan(&m, (int)ranks, shard, offload, &fz);
	/* with --data: of a separate input embedding, only the rows it uses */
	struct llm_dataset d = { 0 };
	struct llm_tokenizer *tk = NULL;
	if (o->data) {
		struct llm_data_opts dopt = o->data_o;
		dopt.seq_len = o->seq_len;
		if (llm_finetune_tokenizer(&m, model, &tk) || llm_dataset_load(&d, o->data, tk, &dopt, NULL))
			llm_die("%s", llm_errmsg());
	}
	size_t table, emb = llm_embed_resident(&m, o->data ? &d : NULL, &table);
	fz.resident = fz.resident - table + emb;
	llm_dataset_free(&d);
	llm_tokenizer_close(tk);
	struct plan_row rows[] = {
		{ "frozen_weights", "frozen weights (resident)", fz.resident },
		{ "frozen_offloaded", "frozen weights (off-loaded to host)", fz.offloaded },
		{ "gather_buffer", shard ? "all-gathered layer buffer" : "copied-in layer buffer", fz.buffer },
		{ "lora_params", "LoRA parameters", p.params },
		{ "gradients", "LoRA gradients", p.grads },
		{ "optimizer_state", "AdamW state (m, v)", p.optimizer },
		{ "activation_checkpoints", "activation checkpoints", p.checkpoints },
		{ "layer_activations", o->checkpoint ? "one layer's activations" : "all layers' activations", p.layer_acts },
		{ "backward_workspace", "backward workspace", p.workspace },
		{ "logits", "logits (one chunk)", p.logits },
		{ "thread_scratch", "thread scratch", p.threads },
	};
	size_t total = 0;
	for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
		total += rows[i].bytes;
	if (json) {
		printf("{\"model\": \"%s\", \"n_layer\": %d, \"d_model\": %d, \"seq_len\": %d, \"micro_batch\": %d, "
		       "\"ranks\": %lld, \"shard_base\": %s, \"offload_base\": %g, \"checkpoint_activations\": %s, "
		       "\"rank\": %d, \"lora_params\": %zu, \"decoder_weights\": %zu, \"other_weights\": %zu, "
		       "\"offloaded_layers\": %d, \"embedding_table\": %zu, \"embedding_resident\": %zu, "
		       "\"bytes_per_rank\": {", model, m.cfg.n_layer, m.cfg.d_model,
		       o->seq_len, o->micro_batch, (long long)ranks, shard ? "true" : "false", offload,
		       o->checkpoint ? "true" : "false", o->rank, lo.n_params, fz.decoder, fz.other, fz.n_offloaded,
		       table, emb);
		for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
			printf("\"%s\": %zu, ", rows[i].key, rows[i].bytes);
		printf("\"total\": %zu}}\n", total);
	} else {
		printf("# llm-finetune --plan: %s, %d layers, d_model %d, %zu LoRA parameters (rank %d)\n", model,
		       m.cfg.n_layer, m.cfg.d_model, lo.n_params, o->rank);
		printf("# seq_len %d, micro-batch %d, %lld rank%s%s, offload %.2f, activation checkpointing %s\n",
		       o->seq_len, o->micro_batch, (long long)ranks, ranks > 1 ? "s" : "", shard ? ", --shard-base" : "",
		       offload, o->checkpoint ? "on" : "off");
		printf("# input embedding: %.1f of %.1f MiB resident (%s)\n", (double)emb / 1048576.0,
		       (double)table / 1048576.0, m.embed.data == m.lm_head.data ? "tied to the lm_head: read whole"
		       : o->data ? "the pages of the rows the --data tokens use" : "no --data: counted whole");
		printf("%-38s %14s %10s\n", "per rank", "bytes", "MiB");
		for (size_t i = 0; i < sizeof rows / sizeof *rows; i++)
			printf("%-38s %14zu %10.1f\n", rows[i].label, rows[i].bytes, (double)rows[i].bytes / 1048576.0);
		printf("%-38s %14zu %10.1f\n", "total", total, (double)total / 1048576.0);
	}
	llm_lora_free(&lo);
	llm_model_close(&m);
	return 0;
}

static struct llm_comm *world;    /* one rank unless under mpirun */

int main(int argc, char **argv)
{
	struct llm_finetune_opts o = {
		.rank = 8, .alpha = 16, .dropout = 0.05, .seq_len = 512, .micro_batch = 1, .grad_accum = 1,
		.epochs = 1, .pack = 1,
		.adam = { .lr = 2e-4, .min_lr_ratio = 0.1, .beta1 = 0.9, .beta2 = 0.999, .eps = 1e-8, .clip = 1.0 },
	};
	const char *model = NULL, *targets = "q,k,v,o,gate,up,down", *merge = NULL, *sample = NULL;
	int64_t rank = 8, seq_len = 512, micro = 1, accum = 1, seed = 0, threads = 0, sample_tokens = 32;
	int64_t warmup = 0, ranks = 0;
	int no_pack = 0, plan = 0, json = 0, shard = 0;
	double offload = 0;
	const struct llm_opt opts[] = {
		LLM_STR('m', "model", "CKPT", &model, "base checkpoint (directory or .safetensors; F32, F16, BF16 or FP8)"),
		LLM_STR(0, "data", "FILE", &o.data, "training data, JSONL: {instruction, input, output} or {messages}"),
		LLM_STR('o', "output", "DIR", &o.out, "adapter directory (PEFT layout); with --merge the merged checkpoint"),
		LLM_INT('r', "rank", "N", &rank, "LoRA rank r", 1, 4096),
		LLM_FLOAT(0, "alpha", "A", &o.alpha, "LoRA alpha (the update is scaled by alpha / r)", 0, 0),
		LLM_FLOAT(0, "dropout", "P", &o.dropout, "LoRA dropout on the adapter input", 0, 0.99),
		LLM_STR(0, "targets", "LIST", &targets, "projections to adapt: q,k,v,o,gate,up,down or all"),
		LLM_INT(0, "seq-len", "N", &seq_len, "tokens per packed row (a sample may have N + 1)", 2, 1 << 20),
		LLM_INT(0, "micro-batch", "N", &micro, "rows per forward/backward pass", 1, 4096),
		LLM_INT(0, "grad-accum", "N", &accum, "micro-batches per optimizer step", 1, 1 << 20),
		LLM_INT(0, "epochs", "N", &o.epochs, "passes over the data (unless --steps)", 1, 1 << 20),
		LLM_INT(0, "steps", "N", &o.steps, "optimizer steps (0: as many as --epochs take)", 0, INT64_MAX / 8),
		LLM_FLOAT(0, "lr", "X", &o.adam.lr, "peak learning rate", 0, 10),
		LLM_FLOAT(0, "min-lr-ratio", "X", &o.adam.min_lr_ratio, "cosine decay ends at lr times this", 0, 1),
		LLM_INT(0, "warmup", "N", &warmup, "linear warmup steps", 0, INT64_MAX / 8),
		LLM_FLOAT(0, "weight-decay", "X", &o.adam.weight_decay, "AdamW decoupled weight decay", 0, 10),
		LLM_FLOAT(0, "beta1", "X", &o.adam.beta1, "AdamW beta1", 0, 0.999999),
		LLM_FLOAT(0, "beta2", "X", &o.adam.beta2, "AdamW beta2", 0, 0.999999999),
		LLM_FLOAT(0, "adam-eps", "X", &o.adam.eps, "AdamW epsilon", 0, 1),
		LLM_FLOAT(0, "clip", "X", &o.adam.clip, "clip the global gradient norm to X (0: off)", 0, 1e9),
		LLM_INT(0, "seed", "N", &seed, "seed of the adapter init, data order and dropout", 0, INT64_MAX),
		LLM_FLAG(0, "train-on-prompt", &o.data_o.train_on_prompt, "count the prompt tokens in the loss too"),
		LLM_FLAG(0, "no-pack", &no_pack, "one sample per row instead of packing rows"),
		LLM_FLAG(0, "skip-bad", &o.data_o.skip_bad, "skip bad data lines (counted, each named) instead of failing"),
		LLM_STR(0, "chat-template", "FILE", &o.data_o.chat_template, "Jinja chat template for {messages} data"),
		LLM_FLAG(0, "checkpoint-activations", &o.checkpoint, "recompute each layer in the backward pass"),
		LLM_INT('t', "threads", "N", &threads, "CPU threads (0: all)", 0, 1024),
		LLM_INT(0, "save-every", "N", &o.save_every, "save the training state every N steps (0: never)", 0, INT64_MAX),
		LLM_FLAG(0, "resume", &o.resume, "continue from the training state in the output directory"),
		LLM_STR(0, "log", "FILE", &o.log, "loss curve as CSV"),
		LLM_FLAG(0, "plot", &o.plot, "plot the loss curve on stderr at the end"),
		LLM_STR(0, "adapter", "DIR", &o.adapter, "start from this PEFT adapter (training) or use it (--sample)"),
		LLM_STR(0, "merge", "DIR", &merge, "write -m with the adapter DIR merged in to -o, then exit"),
		LLM_STR(0, "sample", "TEXT", &sample, "after training (or alone): print the greedy continuation of TEXT"),
		LLM_INT(0, "sample-tokens", "N", &sample_tokens, "tokens --sample generates", 1, 1 << 20),
		LLM_FLAG(0, "plan", &plan, "print the memory per rank without loading the weights, then exit"),
		LLM_FLAG(0, "json", &json, "with --plan: JSON instead of a table"),
		LLM_INT(0, "ranks", "N", &ranks, "with --plan: ranks to plan for (default: as launched)", 1, 1 << 20),
		LLM_FLAG(0, "shard-base", &shard, "each rank keeps 1/N of the frozen layers, all-gathered per use (ZeRO-3)"),
		LLM_FLOAT(0, "offload-base", "FRACTION", &offload, "share of the frozen layers kept in host memory, copied in per use", 0, 1),
		LLM_FLAG('f', "force", &o.force, "replace an existing adapter or checkpoint at -o"),
	};
	const struct llm_cli cli = {
		.usage = "llm-finetune [options] -m CKPT --data FILE.jsonl -o ADAPTER_DIR",
		.summary = "Train a LoRA adapter on a frozen base checkpoint (CPU) and write it in the PEFT layout,\n"
		           "data parallel under mpirun -np N; --merge folds an adapter into a checkpoint,\n"
		           "--plan prints the memory a run needs per rank.",
		.example = "llm-finetune -m models/stories260K --data tests/data/finetune/train.jsonl -o /tmp/ad --steps 50 --lr 1e-2",
		.opts = opts, .n_opts = (int)(sizeof opts / sizeof *opts), .min_pos = 0, .max_pos = 0,
	};
	const char *pos[16];
	int n_pos;
	int rc = llm_args_parse(argc, argv, &cli, pos, &n_pos);
	if (rc != LLM_ARGS_OK)
		return rc == LLM_ARGS_EXIT ? 0 : 2;
	if (!model)
		return llm_args_usage_error(&cli, "-m CKPT is required");
	if (llm_lora_parse_targets(targets, &o.targets))
		return llm_args_usage_error(&cli, "--targets: %s", llm_errmsg());
	o.model = model;
	o.rank = (int)rank;
	o.seq_len = (int)seq_len;
	o.micro_batch = (int)micro;
	o.grad_accum = (int)accum;
	o.seed = (uint64_t)seed;
	o.n_threads = (int)threads;
	o.pack = !no_pack;
	o.adam.warmup = warmup;
	if (json && !plan)
		return llm_args_usage_error(&cli, "--json goes with --plan");
	if (!plan && ranks)
		return llm_args_usage_error(&cli, "--ranks goes with --plan (training takes its ranks from mpirun -np)");
	if ((shard || offload > 0) && !plan && !o.data)
		return llm_args_usage_error(&cli, "--shard-base and --offload-base go with training or --plan");
	if (merge && (!o.out || o.data))
		return llm_args_usage_error(&cli, o.out ? "--merge does not train: drop --data" : "--merge needs -o OUT");
	if (!plan && !merge && !o.data && !sample)
		return llm_args_usage_error(&cli, "--data FILE is required (or --merge, --plan, --sample)");
	if (!plan && !merge && o.data && !o.out)
		return llm_args_usage_error(&cli, "-o ADAPTER_DIR is required");
	if (o.resume && o.force)
		return llm_args_usage_error(&cli, "--resume and --force do not go together");
	if (llm_comm_init(&world, &argc, &argv))
		llm_die("%s", llm_errmsg());
	/* --plan, --merge and --sample run on rank 0 alone */
	if (world->rank != 0 && (plan || merge || !o.data)) {
		llm_comm_finalize(world);
		return 0;
	}
	if (plan) {
		rc = print_plan(model, &o, ranks ? ranks : world->size, shard, offload, json);
		llm_comm_finalize(world);
		return rc;
	}
	char stale[4096];         /* what killed runs left at the output: beside a merged checkpoint, inside an adapter directory (their *.tmp.PID) */
	int n_stale = llm_tmp_sweep(world->rank == 0 && (merge || o.data) ? o.out : NULL, !merge, stale, sizeof stale);
	if (n_stale)
		LLM_INFO("%s: removed %d stale temporar%s of killed runs (%s%s)\n", llm_progname(), n_stale,
		         n_stale > 1 ? "ies" : "y", stale, n_stale > 1 ? ", ..." : "");
	if (merge) {
		struct llm_model m;
		struct llm_lora lo;
		if (llm_model_open(&m, model) || llm_lora_load(&lo, merge, &m.cfg))
			llm_die("%s", llm_errmsg());
		llm_model_close(&m);
		struct llm_progress pg;      /* progress and the summary on stderr; -q: none */
		if (llm_progress_init(&pg, llm_log_level >= 1 ? stderr : NULL))
			llm_die("%s", llm_errmsg());
		struct llm_ckpt_write_opts wo = { .force = o.force, .progress = &pg };
		if (llm_lora_merge(&lo, model, o.out, &wo)) {
			llm_progress_clear(&pg);
			llm_die("%s", llm_errmsg());
		}
		llm_progress_end_write(&pg, o.out);
		llm_lora_free(&lo);
		llm_comm_finalize(world);
		return 0;
	}
	if (o.data) {
		struct llm_finetune_result r;
		o.comm = world;
		o.shard_base = shard;
		o.offload_base = offload;
		/* ranks on one node share its cores (the results do not depend on it) */
		if (!threads && world->size > 1) {
			const char *ls = getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
			long local = ls ? strtol(ls, NULL, 10) : world->size, ncpu = sysconf(_SC_NPROCESSORS_ONLN);
			o.n_threads = (int)(local > 0 && ncpu / local > 1 ? ncpu / local : 1);
		}
		if (llm_finetune(&o, &r)) {
			if (r.peer_failed) {          /* the failing rank reports and ends the job */
				llm_comm_barrier(world);
				exit(1);
			}
			if (world->size > 1)
				llm_comm_die("%s", llm_errmsg());
			llm_die("%s", llm_errmsg());
		}
		if (r.steps > r.start_step && world->rank == 0) {
			LLM_INFO("done: %lld steps, loss %.4f -> %.4f, %.0f tok/s, peak RSS %.1f MiB%s "
			         "(plan %.1f MiB + frozen weights %.1f MiB + layer buffer %.1f MiB)\n", (long long)r.steps,
			         r.first_loss, r.last_loss, r.tokens_per_s, (double)r.peak_rss_max / 1048576.0,
			         world->size > 1 ? " (largest rank)" : "", (double)r.plan.total / 1048576.0,
			         (double)(r.frozen.resident + r.frozen.offloaded) / 1048576.0,
			         (double)r.frozen.buffer / 1048576.0);
			if (r.gathered || r.copied_in)
				LLM_INFO("frozen weights moved per rank: %.1f MiB all-gathered from other ranks, "
				         "%.1f MiB copied in from host memory\n", (double)r.gathered / 1048576.0,
				         (double)r.copied_in / 1048576.0);
		}
	}
	if (sample && world->rank == 0) {
		char *text;
		if (llm_finetune_sample(model, o.data ? o.out : o.adapter, sample, (int)sample_tokens,
		                        (int)threads, &text))
			llm_die("%s", llm_errmsg());
		printf("%s\n", text);
		free(text);
	}
	if (llm_comm_finalize(world))
		llm_die("%s", llm_errmsg());
	return 0;
}
