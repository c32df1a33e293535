/* tests/test_toolcall.c: tool calls parsed from chat answers
 * (common/text/toolcall.c): the formats a template teaches, whole and partial
 * calls, unknown names and malformed JSON left as content, the content
 * around calls, and the prefix a stream may send before the end; and the
 * reasoning split (common/text/reasoning.c): <think> blocks the answer opens
 * or the prompt left open, unclosed blocks, and a stream whose pieces are
 * always prefixes of the whole answer's split. */
#include "check.h"
#include "toolcall.h"
#include "reasoning.h"

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

/* TEXT split (STARTS_OPEN: the prompt opened the block): REASONING (NULL:
 * none) and CONTENT; and every prefix of TEXT, split as a stream, gives a
 * reasoning and a content that are prefixes of those. */
static void split(const char *text, int starts_open, const char *reasoning, const char *content)
{
	size_t n = strlen(text);
	struct llm_reasoning_split sp;
	llm_reasoning_split(text, n, starts_open, 1, &sp);
	size_t rl = sp.r_end - sp.r_begin, cl = sp.c_end - sp.c_begin;
	int ok = sp.has_reasoning == (reasoning != NULL) && (!reasoning || (rl == strlen(reasoning) &&
	         !memcmp(text + sp.r_begin, reasoning, rl))) && cl == strlen(content) && !memcmp(text + sp.c_begin, content, cl);
	check(ok, "split '%s'%s: reasoning '%s', content '%s' (got %s'%.*s', '%.*s')", text, starts_open ? " (open)" : "",
	      reasoning ? reasoning : "(none)", content, sp.has_reasoning ? "" : "(none) ", (int)rl, text + sp.r_begin,
	      (int)cl, text + sp.c_begin);
	size_t bad = 0;
	for (size_t k = 0; k <= n; k++) {
		struct llm_reasoning_split p;
		llm_reasoning_split(text, k, starts_open, 0, &p);
		size_t prl = p.r_end - p.r_begin, pcl = p.c_end - p.c_begin;
		if ((prl && (p.r_begin != sp.r_begin || prl > rl)) || (pcl && (p.c_begin != sp.c_begin || pcl > cl)))
			bad = k ? k : n + 1;
	}
	check(!bad, "split '%s': each streamed prefix's pieces are prefixes of the whole's (first bad at %zu)", text, bad);
}

int main(void)
{
	enum llm_tool_format H = LLM_TOOL_HERMES, L = LLM_TOOL_LLAMA3;
	check(llm_tool_format_of("{% if tools %}<tools>{% endif %}<tool_call>\n") == H, "a template with <tool_call>: hermes");
	check(llm_tool_format_of("{{- '<|python_tag|>' }}") == L, "a template with <|python_tag|>: llama3");
	check(llm_tool_format_of("{% for m in messages %}{{ m.content }}{% endfor %}") == LLM_TOOL_NONE &&
	      llm_tool_format_of(NULL) == LLM_TOOL_NONE, "a template without tools: none");

	check(llm_reasoning_of("{{ '<think>\\n' }}{% if x %}</think>{% endif %}") &&
	      !llm_reasoning_of("{{ '<think>' }}") && !llm_reasoning_of(NULL), "a template with <think> and </think> reasons");
	check(llm_reasoning_prompt_open("<|Assistant|><think>\n", 21) &&
	      !llm_reasoning_prompt_open("assistant\n<think>\n\n</think>\n\n", 29) &&
	      !llm_reasoning_prompt_open("<think>x", 8), "a prompt that ends in an open <think> starts in the reasoning");
	split("<think>\nLet me see.\n</think>\n\nHello.", 0, "Let me see.", "Hello.");
	split("  <think>a</think>b", 0, "a", "b");
	split("<think>\n\n</think>\n\nHi", 0, "", "Hi");
	split("Hello <think>x</think>", 0, NULL, "Hello <think>x</think>");   /* only a block the answer opens with */
	split("<think>still thinking\n", 0, "still thinking", "");           /* cut by max_tokens: all reasoning */
	split("plan</think>answer", 1, "plan", "answer");                     /* the prompt opened it (DeepSeek-R1) */
	split("plan without end", 1, "plan without end", "");
	split("<thi", 0, NULL, "<thi");                                       /* a whole answer that only looks like one */
	split("<think>a</thi", 0, "a</thi", "");
	split("<think>r</think><tool_call>{}</tool_call>", 0, "r", "<tool_call>{}</tool_call>");

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
