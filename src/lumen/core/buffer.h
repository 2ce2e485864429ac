// Owned memory: AlignedBuffer (heap, 64-byte aligned, zeroed) and MappedFile
// (a whole file, read-only: mmap'd or copied onto huge pages). Both are move-only RAII; TensorViews
// point into them and must not outlive them.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "lumen/core/status.h"

namespace lumen {

class AlignedBuffer {
 public:
  static constexpr size_t kAlign = 64;
  AlignedBuffer() = default;
  explicit AlignedBuffer(size_t bytes);  // zero-filled; aborts only on OOM
  // Zero-filled too, but as anonymous pages the kernel zeroes on first
  // touch: for a large buffer of which only a part is written, a KV cache
  // allocated for a whole context (a server's 1.4 GB for a 1B model at 45k
  // tokens cost every new session a memset of all of it: 0.7 s before its
  // first token, 12 s for four at once). Not for per-call scratch, which
  // would fault its pages in on every call.
  static AlignedBuffer ZeroedOnTouch(size_t bytes);
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
  void Free();
  void* data_ = nullptr;
  size_t size_ = 0;
  bool mapped_ = false;  // ZeroedOnTouch: munmap, not free
};

// How a file's bytes are made resident.
//   kMap:  mmap of the file (pages shared with the page cache, 4 KiB pages).
//   kCopy: read into anonymous memory on transparent huge pages
//          (madvise(MADV_HUGEPAGE)), then made read-only. Decode streams every
//          weight once per token; on 4 KiB pages each page is a TLB miss and
//          the stream stalls at page boundaries (measured on a KVM Xeon: Q4_0
//          1B decode 1.8x faster, docs/reference/performance.md).
//   kAuto: kCopy for files of at least kCopyMinBytes that fit in half of
//          MemAvailable, else kMap; LUMEN_MMAP=1 in the environment forces
//          kMap (llama.cpp's --mmap/--no-mmap trade: shared pages vs speed).
enum class Residency { kAuto, kMap, kCopy };

class MappedFile {
 public:
  static constexpr size_t kCopyMinBytes = size_t{32} << 20;

  // Maps or reads `path` read-only. Errors name the path and the OS reason.
  static Result<MappedFile> Open(const std::string& path, Residency r = Residency::kAuto);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return static_cast<const uint8_t*>(data_); }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  bool copied() const { return copied_; }
  // Bytes held in anonymous memory (kCopy): the file, less a prefix given
  // back to the file by MapPrefixFromFile. 0 for kMap.
  size_t copied_bytes() const { return copied_ ? size_ - prefix_mapped_ : 0; }

  // kCopy: backs the whole pages of [0, bytes) with the file instead of the
  // copy, and drops them from memory (they are read back from the file when
  // touched), for a header that has been parsed into owned values. The
  // mapping is checked to hold the same bytes as the copy before it replaces
  // it, so the contents never change; returns false (and keeps the copy) when
  // the file cannot be mapped or no longer matches. kMap, or a prefix already
  // mapped: nothing to do, true.
  bool MapPrefixFromFile(size_t bytes);

  // kCopy: makes the pages of [offset, offset + len) writable, calls
  // fn(the range's first byte) to transform it in place, and makes them
  // read-only again (a load-time repack costs no second copy). False, and fn
  // is not called, for kMap (the page cache's pages are shared), a range
  // that is not inside the copy (past the end, or in the prefix given back
  // to the file), or when the pages cannot be made writable.
  bool RewriteInPlace(size_t offset, size_t len, const std::function<void(uint8_t*)>& fn);

 private:
  void Release();

  void* data_ = nullptr;
  size_t size_ = 0;
  void* map_base_ = nullptr;  // what munmap takes (kCopy: before the 2 MiB alignment)
  size_t map_len_ = 0;
  bool copied_ = false;
  size_t prefix_mapped_ = 0;  // kCopy: leading bytes mapped from the file again
  std::string path_;
};

// Reads a whole (small) file into a string.
Result<std::string> ReadFile(const std::string& path);

// Writes `bytes` to `path` atomically: a temp file beside it, fsync, rename.
// On failure nothing is left behind and `path` is untouched.
Status WriteFileAtomic(const std::string& path, std::string_view bytes);

}  // namespace lumen
