/* tests/lib/check.c: TAP output and comparisons for the C tests. */
#define _GNU_SOURCE
#include "check.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static int n_fail;
static char note[1024];         /* check_note: the next check's failure detail */

static void line(const char *status, const char *fmt, va_list ap, const char *suffix)
{
	printf("%s - ", status);
	vprintf(fmt, ap);
	printf("%s\n", suffix ? suffix : "");
	fflush(stdout);
}

void check_note(const char *fmt, ...)
{
	if (note[0])
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(note, sizeof note, fmt, ap);
	va_end(ap);
}

int check(int cond, const char *fmt, ...)
{
	char suf[sizeof note + 8] = "";
	if (!cond && note[0])
		snprintf(suf, sizeof suf, " -- %s", note);
	note[0] = 0;
	va_list ap;
	va_start(ap, fmt);
	line(cond ? "ok" : "not ok", fmt, ap, suf);
	va_end(ap);
	if (!cond)
		n_fail++;
	return cond;
}

void check_skip(const char *reason, const char *fmt, ...)
{
	char suf[512];
	snprintf(suf, sizeof suf, " # SKIP %s", reason);
	va_list ap;
	va_start(ap, fmt);
	line("ok", fmt, ap, suf);
	va_end(ap);
}

void check_diag(const char *fmt, ...)
{
	va_list ap;
	printf("# ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

/* |got - ref| against the bound, NaN on either side failing */
static int close_bad(double g, double r, double atol, double rtol)
{
	return isnan(g) || isnan(r) || fabs(g - r) > atol + rtol * fabs(r);
}

int check_close_detail(char *buf, size_t size, const char *name, const float *got, const float *ref, size_t n,
                       double atol, double rtol)
{
	double max_abs = 0, max_rel = 0;
	size_t first = n, at_max = 0, bad = 0;
	for (size_t i = 0; i < n; i++) {
		double g = got[i], r = ref[i], d = isnan(g) || isnan(r) ? INFINITY : fabs(g - r);
		if (close_bad(g, r, atol, rtol)) {
			if (!bad)
				first = i;
			bad++;
		}
		if (d > max_abs) {
			max_abs = d;
			at_max = i;
		}
		if (r != 0 && d / fabs(r) > max_rel)
			max_rel = d / fabs(r);
	}
	if (!bad)
		return 0;
	double e = fabs((double)got[first] - ref[first]);
	snprintf(buf, size, "%s: first bad [%zu] expected %.9g got %.9g (abs %.3g, rel %.3g); %zu of %zu outside "
	         "atol %g rtol %g; max abs %.3g at [%zu] (expected %.9g got %.9g), max rel %.3g",
	         name, first, ref[first], got[first], e, ref[first] != 0 ? e / fabs(ref[first]) : e, bad, n, atol, rtol,
	         max_abs, at_max, ref[at_max], got[at_max], max_rel);
	return 1;
}

int check_close(const char *name, const float *got, const float *ref, size_t n,
                double atol, double rtol)
{
	double max_abs = 0, max_rel = 0;
	for (size_t i = 0; i < n; i++) {
		double g = got[i], r = ref[i], d = isnan(g) || isnan(r) ? INFINITY : fabs(g - r);
		if (d > max_abs)
			max_abs = d;
		if (r != 0 && d / fabs(r) > max_rel)
			max_rel = d / fabs(r);
	}
	char detail[sizeof note];
	if (!check_close_detail(detail, sizeof detail, name, got, ref, n, atol, rtol)) {
		check(1, "%s (n=%zu, max abs %.3g, max rel %.3g)", name, n, max_abs, max_rel);
		return 1;
	}
	for (size_t i = 0; i < n && i < 4; i++)
		check_diag("  [%zu] expected %.9g got %.9g", i, ref[i], got[i]);
	/* this line carries the detail, and so does the next check() */
	char pending[sizeof note];
	snprintf(pending, sizeof pending, "%s", note);
	note[0] = 0;
	check_note("%s", detail);
	check(0, "%s (n=%zu, max abs %.3g, max rel %.3g)", name, n, max_abs, max_rel);
	check_note("%s", pending[0] ? pending : detail);
	return 0;
}

int check_done(void) { return n_fail ? 1 : 0; }

static const char *dir_or_null(const char *env, const char *def)
{
	const char *d = getenv(env);
	if (!d || !*d)
		d = def;
	struct stat st;
	return stat(d, &st) == 0 && S_ISDIR(st.st_mode) ? d : NULL;
}

const char *test_models_dir(void) { return dir_or_null("LLM_TEST_MODELS", "../shared/models"); }
const char *test_ref_dir(void) { return dir_or_null("LLM_TEST_REF", "../shared/reference"); }

const char *test_tmpdir(void)
{
	static char path[256];
	const char *env = getenv("TMPD");       /* set by tests/run, removed after */
	if (!path[0] && env && *env)
		snprintf(path, sizeof path, "%s", env);
	if (!path[0]) {
		mkdir("tests/tmp", 0755);
		snprintf(path, sizeof path, "tests/tmp/c.XXXXXX");
		if (!mkdtemp(path)) {
			perror("mkdtemp");
			exit(2);
		}
	}
	return path;
}

char *test_read_file(const char *path, size_t *len)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return NULL;
	fseek(f, 0, SEEK_END);
	long n = ftell(f);
	fseek(f, 0, SEEK_SET);
	char *buf = malloc((size_t)n + 1);
	if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
		free(buf);
		buf = NULL;
	}
	fclose(f);
	if (buf) {
		buf[n] = 0;
		if (len)
			*len = (size_t)n;
	}
	return buf;
}
