// Drives kvroute with the official openai npm client. Usage: node client.mjs <scenario>...
// with KVROUTE_BASE_URL (".../v1") and KVROUTE_MODEL set. Prints one JSON object mapping each
// scenario to what the client saw, checked by e2e_test.go.
import OpenAI from 'openai';

const client = new OpenAI({
  baseURL: process.env.KVROUTE_BASE_URL,
  apiKey: process.env.KVROUTE_API_KEY || 'unused',
  maxRetries: 0,
  timeout: 30_000,
});
const model = process.env.KVROUTE_MODEL;
const messages = [
  { role: 'system', content: 'You are a terse assistant. '.repeat(20) },
  { role: 'user', content: 'Say hello.' },
];

function errorInfo(err) {
  return { error: err?.constructor?.name, status: err?.status, type: err?.type ?? err?.error?.type, message: String(err?.message ?? err) };
}

const scenarios = {
  async chat() {
    const r = await client.chat.completions.create({ model, messages, max_tokens: 8 });
    return { content: r.choices[0].message.content, usage: r.usage };
  },
  async chat2() { return scenarios.chat(); },
  async stream() {
    const s = await client.chat.completions.create({ model, messages, max_tokens: 8, stream: true });
    let chunks = 0, text = '', usageChunks = 0;
    for await (const c of s) {
      chunks++;
      if (c.usage) usageChunks++;
      text += c.choices[0]?.delta?.content ?? '';
    }
    return { chunks, text, usageChunks };
  },
  async streamUsage() {
    const s = await client.chat.completions.create({ model, messages, max_tokens: 8, stream: true, stream_options: { include_usage: true } });
    let usage = null;
    for await (const c of s) if (c.usage) usage = c.usage;
    return { usage };
  },
  async completion() {
    const r = await client.completions.create({ model, prompt: 'Once upon a time', max_tokens: 8 });
    return { text: r.choices[0].text, usage: r.usage };
  },
  async models() {
    const ids = [];
    for await (const m of client.models.list()) ids.push(m.id);
    return { ids };
  },
  async badJSON() {
    try {
      await client.post('/chat/completions', { body: new TextEncoder().encode('{"model": '), headers: { 'Content-Type': 'application/json' } });
      return { error: null };
    } catch (err) { return errorInfo(err); }
  },
  async badRequest() {
    try {
      await client.chat.completions.create({ model, messages: 'not a list' });
      return { error: null };
    } catch (err) { return errorInfo(err); }
  },
  async unknownModel() {
    try {
      await client.chat.completions.create({ model: 'no-such-model', messages });
      return { error: null };
    } catch (err) { return errorInfo(err); }
  },
  async abort() {
    const s = await client.chat.completions.create({ model, messages, max_tokens: 4000, stream: true });
    let chunks = 0;
    for await (const c of s) {
      chunks++;
      if (chunks === 2) { s.controller.abort(); break; }
    }
    return { chunks, aborted: true };
  },
};

const names = process.argv.slice(2);
const results = {};
let failed = false;
for (const name of names) {
  if (!scenarios[name]) {
    console.error(`unknown scenario ${name}; known: ${Object.keys(scenarios).join(', ')}`);
    process.exit(2);
  }
  try {
    results[name] = await scenarios[name]();
  } catch (err) {
    results[name] = errorInfo(err);
    failed = true;
  }
}
console.log(JSON.stringify(results));
process.exit(failed ? 1 : 0);
