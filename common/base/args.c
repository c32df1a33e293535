/* common/base/args.c: table-driven option parsing, --help, strict numbers, the
 * tools' interrupt flag. */
#define _GNU_SOURCE
#include "args.h"

#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

volatile sig_atomic_t llm_interrupt;

/* Async-signal-safe: a flag, or _exit on the second signal. */
static void on_signal(int sig)
{
	if (llm_interrupt)
		_exit(128 + sig);
	llm_interrupt = sig;
}

void llm_signals_catch(void)
{
	struct sigaction sa = { .sa_handler = on_signal, .sa_flags = SA_RESTART };
	sigemptyset(&sa.sa_mask);
	sigaction(SIGINT, &sa, NULL);   /* cannot fail: valid signals, a valid action */
	sigaction(SIGTERM, &sa, NULL);
}

enum llm_status llm_parse_int(const char *s, int64_t min, int64_t max, int64_t *out)
{
	char *end;
	errno = 0;
	long long v = strtoll(s, &end, 10);
	if (!*s || *end || errno)
		return llm_fail(LLM_ERR_USAGE, "'%s' is not an integer", s);
	if ((min || max) && (v < min || v > max))
		return llm_fail(LLM_ERR_USAGE, "%lld is out of range [%lld, %lld]", v,
		                (long long)min, (long long)max);
	*out = v;
	return LLM_OK;
}

enum llm_status llm_parse_float(const char *s, double *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (!*s || *end || errno || !isfinite(v))
		return llm_fail(LLM_ERR_USAGE, "'%s' is not a number", s);
	*out = v;
	return LLM_OK;
}

enum llm_status llm_parse_size(const char *s, size_t *out)
{
	char *end;
	errno = 0;
	double v = strtod(s, &end);
	if (end == s || errno || !isfinite(v) || v < 0)
		return llm_fail(LLM_ERR_USAGE, "'%s' is not a size", s);
	static const struct { const char *suf; double mul; } units[] = {
		{ "", 1 }, { "B", 1 }, { "K", 1e3 }, { "KB", 1e3 }, { "KiB", 1024.0 },
		{ "M", 1e6 }, { "MB", 1e6 }, { "MiB", 1048576.0 }, { "G", 1e9 }, { "GB", 1e9 },
		{ "GiB", 1073741824.0 }, { "T", 1e12 }, { "TB", 1e12 }, { "TiB", 1099511627776.0 },
	};
	for (size_t i = 0; i < sizeof units / sizeof *units; i++)
		if (!strcasecmp(end, units[i].suf)) {
			*out = (size_t)(v * units[i].mul);
			return LLM_OK;
		}
	return llm_fail(LLM_ERR_USAGE, "'%s': unknown size suffix '%s'", s, end);
}

/* The destinations of the options the last llm_args_parse set (a tool
 * parses once). */
static const void *given[64];
static size_t n_given;

int llm_args_given(const void *dest)
{
	for (size_t i = 0; i < n_given; i++)
		if (given[i] == dest)
			return 1;
	return 0;
}

static void print_default(const struct llm_opt *o, FILE *out)
{
	if (!o->dest)
		return;
	switch (o->type) {
	case LLM_OPT_STR: {
		const char *v = *(const char **)o->dest;
		if (v)
			fprintf(out, " (default: %s)", v);
		break;
	}
	case LLM_OPT_INT: fprintf(out, " (default: %lld)", (long long)*(int64_t *)o->dest); break;
	case LLM_OPT_FLOAT: fprintf(out, " (default: %g)", *(double *)o->dest); break;
	case LLM_OPT_SIZE: {
		size_t v = *(size_t *)o->dest;
		if (v)
			fprintf(out, " (default: %zu)", v);
		break;
	}
	default: break;
	}
}

void llm_args_help(const struct llm_cli *cli, FILE *out)
{
	fprintf(out, "usage: %s\n\n%s\n\noptions:\n", cli->usage, cli->summary);
	for (int i = 0; i < cli->n_opts; i++) {
		const struct llm_opt *o = &cli->opts[i];
		char left[96];
		int n = 0;
		if (o->short_name)
			n = snprintf(left, sizeof left, "-%c, ", o->short_name);
		else
			n = snprintf(left, sizeof left, "    ");
		snprintf(left + n, sizeof left - (size_t)n, "--%s%s%s", o->long_name,
		         o->metavar ? " " : "", o->metavar ? o->metavar : "");
		fprintf(out, "  %-28s %s", left, o->help);
		print_default(o, out);
		fputc('\n', out);
	}
	fprintf(out, "  %-28s %s\n", "-v, --verbose", "more output on stderr (repeat for more)");
	fprintf(out, "  %-28s %s\n", "-q, --quiet", "errors only on stderr");
	fprintf(out, "  %-28s %s\n", "-h, --help", "print this help and exit");
	fprintf(out, "  %-28s %s\n", "    --version", "print the version and exit");
	if (cli->example)
		fprintf(out, "\nExample:\n  %s\n", cli->example);
}

int llm_args_usage_error(const struct llm_cli *cli, const char *fmt, ...)
{
	(void)cli;
	va_list ap;
	fprintf(stderr, "%s: ", llm_progname());
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\ntry '%s --help'\n", llm_progname());
	return LLM_ARGS_ERROR;
}

enum { OPT_VERSION = 1000, OPT_BASE = 2000 };

int llm_args_parse(int argc, char **argv, const struct llm_cli *cli,
                   const char **pos, int *n_pos)
{
	llm_set_progname(argv[0]);
	n_given = 0;
	int n = cli->n_opts;
	struct option *lo = calloc((size_t)n + 5, sizeof *lo);
	char shorts[256] = "+hvq";
	size_t sl = strlen(shorts);
	if (!lo)
		return llm_args_usage_error(cli, "out of memory");
	for (int i = 0; i < n; i++) {
		const struct llm_opt *o = &cli->opts[i];
		int arg = o->type == LLM_OPT_FLAG || o->type == LLM_OPT_COUNT ? no_argument : required_argument;
		lo[i] = (struct option){ o->long_name, arg, NULL, OPT_BASE + i };
		if (o->short_name && sl + 3 < sizeof shorts) {
			shorts[sl++] = o->short_name;
			if (arg == required_argument)
				shorts[sl++] = ':';
			shorts[sl] = 0;
		}
	}
	lo[n + 0] = (struct option){ "help", no_argument, NULL, 'h' };
	lo[n + 1] = (struct option){ "verbose", no_argument, NULL, 'v' };
	lo[n + 2] = (struct option){ "quiet", no_argument, NULL, 'q' };
	lo[n + 3] = (struct option){ "version", no_argument, NULL, OPT_VERSION };
	int rc = LLM_ARGS_OK, c;
	opterr = 0;
	optind = 1;
	/* Positional arguments may come anywhere: collect them as we go. */
	*n_pos = 0;
	while (rc == LLM_ARGS_OK && optind < argc) {
		if (argv[optind][0] != '-' || !strcmp(argv[optind], "-")) {
			if (*n_pos >= 16) {
				rc = llm_args_usage_error(cli, "too many arguments");
				break;
			}
			pos[(*n_pos)++] = argv[optind++];
			continue;
		}
		if (!strcmp(argv[optind], "--")) {
			for (optind++; optind < argc && *n_pos < 16; optind++)
				pos[(*n_pos)++] = argv[optind];
			break;
		}
		c = getopt_long(argc, argv, shorts, lo, NULL);
		if (c == -1)
			break;
		const struct llm_opt *o = NULL;
		if (c >= OPT_BASE)
			o = &cli->opts[c - OPT_BASE];
		else
			for (int i = 0; i < n; i++)
				if (cli->opts[i].short_name == c && c)
					o = &cli->opts[i];
		if (c == 'h' && !o) {
			llm_args_help(cli, stdout);
			rc = LLM_ARGS_EXIT;
		} else if (c == 'v' && !o) {
			llm_log_level++;
		} else if (c == 'q' && !o) {
			llm_log_level = 0;
		} else if (c == OPT_VERSION) {
			printf("%s %s\n", llm_progname(), LLM_VERSION);
			rc = LLM_ARGS_EXIT;
		} else if (c == '?' || c == ':' || !o) {
			if (optopt && optopt < OPT_BASE && optopt != '?')
				rc = llm_args_usage_error(cli, "option -%c: %s", optopt,
				                          strchr(shorts, optopt) ? "needs a value" : "unknown option");
			else
				rc = llm_args_usage_error(cli, "%s: %s", argv[optind - 1],
				                          c == ':' ? "needs a value" : "unknown option");
		} else {
			enum llm_status s = LLM_OK;
			switch (o->type) {
			case LLM_OPT_FLAG: *(int *)o->dest = 1; break;
			case LLM_OPT_COUNT: (*(int *)o->dest)++; break;
			case LLM_OPT_STR: *(const char **)o->dest = optarg; break;
			case LLM_OPT_LIST: {
				struct llm_strlist *l = o->dest;
				if (l->n >= 64)
					s = llm_fail(LLM_ERR_USAGE, "given too many times");
				else
					l->v[l->n++] = optarg;
				break;
			}
			case LLM_OPT_INT: s = llm_parse_int(optarg, o->min, o->max, o->dest); break;
			case LLM_OPT_FLOAT: {
				double v;
				s = llm_parse_float(optarg, &v);
				if (!s && (o->fmin != 0 || o->fmax != 0) && (v < o->fmin || v > o->fmax))
					s = llm_fail(LLM_ERR_USAGE, "%g is out of range [%g, %g]", v, o->fmin, o->fmax);
				if (!s)
					*(double *)o->dest = v;
				break;
			}
			case LLM_OPT_SIZE: s = llm_parse_size(optarg, o->dest); break;
			}
			if (s)
				rc = llm_args_usage_error(cli, "--%s: %s", o->long_name, llm_errmsg());
			else if (n_given < sizeof given / sizeof *given)
				given[n_given++] = o->dest;
		}
	}
	free(lo);
	if (rc == LLM_ARGS_OK && *n_pos < cli->min_pos)
		rc = llm_args_usage_error(cli, "missing argument (usage: %s)", cli->usage);
	else if (rc == LLM_ARGS_OK && cli->max_pos >= 0 && *n_pos > cli->max_pos)
		rc = llm_args_usage_error(cli, "unexpected argument '%s'", pos[cli->max_pos]);
	return rc;
}
