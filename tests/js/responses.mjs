// tests/js/responses.mjs: the Responses API (POST /v1/responses) through the
// official openai client: responses.create and responses.stream, streamed
// and not, a function tool round trip (a forced call, its output sent back
// as function_call_output), text.format json_schema, the refusals. Against
// llm-serve running a template that teaches <tool_call> blocks.
// Usage: LLM_SERVE_URL=http://127.0.0.1:PORT/v1 [LLM_SERVE_KEY=KEY] node responses.mjs
// Prints unnumbered TAP lines. Every call has a timeout and no retries.
import OpenAI from 'openai';

const client = new OpenAI({ baseURL: process.env.LLM_SERVE_URL, apiKey: process.env.LLM_SERVE_KEY ?? 'none', maxRetries: 0, timeout: 60000 });
const model = 'stories260K';
let failed = 0;
const ok = (c, d) => { console.log(`${c ? 'ok' : 'not ok'} - openai responses: ${d}`); if (!c) failed = 1; };
async function t(desc, f) {
	try { ok(await f(), desc); } catch (e) { ok(false, `${desc} (${e.constructor.name}: ${e.message})`); }
}

const tools = [{ type: 'function', name: 'weather', strict: false, parameters: { type: 'object',
	properties: { city: { type: 'string', maxLength: 8 } }, required: ['city'] } }];
const input = [{ role: 'user', content: 'Weather in Oslo?' }];
const forced = { model, input, tools, tool_choice: 'required', max_output_tokens: 120, temperature: 0 };

let call = null;
await t('responses.create, tool_choice required: a function_call item with JSON arguments', async () => {
	const r = await client.responses.create(forced);
	call = r.output.find((o) => o.type === 'function_call');
	return r.object === 'response' && r.status === 'completed' && call?.name === 'weather' &&
		typeof JSON.parse(call.arguments).city === 'string' && call.call_id.startsWith('call_') &&
		r.usage.input_tokens > 0 && r.usage.output_tokens > 0 && r.output_text === '';
});

await t('responses.stream: the events assemble (the client checks their order and indices) into the same call', async () => {
	const stream = client.responses.stream(forced);
	const types = [], seq = [];
	let args = '';
	stream.on('response.function_call_arguments.delta', (e) => { args += e.delta; });
	for await (const e of stream) { types.push(e.type); seq.push(e.sequence_number); }
	const r = await stream.finalResponse();
	const c = r.output.find((o) => o.type === 'function_call');
	return types[0] === 'response.created' && types[1] === 'response.in_progress' &&
		types.at(-1) === 'response.completed' && types.includes('response.output_item.added') &&
		types.includes('response.function_call_arguments.done') && types.includes('response.output_item.done') &&
		seq.every((s, i) => s === i) && c?.name === call?.name && c.arguments === call?.arguments && args === c.arguments;
});

await t('the tool round trip: function_call and function_call_output sent back give a text answer', async () => {
	const r = await client.responses.create({ model, tools, max_output_tokens: 12, temperature: 0, instructions: 'Be brief.',
		input: [...input, { type: 'function_call', call_id: call.call_id, name: call.name, arguments: call.arguments },
			{ type: 'function_call_output', call_id: call.call_id, output: 'sunny, 21 C' }] });
	return ['completed', 'incomplete'].includes(r.status) && r.output.length === 1 && r.output[0].type === 'message' &&
		r.output_text === r.output[0].content[0].text && r.usage.output_tokens > 0 && r.usage.output_tokens <= 12;
});

await t('streamed text: output_text deltas add up to the text of the unstreamed answer', async () => {
	const body = { model, input: 'Once upon a time', max_output_tokens: 16, temperature: 0 };
	const ref = await client.responses.create(body);
	const stream = await client.responses.create({ ...body, stream: true });
	let text = '', done = null, last = null;
	for await (const e of stream) {
		if (e.type === 'response.output_text.delta') text += e.delta;
		if (e.type === 'response.output_text.done') done = e.text;
		last = e;
	}
	return text.length > 0 && text === ref.output_text && done === text && last.type === 'response.incomplete' &&
		last.response.incomplete_details.reason === 'max_output_tokens' && last.response.output[0].content[0].text === text;
});

await t('text.format json_schema: the answer is JSON valid for the schema (output_parsed)', async () => {
	const r = await client.responses.parse({ model, input: 'Give a number.', max_output_tokens: 40, temperature: 0,
		text: { format: { type: 'json_schema', name: 'n', strict: true, schema: { type: 'object',
			properties: { n: { type: 'integer', minimum: 1, maximum: 9 } }, required: ['n'], additionalProperties: false } } } });
	return r.status === 'completed' && Number.isInteger(r.output_parsed?.n) && r.output_parsed.n >= 1 && r.output_parsed.n <= 9;
});

await t('previous_response_id is BadRequestError (400) naming it', async () => {
	try {
		await client.responses.create({ model, input: 'hi', previous_response_id: 'resp_1', max_output_tokens: 4 });
		return false;
	} catch (e) { return e.status === 400 && e.constructor.name === 'BadRequestError' && e.param === 'previous_response_id'; }
});

await t('store: true is BadRequestError (400) naming it', async () => {
	try {
		await client.responses.create({ model, input: 'hi', store: true, max_output_tokens: 4 });
		return false;
	} catch (e) { return e.status === 400 && e.param === 'store'; }
});
process.exit(failed);
