// tests/js/reasoning.mjs: reasoning split from the answer, read by real
// clients: the Vercel AI SDK (@ai-sdk/openai-compatible reads
// reasoning_content, streamed too) and the openai client (its chunks keep
// delta.reasoning_content). Against llm-serve running Qwen3's tokenizer
// and chat template on random weights, whose answers are forced with
// guided_regex to open with a <think> block.
// Usage: LLM_SERVE_URL=http://127.0.0.1:PORT/v1 LLM_MODEL=NAME node reasoning.mjs
// Prints unnumbered TAP lines. Every call has a timeout and no retries.
import OpenAI from 'openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, streamText, tool, jsonSchema, stepCountIs } from 'ai';

const baseURL = process.env.LLM_SERVE_URL, model = process.env.LLM_MODEL;
let failed = 0;
const ok = (c, d) => { console.log(`${c ? 'ok' : 'not ok'} - reasoning: ${d}`); if (!c) failed = 1; };
async function t(desc, f) {
	try { ok(await f(), desc); } catch (e) { ok(false, `${desc} (${e.constructor.name}: ${e.message})`); }
}

// thinking in lower-case words, then an answer that starts with "Answer"
const think = '<think>\\n[a-z]{2,8}( [a-z]{2,8}){2}\\n</think>\\n\\nAnswer [a-z]{2,8}\\.';
const provider = createOpenAICompatible({ name: 'llmserve', baseURL, apiKey: 'none' });
const base = { model: provider.chatModel(model), prompt: 'Why is the sky blue?', maxOutputTokens: 80, temperature: 0,
	maxRetries: 0, providerOptions: { llmserve: { guided_regex: think } } };
const words = /^[a-z]{2,8}( [a-z]{2,8}){2}$/, answer = /^Answer [a-z]{2,8}\.$/;

const gen = await generateText(base).catch((e) => e);
await t('AI SDK generateText: reasoningText is the thinking, text the answer after </think>', async () => {
	if (gen instanceof Error)
		throw gen;
	return words.test(gen.reasoningText) && answer.test(gen.text);
});

await t('AI SDK streamText: reasoning deltas and text deltas give the same two parts', async () => {
	const r = streamText(base);
	let reasoning = '', text = '';
	for await (const p of r.fullStream) {
		if (p.type === 'reasoning-delta')
			reasoning += p.text;
		else if (p.type === 'text-delta')
			text += p.text;
	}
	return reasoning === gen.reasoningText && text === gen.text;
});

await t('AI SDK: a tool call after the reasoning is parsed from the content (a step that calls, then one that answers)',
	async () => {
		const cities = [];
		const call = '<think>\\n[a-z]{2,8}\\n</think>\\n\\n<tool_call>\\n\\{"name": "weather", "arguments": \\{"city": "Oslo"\\}\\}\\n</tool_call>';
		const r = await generateText({ ...base, tools: { weather: tool({ inputSchema: jsonSchema({ type: 'object',
			properties: { city: { type: 'string' } }, required: ['city'] }),
		execute: async ({ city }) => { cities.push(city); return 'sunny'; } }) }, stopWhen: stepCountIs(3),
		prepareStep: ({ stepNumber }) => ({ providerOptions: { llmserve: { guided_regex: stepNumber ? think : call } } }) });
		return r.steps.length === 2 && cities.join() === 'Oslo' && /^[a-z]{2,8}$/.test(r.steps[0].reasoningText) &&
			r.steps[0].finishReason === 'tool-calls' && answer.test(r.text);
	});

const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const body = { model, messages: [{ role: 'user', content: 'Why is the sky blue?' }], max_tokens: 80, temperature: 0,
	guided_regex: think };
await t('openai client: message.reasoning_content and content; streamed, delta.reasoning_content then delta.content',
	async () => {
		const r = await client.chat.completions.create(body);
		const m = r.choices[0].message;
		let reasoning = '', content = '', order = '';
		for await (const ch of await client.chat.completions.create({ ...body, stream: true })) {
			const d = ch.choices[0]?.delta ?? {};
			if (d.reasoning_content)
				reasoning += d.reasoning_content, order += order.endsWith('r') ? '' : 'r';
			if (d.content)
				content += d.content, order += order.endsWith('c') ? '' : 'c';
		}
		return words.test(m.reasoning_content) && answer.test(m.content) && reasoning === m.reasoning_content &&
			content === m.content && order === 'rc';
	});

await t('openai client: chat_template_kwargs {enable_thinking: false} reaches the template (its prompt closes an empty block)',
	async () => {
		const p = { model, messages: body.messages, max_tokens: 1 };
		const on = await client.chat.completions.create(p);
		const off = await client.chat.completions.create({ ...p, chat_template_kwargs: { enable_thinking: false } });
		// "<think>\n\n</think>\n\n": 4 more prompt tokens in Qwen3's vocabulary
		return off.usage.prompt_tokens === on.usage.prompt_tokens + 4;
	});
process.exit(failed);
