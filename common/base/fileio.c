/* common/base/fileio.c: whole-file reads, atomic writes, tree removal. */
#define _GNU_SOURCE
#include "fileio.h"
#include "buf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

char *llm_strdup(const char *s)
{
	if (!s)
		return NULL;
	size_t n = strlen(s) + 1;
	char *d = malloc(n);
	if (d)
		memcpy(d, s, n);
	return d;
}

char *llm_path_join(const char *dir, const char *name)
{
	size_t n = strlen(dir) + strlen(name) + 2;
	char *p = malloc(n);
	if (p)
		snprintf(p, n, "%s/%s", dir, name);
	return p;
}

char *llm_path_trim(const char *path)
{
	char *p = llm_strdup(path);
	size_t n = p ? strlen(p) : 0;
	while (n > 1 && p[n - 1] == '/')
		p[--n] = 0;
	return p;
}

char *llm_path_dir(const char *path)
{
	char *p = llm_path_trim(path), *slash = p ? strrchr(p, '/') : NULL;
	if (p && !slash) {
		free(p);
		return llm_strdup(".");
	}
	if (slash)
		slash[slash == p] = 0;
	return p;
}

static enum llm_status read_fd(int fd, const char *path, char **buf, size_t *len);

enum llm_status llm_read_file(const char *path, char **buf, size_t *len)
{
	int fd = strcmp(path, "-") ? open(path, O_RDONLY | O_CLOEXEC) : 0;
	if (fd < 0)
		return llm_fail(LLM_ERR_IO, "%s: %s", path, strerror(errno));
	return read_fd(fd, path, buf, len);
}

int llm_open_regular(const char *path)
{
	/* O_NONBLOCK: opening a FIFO for reading would wait for a writer */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0) {
		llm_fail(LLM_ERR_IO, "%s: %s", path, strerror(errno));
		return -1;
	}
	struct stat st;
	if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
		close(fd);
		llm_fail(LLM_ERR_IO, "%s: not a regular file", path);
		return -1;
	}
	int fl = fcntl(fd, F_GETFL);
	if (fl != -1)
		fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
	return fd;
}

enum llm_status llm_read_regular_file(const char *path, char **buf, size_t *len)
{
	int fd = llm_open_regular(path);
	return fd < 0 ? LLM_ERR_IO : read_fd(fd, path, buf, len);
}

/* FD's bytes to the end (FD closed unless it is 0, standard input). */
static enum llm_status read_fd(int fd, const char *path, char **buf, size_t *len)
{
	struct llm_buf b = { 0 };
	struct stat st;
	size_t want = 1 << 16;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0)
		want = (size_t)st.st_size + 1;
	for (;;) {
		/* full (a regular file: at its end, or it grew): twice the room */
		if (b.len + 1 >= b.cap && llm_buf_reserve(&b, b.cap ? 2 * b.cap : want)) {
			llm_buf_free(&b);
			if (fd)
				close(fd);
			return llm_fail(LLM_ERR_NOMEM, "%s: out of memory", path);
		}
		ssize_t r = read(fd, b.p + b.len, b.cap - b.len - 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0) {
			int e = errno;
			llm_buf_free(&b);
			if (fd)
				close(fd);
			return llm_fail(LLM_ERR_IO, "%s: %s", path, strerror(e));
		}
		if (r == 0)
			break;
		b.len += (size_t)r;
	}
	if (fd)
		close(fd);
	b.p[b.len] = 0;
	*buf = b.p;
	*len = b.len;
	return LLM_OK;
}

enum llm_status llm_write_all(int fd, const void *data, size_t len, const char *what)
{
	const char *p = data;
	while (len) {
		ssize_t w = write(fd, p, len > (1u << 30) ? (1u << 30) : len);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return llm_fail(LLM_ERR_IO, "%s: write: %s", what, strerror(errno));
		p += w;
		len -= (size_t)w;
	}
	return LLM_OK;
}

enum llm_status llm_write_file_atomic(const char *path, const void *data, size_t len)
{
	char tmp[4096];
	snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		return llm_fail(LLM_ERR_IO, "%s: %s", tmp, strerror(errno));
	enum llm_status s = llm_write_all(fd, data, len, path);
	if (!s && fsync(fd) != 0)
		s = llm_fail(LLM_ERR_IO, "%s: fsync: %s", path, strerror(errno));
	close(fd);
	if (!s && rename(tmp, path) != 0)
		s = llm_fail(LLM_ERR_IO, "%s: rename: %s", path, strerror(errno));
	if (s)
		unlink(tmp);
	return s;
}

int llm_is_dir(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int llm_exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

void llm_rm_rf(const char *path)
{
	struct stat st;
	if (lstat(path, &st) != 0)
		return;
	if (S_ISDIR(st.st_mode)) {
		DIR *d = opendir(path);
		struct dirent *e;
		while (d && (e = readdir(d))) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			char *p = llm_path_join(path, e->d_name);
			if (p)
				llm_rm_rf(p);
			free(p);
		}
		if (d)
			closedir(d);
		rmdir(path);
	} else {
		unlink(path);
	}
}

void llm_fsync_dir(const char *path)
{
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd >= 0) {
		fsync(fd);
		close(fd);
	}
}

int llm_is_utf8_text(const char *s, size_t n)
{
	const unsigned char *p = (const unsigned char *)s;
	size_t i = 0;
	while (i < n) {
		unsigned c = p[i];
		size_t k;                 /* continuation bytes that follow */
		if (c == 0)
			return 0;
		if (c < 0x80)
			k = 0;
		else if (c >= 0xc2 && c < 0xe0)
			k = 1;
		else if (c >= 0xe0 && c < 0xf0)
			k = 2;
		else if (c >= 0xf0 && c < 0xf5)
			k = 3;
		else
			return 0;
		if (k > n - i - 1)
			return 0;
		for (size_t j = 1; j <= k; j++)
			if ((p[i + j] & 0xc0) != 0x80)
				return 0;
		i += k + 1;
	}
	return 1;
}

char *llm_next_line(char **p, char *end)
{
	char *line = *p;
	if (line >= end)
		return NULL;
	char *nl = memchr(line, '\n', (size_t)(end - line));
	if (!nl)
		nl = end;
	*nl = 0;
	if (nl > line && nl[-1] == '\r')
		nl[-1] = 0;
	*p = nl + 1;
	return line;
}

/* The PID of a name "<base>.tmp.<PID>" (BASE NULL: any base), else 0. */
static long tmp_pid(const char *name, const char *base)
{
	const char *t = strstr(name, ".tmp.");
	if (!t || t == name)
		return 0;
	while (strstr(t + 1, ".tmp."))   /* the last ".tmp.": "x.tmp.1.tmp.2" is x.tmp.1's */
		t = strstr(t + 1, ".tmp.");
	if (base && ((size_t)(t - name) != strlen(base) || strncmp(name, base, (size_t)(t - name))))
		return 0;
	const char *d = t + 5;
	long pid = 0;
	for (; *d >= '0' && *d <= '9' && pid < 1L << 40; d++)
		pid = pid * 10 + (*d - '0');
	return *d || d == t + 5 || pid <= 0 || pid > INT32_MAX ? 0 : pid;
}

int llm_tmp_sweep(const char *path, int inside, char *first, size_t n)
{
	if (first && n)
		first[0] = 0;
	if (!path || !*path || !strcmp(path, "-"))
		return 0;
	char *p = llm_path_trim(path), *dir = NULL, *base = NULL;
	if (!p)
		return 0;
	if (inside) {
		dir = p;
	} else {
		dir = llm_path_dir(p);
		const char *sl = strrchr(p, '/');
		base = llm_strdup(sl ? sl + 1 : p);
	}
	int removed = 0;
	DIR *d = dir && (inside || base) ? opendir(dir) : NULL;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		long pid = tmp_pid(e->d_name, base);
		if (!pid || pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH)
			continue;           /* alive, or not ours to judge (EPERM: someone else's live process) */
		char *full = llm_path_join(dir, e->d_name);
		if (!full)
			continue;
		llm_rm_rf(full);
		if (!llm_exists(full) && removed++ == 0 && first && n)
			snprintf(first, n, "%s", full);
		free(full);
	}
	if (d)
		closedir(d);
	if (!inside)
		free(dir);
	free(base);
	free(p);
	return removed;
}
