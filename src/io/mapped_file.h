// A read-only memory mapping of a whole file (weights are used in place, never
// copied). An empty file maps to no bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace megactx {

class MappedFile {
 public:
  // Throws megactx::Error naming the path when it cannot be opened or mapped.
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Asks the kernel to start reading [offset, offset + length) ahead of use.
  void prefetch(size_t offset, size_t length) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace megactx
