/* common/base/progress.c: progress lines and summaries on the tool's stream
 * (progress.h). Every function is a no-op without a stream. */
#define _POSIX_C_SOURCE 200809L
#include "progress.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "banned.h"

#define BAR 20                      /* characters of the terminal bar */

enum llm_status llm_progress_init(struct llm_progress *p, FILE *out)
{
	memset(p, 0, sizeof *p);
	p->out = out;
	p->tty = out && isatty(fileno(out));
	p->interval = p->tty ? 0.25 : 5;
	p->t0 = p->last = llm_now();
	const char *e = getenv("LLM_PROGRESS_INTERVAL");
	if (e && *e) {
		char *end;
		double v = strtod(e, &end);
		if (*end || !(v >= 0) || v > 1e9)
			return llm_fail(LLM_ERR_USAGE, "LLM_PROGRESS_INTERVAL: '%s' is not a number of seconds >= 0", e);
		p->interval = v;
	}
	return LLM_OK;
}

double llm_progress_elapsed(const struct llm_progress *p)
{
	return llm_now() - p->t0;
}

const char *llm_progress_size(uint64_t bytes, char *buf)
{
	static const char *unit[] = { "B", "kB", "MB", "GB", "TB", "PB", "EB" };
	double v = (double)bytes;
	int u = 0;
	while (v >= 999.95 && u < 6) {      /* 999.96 B would print as "1000.0 B" */
		v /= 1000;
		u++;
	}
	if (u == 0)
		snprintf(buf, 16, "%llu B", (unsigned long long)bytes);
	else
		snprintf(buf, 16, v < 99.95 ? "%.1f %s" : "%.0f %s", v, unit[u]);
	return buf;
}

/* Print LINE: in place on a terminal (padded over a longer last line),
 * else as a line of its own. */
static void put_line(struct llm_progress *p, const char *line)
{
	int n = (int)strlen(line);
	if (p->tty) {
		fprintf(p->out, "\r%s%*s", line, p->shown > n ? p->shown - n : 0, "");
		p->shown = n;
	} else {
		fprintf(p->out, "%s\n", line);
	}
	fflush(p->out);
}

void llm_progress_tick(struct llm_progress *p)
{
	if (!p || !p->out)
		return;
	double now = llm_now();
	if (now - p->last < p->interval)
		return;
	p->last = now;
	double el = now - p->t0;
	double frac = p->n_bytes ? (double)p->bytes / (double)p->n_bytes
	            : p->n_items ? (double)p->items / (double)p->n_items : -1;
	char line[320], a[16], b[16];
	size_t n = 0;
#define ADD(...) (n += (size_t)snprintf(line + n, n < sizeof line ? sizeof line - n : 0, __VA_ARGS__), \
                  n = n < sizeof line ? n : sizeof line - 1)
	ADD("%s:", llm_progname());
	if (p->note[0])
		ADD(" %s", p->note);
	if (frac >= 0) {
		frac = frac > 1 ? 1 : frac;
		if (p->tty) {
			char bar[BAR + 1];
			int k = (int)(frac * BAR);
			memset(bar, '#', (size_t)k);
			memset(bar + k, '.', (size_t)(BAR - k));
			bar[BAR] = 0;
			ADD(" [%s]", bar);
		}
		ADD(" %3.0f%%", frac * 100);
	}
	const char *noun = p->noun ? p->noun : "items";
	if (p->n_items)
		ADD("  %llu/%llu %s", (unsigned long long)p->items, (unsigned long long)p->n_items, noun);
	else
		ADD("  %llu %s", (unsigned long long)p->items, noun);
	if (p->n_bytes) {
		double rate = el > 0 ? (double)p->bytes / el : 0;
		ADD("  %s/%s", llm_progress_size(p->bytes, a), llm_progress_size(p->n_bytes, b));
		ADD("  %s/s", llm_progress_size((uint64_t)rate, a));
		if (rate > 0 && p->bytes < p->n_bytes)
			ADD("  ETA %.0f s", (double)(p->n_bytes - p->bytes) / rate);
	}
	ADD("  %.0f s", el);
#undef ADD
	put_line(p, line);
}

void llm_progress_clear(struct llm_progress *p)
{
	if (!p || !p->out || !p->tty || !p->shown)
		return;
	fprintf(p->out, "\r%*s\r", p->shown, "");
	fflush(p->out);
	p->shown = 0;
}

void llm_progress_end(struct llm_progress *p, const char *fmt, ...)
{
	if (!p || !p->out)
		return;
	llm_progress_clear(p);
	fprintf(p->out, "%s: ", llm_progname());
	va_list ap;
	va_start(ap, fmt);
	vfprintf(p->out, fmt, ap);
	va_end(ap);
	fputc('\n', p->out);
	fflush(p->out);
}

void llm_progress_end_write(struct llm_progress *p, const char *out)
{
	if (!p || !p->out)
		return;
	char in[80] = "", a[16], b[16];
	double el = llm_progress_elapsed(p);
	if (p->items_in)
		snprintf(in, sizeof in, "read %s (%llu tensors), ", llm_progress_size(p->bytes_in, a),
		         (unsigned long long)p->items_in);
	llm_progress_end(p, "%swrote %s (%llu tensors, %llu file%s) to %s in %.*f s, %s/s", in,
	                 llm_progress_size(p->bytes, b), (unsigned long long)p->items, (unsigned long long)p->files,
	                 p->files == 1 ? "" : "s", strcmp(out, "-") ? out : "standard output", el < 10 ? 2 : 1, el,
	                 llm_progress_size(el > 0 ? (uint64_t)((double)p->bytes / el) : 0, a));
}
