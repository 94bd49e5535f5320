#include "gateway/turn_response.h"

#include "server/endpoints.h"
#include "server/sse.h"

namespace megactx::gateway {

namespace {

nlohmann::json chunk(const TurnReply& reply, nlohmann::json delta, nlohmann::json logprobs,
                     nlohmann::json finish, bool include_usage) {
  nlohmann::json out = {
      {"id", reply.id},
      {"object", "chat.completion.chunk"},
      {"created", reply.created},
      {"model", reply.model},
      {"choices", nlohmann::json::array({{{"index", 0},
                                          {"delta", std::move(delta)},
                                          {"logprobs", std::move(logprobs)},
                                          {"finish_reason", std::move(finish)}}})}};
  if (include_usage) out["usage"] = nullptr;
  return out;
}

bool non_empty_string(const nlohmann::json& message, const char* field) {
  return message.contains(field) && message[field].is_string() &&
         !message[field].get<std::string>().empty();
}

}  // namespace

server::HttpResponse turn_response(const TurnReply& reply) {
  nlohmann::json choice = {{"index", 0},
                           {"message", reply.message},
                           {"logprobs", reply.logprobs},
                           {"finish_reason", reply.finish_reason},
                           {"matched_stop", reply.matched_stop}};
  return server::json_response({{"id", reply.id},
                                {"object", "chat.completion"},
                                {"created", reply.created},
                                {"model", reply.model},
                                {"choices", nlohmann::json::array({std::move(choice)})},
                                {"usage", reply.usage},
                                {"gateway", reply.gateway}});
}

void stream_turn(server::ResponseChannel& channel, const TurnReply& reply, bool include_usage) {
  using server::sse_event;
  channel.begin_stream(200, server::kEventStreamType);
  channel.write(sse_event(
      chunk(reply, {{"role", "assistant"}, {"content", ""}}, nullptr, nullptr, include_usage)));
  const nlohmann::json& message = reply.message;
  if (non_empty_string(message, "reasoning_content"))
    channel.write(sse_event(chunk(reply, {{"reasoning_content", message["reasoning_content"]}},
                                  nullptr, nullptr, include_usage)));
  // The logprobs ride on the content chunk (or the finish chunk when there is none).
  nlohmann::json logprobs = reply.logprobs;
  if (non_empty_string(message, "content")) {
    channel.write(sse_event(chunk(reply, {{"content", message["content"]}}, std::move(logprobs),
                                  nullptr, include_usage)));
    logprobs = nullptr;
  }
  if (message.contains("tool_calls") && message["tool_calls"].is_array()) {
    int index = 0;
    for (const auto& call : message["tool_calls"]) {
      nlohmann::json item = call;
      item["index"] = index++;
      channel.write(sse_event(chunk(reply, {{"tool_calls", nlohmann::json::array({item})}}, nullptr,
                                    nullptr, include_usage)));
    }
  }
  nlohmann::json last = chunk(reply, nlohmann::json::object(), std::move(logprobs),
                              reply.finish_reason, include_usage);
  last["gateway"] = reply.gateway;
  channel.write(sse_event(last));
  if (include_usage)
    channel.write(sse_event({{"id", reply.id},
                             {"object", "chat.completion.chunk"},
                             {"created", reply.created},
                             {"model", reply.model},
                             {"choices", nlohmann::json::array()},
                             {"usage", reply.usage}}));
  channel.write(server::sse_done());
  channel.end_stream();
}

}  // namespace megactx::gateway
