// Dashboard series from /ui/stats snapshots: rates from counter
// differences, percentiles from histogram bucket differences over a window
// (what Prometheus' rate() and histogram_quantile() compute from /metrics).

// The q-quantile of per-bucket counts (last bucket: +Inf), interpolated
// linearly inside its bucket; null without observations.
export function histogramQuantile(q, upperBounds, counts) {
  const total = counts.reduce((a, b) => a + b, 0);
  if (total <= 0) return null;
  const rank = q * total;
  let cumulative = 0;
  for (let i = 0; i < counts.length; i++) {
    const before = cumulative;
    cumulative += counts[i];
    if (cumulative >= rank && counts[i] > 0) {
      // Past the last finite bound nothing is known but the bound itself.
      if (i >= upperBounds.length) return upperBounds[upperBounds.length - 1];
      const lower = i === 0 ? 0 : upperBounds[i - 1];
      const upper = upperBounds[i];
      return lower + (upper - lower) * ((rank - before) / counts[i]);
    }
  }
  return upperBounds[upperBounds.length - 1];
}

function bucketDelta(now, then) {
  return now.counts.map((count, i) => count - (then?.counts[i] ?? 0));
}

// The newest snapshot at least `seconds` older than `latest` (or the oldest kept).
function snapshotBefore(history, latest, seconds) {
  let chosen = history[0];
  for (const snapshot of history) {
    if (latest.monotonic_ms - snapshot.monotonic_ms >= seconds * 1000) chosen = snapshot;
    else break;
  }
  return chosen;
}

const ratio = (a, b) => (b > 0 ? a / b : null);

// One point of every plotted series from the newest snapshot and the ones
// before it: rates over the last `rateSeconds`, percentiles and hit rates
// over the last `windowSeconds`.
export function seriesPoint(history, { rateSeconds = 2, windowSeconds = 30 } = {}) {
  const latest = history[history.length - 1];
  const rateBase = snapshotBefore(history, latest, rateSeconds);
  const windowBase = snapshotBefore(history, latest, windowSeconds);
  const elapsed = (latest.monotonic_ms - rateBase.monotonic_ms) / 1000;
  const rate = (read) => (elapsed > 0 ? (read(latest) - read(rateBase)) / elapsed : 0);
  const e = latest.engine;
  const windowed = (name, q) => {
    const now = latest.histograms[name];
    const counts = bucketDelta(now, windowBase === latest ? null : windowBase.histograms[name]);
    const value = histogramQuantile(q, now.upper_bounds, counts);
    return value === null ? null : value * 1000;  // ms
  };
  const specSteps = e.spec_verify_steps - windowBase.engine.spec_verify_steps;
  const specAccepted = e.spec_accepted_tokens - windowBase.engine.spec_accepted_tokens;
  const hitTokens = e.prefix_cache_hits - windowBase.engine.prefix_cache_hits;
  const queryTokens = e.prefix_cache_queries - windowBase.engine.prefix_cache_queries;
  const hitRate = ratio(hitTokens, queryTokens);
  return {
    time: latest.time,
    outputTokensPerSecond: rate((s) => s.counters.generated_tokens),
    running: e.running_requests,
    waiting: e.waiting_requests,
    kvUsed: e.kv_pages_used,
    kvTotal: e.kv_pages_total,
    hostKvUsed: e.host_kv_pages_used,
    hostKvTotal: e.host_kv_pages_total,
    hostLatentUsed: e.host_latent_pages_used ?? 0,
    hostLatentTotal: e.host_latent_pages_total ?? 0,
    // The live host tier's GPU hot cache (CUDA): entries read without a copy,
    // and what a step copies host -> GPU, all time.
    hostLatentHitRate: e.host_latent_selected_entries > 0
      ? (100 * e.host_latent_hot_hits) / e.host_latent_selected_entries : null,
    hostLatentCopiedPerStep: e.host_latent_read_steps > 0
      ? e.host_latent_copied_bytes / e.host_latent_read_steps : null,
    // CUDA Graphs (all time): the share of the decode steps of a graph's
    // batch bucket that replayed one (the rest ran eagerly: a bucket's first
    // step, or a layout that is not captured); null without any.
    graphReplayShare: (e.graph_replays ?? 0) + (e.graph_eager_steps ?? 0) > 0
      ? (100 * e.graph_replays) / (e.graph_replays + e.graph_eager_steps) : null,
    prefixHitRate: hitRate === null ? null : hitRate * 100,
    prefixHitRateTotal: (ratio(e.prefix_cache_hits, e.prefix_cache_queries) ?? 0) * 100,
    specAcceptLength: specSteps > 0 ? 1 + specAccepted / specSteps : null,
    specAcceptLengthTotal:
      e.spec_verify_steps > 0 ? 1 + e.spec_accepted_tokens / e.spec_verify_steps : null,
    ttftP50: windowed('time_to_first_token', 0.5),
    ttftP90: windowed('time_to_first_token', 0.9),
    ttftP99: windowed('time_to_first_token', 0.99),
    tpotP50: windowed('time_per_output_token', 0.5),
    tpotP90: windowed('time_per_output_token', 0.9),
    tpotP99: windowed('time_per_output_token', 0.99),
    finished: latest.counters.requests_finished,
    aborted: latest.counters.requests_aborted,
    failed: latest.counters.requests_failed,
  };
}

// Data-parallel attention: a row per rank of the newest snapshot (none for a
// server without it): requests running and admitted so far, KV pages held
// (by requests or the prefix cache) of the rank's total, its prefix cache's
// pages, and rows the rank sampled per second over the last `rateSeconds`.
export function rankRows(history, { rateSeconds = 2 } = {}) {
  const latest = history[history.length - 1];
  const ranks = latest?.engine?.data_parallel_ranks ?? [];
  if (!ranks.length) return [];
  const base = snapshotBefore(history, latest, rateSeconds);
  const elapsed = (latest.monotonic_ms - base.monotonic_ms) / 1000;
  return ranks.map((r, i) => {
    const before = base.engine.data_parallel_ranks?.[i];
    return {
      rank: i,
      running: r.running_requests,
      admissions: r.admissions,
      kvHeld: r.kv_pages_total - r.kv_pages_free,
      kvTotal: r.kv_pages_total,
      prefixPages: r.prefix_cache_pages,
      sampledPerSecond: elapsed > 0 && before
        ? ((r.sampled_rows ?? 0) - (before.sampled_rows ?? 0)) / elapsed : null,
    };
  });
}

// The serving group's layout in a few words ('' for one process), from the
// server's arguments in /ui/stats.
export function groupLayout(server) {
  const parts = [];
  if ((server.tensor_parallel_size ?? 1) > 1) parts.push(`TP ${server.tensor_parallel_size}`);
  if ((server.expert_parallel_size ?? 1) > 1) parts.push(`EP ${server.expert_parallel_size}`);
  if (server.enable_dp_attention) parts.push(`DP attention ${server.dp_size}`);
  if ((server.context_parallel_size ?? 1) > 1) parts.push(`CP ${server.context_parallel_size}`);
  if (server.enable_layer_split) parts.push('LayerSplit');
  return parts.join(' · ');
}
