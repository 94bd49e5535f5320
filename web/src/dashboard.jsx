// The live dashboard: /ui/stats polled once a second (kept for the last 10
// minutes while the page is open) and plotted with uPlot: output tokens/s,
// requests running and waiting, KV pages (device and host tier), prefix-cache
// hit rate, MTP accepted length, TTFT and TPOT percentiles; a serving
// group's layout, and with data-parallel attention a table of its ranks.
import { useEffect, useRef, useState } from 'preact/hooks';
import uPlot from 'uplot';
import { getJson } from './api.js';
import { groupLayout, rankRows, seriesPoint } from './metrics.js';

const POLL_MS = 1000;
const KEEP_SNAPSHOTS = 600;

// One poller for the page's lifetime, so the history survives page switches.
const store = { snapshots: [], points: [], error: '', listeners: new Set(), timer: null };

async function poll() {
  // A tab in the background draws nothing: skip the request (the next rate
  // spans the gap, as it should).
  if (document.hidden && store.snapshots.length) return;
  try {
    const snapshot = await getJson('/ui/stats');
    store.snapshots.push(snapshot);
    if (store.snapshots.length > KEEP_SNAPSHOTS) store.snapshots.shift();
    store.points.push(seriesPoint(store.snapshots));
    if (store.points.length > KEEP_SNAPSHOTS) store.points.shift();
    store.error = '';
  } catch (error) {
    store.error = error.message;
  }
  for (const listener of store.listeners) listener();
}

function useStats() {
  const [, setVersion] = useState(0);
  useEffect(() => {
    const listener = () => setVersion((v) => v + 1);
    store.listeners.add(listener);
    if (!store.timer) {
      poll();
      store.timer = setInterval(poll, POLL_MS);
    }
    return () => store.listeners.delete(listener);
  }, []);
  return store;
}

const css = (name) => getComputedStyle(document.documentElement).getPropertyValue(name).trim();

// A uPlot chart of `series` ({key, label, color}) over `points`; its element
// carries data-samples and data-max (what the browser test reads).
function Chart({ title, series, points, unit, digits = 1, yMin = 0, description }) {
  const box = useRef(null);
  const plot = useRef(null);
  const data = [points.map((p) => p.time), ...series.map((s) => points.map((p) => p[s.key] ?? null))];
  useEffect(() => {
    const axis = { stroke: css('--muted'), grid: { stroke: css('--grid') }, ticks: { stroke: css('--grid') } };
    plot.current = new uPlot({
      width: Math.max(200, box.current.clientWidth),
      height: 180,
      // The caption shows the newest values; uPlot's own legend would repeat them.
      legend: { show: false },
      cursor: { drag: { x: false, y: false } },
      scales: { x: { time: true }, y: { range: (u, min, max) => [Math.min(yMin, min ?? 0), Math.max(max ?? 1, 1e-9) * 1.1] } },
      axes: [axis, {
        ...axis,
        size: 56,
        values: (u, values) => values.map((v) => +v.toFixed(digits)),
        // Counts (digits 0) get whole-number ticks only.
        ...(digits === 0 ? { incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000] } : {}),
      }],
      series: [
        {},
        ...series.map((s) => ({
          label: s.label,
          stroke: s.color,
          width: 2,
          spanGaps: false,
          value: (u, v) => (v === null || v === undefined ? '–' : `${v.toFixed(digits)}${unit ? ' ' + unit : ''}`),
        })),
      ],
    }, data, box.current);
    const resize = new ResizeObserver(() => {
      const width = box.current?.clientWidth ?? 0;
      if (width > 0) plot.current.setSize({ width, height: 180 });
    });
    resize.observe(box.current);
    return () => {
      resize.disconnect();
      plot.current.destroy();
    };
  }, []);
  useEffect(() => {
    plot.current?.setData(data);
  });
  const latest = points[points.length - 1];
  const values = data.slice(1).flat().filter((v) => v !== null && Number.isFinite(v));
  return (
    <figure class="chart" data-testid={`chart-${series[0].key}`} data-samples={points.length}
      data-max={values.length ? Math.max(...values) : ''}>
      <figcaption>
        <span class="chart-title">{title}</span>
        {latest && (
          <span class="chart-now">
            {series.map((s) => {
              const v = latest[s.key];
              return <span style={{ color: s.color }}>{s.label} {v === null || v === undefined ? '–' : v.toFixed(digits)}</span>;
            })}
          </span>
        )}
      </figcaption>
      <div ref={box} class="chart-box" role="img" aria-label={`${title}: ${description}`} />
    </figure>
  );
}

const COLORS = { a: '#2f6fde', b: '#e0672b', c: '#2a9d5c', d: '#9b59b6' };

function Tile({ label, value, testid }) {
  return (
    <div class="tile" data-testid={testid}>
      <div class="tile-value">{value}</div>
      <div class="tile-label">{label}</div>
    </div>
  );
}

export function Dashboard() {
  const stats = useStats();
  const points = stats.points;
  const latest = points[points.length - 1];
  const server = stats.snapshots[stats.snapshots.length - 1]?.server ?? {};
  const fmt = (v, digits = 0) => (v === null || v === undefined ? '–' : v.toFixed(digits));
  const layout = groupLayout(server);
  const ranks = rankRows(stats.snapshots);
  return (
    <div class="dashboard">
      <div class="row">
        <h1>Dashboard</h1>
        <span class="muted">
          {server.device && <>device {server.device} · KV {server.kv_dtype} {server.kv_memory}
            {server.host_kv_memory && server.host_kv_memory !== '0' && <> + host {server.host_kv_memory}</>}
            {server.host_latent_memory && server.host_latent_memory !== '0' && <> + live host tier {server.host_latent_memory}</>}
            {' '}· MTP steps {server.speculative_steps ?? 0} · </>}
          {layout && <span data-testid="group-layout">{layout} · </span>}
          polled every second from /ui/stats · percentiles over the last 30 s
        </span>
      </div>
      {stats.error && <p class="error" role="alert">{stats.error}</p>}
      {latest && (
        <div class="tiles">
          <Tile label="output tokens/s" value={fmt(latest.outputTokensPerSecond, 1)} testid="tile-tps" />
          <Tile label="running / waiting" value={`${latest.running} / ${latest.waiting}`} />
          <Tile label="KV pages used" value={`${latest.kvUsed} / ${latest.kvTotal}`} />
          <Tile label="host KV pages" value={latest.hostKvTotal ? `${latest.hostKvUsed} / ${latest.hostKvTotal}` : 'no tier'} />
          {latest.hostLatentTotal > 0 && (
            <Tile label="live host tier pages" value={`${latest.hostLatentUsed} / ${latest.hostLatentTotal}`} />
          )}
          {latest.hostLatentHitRate !== null && (
            <Tile label="hot cache hits / copied per step"
              value={`${fmt(latest.hostLatentHitRate, 1)}% / ${fmt(latest.hostLatentCopiedPerStep / 1e6, 2)} MB`} />
          )}
          <Tile label="prefix hit rate (all time)" value={`${fmt(latest.prefixHitRateTotal, 1)}%`} />
          <Tile label="MTP accepted length" value={fmt(latest.specAcceptLengthTotal, 2)} />
          {latest.graphReplayShare !== null && (
            <Tile label="decode steps from CUDA Graphs" value={`${fmt(latest.graphReplayShare, 1)}%`} />
          )}
          <Tile label="requests finished" value={`${latest.finished}`} testid="tile-finished" />
        </div>
      )}
      {ranks.length > 0 && (
        <div class="table-scroll dp-ranks">
          <table class="runs" data-testid="dp-ranks">
            <caption>Data-parallel attention: each rank's requests, KV pages and sampling</caption>
            <thead>
              <tr><th>rank</th><th>running</th><th>admitted</th><th>KV pages held</th>
                <th>prefix-cache pages</th><th>rows sampled/s</th></tr>
            </thead>
            <tbody>
              {ranks.map((r) => (
                <tr key={r.rank} data-testid={`dp-rank-${r.rank}`}>
                  <td>{r.rank}</td><td>{r.running}</td><td class="admitted">{r.admissions}</td>
                  <td>{r.kvHeld} / {r.kvTotal}</td><td>{r.prefixPages}</td>
                  <td>{fmt(r.sampledPerSecond, 1)}</td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      )}
      <div class="charts">
        <Chart title="Output tokens/s" unit="tok/s" points={points} description="generated tokens per second"
          series={[{ key: 'outputTokensPerSecond', label: 'output', color: COLORS.a }]} />
        <Chart title="Requests" digits={0} points={points} description="requests running and waiting"
          series={[{ key: 'running', label: 'running', color: COLORS.a },
            { key: 'waiting', label: 'waiting', color: COLORS.b }]} />
        <Chart title="KV pages used" digits={0} points={points}
          description="KV cache pages in use on the device, in the prefix cache's host tier and in the live host tier"
          series={[{ key: 'kvUsed', label: 'device', color: COLORS.a },
            { key: 'hostKvUsed', label: 'host tier', color: COLORS.d },
            { key: 'hostLatentUsed', label: 'live host tier', color: COLORS.b }]} />
        <Chart title="Prefix-cache hit rate" unit="%" points={points} description="prompt tokens found in the prefix cache"
          series={[{ key: 'prefixHitRate', label: 'last 30 s', color: COLORS.c },
            { key: 'prefixHitRateTotal', label: 'all time', color: COLORS.a }]} />
        <Chart title="MTP accepted length" digits={2} points={points} description="tokens per speculative verification step"
          series={[{ key: 'specAcceptLength', label: 'last 30 s', color: COLORS.b },
            { key: 'specAcceptLengthTotal', label: 'all time', color: COLORS.a }]} />
        <Chart title="Time to first token" unit="ms" points={points} description="TTFT percentiles in milliseconds"
          series={[{ key: 'ttftP50', label: 'p50', color: COLORS.a }, { key: 'ttftP90', label: 'p90', color: COLORS.b },
            { key: 'ttftP99', label: 'p99', color: COLORS.d }]} />
        <Chart title="Time per output token" unit="ms" points={points} description="TPOT percentiles in milliseconds"
          series={[{ key: 'tpotP50', label: 'p50', color: COLORS.a }, { key: 'tpotP90', label: 'p90', color: COLORS.b },
            { key: 'tpotP99', label: 'p99', color: COLORS.d }]} />
      </div>
    </div>
  );
}
