// Browser tests of the web UI megactx serves at /: Debian's chromium,
// headless, driven by playwright-core against the real `megactx serve` on
// the default model (with MTP speculation, so MTP marks and the accepted
// length show). Chat streaming, reasoning and a tool call answered, a
// parameter taking effect, the token heat map, the rendered prompt, the
// long-document prefix reuse, a dashboard plot moving under load (and a
// data-parallel group's dashboard with a row per rank), the model card, keyboard use, the narrow layout, the API key, and no console errors
// or requests leaving the server. Screenshots go to MEGACTX_WEB_SHOTS.
//
//   node --test --test-concurrency=1 web_ui.test.mjs
//   (MEGACTX_BIN, MEGACTX_MODEL; CHROMIUM defaults to /usr/bin/chromium;
//   MEGACTX_SERVE_ARGS="--device cuda" runs the same against the CUDA server)
import { spawn } from 'node:child_process';
import { mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import readline from 'node:readline';
import { after, before, test } from 'node:test';
import assert from 'node:assert/strict';
import { chromium } from 'playwright-core';

const megactx = process.env.MEGACTX_BIN;
const model = process.env.MEGACTX_MODEL;
if (!megactx || !model) throw new Error('set MEGACTX_BIN and MEGACTX_MODEL');
const shots = process.env.MEGACTX_WEB_SHOTS ?? join(tmpdir(), 'megactx-web-shots');
mkdirSync(shots, { recursive: true });
const WAIT = 180000;  // generous: CI runs other tests beside this one on two cores

const serveArgs = (process.env.MEGACTX_SERVE_ARGS ?? '').split(' ').filter(Boolean);
const servers = [];
async function startServer(extra = []) {
  const server = spawn(megactx, ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0',
    '--kv-memory', '256MiB', ...serveArgs, ...extra], { stdio: ['ignore', 'pipe', 'pipe'] });
  servers.push(server);
  const log = [];
  server.stderr.on('data', (data) => log.push(data.toString()));
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error('server did not start:\n' + log.join(''))), 300000);
    server.on('exit', (code) => reject(new Error(`server exited with ${code}:\n` + log.join(''))));
    readline.createInterface({ input: server.stdout }).on('line', (line) => {
      const match = /at (http:\/\/\S+)/.exec(line);
      if (match) {
        clearTimeout(timer);
        resolve(match[1]);
      }
    });
  });
}

// Flags a closed network needs: without the background-networking ones
// chromium's own connections are refused and it logs errors.
async function launchBrowser() {
  const profile = mkdtempSync(join(tmpdir(), 'megactx-chromium-'));
  const context = await chromium.launchPersistentContext(profile, {
    executablePath: process.env.CHROMIUM ?? '/usr/bin/chromium',
    headless: true,
    viewport: { width: 1280, height: 860 },
    args: ['--headless', '--no-sandbox', '--disable-gpu', '--disable-quic', '--no-first-run',
      '--disable-background-networking', '--disable-component-update', '--disable-sync',
      '--disable-dev-shm-usage'],
  });
  return { context, profile };
}

let baseURL;
let browser;
let page;
const problems = [];  // console errors, page errors, requests to other origins

function watch(target, origin, sink) {
  target.on('console', (message) => {
    if (message.type() === 'error' || message.type() === 'warning')
      sink.push(`console ${message.type()}: ${message.text()}`);
  });
  target.on('pageerror', (error) => sink.push(`page error: ${error.message}`));
  target.on('request', (request) => {
    if (!request.url().startsWith(origin) && !request.url().startsWith('data:'))
      sink.push(`request off the server: ${request.url()}`);
  });
}

before(async () => {
  baseURL = await startServer(['--speculative-steps', '2']);
  browser = await launchBrowser();
  page = browser.context.pages()[0] ?? (await browser.context.newPage());
  page.setDefaultTimeout(WAIT);
  watch(page, baseURL, problems);
  await page.goto(baseURL + '/');
  await page.locator('.server-state').getByText('models/default').waitFor();
});

after(async () => {
  await browser?.context.close();
  if (browser) rmSync(browser.profile, { recursive: true, force: true });
  for (const server of servers) if (server.exitCode === null) server.kill('SIGTERM');
});

// The chat's parameter fields by name (the long-document page, mounted
// but hidden, has a "Max tokens" of its own).
const FIELDS = { 'Temperature': 'temperature', 'Max tokens': 'max_tokens' };
async function setParameter(label, value) {
  await page.locator(`#param-${FIELDS[label]}`).fill(String(value));
}

async function send(text) {
  const before = await page.getByTestId('assistant-turn').count();
  await page.locator('#composer-input').fill(text);
  await page.locator('#composer-input').press('Enter');
  const turn = page.getByTestId('assistant-turn').nth(before);
  await turn.waitFor();
  return turn;
}

async function finished(turn) {
  await turn.and(page.locator('[aria-busy="false"]')).waitFor();
  const error = await turn.locator('.error').count();
  assert.equal(error, 0, `the turn failed: ${await turn.innerText()}`);
}

test('the page and its files come compressed from the server itself', async () => {
  const sizes = await page.evaluate(() => performance.getEntriesByType('resource')
    .filter((entry) => entry.name.includes('/assets/'))
    .map((entry) => ({ name: entry.name, wire: entry.encodedBodySize, size: entry.decodedBodySize })));
  assert.ok(sizes.length >= 2, JSON.stringify(sizes));
  const script = sizes.find((entry) => entry.name.endsWith('.js'));
  assert.ok(script.wire < script.size / 2, `script not gzipped: ${JSON.stringify(script)}`);
  const response = await fetch(baseURL + '/', { headers: { 'Accept-Encoding': 'identity' } });
  assert.equal(response.headers.get('content-type'), 'text/html; charset=utf-8');
  assert.match(response.headers.get('content-security-policy'), /default-src 'self'/);
  assert.equal((await fetch(baseURL + '/assets/nothing.js')).status, 404);
});

test('chat: tokens stream in, reasoning apart, token heat map with MTP marks', async () => {
  await setParameter('Temperature', 0);
  // Long enough that the stream outlasts a busy browser's batching: with 64
  // tokens (~0.5 s) under a loaded CI machine the whole answer once arrived
  // in one render ("text did not arrive in pieces: 192").
  await setParameter('Max tokens', 256);
  // Record every length the answer's text passes through while it streams.
  await page.evaluate(() => {
    window.__lengths = [];
    new MutationObserver(() => {
      const bubbles = document.querySelectorAll('[data-testid="assistant-content"]');
      const last = bubbles[bubbles.length - 1];
      const turn = last?.closest('[data-testid="assistant-turn"]');
      const text = (turn?.querySelector('.reasoning-text')?.textContent ?? '') + (last?.textContent ?? '');
      if (window.__lengths[window.__lengths.length - 1] !== text.length) window.__lengths.push(text.length);
    }).observe(document.body, { subtree: true, childList: true, characterData: true });
  });
  const turn = await send('Tell me about the Debian project.');
  await finished(turn);
  const lengths = await page.evaluate(() => window.__lengths.filter((n) => n > 0));
  assert.ok(new Set(lengths).size >= 3, `text did not arrive in pieces: ${lengths}`);
  assert.ok((await turn.getByTestId('assistant-content').innerText()).trim().length > 0);
  const tokens = Number(await turn.getByTestId('completion-tokens').innerText());
  assert.ok(tokens > 1);
  assert.ok(Number(await turn.getByTestId('ttft').innerText()) >= 0);

  await turn.getByRole('button', { name: 'Tokens' }).click();
  const spans = turn.locator('.tok');
  assert.equal(await spans.count(), tokens);
  await spans.nth(1).hover();
  await turn.locator('.alternatives tr').first().waitFor();
  assert.equal(await turn.locator('.alternatives tr').count(), 5);  // "Alternatives per token" 5
  // Speculative steps 2: some tokens were drafted by the MTP layer and accepted.
  const marked = await turn.locator('.tok.mtp').count();
  assert.ok(marked >= 1 && marked < tokens, `MTP-marked tokens: ${marked} of ${tokens}`);
  await page.screenshot({ path: join(shots, 'chat-tokens.png') });
});

test('chat: reasoning is shown apart and folds', async () => {
  await page.getByRole('button', { name: 'New chat' }).click();
  await setParameter('Max tokens', 160);
  // The default model was trained to reason aloud about sums (tools/data/synth.py).
  const turn = await send('What is 123 + 456?');
  await finished(turn);
  const reasoning = turn.getByTestId('reasoning');
  await reasoning.waitFor();
  assert.ok((await reasoning.locator('.reasoning-text').textContent()).trim().length > 0);
  // Folded once the answer came; the summary opens it.
  const open = () => reasoning.evaluate((element) => element.open);
  const wasOpen = await open();
  await reasoning.locator('summary').click();
  assert.equal(await open(), !wasOpen);
});

test('chat: a tool call is rendered and answered', async () => {
  await page.getByRole('button', { name: 'New chat' }).click();
  await page.getByLabel('Tools', { exact: true }).check();
  await page.getByLabel('Tool definitions (OpenAI JSON)').waitFor();
  const turn = await send('What is the weather in Paris? Use the tool.');
  await finished(turn);
  const calls = turn.getByTestId('tool-call');
  await calls.first().waitFor();
  const count = await calls.count();
  for (let i = 0; i < count; i++) {
    assert.equal(await calls.nth(i).locator('.tool-name').innerText(), 'get_weather');
    await calls.nth(i).getByLabel('Result of get_weather').fill('{"temperature_c": 21}');
  }
  assert.match(await calls.first().locator('pre').innerText(), /Paris/);
  assert.equal(await turn.getByTestId('finish-reason').innerText(), 'tool_calls');
  await page.screenshot({ path: join(shots, 'chat-tool-call.png') });
  await turn.getByRole('button', { name: 'Send tool results' }).click();
  const reply = page.getByTestId('assistant-turn').nth(1);
  await finished(reply);
  assert.equal(await page.locator('.turn.tool').count(), count);
  await page.getByLabel('Tools', { exact: true }).uncheck();
});

test('chat: a changed parameter takes effect, and the rendered prompt', async () => {
  await page.getByRole('button', { name: 'New chat' }).click();
  await setParameter('Max tokens', 3);
  await page.getByLabel('Thinking (reasoning before the answer)').uncheck();
  const turn = await send('Count: 1, 2, 3,');
  await finished(turn);
  assert.equal(await turn.getByTestId('completion-tokens').innerText(), '3');
  assert.equal(await turn.getByTestId('finish-reason').innerText(), 'length');

  await page.locator('#composer-input').fill('And then?');
  await page.getByRole('button', { name: 'Prompt' }).click();
  const count = page.getByTestId('prompt-tokens');
  await count.waitFor();
  assert.ok(parseInt(await count.innerText(), 10) > 5);
  const prompt = await page.locator('.prompt-text').innerText();
  assert.match(prompt, /<\|user\|>\s*Count: 1, 2, 3,/);
  assert.match(prompt, /And then\?/);
  assert.match(prompt, /<\/think>/);  // thinking off: the template closes the think block
  await page.getByRole('button', { name: 'Close' }).click();
  await page.locator('#composer-input').fill('');
  await page.getByLabel('Thinking (reasoning before the answer)').check();
  await setParameter('Max tokens', 512);
});

test('long document: token count, and the prefix cache on the next question', async () => {
  await page.goto(baseURL + '/#/document');
  await page.getByRole('button', { name: /pass-key sample/ }).click();
  await page.waitForFunction(() => Number(document.querySelector('[data-testid="document-tokens"]')?.textContent) > 5000);
  const documentTokens = Number(await page.getByTestId('document-tokens').innerText());
  const ask = page.getByRole('button', { name: 'Ask', exact: true });
  await ask.click();
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="document-runs"] tbody tr').length === 1 &&
    !document.querySelector('[data-testid="document-runs"] tbody tr td.answer')?.textContent.startsWith('…'));
  await ask.waitFor({ state: 'visible' });
  await page.waitForFunction(() => !document.querySelector('.ask button').disabled);
  await page.getByLabel('Question').fill('Which pass key was hidden in the text?');
  await ask.click();
  await page.waitForFunction(() => document.querySelectorAll('[data-testid="document-runs"] tbody tr').length === 2 &&
    !document.querySelector('.ask button').disabled);
  const cached = await page.getByTestId('cached-tokens').allInnerTexts();
  const second = parseInt(cached[1], 10);
  assert.ok(second >= documentTokens - 128, `second question reused ${second} of ${documentTokens} tokens`);
  assert.ok(parseInt(cached[0], 10) < second);
  await page.screenshot({ path: join(shots, 'long-document.png'), fullPage: true });
});

test('dashboard: plots move while the server is under load', async () => {
  await page.goto(baseURL + '/#/dashboard');
  const chart = page.getByTestId('chart-outputTokensPerSecond');
  await page.waitForFunction(() => Number(document.querySelector('[data-testid="chart-outputTokensPerSecond"]')?.dataset.samples) >= 2);
  const samplesBefore = Number(await chart.getAttribute('data-samples'));
  const finishedBefore = Number(await page.getByTestId('tile-finished').locator('.tile-value').innerText());
  // Load from outside the page: four streams of 480 tokens each, long enough that the
  // once-a-second poll sees them running (at 160 tokens an idle machine could finish them
  // between two polls, and the running series would never leave 0).
  const load = Array.from({ length: 4 }, (_, i) => fetch(baseURL + '/v1/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: `Load ${i}: the Debian project`, max_tokens: 480, ignore_eos: true, temperature: 0.8 }),
  }).then((response) => response.json()));
  // The newest point of the tokens/s series rises above 0 while the load runs, and a poll
  // sees requests running and KV pages held.
  await page.waitForFunction(() => Number(document.querySelector('[data-testid="tile-tps"] .tile-value')?.textContent) > 0);
  await page.waitForFunction(() => Number(document.querySelector('[data-testid="chart-running"]')?.dataset.max) >= 1
    && Number(document.querySelector('[data-testid="chart-kvUsed"]')?.dataset.max) >= 1);
  await page.screenshot({ path: join(shots, 'dashboard.png') });
  await Promise.all(load);
  await page.waitForFunction((n) => Number(document.querySelector('[data-testid="tile-finished"] .tile-value')?.textContent) >= n + 4, finishedBefore);
  assert.ok(Number(await chart.getAttribute('data-samples')) > samplesBefore);
  assert.ok(Number(await page.getByTestId('chart-running').getAttribute('data-max')) >= 1);
  assert.ok(Number(await page.getByTestId('chart-kvUsed').getAttribute('data-max')) >= 1);
  assert.ok(await page.locator('.chart canvas').count() >= 7);
});

test('model card: layer schedule with IndexShare and the KV facts', async () => {
  await page.goto(baseURL + '/#/model');
  const strip = page.getByRole('list', { name: 'Layer schedule' });
  await strip.waitFor();
  const kinds = await strip.locator('.layer-kind').allInnerTexts();
  assert.deepEqual(kinds, ['F', 'F', 'F', 'S', 'S', 'S', 'F', 'S', 'F']);  // 8 layers + MTP
  assert.match(await page.locator('.model-card').innerText(), /4 full indexer layers, 4 shared/);
  assert.match(await page.locator('.model-card').innerText(), /bytes per token/);
  await page.screenshot({ path: join(shots, 'model-card.png'), fullPage: true });
});

test('keyboard: the pages are reachable by Tab and Enter, Esc stops a reply', async () => {
  // A fresh load of a page that focuses nothing: Tab starts at the top.
  await page.goto(baseURL + '/#/model');
  await page.reload();
  await page.getByRole('list', { name: 'Layer schedule' }).waitFor();
  const reached = [];
  for (let i = 0; i < 6; i++) {
    await page.keyboard.press('Tab');
    reached.push(await page.evaluate(() => document.activeElement?.textContent?.trim()));
  }
  assert.ok(reached.includes('Skip to content'), reached.join(' | '));
  assert.ok(reached.includes('Dashboard'), reached.join(' | '));
  while ((await page.evaluate(() => document.activeElement?.textContent?.trim())) !== 'Dashboard')
    await page.keyboard.press('Shift+Tab');
  await page.keyboard.press('Enter');
  await page.waitForFunction(() => location.hash === '#/dashboard');

  await page.goto(baseURL + '/#/chat');
  await setParameter('Max tokens', 20000);
  await page.getByLabel('Ignore end of text (run to max tokens)').check();
  const turn = await send('Write a long story about a lighthouse.');
  await turn.locator('.tok, .bubble').first().waitFor();
  await page.waitForFunction(() => document.querySelector('[data-testid="assistant-turn"] [data-testid="completion-tokens"]')?.textContent > 0
    || document.querySelector('[data-testid="assistant-turn"] .reasoning-text')?.textContent.length > 0);
  await page.locator('#composer-input').press('Escape');
  await finished(turn);
  assert.equal(await turn.getByTestId('finish-reason').innerText(), 'stopped');
  await page.getByLabel('Ignore end of text (run to max tokens)').uncheck();
  await setParameter('Max tokens', 512);
});

test('narrow screen: one column, parameters behind a button, no sideways scrolling', async () => {
  await page.setViewportSize({ width: 390, height: 844 });
  await page.goto(baseURL + '/#/chat');
  const toggle = page.getByRole('button', { name: 'Parameters' });
  await toggle.waitFor();
  assert.equal(await page.locator('#chat-settings').isVisible(), false);
  await toggle.click();
  assert.equal(await page.locator('#chat-settings').isVisible(), true);
  for (const hash of ['#/chat', '#/document', '#/dashboard', '#/model']) {
    await page.goto(baseURL + '/' + hash);
    await page.waitForTimeout(300);
    const overflow = await page.evaluate(() => document.documentElement.scrollWidth - window.innerWidth);
    assert.ok(overflow <= 1, `${hash} scrolls sideways by ${overflow}px`);
  }
  await page.goto(baseURL + '/#/chat');
  await page.screenshot({ path: join(shots, 'narrow-chat.png') });
  await page.setViewportSize({ width: 1280, height: 860 });
});

test('no console errors, no requests off the server', () => {
  assert.deepEqual(problems, []);
});

test('API key: the page asks for it and then works', async () => {
  const keyed = await startServer(['--api-key', 'sesame']);
  const other = await browser.context.newPage();
  other.setDefaultTimeout(WAIT);
  const seen = [];
  watch(other, keyed, seen);
  await other.goto(keyed + '/');
  const dialog = other.getByRole('dialog', { name: 'API key' });
  await dialog.waitFor();
  await dialog.getByLabel('Key').fill('sesame');
  await dialog.getByRole('button', { name: 'Save' }).click();
  await other.locator('.server-state').getByText('models/default').waitFor();
  await other.locator('#composer-input').fill('Hello!');
  await other.locator('#composer-input').press('Enter');
  const turn = other.getByTestId('assistant-turn').first();
  await turn.and(other.locator('[aria-busy="false"]')).waitFor();
  assert.equal(await turn.locator('.error').count(), 0);
  // The only errors are the 401s that made the page ask.
  const unexpected = seen.filter((line) => !/401/.test(line));
  assert.deepEqual(unexpected, []);
  await other.close();
});

test('dashboard of a data-parallel group: its layout and a row per rank', async () => {
  const group = await startServer(['--tensor-parallel-size', '2', '--expert-parallel-size', '2',
    '--enable-dp-attention']);
  const other = await browser.context.newPage();
  other.setDefaultTimeout(WAIT);
  const seen = [];
  watch(other, group, seen);
  await other.goto(group + '/#/dashboard');
  await other.getByTestId('group-layout').getByText('TP 2 · EP 2 · DP attention 2').waitFor();
  // Two requests at once land on both ranks (the emptier rank takes the second).
  await Promise.all([0, 1].map((i) => fetch(group + '/v1/completions', {
    method: 'POST',
    headers: { 'Content-Type': 'application/json' },
    body: JSON.stringify({ prompt: `Rank ${i}: the Debian project`, max_tokens: 24, ignore_eos: true }),
  }).then((response) => response.json())));
  await other.waitForFunction(() => [0, 1].every((r) => Number(document.querySelector(
    `[data-testid="dp-rank-${r}"] .admitted`)?.textContent) >= 1));
  await other.screenshot({ path: join(shots, 'dashboard-dp-ranks.png'), fullPage: true });
  assert.deepEqual(seen, []);
  await other.close();
});

