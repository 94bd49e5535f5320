#include "io/safetensors.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <set>

#include "core/error.h"
#include "io/json_fields.h"

namespace megactx {

namespace {

// The reference implementation refuses headers past 100 MB; real ones are < 1 MB.
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;
constexpr size_t kMaxRank = 16;

uint64_t read_u64_le(const uint8_t* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | bytes[i];
  return value;
}

uint64_t read_offset(const nlohmann::json& value, const std::string& what) {
  MEGACTX_CHECK(
      value.is_number_unsigned() || (value.is_number_integer() && value.get<int64_t>() >= 0),
      "{} must be a non-negative integer, got {}", what, value.dump());
  return value.get<uint64_t>();
}

SafetensorsEntry parse_entry(const std::string& name, const nlohmann::json& info,
                             uint64_t data_size, const std::string& label) {
  const std::string where = fmt::format("{}: tensor '{}'", label, name);
  MEGACTX_CHECK(info.is_object(), "{}: expected an object, got {}", where, json_type_name(info));
  for (const auto& [key, unused] : info.items())
    MEGACTX_CHECK(key == "dtype" || key == "shape" || key == "data_offsets",
                  "{}: unexpected field '{}'", where, key);
  MEGACTX_CHECK(info.contains("dtype") && info["dtype"].is_string(),
                "{}: field 'dtype' missing or not a string", where);
  MEGACTX_CHECK(info.contains("shape") && info["shape"].is_array(),
                "{}: field 'shape' missing or not a list", where);
  MEGACTX_CHECK(info.contains("data_offsets") && info["data_offsets"].is_array() &&
                    info["data_offsets"].size() == 2,
                "{}: field 'data_offsets' must be a list of two integers", where);

  SafetensorsEntry entry;
  entry.name = name;
  const std::string dtype_text = info["dtype"].get<std::string>();
  const auto dtype = dtype_from_name(dtype_text);
  MEGACTX_CHECK(dtype.has_value(), "{}: unsupported dtype '{}'", where, dtype_text);
  entry.dtype = *dtype;

  const auto& shape = info["shape"];
  MEGACTX_CHECK(shape.size() <= kMaxRank, "{}: shape has rank {} (more than {})", where,
                shape.size(), kMaxRank);
  uint64_t bytes = dtype_size(entry.dtype);
  for (size_t axis = 0; axis < shape.size(); ++axis) {
    const uint64_t extent = read_offset(shape[axis], fmt::format("{}: shape[{}]", where, axis));
    MEGACTX_CHECK(extent <= static_cast<uint64_t>(INT64_MAX), "{}: shape[{}] too large", where,
                  axis);
    MEGACTX_CHECK(!__builtin_mul_overflow(bytes, extent, &bytes),
                  "{}: shape {} overflows the byte count", where, shape.dump());
    entry.shape.push_back(static_cast<int64_t>(extent));
  }

  entry.begin = read_offset(info["data_offsets"][0], where + ": data_offsets[0]");
  entry.end = read_offset(info["data_offsets"][1], where + ": data_offsets[1]");
  MEGACTX_CHECK(entry.begin <= entry.end, "{}: data_offsets [{}, {}] run backwards", where,
                entry.begin, entry.end);
  MEGACTX_CHECK(entry.end <= data_size,
                "{}: data_offsets [{}, {}] reach past the end of the data section ({} bytes; "
                "file truncated?)",
                where, entry.begin, entry.end, data_size);
  MEGACTX_CHECK(entry.end - entry.begin == bytes,
                "{}: data_offsets [{}, {}] span {} bytes but shape {} of {} needs {}", where,
                entry.begin, entry.end, entry.end - entry.begin, shape.dump(), dtype_text, bytes);
  return entry;
}

}  // namespace

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size,
                                           const std::string& label) {
  MEGACTX_CHECK(size >= 8,
                "{}: truncated ({} bytes; a safetensors file starts with an 8-byte "
                "header length)",
                label, size);
  const uint64_t header_length = read_u64_le(bytes);
  MEGACTX_CHECK(header_length <= kMaxHeaderBytes, "{}: header length {} is implausibly large",
                label, header_length);
  MEGACTX_CHECK(header_length <= size - 8,
                "{}: header length {} exceeds the {} bytes after the length field (file "
                "truncated or not safetensors)",
                label, header_length, size - 8);
  MEGACTX_CHECK(header_length >= 2, "{}: header length {} is too short for a JSON object", label,
                header_length);

  const char* text = reinterpret_cast<const char*>(bytes + 8);
  // Top-level keys are checked for duplicates, which plain parsing would silently merge.
  std::set<std::string> keys;
  std::string duplicate;
  nlohmann::json::parser_callback_t on_event = [&](int depth, nlohmann::json::parse_event_t event,
                                                   nlohmann::json& parsed) {
    if (event == nlohmann::json::parse_event_t::key && depth == 1 && parsed.is_string()) {
      if (!keys.insert(parsed.get<std::string>()).second && duplicate.empty())
        duplicate = parsed.get<std::string>();
    }
    return true;
  };
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text, text + header_length, on_event);
  } catch (const nlohmann::json::exception& error) {
    fail("{}: header is not valid JSON: {}", label, error.what());
  }
  MEGACTX_CHECK(header.is_object(), "{}: header must be a JSON object, got {}", label,
                json_type_name(header));
  MEGACTX_CHECK(duplicate.empty(), "{}: header names '{}' twice", label, duplicate);

  SafetensorsHeader result;
  result.data_offset = 8 + header_length;
  const uint64_t data_size = size - result.data_offset;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") {
      MEGACTX_CHECK(info.is_object() || info.is_null(), "{}: __metadata__ must be an object",
                    label);
      if (info.is_null()) continue;
      for (const auto& [key, value] : info.items()) {
        MEGACTX_CHECK(value.is_string(), "{}: __metadata__ value of '{}' must be a string", label,
                      key);
        result.metadata[key] = value.get<std::string>();
      }
      continue;
    }
    result.entries.push_back(parse_entry(name, info, data_size, label));
  }

  // Overlap check on the byte ranges (empty tensors occupy nothing).
  std::sort(result.entries.begin(), result.entries.end(),
            [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
              return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
            });
  const SafetensorsEntry* previous = nullptr;
  for (const auto& entry : result.entries) {
    if (entry.begin == entry.end) continue;
    if (previous != nullptr)
      MEGACTX_CHECK(entry.begin >= previous->end,
                    "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", label, previous->name,
                    previous->begin, previous->end, entry.name, entry.begin, entry.end);
    previous = &entry;
  }
  return result;
}

SafetensorsFile::SafetensorsFile(const std::string& path) : file_(path) {
  header_ = parse_safetensors_header(file_.data(), file_.size(), path);
  for (size_t i = 0; i < header_.entries.size(); ++i) index_[header_.entries[i].name] = i;
}

const SafetensorsEntry* SafetensorsFile::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &header_.entries[it->second];
}

Tensor SafetensorsFile::view(const SafetensorsEntry& entry) const {
  return Tensor::view(file_.data() + header_.data_offset + entry.begin, entry.shape, entry.dtype);
}

}  // namespace megactx
