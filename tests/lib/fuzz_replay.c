/* tests/lib/fuzz_replay.c: a libFuzzer harness (tests/fuzz/NAME.c) run
 * without libFuzzer, so the kept corpora run in make test with the suite's
 * compiler (and in make asan with its sanitizers). Linked with one
 * harness as build/tests/fuzz/NAME:
 *   NAME FILE|DIR...
 * runs LLVMFuzzerInitialize when the harness has one, then every FILE and
 * every file of every DIR once through LLVMFuzzerTestOneInput. A harness
 * stops the process on a broken invariant; otherwise this prints the
 * number of inputs and exits 0 (1 when an input could not be read). */
#define _POSIX_C_SOURCE 200809L
#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
__attribute__((weak)) int LLVMFuzzerInitialize(int *argc, char ***argv);

static int run_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	if (!f) {
		fprintf(stderr, "%s: cannot open\n", path);
		return -1;
	}
	size_t cap = 4096, n = 0, got;
	uint8_t *buf = malloc(cap);
	while (buf && (got = fread(buf + n, 1, cap - n, f)) > 0) {
		n += got;
		if (n == cap) {
			uint8_t *nb = realloc(buf, cap *= 2);
			if (!nb)
				free(buf);
			buf = nb;
		}
	}
	int err = ferror(f) || !buf;
	fclose(f);
	if (err) {
		free(buf);
		fprintf(stderr, "%s: read error\n", path);
		return -1;
	}
	/* an exact-size copy, so ASan sees a read past the input */
	uint8_t *in = malloc(n ? n : 1);
	memcpy(in, buf, n);
	free(buf);
	LLVMFuzzerTestOneInput(in, n);
	free(in);
	return 0;
}

static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s FILE|DIR...\n", argv[0]);
		return 2;
	}
	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	long runs = 0, bad = 0;
	for (int i = 1; i < argc; i++) {
		struct stat st;
		if (stat(argv[i], &st) == 0 && S_ISDIR(st.st_mode)) {
			DIR *d = opendir(argv[i]);
			if (!d) {
				fprintf(stderr, "%s: cannot open\n", argv[i]);
				bad++;
				continue;
			}
			char **names = NULL;
			size_t nn = 0, cn = 0;
			struct dirent *e;
			while ((e = readdir(d))) {
				if (e->d_name[0] == '.')
					continue;
				if (nn == cn) {
					cn = cn ? 2 * cn : 64;
					char **p = realloc(names, cn * sizeof *names);
					if (!p) {
						fprintf(stderr, "%s: out of memory\n", argv[i]);
						return 1;
					}
					names = p;
				}
				if (!(names[nn++] = strdup(e->d_name))) {
					fprintf(stderr, "%s: out of memory\n", argv[i]);
					return 1;
				}
			}
			closedir(d);
			qsort(names, nn, sizeof *names, cmp);   /* the same order every run */
			for (size_t k = 0; k < nn; k++) {
				char path[4096];
				snprintf(path, sizeof path, "%s/%s", argv[i], names[k]);
				if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
					if (run_file(path))
						bad++;
					else
						runs++;
				}
				free(names[k]);
			}
			free(names);
		} else if (run_file(argv[i])) {
			bad++;
		} else {
			runs++;
		}
	}
	printf("%ld inputs\n", runs);
	return bad ? 1 : 0;
}
