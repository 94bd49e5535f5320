// Host side of the fp8-native CUDA load (model/cuda/checkpoint_matrix.h), no GPU:
// e4m3 weights come back as shipped with their 128x128 scales, stacked
// gate/up matrices keep each row's block scale, bad scales are Errors naming
// the tensor, random fp8 weights are quantised as checkpoints are; and how far the device's
// per-128-group activation rounding moves the glm_fp8 fixture from the float32 oracle (emulated on
// the CPU).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "../io/test_files.h"
#include "../model/hf_fixture.h"
#include "core/dtype.h"
#include "core/error.h"
#include "fp8_emulation.h"
#include "io/checkpoint.h"
#include "model/cuda/checkpoint_matrix.h"
#include "model/weight_source.h"

namespace megactx::testing {
namespace {

// Random e4m3 bytes, never NaN (0x7f / 0xff).
std::string fp8_bytes(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string bytes(static_cast<size_t>(count), '\0');
  for (char& b : bytes) {
    uint8_t v = static_cast<uint8_t>(rng() & 0xff);
    if ((v & 0x7f) == 0x7f) v ^= 1;
    b = static_cast<char>(v);
  }
  return bytes;
}

std::string f32_bytes(const std::vector<float>& values) {
  std::string bytes(values.size() * 4, '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

std::vector<float> scales(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> uniform(1e-3f, 2e-2f);
  std::vector<float> values(static_cast<size_t>(count));
  for (float& v : values) v = uniform(rng);
  return values;
}

// A model directory with glm_fp8's config.json (block size replaced when
// `block` > 0) and one safetensors file of `tensors`.
struct SyntheticCheckpoint {
  TempDir dir;
  std::unique_ptr<Checkpoint> checkpoint;
  SyntheticCheckpoint(const std::vector<RawTensor>& tensors, int64_t block = 0) {
    nlohmann::json config =
        nlohmann::json::parse(std::ifstream(fixture_dir("glm_fp8") + "/config.json"));
    if (block > 0) config["quantization_config"]["weight_block_size"] = {block, block};
    std::ofstream(dir.file("config.json")) << config.dump();
    write_bytes(dir.file("model.safetensors"), safetensors_bytes(tensors));
    checkpoint = Checkpoint::open(dir.path());
  }
};

const std::string kW = fp8_bytes(130 * 200, 1);
const std::string kUp = fp8_bytes(70 * 200, 2);
const std::vector<float> kWScales = scales(4, 3);   // [2, 2]
const std::vector<float> kUpScales = scales(2, 4);  // [1, 2]

std::vector<RawTensor> good_tensors() {
  return {{"w.weight", "F8_E4M3", {130, 200}, kW},
          {"w.weight_scale_inv", "F32", {2, 2}, f32_bytes(kWScales)},
          {"up.weight", "F8_E4M3", {70, 200}, kUp},
          {"up.weight_scale_inv", "F32", {1, 2}, f32_bytes(kUpScales)},
          {"plain.weight",
           "BF16",
           {2, 3},
           std::string("\x80\x3f\x00\x40\x40\x40\x80\xbf\x00\x00\x00\x3f", 12)}};
}

std::string error_of(const std::function<void()>& action) {
  try {
    action();
  } catch (const Error& error) {
    return error.what();
  }
  return "(no error)";
}

TEST(CheckpointMatrix, Fp8WeightsComeBackAsShippedWithTheirScales) {
  SyntheticCheckpoint s(good_tensors());
  const CheckpointMatrix w = read_checkpoint_matrix(*s.checkpoint, "w.weight", {130, 200});
  ASSERT_TRUE(w.fp8());
  EXPECT_EQ(w.values.dtype(), DType::F8_E4M3);
  EXPECT_EQ(std::memcmp(w.values.raw(), kW.data(), kW.size()), 0);
  ASSERT_EQ(w.scales.shape(), (Shape{2, 2}));
  EXPECT_EQ(std::vector<float>(w.scales.data<float>(), w.scales.data<float>() + 4), kWScales);
  // Dequantised by definition: e4m3 value times the scale of its 128x128 block.
  const Tensor values = dequantize(w);
  for (int64_t r = 0; r < 130; ++r)
    for (int64_t c = 0; c < 200; ++c)
      ASSERT_EQ(values.data<float>()[r * 200 + c],
                fp8_e4m3_to_float(static_cast<uint8_t>(kW[r * 200 + c])) *
                    kWScales[(r / 128) * 2 + c / 128])
          << r << ", " << c;
}

TEST(CheckpointMatrix, StackedGateUpKeepsEveryRowsBlockScale) {
  EXPECT_EQ(fp8_block_scale_row(127, 0), 0);
  EXPECT_EQ(fp8_block_scale_row(128, 0), 1);
  EXPECT_EQ(fp8_block_scale_row(129, 130), 1);  // gate's ragged second block
  EXPECT_EQ(fp8_block_scale_row(130, 130), 2);  // up's first block starts fresh
  EXPECT_EQ(fp8_block_scale_row(257, 130), 2);
  EXPECT_EQ(fp8_block_scale_row(258, 130), 3);
  EXPECT_EQ(fp8_block_scale_row(200, 128), 200 / 128);  // a whole-block split changes nothing

  SyntheticCheckpoint s(good_tensors());
  const CheckpointMatrix gate = read_checkpoint_matrix(*s.checkpoint, "w.weight", {130, 200});
  const CheckpointMatrix up = read_checkpoint_matrix(*s.checkpoint, "up.weight", {70, 200});
  const CheckpointMatrix stacked = stack_rows(gate, up);
  ASSERT_TRUE(stacked.fp8());
  EXPECT_EQ(stacked.values.shape(), (Shape{200, 200}));
  EXPECT_EQ(stacked.scales.shape(), (Shape{3, 2}));
  EXPECT_EQ(stacked.scale_split, 130);
  const Tensor a = dequantize(gate), b = dequantize(up), ab = dequantize(stacked);
  EXPECT_EQ(std::memcmp(ab.raw(), a.raw(), a.nbytes()), 0);
  EXPECT_EQ(std::memcmp(static_cast<const char*>(ab.raw()) + a.nbytes(), b.raw(), b.nbytes()), 0);
  // Mixed kinds stack as float32.
  const CheckpointMatrix plain = read_checkpoint_matrix(*s.checkpoint, "plain.weight", {2, 3});
  EXPECT_FALSE(plain.fp8());
  EXPECT_EQ(plain.values.dtype(), DType::F32);
  EXPECT_EQ(plain.values.data<float>()[0], 1.0f);
  EXPECT_EQ(plain.values.data<float>()[3], -1.0f);
}

TEST(CheckpointMatrix, PaddedRowsAreZerosWithinTheLastScaleBlock) {
  SyntheticCheckpoint s(good_tensors());
  const CheckpointMatrix gate = read_checkpoint_matrix(*s.checkpoint, "w.weight", {130, 200});
  const CheckpointMatrix up = read_checkpoint_matrix(*s.checkpoint, "up.weight", {70, 200});
  // Alone (70 rows: one partial block) and stacked after a split at 130 (up's
  // rows 130..199 in a block that runs to 257).
  for (const auto& [matrix, most] :
       std::vector<std::pair<CheckpointMatrix, int64_t>>{{up, 128}, {stack_rows(gate, up), 258}}) {
    const CheckpointMatrix padded = pad_rows(matrix, most);
    EXPECT_EQ(padded.values.shape(), (Shape{most, 200}));
    EXPECT_EQ(padded.scales.shape(), matrix.scales.shape());
    EXPECT_EQ(padded.scale_split, matrix.scale_split);
    const Tensor before = dequantize(matrix), after = dequantize(padded);
    EXPECT_EQ(std::memcmp(after.raw(), before.raw(), before.nbytes()), 0);
    for (int64_t i = before.numel(); i < after.numel(); ++i)
      ASSERT_EQ(after.data<float>()[i], 0.0f) << i;
    EXPECT_THROW(pad_rows(matrix, most + 1), Error);  // a new scale row
  }
}

TEST(CheckpointMatrix, BadScalesAreErrorsNamingTheTensor) {
  std::vector<RawTensor> tensors = good_tensors();
  tensors.push_back({"missing.weight", "F8_E4M3", {4, 8}, fp8_bytes(32, 5)});
  tensors.push_back({"wrong.weight", "F8_E4M3", {130, 200}, kW});
  tensors.push_back({"wrong.weight_scale_inv", "F32", {1, 2}, f32_bytes({1.0f, 1.0f})});
  tensors.push_back({"nan.weight", "F8_E4M3", {4, 8}, fp8_bytes(32, 6)});
  tensors.push_back({"nan.weight_scale_inv",
                     "F32",
                     {1, 1},
                     f32_bytes({std::numeric_limits<float>::quiet_NaN()})});
  tensors.push_back({"dense.weight", "F32", {1, 1}, f32_bytes({1.0f})});
  tensors.push_back({"dense.weight_scale_inv", "F32", {1, 1}, f32_bytes({1.0f})});
  SyntheticCheckpoint s(tensors);
  const Checkpoint& c = *s.checkpoint;
  std::string e = error_of([&] { read_checkpoint_matrix(c, "missing.weight", {4, 8}); });
  EXPECT_NE(e.find("'missing.weight_scale_inv' is missing"), std::string::npos) << e;
  e = error_of([&] { read_checkpoint_matrix(c, "wrong.weight", {130, 200}); });
  EXPECT_NE(e.find("wrong.weight_scale_inv"), std::string::npos) << e;
  EXPECT_NE(e.find("expected [2, 2]"), std::string::npos) << e;
  e = error_of([&] { read_checkpoint_matrix(c, "nan.weight", {4, 8}); });
  EXPECT_NE(e.find("non-finite"), std::string::npos) << e;
  e = error_of([&] { read_checkpoint_matrix(c, "dense.weight", {1, 1}); });
  EXPECT_NE(e.find("dense.weight_scale_inv"), std::string::npos) << e;
  e = error_of([&] { read_checkpoint_matrix(c, "w.weight", {200, 130}); });
  EXPECT_NE(e.find("w.weight"), std::string::npos) << e;
  e = error_of([&] { read_checkpoint_matrix(c, "absent.weight", {4, 8}); });
  EXPECT_NE(e.find("absent.weight"), std::string::npos) << e;
  e = error_of([&] { read_checkpoint_float(c, "missing.weight", {4, 8}); });
  EXPECT_NE(e.find("missing.weight_scale_inv"), std::string::npos) << e;
}

TEST(CheckpointMatrix, BlockSizeOtherThan128IsAnError) {
  SyntheticCheckpoint s(good_tensors(), /*block=*/64);
  const std::string e = error_of([&] {
    read_checkpoint_matrix(*s.checkpoint, "w.weight", {130, 200});
  });
  EXPECT_NE(e.find("128x128"), std::string::npos) << e;
  EXPECT_NE(e.find("64x64"), std::string::npos) << e;
}

// Every fp8 matrix of the fixture, read natively and dequantised, equals what
// the float32 loader (weight_source.cpp, the CPU oracle's path) builds.
TEST(CheckpointMatrix, FixtureMatricesDequantiseLikeTheFloatLoader) {
  const std::unique_ptr<Checkpoint> checkpoint = Checkpoint::open(fixture_dir("glm_fp8"));
  auto source = make_checkpoint_weights(*checkpoint);
  int64_t checked = 0;
  for (const std::string& name : checkpoint->names()) {
    if (checkpoint->dtype_of(name) != DType::F8_E4M3) continue;
    const Shape shape = checkpoint->shape_of(name);
    const CheckpointMatrix native = read_checkpoint_matrix(*checkpoint, name, shape);
    ASSERT_TRUE(native.fp8()) << name;
    const Tensor ours = dequantize(native);
    const Tensor theirs = source->get(name, shape);
    ASSERT_EQ(std::memcmp(ours.raw(), theirs.raw(), ours.nbytes()), 0) << name;
    ++checked;
  }
  EXPECT_EQ(checked, 30);  // glm_fp8: 10 in the dense layer, 20 in the MoE layer
}

TEST(CheckpointMatrix, QuantizeBlocksAsFp8CheckpointsAreMade) {
  // [200, 300]: ragged blocks in both directions, one all-zero block.
  Tensor values = Tensor::empty({200, 300});
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  for (int64_t i = 0; i < values.numel(); ++i) values.data<float>()[i] = normal(rng);
  for (int64_t r = 128; r < 200; ++r)
    for (int64_t c = 256; c < 300; ++c) values.data<float>()[r * 300 + c] = 0.0f;
  const CheckpointMatrix q = quantize_blocks(values);
  ASSERT_TRUE(q.fp8());
  ASSERT_EQ(q.scales.shape(), (Shape{2, 3}));
  EXPECT_EQ(q.scales.data<float>()[1 * 3 + 2], 1.0f);  // the all-zero block
  const Tensor back = dequantize(q);
  for (int64_t r = 0; r < 200; ++r) {
    for (int64_t c = 0; c < 300; ++c) {
      const float v = values.data<float>()[r * 300 + c];
      const float scale = q.scales.data<float>()[(r / 128) * 3 + c / 128];
      // The code is the definition's, and it rounds within half an e4m3 step.
      ASSERT_EQ(static_cast<const uint8_t*>(q.values.raw())[r * 300 + c],
                float_to_fp8_e4m3(v / scale))
          << r << ", " << c;
      ASSERT_LE(std::fabs(back.data<float>()[r * 300 + c] - v),
                std::max(std::fabs(v) / 16.0f, scale * std::ldexp(1.0f, -10)) * 1.0001f)
          << r << ", " << c;
    }
  }
}

TEST(CheckpointMatrix, RandomFp8SourceShapesTensorsAsFp8Checkpoints) {
  auto source = make_random_fp8_matrices(5);
  const CheckpointMatrix q = source->matrix("model.layers.0.self_attn.q_a_proj.weight", {144, 160});
  EXPECT_TRUE(q.fp8());
  EXPECT_EQ(q.scales.shape(), (Shape{2, 2}));
  EXPECT_FALSE(source->matrix("lm_head.weight", {256, 160}).fp8());
  EXPECT_FALSE(
      source->matrix("model.layers.0.self_attn.indexer.weights_proj.weight", {8, 160}).fp8());
  const Tensor norm = source->float_tensor("model.layers.0.input_layernorm.weight", {160});
  EXPECT_EQ(norm.data<float>()[0], 1.0f);
  // Reproducible for a seed.
  const CheckpointMatrix again =
      make_random_fp8_matrices(5)->matrix("model.layers.0.self_attn.q_a_proj.weight", {144, 160});
  EXPECT_EQ(std::memcmp(q.values.raw(), again.values.raw(), q.values.nbytes()), 0);
}

TEST(Fp8Emulation, GroupRoundingIsWithinHalfAnE4m3Step) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const int64_t rows = 3, in = 300, stride = 310;
  std::vector<float> x(static_cast<size_t>(rows * stride));
  for (float& v : x) v = normal(rng);
  for (int64_t c = 128; c < 256; ++c) x[1 * stride + c] = 0.0f;  // an all-zero group
  const std::vector<float> rounded = fp8_rounded_inputs(x.data(), rows, in, stride);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < in; ++c) {
      const float v = x[r * stride + c], got = rounded[r * in + c];
      // Normal e4m3 range: |error| <= 2^-4 |v|; below it, half a subnormal step.
      float amax = 0.0f;
      const int64_t g0 = c / 128 * 128;
      for (int64_t k = g0; k < std::min(in, g0 + 128); ++k)
        amax = std::max(amax, std::fabs(x[r * stride + k]));
      const float s = amax > 0 ? amax / 448.0f : 1.0f;
      const float bound = std::max(std::fabs(v) / 16.0f, s * std::ldexp(1.0f, -10));
      ASSERT_LE(std::fabs(got - v), bound * 1.0001f) << r << ", " << c;
    }
  }
}

// Measured here on the CPU (the same bounds the GPU test holds the device
// to): the fixture's logits with fp8-rounded GEMM inputs vs the float32
// oracle, with dense selection (index_topk 4096 >= the context: the rounding
// alone) and with the fixture's sparse top-k (index margins of 1e-4 relative,
// so the rounding also changes which keys a query attends to).
TEST(Fp8Emulation, GlmFp8StaysCloseToTheOracle) {
  const HfFixture f = load_fixture("glm_fp8");
  for (const bool dense : {true, false}) {
    ModelLoadOptions options;
    if (dense) options.index_topk_override = 4096;
    auto oracle = load_language_model(f.dir, options);
    auto emulated = load_fp8_emulated_model(f.dir, options.index_topk_override);
    // The prompt and HF's greedy continuation, as the GPU test feeds them.
    std::vector<int32_t> ids = f.input_ids;
    ids.insert(ids.end(), f.greedy_ids.begin(), f.greedy_ids.end());
    SequenceRunner a(*oracle, KvDType::F32, 128), b(*emulated, KvDType::F32, 128);
    const Tensor want = a.feed(ids, true);
    const Tensor got = b.feed(ids, true);
    const double rel = relative_error(got.data<float>(), want.data<float>(), want.numel());
    const double agree = argmax_agreement(got.data<float>(), want.data<float>(),
                                          static_cast<int64_t>(ids.size()), f.vocab);
    const std::vector<double> rows = sorted_row_errors(got.data<float>(), want.data<float>(),
                                                       static_cast<int64_t>(ids.size()), f.vocab);
    std::printf(
        "glm_fp8 prompt + greedy (%s selection), fp8-rounded GEMM inputs vs float32 "
        "oracle: per-position max rel median %.4f, 90%% %.4f, max %.4f; argmax agreement "
        "%.3f\n",
        dense ? "dense" : "sparse", quantile(rows, 0.5), quantile(rows, 0.9), rows.back(), agree);
    EXPECT_GT(rel, 1e-4) << "the emulation really rounds";
    if (dense) {
      EXPECT_LE(quantile(rows, 0.5), kFp8DenseRowMedian);
      EXPECT_LE(quantile(rows, 0.9), kFp8DenseRow90);
      EXPECT_GE(agree, kFp8DenseArgmaxAgreement);
    } else {
      EXPECT_LE(quantile(rows, 0.5), kFp8SparseRowMedian);
      EXPECT_GE(agree, kFp8SparseArgmaxAgreement);
    }
  }
}

}  // namespace
}  // namespace megactx::testing
