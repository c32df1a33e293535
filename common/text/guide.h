/* common/text/guide.h: the front ends of structured output, each written as
 * grammar text for the grammar engine (grammar.h): any JSON object
 * (response_format json_object), a JSON Schema subset (json_schema,
 * guided_json), a regular expression subset (guided_regex), a list of
 * strings (guided_choice); and the vocabulary of a tokenizer.
 *
 * Guarantee: every text the grammar accepts is valid for what it came
 * from (the schema validates it, the regular expression fullmatches it, it
 * is one of the choices). The grammar may accept fewer texts than the
 * schema allows, as documented in llm-serve(1): JSON is written compact
 * (no whitespace), object properties in the schema's order and no others
 * (additionalProperties as a schema is taken for objects without
 * properties), integers of at most 16 digits unless a bound needs more,
 * numbers with at most 15 fraction digits and 2 exponent digits. What it
 * cannot honour is refused by name (LLM_ERR_USAGE, "json_schema: ...:
 * unsupported keyword 'format'"), never ignored. */
#ifndef LLM_GUIDE_H
#define LLM_GUIDE_H

#include "grammar.h"
#include "buf.h"

struct json_t;
struct llm_tokenizer;

/* Grammar text appended to OUT. Errors are LLM_ERR_USAGE with a message
 * naming the place ("properties.a.items: unsupported keyword 'uniqueItems'"),
 * or LLM_ERR_NOMEM. */
enum llm_status llm_guide_json_object(struct llm_buf *out);
enum llm_status llm_guide_json_schema(const struct json_t *schema, struct llm_buf *out);
/* A regular expression (Python re syntax, a subset: literals, escapes,
 * classes with ranges and negation, \d \w \s and their negations (ASCII
 * where negated), ., groups ((...), (?:...), (?P<name>...)), |, ? * + {m}
 * {m,} {m,n} (lazy forms too); ^ first and $ last only) that the whole
 * text must match. */
enum llm_status llm_guide_regex(const char *re, size_t len, struct llm_buf *out);
/* A tool call (tool_choice "required" or a named function): PRE, then one
 * of the N functions as compact JSON {"name": NAMES[i], ARGKEY: arguments}
 * with arguments valid for PARAMS[i] (a JSON Schema, its "#" itself; NULL:
 * the empty object), then POST. Errors name the tool: "tools[1] ('get')
 * parameters.properties.x: unsupported keyword 'format'". */
enum llm_status llm_guide_tool_call(const char *const *names, const struct json_t *const *params, size_t n,
                                    const char *argkey, const char *pre, const char *post, struct llm_buf *out);
/* The text is one of the N strings of CHOICE. */
enum llm_status llm_guide_choice(const char *const *choice, size_t n, struct llm_buf *out);

/* The vocabulary of TK for masks over N_VOCAB ids (the model's; ids TK
 * lacks and special tokens have no bytes): each token's bytes, byte-fallback
 * and byte-level tokens as the bytes they stand for. */
enum llm_status llm_gvocab_tokenizer(struct llm_gvocab **v, const struct llm_tokenizer *tk, int n_vocab);

#endif
