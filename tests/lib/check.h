/* tests/lib/check.h: the C side of the test harness.
 *
 * Each test program prints one TAP line per check without numbers
 * ("ok - name", "not ok - name", "ok - name # SKIP reason"); tests/run
 * numbers them, counts them and prints the closing summary. Diagnostics go
 * to stdout as "# ..." lines. A program returns check_done(). */
#ifndef LLM_TEST_CHECK_H
#define LLM_TEST_CHECK_H

#include <stddef.h>
#include <stdio.h>

/* Record one check; prints ok/not ok. Returns cond. */
int check(int cond, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void check_skip(const char *reason, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void check_diag(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The detail of a failure (op, shape, first differing element, expected
 * and got) for the next check line: when that check fails, its line ends
 * " -- NOTE", so the failing line alone says what to fix. The first note
 * since the last check() wins; every check() clears it, pass or fail. */
void check_note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* One check over N floats: fails when |got - ref| > atol + rtol * |ref| or
 * either is NaN. Its line gives max abs/rel error; a failing one ends
 * " -- NAME: first bad [i] expected E got G (abs, rel), K of N outside
 * atol/rtol, max abs at [j]" (check_close_detail), which also becomes the
 * note of the next check() (the aggregate check of a group of comparisons
 * then carries its first failure); diagnostics list the first pairs. */
int check_close(const char *name, const float *got, const float *ref, size_t n,
                double atol, double rtol);
/* The failure detail check_close writes, into BUF (SIZE bytes); 0 when
 * every element is within the bounds. */
int check_close_detail(char *buf, size_t size, const char *name, const float *got, const float *ref, size_t n,
                       double atol, double rtol);
/* 0 when every check passed. */
int check_done(void);

/* $LLM_TEST_MODELS (default ../shared/models) and $LLM_TEST_REF
 * (default ../shared/reference), relative to the project root; the result
 * is NULL when the directory is absent. */
const char *test_models_dir(void);
const char *test_ref_dir(void);
/* A fresh scratch directory under tests/tmp/, removed by tests/run. */
const char *test_tmpdir(void);
/* Read a whole file (NUL-terminated); NULL if absent. */
char *test_read_file(const char *path, size_t *len);

#endif
