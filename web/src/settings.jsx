// The sampling parameters and request options of the chat, and the request
// body they make. An empty field is left out of the request, so the
// server's default (the model's generation_config.json) applies.
import { useState } from 'preact/hooks';

export const WEATHER_TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather of a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

export const DEFAULT_SETTINGS = {
  system: '',
  temperature: '',
  top_p: '',
  top_k: '',
  min_p: '',
  max_tokens: '512',
  stop: '',
  seed: '',
  thinking: true,
  ignoreEos: false,
  logprobs: true,
  top_logprobs: '5',
  toolsOn: false,
  tools: JSON.stringify([WEATHER_TOOL], null, 2),
};

const SETTINGS_STORAGE = 'megactx.chatSettings';

export function useSettings() {
  const [settings, setSettings] = useState(() => {
    try {
      return { ...DEFAULT_SETTINGS, ...JSON.parse(localStorage.getItem(SETTINGS_STORAGE) ?? '{}') };
    } catch {
      return { ...DEFAULT_SETTINGS };
    }
  });
  const update = (change) =>
    setSettings((old) => {
      const next = { ...old, ...change };
      try {
        localStorage.setItem(SETTINGS_STORAGE, JSON.stringify(next));
      } catch {
        // Not persisted; still used.
      }
      return next;
    });
  return [settings, update];
}

// The tools list, or a message saying why the JSON is not one.
export function parseTools(text) {
  try {
    const tools = JSON.parse(text);
    if (!Array.isArray(tools)) return { error: 'Tools must be a JSON list.' };
    for (const tool of tools) {
      if (tool?.type !== 'function' || typeof tool?.function?.name !== 'string')
        return { error: 'Every tool is {"type": "function", "function": {"name": ...}}.' };
    }
    return { tools };
  } catch (error) {
    return { error: `Tools are not valid JSON: ${error.message}` };
  }
}

// The /v1/chat/completions body (without `stream`) for `messages`.
export function chatRequest(settings, messages) {
  const body = { messages, stream_options: { include_usage: true } };
  for (const name of ['temperature', 'top_p', 'min_p']) {
    if (String(settings[name]).trim() !== '') body[name] = Number(settings[name]);
  }
  for (const name of ['top_k', 'max_tokens', 'seed']) {
    if (String(settings[name]).trim() !== '') body[name] = Math.trunc(Number(settings[name]));
  }
  const stops = settings.stop.split('\n').filter((line) => line !== '');
  if (stops.length) body.stop = stops;
  body.chat_template_kwargs = { enable_thinking: settings.thinking };
  if (settings.ignoreEos) body.ignore_eos = true;
  if (settings.logprobs) {
    body.logprobs = true;
    body.top_logprobs = Math.trunc(Number(settings.top_logprobs) || 0);
  }
  if (settings.toolsOn) {
    const { tools } = parseTools(settings.tools);
    if (tools?.length) body.tools = tools;
  }
  return body;
}

function Field({ id, label, hint, children }) {
  return (
    <div class="field">
      <label for={id}>{label}</label>
      {children}
      {hint && <small id={`${id}-hint`}>{hint}</small>}
    </div>
  );
}

function NumberField({ name, label, hint, settings, update, ...limits }) {
  const id = `param-${name}`;
  return (
    <Field id={id} label={label} hint={hint}>
      <input id={id} name={name} type="number" inputmode="decimal" placeholder="default"
        aria-describedby={hint ? `${id}-hint` : undefined} value={settings[name]} {...limits}
        onInput={(event) => update({ [name]: event.currentTarget.value })} />
    </Field>
  );
}

export function SettingsPanel({ settings, update }) {
  const tools = settings.toolsOn ? parseTools(settings.tools) : {};
  const props = { settings, update };
  return (
    <div class="settings">
      <h2 class="panel-title">Parameters</h2>
      <Field id="param-system" label="System prompt">
        <textarea id="param-system" rows="2" value={settings.system}
          onInput={(event) => update({ system: event.currentTarget.value })} />
      </Field>
      <div class="grid2">
        <NumberField name="temperature" label="Temperature" min="0" max="2" step="0.05" {...props} />
        <NumberField name="max_tokens" label="Max tokens" min="1" step="1" {...props} />
        <NumberField name="top_p" label="Top-p" min="0.01" max="1" step="0.01" {...props} />
        <NumberField name="top_k" label="Top-k" min="-1" step="1" hint="-1: off" {...props} />
        <NumberField name="min_p" label="Min-p" min="0" max="1" step="0.01" {...props} />
        <NumberField name="seed" label="Seed" min="0" step="1" {...props} />
      </div>
      <Field id="param-stop" label="Stop strings" hint="one per line">
        <textarea id="param-stop" rows="2" value={settings.stop} aria-describedby="param-stop-hint"
          onInput={(event) => update({ stop: event.currentTarget.value })} />
      </Field>
      <label class="check">
        <input type="checkbox" checked={settings.thinking}
          onChange={(event) => update({ thinking: event.currentTarget.checked })} />
        Thinking (reasoning before the answer)
      </label>
      <label class="check">
        <input type="checkbox" checked={settings.ignoreEos}
          onChange={(event) => update({ ignoreEos: event.currentTarget.checked })} />
        Ignore end of text (run to max tokens)
      </label>
      <label class="check">
        <input type="checkbox" checked={settings.logprobs}
          onChange={(event) => update({ logprobs: event.currentTarget.checked })} />
        Token details (logprobs, MTP marks)
      </label>
      {settings.logprobs && (
        <NumberField name="top_logprobs" label="Alternatives per token" min="0" max="20" step="1" {...props} />
      )}
      <label class="check">
        <input type="checkbox" checked={settings.toolsOn}
          onChange={(event) => update({ toolsOn: event.currentTarget.checked })} />
        Tools
      </label>
      {settings.toolsOn && (
        <Field id="param-tools" label="Tool definitions (OpenAI JSON)">
          <textarea id="param-tools" class="code" rows="10" spellcheck={false} value={settings.tools}
            aria-invalid={tools.error ? 'true' : undefined}
            onInput={(event) => update({ tools: event.currentTarget.value })} />
          {tools.error && <small class="error">{tools.error}</small>}
        </Field>
      )}
      <button type="button" class="secondary small" onClick={() => update({ ...DEFAULT_SETTINGS })}>
        Reset parameters
      </button>
    </div>
  );
}
