/* common/base/status.c: per-thread error messages, logging, program name. */
#define _POSIX_C_SOURCE 200809L
#include "status.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static _Thread_local char errbuf[1024];
int llm_log_level = 1;
static const char *progname = "llm";

enum llm_status llm_fail(enum llm_status s, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(errbuf, sizeof errbuf, fmt, ap);
	va_end(ap);
	for (char *p = errbuf; *p; p++)          /* keep it one line */
		if (*p == '\n' || *p == '\r')
			*p = ' ';
	return s;
}

enum llm_status llm_fail_prefix(enum llm_status s, const char *fmt, ...)
{
	char pre[512], joined[sizeof pre + sizeof errbuf + 2];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(pre, sizeof pre, fmt, ap);
	va_end(ap);
	snprintf(joined, sizeof joined, "%s: %s", pre, errbuf);
	memcpy(errbuf, joined, sizeof errbuf - 1);
	errbuf[sizeof errbuf - 1] = 0;
	return s;
}

const char *llm_errmsg(void) { return errbuf; }

const char *llm_status_name(enum llm_status s)
{
	static const char *names[] = {
		"ok", "i/o error", "format error", "usage error", "out of memory",
		"unsupported", "exists", "out of range", "cuda error",
		"communication error", "internal error",
	};
	return (unsigned)s < sizeof names / sizeof *names ? names[s] : "unknown";
}

void llm_log(int level, const char *fmt, ...)
{
	if (level > llm_log_level)
		return;
	va_list ap;
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
}

void llm_set_progname(const char *argv0)
{
	const char *s = strrchr(argv0, '/');
	progname = s ? s + 1 : argv0;
}

const char *llm_progname(void) { return progname; }

void llm_die(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "%s: ", progname);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	exit(1);
}

void llm_warn(const char *fmt, ...)
{
	if (llm_log_level < 1)
		return;
	va_list ap;
	fprintf(stderr, "%s: warning: ", progname);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

double llm_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}
