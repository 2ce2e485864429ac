// safetensors reader and writer (Hugging Face's tensor file format).
//
// Layout: u64 little-endian N, N bytes of UTF-8 JSON header, then the data
// section. The header maps each tensor name to {"dtype", "shape",
// "data_offsets": [begin, end)} (offsets relative to the data section), plus an
// optional "__metadata__" object of string values.
//
// SafetensorsFile::Open mmaps the file and validates it as the spec and the
// reference implementation do: the header fits in the file and is at most
// 100 MB, starts with '{', is valid JSON (so every name is valid UTF-8) without
// duplicate keys; each entry has a known dtype, non-negative integer shape and
// offsets; shape size * element size == end - begin (overflow-checked); and the
// tensors tile the data section exactly, with no overlap, no hole and nothing
// after the last tensor (the spec forbids holes to rule out polyglot files).
// Errors read "<path>: tensor '<name>': <reason>" or "<path>: <reason>".
// The reader does not require the header length to be a multiple of 8 (files
// from old writers are not padded); views are then unaligned for their dtype.
//
// Views are zero-copy into the mapping and live as long as the SafetensorsFile.
// Shapes of more than 4 dimensions keep their full `shape` but the view folds
// the leading dimensions into its first one (TensorView holds at most 4).
//
// SafetensorsWriter lays tensors out as the reference writer does (descending
// dtype alignment, then name; header padded with spaces to a multiple of 8, so
// every tensor is naturally aligned) and writes atomically: temp file, fsync,
// rename, streaming each tensor's bytes without building the file in memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/core/buffer.h"
#include "lumen/core/status.h"
#include "lumen/core/tensor.h"

namespace lumen::formats {

// The header's largest accepted size, as in the reference implementation.
inline constexpr uint64_t kSafetensorsMaxHeader = 100'000'000;

struct SafetensorsTensor {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;  // as stored, outermost first; [] for a scalar
  uint64_t data_begin = 0;     // offsets within the data section
  uint64_t data_end = 0;
  TensorView view;  // zero-copy into the file's bytes
};

class SafetensorsFile {
 public:
  static Result<SafetensorsFile> Open(const std::string& path,
                                      Residency residency = Residency::kAuto);
  // Parses from memory (fuzzer, tests); `bytes` must outlive the object.
  static Result<SafetensorsFile> FromBytes(const uint8_t* bytes, size_t size, std::string name);

  const std::string& path() const { return path_; }
  // Bytes of the file copied into anonymous memory (Residency::kCopy), else 0.
  size_t copied_bytes() const { return file_.copied_bytes(); }
  // Tensors in data-section order.
  const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
  const SafetensorsTensor* Find(std::string_view name) const;
  // The "__metadata__" object (string values only); an empty object if absent.
  const nlohmann::json& metadata() const { return metadata_; }
  // Offset of the data section from the start of the file (8 + N).
  uint64_t data_offset() const { return data_offset_; }
  // The bytes [at, at + len) of this file, writable for fn:
  // MappedFile::RewriteInPlace. False where they are not in this file or the
  // file is mapped, not copied (fn is not called).
  bool RewriteInPlace(const void* at, size_t len, const std::function<void(uint8_t*)>& fn);

 private:
  static Result<SafetensorsFile> Parse(const uint8_t* bytes, size_t size, std::string name);

  MappedFile file_;  // empty for FromBytes
  std::string path_;
  nlohmann::json metadata_ = nlohmann::json::object();
  uint64_t data_offset_ = 0;
  std::vector<SafetensorsTensor> tensors_;
  std::map<std::string, size_t, std::less<>> index_;
};

// Safetensors dtype names ("F32", "BF16", "BOOL", ...) <-> DType. Known names
// without a DType (F8_E4M3, F8_E5M2, U64) give nullopt like unknown names.
std::optional<DType> DTypeFromSafetensors(std::string_view name);
std::optional<std::string_view> SafetensorsDTypeName(DType t);

class SafetensorsWriter {
 public:
  // Adds a tensor holding `bytes` (little-endian, row-major); the size must be
  // exactly numel * element size. Errors: unsupported dtype, negative dim,
  // size mismatch, duplicate or non-UTF-8 name, the reserved "__metadata__".
  Status Add(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
             std::string bytes);
  // As Add, but borrows `data`: it must stay valid until Write returns.
  Status AddBorrowed(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                     const void* data, size_t size);
  // Borrows a contiguous view (e.g. one read from another file).
  Status AddView(const std::string& name, const TensorView& view);

  void SetMetadata(const std::string& key, const std::string& value);  // replaces same key

  // The header bytes (u64 length + padded JSON) for the current tensors.
  std::string Header() const;
  // The whole file in memory (tests and fuzz seeds; Write streams instead).
  std::string Serialize() const;
  // Writes the file atomically; on failure nothing is left behind.
  Status Write(const std::string& path) const;

 private:
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::string owned;
    const void* borrowed;  // null when the bytes are `owned`
    size_t size;
    const char* bytes() const {
      return borrowed ? static_cast<const char*>(borrowed) : owned.data();
    }
  };
  Status Check(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
               size_t size) const;
  std::vector<const Pending*> Ordered() const;

  std::vector<Pending> tensors_;
  std::map<std::string, std::string> metadata_;
};

// True if `s` is well-formed UTF-8 (no overlongs, surrogates or > U+10FFFF).
bool IsValidUtf8(std::string_view s);

}  // namespace lumen::formats
