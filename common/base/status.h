/* common/base/status.h: status codes, the per-thread error message, logging.
 *
 * The library never prints to stdout and never exits: a failing function
 * records a one-line message with llm_fail() and returns its status; a tool
 * prints llm_errmsg() and decides the exit code. */
#ifndef LLM_STATUS_H
#define LLM_STATUS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum llm_status {
	LLM_OK = 0,
	LLM_ERR_IO,          /* open/read/write/mmap/rename failed */
	LLM_ERR_FORMAT,      /* malformed file: header, JSON, shapes, offsets */
	LLM_ERR_USAGE,       /* bad argument or combination of arguments */
	LLM_ERR_NOMEM,       /* allocation failed */
	LLM_ERR_UNSUPPORTED, /* valid input this build or model cannot handle */
	LLM_ERR_EXISTS,      /* output exists and --force was not given */
	LLM_ERR_RANGE,       /* value out of range (context, token id, ...) */
	LLM_ERR_CUDA,        /* CUDA runtime or library error */
	LLM_ERR_COMM,        /* MPI/NCCL communication error */
	LLM_ERR_INTERNAL,    /* a bug: an invariant did not hold */
};

/* Record a printf-style message for the calling thread and return s.
 * The message is one line; callers put the file or field first. */
enum llm_status llm_fail(enum llm_status s, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* Prepend "prefix: " to the current message (adds context on the way up). */
enum llm_status llm_fail_prefix(enum llm_status s, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
/* The last message recorded by this thread ("" if none). */
const char *llm_errmsg(void);
const char *llm_status_name(enum llm_status s);

#define LLM_TRY(expr) do { enum llm_status s_ = (expr); if (s_) return s_; } while (0)

/* Logging to stderr. Level 0 = errors only (-q), 1 = normal, 2 = -v, 3 = -vv. */
extern int llm_log_level;
void llm_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
#define LLM_INFO(...)  llm_log(1, __VA_ARGS__)
#define LLM_DEBUG(...) llm_log(2, __VA_ARGS__)

/* For tools only: the program name used in messages, and the exit path. */
void llm_set_progname(const char *argv0);
const char *llm_progname(void);
/* Print "prog: message" to stderr and exit(1). */
_Noreturn void llm_die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Print "prog: warning: message" to stderr (always, unless -q). */
void llm_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Monotonic seconds. */
double llm_now(void);

#endif
