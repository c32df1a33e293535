// tests/js/openai.mjs: llm-serve driven by the official openai client.
// Usage: LLM_SERVE_URL=http://127.0.0.1:PORT/v1 LLM_SERVE_KEY=KEY LLM_REF=greedy.jsonl node openai.mjs
// Prints unnumbered TAP lines (tests/run numbers them). Every call has a
// timeout and no retries, so a broken server fails fast instead of hanging.
import OpenAI from 'openai';
import { readFileSync } from 'node:fs';

const baseURL = process.env.LLM_SERVE_URL, apiKey = process.env.LLM_SERVE_KEY;
const client = new OpenAI({ baseURL, apiKey, maxRetries: 0, timeout: 60000 });
const model = 'stories260K';
let failed = 0;
const ok = (c, d) => { console.log(`${c ? 'ok' : 'not ok'} - openai: ${d}`); if (!c) failed = 1; };
const diag = (s) => console.log(`# ${String(s).split('\n').join('\n# ')}`);
async function t(desc, f) {
	try { ok(await f(), desc); } catch (e) { ok(false, `${desc} (${e.constructor.name}: ${e.message})`); }
}
async function status(f) {
	try { await f(); return 200; } catch (e) { return e.status ?? e.constructor.name; }
}

const ref = readFileSync(process.env.LLM_REF, 'utf8').trim().split('\n').map(JSON.parse);

await t('models.list names the model', async () => {
	const m = await client.models.list();
	return m.data.length === 1 && m.data[0].id === model;
});

await t('completions.create: greedy ids equal the reference (s06, 40 tokens)', async () => {
	const r = ref.find((o) => o.id === 's06');
	const c = await client.completions.create({ model, prompt: r.prompt_ids, max_tokens: 40, temperature: 0 });
	const got = c.choices[0].token_ids;
	return JSON.stringify(got) === JSON.stringify(r.ids.slice(0, 40)) && c.usage.completion_tokens === 40 &&
		c.choices[0].finish_reason === 'length';
});

const prompt = 'Once upon a time';
const full = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0 });
await t('completions.create with a text prompt: text, usage, finish_reason', async () =>
	full.choices[0].text.length > 0 && full.usage.prompt_tokens === 5 && full.usage.total_tokens === 29 &&
	full.object === 'text_completion');

await t('completions streaming: the chunks add up to the same text', async () => {
	const stream = await client.completions.create({ model, prompt, max_tokens: 24, temperature: 0, stream: true });
	let text = '', n = 0, fin = null;
	for await (const ch of stream) { text += ch.choices[0].text; n++; fin = ch.choices[0].finish_reason ?? fin; }
	return text === full.choices[0].text && n === 24 && fin === 'length';
});

await t('stop: the text ends before the stop string, finish_reason stop', async () => {
	const c = await client.completions.create({ model, prompt, max_tokens: 40, temperature: 0, stop: ['Lily'] });
	return c.choices[0].finish_reason === 'stop' && !c.choices[0].text.includes('Lily') &&
		full.choices[0].text.startsWith(c.choices[0].text);
});

await t('seed: the same seed gives the same sample, another seed another', async () => {
	const a = await client.completions.create({ model, prompt, max_tokens: 30, temperature: 1, seed: 42 });
	const b = await client.completions.create({ model, prompt, max_tokens: 30, temperature: 1, seed: 42 });
	const c = await client.completions.create({ model, prompt, max_tokens: 30, temperature: 1, seed: 43 });
	return a.choices[0].text === b.choices[0].text && a.choices[0].text !== c.choices[0].text;
});

const messages = [{ role: 'system', content: 'You tell stories.' }, { role: 'user', content: 'A story about a dog' }];
const chat = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0 });
await t('chat.completions.create: an assistant message', async () =>
	chat.choices[0].message.role === 'assistant' && chat.choices[0].message.content.length > 0 &&
	chat.usage.completion_tokens === 16 && chat.object === 'chat.completion');

await t('chat streaming: the deltas add up to the same message', async () => {
	const stream = await client.chat.completions.create({ model, messages, max_tokens: 16, temperature: 0, stream: true,
		stream_options: { include_usage: true } });
	let text = '', usage = null;
	for await (const ch of stream) {
		if (ch.choices.length) text += ch.choices[0].delta.content ?? '';
		if (ch.usage) usage = ch.usage;
	}
	return text === chat.choices[0].message.content && usage && usage.completion_tokens === 16;
});

await t('chat logprobs with top_logprobs: 2', async () => {
	const c = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0, logprobs: true,
		top_logprobs: 2 });
	const lp = c.choices[0].logprobs.content;
	return lp.length === 4 && lp.every((x) => x.logprob <= 0 && x.top_logprobs.length === 2 &&
		x.top_logprobs[0].logprob >= x.top_logprobs[1].logprob);
});

await t('logit_bias bans the greedy first token of a chat answer', async () => {
	const first = chat.choices[0].token_ids[0];
	const c = await client.chat.completions.create({ model, messages, max_tokens: 4, temperature: 0,
		logit_bias: { [String(first)]: -100 } });
	return c.choices[0].token_ids[0] !== first && c.usage.completion_tokens === 4;
});

await t('n: 2 gives two choices', async () => {
	const c = await client.chat.completions.create({ model, messages, max_tokens: 8, temperature: 1, seed: 5, n: 2 });
	return c.choices.length === 2 && c.choices[1].index === 1;
});

await t('max_tokens beyond the context: BadRequestError 400 with the numbers', async () => {
	try { await client.completions.create({ model, prompt, max_tokens: 1000 }); return false; } catch (e) {
		return e instanceof OpenAI.BadRequestError && /prompt of 5 tokens \+ max_tokens 1000 exceeds the context of 512/.test(e.message);
	}
});
await t('a wrong type: 400 naming the field', async () => {
	try { await client.completions.create({ model, prompt, temperature: 'hot' }); return false; } catch (e) {
		return e.status === 400 && e.param === 'temperature';
	}
});
await t('another model name on a server without adapters: answered by the served model', async () =>
	(await client.completions.create({ model: 'gpt-9', prompt, max_tokens: 1 })).model === model);
await t('a wrong API key: AuthenticationError 401', async () => {
	const bad = new OpenAI({ baseURL, apiKey: 'wrong', maxRetries: 0, timeout: 10000 });
	try { await bad.models.list(); return false; } catch (e) { return e instanceof OpenAI.AuthenticationError; }
});
await t('an aborted stream is cancelled on the server', async () => {
	const ac = new AbortController();
	const stream = await client.completions.create({ model, prompt, max_tokens: 500, n: 16, ignore_eos: true,
		stream: true }, { signal: ac.signal });
	let n = 0;
	try { for await (const _ of stream) { if (++n === 5) ac.abort(); } } catch (e) { /* aborted */ }
	const metrics = baseURL.replace(/\/v1$/, '') + '/metrics';
	// 30 s: a safety bound for a loaded machine; the loop ends at the event
	for (const end = Date.now() + 30000; Date.now() < end;) {
		const m = await (await fetch(metrics, { headers: { Authorization: `Bearer ${apiKey}` } })).text();
		if (/^llm_requests_total\{status="cancelled"\} 1$/m.test(m) && /^llm_kv_blocks_used 0$/m.test(m)) return true;
		await new Promise((r) => setTimeout(r, 100));
	}
	return false;
});
process.exit(failed);
