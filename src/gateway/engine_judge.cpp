#include "gateway/engine_judge.h"

#include <boost/asio/post.hpp>
#include <boost/asio/thread_pool.hpp>

#include <chrono>
#include <memory>

#include "chat/output_parser.h"
#include "server/chat_request.h"
#include "server/generation_output.h"
#include "server/json_text.h"

namespace megactx::gateway {

namespace {

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

EngineJudge::EngineJudge(server::ServerState& state, JudgeConfig config)
    : state_(state), config_(std::move(config)) {}

void EngineJudge::judge(const JudgeCase& item, std::function<void(Verdict)> done) {
  const auto start = std::chrono::steady_clock::now();
  struct Pending {
    server::GenerationOutput output;
    OutputParserOptions parser;
    std::function<void(Verdict)> done;
  };
  auto pending = std::make_shared<Pending>();
  pending->done = std::move(done);
  GenerationRequest request;
  try {
    server::HttpRequest http;
    http.method = "POST";
    http.path = http.target = "/v1/chat/completions";
    http.body = server::dump_json(
        judge_request_body(item, "", config_.max_tokens, /*template_kwargs=*/true));
    const server::ChatRequestPlan plan = server::plan_chat_request(state_, http);
    pending->parser = plan.parser_options;
    request = server::chat_generation_request(plan, 0, state_.new_id("judge-"));
  } catch (const std::exception& error) {
    // No verdict (e.g. an engine without structured output, a case too long
    // for the context); reported from the caller's side of a thread hop, as
    // the interface promises.
    Verdict verdict{VerdictKind::Failed, std::string("the judge request failed: ") + error.what(),
                    seconds_since(start)};
    state_.post([pending, verdict] { pending->done(verdict); });
    return;
  }
  state_.submit(std::move(request), [pending, start](const RequestUpdate& update) {
    pending->output.add(update);
    if (update.finish == FinishReason::None) return;
    Verdict verdict;
    if (update.finish == FinishReason::Error || update.finish == FinishReason::Abort) {
      verdict = {VerdictKind::Failed, "the judge's generation ended: " + update.finish_detail, 0.0};
    } else {
      const ParsedMessage parsed = parse_output(pending->output.text, pending->parser);
      verdict = parse_verdict(parsed.content);
    }
    verdict.seconds = seconds_since(start);
    pending->done(verdict);
  });
}

}  // namespace megactx::gateway
