// base64 against RFC 4648's test vectors (section 10) and round trips of
// every length mod 3; malformed text is refused.
#include <gtest/gtest.h>

#include <string>

#include "core/base64.h"

namespace megactx {
namespace {

std::span<const std::byte> bytes_of(const std::string& text) {
  return std::as_bytes(std::span(text.data(), text.size()));
}

TEST(Base64, Rfc4648Vectors) {
  const std::pair<const char*, const char*> vectors[] = {
      {"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},        {"foo", "Zm9v"},
      {"foob", "Zm9vYg=="}, {"fooba", "Zm9vYmE="}, {"foobar", "Zm9vYmFy"}};
  for (const auto& [plain, encoded] : vectors) {
    EXPECT_EQ(base64_encode(bytes_of(plain)), encoded);
    const auto decoded = base64_decode(encoded);
    ASSERT_TRUE(decoded.has_value()) << encoded;
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(decoded->data()), decoded->size()), plain);
  }
}

TEST(Base64, RoundTripsBinaryAndRefusesMalformedText) {
  std::string all;
  for (int i = 0; i < 256; ++i) all += static_cast<char>(i);
  for (size_t n : {0u, 1u, 2u, 3u, 254u, 255u, 256u}) {
    const std::string part = all.substr(0, n);
    const auto decoded = base64_decode(base64_encode(bytes_of(part)));
    ASSERT_TRUE(decoded.has_value());
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(decoded->data()), decoded->size()), part);
  }
  for (const char* bad : {"Zg=", "Z===", "Zm9v!A==", "Zg==Zm8=", "Z=g="})
    EXPECT_FALSE(base64_decode(bad).has_value()) << bad;
}

}  // namespace
}  // namespace megactx
