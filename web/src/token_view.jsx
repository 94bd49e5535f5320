// The generated tokens as a heat map: the less probable a sampled token was,
// the stronger its background; hovering or focusing a token shows its
// probability and the top alternatives the model weighed. Tokens the MTP
// layer drafted and the model accepted are underlined.
import { useState } from 'preact/hooks';

const probability = (logprob) => (logprob === null || logprob === undefined ? null : Math.exp(logprob));
const percent = (p) => (p === null ? '?' : p >= 0.995 ? '100%' : `${(p * 100).toFixed(p < 0.1 ? 1 : 0)}%`);

// Shows whitespace that would vanish: newlines, tabs, leading spaces.
function visible(text) {
  return text.replace(/\n/g, '↵').replace(/\t/g, '⇥').replace(/^ /, '␣');
}

function heat(p) {
  if (p === null) return 'transparent';
  const alpha = Math.min(0.85, (1 - p) * 0.9);
  return `rgba(230, 80, 30, ${alpha.toFixed(3)})`;
}

export function TokenView({ tokens }) {
  const [focused, setFocused] = useState(null);
  const mtp = tokens.filter((token) => token.mtp).length;
  const current = focused === null ? null : tokens[focused];
  return (
    <div class="token-view">
      <div class="token-legend" aria-hidden="true">
        <span>probability</span>
        <span class="swatch" style={{ background: heat(1) , border: '1px solid var(--border)' }} /> high
        <span class="swatch" style={{ background: heat(0.5) }} /> 50%
        <span class="swatch" style={{ background: heat(0) }} /> low
        <span class="mtp-sample">MTP</span> drafted by the MTP layer and accepted ({mtp} of {tokens.length})
      </div>
      <div class="token-text" role="list" aria-label="Generated tokens"
        onMouseLeave={() => setFocused(null)}>
        {tokens.map((token, index) => {
          const p = probability(token.logprob);
          return (
            <>
              <span role="listitem" tabindex="0" class={token.mtp ? 'tok mtp' : 'tok'}
                style={{ background: heat(p) }} data-p={p ?? ''}
                aria-label={`${JSON.stringify(token.text)}, ${percent(p)}${token.mtp ? ', MTP accepted' : ''}`}
                onMouseEnter={() => setFocused(index)} onFocus={() => setFocused(index)}>
                {visible(token.text)}
              </span>
              {token.text.includes('\n') && <br />}
            </>
          );
        })}
      </div>
      <div class="token-detail" aria-live="polite">
        {current ? (
          <>
            <div>
              <code>{JSON.stringify(current.text)}</code> p = {percent(probability(current.logprob))}
              {' '}(logprob {current.logprob?.toFixed(3)}){current.mtp && ' · MTP accepted'}
            </div>
            {current.top.length > 0 && (
              <table class="alternatives">
                <caption>Top alternatives</caption>
                <tbody>
                  {current.top.map((alt) => {
                    const p = probability(alt.logprob);
                    return (
                      <tr class={alt.token === current.text ? 'chosen' : ''}>
                        <td><code>{JSON.stringify(alt.token)}</code></td>
                        <td class="bar"><span style={{ width: `${(p ?? 0) * 100}%` }} /></td>
                        <td class="num">{percent(p)}</td>
                      </tr>
                    );
                  })}
                </tbody>
              </table>
            )}
          </>
        ) : (
          <span class="muted">Hover or focus a token to see its alternatives.</span>
        )}
      </div>
    </div>
  );
}
