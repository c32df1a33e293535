// tests/js/hf.mjs: llm-serve driven by Hugging Face's JS client
// (@huggingface/inference) as its README shows it for a local server:
// new InferenceClient() with endpointUrl and no model, so the client sends
// the URL as "model" (llm-serve without adapters takes any name).
// Usage: LLM_SERVE_URL=http://127.0.0.1:PORT node hf.mjs
// Prints unnumbered TAP lines. Every call has a timeout.
import { InferenceClient } from '@huggingface/inference';

const endpointUrl = process.env.LLM_SERVE_URL;
const client = new InferenceClient(undefined, { endpointUrl, signal: AbortSignal.timeout(60000) });
let failed = 0;
const ok = (c, d) => { console.log(`${c ? 'ok' : 'not ok'} - huggingface: ${d}`); if (!c) failed = 1; };
async function t(desc, f) {
	try { ok(await f(), desc); } catch (e) { ok(false, `${desc} (${e.constructor.name}: ${e.message})`); }
}

const messages = [{ role: 'user', content: 'A story about a dog' }];
const chat = await client.chatCompletion({ messages, max_tokens: 12, temperature: 0 }).catch((e) => e);
await t('chatCompletion with endpointUrl and no model: an answer', async () => {
	if (chat instanceof Error)
		throw chat;
	return chat.choices[0].message.content.length > 0 && chat.usage.completion_tokens === 12;
});

await t('chatCompletionStream: the deltas add up to the same answer', async () => {
	let text = '';
	for await (const ch of client.chatCompletionStream({ messages, max_tokens: 12, temperature: 0 }))
		text += ch.choices[0]?.delta?.content ?? '';
	return text === chat.choices[0].message.content;
});

const inputs = 'Once upon a time', parameters = { max_new_tokens: 8, temperature: 0 };
const gen = await client.textGeneration({ inputs, parameters }).catch((e) => e);
await t('textGeneration: generated_text', async () => {
	if (gen instanceof Error)
		throw gen;
	return typeof gen.generated_text === 'string' && gen.generated_text.length > 0;
});

await t('textGenerationStream: the chunks add up to the same text', async () => {
	let text = '', n = 0;
	for await (const ch of client.textGenerationStream({ inputs, parameters }))
		text += ch.choices?.[0]?.text ?? ch.token?.text ?? '', n++;
	return n === 8 && text === gen.generated_text;
});

// TGI's chat response_format: {"type": "json", "value": a JSON Schema}
const schema = { type: 'object', properties: { name: { type: 'string', maxLength: 6 }, age: { type: 'integer' } },
	required: ['name', 'age'], additionalProperties: false };
await t('chatCompletion with TGI\'s response_format {type: json, value: schema}: JSON of that schema', async () => {
	const r = await client.chatCompletion({ messages, max_tokens: 60, temperature: 0,
		response_format: { type: 'json', value: schema } });
	const o = JSON.parse(r.choices[0].message.content);
	return Object.keys(o).join() === 'name,age' && typeof o.name === 'string' && Number.isInteger(o.age);
});

await t('chatCompletion with TGI\'s response_format {type: regex}: the text matches', async () => {
	const r = await client.chatCompletion({ messages, max_tokens: 20, temperature: 0,
		response_format: { type: 'regex', value: '[0-9]{3}-[a-z]{2}' } });
	return /^[0-9]{3}-[a-z]{2}$/.test(r.choices[0].message.content);
});
process.exit(failed);
