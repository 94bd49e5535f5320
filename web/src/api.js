// The server's HTTP API as the page uses it: the API key (kept in this
// browser's localStorage and sent as a Bearer token), JSON calls, and the
// OpenAI chat stream read from fetch (EventSource cannot send the key).
const KEY_STORAGE = 'megactx.apiKey';

export function apiKey() {
  try {
    return localStorage.getItem(KEY_STORAGE) ?? '';
  } catch {
    return '';
  }
}

export function setApiKey(key) {
  try {
    if (key) localStorage.setItem(KEY_STORAGE, key);
    else localStorage.removeItem(KEY_STORAGE);
  } catch {
    // Storage off (private mode): the key lasts for this page only.
  }
  sessionKey = key;
}
let sessionKey = null;

let unauthorized = () => {};
// Called with the server's message whenever a request gets 401.
export function onUnauthorized(handler) {
  unauthorized = handler;
}

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

function headers(json) {
  const out = {};
  if (json) out['Content-Type'] = 'application/json';
  const key = sessionKey ?? apiKey();
  if (key) out.Authorization = `Bearer ${key}`;
  return out;
}

async function failure(response) {
  let message = `${response.status} ${response.statusText}`;
  try {
    const body = await response.json();
    message = body?.error?.message ?? message;
  } catch {
    // Not JSON: keep the status line.
  }
  if (response.status === 401) unauthorized(message);
  return new ApiError(response.status, message);
}

export async function getJson(path, { signal } = {}) {
  const response = await fetch(path, { headers: headers(false), signal });
  if (!response.ok) throw await failure(response);
  return response.json();
}

export async function postJson(path, body, { signal } = {}) {
  const response = await fetch(path, {
    method: 'POST',
    headers: headers(true),
    body: JSON.stringify(body),
    signal,
  });
  if (!response.ok) throw await failure(response);
  return response.json();
}

// POST /v1/chat/completions with stream: true; onEvent(payload) for every
// SSE data event until [DONE]. An error event in the stream throws.
export async function streamChat(body, onEvent, signal) {
  const response = await fetch('/v1/chat/completions', {
    method: 'POST',
    headers: headers(true),
    body: JSON.stringify({ ...body, stream: true }),
    signal,
  });
  if (!response.ok) throw await failure(response);
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, { stream: true });
    let end;
    while ((end = buffer.indexOf('\n\n')) >= 0) {
      const event = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      for (const line of event.split('\n')) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        const payload = JSON.parse(data);
        if (payload.error) throw new ApiError(payload.error.code ?? 400, payload.error.message);
        onEvent(payload);
      }
    }
  }
}
