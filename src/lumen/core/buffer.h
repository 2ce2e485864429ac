// Owned memory: AlignedBuffer (heap, 64-byte aligned, zeroed) and MappedFile
// (read-only mmap of a whole file). Both are move-only RAII; TensorViews point
// into them and must not outlive them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "lumen/core/status.h"

namespace lumen {

class AlignedBuffer {
 public:
  static constexpr size_t kAlign = 64;
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);  // zero-filled; aborts only on OOM
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  void* data() const { return data_; }
  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }
  size_t size() const { return size_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
};

class MappedFile {
 public:
  // Maps `path` read-only. Errors name the path and the OS reason.
  static Result<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Reads a whole (small) file into a string.
Result<std::string> ReadFile(const std::string& path);

// Writes `bytes` to `path` atomically: a temp file beside it, fsync, rename.
// On failure nothing is left behind and `path` is untouched.
Status WriteFileAtomic(const std::string& path, std::string_view bytes);

}  // namespace lumen
