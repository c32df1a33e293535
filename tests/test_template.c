/* tests/test_template.c: chat templates against Python Jinja2 as Hugging Face
 * sets it up.
 *
 * Every chat.jsonl conversation of $LLM_TEST_REF/tokenizers/{llama3,qwen3}
 * must render byte for byte as `rendered` (the Python Jinja2 result; where
 * transformers.js disagrees, README says Python is the reference), and
 * encoding the rendered text without special tokens must give `ids`.
 * Then small templates whose Jinja2 output is known, and constructs that
 * must be refused rather than rendered wrong. */
#define _GNU_SOURCE
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "llm.h"

static void run_chat(const char *ref, const char *name)
{
	char dir[4096], path[4200];
	snprintf(dir, sizeof dir, "%s/tokenizers/%s", ref, name);
	snprintf(path, sizeof path, "%s/chat.jsonl", dir);
	FILE *f = fopen(path, "r");
	if (!f) {
		check_skip("no chat.jsonl in $LLM_TEST_REF", "%s: chat template", name);
		return;
	}
	struct llm_tokenizer *tk;
	if (!check(llm_tokenizer_open(&tk, dir) == LLM_OK, "%s: open tokenizer", name)) {
		check_diag("%s", llm_errmsg());
		fclose(f);
		return;
	}
	char *line = NULL;
	size_t cap = 0;
	int n = 0, ok_text = 0, ok_ids = 0, shown = 0, lineno = 0;
	while (getline(&line, &cap, f) > 0) {
		lineno++;
		json_error_t e;
		json_t *c = json_loads(line, 0, &e);
		n++;
		if (!c) {
			check_diag("  line %d: %s", lineno, e.text);
			continue;
		}
		json_t *req = json_pack("{sOsOsOsO}", "messages", json_object_get(c, "messages"), "add_generation_prompt",
		                        json_object_get(c, "add_generation_prompt"), "tools", json_object_get(c, "tools"),
		                        "template_kwargs", json_object_get(c, "template_kwargs"));
		char *rs = json_dumps(req, JSON_COMPACT | JSON_PRESERVE_ORDER);
		char *out = NULL;
		size_t len = 0;
		const char *want = json_string_value(json_object_get(c, "rendered"));
		const char *id = json_string_value(json_object_get(c, "id"));
		if (llm_chat_render(tk, NULL, rs, &out, &len)) {
			if (shown++ < 5)
				check_diag("  %s: render failed: %s", id, llm_errmsg());
		} else if (len == strlen(want) && !memcmp(out, want, len)) {
			ok_text++;
			int32_t *ids;
			size_t ni;
			json_t *ref_ids = json_object_get(c, "ids");
			if (!llm_tokenizer_encode(tk, out, len, false, &ids, &ni)) {
				int same = ni == json_array_size(ref_ids);
				for (size_t i = 0; same && i < ni; i++)
					same = ids[i] == json_integer_value(json_array_get(ref_ids, i));
				ok_ids += same;
				if (!same && shown++ < 5)
					check_diag("  %s: ids differ", id);
				free(ids);
			}
		} else if (shown++ < 5) {
			size_t k = 0;
			while (k < len && want[k] && out[k] == want[k])
				k++;
			check_diag("  %s: differs at byte %zu: got \"%.60s\" want \"%.60s\"", id, k, out + k, want + k);
		}
		free(out);
		free(rs);
		json_decref(req);
		json_decref(c);
	}
	free(line);
	fclose(f);
	check(n > 0 && ok_text == n, "%s: chat template renders as Jinja2 (%d/%d)", name, ok_text, n);
	check(n > 0 && ok_ids == n, "%s: rendered prompt encodes to the reference ids (%d/%d)", name, ok_ids, n);
	llm_tokenizer_close(tk);
}

/* Render SRC with VARS (JSON) and compare with WANT. */
static void expect(const char *what, const char *src, const char *vars, const char *want)
{
	struct llm_jinja *t;
	char *out = NULL;
	size_t len;
	json_error_t e;
	json_t *v = json_loads(vars, 0, &e);
	enum llm_status s = llm_jinja_parse(&t, src, strlen(src));
	if (!s) {
		s = llm_jinja_render(t, v, &out, &len);
		llm_jinja_free(t);
	}
	int ok = !s && !strcmp(out, want);
	if (!check(ok, "jinja: %s", what))
		check_diag("got \"%s\" want \"%s\" (%s)", s ? "" : out, want, s ? llm_errmsg() : "ok");
	free(out);
	json_decref(v);
}

/* Parsing or rendering must fail with status WANT and a message containing NEEDLE. */
static void refuse(const char *what, const char *src, enum llm_status want, const char *needle)
{
	struct llm_jinja *t;
	char *out = NULL;
	size_t len;
	enum llm_status s = llm_jinja_parse(&t, src, strlen(src));
	if (!s) {
		json_t *v = json_object();
		s = llm_jinja_render(t, v, &out, &len);
		json_decref(v);
		llm_jinja_free(t);
	}
	int ok = s == want && strstr(llm_errmsg(), needle) && strstr(llm_errmsg(), "chat template");
	if (!check(ok, "jinja refuses: %s", what))
		check_diag("status %s, message \"%s\", output \"%s\"", llm_status_name(s), llm_errmsg(), out ? out : "");
	free(out);
}

static void unit(void)
{
	expect("text and expressions", "a{{ x }}b{{ 1 + 2 }}", "{\"x\": \"X\"}", "aXb3");
	expect("trim_blocks and lstrip_blocks", "<\n  {% if true %}\nyes\n  {% endif %}\n>", "{}", "<\nyes\n>");
	expect("whitespace control", "a  {{- 'b' -}}  c {%- if 1 %} d{% endif %}", "{}", "abc d");
	expect("plus disables lstrip", "x\n  {%+ if 1 %}y{% endif %}", "{}", "x\n  y");
	expect("for with loop vars", "{% for x in xs %}{{ loop.index0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ x }};{% endfor %}",
	       "{\"xs\": [\"a\", \"b\"]}", "0TrueFalse2a;1FalseTrue2b;");
	expect("for else and filter", "{% for x in xs if x > 1 %}{{ x }}{% else %}none{% endfor %}|{% for x in [] %}{% else %}empty{% endfor %}",
	       "{\"xs\": [1, 2, 3]}", "23|empty");
	expect("dict items and unpacking", "{% for k, v in d.items() %}{{ k }}={{ v }},{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
	       "{\"d\": {\"b\": 1, \"a\": 2}}", "b=1,a=2,ba");
	expect("set scoping and namespace",
	       "{% set x = 1 %}{% for i in [1,2] %}{% set x = x + i %}{% endfor %}{{ x }}"
	       "{% set ns = namespace(t=0) %}{% for i in [1,2] %}{% set ns.t = ns.t + i %}{% endfor %}{{ ns.t }}",
	       "{}", "13");
	expect("elif chain", "{% for i in [1,2,3] %}{% if i == 1 %}a{% elif i == 2 %}b{% else %}c{% endif %}{% endfor %}", "{}", "abc");
	expect("slicing", "{{ xs[::-1] }}{{ xs[1:] }}{{ s[1:3] }}{{ s[-1] }}{{ 'héllo'[1] }}", "{\"xs\": [1, 2, 3], \"s\": \"abcd\"}",
	       "[3, 2, 1][2, 3]bcdé");
	expect("string methods",
	       "{{ s.strip() }}|{{ s.lstrip() }}|{{ '\\n\\nx\\n'.strip('\\n') }}|{{ 'a,b'.split(',') }}|{{ 'a b  c'.split() }}|"
	       "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith('bc') }}|{{ 'aXa'.replace('a', 'b') }}|{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}",
	       "{\"s\": \"  hi  \"}", "hi|hi  |x|['a', 'b']|['a', 'b', 'c']|TrueTrue|bXb|ABab");
	expect("filters", "{{ ' x ' | trim }}|{{ xs | length }}|{{ xs | join(', ') }}|{{ xs | first }}{{ xs | last }}|"
	       "{{ u | default('d') }}|{{ 'Ab' | upper }}|{{ 3 | string }}|{{ xs | map('string') | join }}",
	       "{\"xs\": [1, 2, 3]}", "x|3|1, 2, 3|13|d|AB|3|123");
	expect("selectattr and map attribute",
	       "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='c') | join(',') }}|{{ ms | rejectattr('role', 'eq', 'user') | list | length }}",
	       "{\"ms\": [{\"role\": \"user\", \"c\": \"a\"}, {\"role\": \"sys\", \"c\": \"b\"}, {\"role\": \"user\", \"c\": \"c\"}]}", "a,c|1");
	expect("tests", "{{ x is defined }}{{ y is defined }}{{ n is none }}{{ s is string }}{{ d is mapping }}{{ l is sequence }}"
	       "{{ 3 is odd }}{{ x is not none }}{{ b is false }}",
	       "{\"x\": 1, \"n\": null, \"s\": \"\", \"d\": {}, \"l\": [], \"b\": false}", "TrueFalseTrueTrueTrueTrueTrueTrueTrue");
	expect("in and not in, ~", "{{ 'a' in 'cat' }}{{ 2 in [1,2] }}{{ 'k' in d }}{{ 'z' not in d }}{{ 1 ~ 'x' ~ none }}",
	       "{\"d\": {\"k\": 1}}", "TrueTrueTrueTrue1xNone");
	expect("tojson like json.dumps(ensure_ascii=False)",
	       "{{ v | tojson }}|{{ v | tojson(indent=2) }}",
	       "{\"v\": {\"a\": [1, 2.5, true, null], \"s\": \"é\\\"\\n\\u0001\", \"e\": {}, \"f\": 1.0, \"g\": 1e-07}}",
	       "{\"a\": [1, 2.5, true, null], \"s\": \"é\\\"\\n\\u0001\", \"e\": {}, \"f\": 1.0, \"g\": 1e-07}|"
	       "{\n  \"a\": [\n    1,\n    2.5,\n    true,\n    null\n  ],\n  \"s\": \"é\\\"\\n\\u0001\",\n  \"e\": {},\n  \"f\": 1.0,\n  \"g\": 1e-07\n}");
	expect("python str of values", "{{ [1, 'a', none, true, 0.5] }}{{ {'k': 'v'} }}{{ 10 / 4 }}{{ 7 // 2 }}{{ -7 % 3 }}{{ 2 ** 10 }}",
	       "{}", "[1, 'a', None, True, 0.5]{'k': 'v'}2.5321024");
	expect("conditional expression and undefined", "{{ 'y' if x else 'n' }}{{ u }}{{ 'z' if u }}|{{ u | length }}", "{\"x\": 1}", "y|0");
	expect("macro", "{% macro m(a, b='B') %}[{{ a }}{{ b }}]{% endmacro %}{{ m('x') }}{{ m('y', b='z') }}", "{}", "[xB][yz]");
	expect("break and continue", "{% for i in range(10) %}{% if i == 1 %}{% continue %}{% endif %}{% if i == 3 %}{% break %}{% endif %}{{ i }}{% endfor %}",
	       "{}", "02");
	expect("set block and comments", "{# c #}{% set x %}a{{ 1 }}{% endset %}{{ x }}", "{}", "a1");
	expect("raw", "{% raw %}{{ x }}{% endraw %}", "{}", "{{ x }}");
	expect("dict literal and get", "{% set d = {'a': 1} %}{{ d.get('a') }}{{ d.get('b', 2) }}{{ d['a'] }}{{ d.a }}", "{}", "1211");
	refuse("extends", "{% extends 'x' %}", LLM_ERR_UNSUPPORTED, "line 1: unsupported tag 'extends'");
	refuse("include", "a\n{% include 'x' %}", LLM_ERR_UNSUPPORTED, "line 2: unsupported tag 'include'");
	refuse("unknown filter", "{{ x | frobnicate }}", LLM_ERR_UNSUPPORTED, "unsupported filter 'frobnicate'");
	refuse("unknown test", "{{ x is frob }}", LLM_ERR_UNSUPPORTED, "unsupported test 'frob'");
	refuse("call block", "{% call m() %}{% endcall %}", LLM_ERR_UNSUPPORTED, "unsupported tag 'call'");
	refuse("unclosed if", "{% if x %}a", LLM_ERR_FORMAT, "missing");
	refuse("unclosed tag", "{{ x ", LLM_ERR_FORMAT, "unclosed");
	/* a tag that ends where an expression, attribute or test name is due
	 * (found by tests/fuzz/fuzz_chat: the parser stepped back past the
	 * tag's start and read before its token array) */
	refuse("empty expression", "{{ }}", LLM_ERR_FORMAT, "line 1: expected an expression at end of tag");
	refuse("no attribute name", "{{ x. }}", LLM_ERR_FORMAT, "line 1: expected an attribute name at end of tag");
	refuse("no test name", "a\n{{ x is }}", LLM_ERR_FORMAT, "line 2: expected a test name at end of tag");
	refuse("no expression in if", "{% if %}{% endif %}", LLM_ERR_FORMAT, "expected an expression at end of tag");
	/* integers are 64-bit: past them is refused, never wrapped (Python's
	 * would grow); exact up to the bound */
	expect("integer power, exact past 2^53", "{{ 3 ** 39 }} {{ -2 ** 63 }} {{ 2 ** 62 + (2 ** 62 - 1) }}", "{}",
	       "4052555153018976267 -9223372036854775808 9223372036854775807");
	expect("floor division and modulo at the bounds", "{% set m = -9223372036854775807 - 1 %}{{ m // 1 }} {{ m % -1 }}",
	       "{}", "-9223372036854775808 0");
	/* the source as Jinja2's lexer reads it (checked against jinja2 3.1 with
	 * transformers' settings): one trailing newline dropped, so a template
	 * file's last line break is not in the prompt; \r\n and \r are \n */
	expect("a template file's last newline is dropped", "a{{ 1 }}\n", "{}", "a1");
	expect("only the last one", "a\n\n", "{}", "a\n");
	expect("after a block tag too", "{% if true %}\nx\n{% endif %}\n", "{}", "x\n");
	expect("\\r\\n and \\r become \\n, in strings too", "a\r\nb\rc{{ \"p\r\nq\" }}", "{}", "a\nb\ncp\nq");
	expect("an undefined in a list prints as Undefined", "{{ [u] }}", "{}", "[Undefined]");
	expect("float % and // as Python's", "{{ 1 % 1e400 }} {{ -1 % 1e400 }} {{ -1 // 1e400 }} {{ -7.5 // 2 }} "
	       "{{ 7.5 % -2 }} {{ 5 // 0.1 }} {{ 0.0 // -3 }} {{ 5.5 % 2 }}", "{}",
	       "1.0 inf -1.0 -4.0 -0.5 49.0 -0.0 1.5");
	/* a float operand: its bytes are not read as a bool (UBSan, fuzzer) */
	expect("float with int or bool operands", "{{ 7 / 5 + 1 }} {{ 2 * 1.5 }} {{ true + 1 }} {{ 7 / 5 - true }}", "{}",
	       "2.4 3.0 2 0.3999999999999999");
	refuse("+ past 64 bits", "{{ 2 + 9223372036854775807 }}", LLM_ERR_USAGE, "integer overflow in '+'");
	refuse("* past 64 bits", "{{ 4294967296 * 4294967296 }}", LLM_ERR_USAGE, "integer overflow in '*'");
	refuse("** past 64 bits", "{{ 2 ** 63 }}", LLM_ERR_USAGE, "integer overflow in '**'");
	refuse("- of the least integer", "{% set m = -9223372036854775807 - 1 %}{{ -m }}", LLM_ERR_USAGE,
	       "integer overflow in '-'");
	refuse("// of the least integer by -1", "{% set m = -9223372036854775807 - 1 %}{{ m // -1 }}", LLM_ERR_USAGE,
	       "integer overflow in '//'");
	refuse("integer literal past 64 bits", "{{ 9223372036854775808 }}", LLM_ERR_UNSUPPORTED, "past 64 bits");
	refuse("a 70-digit literal", "{{ 1234567890123456789012345678901234567890123456789012345678901234567890 }}",
	       LLM_ERR_UNSUPPORTED, "more than 63 digits");
	refuse("string repeated past 64 MiB", "{{ 'ab' * 9223372036854775807 }}", LLM_ERR_USAGE, "more than 64 MiB");
	refuse("indent wider than 64 MiB", "{{ 'a\nb' | indent(9223372036854775807) }}", LLM_ERR_USAGE, "more than 64 MiB");
	expect("range up to the last integer", "{{ range(9223372036854775806, 9223372036854775807, 5) | list }}", "{}",
	       "[9223372036854775806]");
	refuse("raise_exception", "{{ raise_exception('roles must alternate') }}", LLM_ERR_USAGE, "roles must alternate");
	refuse("list.append in the immutable sandbox", "{% set l = [] %}{{ l.append(1) }}", LLM_ERR_USAGE, "unsafe");
	refuse("attribute of undefined", "{{ u.x }}", LLM_ERR_USAGE, "undefined");
}

int main(void)
{
	const char *ref = test_ref_dir();
	if (!ref) {
		check_skip("no reference data in $LLM_TEST_REF", "llama3: chat template");
		check_skip("no reference data in $LLM_TEST_REF", "qwen3: chat template");
	} else {
		run_chat(ref, "llama3");
		run_chat(ref, "qwen3");
	}
	unit();
	return check_done();
}
