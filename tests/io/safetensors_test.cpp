// The safetensors reader: every dtype read back bit-exactly, metadata, and each
// way a header can lie rejected with an Error (never a crash or a read past the end).
#include "io/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>

#include "core/error.h"
#include "test_files.h"

namespace megactx {
namespace {

using testing::pod_bytes;
using testing::RawTensor;
using testing::safetensors_bytes;

SafetensorsHeader parse(const std::string& bytes) {
  return parse_safetensors_header(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(),
                                  "test.safetensors");
}

void expect_error(const std::string& bytes, const std::string& needle) {
  try {
    parse(bytes);
    ADD_FAILURE() << "no error; expected one mentioning " << needle;
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find(needle), std::string::npos)
        << "message: " << error.what();
  }
}

TEST(Safetensors, ReadsEveryDtypeZeroCopy) {
  testing::TempDir dir;
  const std::vector<float> f32 = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, 7.0f};
  const std::vector<uint16_t> bf16 = {0x3fc0, 0xc000};         // 1.5, -2.0
  const std::vector<uint16_t> f16 = {0x3e00, 0xc000, 0x0001};  // 1.5, -2.0, 2^-24
  const std::vector<uint8_t> fp8 = {0x3c, 0xb8, 0x7e};         // 1.5, -1.0, 448
  const std::vector<int32_t> i32 = {-7, 8};
  const std::vector<int64_t> i64 = {1ll << 40};
  const std::vector<uint8_t> u8 = {255, 0, 3};
  const std::vector<double> f64 = {3.5};
  std::vector<RawTensor> tensors = {
      {"a.f32", "F32", {2, 3}, pod_bytes(f32)},
      {"b.bf16", "BF16", {2}, pod_bytes(bf16)},
      {"c.f16", "F16", {3}, pod_bytes(f16)},
      {"d.weight", "F8_E4M3", {1, 3}, pod_bytes(fp8)},
      {"d.weight_scale_inv", "F32", {1, 1}, pod_bytes(std::vector<float>{0.5f})},
      {"e.i32", "I32", {2}, pod_bytes(i32)},
      {"f.i64", "I64", {1}, pod_bytes(i64)},
      {"g.u8", "U8", {3}, pod_bytes(u8)},
      {"h.f64", "F64", {}, pod_bytes(f64)},
      {"i.empty", "BF16", {0, 4}, ""},
  };
  testing::write_bytes(dir.file("x.safetensors"),
                       safetensors_bytes(tensors, R"({"format":"pt","note":"hi"})"));
  SafetensorsFile file(dir.file("x.safetensors"));
  EXPECT_EQ(file.entries().size(), tensors.size());
  EXPECT_EQ(file.metadata().at("format"), "pt");
  EXPECT_EQ(file.metadata().at("note"), "hi");

  const Tensor a = file.view(*file.find("a.f32"));
  EXPECT_EQ(a.dtype(), DType::F32);
  EXPECT_EQ(a.shape(), (Shape{2, 3}));
  for (size_t i = 0; i < f32.size(); ++i) EXPECT_EQ(a.data<float>()[i], f32[i]);

  const Tensor b = file.view(*file.find("b.bf16")).to_float();
  EXPECT_EQ(b.data<float>()[0], 1.5f);
  EXPECT_EQ(b.data<float>()[1], -2.0f);
  const Tensor c = file.view(*file.find("c.f16")).to_float();
  EXPECT_EQ(c.data<float>()[0], 1.5f);
  EXPECT_EQ(c.data<float>()[1], -2.0f);
  EXPECT_EQ(c.data<float>()[2], std::ldexp(1.0f, -24));
  const Tensor d = file.view(*file.find("d.weight")).to_float();
  EXPECT_EQ(d.data<float>()[0], 1.5f);
  EXPECT_EQ(d.data<float>()[1], -1.0f);
  EXPECT_EQ(d.data<float>()[2], 448.0f);
  EXPECT_EQ(file.view(*file.find("d.weight_scale_inv")).data<float>()[0], 0.5f);
  EXPECT_EQ(file.view(*file.find("e.i32")).data<int32_t>()[0], -7);
  EXPECT_EQ(file.view(*file.find("f.i64")).data<int64_t>()[0], 1ll << 40);
  EXPECT_EQ(file.view(*file.find("g.u8")).data<uint8_t>()[0], 255);
  const Tensor h = file.view(*file.find("h.f64"));
  EXPECT_EQ(h.rank(), 0);
  EXPECT_EQ(h.data<double>()[0], 3.5);
  EXPECT_EQ(file.view(*file.find("i.empty")).numel(), 0);
  EXPECT_EQ(file.find("missing"), nullptr);
}

TEST(Safetensors, TruncatedAndLyingLengths) {
  expect_error("", "truncated");
  expect_error("abc", "truncated");
  // The length says 1000 bytes of header but the file ends sooner.
  expect_error(testing::u64_le(1000) + "{}", "exceeds");
  expect_error(testing::u64_le(~0ull) + "{}", "implausibly large");
  expect_error(testing::u64_le(0), "too short");
  // Data section shorter than a tensor's offsets claim (file truncated).
  std::string good = safetensors_bytes({{"w", "F32", {4}, std::string(16, '\1')}});
  EXPECT_NO_THROW(parse(good));
  expect_error(good.substr(0, good.size() - 1), "past the end");
}

TEST(Safetensors, InvalidJson) {
  expect_error(safetensors_bytes("{\"w\": {", ""), "not valid JSON");
  expect_error(safetensors_bytes("[1,2,3]", ""), "must be a JSON object");
  expect_error(safetensors_bytes("{\"w\": 5}", ""), "expected an object");
  expect_error(safetensors_bytes(R"({"__metadata__": {"a": 1}})", ""), "__metadata__");
  // Duplicate tensor names would silently replace each other.
  expect_error(safetensors_bytes(R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},)"
                                 R"("w":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}})",
                                 "ab"),
               "twice");
}

TEST(Safetensors, BadEntries) {
  const std::string data(64, '\0');
  auto entry = [&](const std::string& body) {
    return safetensors_bytes("{\"w\":{" + body + "}}", data);
  };
  expect_error(entry(R"("dtype":"F4","shape":[2],"data_offsets":[0,1])"), "unsupported dtype");
  expect_error(entry(R"("dtype":7,"shape":[2],"data_offsets":[0,8])"), "dtype");
  expect_error(entry(R"("shape":[2],"data_offsets":[0,8])"), "dtype");
  expect_error(entry(R"("dtype":"F32","shape":[-2],"data_offsets":[0,8])"), "shape[0]");
  expect_error(entry(R"("dtype":"F32","shape":[2.5],"data_offsets":[0,8])"), "shape[0]");
  expect_error(entry(R"("dtype":"F32","shape":"2","data_offsets":[0,8])"), "shape");
  expect_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0])"), "data_offsets");
  expect_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[8,0])"), "backwards");
  expect_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,12])"), "needs 8");
  expect_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[60,68])"), "past the end");
  expect_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,8],"extra":1)"), "extra");
  // shape x dtype overflowing 64 bits must not wrap around to a small size.
  expect_error(entry(R"("dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,0])"),
               "overflows");
  expect_error(entry(R"("dtype":"F32","shape":[2],"data_offsets":[0,18446744073709551615])"),
               "past the end");
}

TEST(Safetensors, OverlappingTensors) {
  const std::string data(16, '\0');
  expect_error(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                 R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                 data),
               "overlap");
  // Adjacent and empty tensors are fine.
  EXPECT_NO_THROW(
      parse(safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                              R"("e":{"dtype":"F32","shape":[0],"data_offsets":[4,4]},)"
                              R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                              data)));
}

TEST(Safetensors, FileErrors) {
  testing::TempDir dir;
  EXPECT_THROW(SafetensorsFile(dir.file("missing.safetensors")), Error);
  EXPECT_THROW(SafetensorsFile(dir.path()), Error);  // a directory
  testing::write_bytes(dir.file("empty.safetensors"), "");
  EXPECT_THROW(SafetensorsFile(dir.file("empty.safetensors")), Error);
}

}  // namespace
}  // namespace megactx
