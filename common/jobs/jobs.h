/* common/jobs/jobs.h: offline generation jobs, llm-generate's work: prompts
 * read from text or JSONL lines (each through the request parser,
 * request.h, over the flags' defaults), run together through the one
 * scheduler, and their results collected and written as JSON.
 *
 * A job's output does not depend on the other jobs of its batch (batch
 * invariance; each job has its own seed). */
#ifndef LLM_JOBS_H
#define LLM_JOBS_H

#include "request.h"
#include "scheduler.h"
#include "buf.h"

#include <signal.h>

struct llm_job {
	int32_t *prompt;            /* (n_prompt) */
	size_t n_prompt;
	struct llm_sample_params p; /* stop strings and biases: the request's or the env's */
	char *stop_own[LLM_MAX_STOP];
	struct llm_logit_bias *bias_own;
	/* the result */
	int32_t *ids;               /* (n) generated ids */
	float *logprob;             /* (n) */
	struct llm_logprob *top;    /* (n, p.n_logprobs) best first; id -1 past the vocabulary */
	size_t n, cap_ids, cap_lp, cap_top;
	struct llm_buf text;
	enum llm_finish finish;
	char error[256];            /* finish LLM_FINISH_ERROR: why */
	double t_submit, t_first, t_end;
	/* optional: each event as it comes (streaming), before it is kept */
	void (*on_event)(void *user, struct llm_job *j, const struct llm_token_event *ev);
	void *user;
	int echo;                   /* text starts with the prompt's, not yet handed to on_event */
	int id;                     /* the scheduler's request id (llm_jobs_run) */
	int tool_fmt;               /* a line with tools: enum llm_tool_format of the template,
	                             * the text parsed into tool_calls in llm_job_json; 0: none */
	char **tool_names;          /* (n_tools) owned */
	int n_tools;
	int adapter;                /* the engine's LoRA slot (request.h's adapter); 0: the base */
};

/* The jobs of BUF (LEN bytes, modified): one per non-empty line, a JSON
 * object (request.h's JSONL kind) or plain text; ENV holds the flags'
 * defaults, and with CLOCK_SEED each line's default seed comes from the
 * clock and the line number. Errors name the line ("stdin: line 3:
 * temperature: ..."). *JOBS is malloc'd (free with llm_jobs_free). */
enum llm_status llm_jobs_read(char *buf, size_t len, const struct llm_api_env *env, int clock_seed,
                              struct llm_job **jobs, size_t *n);
/* One job of prompt TEXT (tokenized with special tokens), or with CHAT of
 * TEXT as the user message (SYSTEM's message first when not NULL) through
 * the chat template. */
enum llm_status llm_job_text(struct llm_job *j, const char *text, int chat, const char *system,
                             const struct llm_api_env *env);
/* llm-generate's --lora: ENV->adapters the names of the N adapter SPECS
 * ("NAME=DIR" or "DIR", the engine's slots 1 .. N in order,
 * llm_lora_spec_split), model_name MODEL's base name (a line's "model"
 * picks the base by it, an adapter by its name, nothing else), and the
 * first adapter the default of lines that name none (as one --lora
 * applies to every line). N 0: nothing changes. Freed by
 * llm_api_env_guide_free. */
enum llm_status llm_jobs_env_lora(struct llm_api_env *env, const char *const *specs, int n, const char *model);
/* Echo: start each job's text with its prompt's (decoded with TK, special
 * tokens left out; ids TK lacks add none), so that text is the prompt's
 * followed by the continuation's, as llama.cpp prints it; on_event gets it
 * first, as an event of its own (token -1, index 0, no finish).
 * LLM_ERR_USAGE without TK, LLM_ERR_NOMEM. */
enum llm_status llm_jobs_echo(struct llm_job *jobs, size_t n, const struct llm_tokenizer *tk);
/* The KV positions the longest of the N JOBS needs: its prompt and
 * max_tokens (INT64_MAX when a job's max_tokens is 0, up to the context),
 * for sizing the cache (memplan.h's llm_kv_size_generate); 0 when N is 0. */
int64_t llm_jobs_kv_need(const struct llm_job *jobs, size_t n);
/* Where llm_jobs_run hands results, and when it stops. */
struct llm_jobs_out {
	void (*done)(void *user, size_t i);    /* may be NULL: job i finished, in input order */
	void *user;
	const volatile sig_atomic_t *stop;     /* may be NULL; a signal handler's flag (llm_interrupt) */
	int gaps;                              /* after a stop: also the finished jobs past an unfinished one */
	size_t n_done;                         /* out: the jobs handed to DONE */
};
/* Queue the N jobs on S (with NUMBERED, errors name "prompt K") and run S
 * until every job has finished. After each step O->done gets each job i,
 * in input order, once jobs 0..i have all finished: results can be
 * written in input order as they come. When *O->stop turns nonzero
 * (checked between steps), every job not finished is cancelled (its
 * blocks freed at the next step) and keeps finish LLM_FINISH_NONE; with
 * O->gaps DONE then gets, in input order, the finished jobs past the first
 * unfinished one (a caller whose lines carry no index stops at the gap).
 * A job that ended with LLM_FINISH_ERROR, when its turn to be handed on
 * comes, makes it fail (LLM_ERR_RANGE with that job's reason). */
enum llm_status llm_jobs_run(struct llm_sched *s, struct llm_job *jobs, size_t n, int numbered,
                             struct llm_jobs_out *o);
/* A finished job as one JSON line (no newline): index, text, prompt_ids,
 * ids, finish_reason, logprobs and top_logprobs when asked, timings.
 * Malloc'd; NULL when out of memory. */
char *llm_job_json(const struct llm_job *j, size_t index);
/* A finished job's one-line summary for -v. */
void llm_job_summary(const struct llm_job *j, size_t index, char *out, size_t n);
void llm_job_free(struct llm_job *j);
void llm_jobs_free(struct llm_job *jobs, size_t n);

#endif
