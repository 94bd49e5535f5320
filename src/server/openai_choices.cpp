#include "server/openai_choices.h"

#include "server/api_error.h"
#include "server/endpoints.h"
#include "server/openai_common.h"
#include "server/request_group.h"
#include "server/sse.h"

namespace megactx::server {

OpenAiChoiceJob::OpenAiChoiceJob(ServerState& state_in, std::shared_ptr<ResponseChannel> channel_in,
                                 std::string id_in, std::string object, std::string chunk_object)
    : state(state_in),
      channel(std::move(channel_in)),
      id(std::move(id_in)),
      created(unix_time_seconds()),
      object_(std::move(object)),
      chunk_object_(std::move(chunk_object)) {}

void OpenAiChoiceJob::submit(const std::shared_ptr<OpenAiChoiceJob>& job) {
  job->outputs.resize(job->requests.size());
  job->remaining_ = job->requests.size();
  std::vector<const GenerationRequest*> requests;
  for (const auto& request : job->requests) requests.push_back(&request);
  // The n choices of a prompt are consecutive: the first prefills it for the others.
  submit_request_group(
      job->state, *job->channel, requests,
      [job](size_t index, const RequestUpdate& update) { job->on_update(index, update); },
      sample_group_leaders(requests.size(), job->choices_per_prompt));
}

void OpenAiChoiceJob::on_update(size_t index, const RequestUpdate& update) {
  std::lock_guard lock(mutex_);
  outputs[index].add(update);
  bool finished_now = update.finish != FinishReason::None;
  if (finished_now) --remaining_;
  if (stream) return stream_update(index, update, finished_now);
  if (remaining_ == 0) respond_whole();
}

void OpenAiChoiceJob::respond_whole() {
  for (const auto& output : outputs)
    if (output.finish == FinishReason::Error)
      return channel->respond(
          error_response(error_status(output.server_error), output.finish_detail));
  nlohmann::json choices = nlohmann::json::array();
  for (size_t i = 0; i < outputs.size(); ++i) choices.push_back(whole_choice(i));
  channel->respond(json_response({{"id", id},
                                  {"object", object_},
                                  {"created", created},
                                  {"model", state.config().served_model_name},
                                  {"choices", std::move(choices)},
                                  {"usage", usage()}}));
}

void OpenAiChoiceJob::stream_update(size_t index, const RequestUpdate& update, bool finished_now) {
  bool failed = finished_now && update.finish == FinishReason::Error;
  if (!stream_started_) {
    if (failed && outputs.size() == 1)
      return channel->respond(
          error_response(error_status(update.server_error), update.finish_detail));
    channel->begin_stream(200, kEventStreamType);
    stream_started_ = true;
  }
  if (failed)
    channel->write(sse_event(error_json(error_status(update.server_error), update.finish_detail)));
  else
    stream_choice(index, update, finished_now);
  if (remaining_ > 0) return;
  if (include_usage)
    channel->write(sse_event({{"id", id},
                              {"object", chunk_object_},
                              {"created", created},
                              {"model", state.config().served_model_name},
                              {"choices", nlohmann::json::array()},
                              {"usage", usage()}}));
  channel->write(sse_done());
  channel->end_stream();
}

nlohmann::json OpenAiChoiceJob::chunk(nlohmann::json choice) const {
  nlohmann::json out = {{"id", id},
                        {"object", chunk_object_},
                        {"created", created},
                        {"model", state.config().served_model_name},
                        {"choices", nlohmann::json::array({std::move(choice)})}};
  if (include_usage) out["usage"] = nullptr;
  return out;
}

nlohmann::json OpenAiChoiceJob::usage() const {
  std::vector<const GenerationOutput*> pointers;
  for (const auto& output : outputs) pointers.push_back(&output);
  return usage_json(pointers, choices_per_prompt);
}

}  // namespace megactx::server
