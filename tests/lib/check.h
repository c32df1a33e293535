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
/* One check over N floats: fails when |got - ref| > atol + rtol * |ref| or
 * either is NaN; prints max abs/rel error, worst index and the first pairs. */
int check_close(const char *name, const float *got, const float *ref, size_t n,
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
