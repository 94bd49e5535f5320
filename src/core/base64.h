// Standard base64 (RFC 4648, with '=' padding): how SGLang returns packed
// arrays in JSON (meta_info.routed_experts is the int32 bytes, little-endian).
#pragma once

#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace megactx {

std::string base64_encode(std::span<const std::byte> bytes);
// nullopt for anything that is not padded standard base64.
std::optional<std::vector<std::byte>> base64_decode(std::string_view text);

}  // namespace megactx
