// Unicode canonical normalization (NFC, NFD) for the NFC/NFD normalizers.
// Tables come from unicode_tables.inc (generate_unicode_tables.py).
#pragma once

#include <string>
#include <string_view>

namespace megactx::unicode {

std::string nfc(std::string_view text);  // text must be valid UTF-8
std::string nfd(std::string_view text);

}  // namespace megactx::unicode
