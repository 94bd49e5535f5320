// The model card: `megactx inspect` as JSON from GET /ui/model (layer
// schedule with IndexShare's full and shared indexer layers, parameters, KV
// bytes per token, tokens that fit the KV budget) and the running server's
// KV pool and settings.
import { useEffect, useState } from 'preact/hooks';
import { getJson } from './api.js';

const count = (n) =>
  n === null || n === undefined ? '–'
    : n >= 1e9 ? `${(n / 1e9).toFixed(2)}B` : n >= 1e6 ? `${(n / 1e6).toFixed(2)}M`
    : n >= 1e3 ? `${(n / 1e3).toFixed(1)}K` : String(n);
const bytes = (n) =>
  n === null || n === undefined ? '–'
    : n >= 2 ** 30 ? `${(n / 2 ** 30).toFixed(2)} GiB` : n >= 2 ** 20 ? `${(n / 2 ** 20).toFixed(1)} MiB`
    : n >= 1024 ? `${(n / 1024).toFixed(1)} KiB` : `${n} B`;

function Facts({ rows }) {
  return (
    <dl class="facts">
      {rows.filter(Boolean).map(([label, value]) => (
        <>
          <dt>{label}</dt>
          <dd>{value}</dd>
        </>
      ))}
    </dl>
  );
}

// Every layer as a cell: F (runs the DSA indexer) or S (reuses the top-k of
// the full layer before it), dense or MoE, and the MTP layer.
function LayerStrip({ schedule }) {
  const layers = [];
  for (const run of schedule) {
    for (let id = run.first_layer; id <= run.last_layer; id++) layers.push({ id, ...run });
  }
  return (
    <div class="layer-strip" role="list" aria-label="Layer schedule">
      {layers.map((layer) => {
        const text = `layer ${layer.id}: ${layer.mtp ? 'MTP, ' : ''}${layer.mlp}, indexer ${layer.indexer}` +
          (layer.indexer === 'shared' ? ` (top-k of layer ${layer.indexer_source_layer})` : '');
        return (
          <div role="listitem" class={`layer ${layer.indexer} ${layer.mlp} ${layer.mtp ? 'mtp' : ''}`}
            title={text} aria-label={text}>
            <span class="layer-id">{layer.id}</span>
            <span class="layer-kind">{layer.indexer === 'full' ? 'F' : 'S'}</span>
            <span class="layer-mlp">{layer.mtp ? 'MTP' : layer.mlp === 'moe' ? 'MoE' : 'dense'}</span>
          </div>
        );
      })}
    </div>
  );
}

export function ModelCard({ active, refresh }) {
  const [card, setCard] = useState(null);
  const [error, setError] = useState('');
  useEffect(() => {
    if (!active) return;
    getJson('/ui/model').then((c) => { setCard(c); setError(''); }).catch((e) => setError(e.message));
  }, [active, refresh]);
  if (error) return <p class="error" role="alert">{error}</p>;
  if (!card) return <p class="muted">Loading the model card…</p>;
  const s = card.summary;
  const server = card.server ?? {};
  const kvDtype = server.kv_dtype ?? 'bf16';
  const perToken = s && (kvDtype === 'fp8' ? s.kv_bytes_per_token_fp8 : s.kv_bytes_per_token_bf16);
  return (
    <div class="model-card">
      <h1>{card.served_model_name}</h1>
      <p class="muted">{card.model_path}</p>
      <div class="cards">
        <section class="card">
          <h2>Model</h2>
          {s ? (
            <Facts rows={[
              ['type', s.model_type],
              ['layers', `${s.num_hidden_layers} (+${s.mtp_layers} MTP): ${s.dense_layers} dense, ${s.moe_layers} MoE`],
              ['IndexShare', `${s.full_indexer_layers} full indexer layers, ${s.shared_indexer_layers} shared`],
              ['full layers', s.full_indexer_layer_ids.join(', ')],
              ['parameters', `${count(s.params_total)} total, ${count(s.params_active)} active per token`],
              ['MTP parameters', count(s.params_mtp)],
              ['weights', bytes(s.weight_bytes)],
              ['vocabulary', count(card.vocab_size)],
            ]} />
          ) : <p class="error">No summary: {card.summary_error}</p>}
        </section>
        <section class="card">
          <h2>KV cache</h2>
          <Facts rows={[
            s && ['bytes per token', `${s.kv_bytes_per_token_bf16} (bf16) · ${s.kv_bytes_per_token_fp8} (fp8)` +
              (s.mtp_layers ? ` · MTP +${s.kv_bytes_per_token_bf16_mtp} / +${s.kv_bytes_per_token_fp8_mtp}` : '')],
            s && ['per attention layer', `latent ${s.kv_latent_bytes_per_layer_bf16} / ${s.kv_latent_bytes_per_layer_fp8} B, ` +
              `indexer ${s.kv_indexer_bytes_per_layer_bf16} / ${s.kv_indexer_bytes_per_layer_fp8} B (bf16 / fp8)`],
            ['in use', `${kvDtype}${perToken ? `, ${perToken} B per token` : ''}`],
            ['budget', server.kv_memory ?? '–'],
            s?.memory_budget_bytes && ['tokens that fit', `${count(kvDtype === 'fp8' ? s.tokens_fit_fp8 : s.tokens_fit_bf16)} (${kvDtype})`],
            ['pool', `${card.kv_pool.pages_total} pages × ${card.kv_pool.page_size} tokens = ${count(card.kv_pool.tokens)} tokens`],
            card.kv_pool.host_pages_total > 0 && ['host tier', `${card.kv_pool.host_pages_total} pages = ${count(card.kv_pool.host_tokens)} tokens`],
            ['longest context', `${count(card.max_context_tokens)} tokens`],
          ]} />
        </section>
        <section class="card">
          <h2>Server</h2>
          <Facts rows={[
            ['device', server.device ?? '–'],
            ['MTP speculative steps', String(server.speculative_steps ?? 0)],
            ['max running requests', String(server.max_running_requests ?? '–')],
            ['max prefill tokens', String(server.max_prefill_tokens ?? '–')],
            ['host KV memory', server.host_kv_memory ?? '0'],
            ['live host tier memory', server.host_latent_memory ?? '0'],
            ['API key', card.api_key_required ? 'required' : 'off'],
          ]} />
        </section>
      </div>
      {s && (
        <section class="card wide">
          <h2>Layer schedule</h2>
          <LayerStrip schedule={s.schedule} />
          <p class="muted">F: the layer runs the DSA indexer; S: it reuses the top-k of the last full layer
            (IndexShare). Hover a layer for details.</p>
          <details>
            <summary>megactx inspect</summary>
            <pre class="code">{card.summary_text}</pre>
          </details>
        </section>
      )}
    </div>
  );
}
