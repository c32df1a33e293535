// tests/js/tools.mjs: tool calls through the official openai client, against
// llm-serve running a template that teaches <tool_call> blocks.
// Usage: LLM_SERVE_URL=http://127.0.0.1:PORT/v1 node tools.mjs
// Prints unnumbered TAP lines. Every call has a timeout and no retries.
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.LLM_SERVE_URL, apiKey: 'none', maxRetries: 0, timeout: 60000 });
const model = 'stories260K';
let failed = 0;
const ok = (c, d) => { console.log(`${c ? 'ok' : 'not ok'} - openai tools: ${d}`); if (!c) failed = 1; };
async function t(desc, f) {
	try { ok(await f(), desc); } catch (e) { ok(false, `${desc} (${e.constructor.name}: ${e.message})`); }
}

const tools = [
	{ type: 'function', function: { name: 'weather', parameters: { type: 'object',
		properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'] } } },
];
const messages = [{ role: 'user', content: 'Weather in Oslo?' }];

await t('chat.completions.create, tool_choice required: message.tool_calls with JSON arguments', async () => {
	const r = await client.chat.completions.create({ model, messages, tools, tool_choice: 'required', max_tokens: 120,
		temperature: 0 });
	const c = r.choices[0], call = c.message.tool_calls?.[0];
	return c.finish_reason === 'tool_calls' && call?.type === 'function' && call.function.name === 'weather' &&
		typeof JSON.parse(call.function.arguments).city === 'string' && c.message.content === null;
});

await t('streamed: the tool-call deltas assemble (as the client SDK accumulates them) into the same call', async () => {
	const stream = await client.chat.completions.create({ model, messages, tools, tool_choice: 'required', max_tokens: 120,
		temperature: 0, stream: true });
	const calls = [];
	let finish = null;
	for await (const chunk of stream) {
		const ch = chunk.choices[0];
		for (const d of ch?.delta?.tool_calls ?? []) {
			calls[d.index] ??= { id: '', name: '', args: '' };
			calls[d.index].id += d.id ?? '';
			calls[d.index].name += d.function?.name ?? '';
			calls[d.index].args += d.function?.arguments ?? '';
		}
		finish = ch?.finish_reason ?? finish;
	}
	return calls.length === 1 && calls[0].name === 'weather' && typeof JSON.parse(calls[0].args).city === 'string' &&
		finish === 'tool_calls';
});

await t('a tool_choice naming a function not among the tools is BadRequestError (400)', async () => {
	try {
		await client.chat.completions.create({ model, messages, tools, max_tokens: 8,
			tool_choice: { type: 'function', function: { name: 'nope' } } });
		return false;
	} catch (e) { return e.status === 400 && e.constructor.name === 'BadRequestError'; }
});
process.exit(failed);
