/* common/base/banned.h: functions that overflow buffers or silently accept junk.
 * Included last by every library and tool source (through llm.h). */
#ifndef LLM_BANNED_H
#define LLM_BANNED_H
/* the real declarations first, so later includes of these are no-ops */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#undef strcpy
#define strcpy(a, b) llm_banned_strcpy_use_snprintf
#undef strcat
#define strcat(a, b) llm_banned_strcat_use_snprintf
#undef sprintf
#define sprintf(...) llm_banned_sprintf_use_snprintf
#undef atoi
#define atoi(s) llm_banned_atoi_use_llm_parse_int
#undef atof
#define atof(s) llm_banned_atof_use_llm_parse_float
#endif
