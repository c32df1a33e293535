/* tests/lib/sched_run.h: run a set of requests to the end through the one
 * scheduler (scheduler.h) over engine E: all of them queued together, as
 * many running at once as E has sequences, its whole step budget, no
 * prefix cache. DETOK may be NULL. The first failing add or step is
 * returned (its message in llm_errmsg()). */
#ifndef TEST_SCHED_RUN_H
#define TEST_SCHED_RUN_H

#include "scheduler.h"

static inline enum llm_status test_sched_run(struct llm_engine *e, const struct llm_request *r, int n,
                                             const struct llm_detok *detok)
{
	struct llm_mem_plan p;
	llm_engine_plan(e, &p);
	struct llm_sched_opts o = { .max_running = p.max_seqs, .max_batch_tokens = p.max_batch_tokens };
	if (detok)
		o.detok = *detok;
	struct llm_sched *s;
	LLM_TRY(llm_sched_open(&s, e, &o));
	enum llm_status st = LLM_OK;
	for (int i = 0; !st && i < n; i++)
		st = llm_sched_add(s, &r[i], NULL);
	if (!st)
		st = llm_sched_run(s);
	llm_sched_close(s);
	return st;
}

#endif
