#include "gateway/gateway_routes.h"

#include "gateway/gateway.h"
#include "gateway/judge.h"
#include "gateway/trajectory.h"
#include "server/api_error.h"
#include "server/endpoints.h"
#include "server/json_text.h"
#include "server/request_fields.h"
#include "tokenizer/tokenizer.h"

namespace megactx::gateway {

namespace {

using server::HttpRequest;
using server::HttpResponse;
using server::ResponseChannel;
using server::throw_invalid;

bool query_flag(const std::map<std::string, std::string>& fields, const std::string& name) {
  auto it = fields.find(name);
  if (it == fields.end()) return false;
  if (it->second == "1" || it->second == "true" || it->second.empty()) return true;
  if (it->second == "0" || it->second == "false") return false;
  throw_invalid(name, "'" + name + "' must be 1, 0, true or false");
}

std::string query_text(const std::map<std::string, std::string>& fields, const std::string& name) {
  auto it = fields.find(name);
  return it == fields.end() ? std::string() : it->second;
}

// Exactly one of rollout_id and session_id, from a body or a query.
struct Selection {
  std::string rollout_id, session_id;
};

Selection selection_of(std::string rollout_id, std::string session_id) {
  if (rollout_id.empty() == session_id.empty())
    throw_invalid("rollout_id", "give exactly one of 'rollout_id' and 'session_id'");
  return {std::move(rollout_id), std::move(session_id)};
}

Selection body_selection(const HttpRequest& request) {
  const nlohmann::json body =
      request.body.empty() ? nlohmann::json::object() : server::parse_request_json(request.body);
  if (!body.is_object()) throw_invalid("body", "the body must be a JSON object");
  std::string rollout, session;
  if (server::has_field(body, "rollout_id")) {
    if (!body["rollout_id"].is_string())
      throw_invalid("rollout_id", "'rollout_id' must be a string");
    rollout = body["rollout_id"].get<std::string>();
  }
  if (server::has_field(body, "session_id")) {
    if (!body["session_id"].is_string())
      throw_invalid("session_id", "'session_id' must be a string");
    session = body["session_id"].get<std::string>();
  }
  return selection_of(rollout, session);
}

void sessions(Gateway& gateway, const HttpRequest& request,
              std::shared_ptr<ResponseChannel> channel) {
  const auto fields = server::query_fields(request.target);
  const std::string rollout = query_text(fields, "rollout_id");
  nlohmann::json list = nlohmann::json::array();
  // Every session when no rollout is named.
  const auto selected =
      rollout.empty() ? gateway.store().all() : gateway.store().select(rollout, "");
  for (const auto& stored : selected) {
    std::lock_guard lock(stored->mutex);
    list.push_back(session_summary_json(stored->session));
  }
  const StoreStats stats = gateway.store().stats();
  channel->respond(server::json_response({{"sessions", std::move(list)},
                                          {"store",
                                           {{"sessions", stats.sessions},
                                            {"bytes", stats.bytes},
                                            {"max_sessions", gateway.store().limits().max_sessions},
                                            {"max_bytes", gateway.store().limits().max_bytes},
                                            {"evicted", stats.evicted}}}}));
}

void session(Gateway& gateway, const HttpRequest& request,
             std::shared_ptr<ResponseChannel> channel) {
  const auto fields = server::query_fields(request.target);
  const std::string id = query_text(fields, "session_id");
  if (id.empty()) throw_invalid("session_id", "'session_id' is required (?session_id=...)");
  const bool with_prompt_ids = query_flag(fields, "prompt_ids");
  auto stored = gateway.store().find(id);
  if (!stored) throw server::ApiError(404, "no gateway session '" + id + "'", "session_id");
  nlohmann::json out;
  {
    std::lock_guard lock(stored->mutex);
    out = session_json(stored->session, gateway.state().engine().tokenizer(), with_prompt_ids);
  }
  channel->respond(server::json_response(out));
}

void samples(Gateway& gateway, const HttpRequest& request,
             std::shared_ptr<ResponseChannel> channel) {
  const auto fields = server::query_fields(request.target);
  const Selection selection =
      selection_of(query_text(fields, "rollout_id"), query_text(fields, "session_id"));
  const bool finish = query_flag(fields, "finish");
  const bool with_text = query_flag(fields, "text");
  const Tokenizer& tokenizer = gateway.state().engine().tokenizer();
  HttpResponse response;
  response.content_type = "application/x-ndjson";
  for (const auto& stored : gateway.store().select(selection.rollout_id, selection.session_id)) {
    std::lock_guard lock(stored->mutex);
    for (const Trace& trace : stored->session.traces)
      response.body +=
          server::dump_json(sample_json(stored->session, trace, tokenizer, with_text)) + "\n";
  }
  if (finish) gateway.store().finish(selection.rollout_id, selection.session_id);
  channel->respond(std::move(response));
}

void finish(Gateway& gateway, const HttpRequest& request,
            std::shared_ptr<ResponseChannel> channel) {
  const Selection selection = body_selection(request);
  const int64_t count = gateway.store().finish(selection.rollout_id, selection.session_id);
  channel->respond(server::json_response({{"finished", count}}));
}

void remove(Gateway& gateway, const HttpRequest& request,
            std::shared_ptr<ResponseChannel> channel) {
  const Selection selection = body_selection(request);
  const int64_t count = gateway.store().remove(selection.rollout_id, selection.session_id);
  channel->respond(server::json_response({{"deleted", count}}));
}

nlohmann::json hits_json(const std::vector<RuleHit>& hits) {
  nlohmann::json out = nlohmann::json::array();
  for (const RuleHit& hit : hits)
    out.push_back({{"rule", hit.rule},
                   {"category", hit.category},
                   {"description", hit.description},
                   {"evidence", server::sanitize_utf8(hit.evidence)},
                   {"judge", hit.judge}});
  return out;
}

void screen(Gateway& gateway, const HttpRequest& request,
            std::shared_ptr<ResponseChannel> channel) {
  const nlohmann::json body = server::parse_request_json(request.body);
  if (!body.is_object()) throw_invalid("body", "the body must be a JSON object");
  const auto tool = server::get_string(body, "tool");
  if (!tool || tool->empty()) throw_invalid("tool", "'tool' (the function's name) is required");
  if (!body.contains("arguments") ||
      !(body["arguments"].is_object() || body["arguments"].is_string()))
    throw_invalid("arguments", "'arguments' must be an object or a JSON string");
  nlohmann::json messages = nlohmann::json::array();
  if (server::has_field(body, "messages")) {
    if (!body["messages"].is_array()) throw_invalid("messages", "'messages' must be a list");
    messages = body["messages"];
  }
  const bool use_judge = server::get_bool(body, "judge").value_or(false);
  const nlohmann::json call = {{"function", {{"name", *tool}, {"arguments", body["arguments"]}}}};
  const ToolCallView view = view_tool_call(call);
  std::vector<RuleHit> hits = gateway.guard().filter().screen(view);
  nlohmann::json out = {{"tool", *tool}, {"flagged", !hits.empty()}, {"rules", hits_json(hits)}};
  bool needs_judge = !hits.empty();
  for (const RuleHit& hit : hits) needs_judge = needs_judge && hit.judge;
  if (!hits.empty() && !needs_judge) {
    out["confirmed"] = true;
    out["verdict"] = "not_judged";
  }
  Judge* judge = gateway.guard().judge();
  if (!use_judge || !needs_judge || judge == nullptr) {
    if (!out.contains("confirmed")) out["confirmed"] = false;
    if (!out.contains("verdict")) out["verdict"] = nullptr;
    return channel->respond(server::json_response(out));
  }
  judge->judge(judge_case(messages, view, hits), [channel, out](Verdict verdict) mutable {
    out["verdict"] = verdict_name(verdict.kind);
    out["reason"] = server::sanitize_utf8(verdict.reason);
    out["judge_seconds"] = verdict.seconds;
    out["confirmed"] = verdict.kind == VerdictKind::Hack;
    channel->respond(server::json_response(out));
  });
}

void rules(Gateway& gateway, const HttpRequest&, std::shared_ptr<ResponseChannel> channel) {
  nlohmann::json list = nlohmann::json::array();
  for (const Rule& rule : gateway.guard().filter().rules())
    list.push_back({{"id", rule.id},
                    {"category", rule.category},
                    {"description", rule.description},
                    {"judge", rule.judge}});
  const GatewayConfig& config = gateway.config();
  channel->respond(
      server::json_response({{"mode", guard_mode_name(config.mode)},
                             {"judge", config.judge.endpoint},
                             {"builtin_sets", RuleFilter::builtin_sets()},
                             {"rules", std::move(list)},
                             {"intercept_text", config.intercept_text},
                             {"max_intercepts_per_turn", config.max_intercepts_per_turn}}));
}

}  // namespace

void add_gateway_routes(server::Router& router, Gateway& gateway) {
  using Handler = void (*)(Gateway&, const HttpRequest&, std::shared_ptr<ResponseChannel>);
  auto bind = [&gateway](Handler handler) {
    return
        [&gateway, handler](const HttpRequest& request, std::shared_ptr<ResponseChannel> channel) {
          handler(gateway, request, std::move(channel));
        };
  };
  router.add("GET", "/gateway/sessions", bind(sessions));
  router.add("GET", "/gateway/session", bind(session));
  router.add("GET", "/gateway/samples", bind(samples));
  router.add("POST", "/gateway/finish", bind(finish));
  router.add("POST", "/gateway/delete", bind(remove));
  router.add("POST", "/gateway/screen", bind(screen));
  router.add("GET", "/gateway/rules", bind(rules));
}

}  // namespace megactx::gateway
