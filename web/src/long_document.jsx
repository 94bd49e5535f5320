// Long-document mode: a text (pasted, loaded from a file, or the shipped
// 8K-token pass-key sample) and questions about it. Every question is a
// fresh request whose prompt starts with the document, so from the second
// question on the prefix cache holds the document's pages: the table shows
// the prompt tokens served from it and the time to first token falling.
import { useEffect, useRef, useState } from 'preact/hooks';
import { postJson, streamChat } from './api.js';
import { applyChunk, newAssistantTurn, turnSummary } from './chat_state.js';

const format = (value, digits = 0) => (value === null || value === undefined ? '–' : value.toFixed(digits));

export function LongDocument() {
  const [text, setText] = useState('');
  const [count, setCount] = useState(null);
  const [contextTokens, setContextTokens] = useState(null);
  const [question, setQuestion] = useState('What is the pass key?');
  const [maxTokens, setMaxTokens] = useState('32');
  const [thinking, setThinking] = useState(false);
  const [runs, setRuns] = useState([]);
  const [busy, setBusy] = useState(false);
  const [error, setError] = useState('');
  const file = useRef(null);

  // The document's token count, a moment after typing stops.
  useEffect(() => {
    if (!text) {
      setCount(null);
      return;
    }
    const controller = new AbortController();
    const timer = setTimeout(() => {
      postJson('/tokenize', { prompt: text, add_special_tokens: false, return_tokens: false },
        { signal: controller.signal })
        .then((result) => {
          setCount(result.count);
          setContextTokens(result.max_model_len);
        })
        .catch((failure) => failure.name !== 'AbortError' && setError(failure.message));
    }, 400);
    return () => {
      clearTimeout(timer);
      controller.abort();
    };
  }, [text]);

  const loadSample = async () => {
    setError('');
    const response = await fetch('/samples/passkey-8k.txt');
    setText(await response.text());
    setQuestion('What is the pass key?');
  };
  const loadFile = async (event) => {
    const chosen = event.currentTarget.files?.[0];
    if (chosen) setText(await chosen.text());
  };

  async function ask() {
    if (!text || !question.trim() || busy) return;
    setError('');
    const turn = newAssistantTurn(performance.now());
    const run = { question: question.trim(), turn };
    const all = [...runs, run];
    setRuns(all);
    setBusy(true);
    const body = {
      messages: [{ role: 'user', content: `${text}\n\n${run.question}` }],
      stream_options: { include_usage: true },
      temperature: 0,
      max_tokens: Math.max(1, Math.trunc(Number(maxTokens) || 32)),
      chat_template_kwargs: { enable_thinking: thinking },
    };
    try {
      await streamChat(body, (chunk) => {
        applyChunk(turn, chunk, performance.now());
        setRuns([...all]);
      });
    } catch (failure) {
      turn.error = failure.message;
    } finally {
      turn.streaming = false;
      setBusy(false);
      setRuns([...all]);
    }
  }

  const tooLong = count !== null && contextTokens !== null && count >= contextTokens;
  return (
    <div class="long-document">
      <h1>Long document</h1>
      <p class="muted">Paste or load a text, then ask about it. Each question is sent with the whole
        document in front; the second one finds the document in the prefix cache.</p>
      <div class="row">
        <button type="button" class="secondary" onClick={loadSample}>Load the pass-key sample (8K tokens)</button>
        <button type="button" class="secondary" onClick={() => file.current.click()}>Load a file…</button>
        <input ref={file} type="file" accept=".txt,.md,.csv,.json,.log,text/*" class="visually-hidden"
          tabindex="-1" aria-hidden="true" onChange={loadFile} />
        <button type="button" class="secondary" onClick={() => { setText(''); setRuns([]); }}>Clear</button>
      </div>
      <label for="document-text">Document</label>
      <textarea id="document-text" class="document" rows="12" value={text}
        onInput={(event) => setText(event.currentTarget.value)} />
      <div class="row" role="status">
        <span>
          <b data-testid="document-tokens">{count === null ? '–' : count}</b> tokens
          {contextTokens !== null && <> of {contextTokens} context</>} · {text.length} characters
        </span>
        {tooLong && <span class="error">longer than the context: the server will refuse it</span>}
      </div>
      {count !== null && contextTokens && (
        <meter min="0" max={contextTokens} value={count} aria-label="document tokens of the context" />
      )}
      <div class="ask">
        <div class="field grow">
          <label for="document-question">Question</label>
          <input id="document-question" value={question}
            onInput={(event) => setQuestion(event.currentTarget.value)}
            onKeyDown={(event) => event.key === 'Enter' && ask()} />
        </div>
        <div class="field">
          <label for="document-max-tokens">Max tokens</label>
          <input id="document-max-tokens" type="number" min="1" value={maxTokens}
            onInput={(event) => setMaxTokens(event.currentTarget.value)} />
        </div>
        <label class="check">
          <input type="checkbox" checked={thinking} onChange={(event) => setThinking(event.currentTarget.checked)} />
          Thinking
        </label>
        <button type="button" onClick={ask} disabled={busy || !text || !question.trim()}>Ask</button>
      </div>
      {error && <p class="error" role="alert">{error}</p>}
      {runs.length > 0 && (
        <div class="table-scroll">
          <table class="runs" data-testid="document-runs">
            <thead>
              <tr>
                <th scope="col">#</th><th scope="col">Question</th><th scope="col">Answer</th>
                <th scope="col">Prompt tokens</th><th scope="col">From prefix cache</th>
                <th scope="col">TTFT ms</th><th scope="col">tok/s</th>
              </tr>
            </thead>
            <tbody>
              {runs.map((run, i) => {
                const s = turnSummary(run.turn);
                const reused = s.promptTokens ? (100 * (s.cachedTokens ?? 0)) / s.promptTokens : null;
                return (
                  <tr>
                    <td>{i + 1}</td>
                    <td>{run.question}</td>
                    <td class="answer">{run.turn.error || run.turn.content.trimStart() || (run.turn.streaming ? '…' : '')}
                      {run.turn.reasoning && <details><summary>reasoning</summary>{run.turn.reasoning}</details>}</td>
                    <td class="num">{s.promptTokens ?? '–'}</td>
                    <td class="num" data-testid="cached-tokens">
                      {s.cachedTokens ?? '–'}{reused !== null && ` (${reused.toFixed(0)}%)`}
                    </td>
                    <td class="num" data-testid="document-ttft">{format(s.ttftMs)}</td>
                    <td class="num">{format(s.tokensPerSecond, 1)}</td>
                  </tr>
                );
              })}
            </tbody>
          </table>
        </div>
      )}
    </div>
  );
}
