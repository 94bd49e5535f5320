// The prompt exactly as the server's chat template renders the conversation
// (POST /tokenize with the same messages, tools and template arguments as
// the chat request), with its token count and the token boundaries.
import { useEffect, useState } from 'preact/hooks';
import { postJson } from './api.js';

const SHOW_TOKENS_UP_TO = 20000;  // beyond, plain text renders much faster

export function PromptView({ request, onClose }) {
  const [result, setResult] = useState(null);
  const [error, setError] = useState('');
  const [boundaries, setBoundaries] = useState(true);
  useEffect(() => {
    const { messages, tools, chat_template_kwargs } = request;
    postJson('/tokenize', { messages, tools, chat_template_kwargs, return_token_strs: true })
      .then(setResult)
      .catch((failure) => setError(failure.message));
  }, [request]);
  return (
    <div class="prompt-view" role="region" aria-label="Rendered prompt">
      <div class="row">
        <h3>
          Prompt as the chat template rendered it
          {result && <span class="badge" data-testid="prompt-tokens">{result.count} tokens</span>}
        </h3>
        <label class="check inline">
          <input type="checkbox" checked={boundaries}
            onChange={(event) => setBoundaries(event.currentTarget.checked)} />
          token boundaries
        </label>
        <button type="button" class="secondary small" onClick={onClose}>Close</button>
      </div>
      {error && <p class="error">{error}</p>}
      {result && (
        <pre class="prompt-text">
          {boundaries && result.token_strs && result.count <= SHOW_TOKENS_UP_TO
            ? result.token_strs.map((piece, i) => <span class={i % 2 ? 'pt odd' : 'pt'}>{piece}</span>)
            : result.prompt}
        </pre>
      )}
      {result && (
        <p class="muted">
          {result.count} of {result.max_model_len} context tokens; the reply may use the rest.
        </p>
      )}
    </div>
  );
}
