// The chat playground: streamed answers with their reasoning apart (a
// collapsible block), tool calls as cards that take the tool's answer, the
// token heat map on demand, per-turn timing and the rendered prompt.
import { useEffect, useRef, useState } from 'preact/hooks';
import { streamChat } from './api.js';
import { apiMessages, applyChunk, newAssistantTurn, turnSummary } from './chat_state.js';
import { PromptView } from './prompt_view.jsx';
import { SettingsPanel, chatRequest, parseTools, useSettings } from './settings.jsx';
import { TokenView } from './token_view.jsx';

const format = (value, digits = 0) => (value === null || value === undefined ? '–' : value.toFixed(digits));

function TurnStats({ turn }) {
  const s = turnSummary(turn);
  return (
    <div class="turn-stats" data-testid="turn-stats">
      <span title="time to first token">TTFT <b data-testid="ttft">{format(s.ttftMs)}</b> ms</span>
      <span><b data-testid="completion-tokens">{s.completionTokens}</b> tokens</span>
      <span><b>{format(s.tokensPerSecond, 1)}</b> tok/s</span>
      {s.promptTokens !== null && (
        <span>prompt <b>{s.promptTokens}</b> ({s.cachedTokens ?? 0} cached)</span>
      )}
      {s.mtpTokens > 0 && <span class="mtp-sample" title="drafted by the MTP layer and accepted">MTP {s.mtpTokens}</span>}
      {turn.stats.finish && <span>finish <b data-testid="finish-reason">{turn.stats.finish}</b></span>}
    </div>
  );
}

function ToolCalls({ turn, answerable, onAnswer }) {
  const calls = turn.toolCalls.filter(Boolean);
  const [answers, setAnswers] = useState({});
  if (!calls.length) return null;
  const pretty = (text) => {
    try {
      return JSON.stringify(JSON.parse(text), null, 2);
    } catch {
      return text;
    }
  };
  return (
    <div class="tool-calls">
      {calls.map((call, i) => (
        <div class="tool-call" data-testid="tool-call">
          <div class="tool-head">
            <span class="badge">tool call</span> <code class="tool-name">{call.name}</code>
            <small class="muted">{call.id}</small>
          </div>
          <pre class="code">{pretty(call.arguments)}</pre>
          {answerable && (
            <>
              <label for={`tool-answer-${call.id || i}`}>Result of {call.name}</label>
              <textarea id={`tool-answer-${call.id || i}`} class="code" rows="2"
                placeholder='e.g. {"temperature_c": 21}' value={answers[i] ?? ''}
                onInput={(event) => setAnswers({ ...answers, [i]: event.currentTarget.value })} />
            </>
          )}
        </div>
      ))}
      {answerable && (
        <button type="button" onClick={() => onAnswer(calls.map((call, i) => ({ call, content: answers[i] ?? '' })))}>
          Send tool results
        </button>
      )}
    </div>
  );
}

function Turn({ turn, last, busy, onAnswer }) {
  const [showTokens, setShowTokens] = useState(false);
  if (turn.role === 'user') {
    return <div class="turn user" data-testid="user-turn"><div class="bubble">{turn.content}</div></div>;
  }
  if (turn.role === 'tool') {
    return (
      <div class="turn tool">
        <div class="bubble"><span class="badge">tool result</span> <code>{turn.name}</code>
          <pre class="code">{turn.content}</pre></div>
      </div>
    );
  }
  return (
    <div class="turn assistant" data-testid="assistant-turn" aria-busy={turn.streaming ? 'true' : 'false'}>
      {turn.reasoning && (
        <details class="reasoning" open={turn.streaming && !turn.content} data-testid="reasoning">
          <summary>Reasoning <small class="muted">({turn.reasoning.length} characters)</small></summary>
          <div class="reasoning-text">{turn.reasoning}</div>
        </details>
      )}
      {(turn.content || turn.streaming || !turn.toolCalls.length) && (
        <div class="bubble" data-testid="assistant-content">
          {turn.content}
          {turn.streaming && <span class="cursor" aria-hidden="true" />}
        </div>
      )}
      <ToolCalls turn={turn} answerable={last && !busy && turn.toolCalls.length > 0} onAnswer={onAnswer} />
      {turn.error && <p class="error" role="alert">{turn.error}</p>}
      <div class="row">
        <TurnStats turn={turn} />
        {turn.tokens.length > 0 && (
          <button type="button" class="secondary small" aria-expanded={showTokens}
            onClick={() => setShowTokens(!showTokens)}>
            {showTokens ? 'Hide tokens' : 'Tokens'}
          </button>
        )}
      </div>
      {showTokens && <TokenView tokens={turn.tokens} />}
    </div>
  );
}

export function Chat({ active }) {
  const [settings, update] = useSettings();
  const turns = useRef([]);
  const [, setVersion] = useState(0);
  const redraw = () => setVersion((v) => v + 1);
  const [draft, setDraft] = useState('');
  const [busy, setBusy] = useState(false);
  const [prompt, setPrompt] = useState(null);
  const [panelOpen, setPanelOpen] = useState(false);
  const abort = useRef(null);
  const list = useRef(null);
  const composer = useRef(null);

  useEffect(() => {
    if (active) composer.current?.focus();
  }, [active]);
  useEffect(() => {
    const element = list.current;
    if (element) element.scrollTop = element.scrollHeight;
  });

  const messagesWith = (extra) => apiMessages(settings.system, [...turns.current, ...extra]);

  async function generate() {
    const turn = newAssistantTurn(performance.now());
    const body = chatRequest(settings, messagesWith([]));
    turns.current.push(turn);
    setBusy(true);
    redraw();
    const controller = new AbortController();
    abort.current = controller;
    try {
      await streamChat(body, (chunk) => {
        applyChunk(turn, chunk, performance.now());
        redraw();
      }, controller.signal);
    } catch (error) {
      if (error.name !== 'AbortError') turn.error = error.message;
      else turn.stats.finish ??= 'stopped';
    } finally {
      turn.streaming = false;
      abort.current = null;
      setBusy(false);
      redraw();
    }
  }

  function send() {
    const text = draft.trim();
    if (busy || !text) return;
    if (settings.toolsOn && parseTools(settings.tools).error) return;
    turns.current.push({ role: 'user', content: text });
    setDraft('');
    setPrompt(null);
    generate();
  }

  function answerTools(results) {
    for (const { call, content } of results)
      turns.current.push({ role: 'tool', toolCallId: call.id, name: call.name, content });
    generate();
  }

  const onKey = (event) => {
    if (event.key === 'Enter' && !event.shiftKey && !event.isComposing) {
      event.preventDefault();
      send();
    } else if (event.key === 'Escape' && abort.current) {
      abort.current.abort();
    }
  };

  const showPrompt = () => {
    const extra = draft.trim() ? [{ role: 'user', content: draft.trim() }] : [];
    setPrompt(chatRequest(settings, messagesWith(extra)));
  };

  const all = turns.current;
  return (
    <div class={`chat ${panelOpen ? 'panel-open' : ''}`}>
      <div class="chat-main">
        <div class="turns" ref={list} aria-live="off">
          {all.length === 0 && (
            <div class="empty">
              <h1>Chat with the model</h1>
              <p>Answers stream token by token. Reasoning appears in its own block; with Tools on,
                the model may call one and you answer it. "Tokens" under an answer shows how probable
                each token was.</p>
            </div>
          )}
          {all.map((turn, index) => (
            <Turn turn={turn} last={index === all.length - 1} busy={busy} onAnswer={answerTools} />
          ))}
        </div>
        {prompt && <PromptView request={prompt} onClose={() => setPrompt(null)} />}
        <div class="composer">
          <label for="composer-input" class="visually-hidden">Message</label>
          <textarea id="composer-input" ref={composer} rows="2" value={draft}
            placeholder="Message (Enter sends, Shift+Enter: new line, Esc stops)"
            onInput={(event) => setDraft(event.currentTarget.value)} onKeyDown={onKey} />
          <div class="composer-buttons">
            {busy ? (
              <button type="button" class="danger" onClick={() => abort.current?.abort()}>Stop</button>
            ) : (
              <button type="button" onClick={send} disabled={!draft.trim()}>Send</button>
            )}
            <button type="button" class="secondary" onClick={showPrompt}>Prompt</button>
            <button type="button" class="secondary" disabled={busy}
              onClick={() => { turns.current = []; setPrompt(null); redraw(); }}>New chat</button>
            <button type="button" class="secondary panel-toggle" aria-expanded={panelOpen}
              aria-controls="chat-settings" onClick={() => setPanelOpen(!panelOpen)}>Parameters</button>
          </div>
        </div>
        <div class="visually-hidden" role="status">{busy ? 'Generating' : all.length ? 'Answer complete' : ''}</div>
      </div>
      <aside id="chat-settings" class="chat-side" aria-label="Parameters">
        <SettingsPanel settings={settings} update={update} />
      </aside>
    </div>
  );
}
