// GGUF v2/v3 reader and writer.
//
// GgufFile::Open mmaps the file, validates the header, every metadata value and
// every tensor info (names unique and UTF-8, dims positive and not overflowing,
// data inside the file and aligned), then hands out zero-copy TensorViews. The
// view's shape is row-major (GGUF ne reversed): ne=[in, out] becomes [out, in].
// Any problem is an error naming the file, the key or tensor, the offset, and why.
//
// The views point into read-only memory (the mapping, or the caller's bytes for
// FromBytes); blocks may sit at any byte offset when the alignment is small.
//
// GgufWriter keeps the added tensors' bytes, then streams header, metadata and
// data (aligned, zero-padded) through a small buffer to a temp file beside the
// target, fsyncs and renames it, so a failed write leaves nothing behind.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "lumen/core/buffer.h"
#include "lumen/core/status.h"
#include "lumen/core/tensor.h"

namespace lumen::formats {

// GGUF metadata value types, numbered as in the file.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// One metadata value. Arrays hold their element type and values (arrays of
// arrays are allowed by the format and kept as nested GgufValue).
struct GgufValue {
  GgufType type = GgufType::kU8;
  std::variant<uint64_t, int64_t, double, bool, std::string, std::vector<GgufValue>> v;
  GgufType array_type = GgufType::kU8;  // element type when type == kArray

  std::optional<int64_t> AsInt() const;           // any integer type (and bool)
  std::optional<double> AsFloat() const;          // any numeric type
  const std::string* AsString() const;            // kString only
  const std::vector<GgufValue>* AsArray() const;  // kArray only
};

struct GgufTensorInfo {
  std::string name;
  DType dtype;
  std::vector<int64_t> ne;  // as stored: ne[0] innermost
  uint64_t offset;          // relative to the data section
  TensorView view;          // row-major view into the mapping
  size_t nbytes = 0;        // bytes of tensor data (whole blocks)
};

class GgufFile {
 public:
  static Result<GgufFile> Open(const std::string& path, Residency residency = Residency::kAuto);
  // Parses from memory (used by the fuzzer); `bytes` must outlive the object.
  static Result<GgufFile> FromBytes(const uint8_t* bytes, size_t size, std::string name);

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  const std::string& path() const { return path_; }
  // Bytes of the file held in anonymous memory (Residency::kCopy), else 0:
  // the tensor data. Open gives the header's pages back to the file once it
  // is parsed (MappedFile::MapPrefixFromFile); a 128k vocabulary is megabytes.
  size_t copied_bytes() const { return file_.copied_bytes(); }
  // Absolute file offset of the tensor data section (aligned).
  uint64_t data_offset() const { return data_offset_; }

  // Metadata in file order, and lookup by key.
  const std::vector<std::pair<std::string, GgufValue>>& metadata() const { return kv_; }
  const GgufValue* Find(const std::string& key) const;
  // Typed accessors: error names the key if absent or of the wrong type.
  Result<int64_t> GetInt(const std::string& key) const;
  Result<double> GetFloat(const std::string& key) const;
  Result<std::string> GetString(const std::string& key) const;
  // With default when absent (still an error when present with a wrong type).
  Result<int64_t> GetInt(const std::string& key, int64_t def) const;
  Result<double> GetFloat(const std::string& key, double def) const;

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* FindTensor(const std::string& name) const;

  // Frees the parsed metadata (afterwards metadata() is empty and Find finds
  // nothing); tensors and the mapping stay. A loaded model keeps the file open
  // for its tensors only, and a 128k vocabulary's token and merge arrays are
  // tens of MB of heap once the tokenizer has been built from them.
  void DropMetadata();

  // The bytes of a tensor of this file (view.data .. + len), writable for
  // fn: MappedFile::RewriteInPlace. False where the file is mapped, not
  // copied (fn is not called).
  bool RewriteInPlace(const void* at, size_t len, const std::function<void(uint8_t*)>& fn);

 private:
  // Validates and indexes `bytes` (the whole file) into *this.
  Status Parse(const uint8_t* bytes, size_t size);

  MappedFile file_;
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
};

class GgufWriter {
 public:
  void SetValue(const std::string& key, GgufValue value);  // replaces same key
  // Helpers for common kinds.
  void SetU32(const std::string& key, uint32_t v);
  void SetI32(const std::string& key, int32_t v);
  void SetF32(const std::string& key, float v);
  void SetBool(const std::string& key, bool v);
  void SetString(const std::string& key, std::string v);
  void SetStringArray(const std::string& key, const std::vector<std::string>& v);
  void SetF32Array(const std::string& key, const std::vector<float>& v);
  void SetI32Array(const std::string& key, const std::vector<int32_t>& v);

  // Adds a tensor; `shape` is row-major ([out, in]); `data` holds exactly
  // RowBytes(dtype, shape.back()) * rows bytes and is copied when written.
  Status AddTensor(const std::string& name, DType dtype, const std::vector<int64_t>& shape,
                   std::string data);

  // Writes GGUF v3 with `alignment` (default 32) atomically.
  Status Write(const std::string& path, uint32_t alignment = 32) const;

 private:
  std::vector<std::pair<std::string, GgufValue>> kv_;
  struct Pending {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::string data;
  };
  std::vector<Pending> tensors_;
};

// GGML type id <-> DType (e.g. 0 = F32, 1 = F16, 2 = Q4_0, 12 = Q4_K, 30 = BF16).
std::optional<DType> DTypeFromGgml(uint32_t ggml_type);
std::optional<uint32_t> GgmlFromDType(DType t);

}  // namespace lumen::formats
