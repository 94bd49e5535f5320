#include "gateway/trajectory.h"

#include "server/json_text.h"
#include "tokenizer/tokenizer.h"

namespace megactx::gateway {

namespace {

using server::sanitize_utf8;

const char* sample_status(const std::string& finish_reason) {
  if (finish_reason == "stop") return "completed";
  if (finish_reason == "length") return "truncated";
  if (finish_reason == "abort") return "aborted";
  if (finish_reason == "error") return "failed";
  return "pending";
}

const Generation* generation_of(const Session& session, const Span& span) {
  if (span.kind != SpanKind::Model || span.turn < 0 ||
      static_cast<size_t>(span.turn) >= session.turns.size())
    return nullptr;
  const Turn& turn = session.turns[static_cast<size_t>(span.turn)];
  if (span.generation < 0 || static_cast<size_t>(span.generation) >= turn.generations.size())
    return nullptr;
  return &turn.generations[static_cast<size_t>(span.generation)];
}

nlohmann::json span_json(const Span& span) {
  nlohmann::json out = {{"kind", span_kind_name(span.kind)},
                        {"begin", span.begin},
                        {"end", span.end},
                        {"turn", span.turn}};
  if (span.kind == SpanKind::Model) out["generation"] = span.generation;
  if (span.intercepted) out["intercepted"] = true;
  return out;
}

nlohmann::json guard_event_json(const GuardEvent& event) {
  return {{"generation", event.generation},
          {"call", event.call},
          {"tool", sanitize_utf8(event.tool)},
          {"arguments", sanitize_utf8(event.arguments)},
          {"rules", event.rules},
          {"verdict", event.verdict},
          {"reason", sanitize_utf8(event.reason)},
          {"confirmed", event.confirmed},
          {"action", event.action},
          {"judge_seconds", event.judge_seconds}};
}

std::vector<int32_t> slice(const std::vector<int32_t>& tokens, size_t begin, size_t end) {
  end = std::min(end, tokens.size());
  begin = std::min(begin, end);
  return {tokens.begin() + static_cast<std::ptrdiff_t>(begin),
          tokens.begin() + static_cast<std::ptrdiff_t>(end)};
}

}  // namespace

const char* span_kind_name(SpanKind kind) {
  switch (kind) {
    case SpanKind::Prompt:
      return "prompt";
    case SpanKind::Model:
      return "model";
    case SpanKind::Context:
      return "context";
    case SpanKind::Virtual:
      return "virtual";
  }
  return "prompt";
}

size_t Trace::prompt_length() const {
  if (spans.empty() || spans.front().kind != SpanKind::Prompt) return 0;
  return spans.front().end;
}

size_t Session::estimated_bytes() const {
  // What the containers hold, plus a fixed cost per object for the rest.
  size_t bytes = 512 + id.size() + parent_id.size() + rollout_id.size();
  for (const Trace& trace : traces)
    bytes += 256 + trace.tokens.size() * (sizeof(int32_t) + sizeof(float)) +
             trace.spans.size() * sizeof(Span) + trace.history.size() * sizeof(uint64_t) +
             trace.turns.size() * (sizeof(int64_t) + 2 * sizeof(size_t));
  for (const Turn& turn : turns) {
    bytes += 512 + turn.request_id.size() + server::dump_json(turn.reply).size();
    for (const Generation& generation : turn.generations)
      bytes +=
          128 + server::dump_json(generation.tool_calls).size() + generation.weight_version.size();
    for (const GuardEvent& event : turn.guard)
      bytes += 256 + event.tool.size() + event.arguments.size() + event.reason.size();
  }
  return bytes;
}

nlohmann::json sample_json(const Session& session, const Trace& trace, const Tokenizer& tokenizer,
                           bool with_text) {
  const size_t prompt_length = trace.prompt_length();
  const size_t total = trace.tokens.size();
  std::vector<int> loss_mask(total - std::min(prompt_length, total), 0);
  std::vector<float> logprobs(loss_mask.size(), 0.0f);
  nlohmann::json weight_versions = nlohmann::json::array();
  nlohmann::json spans = nlohmann::json::array();
  nlohmann::json interceptions = nlohmann::json::array();
  std::string finish_reason;
  for (size_t s = 0; s < trace.spans.size(); ++s) {
    const Span& span = trace.spans[s];
    spans.push_back(span_json(span));
    if (span.kind != SpanKind::Model) continue;
    for (size_t i = std::max(span.begin, prompt_length); i < std::min(span.end, total); ++i) {
      loss_mask[i - prompt_length] = 1;
      logprobs[i - prompt_length] = trace.logprobs[i];
    }
    const Generation* generation = generation_of(session, span);
    if (generation == nullptr) continue;
    weight_versions.push_back(generation->weight_version);
    finish_reason = generation->finish_reason;
    if (!span.intercepted) continue;
    nlohmann::json interception = {{"turn", span.turn},
                                   {"generation", span.generation},
                                   {"begin", span.begin},
                                   {"end", span.end},
                                   {"tool_calls", generation->tool_calls}};
    // The virtual tool result follows the blocked call.
    if (s + 1 < trace.spans.size() && trace.spans[s + 1].kind == SpanKind::Virtual) {
      interception["virtual_begin"] = trace.spans[s + 1].begin;
      interception["virtual_end"] = trace.spans[s + 1].end;
    }
    nlohmann::json rules = nlohmann::json::array(), reasons = nlohmann::json::array();
    const Turn& turn = session.turns[static_cast<size_t>(span.turn)];
    for (const GuardEvent& event : turn.guard) {
      if (event.generation != span.generation || !event.confirmed) continue;
      for (const auto& rule : event.rules) rules.push_back(rule);
      reasons.push_back(sanitize_utf8(event.reason));
    }
    interception["rules"] = std::move(rules);
    interception["judge_reasons"] = std::move(reasons);
    interceptions.push_back(std::move(interception));
  }
  nlohmann::json guard = nlohmann::json::array();
  for (int64_t turn_index : trace.turns)
    for (const GuardEvent& event : session.turns[static_cast<size_t>(turn_index)].guard) {
      nlohmann::json item = guard_event_json(event);
      item["turn"] = turn_index;
      guard.push_back(std::move(item));
    }
  nlohmann::json metadata = {
      {"rollout_id", session.rollout_id},
      {"session_id", session.id},
      {"parent_session_id",
       session.parent_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(session.parent_id)},
      {"trace", trace.index},
      {"trace_start", trace.start},
      {"forked_from", trace.forked_from_trace < 0
                          ? nlohmann::json(nullptr)
                          : nlohmann::json({{"trace", trace.forked_from_trace},
                                            {"turn", trace.forked_from_turn}})},
      {"turns", trace.turns},
      {"prompt_length", prompt_length},
      {"spans", std::move(spans)},
      {"interceptions", std::move(interceptions)},
      {"guard", std::move(guard)},
      {"finish_reason", finish_reason}};
  nlohmann::json sample = {{"tokens", trace.tokens},
                           {"response_length", loss_mask.size()},
                           {"loss_mask", loss_mask},
                           {"rollout_log_probs", logprobs},
                           {"weight_versions", std::move(weight_versions)},
                           {"status", sample_status(finish_reason)},
                           {"session_id", session.id},
                           {"reward", nullptr},
                           {"metadata", std::move(metadata)}};
  if (with_text) {
    sample["prompt"] =
        sanitize_utf8(tokenizer.decode(slice(trace.tokens, 0, prompt_length), false));
    sample["response"] =
        sanitize_utf8(tokenizer.decode(slice(trace.tokens, prompt_length, total), false));
  }
  return sample;
}

nlohmann::json session_json(const Session& session, const Tokenizer& tokenizer,
                            bool with_prompt_ids) {
  nlohmann::json turns = nlohmann::json::array();
  for (const Turn& turn : session.turns) {
    const Trace& trace = session.traces[static_cast<size_t>(turn.trace)];
    nlohmann::json generations = nlohmann::json::array();
    for (const Generation& generation : turn.generations) {
      std::vector<float> logprobs(
          trace.logprobs.begin() + static_cast<std::ptrdiff_t>(generation.begin),
          trace.logprobs.begin() + static_cast<std::ptrdiff_t>(generation.end));
      nlohmann::json item = {{"prompt_length", generation.begin},
                             {"output_ids", slice(trace.tokens, generation.begin, generation.end)},
                             {"output_logprobs", logprobs},
                             {"finish_reason", generation.finish_reason},
                             {"weight_version", generation.weight_version},
                             {"cached_tokens", generation.cached_tokens},
                             {"tool_calls", generation.tool_calls},
                             {"intercepted", generation.intercepted}};
      if (with_prompt_ids) item["prompt_ids"] = slice(trace.tokens, 0, generation.begin);
      generations.push_back(std::move(item));
    }
    nlohmann::json guard = nlohmann::json::array();
    for (const GuardEvent& event : turn.guard) guard.push_back(guard_event_json(event));
    turns.push_back(
        {{"turn", turn.index},
         {"trace", turn.trace},
         {"kind", turn.kind},
         {"diverges_at",
          turn.diverges_at < 0 ? nlohmann::json(nullptr) : nlohmann::json(turn.diverges_at)},
         {"request_id", turn.request_id},
         {"created", turn.created},
         {"context",
          {{"begin", turn.context_begin},
           {"end", turn.context_end},
           {"ids", slice(trace.tokens, turn.context_begin, turn.context_end)}}},
         {"generations", std::move(generations)},
         {"guard", std::move(guard)},
         {"reply", turn.reply},
         {"finish_reason",
          turn.generations.empty() ? std::string() : turn.generations.back().finish_reason}});
  }
  nlohmann::json samples = nlohmann::json::array();
  for (const Trace& trace : session.traces)
    samples.push_back(sample_json(session, trace, tokenizer, false));
  nlohmann::json out = session_summary_json(session);
  out["turns"] = std::move(turns);
  out["samples"] = std::move(samples);
  return out;
}

nlohmann::json session_summary_json(const Session& session) {
  return {{"session_id", session.id},
          {"parent_session_id",
           session.parent_id.empty() ? nlohmann::json(nullptr) : nlohmann::json(session.parent_id)},
          {"rollout_id", session.rollout_id},
          {"created", session.created},
          {"finished", session.finished},
          {"turn_count", session.turns.size()},
          {"trace_count", session.traces.size()},
          {"bytes", session.bytes}};
}

}  // namespace megactx::gateway
