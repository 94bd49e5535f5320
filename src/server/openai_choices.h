// One OpenAI request (/v1/completions, /v1/chat/completions) answered by one
// engine request per choice: n per prompt, prompt-major when /v1/completions
// has several prompts. The job collects every choice's updates and, once all
// have finished, ends the response: whole, the choices in index order with
// usage summed over them (each prompt counted once); streamed, a usage chunk
// when asked for, then [DONE]. A failed choice fails a whole response with
// 400; streamed, it is an error event, or a plain 400 when it is the only
// choice and nothing has been sent yet. The endpoint formats one choice,
// whole or as chunks.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/request.h"
#include "server/generation_output.h"
#include "server/http_types.h"
#include "server/server_state.h"

namespace megactx::server {

class OpenAiChoiceJob {
 public:
  // `object` names the whole response ("chat.completion"), `chunk_object`
  // each streamed chunk ("chat.completion.chunk").
  OpenAiChoiceJob(ServerState& state, std::shared_ptr<ResponseChannel> channel, std::string id,
                  std::string object, std::string chunk_object);
  virtual ~OpenAiChoiceJob() = default;

  // Submits requests[i] as choice i; a client disconnect aborts them all.
  // Called once, after `requests` and the endpoint's own per-choice state are
  // filled in.
  static void submit(const std::shared_ptr<OpenAiChoiceJob>& job);

  // The engine's update for choice `index` (serialised by the job's mutex).
  void on_update(size_t index, const RequestUpdate& update);

  ServerState& state;
  std::shared_ptr<ResponseChannel> channel;
  const std::string id;
  const int64_t created;
  bool stream = false, include_usage = false;
  size_t choices_per_prompt = 1;            // n
  std::vector<GenerationRequest> requests;  // [choices]
  std::vector<GenerationOutput> outputs;    // [choices], sized by submit()

 protected:
  // Choice `index` of the whole response: every choice has finished, none failed.
  virtual nlohmann::json whole_choice(size_t index) const = 0;
  // Writes the chunks for what `update` added to choice `index` (already in
  // outputs[index]) and its finish chunk when `finished_now`. Never called
  // for a failed choice.
  virtual void stream_choice(size_t index, const RequestUpdate& update, bool finished_now) = 0;

  // A streamed chunk carrying one choice object; "usage": null in every chunk
  // when the stream ends with a usage chunk, as OpenAI sends it.
  nlohmann::json chunk(nlohmann::json choice) const;

 private:
  void respond_whole();
  void stream_update(size_t index, const RequestUpdate& update, bool finished_now);
  nlohmann::json usage() const;

  const std::string object_, chunk_object_;
  std::mutex mutex_;
  size_t remaining_ = 0;  // choices not finished yet
  bool stream_started_ = false;
};

}  // namespace megactx::server
