/* common/text/reasoning.h: reasoning in a chat answer (reasoning.c): models
 * that think in <think>...</think> before they answer (Qwen3, QwQ, the
 * DeepSeek-R1 distills) get the thinking split from the answer, as vLLM's
 * reasoning parsers give it (OpenAI chat: message.reasoning_content,
 * streamed as delta.reasoning_content); the Responses and Messages APIs
 * can call the same split for their reasoning items and thinking blocks.
 *
 * Whether a model reasons is read from its chat template: one that holds
 * both markers teaches them. Where the answer starts is read from the
 * rendered prompt: a prompt that ends in an open <think> (DeepSeek-R1's
 * template, Qwen3's thinking models) starts the answer inside the
 * reasoning; otherwise reasoning is only a <think> block the answer opens
 * with (after white space). A block that never closes (max_tokens) is all
 * reasoning. Qwen3's enable_thinking false renders an empty closed block
 * in the prompt, so its answers are content.
 *
 * Guarantees:
 * - The split of the whole answer and the stream's pieces agree: the
 *   reasoning sent while streaming (llm_reasoning_split with done 0) is
 *   always a prefix of the final reasoning, and the content too; a marker
 *   cut between two tokens is held back, never sent as text.
 * - The reasoning is trimmed of the white space next to its markers, and
 *   the content of the white space after </think>, as the templates strip
 *   them when a turn is rendered again. */
#ifndef LLM_REASONING_H
#define LLM_REASONING_H

#include <stddef.h>

/* 1 when TEMPLATE_SRC (NULL: none) holds both <think> and </think>. */
int llm_reasoning_of(const char *template_src);

/* 1 when PROMPT (LEN bytes) ends in an open <think> block (white space after
 * it allowed): the answer starts inside the reasoning. */
int llm_reasoning_prompt_open(const char *prompt, size_t len);

/* The answer TEXT (LEN bytes) split; DONE: it is whole (a partial marker at
 * its end is text then). reasoning is [r_begin, r_end), content is
 * [c_begin, c_end); has_reasoning: the answer reasons (a block opened), so
 * a response says reasoning_content, "" or more. Before the split is known
 * (the text so far could still open a block), both are empty. */
struct llm_reasoning_split {
	size_t r_begin, r_end;
	size_t c_begin, c_end;
	int has_reasoning;
};
void llm_reasoning_split(const char *text, size_t len, int starts_open, int done, struct llm_reasoning_split *out);

#endif
