// POST /generate as SGLang serves it (python/sglang/srt/managers/io_struct.py
// GenerateReqInput, entrypoints/http_server.py): `text` or `input_ids`, single
// or batch; per-item `sampling_params`, `rid`, `return_logprob`,
// `logprob_start_len`, `top_logprobs_num`; `stream` sends SSE chunks whose
// `text` and `output_ids` are cumulative, then "data: [DONE]". Structured
// output: sampling_params.json_schema / regex / ebnf (structured_output.h).
#include <chrono>
#include <mutex>

#include "core/base64.h"
#include "io/model_config.h"
#include "server/api_error.h"
#include "server/endpoints.h"
#include "server/generation_output.h"
#include "server/json_text.h"
#include "server/logprob_json.h"
#include "server/prompt_limits.h"
#include "server/request_fields.h"
#include "server/request_group.h"
#include "server/sampling_json.h"
#include "server/sse.h"
#include "server/structured_output.h"
#include "tokenizer/tokenizer.h"

namespace megactx::server {

namespace {

struct GenerateItem {
  GenerationRequest request;
  GenerationOutput output;
  bool return_text_in_logprobs = false;
};

nlohmann::json finish_reason_json(const GenerationOutput& output) {
  switch (output.finish) {
    case FinishReason::None:
      return nullptr;
    case FinishReason::Stop: {
      nlohmann::json reason = {{"type", "stop"}};
      if (output.matched_stop_token)
        reason["matched"] = *output.matched_stop_token;
      else if (!output.finish_detail.empty())
        reason["matched"] = sanitize_utf8(output.finish_detail);
      else
        reason["matched"] = nullptr;
      return reason;
    }
    case FinishReason::Length:
      return {{"type", "length"}, {"length", output.completion_tokens}};
    case FinishReason::Abort:
      return {{"type", "abort"},
              {"message", output.finish_detail.empty() ? "aborted" : output.finish_detail}};
    case FinishReason::Error:
      return {{"type", "abort"}, {"message", output.finish_detail}, {"status_code", 400}};
  }
  return nullptr;
}

// SGLang's meta_info.hidden_states: the prefill's rows as one [prompt, H]
// list, then one [H] list per decoded token, of hidden states [tokens - 1, H]
// (every token but the last).
nlohmann::json sglang_hidden_states(const std::vector<float>& hidden,
                                    const GenerationRequest& request, int64_t H) {
  const int64_t rows = H > 0 ? static_cast<int64_t>(hidden.size()) / H : 0;
  const auto row = [&](int64_t r) {
    return nlohmann::json(std::vector<float>(hidden.begin() + r * H, hidden.begin() + (r + 1) * H));
  };
  const int64_t prompt = std::min<int64_t>(static_cast<int64_t>(request.input_ids.size()), rows);
  nlohmann::json out = nlohmann::json::array();
  nlohmann::json prefill = nlohmann::json::array();
  for (int64_t r = 0; r < prompt; ++r) prefill.push_back(row(r));
  out.push_back(std::move(prefill));
  for (int64_t r = prompt; r < rows; ++r) out.push_back(row(r));
  return out;
}

struct GenerateJob {
  ServerState& state;
  std::shared_ptr<ResponseChannel> channel;
  bool stream = false;
  bool batch = false;
  std::vector<GenerateItem> items;
  std::mutex mutex;
  size_t remaining = 0;
  bool stream_started = false;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();

  GenerateJob(ServerState& state_in, std::shared_ptr<ResponseChannel> channel_in)
      : state(state_in), channel(std::move(channel_in)) {}

  nlohmann::json item_json(size_t index) const {
    const GenerateItem& item = items[index];
    const GenerationOutput& out = item.output;
    const Tokenizer& tokenizer = state.engine().tokenizer();
    nlohmann::json meta = {
        {"id", item.request.rid},
        {"finish_reason", finish_reason_json(out)},
        {"prompt_tokens", out.prompt_tokens > 0
                              ? out.prompt_tokens
                              : static_cast<int64_t>(item.request.input_ids.size())},
        {"completion_tokens", out.completion_tokens},
        {"cached_tokens", out.cached_tokens},
        {"spec_accept_token_num", out.spec_accept_token_num},
        {"spec_draft_token_num", out.spec_draft_token_num},
        {"spec_verify_ct", out.spec_verify_ct},
        {"weight_version", out.weight_versions.empty() ? state.engine().weight_version()
                                                       : out.weight_versions.back()}};
    if (out.weight_versions.size() > 1) meta["weight_versions"] = out.weight_versions;
    if (item.request.return_logprob) {
      auto input = align_input_logprobs(out.input_logprobs, item.request.input_ids,
                                        item.request.logprob_start_len);
      bool with_text = item.return_text_in_logprobs;
      meta["input_token_logprobs"] = sglang_token_logprobs(tokenizer, input, with_text);
      meta["output_token_logprobs"] =
          sglang_token_logprobs(tokenizer, out.output_logprobs, with_text);
      if (item.request.top_logprobs_num > 0) {
        meta["input_top_logprobs"] = sglang_top_logprobs(tokenizer, input, with_text);
        meta["output_top_logprobs"] =
            sglang_top_logprobs(tokenizer, out.output_logprobs, with_text);
      }
      if (!item.request.token_ids_logprob.empty()) {
        meta["input_token_ids_logprobs"] = sglang_token_ids_logprobs(tokenizer, input, with_text);
        meta["output_token_ids_logprobs"] =
            sglang_token_ids_logprobs(tokenizer, out.output_logprobs, with_text);
      }
    }
    if (item.request.return_hidden_states && out.finished())
      meta["hidden_states"] = sglang_hidden_states(out.hidden_states, item.request,
                                                   state.engine().model_config().hidden_size);
    if (item.request.return_routed_experts && out.finished()) {
      // SGLang's encoding: base64 of the int32 array [tokens - 1, layers, top_k].
      meta["routed_experts"] = base64_encode(std::as_bytes(std::span(out.routed_experts)));
    }
    if (out.finished())
      meta["e2e_latency"] =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    nlohmann::json result = {{"text", sanitize_utf8(out.text)},
                             {"output_ids", out.output_ids},
                             {"meta_info", std::move(meta)}};
    if (batch && stream) result["index"] = index;
    return result;
  }

  void on_update(size_t index, const RequestUpdate& update) {
    std::lock_guard lock(mutex);
    GenerateItem& item = items[index];
    item.output.add(update);
    bool finished_now = update.finish != FinishReason::None;
    if (finished_now) --remaining;

    if (stream) {
      if (!stream_started) {
        // An error before anything was sent still gets a proper HTTP status.
        if (finished_now && update.finish == FinishReason::Error && !batch) {
          channel->respond(error_response(error_status(update.server_error), update.finish_detail));
          return;
        }
        channel->begin_stream(200, kEventStreamType);
        stream_started = true;
      }
      if (finished_now && update.finish == FinishReason::Error)
        channel->write(
            sse_event(error_json(error_status(update.server_error), update.finish_detail)));
      else
        channel->write(sse_event(item_json(index)));
      if (remaining == 0) {
        channel->write(sse_done());
        channel->end_stream();
      }
      return;
    }
    if (remaining > 0) return;
    for (const auto& other : items)
      if (other.output.finish == FinishReason::Error) {
        channel->respond(
            error_response(error_status(other.output.server_error), other.output.finish_detail));
        return;
      }
    if (!batch) {
      channel->respond(json_response(item_json(0)));
      return;
    }
    nlohmann::json all = nlohmann::json::array();
    for (size_t i = 0; i < items.size(); ++i) all.push_back(item_json(i));
    channel->respond(json_response(all));
  }
};

// A per-item field: in a batch, a list gives one value per prompt and a
// scalar applies to all.
const nlohmann::json* item_field(const nlohmann::json& body, const std::string& name, size_t index,
                                 size_t batch_size, bool batch, bool list_is_scalar = false) {
  auto it = body.find(name);
  if (it == body.end() || it->is_null()) return nullptr;
  if (batch && it->is_array() && !list_is_scalar) {
    if (it->size() != batch_size)
      throw_invalid(name, "'" + name + "' has " + std::to_string(it->size()) +
                              " entries for a batch of " + std::to_string(batch_size));
    return &(*it)[index];
  }
  return &*it;
}

}  // namespace

void handle_generate(ServerState& state, const HttpRequest& request,
                     std::shared_ptr<ResponseChannel> channel) {
  nlohmann::json body = parse_request_json(request.body);
  bool has_text = has_field(body, "text"), has_ids = has_field(body, "input_ids");
  if (has_text == has_ids) throw_invalid("text", "give exactly one of 'text' or 'input_ids'");
  const Tokenizer& tokenizer = state.engine().tokenizer();

  std::vector<std::vector<int32_t>> prompts;
  bool batch = false;
  if (has_text) {
    const auto& text = body["text"];
    // SGLang tokenizes `text` with the tokenizer's defaults (special tokens added).
    if (text.is_string()) {
      prompts.push_back(tokenizer.encode(text.get<std::string>(), true));
    } else if (text.is_array() && !text.empty()) {
      batch = true;
      for (const auto& item : text) {
        if (!item.is_string())
          throw_invalid("text", "'text' must be a string or a list of strings");
        prompts.push_back(tokenizer.encode(item.get<std::string>(), true));
      }
    } else {
      throw_invalid("text", "'text' must be a string or a non-empty list of strings");
    }
  } else {
    const auto& ids = body["input_ids"];
    if (!ids.is_array() || ids.empty())
      throw_invalid("input_ids", "'input_ids' must be a non-empty list of token ids (or of lists)");
    if (ids[0].is_array()) {
      batch = true;
      for (const auto& item : ids) prompts.push_back(get_token_list(item, "input_ids"));
    } else {
      prompts.push_back(get_token_list(ids, "input_ids"));
    }
  }
  int64_t vocab = tokenizer.vocab_size();
  for (const auto& prompt : prompts) {
    if (prompt.empty()) throw_invalid(has_text ? "text" : "input_ids", "a prompt is empty");
    for (int32_t id : prompt)
      if (vocab > 0 && id >= vocab)
        throw_invalid("input_ids", "token id " + std::to_string(id) +
                                       " is not in the vocabulary (size " + std::to_string(vocab) +
                                       ")");
  }
  bool stream = get_bool(body, "stream").value_or(false);
  bool with_text = get_bool(body, "return_text_in_logprobs").value_or(false);

  auto job = std::make_shared<GenerateJob>(state, channel);
  job->stream = stream;
  job->batch = batch;
  size_t count = prompts.size();
  job->items.resize(count);
  for (size_t i = 0; i < count; ++i) {
    GenerateItem& item = job->items[i];
    GenerationRequest& generation = item.request;
    generation.input_ids = std::move(prompts[i]);
    if (auto* params = item_field(body, "sampling_params", i, count, batch)) {
      generation.sampling = parse_sglang_sampling(*params, state.config().default_sampling);
      generation.sampling.grammar = sglang_grammar(state.engine(), *params);
    } else {
      generation.sampling = state.config().default_sampling;
    }
    if (auto* rid = item_field(body, "rid", i, count, batch)) {
      if (!rid->is_string()) throw_invalid("rid", "'rid' must be a string (or a list of strings)");
      generation.rid = rid->get<std::string>();
    } else {
      generation.rid = state.new_id("");
    }
    if (auto* value = item_field(body, "return_logprob", i, count, batch)) {
      if (!value->is_boolean())
        throw_invalid("return_logprob", "'return_logprob' must be a boolean");
      generation.return_logprob = value->get<bool>();
    }
    if (auto* value = item_field(body, "logprob_start_len", i, count, batch)) {
      if (!value->is_number_integer())
        throw_invalid("logprob_start_len", "'logprob_start_len' must be an integer");
      generation.logprob_start_len = value->get<int64_t>();
      if (generation.logprob_start_len < -1 ||
          generation.logprob_start_len > static_cast<int64_t>(generation.input_ids.size()))
        throw_invalid("logprob_start_len", "'logprob_start_len' must be in [-1, prompt length]");
    }
    if (auto* value = item_field(body, "top_logprobs_num", i, count, batch)) {
      if (!value->is_number_integer() || value->get<int64_t>() < 0 || value->get<int64_t>() > vocab)
        throw_invalid("top_logprobs_num", "'top_logprobs_num' must be an integer in [0, " +
                                              std::to_string(vocab) + "]");
      generation.top_logprobs_num = value->get<int64_t>();
    }
    // One list of ids for every prompt, or (a batch) a list per prompt.
    const auto ids_field = body.find("token_ids_logprob");
    const bool ids_per_prompt = batch && ids_field != body.end() && ids_field->is_array() &&
                                !ids_field->empty() && (*ids_field)[0].is_array();
    if (auto* value = item_field(body, "token_ids_logprob", i, count, batch, !ids_per_prompt)) {
      if (!value->is_null()) {
        generation.token_ids_logprob = get_token_list(*value, "token_ids_logprob");
        for (int32_t id : generation.token_ids_logprob)
          if (vocab > 0 && id >= vocab)
            throw_invalid("token_ids_logprob",
                          "token id " + std::to_string(id) + " is not in the vocabulary");
      }
    }
    if (auto* value = item_field(body, "temp_scaled_logprobs", i, count, batch)) {
      if (!value->is_boolean())
        throw_invalid("temp_scaled_logprobs", "'temp_scaled_logprobs' must be a boolean");
      generation.temp_scaled_logprobs = value->get<bool>();
    }
    // Extras that need a server switch: a boolean, and true only with the switch.
    const auto switched = [&](const char* name, bool& field, bool enabled, const char* flag) {
      const nlohmann::json* value = item_field(body, name, i, count, batch);
      if (value == nullptr) return;
      if (!value->is_boolean())
        throw_invalid(name, std::string("'") + name + "' must be a boolean");
      field = value->get<bool>();
      if (field && !enabled)
        throw_invalid(name, std::string("'") + name + "' needs the server started with " + flag);
    };
    switched("return_routed_experts", generation.return_routed_experts,
             state.engine().records_routed_experts(), "--enable-return-routed-experts");
    switched("return_hidden_states", generation.return_hidden_states,
             state.engine().records_hidden_states(), "--enable-return-hidden-states");
    // SGLang returns input logprobs only from logprob_start_len on; by default
    // it starts at the end of the prompt (no input logprobs) for generation.
    if (!generation.return_logprob) generation.logprob_start_len = -1;
    int64_t max_new = resolve_max_new_tokens(static_cast<int64_t>(generation.input_ids.size()),
                                             generation.sampling.max_new_tokens,
                                             state.engine().max_context_tokens(), /*clamp=*/true,
                                             {has_text ? "text" : "input_ids", "max_new_tokens"});
    generation.sampling.max_new_tokens = max_new;
    check_sampling_request(generation.sampling, vocab, /*openai_names=*/false);
    item.return_text_in_logprobs = with_text;
  }
  // sampling_params.n: n samples of every prompt, request rid-k with seed + k,
  // the first of each prompt prefilling it for the others.
  int64_t n = 1;
  if (auto* params = item_field(body, "sampling_params", 0, count, batch);
      params && params->is_object()) {
    n = get_integer(*params, "n").value_or(1);
    if (n < 1 || n > 128) throw_invalid("n", "sampling_params.n must be between 1 and 128");
    for (size_t i = 1; i < count; ++i) {
      const nlohmann::json* other = item_field(body, "sampling_params", i, count, batch);
      if (other == nullptr || !other->is_object() || get_integer(*other, "n").value_or(1) != n)
        throw_invalid("n", "every prompt of a batch must ask for the same sampling_params.n");
    }
  }
  if (n > 1) {
    std::vector<GenerateItem> samples;
    for (const GenerateItem& item : job->items) {
      for (int64_t k = 0; k < n; ++k) {
        GenerateItem sample = item;
        sample.request.rid = item.request.rid + "-" + std::to_string(k);
        if (sample.request.sampling.seed)
          sample.request.sampling.seed = *sample.request.sampling.seed + static_cast<uint64_t>(k);
        samples.push_back(std::move(sample));
      }
    }
    job->items = std::move(samples);
    job->batch = true;
    count = job->items.size();
  }
  for (size_t i = 0; i < count; ++i)
    for (size_t j = i + 1; j < count; ++j)
      if (job->items[i].request.rid == job->items[j].request.rid)
        throw_invalid("rid", "duplicate rid '" + job->items[i].request.rid + "' in one batch");
  state.check_capacity();

  job->remaining = count;
  std::vector<const GenerationRequest*> requests;
  for (const auto& item : job->items) requests.push_back(&item.request);
  submit_request_group(
      state, *channel, requests,
      [job](size_t index, const RequestUpdate& update) { job->on_update(index, update); },
      sample_group_leaders(count, static_cast<size_t>(n)));
}

}  // namespace megactx::server
