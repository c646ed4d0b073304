// The official OpenAI client (npm `openai`) against `kite serve`; run by openai_client_test.py, which installs the
// package, starts the servers and passes, in the environment: KITE_OPENAI_MODULES (the node_modules folder),
// KITE_TINY_URL and KITE_SCRIPTED_URL (the two servers' /v1), KITE_API_KEY, KITE_REFERENCES (`kite run`'s
// results as JSON), KITE_SCRIPTED_TOKENS (how many tokens the scripted checkpoint's answers generate). Prints PASS or
// FAIL per case and exits 1 when one failed.
import assert from "node:assert/strict";
import { join } from "node:path";
import { pathToFileURL } from "node:url";

const { default: OpenAI } = await import(pathToFileURL(join(process.env.KITE_OPENAI_MODULES, "openai", "index.mjs")));
const refs = JSON.parse(process.env.KITE_REFERENCES);
const scriptedTokens = JSON.parse(process.env.KITE_SCRIPTED_TOKENS);
// No retries: a 5xx or a dropped connection must show, not be retried away.
const options = { apiKey: process.env.KITE_API_KEY, maxRetries: 0, timeout: 60_000 };
const tiny = new OpenAI({ ...options, baseURL: process.env.KITE_TINY_URL });
const scripted = new OpenAI({ ...options, baseURL: process.env.KITE_SCRIPTED_URL });

let passed = 0, failed = 0;
async function test(name, fn) {
  try {
    await fn();
    passed++;
    console.log("PASS", name);
  } catch (e) {
    failed++;
    console.log("FAIL", name, e && e.stack ? e.stack : e);
  }
}

// The error the call throws: its class (the client's mapping of the status) and OpenAI's error shape.
async function rejection(promise, errorClass, status) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof errorClass, `expected ${errorClass.name}, got ${e && e.constructor.name}: ${e}`);
    assert.equal(e.status, status);
    assert.ok(e.error && typeof e.error.message === "string" && e.error.message.length > 0, JSON.stringify(e.error));
    return e;
  }
  assert.fail(`expected ${errorClass.name} (${status}), the call succeeded`);
}

const weather = {
  type: "function",
  function: { name: "get_weather", description: "The weather in a city.",
              parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] } },
};

await test("models list and retrieve", async () => {
  const ids = [];
  for await (const model of tiny.models.list()) ids.push(model.id);
  assert.deepEqual(ids, ["tiny"]);
  const model = await tiny.models.retrieve("tiny");
  assert.equal(model.id, "tiny");
  assert.equal(model.object, "model");
});

await test("completion equals kite run", async () => {
  const out = await tiny.completions.create({ model: "tiny", prompt: "The capital of France is", max_tokens: 8,
                                              temperature: 0, ignore_eos: true });
  assert.equal(out.object, "text_completion");
  assert.equal(out.choices[0].text, refs.completion.text);
  assert.equal(out.choices[0].finish_reason, "length");
  assert.deepEqual(out.usage, { prompt_tokens: refs.completion.prompt_tokens.length, completion_tokens: 8,
                                total_tokens: refs.completion.prompt_tokens.length + 8 });
});

await test("streamed completion with usage", async () => {
  const stream = await tiny.completions.create({ model: "tiny", prompt: "The capital of France is", max_tokens: 8,
                                                 temperature: 0, ignore_eos: true, stream: true,
                                                 stream_options: { include_usage: true } });
  let text = "", usage = null, finish = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.choices.length === 0) {
      usage = chunk.usage;
      continue;
    }
    assert.equal(chunk.usage, null); // the usage comes alone, last
    text += chunk.choices[0].text;
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.ok(chunks > 2, `${chunks} chunks`);
  assert.equal(text, refs.completion.text);
  assert.equal(finish, "length");
  assert.equal(usage.completion_tokens, 8);
  assert.equal(usage.prompt_tokens, refs.completion.prompt_tokens.length);
});

await test("n seeded choices, streamed with logprobs, match the whole response", async () => {
  const body = { model: "tiny", prompt: "Once upon a time", max_tokens: 8, temperature: 1, seed: 5, n: 2,
                 logprobs: 2, ignore_eos: true };
  const whole = await tiny.completions.create(body);
  assert.deepEqual(whole.choices.map((c) => c.index), [0, 1]);
  assert.equal(whole.usage.completion_tokens, 16);
  const stream = await tiny.completions.create({ ...body, stream: true });
  const text = ["", ""], logprobs = [0, 1].map(() => ({ tokens: [], token_logprobs: [], top_logprobs: [],
                                                        text_offset: [] }));
  for await (const chunk of stream) {
    const choice = chunk.choices[0];
    text[choice.index] += choice.text;
    for (const key of Object.keys(logprobs[choice.index])) logprobs[choice.index][key].push(...choice.logprobs[key]);
  }
  for (const i of [0, 1]) {
    assert.equal(text[i], whole.choices[i].text);
    assert.deepEqual(logprobs[i], whole.choices[i].logprobs);
  }
});

await test("echo with max_tokens 0 is the prompt alone", async () => {
  const out = await tiny.completions.create({ model: "tiny", prompt: "The capital of France is", max_tokens: 0,
                                              echo: true });
  assert.equal(out.choices[0].text, "The capital of France is");
  assert.equal(out.usage.completion_tokens, 0);
});

await test("chat equals kite run on the rendered prompt", async () => {
  const out = await tiny.chat.completions.create({ model: "tiny", messages: [{ role: "user", content: "Hello!" }],
                                                   max_tokens: 6, temperature: 0, ignore_eos: true });
  assert.equal(out.object, "chat.completion");
  const message = out.choices[0].message;
  assert.equal(message.role, "assistant");
  assert.equal(message.content, refs.chat.text);
  assert.equal(out.usage.prompt_tokens, refs.chat.prompt_tokens.length);
  assert.equal(out.usage.completion_tokens, 6);
});

await test("chat with tools gives reasoning_content and tool_calls", async () => {
  const out = await scripted.chat.completions.create({
    model: "scripted", messages: [{ role: "user", content: "What is the weather in Paris?" }], tools: [weather],
    temperature: 0 });
  const choice = out.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  assert.equal(choice.message.reasoning_content, "ok");
  assert.equal(choice.message.content, "Sure");
  assert.equal(choice.message.tool_calls.length, 1);
  const call = choice.message.tool_calls[0];
  assert.match(call.id, /^chatcmpl-tool-[0-9a-f]{32}$/);
  assert.equal(call.type, "function");
  assert.equal(call.function.name, "get_weather");
  assert.deepEqual(JSON.parse(call.function.arguments), { city: "Paris" });
});

await test("streamed chat with include_usage, tools and reasoning", async () => {
  const stream = await scripted.chat.completions.create({
    model: "scripted", messages: [{ role: "user", content: "What is the weather in Paris?" }], tools: [weather],
    temperature: 0, stream: true, stream_options: { include_usage: true } });
  let reasoning = "", content = "", calls = [], finish = null, usage = null, role = null;
  for await (const chunk of stream) {
    if (chunk.choices.length === 0) {
      usage = chunk.usage;
      continue;
    }
    const delta = chunk.choices[0].delta;
    role = role ?? delta.role;
    reasoning += delta.reasoning_content ?? "";
    content += delta.content ?? "";
    for (const c of delta.tool_calls ?? []) calls.push(c);
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(role, "assistant");
  assert.equal(reasoning, "ok");
  assert.equal(content, "Sure");
  assert.equal(calls.length, 1);
  assert.equal(calls[0].index, 0);
  assert.equal(calls[0].function.name, "get_weather");
  assert.deepEqual(JSON.parse(calls[0].function.arguments), { city: "Paris" });
  assert.equal(finish, "tool_calls");
  assert.equal(usage.completion_tokens, scriptedTokens.answer); // the scripted chain and the end of text
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
});

await test("without tools the call is text", async () => {
  const out = await scripted.chat.completions.create({
    model: "scripted", messages: [{ role: "user", content: "Hi" }], temperature: 0 });
  const message = out.choices[0].message;
  assert.equal(out.choices[0].finish_reason, "stop");
  assert.equal(message.reasoning_content, "ok");
  assert.equal(message.content, 'Sure<tool_call>{"name": "get_weather","arguments": {"city":"Paris"}}</tool_call>');
  assert.ok(!message.tool_calls || message.tool_calls.length === 0, JSON.stringify(message));
});

const lookup = { type: "function", function: { name: "lookup", parameters: { type: "object" } } };

await test("tool_choice required and a named function", async () => {
  const messages = [{ role: "user", content: "What is the weather in Paris?" }];
  // Thinking on (the default): the script reasons, then the opening is inserted after its </think>.
  let out = await scripted.chat.completions.create({ model: "scripted", messages, tools: [weather, lookup],
                                                     tool_choice: "required", temperature: 0 });
  assert.equal(out.choices[0].finish_reason, "tool_calls");
  assert.equal(out.choices[0].message.content, null);
  assert.equal(out.choices[0].message.reasoning_content, "ok");
  assert.equal(out.choices[0].message.tool_calls[0].function.name, "get_weather");
  assert.deepEqual(JSON.parse(out.choices[0].message.tool_calls[0].function.arguments), { city: "Paris" });
  assert.equal(out.usage.completion_tokens, scriptedTokens.thought + scriptedTokens.required);
  // Named, thinking off: the name is the request's, the arguments the model's; OpenAI's finish_reason for it is
  // "stop".
  out = await scripted.chat.completions.create({ model: "scripted", messages, tools: [weather, lookup],
                                                 tool_choice: { type: "function", function: { name: "lookup" } },
                                                 temperature: 0, chat_template_kwargs: { enable_thinking: false } });
  assert.equal(out.choices[0].finish_reason, "stop");
  assert.equal(out.choices[0].message.tool_calls.length, 1);
  assert.equal(out.choices[0].message.tool_calls[0].function.name, "lookup");
  assert.deepEqual(JSON.parse(out.choices[0].message.tool_calls[0].function.arguments), { city: "Paris" });
  assert.equal(out.usage.completion_tokens, scriptedTokens.named);
  const stream = await scripted.chat.completions.create({ model: "scripted", messages, tools: [weather],
                                                          tool_choice: "required", temperature: 0, stream: true });
  const calls = [];
  let finish = null, content = "", reasoning = "";
  for await (const chunk of stream) {
    content += chunk.choices[0].delta.content ?? "";
    reasoning += chunk.choices[0].delta.reasoning_content ?? "";
    for (const c of chunk.choices[0].delta.tool_calls ?? []) calls.push(c);
    finish = chunk.choices[0].finish_reason ?? finish;
  }
  assert.equal(content, "");
  assert.equal(reasoning, "ok");
  assert.equal(calls.length, 1);
  assert.equal(calls[0].function.name, "get_weather");
  assert.equal(finish, "tool_calls");
  const e = await rejection(scripted.chat.completions.create({ model: "scripted", messages, tools: [weather],
                                                               tool_choice: { type: "function",
                                                                              function: { name: "other" } } }),
                            OpenAI.BadRequestError, 400);
  assert.equal(e.param, "tool_choice");
  assert.match(e.message, /other/);
});

await test("chat logprobs, streamed and not", async () => {
  const body = { model: "tiny", messages: [{ role: "user", content: "Hello!" }], max_tokens: 6, temperature: 0,
                 ignore_eos: true, logprobs: true, top_logprobs: 2 };
  const out = await tiny.chat.completions.create(body);
  const content = out.choices[0].logprobs.content;
  assert.equal(content.length, 6);
  for (const entry of content) {
    assert.equal(typeof entry.token, "string");
    assert.ok(entry.logprob <= 0, JSON.stringify(entry));
    assert.equal(entry.top_logprobs.length, 2);
    assert.equal(entry.top_logprobs[0].logprob, entry.logprob); // greedy: the sampled token is the best
  }
  // the tokens' bytes put together are the answer kite run gives on the rendered prompt
  assert.equal(Buffer.from(content.flatMap((entry) => entry.bytes)).toString("utf8"), refs.chat.text);
  const streamed = [];
  for await (const chunk of await tiny.chat.completions.create({ ...body, stream: true }))
    for (const entry of chunk.choices[0]?.logprobs?.content ?? []) streamed.push(entry);
  assert.deepEqual(streamed, content);
});

await test("400 names the field", async () => {
  let e = await rejection(tiny.completions.create({ model: "tiny", prompt: "x", temperature: -1 }),
                          OpenAI.BadRequestError, 400);
  assert.equal(e.param, "temperature");
  assert.match(e.message, /temperature/);
  e = await rejection(tiny.chat.completions.create({ model: "tiny", messages: [] }), OpenAI.BadRequestError, 400);
  assert.equal(e.param, "messages");
  e = await rejection(tiny.completions.create({ model: "tiny", prompt: "x", max_tokens: 2, suffix: "y" }),
                      OpenAI.BadRequestError, 400);
  assert.equal(e.param, "suffix");
  e = await rejection(tiny.completions.create({ model: "tiny", prompt: Array(5000).fill(1), max_tokens: 2 }),
                      OpenAI.BadRequestError, 400);
  assert.match(e.message, /5000/);
});

await test("401 without the key", async () => {
  const stranger = new OpenAI({ ...options, apiKey: "wrong-key", baseURL: process.env.KITE_TINY_URL });
  await rejection(stranger.models.list(), OpenAI.AuthenticationError, 401);
  await rejection(stranger.completions.create({ model: "tiny", prompt: "x", max_tokens: 1 }),
                  OpenAI.AuthenticationError, 401);
});

await test("404 for another model", async () => {
  let e = await rejection(tiny.models.retrieve("other"), OpenAI.NotFoundError, 404);
  assert.equal(e.param, "model");
  e = await rejection(tiny.completions.create({ model: "other", prompt: "x", max_tokens: 1 }), OpenAI.NotFoundError,
                      404);
  assert.equal(e.param, "model");
  e = await rejection(tiny.chat.completions.create({ model: "other", messages: [{ role: "user", content: "x" }] }),
                      OpenAI.NotFoundError, 404);
  assert.equal(e.param, "model");
});

console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
