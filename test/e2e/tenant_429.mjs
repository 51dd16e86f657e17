// Drives kvroute's per-tenant rate limit with the official openai npm client (run by
// tenant_test.go). First a client without retries sends requests until it gets a 429 (the
// tenant's burst); then the default client (2 retries) sends one more and must succeed after
// waiting what the router advised. Prints one JSON object.
import OpenAI from 'openai';

const model = process.env.KVROUTE_MODEL;
const attempts = [];
const recordingFetch = async (url, init) => {
  const r = await fetch(url, init);
  attempts.push({ status: r.status, retryAfterMs: r.headers.get('retry-after-ms'), remaining: r.headers.get('x-ratelimit-remaining-requests') });
  return r;
};
const base = { baseURL: process.env.KVROUTE_BASE_URL, apiKey: process.env.KVROUTE_API_KEY, timeout: 20_000 };
const noRetry = new OpenAI({ ...base, maxRetries: 0 });
const retrying = new OpenAI({ ...base, fetch: recordingFetch }); // default maxRetries: 2
const messages = [{ role: 'user', content: 'Say hello.' }];

let burst = 0, burstError = null;
for (; burst < 200; burst++) {
  try {
    await noRetry.chat.completions.create({ model, messages, max_tokens: 2 });
  } catch (err) {
    burstError = err?.constructor?.name;
    break;
  }
}
const start = Date.now();
let ok = false, content = null, error = null;
try {
  const r = await retrying.chat.completions.create({ model, messages, max_tokens: 2 });
  ok = true;
  content = r.choices[0].message.content;
} catch (err) {
  error = String(err?.message ?? err);
}
console.log(JSON.stringify({ burst, burstError, ok, content, error, elapsedMs: Date.now() - start, attempts }));
