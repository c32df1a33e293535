/* tests/test_check.c: the failure report of the C tests' harness
 * (tests/lib/check.c), the one a device session reads to fix a kernel
 * without a second call (tests/test_cuda.c, bench/gpu.sh step test_cuda):
 * a failing comparison's line names the comparison, the first differing
 * element with expected and got, how many are out of the bounds, and the
 * largest error; the aggregate check after it carries the same first
 * failure; a note belongs to the next check only.
 *
 * "test_check demo" makes the failures; this program runs it as a child
 * and checks its lines, so that its own checks pass. */
#define _GNU_SOURCE
#include "check.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static int demo(void)
{
	float ref[6] = { 1, 2, 3, 4, 5, 6 }, got[6] = { 1, 2, 3.5f, 4, 5, 9 };
	check_close("demo op 2x3", got, ref, 6, 1e-6, 1e-5);
	check(0, "demo group");
	check_note("matmul demo_cfg E4M3 200x256 M 17: first bad [3, 41] expected 1 got 2");
	check(1, "demo pass");
	check(0, "demo bare failure");
	float nan_got[3] = { 1, NAN, 3 }, nan_ref[3] = { 1, 2, 3 };
	check_close("demo nan", nan_got, nan_ref, 3, 0, 0);
	check_close("demo equal", ref, ref, 6, 0, 0);
	return check_done();
}

/* The line of the child's output that starts with PREFIX (NULL if none). */
static const char *find(char *const *lines, int n, const char *prefix)
{
	for (int i = 0; i < n; i++)
		if (!strncmp(lines[i], prefix, strlen(prefix)))
			return lines[i];
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "demo"))
		return demo();
	char cmd[4200];
	snprintf(cmd, sizeof cmd, "'%s' demo", argv[0]);
	FILE *p = popen(cmd, "r");
	if (!p) {
		check(0, "run %s demo", argv[0]);
		return check_done();
	}
	char *lines[64], buf[2048];
	int n = 0;
	while (n < 64 && fgets(buf, sizeof buf, p)) {
		buf[strcspn(buf, "\n")] = 0;
		lines[n++] = strdup(buf);
	}
	int st = pclose(p);
	check(WIFEXITED(st) && WEXITSTATUS(st) == 1, "the demo's failures make its exit status 1 (status %d)", st);

	const char *l = find(lines, n, "not ok - demo op 2x3 ");
	check(l && strstr(l, "(n=6, max abs 3, max rel 0.5) -- demo op 2x3: first bad [2] expected 3 got 3.5 "
	                     "(abs 0.5, rel 0.167); 2 of 6 outside atol 1e-06 rtol 1e-05; max abs 3 at [5] "
	                     "(expected 6 got 9), max rel 0.5"),
	      "a failing comparison's line: first bad index, expected, got, errors, count, max abs where (%s)",
	      l ? l : "no line");
	l = find(lines, n, "not ok - demo group");
	check(l && strstr(l, " -- demo op 2x3: first bad [2] expected 3 got 3.5"),
	      "the aggregate check after it carries that first failure (%s)", l ? l : "no line");
	l = find(lines, n, "ok - demo pass");
	check(l && !strstr(l, " -- "), "a passing check carries no note (%s)", l ? l : "no line");
	l = find(lines, n, "not ok - demo bare failure");
	check(l && !strcmp(l, "not ok - demo bare failure"),
	      "a note belongs to the next check only: a later failure carries none (%s)", l ? l : "no line");
	l = find(lines, n, "not ok - demo nan ");
	check(l && strstr(l, "first bad [1] expected 2 got nan") && strstr(l, "1 of 3 outside"),
	      "a NaN is a failure, named at its index (%s)", l ? l : "no line");
	l = find(lines, n, "ok - demo equal ");
	check(l && strstr(l, "(n=6, max abs 0, max rel 0)") && !strstr(l, " -- "),
	      "equal arrays pass with zero errors (%s)", l ? l : "no line");
	check(find(lines, n, "#   [2] expected 3 got 3.5") != NULL,
	      "the diagnostics list the first pairs as expected/got");
	char d[256];
	float a[2] = { 1, 2 }, b[2] = { 1, 2.5f };
	check(!check_close_detail(d, sizeof d, "x", a, a, 2, 0, 0) && check_close_detail(d, sizeof d, "x", b, a, 2, 0.1, 0)
	      && !strncmp(d, "x: first bad [1] expected 2 got 2.5", 35),
	      "check_close_detail: 0 within the bounds, else the detail (%s)", d);
	for (int i = 0; i < n; i++)
		free(lines[i]);
	return check_done();
}
