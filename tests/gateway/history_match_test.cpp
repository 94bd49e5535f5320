// History matching on its own: message fingerprints, the choice of the
// recorded turn a request continues, and where recorded tokens end in a new
// rendering (append, realign, stop tokens the template does or does not
// write, nothing to align with).
#include <gtest/gtest.h>

#include "gateway/history_match.h"
#include "gateway/message_fingerprint.h"

namespace megactx::gateway {
namespace {

TEST(MessageFingerprint, IgnoresWhatClientsRewrite) {
  const nlohmann::json sent = {
      {"role", "assistant"},
      {"content", nullptr},
      {"reasoning_content", "let me look"},
      {"tool_calls",
       {{{"id", "call_1"},
         {"type", "function"},
         {"function", {{"name", "bash"}, {"arguments", "{\"b\": 2, \"a\": \"x\"}"}}}}}}};
  const nlohmann::json echoed = {
      {"role", "assistant"},
      {"content", "  "},
      {"tool_calls",
       {{{"id", "call_other"},
         {"function", {{"name", "bash"}, {"arguments", "{\"a\":\"x\",\"b\":2}"}}}}}}};
  EXPECT_EQ(message_fingerprint(sent), message_fingerprint(echoed));
  nlohmann::json changed = echoed;
  changed["tool_calls"][0]["function"]["arguments"] = "{\"a\":\"y\",\"b\":2}";
  EXPECT_NE(message_fingerprint(sent), message_fingerprint(changed));
  // Content as a list of text parts reads as its text.
  const nlohmann::json text = {{"role", "user"}, {"content", "hello world"}};
  const nlohmann::json parts = {
      {"role", "user"},
      {"content", {{{"type", "text"}, {"text", "hello "}}, {{"type", "text"}, {"text", "world"}}}}};
  EXPECT_EQ(message_fingerprint(text), message_fingerprint(parts));
  const nlohmann::json user = {{"role", "user"}, {"content", "a"}};
  const nlohmann::json system = {{"role", "system"}, {"content", "a"}};
  EXPECT_NE(message_fingerprint(user), message_fingerprint(system));
}

TEST(MessageFingerprint, HeaderCoversTheTools) {
  const nlohmann::json a = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}};
  nlohmann::json b = a;
  b["tools"] = {{{"type", "function"}, {"function", {{"name", "f"}}}}};
  const auto fa = history_fingerprints(a), fb = history_fingerprints(b);
  ASSERT_EQ(fa.size(), 2u);
  EXPECT_NE(fa[0], fb[0]);
  EXPECT_EQ(fa[1], fb[1]);
}

Session session_with_trace(std::vector<uint64_t> history, std::vector<size_t> history_ends,
                           std::vector<size_t> token_ends) {
  Session session;
  Trace trace;
  trace.history = std::move(history);
  for (size_t j = 0; j < history_ends.size(); ++j) {
    trace.turns.push_back(static_cast<int64_t>(j));
    trace.turn_history_end.push_back(history_ends[j]);
    trace.turn_token_end.push_back(token_ends[j]);
    session.turns.emplace_back();
  }
  session.traces.push_back(trace);
  return session;
}

TEST(MatchHistory, LatestTurnEarlierTurnOrNone) {
  // header, user, reply0, tool, reply1
  const Session session = session_with_trace({1, 2, 3, 4, 5}, {3, 5}, {10, 20});
  HistoryMatch latest = match_history(session, {1, 2, 3, 4, 5, 6});
  ASSERT_TRUE(latest.found);
  EXPECT_TRUE(latest.latest);
  EXPECT_EQ(latest.turn, 1);
  EXPECT_EQ(latest.token_end, 20u);
  // A different tool result after reply0: a fork from turn 0.
  HistoryMatch fork = match_history(session, {1, 2, 3, 9, 10});
  ASSERT_TRUE(fork.found);
  EXPECT_FALSE(fork.latest);
  EXPECT_EQ(fork.turn, 0);
  EXPECT_EQ(fork.history_end, 3u);
  // The same request again (a retry) repeats turn 0's history, not its reply.
  HistoryMatch retry = match_history(session, {1, 2});
  EXPECT_FALSE(retry.found);
  // A rewritten first message: nothing matches.
  EXPECT_FALSE(match_history(session, {1, 7, 3, 4, 5, 6}).found);
}

TEST(AlignHistory, AppendIsAPrefix) {
  const std::string recorded = "<|user|>hi<|assistant|><tool_call>f</tool_call>";
  const std::string rendered = recorded + "<|observation|>result<|assistant|>";
  const Alignment alignment = align_history(rendered, recorded, 0, 20, rendered.size());
  EXPECT_TRUE(alignment.aligned);
  EXPECT_TRUE(alignment.exact);
  EXPECT_EQ(alignment.cut, recorded.size());
}

TEST(AlignHistory, RealignsAroundADroppedReasoning) {
  const std::string recorded = "<|user|>hi<|assistant|><think>plan</think>answer";
  const std::string rendered = "<|user|>hi<|assistant|>answer<|user|>more<|assistant|>";
  const size_t upper = rendered.find("more");
  const Alignment alignment = align_history(rendered, recorded, 0, 25, upper);
  EXPECT_TRUE(alignment.aligned);
  EXPECT_FALSE(alignment.exact);
  EXPECT_EQ(alignment.diverges_at, std::string("<|user|>hi<|assistant|>").size());
  EXPECT_EQ(rendered.substr(alignment.cut), "<|user|>more<|assistant|>");
}

TEST(AlignHistory, StopTokenTheTemplateWrites) {
  // The model stopped on <|observation|>, which the template writes before the result.
  const std::string recorded =
      "<|assistant|>\n<think>x</think>\n<tool_call>f\n</tool_call><|observation|>";
  const std::string rendered =
      "<|assistant|>\n<think></think>\n<tool_call>f\n</"
      "tool_call><|observation|>\n<tool_response>\nok"
      "\n</tool_response><|assistant|>";
  const Alignment alignment = align_history(
      rendered, recorded, std::string("<|observation|>").size(), 40, rendered.find("ok"));
  ASSERT_TRUE(alignment.aligned);
  EXPECT_EQ(rendered.substr(alignment.cut), "\n<tool_response>\nok\n</tool_response><|assistant|>");
}

TEST(AlignHistory, StopTokenTheTemplateDoesNotWrite) {
  // An end-of-text stop: the recorded tokens keep it, the new tokens start after the answer.
  const std::string recorded = "<|assistant|>\n<think>x</think>\nthe answer<|endoftext|>";
  const std::string rendered =
      "<|assistant|>\n<think></think>\nthe answer<|user|>\nnext<|assistant|>";
  const Alignment alignment = align_history(rendered, recorded, std::string("<|endoftext|>").size(),
                                            25, rendered.find("next"));
  ASSERT_TRUE(alignment.aligned);
  EXPECT_EQ(rendered.substr(alignment.cut), "<|user|>\nnext<|assistant|>");
}

TEST(AlignHistory, StopTokenTheTemplateDoesNotWriteAfterAnEmptyThinkBlock) {
  // The model wrote an empty think block itself, so the rendering repeats the
  // recorded text up to the stop token, and the next turn's "<|user|>" shares
  // the stop text's first characters "<|": the first difference lies inside
  // the stop token's text, past the end of the answer, and the search must
  // still reach back to it.
  const std::string recorded = "<|assistant|>\n<think></think>\nthe answer<|endoftext|>";
  const std::string rendered =
      "<|assistant|>\n<think></think>\nthe answer<|user|>\nnext<|assistant|>";
  const Alignment alignment = align_history(rendered, recorded, std::string("<|endoftext|>").size(),
                                            10, rendered.find("next"));
  ASSERT_TRUE(alignment.aligned);
  EXPECT_FALSE(alignment.exact);
  EXPECT_EQ(rendered.substr(alignment.cut), "<|user|>\nnext<|assistant|>");
}

TEST(AlignHistory, NothingToAlignWith) {
  const std::string recorded = "<|assistant|>completely different text that was generated";
  const std::string rendered = "<|system|>summary of the work so far<|user|>go on<|assistant|>";
  const Alignment alignment = align_history(rendered, recorded, 0, 45, rendered.find("go on"));
  EXPECT_FALSE(alignment.aligned);
}

}  // namespace
}  // namespace megactx::gateway
