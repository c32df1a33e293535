/* common/text/jinja.h: a small Jinja2 interpreter for chat templates.
 *
 * Renders a model's chat_template exactly as Hugging Face transformers does:
 * Jinja2 in an ImmutableSandboxedEnvironment with trim_blocks and
 * lstrip_blocks on (keep_trailing_newline off: the source's line endings
 * read as \n and its one last newline dropped), the loopcontrols
 * extension, a tojson filter equal to
 * json.dumps(ensure_ascii=False) (indent, separators, sort_keys passed
 * through), and the globals raise_exception(msg) and strftime_now(fmt).
 * Values follow Python: str, int, float, bool, None, list, dict, plus
 * Jinja's Undefined and namespace().
 *
 * Covered: {{ }}, {# #}, {% if/elif/else %}, {% for %} (else, loop.*,
 * unpacking, dict items, inline if filter), {% set %} (name, tuple,
 * ns.attr, block form), {% macro %} + calls, {% break/continue %},
 * {% generation %} (rendered as its body), {% raw %}, whitespace control
 * (-, +), filters, tests, str/dict/list methods, slicing, `in`, `~`,
 * conditional expressions. Anything else (extends, include, import, call,
 * filter blocks, an unknown filter or test) is LLM_ERR_UNSUPPORTED naming
 * the line, at parse time where Jinja2 itself would fail there; never a
 * silently different prompt. Reference: Jinja2 3.1 documentation and
 * transformers/utils/chat_template_utils.py. */
#ifndef LLM_JINJA_H
#define LLM_JINJA_H

#include <stdbool.h>
#include <stddef.h>
#include "status.h"

struct llm_jinja;
struct llm_tokenizer;
struct json_t;

/* Parse template SRC (LEN bytes). Errors: LLM_ERR_FORMAT (syntax) and
 * LLM_ERR_UNSUPPORTED, the message "chat template: line N: ...". */
enum llm_status llm_jinja_parse(struct llm_jinja **t, const char *src, size_t len);
void llm_jinja_free(struct llm_jinja *t);
/* Render with the variables of the JSON object VARS (a jansson json_t *;
 * object key order is kept). *out is malloc'ed, NUL-terminated, *len bytes.
 * raise_exception() gives LLM_ERR_USAGE with the template's message. */
enum llm_status llm_jinja_render(const struct llm_jinja *t, const struct json_t *vars,
                                 char **out, size_t *len);

/* Render a chat prompt the way apply_chat_template(tokenize=False) does.
 * REQUEST is a JSON object text: {"messages": [...], "add_generation_prompt":
 * bool, "tools": [...] or null, "template_kwargs" (or "chat_template_kwargs"):
 * {...}}; any other top-level key is passed as a template variable too.
 * The variables are the config's special tokens (bos_token, eos_token,
 * unk_token, pad_token, ..., additional_special_tokens), then messages,
 * tools (None when absent), documents (None), add_generation_prompt (false
 * when absent), then the template arguments. TEMPLATE overrides the
 * tokenizer's chat_template when non-NULL; TK may be NULL when TEMPLATE is
 * given (no special-token variables then). *out is malloc'ed.
 * LLM_ERR_USAGE: bad request or no template; otherwise as above. */
enum llm_status llm_chat_render(const struct llm_tokenizer *tk, const char *template_src,
                                const char *request, char **out, size_t *len);

/* llm_chat_render, and *TWO_BOS set when the prompt, encoded without
 * adding special tokens (as apply_chat_template's output is), starts with
 * two BOS tokens: almost always a template that writes BOS on top of a
 * tokenizer that adds one. */
enum llm_status llm_chat_prompt(const struct llm_tokenizer *tk, const char *template_src, const char *request,
                                char **out, size_t *len, int *two_bos);

#endif
