/* common/base/args.h: table-driven command-line parsing for the tools.
 *
 * One table per tool drives getopt_long, --help and the defaults shown.
 * Values are validated, never clamped: "-n 12x" or "-n -1" (min 0) is a
 * usage error. */
#ifndef LLM_ARGS_H
#define LLM_ARGS_H

#include <signal.h>
#include <stdio.h>
#include "status.h"

enum llm_opt_type {
	LLM_OPT_FLAG,    /* int, set to 1 */
	LLM_OPT_COUNT,   /* int, incremented (-v -v) */
	LLM_OPT_STR,     /* const char * */
	LLM_OPT_LIST,    /* struct llm_strlist: repeatable string */
	LLM_OPT_INT,     /* int64_t in [min, max] */
	LLM_OPT_FLOAT,   /* double in [fmin, fmax] */
	LLM_OPT_SIZE,    /* size_t, with optional K/M/G/KB/MB/GB/KiB/MiB/GiB suffix */
};

struct llm_strlist { int n; const char *v[64]; };

struct llm_opt {
	char short_name;         /* 0: none */
	const char *long_name;
	const char *metavar;     /* NULL for flags */
	enum llm_opt_type type;
	void *dest;
	const char *help;        /* the default is appended from *dest when set */
	int64_t min, max;        /* LLM_OPT_INT (both 0: any) */
	double fmin, fmax;       /* LLM_OPT_FLOAT (both 0: any) */
};

/* Table entries with designated initializers (no missing-field warnings). */
#define LLM_FLAG(s, l, d, h)  { .short_name = (s), .long_name = (l), .type = LLM_OPT_FLAG, .dest = (d), .help = (h) }
#define LLM_COUNT(s, l, d, h) { .short_name = (s), .long_name = (l), .type = LLM_OPT_COUNT, .dest = (d), .help = (h) }
#define LLM_STR(s, l, m, d, h) { .short_name = (s), .long_name = (l), .metavar = (m), .type = LLM_OPT_STR, .dest = (d), .help = (h) }
#define LLM_LIST(s, l, m, d, h) { .short_name = (s), .long_name = (l), .metavar = (m), .type = LLM_OPT_LIST, .dest = (d), .help = (h) }
#define LLM_INT(s, l, m, d, h, lo, hi) { .short_name = (s), .long_name = (l), .metavar = (m), .type = LLM_OPT_INT, \
	.dest = (d), .help = (h), .min = (lo), .max = (hi) }
#define LLM_FLOAT(s, l, m, d, h, lo, hi) { .short_name = (s), .long_name = (l), .metavar = (m), .type = LLM_OPT_FLOAT, \
	.dest = (d), .help = (h), .fmin = (lo), .fmax = (hi) }
#define LLM_SIZE(s, l, m, d, h) { .short_name = (s), .long_name = (l), .metavar = (m), .type = LLM_OPT_SIZE, .dest = (d), .help = (h) }

struct llm_cli {
	const char *usage;       /* "llm-quantize [options] IN OUT" */
	const char *summary;     /* one sentence */
	const char *example;     /* one Example: line */
	const struct llm_opt *opts;
	int n_opts;
	int min_pos, max_pos;    /* positional argument counts (max -1: any) */
};

enum { LLM_ARGS_OK = 0, LLM_ARGS_EXIT = 1, LLM_ARGS_ERROR = 2 };

/* Parse ARGV. Positional arguments are returned in POS (at most 16).
 * Handles -h/--help (prints help to stdout, LLM_ARGS_EXIT), --version, -q and
 * -v (setting llm_log_level). On misuse prints one line plus
 * "try 'TOOL --help'" to stderr and returns LLM_ARGS_ERROR. */
int llm_args_parse(int argc, char **argv, const struct llm_cli *cli,
                   const char **pos, int *n_pos);
void llm_args_help(const struct llm_cli *cli, FILE *out);
/* Whether the last llm_args_parse set the option whose destination is DEST
 * from the command line (1), or left its default (0). */
int llm_args_given(const void *dest);
/* Print a usage error ("prog: msg" + "try ...") and return LLM_ARGS_ERROR. */
int llm_args_usage_error(const struct llm_cli *cli, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

/* Strict number parsing: the whole string, in range. */
enum llm_status llm_parse_int(const char *s, int64_t min, int64_t max, int64_t *out);
enum llm_status llm_parse_float(const char *s, double *out);
enum llm_status llm_parse_size(const char *s, size_t *out);

/* For a tool's driving loop: llm_signals_catch() makes the first SIGINT or
 * SIGTERM set llm_interrupt to its number (the loop checks it between
 * steps, finishes what it can and exits 128 + it); a second one ends the
 * process at once with 128 + its number. Reads in progress restart
 * (SA_RESTART). */
extern volatile sig_atomic_t llm_interrupt;
void llm_signals_catch(void);

#define LLM_VERSION "0.1.0"

#endif
