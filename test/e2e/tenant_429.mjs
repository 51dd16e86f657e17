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

// Drains the tenant's bucket with the non-retrying client; returns how many requests passed
// before the 429 and the error's class name.
async function drain() {
  let n = 0;
  for (; n < 200; n++) {
    try {
      await noRetry.chat.completions.create({ model, messages, max_tokens: 2 });
    } catch (err) {
      return [n, err?.constructor?.name];
    }
  }
  return [n, null];
}

// The retrying client must meet the empty bucket: on a loaded machine more than the refill
// interval (1 s at 60 a minute) can pass between the 429 and its first request, which then
// rightly succeeds at once. That round proves nothing about retries, so the bucket is drained
// again and the retry tried again, at most three rounds.
const [burst, burstError] = await drain();
let ok = false, content = null, error = null, elapsedMs = 0, rounds = 0;
for (; rounds < 3; rounds++) {
  if (rounds > 0) await drain();
  attempts.length = 0;
  const start = Date.now();
  try {
    const r = await retrying.chat.completions.create({ model, messages, max_tokens: 2 });
    ok = true;
    content = r.choices[0].message.content;
  } catch (err) {
    ok = false;
    error = String(err?.message ?? err);
  }
  elapsedMs = Date.now() - start;
  if (attempts.length === 0 || attempts[0].status !== 200) break;
}
console.log(JSON.stringify({ burst, burstError, ok, content, error, elapsedMs, rounds: rounds + 1, attempts }));
