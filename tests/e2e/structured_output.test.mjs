// End-to-end test of structured outputs through megactx serve's OpenAI API,
// driven by the official `openai` npm client against the embedded default
// model on the CPU: response_format json_object and json_schema (strict; in
// chat and in completions), strict tools with tool_choice "required" and a
// named function, parallel_tool_calls false, streaming, n > 1, and the 400s
// of bad schemas and of other servers' constraint fields.
// Every constrained output is checked by an independent validator: ajv (with
// ajv-formats) against the request's own schema, JSON.parse for json_object.
//
//   node --test structured_output.test.mjs -- --megactx build/megactx --model models/default
// (or MEGACTX_BIN / MEGACTX_MODEL in the environment)
//
// The default model was never trained on JSON, so unconstrained it does not
// write any; each test's max_tokens is above the longest output its schema
// allows (bounded strings, arrays and integers, at most 8 whitespace
// characters per gap), so every constrained answer must end by itself
// (finish_reason "stop"), and a mask that let one wrong token through fails
// the validator.
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import Ajv from 'ajv';
import addFormats from 'ajv-formats';
import OpenAI from 'openai';
import { startServer, stopServer } from './megactx_server.mjs';

const NAME = 'default';
let server;
let client;
let baseURL;

before(async () => {
  ({ server, baseURL } = await startServer(NAME));
  client = new OpenAI({ apiKey: 'unused', baseURL: baseURL + '/v1', maxRetries: 0, timeout: 300000 });
});

after(() => stopServer(server));

const ajv = new Ajv({ allErrors: true, strict: true });
addFormats(ajv);

// Asserts that `value` validates under `schema` (ajv's errors in the message).
function assertValid(schema, value, what) {
  const validate = ajv.compile(schema);
  assert.ok(validate(value), `${what} does not validate: ${JSON.stringify(value)}\n` +
    JSON.stringify(validate.errors));
}

function parseJson(text, what) {
  try {
    return JSON.parse(text);
  } catch (error) {
    assert.fail(`${what} is not JSON (${error.message}): ${JSON.stringify(text)}`);
  }
}

const user = (content) => ({ role: 'user', content });
const isObject = (value) => value !== null && typeof value === 'object' && !Array.isArray(value);

// Tool-call and reasoning markup of the model's format (GLM): never in content.
const MARKUP = ['<tool_call>', '</tool_call>', '<arg_key>', '<arg_value>', '<think>', '</think>'];
function assertNoMarkup(text) {
  for (const marker of MARKUP) assert.ok(!(text ?? '').includes(marker), `markup in ${JSON.stringify(text)}`);
}

// OpenAI strict mode: every property required, no others. Enum, nested
// object, an array with minItems/maxItems, string formats, bounded strings
// (the email's maxLength keeps the output short).
const productSchema = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 16 },
    category: { type: 'string', enum: ['tool', 'toy', 'food'] },
    size: {
      type: 'object',
      properties: {
        width: { type: 'integer', minimum: 1, maximum: 99 },
        unit: { type: 'string', enum: ['cm', 'in'] },
      },
      required: ['width', 'unit'],
      additionalProperties: false,
    },
    tags: { type: 'array', items: { type: 'string', maxLength: 8 }, minItems: 1, maxItems: 3 },
    released: { type: 'string', format: 'date' },
    contact: { type: 'string', format: 'email', maxLength: 24 },
    in_stock: { type: 'boolean' },
  },
  required: ['name', 'category', 'size', 'tags', 'released', 'contact', 'in_stock'],
  additionalProperties: false,
};
const productFormat = {
  type: 'json_schema',
  json_schema: { name: 'product', schema: productSchema, strict: true },
};
// The longest answer productSchema allows is about 700 characters (most of it
// whitespace), so 800 tokens always fit it.
const productRequest = {
  model: NAME,
  messages: [user('Describe a product as JSON.')],
  temperature: 0,
  max_tokens: 800,
  response_format: productFormat,
};

test('response_format json_object: the content parses as a JSON object', async () => {
  const request = { model: NAME, messages: [user('Give me an object that says ok is true.')], temperature: 0,
    max_tokens: 64 };
  // Unconstrained, the default model answers this prompt in prose.
  const free = await client.chat.completions.create(request);
  assert.ok(!isObject((() => { try { return JSON.parse(free.choices[0].message.content); } catch { return null; } })()),
    `the unconstrained answer is already a JSON object: ${free.choices[0].message.content}`);

  const answer = await client.chat.completions.create({ ...request,
    response_format: { type: 'json_object' } });
  const choice = answer.choices[0];
  assert.equal(choice.finish_reason, 'stop', JSON.stringify(choice));
  const value = parseJson(choice.message.content, 'json_object content');
  assert.ok(isObject(value), `not an object: ${choice.message.content}`);
  assertNoMarkup(choice.message.content);
});

test('response_format json_schema strict: the content validates with ajv', async () => {
  const answer = await client.chat.completions.create(productRequest);
  const choice = answer.choices[0];
  assert.equal(choice.finish_reason, 'stop', JSON.stringify(choice));
  assertNoMarkup(choice.message.content);
  assertValid(productSchema, parseJson(choice.message.content, 'json_schema content'), 'the content');
  assert.ok(answer.usage.completion_tokens < productRequest.max_tokens);

  // The same request without the schema: the model's own answer is not a
  // valid product, so the grammar is what made the one above valid.
  const { response_format: _, ...unconstrained } = productRequest;
  const free = await client.chat.completions.create({ ...unconstrained, max_tokens: 64 });
  const validate = ajv.compile(productSchema);
  let parsed;
  try { parsed = JSON.parse(free.choices[0].message.content); } catch { parsed = undefined; }
  assert.ok(parsed === undefined || !validate(parsed), 'the unconstrained answer already validates');
});

test('response_format json_schema: streamed deltas concatenate to a valid document', async () => {
  const whole = await client.chat.completions.create(productRequest);
  const stream = await client.chat.completions.create({ ...productRequest, stream: true });
  let content = '';
  let reasoning = '';
  let finish;
  let chunks = 0;
  for await (const chunk of stream) {
    if (chunk.choices.length === 0) continue;
    chunks += 1;
    const delta = chunk.choices[0].delta;
    content += delta.content ?? '';
    reasoning += delta.reasoning_content ?? '';
    assert.equal(delta.tool_calls, undefined);
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(finish, 'stop');
  assert.ok(chunks > 3, `only ${chunks} chunks`);
  assertValid(productSchema, parseJson(content, 'the streamed content'), 'the streamed content');
  // Greedy: the stream is the whole answer.
  assert.equal(content, whole.choices[0].message.content);
  assert.equal(reasoning, whole.choices[0].message.reasoning_content ?? '');
});

test('response_format json_schema with n > 1: every choice validates', async () => {
  const answer = await client.chat.completions.create({ ...productRequest, n: 3, temperature: 1.0,
    seed: 11 });
  assert.equal(answer.choices.length, 3);
  const contents = new Set();
  for (const choice of answer.choices) {
    assert.equal(choice.finish_reason, 'stop', JSON.stringify(choice));
    assertValid(productSchema, parseJson(choice.message.content, `choice ${choice.index}`),
      `choice ${choice.index}`);
    contents.add(choice.message.content);
  }
  // Sampled at temperature 1 with their own seeds, the choices differ.
  assert.ok(contents.size > 1, 'every choice is the same');
});

test('response_format json_schema without strict: the content validates', async () => {
  const schema = {
    type: 'object',
    properties: { answer: { type: 'integer', minimum: 0, maximum: 1000 },
      unit: { type: 'string', enum: ['kg', 'g'] } },
    required: ['answer', 'unit'],
    additionalProperties: false,
  };
  const answer = await client.chat.completions.create({ model: NAME, temperature: 0,
    max_tokens: 200, messages: [user('How heavy is a cat?')],
    response_format: { type: 'json_schema', json_schema: { name: 'weight', schema } } });
  assert.equal(answer.choices[0].finish_reason, 'stop');
  assertValid(schema, parseJson(answer.choices[0].message.content, 'the content'), 'the content');
});

test('completions with response_format json_schema: the text validates with ajv', async () => {
  // The legacy completions API takes response_format too (as vLLM and SGLang
  // do): the whole completion is the document.
  const answer = await client.completions.create({ model: NAME, prompt: 'Product record:',
    temperature: 0, max_tokens: 800, response_format: productFormat });
  const choice = answer.choices[0];
  assert.equal(choice.finish_reason, 'stop', JSON.stringify(choice));
  assertValid(productSchema, parseJson(choice.text, 'the completion'), 'the completion');
});

// Strict tools: every parameter bounded, so each call is short.
const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather of a city',
    strict: true,
    parameters: {
      type: 'object',
      properties: {
        city: { type: 'string', minLength: 1, maxLength: 24 },
        unit: { type: 'string', enum: ['celsius', 'fahrenheit'] },
      },
      required: ['city', 'unit'],
      additionalProperties: false,
    },
  },
};
const timeTool = {
  type: 'function',
  function: {
    name: 'get_time',
    description: 'Current time in a time zone',
    strict: true,
    parameters: {
      type: 'object',
      properties: {
        zone: { type: 'string', maxLength: 20 },
        hours: { type: 'integer', minimum: 0, maximum: 23 },
        days: { type: 'array', items: { type: 'string', enum: ['mon', 'tue', 'wed'] }, minItems: 1,
          maxItems: 2 },
      },
      required: ['zone', 'hours', 'days'],
      additionalProperties: false,
    },
  },
};
const tools = [weatherTool, timeTool];
const byName = Object.fromEntries(tools.map((t) => [t.function.name, t.function]));

// Checks an assistant message that must be tool calls of `allowed` only.
function assertCalls(message, allowed) {
  assert.ok(Array.isArray(message.tool_calls) && message.tool_calls.length >= 1,
    `no tool calls: ${JSON.stringify(message)}`);
  assertNoMarkup(message.content);
  assert.ok(!message.content, `content beside required calls: ${JSON.stringify(message.content)}`);
  for (const call of message.tool_calls) {
    assert.equal(call.type, 'function');
    assert.ok(call.id);
    assert.ok(allowed.includes(call.function.name), `call of ${call.function.name}`);
    const args = parseJson(call.function.arguments, `${call.function.name} arguments`);
    assertValid(byName[call.function.name].parameters, args, `${call.function.name} arguments`);
  }
}

test('tool_choice required with strict tools: only calls, arguments validate', async () => {
  // The small default model calls get_weather for most prompts once tools are offered, and which
  // ones it answers in text changes with its weights. So the control forbids the call-opening
  // token with logit_bias: under auto the answer then has no call; under required the grammar
  // leaves that token the only choice at the call's start, so a call still comes, bias or not.
  const opening = await (await fetch(`${baseURL}/tokenize`, { method: 'POST',
    body: JSON.stringify({ prompt: '<tool_call>', add_special_tokens: false }) })).json();
  assert.equal(opening.tokens.length, 1, JSON.stringify(opening));
  const logit_bias = { [opening.tokens[0]]: -100 };
  const free = await client.chat.completions.create({ model: NAME, temperature: 0, max_tokens: 48,
    messages: [user('Hello!')], tools, tool_choice: 'auto', logit_bias });
  assert.equal(free.choices[0].message.tool_calls, undefined, JSON.stringify(free.choices[0]));
  for (const [prompt, bias] of [['What time is it in Tokyo?', undefined], ['Hello!', logit_bias]]) {
    const answer = await client.chat.completions.create({ model: NAME, temperature: 0,
      max_tokens: 300, messages: [user(prompt)], tools, tool_choice: 'required', logit_bias: bias });
    const choice = answer.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
    assertCalls(choice.message, ['get_weather', 'get_time']);
  }
});

test('tool_choice naming a function: calls of that function only', async () => {
  const request = { model: NAME, temperature: 0, max_tokens: 300,
    messages: [user('What is the weather in Paris? Use the tool.')], tools };
  // Left to itself the model calls get_weather here.
  const auto = await client.chat.completions.create(request);
  assert.deepEqual((auto.choices[0].message.tool_calls ?? []).map((c) => c.function.name).slice(0, 1),
    ['get_weather']);
  const named = await client.chat.completions.create({ ...request,
    tool_choice: { type: 'function', function: { name: 'get_time' } } });
  assert.equal(named.choices[0].finish_reason, 'tool_calls');
  assertCalls(named.choices[0].message, ['get_time']);
});

test('parallel_tool_calls false: at most one call', async () => {
  const request = { model: NAME, temperature: 0, max_tokens: 300, tools, tool_choice: 'required',
    messages: [user('What is the weather in Paris and in Rome?')] };
  // With parallel calls allowed the model makes more than one here.
  const parallel = await client.chat.completions.create(request);
  assertCalls(parallel.choices[0].message, ['get_weather', 'get_time']);
  assert.ok(parallel.choices[0].message.tool_calls.length > 1,
    'the model makes one call anyway; the case below proves nothing');
  const single = await client.chat.completions.create({ ...request, parallel_tool_calls: false });
  assertCalls(single.choices[0].message, ['get_weather', 'get_time']);
  assert.equal(single.choices[0].message.tool_calls.length, 1);
  assert.equal(single.choices[0].finish_reason, 'tool_calls');
});

test('tool_choice required, streamed: the tool-call deltas assemble into valid calls', async () => {
  const request = { model: NAME, temperature: 0, max_tokens: 300, tools, tool_choice: 'required',
    messages: [user('What is the weather in Paris and in Rome?')] };
  const whole = await client.chat.completions.create(request);
  const stream = await client.chat.completions.create({ ...request, stream: true });
  const calls = [];
  let content = '';
  let finish;
  for await (const chunk of stream) {
    if (chunk.choices.length === 0) continue;
    const { delta } = chunk.choices[0];
    content += delta.content ?? '';
    for (const part of delta.tool_calls ?? []) {
      if (!calls[part.index]) calls[part.index] = { id: '', type: 'function', function: { name: '', arguments: '' } };
      const call = calls[part.index];
      if (part.id) call.id = part.id;
      if (part.function?.name) call.function.name += part.function.name;
      call.function.arguments += part.function?.arguments ?? '';
    }
    if (chunk.choices[0].finish_reason) finish = chunk.choices[0].finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assertCalls({ content, tool_calls: calls }, ['get_weather', 'get_time']);
  assert.deepEqual(calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]),
    whole.choices[0].message.tool_calls.map((c) => [c.function.name, JSON.parse(c.function.arguments)]));
});

// A 400 from the server, as the client raises it, whose message names `needle`.
async function assertBadRequest(request, param, needle) {
  await assert.rejects(client.chat.completions.create({ model: NAME, messages: [user('hi')],
    max_tokens: 8, ...request }), (error) => {
    assert.ok(error instanceof OpenAI.BadRequestError, String(error));
    assert.ok(error instanceof OpenAI.APIError);
    assert.equal(error.status, 400);
    assert.equal(error.param, param, error.message);
    assert.ok(error.message.includes(needle), `"${error.message}" does not name "${needle}"`);
    return true;
  });
}

test('bad schemas, patterns and tools are a 400 naming the problem', async () => {
  const schemaFormat = (schema) => ({ response_format: { type: 'json_schema',
    json_schema: { name: 'x', schema, strict: true } } });
  await assertBadRequest(schemaFormat({ type: 'object', properties: { a: { type: 'strnig' } } }),
    'response_format', "unknown type 'strnig'");
  await assertBadRequest(schemaFormat({ type: 'string', pattern: '(ab' }), 'response_format',
    "missing ')'");
  await assertBadRequest(schemaFormat({ type: 'object', patternProperties: { a: {} } }),
    'response_format', 'patternProperties');
  await assertBadRequest(schemaFormat({ $ref: '#/$defs/missing' }), 'response_format',
    '#/$defs/missing');
  await assertBadRequest(schemaFormat({ type: 'string', format: 'color' }), 'response_format',
    "'color'");
  await assertBadRequest(schemaFormat({ type: 'integer', minimum: 5, maximum: 3 }), 'response_format',
    'minimum');
  await assertBadRequest({ response_format: { type: 'json_schema' } }, 'response_format', 'json_schema');
  await assertBadRequest({ response_format: { type: 'xml' } }, 'response_format', "'xml'");
  const badTool = { type: 'function', function: { name: 'f', strict: true,
    parameters: { type: 'object', properties: { a: { type: 'string', pattern: '[z-a]' } } } } };
  await assertBadRequest({ tools: [badTool], tool_choice: 'required' }, 'tools', "tool 'f'");
  await assertBadRequest({ tools, tool_choice: { type: 'function', function: { name: 'nope' } } },
    'tool_choice', 'nope');
  // Other servers' constraint fields are refused, never ignored.
  await assertBadRequest({ guided_json: productSchema }, 'guided_json', 'response_format');
  await assertBadRequest({ regex: '[0-9]+' }, 'regex', 'response_format');
  // The server still answers.
  const answer = await client.chat.completions.create({ ...productRequest });
  assert.equal(answer.choices[0].finish_reason, 'stop');
});
