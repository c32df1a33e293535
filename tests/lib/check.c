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

static void line(const char *status, const char *fmt, va_list ap, const char *suffix)
{
	printf("%s - ", status);
	vprintf(fmt, ap);
	printf("%s\n", suffix ? suffix : "");
	fflush(stdout);
}

int check(int cond, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	line(cond ? "ok" : "not ok", fmt, ap, NULL);
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

int check_close(const char *name, const float *got, const float *ref, size_t n,
                double atol, double rtol)
{
	double max_abs = 0, max_rel = 0;
	size_t worst = 0, bad = 0;
	for (size_t i = 0; i < n; i++) {
		double g = got[i], r = ref[i], d = fabs(g - r);
		int nan = isnan(g) || isnan(r);
		if (nan || d > atol + rtol * fabs(r)) {
			if (!bad)
				worst = i;
			bad++;
		}
		if (d > max_abs || nan) {
			max_abs = nan ? INFINITY : d;
			if (!bad)
				worst = i;
		}
		if (r != 0 && d / fabs(r) > max_rel)
			max_rel = d / fabs(r);
	}
	if (bad) {
		check_diag("%s: %zu of %zu outside atol %g rtol %g; max abs %g, max rel %g, worst [%zu] got %.9g ref %.9g",
		           name, bad, n, atol, rtol, max_abs, max_rel, worst, got[worst], ref[worst]);
		for (size_t i = 0; i < n && i < 4; i++)
			check_diag("  [%zu] got %.9g ref %.9g", i, got[i], ref[i]);
	}
	return check(!bad, "%s (n=%zu, max abs %.3g, max rel %.3g)", name, n, max_abs, max_rel);
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
