// tests/js/toolloop.mjs: whole tool loops (a call, the tool's result, a
// final answer) driven by real clients against llm-serve: the openai
// client's chat.completions.runTools, the Vercel AI SDK's multi-step
// generateText/streamText (@ai-sdk/openai-compatible, stopWhen) and
// LangChain's ChatOpenAI with bindTools (@langchain/openai), each streamed
// and not. Their second request carries the assistant turn with
// content null and tool_calls, then the tool message.
// Usage: LLM_SERVE_URL=http://127.0.0.1:PORT/v1 LLM_FORMAT=hermes node toolloop.mjs
// Prints unnumbered TAP lines. Every call has a timeout and no retries.
//
// A random-weight model cannot decide when to call and when to answer, so
// the test decides as a model would: the first turn is forced to call
// (tool_choice "required"), the turn after the tool's result to answer
// (tool_choice "none") in one short sentence (guided_regex: runTools
// refuses an answer cut by max_tokens, and a random model never ends one).
// The AI SDK does that with its own prepareStep (toolChoice, providerOptions);
// for runTools and LangChain, which send the same fields every turn, the
// client's fetch option sets them on a request whose last message is a tool
// result.
import OpenAI from 'openai';
import { createOpenAICompatible } from '@ai-sdk/openai-compatible';
import { generateText, streamText, tool, jsonSchema, stepCountIs } from 'ai';
import { ChatOpenAI } from '@langchain/openai';
import { HumanMessage, ToolMessage } from '@langchain/core/messages';

const baseURL = process.env.LLM_SERVE_URL, fmt = process.env.LLM_FORMAT ?? 'hermes';
const model = process.env.LLM_MODEL ?? 'stories260K';
let failed = 0;
const ok = (c, d) => { console.log(`${c ? 'ok' : 'not ok'} - tool loop (${fmt}): ${d}`); if (!c) failed = 1; };
async function t(desc, f) {
	try { ok(await f(), desc); } catch (e) { ok(false, `${desc} (${e.constructor.name}: ${e.message})`); }
}

const answer = { tool_choice: 'none', guided_regex: '[A-Z][a-z]{1,9}( [a-z]{1,9}){1,3}\\.' };
const params = { type: 'object', properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'] };
const sent = [];   // the bodies the openai client (or LangChain's) sent
const steer = async (url, init) => {
	const body = JSON.parse(init.body);
	if (body.messages.at(-1).role === 'tool')
		Object.assign(body, answer);
	sent.push(body);
	return fetch(url, { ...init, body: JSON.stringify(body) });
};
const client = new OpenAI({ baseURL, apiKey: 'none', maxRetries: 0, timeout: 60000, fetch: steer });

for (const stream of [false, true]) {
	await t(`openai runTools${stream ? ', streamed' : ''}: call, the tool's result, a final answer`, async () => {
		sent.length = 0;
		const cities = [];
		const runner = client.chat.completions.runTools({
			model, messages: [{ role: 'user', content: 'Weather in Oslo?' }], max_tokens: 120, temperature: 0,
			tool_choice: 'required', stream,
			tools: [{ type: 'function', function: { name: 'weather', parameters: params, parse: JSON.parse,
				function: async ({ city }) => { cities.push(city); return `sunny in ${city}`; } } }],
		});
		const final = await runner.finalContent();
		const msgs = runner.messages;
		const second = sent[1]?.messages ?? [];
		const asst = second.find((m) => m.role === 'assistant');
		return cities.length === 1 && typeof cities[0] === 'string' && sent.length === 2 &&
			asst && asst.tool_calls?.length === 1 && (asst.content ?? null) === null &&
			second.at(-1).role === 'tool' && second.at(-1).content === `sunny in ${cities[0]}` &&
			typeof final === 'string' && /^[A-Z].*\.$/.test(final) && msgs.at(-1).role === 'assistant' && !msgs.at(-1).tool_calls?.length;
	});
}

const provider = createOpenAICompatible({ name: 'llmserve', baseURL, apiKey: 'none' });
const weather = (cities) => ({ weather: tool({ description: 'The weather in a city', inputSchema: jsonSchema(params),
	execute: async ({ city }) => { cities.push(city); return `sunny in ${city}`; } }) });
const common = (cities) => ({ model: provider.chatModel(model), prompt: 'Weather in Oslo?', tools: weather(cities),
	stopWhen: stepCountIs(4), maxOutputTokens: 120, temperature: 0, maxRetries: 0,
	prepareStep: ({ stepNumber }) => stepNumber === 0 ? { toolChoice: 'required' } :
		{ toolChoice: 'none', providerOptions: { llmserve: { guided_regex: answer.guided_regex } } } });
// the steps: one call executed, then an answer in text; the second
// request's messages hold the call and its result
const loopDone = (steps, cities, text) => steps.length === 2 && cities.length === 1 &&
	steps[0].toolCalls.length === 1 && steps[0].toolCalls[0].toolName === 'weather' &&
	steps[0].toolResults.length === 1 && steps[0].finishReason === 'tool-calls' &&
	steps[1].toolCalls.length === 0 && steps[1].finishReason === 'stop' && /\.$/.test(text) &&
	typeof text === 'string' && text.length > 0 &&
	JSON.stringify(steps[1].request.body ?? '').includes('sunny in');

await t('AI SDK generateText, stopWhen stepCountIs(4): call, result, final answer', async () => {
	const cities = [];
	const r = await generateText(common(cities));
	return loopDone(r.steps, cities, r.text);
});

await t('AI SDK streamText, the same loop streamed', async () => {
	const cities = [];
	const r = streamText(common(cities));
	let streamed = '';
	for await (const d of r.textStream)
		streamed += d;
	const steps = await r.steps, text = await r.text;
	return loopDone(steps, cities, text) && streamed === text;
});
// LangChain: the model's tool call, the tool's result as a ToolMessage, the
// answer; streamed, the chunks concatenated (tool_call_chunks into calls)
const chat = new ChatOpenAI({ model, apiKey: 'none', temperature: 0, maxTokens: 120, maxRetries: 0, timeout: 60000,
	configuration: { baseURL, fetch: steer } });
const lc = chat.bindTools([{ type: 'function', function: { name: 'weather', description: 'The weather in a city',
	parameters: params } }], { tool_choice: 'required' });
for (const stream of [false, true]) {
	await t(`LangChain ChatOpenAI bindTools${stream ? ', streamed' : ''}: call, ToolMessage, final answer`, async () => {
		sent.length = 0;
		const ask = async (msgs) => {
			if (!stream)
				return lc.invoke(msgs);
			let acc;
			for await (const c of await lc.stream(msgs))
				acc = acc ? acc.concat(c) : c;
			return acc;
		};
		const human = new HumanMessage('Weather in Oslo?');
		const call = await ask([human]);
		const tc = call.tool_calls?.[0];
		if (!tc || tc.name !== 'weather' || typeof tc.args?.city !== 'string')
			return false;
		const final = await ask([human, call, new ToolMessage({ tool_call_id: tc.id, content: `sunny in ${tc.args.city}` })]);
		const second = sent[1]?.messages ?? [];
		const asst = second.find((m) => m.role === 'assistant');
		return sent.length === 2 && asst?.tool_calls?.length === 1 && second.at(-1).role === 'tool' &&
			second.at(-1).content === `sunny in ${tc.args.city}` && typeof final.content === 'string' &&
			/^[A-Z].*\.$/.test(final.content) && !final.tool_calls?.length;
	});
}
process.exit(failed);
