#include "lumen/formats/safetensors.h"

#include "lumen/core/utf8.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

namespace lumen::formats {
namespace {

using nlohmann::json;

struct DTypeName {
  std::string_view name;
  std::optional<DType> dtype;
  int rank;  // position in the reference Dtype enum ("increasing alignment order")
};

// The reference implementation's dtypes, in its enum order; the writer sorts by
// this rank (descending) so that every tensor stays naturally aligned.
constexpr std::array<DTypeName, 15> kDTypes = {{
    {"BOOL", DType::kBool, 0},
    {"U8", DType::kU8, 1},
    {"I8", DType::kI8, 2},
    {"F8_E5M2", std::nullopt, 3},
    {"F8_E4M3", std::nullopt, 4},
    {"I16", DType::kI16, 5},
    {"U16", DType::kU16, 6},
    {"F16", DType::kF16, 7},
    {"BF16", DType::kBF16, 8},
    {"I32", DType::kI32, 9},
    {"U32", DType::kU32, 10},
    {"F32", DType::kF32, 11},
    {"F64", DType::kF64, 12},
    {"I64", DType::kI64, 13},
    {"U64", std::nullopt, 14},
}};

int DTypeRank(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.rank;
  return -1;
}

uint64_t LoadU64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Error messages may quote raw header bytes; keep them printable ASCII.
std::string Printable(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

// Parses the header, failing on the first duplicate key in any object (the
// spec disallows duplicates and nlohmann would silently keep the last one).
Result<json> ParseHeader(std::string_view text) {
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  auto callback = [&](int /*depth*/, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
        open_objects.emplace_back();
        break;
      case json::parse_event_t::object_end:
        if (!open_objects.empty()) open_objects.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects.empty() && parsed.is_string() &&
            !open_objects.back().insert(parsed.get_ref<const std::string&>()).second &&
            duplicate.empty()) {
          duplicate = parsed.get_ref<const std::string&>();
        }
        break;
      default:
        break;
    }
    return true;
  };
  // nlohmann stops at a NUL byte; JSON never contains a raw one.
  if (const size_t nul = text.find('\0'); nul != std::string_view::npos)
    return Errorf("header is not valid JSON: NUL byte at header offset {}", nul);
  json header;
  try {
    header = json::parse(text.begin(), text.end(), callback, /*allow_exceptions=*/true);
  } catch (const json::exception& e) {
    return Errorf("header is not valid JSON: {}", Printable(e.what()));
  }
  if (!duplicate.empty()) return Errorf("duplicate key '{}' in the header", duplicate);
  return header;
}

Result<uint64_t> GetUnsigned(const json& v, std::string_view what) {
  if (!v.is_number_unsigned())
    return Errorf("{} must be a non-negative integer, got {}", what, Printable(v.dump()));
  const uint64_t u = v.get<uint64_t>();
  if (u > uint64_t(std::numeric_limits<int64_t>::max()))
    return Errorf("{} {} is too large", what, u);
  return u;
}

// Bounds the product of the non-zero dims so that views (strides, folded
// leading dims) never overflow, even for zero-size tensors.
constexpr uint64_t kMaxSpanBytes = uint64_t(1) << 62;

struct Entry {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  uint64_t begin, end;
};

Result<Entry> ParseEntry(const std::string& name, const json& v, uint64_t data_size) {
  if (!v.is_object()) return Error("entry must be a JSON object");
  Entry e;
  e.name = name;
  const auto dt = v.find("dtype");
  if (dt == v.end()) return Error("missing \"dtype\"");
  if (!dt->is_string()) return Error("\"dtype\" must be a string");
  const std::string& dname = dt->get_ref<const std::string&>();
  const DTypeName* found = nullptr;
  for (const auto& d : kDTypes)
    if (d.name == dname) found = &d;
  if (!found) return Errorf("unknown dtype '{}'", dname);
  if (!found->dtype) return Errorf("dtype '{}' is not supported", dname);
  e.dtype = *found->dtype;

  const auto sh = v.find("shape");
  if (sh == v.end()) return Error("missing \"shape\"");
  if (!sh->is_array()) return Error("\"shape\" must be an array");
  const uint64_t elem = uint64_t(Info(e.dtype).block_bytes);
  uint64_t numel = 1, span = elem;
  for (const json& d : *sh) {
    LUMEN_ASSIGN_OR_RETURN(const uint64_t dim, GetUnsigned(d, "shape dimension"));
    e.shape.push_back(int64_t(dim));
    numel *= dim;  // cannot overflow while span (>= numel) stays bounded below
    if (dim != 0 && (__builtin_mul_overflow(span, dim, &span) || span > kMaxSpanBytes))
      return Errorf("shape {} is too large", Printable(sh->dump()));
  }
  const uint64_t nbytes = numel * elem;

  const auto off = v.find("data_offsets");
  if (off == v.end()) return Error("missing \"data_offsets\"");
  if (!off->is_array() || off->size() != 2)
    return Error("\"data_offsets\" must be an array [begin, end]");
  LUMEN_ASSIGN_OR_RETURN(e.begin, GetUnsigned((*off)[0], "data_offsets begin"));
  LUMEN_ASSIGN_OR_RETURN(e.end, GetUnsigned((*off)[1], "data_offsets end"));
  if (e.end < e.begin) return Errorf("data_offsets [{}, {}] end before they begin", e.begin, e.end);
  if (e.end > data_size)
    return Errorf("data_offsets [{}, {}] run past the end of the data section ({} bytes)", e.begin,
                  e.end, data_size);
  if (e.end - e.begin != nbytes)
    return Errorf("data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", e.begin, e.end,
                  e.end - e.begin, Printable(sh->dump()), dname, nbytes);
  return e;
}

TensorView MakeView(const uint8_t* data, DType dtype, const std::vector<int64_t>& shape) {
  void* p = const_cast<uint8_t*>(data);  // views are read-only by contract
  if (shape.size() <= size_t(kMaxDims)) {
    return TensorView::Contiguous(p, dtype, shape.data(), int(shape.size()));
  }
  std::array<int64_t, kMaxDims> folded{};
  const size_t lead = shape.size() - kMaxDims + 1;
  folded[0] = 1;
  for (size_t i = 0; i < lead; ++i) folded[0] *= shape[i];
  for (int i = 1; i < kMaxDims; ++i) folded[i] = shape[lead + i - 1];
  return TensorView::Contiguous(p, dtype, folded.data(), kMaxDims);
}

}  // namespace

bool IsValidUtf8(std::string_view s) { return ValidUtf8(s); }

std::optional<DType> DTypeFromSafetensors(std::string_view name) {
  for (const auto& d : kDTypes)
    if (d.name == name) return d.dtype;
  return std::nullopt;
}

std::optional<std::string_view> SafetensorsDTypeName(DType t) {
  for (const auto& d : kDTypes)
    if (d.dtype == t) return d.name;
  return std::nullopt;
}

Result<SafetensorsFile> SafetensorsFile::Open(const std::string& path, Residency residency) {
  LUMEN_ASSIGN_OR_RETURN(MappedFile m, MappedFile::Open(path, residency));
  LUMEN_ASSIGN_OR_RETURN(SafetensorsFile f, Parse(m.data(), m.size(), path));
  f.file_ = std::move(m);  // the mapping's address is unchanged by the move
  return f;
}

Result<SafetensorsFile> SafetensorsFile::FromBytes(const uint8_t* bytes, size_t size,
                                                   std::string name) {
  return Parse(bytes, size, std::move(name));
}

Result<SafetensorsFile> SafetensorsFile::Parse(const uint8_t* bytes, size_t size,
                                               std::string name) {
  if (size < 8)
    return Errorf("{}: file is {} bytes, too short for the 8-byte header length", name, size);
  const uint64_t n = LoadU64(bytes);
  if (n > kSafetensorsMaxHeader)
    return Errorf("{}: header length {} exceeds the limit of {} bytes", name, n,
                  kSafetensorsMaxHeader);
  if (n > size - 8)
    return Errorf("{}: header length {} runs past the end of the file ({} bytes)", name, n, size);
  if (n < 2 || bytes[8] != '{')
    return Errorf("{}: header does not start with '{{' (not a safetensors file?)", name);
  const std::string_view text(reinterpret_cast<const char*>(bytes + 8), n);
  Result<json> parsed = ParseHeader(text);
  if (!parsed.ok()) return parsed.status().WithContext(name);
  const json& header = *parsed;
  if (!header.is_object()) return Errorf("{}: header is not a JSON object", name);

  SafetensorsFile f;
  f.path_ = name;
  f.data_offset_ = 8 + n;
  const uint64_t data_size = size - f.data_offset_;
  const uint8_t* data = bytes + f.data_offset_;

  std::vector<Entry> entries;
  entries.reserve(header.size());
  for (const auto& [key, value] : header.items()) {
    if (key == "__metadata__") {
      if (!value.is_object()) return Errorf("{}: \"__metadata__\" must be an object", name);
      for (const auto& [mk, mv] : value.items()) {
        if (!mv.is_string())
          return Errorf("{}: \"__metadata__\" key '{}' must have a string value", name, mk);
      }
      f.metadata_ = value;
      continue;
    }
    Result<Entry> e = ParseEntry(key, value, data_size);
    if (!e.ok()) return e.status().WithContext(fmt::format("{}: tensor '{}'", name, key));
    entries.push_back(std::move(*e));
  }

  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const Entry& e = entries[i];
    if (e.begin < expected) {
      const Entry& prev = entries[i - 1];
      return Errorf("{}: tensor '{}': data_offsets [{}, {}] overlap tensor '{}' [{}, {}]", name,
                    e.name, e.begin, e.end, prev.name, prev.begin, prev.end);
    }
    if (e.begin > expected)
      return Errorf(
          "{}: tensor '{}': data starts at {} but the previous tensor ends at {}: a hole in the "
          "data section (the spec requires it to be fully covered)",
          name, e.name, e.begin, expected);
    expected = e.end;
  }
  if (expected != data_size)
    return Errorf(
        "{}: the data section has {} bytes after the last tensor (ends at {}, section is {} "
        "bytes; the spec requires it to be fully covered)",
        name, data_size - expected, expected, data_size);

  f.tensors_.reserve(entries.size());
  for (Entry& e : entries) {
    SafetensorsTensor t;
    t.view = MakeView(data + e.begin, e.dtype, e.shape);
    t.name = std::move(e.name);
    t.dtype = e.dtype;
    t.shape = std::move(e.shape);
    t.data_begin = e.begin;
    t.data_end = e.end;
    f.index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }
  return f;
}

bool SafetensorsFile::RewriteInPlace(const void* at, size_t len,
                                     const std::function<void(uint8_t*)>& fn) {
  const auto* p = static_cast<const uint8_t*>(at);
  if (file_.data() == nullptr || p < file_.data() || p > file_.data() + file_.size()) return false;
  return file_.RewriteInPlace(static_cast<size_t>(p - file_.data()), len, fn);
}

const SafetensorsTensor* SafetensorsFile::Find(std::string_view name) const {
  const auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

// ---------------------------------------------------------------------------
// Writer

Status SafetensorsWriter::Check(const std::string& name, DType dtype,
                                const std::vector<int64_t>& shape, size_t size) const {
  if (name == "__metadata__") return Error("tensor name '__metadata__' is reserved");
  if (!IsValidUtf8(name)) return Errorf("tensor name '{}' is not valid UTF-8", Printable(name));
  if (!SafetensorsDTypeName(dtype))
    return Errorf("tensor '{}': dtype {} cannot be stored in safetensors", name, Name(dtype));
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) return Errorf("tensor '{}': negative dimension {}", name, d);
    if (__builtin_mul_overflow(numel, uint64_t(d), &numel))
      return Errorf("tensor '{}': shape too large", name);
  }
  uint64_t nbytes;
  if (__builtin_mul_overflow(numel, uint64_t(Info(dtype).block_bytes), &nbytes) || nbytes != size)
    return Errorf("tensor '{}': {} bytes given, shape needs {} elements of {}", name, size, numel,
                  Name(dtype));
  for (const auto& t : tensors_)
    if (t.name == name) return Errorf("tensor '{}': added twice", name);
  return Status::Ok();
}

Status SafetensorsWriter::Add(const std::string& name, DType dtype,
                              const std::vector<int64_t>& shape, std::string bytes) {
  LUMEN_RETURN_IF_ERROR(Check(name, dtype, shape, bytes.size()));
  const size_t size = bytes.size();
  tensors_.push_back(Pending{name, dtype, shape, std::move(bytes), nullptr, size});
  return Status::Ok();
}

Status SafetensorsWriter::AddBorrowed(const std::string& name, DType dtype,
                                      const std::vector<int64_t>& shape, const void* data,
                                      size_t size) {
  LUMEN_RETURN_IF_ERROR(Check(name, dtype, shape, size));
  static const char kEmpty = 0;
  tensors_.push_back(Pending{name, dtype, shape, {}, data ? data : &kEmpty, size});
  return Status::Ok();
}

Status SafetensorsWriter::AddView(const std::string& name, const TensorView& view) {
  if (!view.is_contiguous()) return Errorf("tensor '{}': view is not contiguous", name);
  std::vector<int64_t> shape(view.shape.begin(), view.shape.begin() + view.ndim);
  return AddBorrowed(name, view.dtype, shape, view.data, view.byte_size());
}

void SafetensorsWriter::SetMetadata(const std::string& key, const std::string& value) {
  metadata_[key] = value;
}

std::vector<const SafetensorsWriter::Pending*> SafetensorsWriter::Ordered() const {
  std::vector<const Pending*> order;
  for (const auto& t : tensors_) order.push_back(&t);
  std::sort(order.begin(), order.end(), [](const Pending* a, const Pending* b) {
    const int ra = DTypeRank(a->dtype), rb = DTypeRank(b->dtype);
    return ra != rb ? ra > rb : a->name < b->name;
  });
  return order;
}

std::string SafetensorsWriter::Header() const {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata_.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata_) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  for (const Pending* t : Ordered()) {
    nlohmann::ordered_json e = nlohmann::ordered_json::object();
    e["dtype"] = std::string(*SafetensorsDTypeName(t->dtype));
    e["shape"] = t->shape;
    e["data_offsets"] = {offset, offset + t->size};
    offset += t->size;
    h[t->name] = std::move(e);
  }
  // Metadata values that are not UTF-8 are replaced rather than thrown on.
  std::string text = h.dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace);
  text.resize((text.size() + 7) / 8 * 8, ' ');
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = char((n >> (8 * i)) & 0xff);
  return out + text;
}

std::string SafetensorsWriter::Serialize() const {
  std::string out = Header();
  for (const Pending* t : Ordered()) out.append(t->bytes(), t->size);
  return out;
}

Status SafetensorsWriter::Write(const std::string& path) const {
  const std::string header = Header();
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errorf("{}: cannot create: {}", tmp, std::strerror(errno));
  auto fail = [&](std::string_view what) {
    const int e = errno;
    ::close(fd);
    ::unlink(tmp.c_str());
    return Errorf("{}: {}: {}", path, what, std::strerror(e));
  };
  auto write_all = [&](const char* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::write(fd, p, std::min<size_t>(n, size_t(1) << 30));
      if (w < 0) {
        if (errno == EINTR) continue;
        return false;
      }
      p += w;
      n -= size_t(w);
    }
    return true;
  };
  if (!write_all(header.data(), header.size())) return fail("write failed");
  for (const Pending* t : Ordered())
    if (!write_all(t->bytes(), t->size)) return fail("write failed");
  if (::fsync(fd) != 0) return fail("fsync failed");
  if (::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return Errorf("{}: close failed: {}", path, std::strerror(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return Errorf("{}: rename failed: {}", path, std::strerror(e));
  }
  // Best effort: make the rename itself durable.
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  if (const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC); dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return Status::Ok();
}

}  // namespace lumen::formats
