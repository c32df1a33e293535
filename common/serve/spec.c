/* common/serve/spec.c: speculative decoding's options and the prompt-lookup
 * drafter (see spec.h). */
#include "spec.h"

#include <string.h>
#include "banned.h"

enum llm_status llm_spec_opts_set(struct llm_spec_opts *o, const char *mode, int64_t k, int64_t ngram,
                                  const char *draft)
{
	memset(o, 0, sizeof *o);
	int dm = mode && !strcmp(mode, "draft");
	if (draft && !dm)
		return llm_fail(LLM_ERR_USAGE, "--draft goes with --speculate draft");
	if (dm && !draft)
		return llm_fail(LLM_ERR_USAGE, "--speculate draft needs --draft DIR");
	int off = !mode || !strcmp(mode, "off");
	if (!off && strcmp(mode, "ngram") && !dm)
		return llm_fail(LLM_ERR_USAGE, "--speculate: '%s' is not ngram, draft or off", mode);
	if (off && (k || ngram))   /* a value that would do nothing: refused, as --draft is */
		return llm_fail(LLM_ERR_USAGE, "%s goes with --speculate ngram or draft", k ? "--spec-tokens" : "--spec-ngram");
	if (dm && ngram)
		return llm_fail(LLM_ERR_USAGE, "--spec-ngram goes with --speculate ngram (a draft model matches nothing)");
	if (off)
		return LLM_OK;
	k = k ? k : LLM_SPEC_DEFAULT_TOKENS;
	ngram = ngram ? ngram : LLM_SPEC_DEFAULT_NGRAM;
	if (k < 1 || k > LLM_SPEC_MAX_DRAFT)
		return llm_fail(LLM_ERR_USAGE, "--spec-tokens: %lld is outside [1, %d]", (long long)k, LLM_SPEC_MAX_DRAFT);
	if (ngram < 1 || ngram > 8)
		return llm_fail(LLM_ERR_USAGE, "--spec-ngram: %lld is outside [1, 8]", (long long)ngram);
	o->mode = dm ? LLM_SPEC_DRAFT : LLM_SPEC_NGRAM;
	o->draft = draft;
	o->n_draft = (int)k;
	o->ngram = (int)ngram;
	return LLM_OK;
}

int llm_spec_ngram(const int32_t *ids, int n, int ngram, int k, int32_t *out)
{
	for (int g = ngram < n - 1 ? ngram : n - 1; g >= 1 && k > 0; g--) {
		const int32_t *suf = ids + n - g;
		/* ids[j .. j + g) == the suffix, with ids[j + g] before the suffix's end */
		for (int j = n - g - 1; j >= 0; j--) {
			if (ids[j + g - 1] != suf[g - 1] || memcmp(ids + j, suf, (size_t)g * sizeof *ids))
				continue;
			int m = n - (j + g);
			m = m < k ? m : k;
			memcpy(out, ids + j + g, (size_t)m * sizeof *ids);
			return m;
		}
	}
	return 0;
}
