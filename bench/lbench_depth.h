/* bench/lbench_depth.h: a context depth for ../shared/tools/lbench.c, the
 * llama.cpp timing helper that lives outside the project (bench/engine.sh).
 *
 * lbench times pp and tg from an empty KV cache. engine.sh compiles it with
 * `-include bench/lbench_depth.h`; with LB_DEPTH=N in the environment every
 * cache clear (the warm-ups and each repetition) is followed by an untimed
 * prefill of N random tokens, so the timed pp/tg start after N tokens of
 * context, as llama-bench -d N and llm-bench model -d N do. The context is
 * made N tokens larger to hold them. Without LB_DEPTH nothing changes.
 * It works by wrapping two llama.cpp calls under their own names: this file
 * includes llama.h first (its include guard makes lbench's own include a
 * no-op), then defines the names to the wrappers below. */
#include <stdio.h>
#include <stdlib.h>
#include "llama.h"

static struct llama_context *lbd_ctx;	/* the one context lbench makes */

static int lbd_depth(void)
{
	const char *s = getenv("LB_DEPTH");
	return s ? atoi(s) : 0;
}

static struct llama_context *lbd_init_from_model(struct llama_model *model,
						 struct llama_context_params cp)
{
	cp.n_ctx += lbd_depth();
	lbd_ctx = llama_init_from_model(model, cp);
	return lbd_ctx;
}

/* Clear, then prefill LB_DEPTH tokens (ids as lbench draws them: 1, then
 * pseudo-random ids above the special tokens) in batches of 512. */
static void lbd_memory_clear(llama_memory_t mem, bool data)
{
	llama_memory_clear(mem, data);
	int depth = lbd_depth();
	if (depth <= 0 || !lbd_ctx)
		return;
	int nv = llama_vocab_n_tokens(llama_model_get_vocab(llama_get_model(lbd_ctx)));
	llama_token ids[512];	/* (chunk,) token ids */
	unsigned s = 777;
	for (int done = 0; done < depth;) {
		int n = depth - done < 512 ? depth - done : 512;
		for (int i = 0; i < n; i++) {
			s = s * 1103515245u + 12345u;
			ids[i] = done + i ? 260 + (int)(s >> 8) % (nv - 260) : 1;
		}
		if (llama_decode(lbd_ctx, llama_batch_get_one(ids, n))) {
			fprintf(stderr, "lbench: depth prefill failed\n");
			exit(1);
		}
		done += n;
	}
	llama_synchronize(lbd_ctx);
}

#define llama_init_from_model lbd_init_from_model
#define llama_memory_clear lbd_memory_clear
