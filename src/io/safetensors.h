// The safetensors format: an 8-byte little-endian header length N, N bytes of
// JSON {"name": {"dtype", "shape", "data_offsets": [begin, end]}, ...,
// "__metadata__": {string: string}}, then the data section; offsets are
// relative to the data section's start.
//
// parse_safetensors_header() validates everything against the file size before
// a single tensor byte is touched: the header length, the JSON, dtypes, shapes
// (no overflow), offsets inside the data section, offsets consistent with
// shape x dtype size, and no two tensors overlapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/mapped_file.h"

namespace megactx {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  uint64_t begin = 0;  // byte offsets into the data section, end exclusive
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_offset = 0;  // 8 + header length: where the data section starts in the file
  std::vector<SafetensorsEntry> entries;  // in file order of data_offsets
  std::map<std::string, std::string> metadata;
};

// `bytes` is the whole file (size `size`); `label` names it in errors.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size,
                                           const std::string& label);

// One mapped .safetensors file.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const std::vector<SafetensorsEntry>& entries() const { return header_.entries; }
  const std::map<std::string, std::string>& metadata() const { return header_.metadata; }
  // Null when the file holds no such tensor.
  const SafetensorsEntry* find(const std::string& name) const;
  // A zero-copy view of the entry's bytes (valid while this object lives).
  Tensor view(const SafetensorsEntry& entry) const;
  size_t size() const { return file_.size(); }
  void prefetch() const { file_.prefetch(0, file_.size()); }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
  std::map<std::string, size_t> index_;  // name -> position in entries
};

}  // namespace megactx
