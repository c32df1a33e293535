/* common/engine/sample_json.c: the request forms of per-request sampling fields
 * that llm-serve's OpenAI endpoints and llm-generate's JSONL and flags share
 * (see sampler.h). */
#include "sampler.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include "banned.h"

/* A token id of the text S (decimal digits only); -1 when it is not one. */
static long token_id(const char *s, char **end, int n_vocab)
{
	if (*s < '0' || *s > '9')
		return -1;
	errno = 0;
	long id = strtol(s, end, 10);
	if (errno || id > INT32_MAX || (n_vocab > 0 && id >= n_vocab))
		return -1;
	return id;
}

static const char *vocab_range(int n_vocab, char *buf, size_t n)
{
	if (n_vocab > 0)
		snprintf(buf, n, " in [0, %d)", n_vocab);
	else
		buf[0] = 0;
	return buf;
}

enum llm_status llm_json_logit_bias(struct json_t *v, int n_vocab, struct llm_logit_bias **bias, int *n)
{
	char r[40];
	*bias = NULL;
	*n = 0;
	if (!json_is_object(v))
		return llm_fail(LLM_ERR_USAGE, "expected an object mapping token ids to biases");
	size_t size = json_object_size(v);
	if (size > LLM_MAX_BIAS)
		return llm_fail(LLM_ERR_USAGE, "%zu entries, at most %d", size, LLM_MAX_BIAS);
	if (!size)
		return LLM_OK;
	struct llm_logit_bias *b = malloc(size * sizeof *b);
	if (!b)
		return llm_fail(LLM_ERR_NOMEM, "out of memory");
	const char *key;
	json_t *x;
	int k = 0;
	json_object_foreach(v, key, x) {
		char *end = NULL;
		long id = token_id(key, &end, n_vocab);
		if (id < 0 || *end) {
			free(b);
			return llm_fail(LLM_ERR_USAGE, "key '%.40s' is not a token id%s", key, vocab_range(n_vocab, r, sizeof r));
		}
		if (!json_is_number(x) || !(fabs(json_number_value(x)) <= 100)) {
			free(b);
			return llm_fail(LLM_ERR_USAGE, "token %ld: expected a number in [-100, 100]", id);
		}
		b[k++] = (struct llm_logit_bias){ (int32_t)id, (float)json_number_value(x) };
	}
	*bias = b;
	*n = k;
	return LLM_OK;
}

enum llm_status llm_json_stop_ids(struct json_t *v, int n_vocab, int32_t ids[LLM_MAX_STOP], int *n)
{
	char r[40];
	*n = 0;
	if (!json_is_array(v))
		return llm_fail(LLM_ERR_USAGE, "expected an array of token ids");
	if (json_array_size(v) > LLM_MAX_STOP)
		return llm_fail(LLM_ERR_USAGE, "%zu ids, at most %d", json_array_size(v), LLM_MAX_STOP);
	for (size_t i = 0; i < json_array_size(v); i++) {
		json_t *x = json_array_get(v, i);
		json_int_t id = json_is_integer(x) ? json_integer_value(x) : -1;
		if (id < 0 || id > INT32_MAX || (n_vocab > 0 && id >= n_vocab)) {
			*n = 0;
			return llm_fail(LLM_ERR_USAGE, "element %zu is not a token id%s", i, vocab_range(n_vocab, r, sizeof r));
		}
		ids[(*n)++] = (int32_t)id;
	}
	return LLM_OK;
}

enum llm_status llm_logit_bias_parse(const char *spec, struct llm_logit_bias *b)
{
	char *end = NULL;
	long id = token_id(spec, &end, 0);
	if (id < 0 || *end != '=')
		return llm_fail(LLM_ERR_USAGE, "'%.40s': expected ID=BIAS with a token id", spec);
	const char *num = end + 1;
	if (!((*num >= '0' && *num <= '9') || *num == '-' || *num == '+' || *num == '.'))
		return llm_fail(LLM_ERR_USAGE, "'%.40s': the bias is not a number in [-100, 100]", spec);
	errno = 0;
	double x = strtod(num, &end);
	if (end == num || *end || errno || !(fabs(x) <= 100))
		return llm_fail(LLM_ERR_USAGE, "'%.40s': the bias is not a number in [-100, 100]", spec);
	*b = (struct llm_logit_bias){ (int32_t)id, (float)x };
	return LLM_OK;
}
