// The megactx playground: chat, long document, dashboard and model card on
// one page, switched by the URL's hash (#/chat, #/document, #/dashboard,
// #/model) so the server serves a single file at "/".
import { render } from 'preact';
import { useEffect, useRef, useState } from 'preact/hooks';
import 'uplot/dist/uPlot.min.css';
import './style.css';
import { apiKey, getJson, onUnauthorized, setApiKey } from './api.js';
import { Chat } from './chat.jsx';
import { Dashboard } from './dashboard.jsx';
import { LongDocument } from './long_document.jsx';
import { ModelCard } from './model_card.jsx';

const PAGES = [
  { hash: '#/chat', label: 'Chat', view: Chat },
  { hash: '#/document', label: 'Long document', view: LongDocument },
  { hash: '#/dashboard', label: 'Dashboard', view: Dashboard },
  { hash: '#/model', label: 'Model', view: ModelCard },
];

function useHash() {
  const [hash, setHash] = useState(location.hash);
  useEffect(() => {
    const update = () => setHash(location.hash);
    addEventListener('hashchange', update);
    return () => removeEventListener('hashchange', update);
  }, []);
  return hash;
}

function KeyDialog({ open, reason, onClose }) {
  const dialog = useRef(null);
  const [value, setValue] = useState(apiKey());
  useEffect(() => {
    const element = dialog.current;
    if (open && !element.open) {
      setValue(apiKey());
      element.showModal();
    } else if (!open && element.open) {
      element.close();
    }
  }, [open]);
  const save = (event) => {
    event.preventDefault();
    setApiKey(value.trim());
    onClose(true);
  };
  return (
    <dialog ref={dialog} class="key-dialog" aria-labelledby="key-title" onClose={() => onClose(false)}>
      <form onSubmit={save}>
        <h2 id="key-title">API key</h2>
        <p>
          {reason ||
            'This server may need the key it was started with (megactx serve --api-key). ' +
              'It is kept in this browser only.'}
        </p>
        <label for="api-key-input">Key</label>
        <input id="api-key-input" type="password" autocomplete="off" value={value}
          onInput={(event) => setValue(event.currentTarget.value)} />
        <div class="row end">
          <button type="button" class="secondary" onClick={() => { setValue(''); setApiKey(''); onClose(true); }}>
            Clear
          </button>
          <button type="button" class="secondary" onClick={() => onClose(false)}>Cancel</button>
          <button type="submit">Save</button>
        </div>
      </form>
    </dialog>
  );
}

function App() {
  const hash = useHash();
  const page = PAGES.find((p) => p.hash === hash) ?? PAGES[0];
  const [keyDialog, setKeyDialog] = useState({ open: false, reason: '' });
  const [server, setServer] = useState({ state: 'connecting', model: '' });
  // Bumped when the key changes so every page reloads what it fetched.
  const [generation, setGeneration] = useState(0);

  useEffect(() => {
    onUnauthorized((message) =>
      setKeyDialog({ open: true, reason: `The server refused the request: ${message}` }));
  }, []);
  useEffect(() => {
    getJson('/v1/models')
      .then((list) => setServer({ state: 'ready', model: list.data?.[0]?.id ?? '' }))
      .catch((error) =>
        setServer({ state: error.status === 401 ? 'locked' : 'offline', model: '' }));
  }, [generation]);

  return (
    <>
      <a class="skip" href="#main">Skip to content</a>
      <header class="top">
        <div class="brand">
          <img src="/favicon.svg" alt="" width="24" height="24" />
          <span>megactx</span>
        </div>
        <nav aria-label="Pages">
          {PAGES.map((p) => (
            <a href={p.hash} aria-current={p === page ? 'page' : undefined}>{p.label}</a>
          ))}
        </nav>
        <div class="server-state" role="status">
          <span class={`dot ${server.state}`} aria-hidden="true" />
          {server.state === 'ready' ? server.model
            : server.state === 'locked' ? 'API key needed'
            : server.state === 'offline' ? 'server unreachable' : 'connecting'}
        </div>
        <button type="button" class="secondary" onClick={() => setKeyDialog({ open: true, reason: '' })}>
          API key
        </button>
      </header>
      <main id="main" tabindex="-1">
        {/* Every page stays mounted (hidden when not shown): a chat keeps its
            turns and the dashboard its history across page switches. */}
        {PAGES.map((p) => (
          <section class="page" hidden={p !== page} aria-label={p.label}>
            <p.view active={p === page} refresh={generation} />
          </section>
        ))}
      </main>
      <KeyDialog open={keyDialog.open} reason={keyDialog.reason}
        onClose={(changed) => {
          setKeyDialog({ open: false, reason: '' });
          if (changed) setGeneration((g) => g + 1);
        }} />
    </>
  );
}

render(<App />, document.getElementById('app'));
