/* common/serve/api_base.c: what the translations of the Responses and
 * Messages APIs (api_responses.c, api_messages.c) both use: a usage error
 * naming the API's field, one server-sent event with its type, a body's
 * field and a buffer as a JSON string. They
 * call it, and it calls neither. */
#define _GNU_SOURCE
#include "apis.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include "banned.h"

enum llm_status llm_api_bad(char *param, size_t n, const char *field, const char *fmt, ...)
{
	char m[400];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(m, sizeof m, fmt, ap);
	va_end(ap);
	snprintf(param, n, "%s", field);
	return llm_fail(LLM_ERR_USAGE, "%s: %s", field, m);
}

void llm_api_sse(struct llm_buf *b, const char *event, json_t *data)
{
	char *d = data ? json_dumps(data, JSON_COMPACT) : NULL;
	json_decref(data);
	if (!d)
		return;
	(void)(llm_buf_append_str(b, "event: ") || llm_buf_append_str(b, event) || llm_buf_append_str(b, "\ndata: ") ||
	       llm_buf_append_str(b, d) || llm_buf_append_str(b, "\n\n"));
	free(d);
}

json_t *llm_api_field(json_t *o, const char *k)
{
	json_t *v = json_object_get(o, k);
	return v && !json_is_null(v) ? v : NULL;
}

json_t *llm_api_str(const struct llm_buf *b)
{
	return json_stringn(b->p ? b->p : "", b->len);
}
