// Test helpers: temporary directories and a byte-level safetensors writer that
// follows the format description (u64 LE length, JSON, data) independently of
// megactx's reader, so tests can also write files that lie.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace megactx::testing {

class TempDir {
 public:
  TempDir() {
    std::string pattern = (std::filesystem::temp_directory_path() / "megactx-io-XXXXXX").string();
    path_ = ::mkdtemp(pattern.data());
  }
  ~TempDir() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }
  std::string file(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline std::string u64_le(uint64_t value) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<char>((value >> (8 * i)) & 0xff);
  return bytes;
}

// A safetensors file from a literal header JSON text and a data section.
inline std::string safetensors_bytes(const std::string& header_json, const std::string& data) {
  std::string header = header_json;
  while (header.size() % 8 != 0) header += ' ';  // the format pads with spaces
  return u64_le(header.size()) + header + data;
}

struct RawTensor {
  std::string name;
  std::string dtype;  // "F32", "BF16", ...
  std::vector<int64_t> shape;
  std::string bytes;  // exactly numel * element size
};

// Lays tensors out back to back in the given order.
inline std::string safetensors_bytes(const std::vector<RawTensor>& tensors,
                                     const std::string& metadata_json = "") {
  std::string header = "{";
  std::string data;
  bool first = true;
  if (!metadata_json.empty()) {
    header += "\"__metadata__\":" + metadata_json;
    first = false;
  }
  for (const auto& tensor : tensors) {
    if (!first) header += ",";
    first = false;
    header += "\"" + tensor.name + "\":{\"dtype\":\"" + tensor.dtype + "\",\"shape\":[";
    for (size_t i = 0; i < tensor.shape.size(); ++i)
      header += (i ? "," : "") + std::to_string(tensor.shape[i]);
    header += "],\"data_offsets\":[" + std::to_string(data.size()) + "," +
              std::to_string(data.size() + tensor.bytes.size()) + "]}";
    data += tensor.bytes;
  }
  header += "}";
  return safetensors_bytes(header, data);
}

template <typename T>
std::string pod_bytes(const std::vector<T>& values) {
  std::string bytes(values.size() * sizeof(T), '\0');
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

}  // namespace megactx::testing
