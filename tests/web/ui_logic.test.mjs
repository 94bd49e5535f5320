// The page's pure logic, without a browser: histogram percentiles and rates
// for the dashboard (web/src/metrics.js) and how a chat turn accumulates
// streamed chunks, MTP marks included (web/src/chat_state.js).
//
//   node --test ui_logic.test.mjs
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { groupLayout, histogramQuantile, rankRows, seriesPoint } from '../../web/src/metrics.js';
import { apiMessages, applyChunk, newAssistantTurn, turnSummary } from '../../web/src/chat_state.js';

test('histogramQuantile interpolates inside the bucket, as histogram_quantile does', () => {
  const bounds = [0.1, 1, 10];
  assert.equal(histogramQuantile(0.5, bounds, [0, 0, 0, 0]), null);
  // 10 observations in (0.1, 1]: the median sits halfway through that bucket.
  assert.ok(Math.abs(histogramQuantile(0.5, bounds, [0, 10, 0, 0]) - 0.55) < 1e-9);
  // The first bucket starts at 0.
  assert.ok(Math.abs(histogramQuantile(0.5, bounds, [4, 0, 0, 0]) - 0.05) < 1e-9);
  // In the +Inf bucket only the largest bound is known.
  assert.equal(histogramQuantile(0.99, bounds, [1, 0, 0, 9]), 10);
  assert.ok(histogramQuantile(0.9, bounds, [5, 5, 0, 0]) > histogramQuantile(0.1, bounds, [5, 5, 0, 0]));
});

function snapshot(ms, generated, ttftCounts, spec = [0, 0], prefix = [0, 0]) {
  const histogram = (counts) => ({ upper_bounds: [0.1, 1], counts, sum: 0, count: counts.reduce((a, b) => a + b) });
  return {
    monotonic_ms: ms,
    time: ms / 1000,
    engine: {
      running_requests: 1, waiting_requests: 0, kv_pages_used: 3, kv_pages_total: 10,
      host_kv_pages_used: 0, host_kv_pages_total: 0,
      prefix_cache_hits: prefix[0], prefix_cache_queries: prefix[1],
      spec_accepted_tokens: spec[0], spec_verify_steps: spec[1],
    },
    counters: { generated_tokens: generated, requests_finished: 0, requests_aborted: 0, requests_failed: 0 },
    histograms: { time_to_first_token: histogram(ttftCounts), time_per_output_token: histogram([0, 0, 0]) },
  };
}

test('seriesPoint: rates and windowed percentiles from snapshot differences', () => {
  const history = [
    snapshot(0, 0, [5, 0, 0]),
    snapshot(1000, 50, [5, 0, 0], [0, 0], [0, 100]),
    snapshot(2000, 150, [5, 4, 0], [30, 20], [80, 200]),
  ];
  const point = seriesPoint(history, { rateSeconds: 1, windowSeconds: 1 });
  assert.equal(point.outputTokensPerSecond, 100);
  // Only the 4 observations of the last second count: all in (0.1, 1] s.
  assert.ok(point.ttftP50 > 100 && point.ttftP50 <= 1000, String(point.ttftP50));
  assert.equal(point.specAcceptLength, 2.5);  // 1 + 30 accepted / 20 steps
  assert.equal(point.prefixHitRate, 80);      // 80 of 100 tokens in the window
  assert.equal(point.prefixHitRateTotal, 40);
  assert.equal(seriesPoint(history.slice(0, 2), { windowSeconds: 1 }).specAcceptLength, null);
  assert.equal(point.hostLatentHitRate, null);  // no live host tier on this server
  assert.equal(point.graphReplayShare, null);  // no CUDA Graphs on this server
  const tier = snapshot(3000, 150, [5, 4, 0]);
  Object.assign(tier.engine, { host_latent_selected_entries: 400, host_latent_hot_hits: 300,
    host_latent_copied_bytes: 6.56e6, host_latent_read_steps: 10 });
  const tierPoint = seriesPoint([...history, tier]);
  assert.equal(tierPoint.hostLatentHitRate, 75);
  assert.equal(tierPoint.hostLatentCopiedPerStep, 6.56e5);
  const graphs = snapshot(4000, 160, [5, 4, 0]);
  Object.assign(graphs.engine, { graph_replays: 90, graph_eager_steps: 10 });
  assert.equal(seriesPoint([...history, graphs]).graphReplayShare, 90);
});

test('rankRows and groupLayout: the data-parallel ranks and the group in words', () => {
  const rank = (running, admissions, free, sampled) => ({ running_requests: running, admissions,
    kv_pages_total: 100, kv_pages_free: free, prefix_cache_pages: 3, sampled_rows: sampled });
  const at = (ms, ranks) => ({ monotonic_ms: ms, engine: { data_parallel_ranks: ranks } });
  const history = [at(0, [rank(0, 0, 100, 0), rank(0, 0, 100, 0)]),
    at(2000, [rank(2, 3, 60, 40), rank(1, 1, 90, 10)])];
  const rows = rankRows(history);
  assert.equal(rows.length, 2);
  assert.deepEqual(rows[0], { rank: 0, running: 2, admissions: 3, kvHeld: 40, kvTotal: 100,
    prefixPages: 3, sampledPerSecond: 20 });
  assert.equal(rows[1].sampledPerSecond, 5);
  assert.equal(rankRows([at(0, [rank(1, 1, 50, 5)])])[0].sampledPerSecond, null);  // one snapshot
  assert.deepEqual(rankRows([{ monotonic_ms: 0, engine: {} }]), []);  // one process
  assert.equal(groupLayout({ tensor_parallel_size: 1 }), '');
  assert.equal(groupLayout({ tensor_parallel_size: 4, expert_parallel_size: 4,
    enable_dp_attention: true, dp_size: 2, enable_layer_split: true }),
  'TP 4 · EP 4 · DP attention 2 · LayerSplit');
});

const chunk = (delta, entries, finish = null) => ({
  choices: [{ index: 0, delta, logprobs: entries ? { content: entries } : null, finish_reason: finish }],
});
const entry = (token) => ({ token, logprob: -0.1, top_logprobs: [] });

test('applyChunk: content, reasoning, tool calls by index, MTP marks per engine step', () => {
  const turn = newAssistantTurn(0);
  applyChunk(turn, chunk({ role: 'assistant', content: '' }), 5);
  assert.equal(turn.stats.firstAt, null);  // the role chunk is no token
  applyChunk(turn, chunk({ reasoning_content: 'think' }, [entry('think')]), 10);
  // One engine step with two accepted drafts and its own token: 3 entries.
  applyChunk(turn, chunk({ content: 'a b c' }, [entry('a'), entry(' b'), entry(' c')]), 20);
  applyChunk(turn, chunk({ tool_calls: [{ index: 0, id: 'call_1', type: 'function', function: { name: 'f', arguments: '{"x"' } }] }), 30);
  applyChunk(turn, chunk({ tool_calls: [{ index: 0, function: { arguments: ': 1}' } }] }, null, 'tool_calls'), 40);
  applyChunk(turn, { choices: [], usage: { prompt_tokens: 7, completion_tokens: 4, prompt_tokens_details: { cached_tokens: 3 } } }, 41);
  assert.equal(turn.reasoning, 'think');
  assert.equal(turn.content, 'a b c');
  assert.deepEqual(turn.tokens.map((t) => t.mtp), [false, true, true, false]);
  assert.deepEqual(turn.toolCalls[0], { id: 'call_1', name: 'f', arguments: '{"x": 1}', answer: '' });
  assert.equal(turn.stats.finish, 'tool_calls');
  const summary = turnSummary(turn);
  assert.equal(summary.ttftMs, 10);
  assert.equal(summary.completionTokens, 4);
  assert.equal(summary.cachedTokens, 3);
  assert.equal(summary.mtpTokens, 2);
  assert.ok(Math.abs(summary.tokensPerSecond - 3 / 0.03) < 1e-6);

  const messages = apiMessages('Be brief.', [{ role: 'user', content: 'hi' }, turn,
    { role: 'tool', toolCallId: 'call_1', content: '{"ok": true}' }]);
  assert.deepEqual(messages, [
    { role: 'system', content: 'Be brief.' },
    { role: 'user', content: 'hi' },
    { role: 'assistant', content: 'a b c',
      tool_calls: [{ id: 'call_1', type: 'function', function: { name: 'f', arguments: '{"x": 1}' } }] },
    { role: 'tool', tool_call_id: 'call_1', content: '{"ok": true}' },
  ]);
});
