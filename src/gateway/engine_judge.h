// The default judge: this server's own engine, called in-process. The judge
// request goes through the same planning as /v1/chat/completions (chat
// template, the verdict schema compiled to a grammar over the engine's
// vocabulary, greedy), is submitted to the engine directly and never counts
// as a session turn.
#pragma once

#include "gateway/gateway_config.h"
#include "gateway/judge.h"
#include "server/server_state.h"

namespace megactx::gateway {

class EngineJudge : public Judge {
 public:
  EngineJudge(server::ServerState& state, JudgeConfig config);
  void judge(const JudgeCase& item, std::function<void(Verdict)> done) override;

 private:
  server::ServerState& state_;
  JudgeConfig config_;
};

}  // namespace megactx::gateway
