// What one streamed assistant turn accumulates from the OpenAI chunks:
// content, reasoning, tool calls (deltas merged by index), per-token
// logprobs and timing.
//
// MTP marks: the server sends one chunk per engine step, and with
// speculative decoding a step commits its accepted draft tokens followed by
// the one token the model sampled itself. So in a chunk carrying n > 1
// logprob entries the first n - 1 tokens were drafted by the MTP layer and
// accepted. (Only visible with logprobs on: without them a chunk's text does
// not say how many tokens it holds.)
export function newAssistantTurn(startedAt) {
  return {
    role: 'assistant',
    content: '',
    reasoning: '',
    toolCalls: [],
    tokens: [],
    streaming: true,
    error: '',
    stats: { startedAt, firstAt: null, lastAt: null, finish: null, usage: null },
  };
}

export function applyChunk(turn, chunk, now) {
  if (chunk.usage) turn.stats.usage = chunk.usage;
  const choice = chunk.choices?.[0];
  if (!choice) return;
  const delta = choice.delta ?? {};
  let produced = false;
  if (delta.content) {
    turn.content += delta.content;
    produced = true;
  }
  if (delta.reasoning_content) {
    turn.reasoning += delta.reasoning_content;
    produced = true;
  }
  for (const call of delta.tool_calls ?? []) {
    const slot = (turn.toolCalls[call.index] ??= { id: '', name: '', arguments: '', answer: '' });
    if (call.id) slot.id = call.id;
    if (call.function?.name) slot.name = call.function.name;
    if (call.function?.arguments) slot.arguments += call.function.arguments;
    produced = true;
  }
  const entries = choice.logprobs?.content ?? [];
  entries.forEach((entry, i) => {
    turn.tokens.push({
      text: entry.token,
      logprob: entry.logprob,
      top: entry.top_logprobs ?? [],
      mtp: i < entries.length - 1,
    });
  });
  if (entries.length) produced = true;
  if (produced) {
    turn.stats.firstAt ??= now;
    turn.stats.lastAt = now;
  }
  if (choice.finish_reason) turn.stats.finish = choice.finish_reason;
}

// Time to first token, tokens and decode rate of a finished (or running) turn.
export function turnSummary(turn) {
  const { startedAt, firstAt, lastAt, usage } = turn.stats;
  const completion = usage?.completion_tokens ?? turn.tokens.length;
  const decodeSeconds = firstAt !== null && lastAt > firstAt ? (lastAt - firstAt) / 1000 : 0;
  return {
    ttftMs: firstAt === null ? null : firstAt - startedAt,
    completionTokens: completion,
    promptTokens: usage?.prompt_tokens ?? null,
    cachedTokens: usage?.prompt_tokens_details?.cached_tokens ?? null,
    tokensPerSecond: decodeSeconds > 0 && completion > 1 ? (completion - 1) / decodeSeconds : null,
    mtpTokens: turn.tokens.filter((token) => token.mtp).length,
  };
}

// The conversation as the API takes it (reasoning is not sent back).
export function apiMessages(system, turns) {
  const out = [];
  if (system.trim()) out.push({ role: 'system', content: system });
  for (const turn of turns) {
    if (turn.role === 'assistant') {
      const message = { role: 'assistant', content: turn.content };
      const calls = turn.toolCalls.filter(Boolean);
      if (calls.length) {
        message.tool_calls = calls.map((call) => ({
          id: call.id,
          type: 'function',
          function: { name: call.name, arguments: call.arguments },
        }));
      }
      out.push(message);
    } else if (turn.role === 'tool') {
      out.push({ role: 'tool', tool_call_id: turn.toolCallId, content: turn.content });
    } else {
      out.push({ role: turn.role, content: turn.content });
    }
  }
  return out;
}
