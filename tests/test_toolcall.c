/* tests/test_toolcall.c: tool calls parsed from chat answers
 * (common/text/toolcall.c): the formats a template teaches, whole and partial
 * calls, unknown names and malformed JSON left as content, the content
 * around calls, and the prefix a stream may send before the end. */
#include "check.h"
#include "toolcall.h"

#include <string.h>

static const char *names[] = { "get_weather", "search" };

/* TEXT in F: N calls (NAME0, ARGS0 the first), CONTENT the rest. */
static void parsed(enum llm_tool_format f, const char *text, int n, const char *name0, const char *args0,
                   const char *content)
{
	struct llm_tool_answer a;
	enum llm_status s = llm_tool_parse(f, text, strlen(text), names, 2, &a);
	int ok = !s && a.n == n && !strcmp(a.content, content) && a.content_len == strlen(content);
	if (ok && n)
		ok = !strcmp(a.calls[0].name, name0) && !strcmp(a.calls[0].arguments, args0);
	check(ok, "%s %s: %d calls, content '%s' (got %d, '%s'%s%s)", llm_tool_format_name(f), text, n, content,
	      s ? -1 : a.n, s ? "" : a.content, !s && a.n ? ", " : "", !s && a.n ? a.calls[0].arguments : "");
	if (!s)
		llm_tool_answer_free(&a);
}

static void safe(enum llm_tool_format f, const char *text, size_t want)
{
	size_t got = llm_tool_safe_prefix(f, text, strlen(text));
	check(got == want, "%s safe prefix of '%s': %zu (got %zu)", llm_tool_format_name(f), text, want, got);
}

int main(void)
{
	enum llm_tool_format H = LLM_TOOL_HERMES, L = LLM_TOOL_LLAMA3;
	check(llm_tool_format_of("{% if tools %}<tools>{% endif %}<tool_call>\n") == H, "a template with <tool_call>: hermes");
	check(llm_tool_format_of("{{- '<|python_tag|>' }}") == L, "a template with <|python_tag|>: llama3");
	check(llm_tool_format_of("{% for m in messages %}{{ m.content }}{% endfor %}") == LLM_TOOL_NONE &&
	      llm_tool_format_of(NULL) == LLM_TOOL_NONE, "a template without tools: none");

	parsed(H, "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"München\"}}\n</tool_call>", 1,
	       "get_weather", "{\"city\":\"München\"}", "");
	parsed(H, "Let me look.\n<tool_call>\n{\"name\": \"search\", \"arguments\": {\"q\": \"a\"}}\n</tool_call>\n"
	          "<tool_call>{\"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\": \\\"Oslo\\\"}\"}</tool_call>", 2,
	       "search", "{\"q\":\"a\"}", "Let me look.");
	parsed(H, "<tool_call>{\"name\": \"search\", \"arguments\": {}}", 1, "search", "{}", "");   /* ended before the tag */
	parsed(H, "Plain answer.", 0, NULL, NULL, "Plain answer.");
	parsed(H, "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>", 0, NULL, NULL,
	       "<tool_call>{\"name\": \"rm_rf\", \"arguments\": {}}</tool_call>");   /* not a function of the request */
	parsed(H, "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": </tool_call>", 0, NULL, NULL,
	       "<tool_call>{\"name\": \"search\", \"arguments\": {\"q\": </tool_call>");   /* malformed */
	parsed(H, "<tool_call>{\"name\": \"search\", \"arguments\": [1]}</tool_call>", 0, NULL, NULL,
	       "<tool_call>{\"name\": \"search\", \"arguments\": [1]}</tool_call>");   /* arguments not an object */

	parsed(L, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}", 1, "get_weather",
	       "{\"city\":\"Paris\"}", "");
	parsed(L, "<|python_tag|>{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}}; {\"name\": \"get_weather\", "
	          "\"parameters\": {}}", 2, "search", "{\"q\":\"x\"}", "");
	parsed(L, "  \n{\"name\": \"search\", \"arguments\": {\"q\": \"y\"}}", 1, "search", "{\"q\":\"y\"}", "");
	parsed(L, "The weather is fine.", 0, NULL, NULL, "The weather is fine.");
	parsed(L, "{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}} and more", 0, NULL, NULL,
	       "{\"name\": \"search\", \"parameters\": {\"q\": \"x\"}} and more");
	parsed(L, "{\"name\": \"search\"", 0, NULL, NULL, "{\"name\": \"search\"");

	struct llm_tool_answer a;
	const char *any = "<tool_call>{\"name\": \"anything\", \"arguments\": {}}</tool_call>";
	check(!llm_tool_parse(H, any, strlen(any), NULL, 0, &a) &&
	      a.n == 1 && !strcmp(a.calls[0].name, "anything"), "names NULL: any function name counts");
	llm_tool_answer_free(&a);

	safe(H, "Hello", 5);
	safe(H, "Hello <tool", 6);
	safe(H, "Hello <tool_call>{\"na", 6);
	safe(H, "a < b", 5);
	safe(H, "x<", 1);
	safe(L, "Hello", 5);
	safe(L, "  {\"name", 0);
	safe(L, "<|python", 0);
	safe(L, " ", 0);
	safe(L, "<b>bold</b>", 11);
	safe(LLM_TOOL_NONE, "{\"name\"", 7);
	return check_done();
}
