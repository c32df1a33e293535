// tests/js/messages.mjs: Anthropic's Messages API (POST /v1/messages and
// /v1/messages/count_tokens) through the official @anthropic-ai/sdk client:
// create, stream, a tool round trip (a forced tool_use, its tool_result sent
// back), stop_sequences, count_tokens, and the error shapes of a bad request
// and a bad key. Against llm-serve started with --api-key, running a
// template that teaches <tool_call> blocks.
// Usage: LLM_SERVE_ROOT=http://127.0.0.1:PORT LLM_SERVE_KEY=KEY node messages.mjs
// Prints unnumbered TAP lines. Every call has a timeout and no retries.
import Anthropic from '@anthropic-ai/sdk';

const opts = { baseURL: process.env.LLM_SERVE_ROOT, maxRetries: 0, timeout: 60000 };
const client = new Anthropic({ ...opts, apiKey: process.env.LLM_SERVE_KEY });
const model = 'stories260K';
let failed = 0;
const ok = (c, d) => { console.log(`${c ? 'ok' : 'not ok'} - anthropic messages: ${d}`); if (!c) failed = 1; };
async function t(desc, f) {
	try { ok(await f(), desc); } catch (e) { ok(false, `${desc} (${e.constructor.name}: ${e.message})`); }
}

const tools = [{ name: 'weather', description: 'The weather in a city', input_schema: { type: 'object',
	properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'] } }];
const messages = [{ role: 'user', content: 'Weather in Oslo?' }];
const forced = { model, messages, tools, tool_choice: { type: 'any' }, max_tokens: 120, temperature: 0,
	system: 'You answer with tools.' };

let use = null;
await t('messages.create, tool_choice any: a tool_use block with an input object, stop_reason tool_use', async () => {
	const m = await client.messages.create(forced);
	use = m.content.find((b) => b.type === 'tool_use');
	return m.type === 'message' && m.role === 'assistant' && m.stop_reason === 'tool_use' && use?.name === 'weather' &&
		typeof use.input.city === 'string' && m.usage.input_tokens > 0 && m.usage.output_tokens > 0;
});

await t('messages.stream: the events assemble (input_json_delta parsed by the client) into the same tool_use', async () => {
	const stream = client.messages.stream({ ...forced, tool_choice: { type: 'tool', name: 'weather' } });
	const types = [];
	stream.on('streamEvent', (e) => types.push(e.type));
	const m = await stream.finalMessage();
	const u = m.content.find((b) => b.type === 'tool_use');
	return types[0] === 'message_start' && types.at(-1) === 'message_stop' && types.includes('content_block_delta') &&
		m.stop_reason === 'tool_use' && u?.name === use?.name && JSON.stringify(u.input) === JSON.stringify(use?.input);
});

await t('the tool round trip: tool_use and tool_result sent back give a text answer', async () => {
	const m = await client.messages.create({ model, tools, max_tokens: 12, temperature: 0, messages: [...messages,
		{ role: 'assistant', content: [use] },
		{ role: 'user', content: [{ type: 'tool_result', tool_use_id: use.id, content: 'sunny, 21 C' }] }] });
	return m.content.length === 1 && m.content[0].type === 'text' && m.content[0].text.length > 0 &&
		['end_turn', 'max_tokens'].includes(m.stop_reason) && m.usage.output_tokens <= 12;
});

await t('streamed text: the text deltas add up to the unstreamed text; stop_reason max_tokens', async () => {
	const body = { model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 16, temperature: 0 };
	const ref = await client.messages.create(body);
	let text = '';
	const stream = client.messages.stream(body).on('text', (d) => { text += d; });
	const m = await stream.finalMessage();
	return text.length > 0 && text === ref.content[0].text && m.content[0].text === text && m.stop_reason === 'max_tokens' &&
		ref.stop_reason === 'max_tokens' && m.usage.output_tokens === 16;
});

await t('stop_sequences: stop_reason stop_sequence naming the string, the text before it', async () => {
	const body = { model, messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 40, temperature: 0 };
	const ref = await client.messages.create(body);
	const word = ref.content[0].text.trim().split(/\s+/)[1];
	const m = await client.messages.create({ ...body, stop_sequences: [word] });
	return m.stop_reason === 'stop_sequence' && m.stop_sequence === word && !m.content[0].text.includes(word) &&
		ref.content[0].text.startsWith(m.content[0].text);
});

await t('countTokens: the input_tokens that create reports for the same request', async () => {
	const n = await client.messages.countTokens({ model, messages, tools, system: forced.system });
	const m = await client.messages.create({ model, messages, tools, system: forced.system, max_tokens: 1 });
	return n.input_tokens > 0 && n.input_tokens === m.usage.input_tokens;
});

await t('a bad request is BadRequestError (400) with {"type": "error", "error": {"type": "invalid_request_error"}}', async () => {
	try {
		await client.messages.create({ model, messages: [], max_tokens: 8 });
		return false;
	} catch (e) {
		return e.status === 400 && e.constructor.name === 'BadRequestError' && e.error?.type === 'error' &&
			e.error.error?.type === 'invalid_request_error' && /^messages: /.test(e.error.error.message);
	}
});

await t('a bad key (x-api-key) is AuthenticationError (401) with error type authentication_error', async () => {
	try {
		await new Anthropic({ ...opts, apiKey: 'wrong' }).messages.create({ model, messages, max_tokens: 8 });
		return false;
	} catch (e) {
		return e.status === 401 && e.constructor.name === 'AuthenticationError' && e.error?.type === 'error' &&
			e.error.error?.type === 'authentication_error';
	}
});
process.exit(failed);
