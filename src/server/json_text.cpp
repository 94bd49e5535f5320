#include "server/json_text.h"

#include "core/error.h"
#include "io/bounded_json.h"
#include "server/api_error.h"

namespace megactx::server {

std::string dump_json(const nlohmann::json& value) {
  return value.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

nlohmann::json parse_request_json(std::string_view body) {
  if (body.empty()) throw ApiError(400, "request body is empty; expected a JSON object");
  nlohmann::json value;
  try {
    value = parse_json(body);
  } catch (const nlohmann::json::exception& error) {
    throw ApiError(400, std::string("request body is not valid JSON: ") + error.what());
  } catch (const Error& error) {
    throw ApiError(400, std::string("request body is not accepted: ") + error.what());
  }
  if (!value.is_object()) throw ApiError(400, "request body must be a JSON object");
  return value;
}

std::string sanitize_utf8(std::string_view text) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    unsigned char lead = static_cast<unsigned char>(text[i]);
    size_t length = lead < 0x80           ? 1
                    : (lead >> 5) == 0x6  ? 2
                    : (lead >> 4) == 0xE  ? 3
                    : (lead >> 3) == 0x1E ? 4
                                          : 0;
    bool valid = length > 0 && i + length <= text.size();
    uint32_t code = length == 1   ? lead
                    : length == 2 ? lead & 0x1F
                    : length == 3 ? lead & 0x0F
                                  : lead & 0x07;
    for (size_t k = 1; valid && k < length; ++k) {
      unsigned char next = static_cast<unsigned char>(text[i + k]);
      valid = (next & 0xC0) == 0x80;
      code = (code << 6) | (next & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid too.
    if (valid && length == 2 && code < 0x80) valid = false;
    if (valid && length == 3 && (code < 0x800 || (code >= 0xD800 && code <= 0xDFFF))) valid = false;
    if (valid && length == 4 && (code < 0x10000 || code > 0x10FFFF)) valid = false;
    if (valid) {
      out.append(text.substr(i, length));
      i += length;
    } else {
      out += kReplacement;
      ++i;
    }
  }
  return out;
}

}  // namespace megactx::server
