#include "io/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"

namespace megactx {

MappedFile::MappedFile(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  MEGACTX_CHECK(fd >= 0, "cannot open {}: {}", path, std::strerror(errno));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    const int saved = errno;
    ::close(fd);
    fail("cannot stat {}: {}", path, std::strerror(saved));
  }
  if (!S_ISREG(info.st_mode)) {
    ::close(fd);
    fail("cannot read {}: not a regular file", path);
  }
  size_ = static_cast<size_t>(info.st_size);
  if (size_ > 0) {
    void* address = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (address == MAP_FAILED) {
      const int saved = errno;
      ::close(fd);
      fail("cannot map {} ({} bytes): {}", path, size_, std::strerror(saved));
    }
    data_ = static_cast<const uint8_t*>(address);
  }
  ::close(fd);  // the mapping keeps the file alive
}

MappedFile::~MappedFile() {
  if (data_ != nullptr) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::prefetch(size_t offset, size_t length) const {
  if (data_ == nullptr || offset >= size_) return;
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t begin = offset / page * page;
  const size_t end = std::min(size_, offset + length);
  ::madvise(const_cast<uint8_t*>(data_) + begin, end - begin, MADV_WILLNEED);
}

}  // namespace megactx
