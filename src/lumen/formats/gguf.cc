#include "lumen/formats/gguf.h"

#include "lumen/core/utf8.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <string_view>

namespace lumen::formats {
namespace {

static_assert(std::endian::native == std::endian::little,
              "GGUF is little-endian; the reader assumes a little-endian host");

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
constexpr uint64_t kDefaultAlignment = 32;
// Arrays of arrays are legal; the bound only stops a hostile file from
// recursing the parser off the stack.
constexpr int kMaxArrayDepth = 16;
// Smallest on-disk size of one metadata entry (key length, empty key, value
// type, 1-byte value) and of one tensor info (name length, empty name, n_dims,
// one ne, type, offset): used to reject absurd counts before reserving memory.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;

struct GgmlType {
  uint32_t id;
  DType dtype;
};
constexpr GgmlType kGgmlTypes[] = {
    {0, DType::kF32},   {1, DType::kF16},   {2, DType::kQ4_0},  {3, DType::kQ4_1},
    {6, DType::kQ5_0},  {7, DType::kQ5_1},  {8, DType::kQ8_0},  {9, DType::kQ8_1},
    {10, DType::kQ2_K}, {11, DType::kQ3_K}, {12, DType::kQ4_K}, {13, DType::kQ5_K},
    {14, DType::kQ6_K}, {15, DType::kQ8_K}, {24, DType::kI8},   {25, DType::kI16},
    {26, DType::kI32},  {27, DType::kI64},  {28, DType::kF64},  {30, DType::kBF16},
};

}  // namespace

// Strict UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF.

namespace {

// Printable form of an untrusted name for error messages.
std::string Escape(std::string_view s) {
  std::string out;
  const size_t limit = 200;
  for (size_t i = 0; i < s.size() && i < limit; ++i) {
    const uint8_t c = static_cast<uint8_t>(s[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (s.size() > limit) out += "...";
  return out;
}

std::string_view TypeName(GgufType t) {
  switch (t) {
    case GgufType::kU8:
      return "u8";
    case GgufType::kI8:
      return "i8";
    case GgufType::kU16:
      return "u16";
    case GgufType::kI16:
      return "i16";
    case GgufType::kU32:
      return "u32";
    case GgufType::kI32:
      return "i32";
    case GgufType::kF32:
      return "f32";
    case GgufType::kBool:
      return "bool";
    case GgufType::kString:
      return "string";
    case GgufType::kArray:
      return "array";
    case GgufType::kU64:
      return "u64";
    case GgufType::kI64:
      return "i64";
    case GgufType::kF64:
      return "f64";
  }
  return "?";
}

bool KnownType(uint32_t t) { return t <= static_cast<uint32_t>(GgufType::kF64); }

// Smallest encoded size of one value of type t.
uint64_t MinValueBytes(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kBool:
      return 1;
    case GgufType::kU16:
    case GgufType::kI16:
      return 2;
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kF32:
      return 4;
    case GgufType::kU64:
    case GgufType::kI64:
    case GgufType::kF64:
      return 8;
    case GgufType::kString:
      return 8;
    case GgufType::kArray:
      return 12;
  }
  return 1;
}

// A bounds-checked little-endian cursor. Every error names the file, the item
// being read (`what`, e.g. "key 'general.name'"), the item's offset and why.
class Cursor {
 public:
  Cursor(const uint8_t* p, size_t size, const std::string& path)
      : p_(p), size_(size), path_(path) {}

  size_t offset() const { return off_; }
  size_t remaining() const { return size_ - off_; }

  Status Fail(const std::string& what, size_t at, std::string_view reason) const {
    return Errorf("{}: {} at offset {}: {}", path_, what, at, reason);
  }

  template <typename T>
  Status Read(T* out, const std::string& what, size_t at, std::string_view field) {
    if (remaining() < sizeof(T)) {
      return Fail(what, at,
                  fmt::format("truncated: {} needs {} bytes at offset {}, {} left", field,
                              sizeof(T), off_, remaining()));
    }
    std::memcpy(out, p_ + off_, sizeof(T));
    off_ += sizeof(T);
    return Status::Ok();
  }

  Status ReadString(std::string* out, const std::string& what, size_t at, std::string_view field) {
    uint64_t len = 0;
    LUMEN_RETURN_IF_ERROR(Read(&len, what, at, fmt::format("{} length", field)));
    if (len > remaining()) {
      return Fail(what, at,
                  fmt::format("{} length {} exceeds the {} bytes left in the file (truncated or "
                              "corrupt)",
                              field, len, remaining()));
    }
    out->assign(reinterpret_cast<const char*>(p_ + off_), static_cast<size_t>(len));
    off_ += static_cast<size_t>(len);
    return Status::Ok();
  }

 private:
  const uint8_t* p_;
  size_t size_;
  size_t off_ = 0;
  const std::string& path_;
};

// Reads one T and stores it widened to S (u64, i64 or double) in out->v.
template <typename T, typename S>
Status ReadScalar(Cursor& c, const std::string& what, size_t at, std::string_view field,
                  GgufValue* out) {
  T x{};
  LUMEN_RETURN_IF_ERROR(c.Read(&x, what, at, field));
  out->v = static_cast<S>(x);
  return Status::Ok();
}

Status ParseValue(Cursor& c, GgufType type, int depth, const std::string& what, size_t at,
                  GgufValue* out) {
  out->type = type;
  switch (type) {
    case GgufType::kU8:
      return ReadScalar<uint8_t, uint64_t>(c, what, at, "u8 value", out);
    case GgufType::kI8:
      return ReadScalar<int8_t, int64_t>(c, what, at, "i8 value", out);
    case GgufType::kU16:
      return ReadScalar<uint16_t, uint64_t>(c, what, at, "u16 value", out);
    case GgufType::kI16:
      return ReadScalar<int16_t, int64_t>(c, what, at, "i16 value", out);
    case GgufType::kU32:
      return ReadScalar<uint32_t, uint64_t>(c, what, at, "u32 value", out);
    case GgufType::kI32:
      return ReadScalar<int32_t, int64_t>(c, what, at, "i32 value", out);
    case GgufType::kU64:
      return ReadScalar<uint64_t, uint64_t>(c, what, at, "u64 value", out);
    case GgufType::kI64:
      return ReadScalar<int64_t, int64_t>(c, what, at, "i64 value", out);
    case GgufType::kF32:
      return ReadScalar<float, double>(c, what, at, "f32 value", out);
    case GgufType::kF64:
      return ReadScalar<double, double>(c, what, at, "f64 value", out);
    case GgufType::kBool: {
      uint8_t x = 0;
      LUMEN_RETURN_IF_ERROR(c.Read(&x, what, at, "bool value"));
      out->v = x != 0;
      break;
    }
    case GgufType::kString: {
      std::string s;
      LUMEN_RETURN_IF_ERROR(c.ReadString(&s, what, at, "string value"));
      out->v = std::move(s);
      break;
    }
    case GgufType::kArray: {
      if (depth >= kMaxArrayDepth) {
        return c.Fail(what, at, fmt::format("arrays nested deeper than {}", kMaxArrayDepth));
      }
      uint32_t et = 0;
      uint64_t count = 0;
      LUMEN_RETURN_IF_ERROR(c.Read(&et, what, at, "array element type"));
      if (!KnownType(et)) {
        return c.Fail(what, at, fmt::format("unknown array element type {}", et));
      }
      LUMEN_RETURN_IF_ERROR(c.Read(&count, what, at, "array length"));
      const GgufType etype = static_cast<GgufType>(et);
      if (count > c.remaining() / MinValueBytes(etype)) {
        return c.Fail(what, at,
                      fmt::format("array length {} of {} cannot fit in the {} bytes left in "
                                  "the file",
                                  count, TypeName(etype), c.remaining()));
      }
      out->array_type = etype;
      std::vector<GgufValue> items(static_cast<size_t>(count));
      for (auto& item : items) {
        LUMEN_RETURN_IF_ERROR(ParseValue(c, etype, depth + 1, what, at, &item));
      }
      out->v = std::move(items);
      break;
    }
    default:
      return c.Fail(what, at, fmt::format("unknown value type {}", static_cast<uint32_t>(type)));
  }
  return Status::Ok();
}

}  // namespace

// ---------------------------------------------------------------------------
// GgufValue

std::optional<int64_t> GgufValue::AsInt() const {
  if (const auto* u = std::get_if<uint64_t>(&v)) {
    if (*u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
    return static_cast<int64_t>(*u);
  }
  if (const auto* i = std::get_if<int64_t>(&v)) return *i;
  if (const auto* b = std::get_if<bool>(&v)) return *b ? 1 : 0;
  return std::nullopt;
}

std::optional<double> GgufValue::AsFloat() const {
  if (const auto* d = std::get_if<double>(&v)) return *d;
  if (const auto* u = std::get_if<uint64_t>(&v)) return static_cast<double>(*u);
  if (const auto* i = std::get_if<int64_t>(&v)) return static_cast<double>(*i);
  return std::nullopt;
}

const std::string* GgufValue::AsString() const { return std::get_if<std::string>(&v); }

const std::vector<GgufValue>* GgufValue::AsArray() const {
  return std::get_if<std::vector<GgufValue>>(&v);
}

// ---------------------------------------------------------------------------
// GgmlType mapping

std::optional<DType> DTypeFromGgml(uint32_t ggml_type) {
  for (const auto& t : kGgmlTypes)
    if (t.id == ggml_type) return t.dtype;
  return std::nullopt;
}

std::optional<uint32_t> GgmlFromDType(DType d) {
  for (const auto& t : kGgmlTypes)
    if (t.dtype == d) return t.id;
  return std::nullopt;
}

// ---------------------------------------------------------------------------
// GgufFile

Result<GgufFile> GgufFile::Open(const std::string& path, Residency residency) {
  LUMEN_ASSIGN_OR_RETURN(MappedFile m, MappedFile::Open(path, residency));
  GgufFile f;
  f.path_ = path;
  f.file_ = std::move(m);
  LUMEN_RETURN_IF_ERROR(f.Parse(f.file_.data(), f.file_.size()));
  // Everything before the tensor data now lives in owned values.
  f.file_.MapPrefixFromFile(f.data_offset_);
  return f;
}

Result<GgufFile> GgufFile::FromBytes(const uint8_t* bytes, size_t size, std::string name) {
  GgufFile f;
  f.path_ = std::move(name);
  LUMEN_RETURN_IF_ERROR(f.Parse(bytes, size));
  return f;
}

Status GgufFile::Parse(const uint8_t* bytes, size_t size) {
  static const uint8_t kEmpty[1] = {0};
  if (bytes == nullptr) bytes = kEmpty;  // an empty mapping has no pointer
  Cursor c(bytes, size, path_);
  const std::string header = "header";

  if (size < 4) {
    return c.Fail(header, 0,
                  fmt::format("file is {} bytes, too short for the GGUF magic (truncated?)", size));
  }
  uint32_t magic = 0;
  LUMEN_RETURN_IF_ERROR(c.Read(&magic, header, 0, "magic"));
  if (magic != kMagic) {
    return c.Fail(header, 0,
                  fmt::format("bad magic '{}', expected 'GGUF' (not a GGUF file)",
                              Escape(std::string_view(reinterpret_cast<const char*>(bytes), 4))));
  }
  LUMEN_RETURN_IF_ERROR(c.Read(&version_, header, 0, "version"));
  if (version_ == 1) {
    return c.Fail(header, 4,
                  "GGUF version 1 is not supported (only versions 2 and 3; re-convert the model)");
  }
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    return c.Fail(
        header, 4,
        fmt::format("unsupported GGUF version {} (only versions 2 and 3){}", version_,
                    (swapped == 2 || swapped == 3) ? "; this looks like a big-endian file" : ""));
  }
  uint64_t n_tensors = 0, n_kv = 0;
  LUMEN_RETURN_IF_ERROR(c.Read(&n_tensors, header, 0, "tensor count"));
  LUMEN_RETURN_IF_ERROR(c.Read(&n_kv, header, 0, "metadata count"));
  if (n_kv > c.remaining() / kMinKvBytes) {
    return c.Fail(header, 16,
                  fmt::format("metadata count {} cannot fit in the {} bytes left in the file", n_kv,
                              c.remaining()));
  }

  // Metadata.
  kv_.reserve(static_cast<size_t>(n_kv));
  for (uint64_t i = 0; i < n_kv; ++i) {
    const size_t at = c.offset();
    std::string key;
    LUMEN_RETURN_IF_ERROR(c.ReadString(&key, fmt::format("key #{}", i), at, "key"));
    const std::string what = fmt::format("key '{}'", Escape(key));
    if (!ValidUtf8(key)) return c.Fail(what, at, "key is not valid UTF-8");
    if (kv_index_.count(key)) return c.Fail(what, at, "duplicate key");
    uint32_t type = 0;
    LUMEN_RETURN_IF_ERROR(c.Read(&type, what, at, "value type"));
    if (!KnownType(type)) return c.Fail(what, at, fmt::format("unknown value type {}", type));
    GgufValue value;
    LUMEN_RETURN_IF_ERROR(ParseValue(c, static_cast<GgufType>(type), 0, what, at, &value));
    if (key == "general.alignment") {
      const auto a = value.AsInt();
      if (!a || value.type == GgufType::kBool) {
        return c.Fail(what, at,
                      fmt::format("alignment must be an integer, got {}", TypeName(value.type)));
      }
      if (*a <= 0 || (*a & (*a - 1)) != 0) {
        return c.Fail(what, at, fmt::format("alignment {} is not a nonzero power of two", *a));
      }
      alignment_ = static_cast<uint64_t>(*a);
    }
    kv_index_.emplace(key, kv_.size());
    kv_.emplace_back(std::move(key), std::move(value));
  }

  // Tensor infos.
  if (n_tensors > c.remaining() / kMinTensorInfoBytes) {
    return c.Fail(header, 8,
                  fmt::format("tensor count {} cannot fit in the {} bytes left in the file",
                              n_tensors, c.remaining()));
  }
  tensors_.reserve(static_cast<size_t>(n_tensors));
  std::vector<size_t> info_at;
  info_at.reserve(static_cast<size_t>(n_tensors));
  for (uint64_t i = 0; i < n_tensors; ++i) {
    const size_t at = c.offset();
    GgufTensorInfo t;
    LUMEN_RETURN_IF_ERROR(c.ReadString(&t.name, fmt::format("tensor #{}", i), at, "name"));
    const std::string what = fmt::format("tensor '{}'", Escape(t.name));
    if (!ValidUtf8(t.name)) return c.Fail(what, at, "name is not valid UTF-8");
    if (tensor_index_.count(t.name)) return c.Fail(what, at, "duplicate tensor name");
    uint32_t n_dims = 0;
    LUMEN_RETURN_IF_ERROR(c.Read(&n_dims, what, at, "n_dims"));
    if (n_dims < 1 || n_dims > static_cast<uint32_t>(kMaxDims)) {
      return c.Fail(what, at, fmt::format("n_dims {} is not in 1..{}", n_dims, kMaxDims));
    }
    uint64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      uint64_t ne = 0;
      LUMEN_RETURN_IF_ERROR(c.Read(&ne, what, at, fmt::format("ne[{}]", d)));
      if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        return c.Fail(what, at, fmt::format("dimension ne[{}] = {} is not positive", d, ne));
      }
      if (numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / ne) {
        return c.Fail(what, at,
                      fmt::format("element count overflows (ne[{}] = {} times {})", d, ne, numel));
      }
      numel *= ne;
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    uint32_t type = 0;
    LUMEN_RETURN_IF_ERROR(c.Read(&type, what, at, "type"));
    const auto dtype = DTypeFromGgml(type);
    if (!dtype) return c.Fail(what, at, fmt::format("unknown ggml type id {}", type));
    t.dtype = *dtype;
    LUMEN_RETURN_IF_ERROR(c.Read(&t.offset, what, at, "data offset"));
    const DTypeInfo& info = Info(t.dtype);
    if (t.ne[0] % info.block_elems != 0) {
      return c.Fail(what, at,
                    fmt::format("innermost dimension {} is not a multiple of the {} block size {}",
                                t.ne[0], info.name, info.block_elems));
    }
    const uint64_t blocks = numel / info.block_elems;
    if (blocks > std::numeric_limits<uint64_t>::max() / info.block_bytes) {
      return c.Fail(what, at, "byte size overflows");
    }
    t.nbytes = static_cast<size_t>(blocks * info.block_bytes);
    tensor_index_.emplace(t.name, tensors_.size());
    tensors_.push_back(std::move(t));
    info_at.push_back(at);
  }

  // Data section: starts at the next multiple of the alignment.
  uint64_t data = c.offset();
  if (const uint64_t rem = data % alignment_; rem != 0) data += alignment_ - rem;
  data_offset_ = data;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    GgufTensorInfo& t = tensors_[i];
    const std::string what = fmt::format("tensor '{}'", Escape(t.name));
    if (t.offset % alignment_ != 0) {
      return c.Fail(what, info_at[i],
                    fmt::format("data offset {} is not a multiple of the alignment {}", t.offset,
                                alignment_));
    }
    if (data > size || t.offset > size - data || t.nbytes > size - data - t.offset) {
      return c.Fail(what, info_at[i],
                    fmt::format("data ({} bytes at data offset {} + {}) runs past the end of the "
                                "file ({} bytes)",
                                t.nbytes, data, t.offset, size));
    }
    int64_t shape[kMaxDims];
    const int nd = static_cast<int>(t.ne.size());
    for (int d = 0; d < nd; ++d) shape[d] = t.ne[nd - 1 - d];
    t.view =
        TensorView::Contiguous(const_cast<uint8_t*>(bytes) + data + t.offset, t.dtype, shape, nd);
  }
  return Status::Ok();
}

const GgufValue* GgufFile::Find(const std::string& key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

const GgufTensorInfo* GgufFile::FindTensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

bool GgufFile::RewriteInPlace(const void* at, size_t len, const std::function<void(uint8_t*)>& fn) {
  const auto* p = static_cast<const uint8_t*>(at);
  if (file_.data() == nullptr || p < file_.data() || p > file_.data() + file_.size()) return false;
  return file_.RewriteInPlace(static_cast<size_t>(p - file_.data()), len, fn);
}

void GgufFile::DropMetadata() {
  std::vector<std::pair<std::string, GgufValue>>().swap(kv_);
  kv_index_.clear();
}

Result<int64_t> GgufFile::GetInt(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Errorf("{}: key '{}': missing", path_, key);
  const auto i = v->AsInt();
  if (!i) return Errorf("{}: key '{}': expected an integer, got {}", path_, key, TypeName(v->type));
  return *i;
}

Result<int64_t> GgufFile::GetInt(const std::string& key, int64_t def) const {
  if (!Find(key)) return def;
  return GetInt(key);
}

Result<double> GgufFile::GetFloat(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Errorf("{}: key '{}': missing", path_, key);
  const auto f = v->AsFloat();
  if (!f) return Errorf("{}: key '{}': expected a number, got {}", path_, key, TypeName(v->type));
  return *f;
}

Result<double> GgufFile::GetFloat(const std::string& key, double def) const {
  if (!Find(key)) return def;
  return GetFloat(key);
}

Result<std::string> GgufFile::GetString(const std::string& key) const {
  const GgufValue* v = Find(key);
  if (!v) return Errorf("{}: key '{}': missing", path_, key);
  const std::string* s = v->AsString();
  if (!s) return Errorf("{}: key '{}': expected a string, got {}", path_, key, TypeName(v->type));
  return *s;
}

}  // namespace lumen::formats
