// What an RL trainer asks of the engine between rollouts, on the default
// model (models/default, CPU): pausing in place, by retraction and by abort;
// weight updates from a directory and from safetensors buckets (partial,
// staged and committed; fp8 re-quantisation is in
// tests/e2e/fp8_weight_update_test.py);
// every bad update leaves the old weights serving; releasing and resuming
// the memory of the weights and the KV cache.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstring>
#include <map>

#include "core/dtype.h"

#include "engine/engine.h"
#include "io/checkpoint.h"
#include "io/weight_update.h"
#include "model/model_loader.h"
#include "tokenizer/tokenizer.h"

namespace megactx {
namespace {

const std::string kModel = std::string(MEGACTX_SOURCE_DIR) + "/models/default";

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  FinishReason finish = FinishReason::None;
  std::string weight_version;
};

class Control {
 public:
  Control() {
    EngineConfig config;
    config.run_thread = false;
    config.check_integrity_every_step = true;
    config.kv_memory_bytes = int64_t{64} << 20;
    config.kv_dtype = KvDType::F32;
    config.model_dir = kModel;
    auto model = load_language_model(kModel, ModelLoadOptions{});
    engine = Engine::create(config, std::move(model), Tokenizer::load(kModel),
                            load_generation_defaults(kModel, {}));
  }

  void submit(const std::string& rid, int64_t tokens = 12) {
    GenerationRequest request;
    request.rid = rid;
    request.input_ids = {3, 17, 99, 42, 7, 1, 250, 31};
    request.sampling.temperature = 0.0;
    request.sampling.max_new_tokens = tokens;
    request.sampling.ignore_eos = true;
    request.return_logprob = true;
    engine->submit(request, [this](const RequestUpdate& update) {
      Output& run = runs[update.rid];
      run.tokens.insert(run.tokens.end(), update.new_token_ids.begin(), update.new_token_ids.end());
      for (const TokenLogprob& lp : update.new_logprobs) run.logprobs.push_back(lp.logprob);
      run.finish = update.finish;
      run.weight_version = update.weight_version;
    });
  }

  Output greedy(const std::string& rid) {
    submit(rid);
    engine->run_until_idle();
    return runs.at(rid);
  }

  std::unique_ptr<Engine> engine;
  std::map<std::string, Output> runs;
};

// A safetensors file of the tensors in their dtypes, written from the format's spec.
std::string safetensors_bytes(const std::map<std::string, Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, tensor] : tensors) {
    header[name] = {{"dtype", std::string(dtype_name(tensor.dtype()))},
                    {"shape", tensor.shape()},
                    {"data_offsets", {data.size(), data.size() + tensor.nbytes()}}};
    data.append(static_cast<const char*>(tensor.raw()), tensor.nbytes());
  }
  std::string text = header.dump();
  while (text.size() % 8) text += ' ';
  std::string out(8, '\0');
  const uint64_t length = text.size();
  std::memcpy(out.data(), &length, 8);
  return out + text + data;
}

std::shared_ptr<TensorBucket> bucket_of(const std::map<std::string, Tensor>& tensors) {
  return std::make_shared<TensorBucket>(
      TensorBucket::from_safetensors(safetensors_bytes(tensors), "test bucket"));
}

// A tensor of the served checkpoint as float32 (bf16 on disk).
Tensor checkpoint_tensor(const std::string& name) {
  const auto checkpoint = Checkpoint::open(kModel);
  const Tensor view = checkpoint->get_float(name, checkpoint->shape_of(name));
  Tensor out = Tensor::empty(view.shape());
  for (int64_t i = 0; i < view.numel(); ++i) {
    out.data<float>()[i] = view.dtype() == DType::BF16 ? bf16_to_float(view.data<uint16_t>()[i])
                                                       : view.data<float>()[i];
  }
  return out;
}

TEST(EngineControl, PausedInPlaceStopsAndResumesWhereItWas) {
  Control plain;
  const Output reference = plain.greedy("r");
  Control c;
  c.submit("r");
  for (int i = 0; i < 4; ++i) c.engine->step();
  const size_t before = c.runs["r"].tokens.size();
  ASSERT_GT(before, 0u);
  c.engine->pause(PauseMode::InPlace);
  EXPECT_TRUE(c.engine->paused());
  EXPECT_FALSE(c.engine->step());  // nothing runs while paused
  c.submit("late");                // waits in the queue
  EXPECT_FALSE(c.engine->step());
  EXPECT_EQ(c.runs["r"].tokens.size(), before);
  EXPECT_EQ(c.runs.count("late") ? c.runs["late"].tokens.size() : 0u, 0u);
  c.engine->resume();
  c.engine->run_until_idle();
  EXPECT_EQ(c.runs["r"].tokens, reference.tokens);
  EXPECT_EQ(c.runs["late"].tokens, reference.tokens);
}

TEST(EngineControl, RetractAndAbortModes) {
  Control plain;
  const Output reference = plain.greedy("r");
  Control c;
  c.submit("r");
  for (int i = 0; i < 3; ++i) c.engine->step();
  c.engine->pause(PauseMode::Retract);
  EXPECT_EQ(c.engine->stats().running_requests, 0);
  EXPECT_EQ(c.engine->stats().waiting_requests, 1);
  c.engine->resume();
  c.engine->run_until_idle();
  EXPECT_EQ(c.runs["r"].tokens, reference.tokens);  // recomputed, same greedy tokens

  c.submit("a");
  for (int i = 0; i < 3; ++i) c.engine->step();
  const size_t partial = c.runs["a"].tokens.size();
  c.engine->pause(PauseMode::Abort);
  EXPECT_EQ(c.runs["a"].finish, FinishReason::Abort);
  EXPECT_EQ(c.runs["a"].tokens.size(), partial);  // what it had, returned
  EXPECT_EQ(c.engine->stats().kv_pages_used, c.engine->stats().prefix_cache_pages);
  c.engine->resume();
  c.engine->check_integrity();
}

TEST(EngineControl, UpdateFromDiskKeepsServingAndBumpsTheVersion) {
  Control c;
  const Output before = c.greedy("before");
  EXPECT_EQ(before.weight_version, "default");
  WeightUpdateRequest update;
  update.model_path = kModel;
  update.weight_version = "step-1";
  const WeightUpdateResult result = c.engine->update_weights(update);
  EXPECT_TRUE(result.committed);
  EXPECT_EQ(c.engine->weight_version(), "step-1");
  const Output after = c.greedy("after");
  EXPECT_EQ(after.tokens, before.tokens);
  EXPECT_EQ(after.logprobs, before.logprobs);  // the same weights, bit for bit
  EXPECT_EQ(after.weight_version, "step-1");

  // Another architecture: refused, the old weights keep serving.
  update.model_path = std::string(MEGACTX_SOURCE_DIR) + "/tests/fixtures/hf/glm_bf16";
  update.weight_version = "wrong";
  try {
    c.engine->update_weights(update);
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("another architecture"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(c.engine->weight_version(), "step-1");
  EXPECT_EQ(c.greedy("still").tokens, before.tokens);
}

TEST(EngineControl, BucketsChangeExactlyTheirTensors) {
  Control c;
  const Output before = c.greedy("before");

  // The same values back: nothing changes, bit for bit.
  WeightUpdateRequest same;
  same.bucket = bucket_of({{"model.norm.weight", checkpoint_tensor("model.norm.weight")}});
  same.weight_version = "same";
  c.engine->update_weights(same);
  const Output unchanged = c.greedy("unchanged");
  EXPECT_EQ(unchanged.logprobs, before.logprobs);

  // The final norm zeroed: every logit is lm_head . 0 = 0, so every token
  // has probability 1 / vocab and greedy takes token 0.
  const Tensor norm = checkpoint_tensor("model.norm.weight");
  Tensor zero = Tensor::zeros(norm.shape());
  WeightUpdateRequest staged;
  staged.bucket = bucket_of({{"model.norm.weight", zero}});
  staged.commit = false;
  const WeightUpdateResult pending = c.engine->update_weights(staged);
  EXPECT_FALSE(pending.committed);
  EXPECT_EQ(c.greedy("staged only").logprobs, before.logprobs);  // not applied yet
  WeightUpdateRequest commit;
  commit.bucket = bucket_of({});
  commit.weight_version = "zero-norm";
  c.engine->update_weights(commit);
  const Output zeroed = c.greedy("zeroed");
  const double uniform = -std::log(static_cast<double>(c.engine->model_config().vocab_size));
  for (float lp : zeroed.logprobs) EXPECT_NEAR(lp, uniform, 1e-4);
  EXPECT_EQ(zeroed.tokens, std::vector<int32_t>(zeroed.tokens.size(), 0));

  // A later partial update keeps the earlier one (the overlay accumulates):
  // sending the original embedding does not bring the norm back.
  WeightUpdateRequest other;
  other.bucket =
      bucket_of({{"model.embed_tokens.weight", checkpoint_tensor("model.embed_tokens.weight")}});
  c.engine->update_weights(other);
  EXPECT_EQ(c.greedy("still zeroed").logprobs, zeroed.logprobs);

  // And the original norm restores the model exactly.
  WeightUpdateRequest restore;
  restore.bucket = bucket_of({{"model.norm.weight", norm}});
  c.engine->update_weights(restore);
  EXPECT_EQ(c.greedy("restored").logprobs, before.logprobs);
}

TEST(EngineControl, BadBucketsAreErrorsAndChangeNothing) {
  Control c;
  const Output before = c.greedy("before");
  const Tensor norm = checkpoint_tensor("model.norm.weight");
  auto expect_error = [&](std::map<std::string, Tensor> tensors, const std::string& fragment) {
    WeightUpdateRequest update;
    update.bucket = bucket_of(tensors);
    update.weight_version = "bad";
    try {
      c.engine->update_weights(update);
      ADD_FAILURE() << "no error for " << fragment;
    } catch (const Error& error) {
      EXPECT_NE(std::string(error.what()).find(fragment), std::string::npos) << error.what();
    }
  };
  expect_error({{"model.no_such.weight", norm}}, "'model.no_such.weight'");
  expect_error({{"model.norm.weight", Tensor::zeros({3})}}, "has shape");
  expect_error({{"model.norm.weight", Tensor::zeros(norm.shape(), DType::I32)}},
               "'model.norm.weight' has dtype I32, not a floating dtype");
  // A bad bucket drops what was staged before it: the commit applies nothing.
  // An integer dtype is a bad bucket like a wrong shape (the bucket carries it
  // to the engine's checks instead of failing while it is parsed).
  WeightUpdateRequest good;
  good.bucket = bucket_of({{"model.norm.weight", Tensor::zeros(norm.shape())}});
  good.commit = false;
  for (const Tensor& bad : {Tensor::zeros({2, 2}), Tensor::zeros(norm.shape(), DType::I64)}) {
    c.engine->update_weights(good);
    expect_error({{"model.norm.weight", bad}}, "'model.norm.weight'");
  }
  WeightUpdateRequest commit;
  commit.bucket = bucket_of({});
  c.engine->update_weights(commit);
  EXPECT_EQ(c.engine->weight_version(), "default");
  const Output after = c.greedy("after");
  EXPECT_EQ(after.logprobs, before.logprobs);
}

TEST(EngineControl, ReleasedMemoryComesBackTheSame) {
  Control c;
  const Output before = c.greedy("before");
  c.submit("live");
  c.engine->step();
  EXPECT_THROW(c.engine->release_memory(MemoryTags{false, true}), Error);  // a live request
  c.engine->run_until_idle();
  c.engine->release_memory(MemoryTags{true, true});
  c.submit("waits");
  EXPECT_FALSE(c.engine->step());  // nothing runs without weights and pools
  EXPECT_EQ(c.runs.count("waits") ? c.runs["waits"].tokens.size() : 0u, 0u);
  c.engine->resume_memory(MemoryTags{true, true});
  c.engine->run_until_idle();
  EXPECT_EQ(c.runs["waits"].tokens, before.tokens);
  EXPECT_EQ(c.runs["waits"].logprobs, before.logprobs);
}

}  // namespace
}  // namespace megactx
