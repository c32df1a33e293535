/* common/base/progress.h: progress and the closing summary of long work
 * (writing checkpoints, benchmark runs), on a stream the tool gives.
 *
 * The library never prints on its own: a tool that wants progress fills a
 * struct llm_progress with llm_progress_init(&p, stderr, ...) and passes its
 * address in the options of the work; a NULL pointer, or a progress object
 * whose stream is NULL (--quiet), makes every call here a no-op.
 *
 * The work counts as it goes (bytes, items such as tensors or requests) and
 * calls llm_progress_tick(), which costs one clock read until a line is due:
 * on a terminal one line redrawn in place ("\r") at most every 0.25 s, with a
 * bar; otherwise one plain line every 5 s. LLM_PROGRESS_INTERVAL (seconds,
 * >= 0; 0: a line at every tick) overrides both, so tests can force lines.
 * The tool ends with one summary line (llm_progress_end). Not thread-safe:
 * one thread ticks (the counters may be copied in from workers under their
 * own lock). */
#ifndef LLM_PROGRESS_H
#define LLM_PROGRESS_H

#include <stdint.h>
#include <stdio.h>
#include "status.h"

struct llm_progress {
	FILE *out;               /* the tool's stream (stderr); NULL: silent */
	int tty;                 /* out is a terminal: one line redrawn in place */
	double interval;         /* seconds between lines */
	double t0, last;         /* llm_now() at init and at the last line */
	int shown;               /* characters of the line on screen (tty) */
	const char *noun;        /* what items are: "tensors", "requests" */
	char note[80];           /* what is being done now: "pp512", "rate 2 req/s" */
	/* counters kept by the work; a total of 0 is unknown */
	uint64_t items, n_items; /* done, total */
	uint64_t bytes, n_bytes; /* written, to write (0: not counting bytes) */
	uint64_t bytes_in, items_in;  /* what was read (for the summary) */
	uint64_t files;          /* files written (shards, ranks) */
};

/* Start the clock. OUT NULL: silent. Reads LLM_PROGRESS_INTERVAL; a value
 * that is not a number of seconds >= 0 is LLM_ERR_USAGE (named). */
enum llm_status llm_progress_init(struct llm_progress *p, FILE *out);

/* A progress line when one is due (see above); no-op when P or its stream
 * is NULL. */
void llm_progress_tick(struct llm_progress *p);

/* Clear the terminal line, before other output on the same stream. */
void llm_progress_clear(struct llm_progress *p);

/* Clear the terminal line and print "PROG: <fmt>" and a newline. */
void llm_progress_end(struct llm_progress *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The summary of writing a checkpoint to OUT: what was read and written
 * (sizes, tensors, files), the time since init and the write rate. */
void llm_progress_end_write(struct llm_progress *p, const char *out);

/* Seconds since llm_progress_init. */
double llm_progress_elapsed(const struct llm_progress *p);

/* BYTES in decimal units, one decimal below 100: "512 B", "14.2 kB",
 * "552 MB", "1.1 GB"; returns BUF (at least 16 bytes). */
const char *llm_progress_size(uint64_t bytes, char *buf);

#endif
