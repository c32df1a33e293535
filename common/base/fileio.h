/* common/base/fileio.h: small file helpers shared by the readers and writers.
 * Every output is written under a temporary name, fsync'd and renamed. */
#ifndef LLM_FILEIO_H
#define LLM_FILEIO_H

#include "status.h"

/* Read a whole file ("-": standard input) into a NUL-terminated heap buffer. */
enum llm_status llm_read_file(const char *path, char **buf, size_t *len);
/* Open PATH for reading when it is a regular file: a FIFO, device or
 * directory is refused without waiting (it is opened O_NONBLOCK, then
 * checked). The descriptor, or -1 with the message set (LLM_ERR_IO,
 * naming PATH). For files a request or a directory of someone else's may
 * name (adapters, side files), where a FIFO would hang the reader. */
int llm_open_regular(const char *path);
/* llm_read_file of a regular file only (llm_open_regular). */
enum llm_status llm_read_regular_file(const char *path, char **buf, size_t *len);
/* Write LEN bytes to PATH atomically (temp name, fsync, rename). */
enum llm_status llm_write_file_atomic(const char *path, const void *data, size_t len);
/* write() all of it, retrying on EINTR and short writes; "what" names the file. */
enum llm_status llm_write_all(int fd, const void *data, size_t len, const char *what);
int llm_is_dir(const char *path);
int llm_exists(const char *path);
/* Remove a file or a directory tree; errors are ignored (cleanup path). */
void llm_rm_rf(const char *path);
/* Stale temporaries: remove what a killed writer left, "<name>.tmp.<PID>"
 * (a file or a directory tree) whose process is gone (kill(PID, 0) fails
 * with ESRCH; a live or foreign process's is kept, and ours). Without
 * INSIDE, the temporaries of output PATH itself (beside it, base name
 * PATH's); with INSIDE, every such entry inside directory PATH (a tool that
 * writes several files there). "-" has none. Returns how many were
 * removed; FIRST (N bytes, may be NULL) gets the first one's path. */
int llm_tmp_sweep(const char *path, int inside, char *first, size_t n);
/* fsync a directory so a rename in it is durable. */
void llm_fsync_dir(const char *path);
/* "dir/name" in a heap string. */
char *llm_path_join(const char *dir, const char *name);
/* PATH without its trailing slashes ("out/" -> "out"; "/" stays), in a
 * heap string. */
char *llm_path_trim(const char *path);
/* The directory of file PATH ("a/b/f" -> "a/b", "f" -> ".", "/f" -> "/"),
 * in a heap string. */
char *llm_path_dir(const char *path);
/* Whether the bytes are valid UTF-8 without NUL (can ride in JSON metadata). */
int llm_is_utf8_text(const char *s, size_t n);
/* The next line of the text [*P, END) (read by llm_read_file, so END is a
 * NUL), cut in place: its newline (and a \r before it) become NUL and *P
 * moves past it. NULL when no text is left. */
char *llm_next_line(char **p, char *end);
/* An owned copy of a string (NULL-safe). */
char *llm_strdup(const char *s);

#endif
