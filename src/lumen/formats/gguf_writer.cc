// GgufWriter: GGUF v3, metadata in insertion order, tensor data aligned with
// zeroed padding, streamed to a temp file beside the target, fsynced and
// renamed into place (the temp file is removed on any failure).
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <limits>

#include "lumen/core/utf8.h"
#include "lumen/formats/gguf.h"

#include <fmt/ranges.h>

namespace lumen::formats {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"
constexpr size_t kFlushBytes = 1 << 20;

// Buffered writer to "<path>.tmp.<pid>"; Commit() fsyncs and renames. If the
// object dies uncommitted, the temp file is unlinked.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path)
      : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {}
  ~AtomicFileWriter() {
    if (fd_ >= 0) ::close(fd_);
    if (!committed_ && opened_) ::unlink(tmp_.c_str());
  }
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  Status Open() {
    fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd_ < 0)
      return Errorf("{}: cannot create temp file {}: {}", path_, tmp_, std::strerror(errno));
    opened_ = true;
    return Status::Ok();
  }

  Status Append(const void* p, size_t n) {
    buf_.append(static_cast<const char*>(p), n);
    written_ += n;
    if (buf_.size() >= kFlushBytes) return Flush();
    return Status::Ok();
  }
  Status AppendZeros(size_t n) {
    buf_.append(n, '\0');
    written_ += n;
    if (buf_.size() >= kFlushBytes) return Flush();
    return Status::Ok();
  }
  uint64_t written() const { return written_; }

  Status Commit() {
    LUMEN_RETURN_IF_ERROR(Flush());
    if (::fsync(fd_) != 0) return Errorf("{}: fsync failed: {}", path_, std::strerror(errno));
    const int fd = fd_;
    fd_ = -1;
    if (::close(fd) != 0) return Errorf("{}: close failed: {}", path_, std::strerror(errno));
    if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
      return Errorf("{}: rename from {} failed: {}", path_, tmp_, std::strerror(errno));
    }
    committed_ = true;
    // Make the rename itself durable; failure here does not undo the write.
    const size_t slash = path_.rfind('/');
    const std::string dir = slash == std::string::npos ? "." : path_.substr(0, slash + 1);
    const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
      (void)::fsync(dfd);
      ::close(dfd);
    }
    return Status::Ok();
  }

 private:
  Status Flush() {
    size_t done = 0;
    while (done < buf_.size()) {
      const ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Errorf("{}: write failed: {}", path_, std::strerror(errno));
      }
      done += static_cast<size_t>(n);
    }
    buf_.clear();
    return Status::Ok();
  }

  std::string path_, tmp_;
  std::string buf_;
  int fd_ = -1;
  bool opened_ = false, committed_ = false;
  uint64_t written_ = 0;
};

// Serializes values into a byte string (metadata is small next to tensor data).
class Encoder {
 public:
  template <typename T>
  void Put(T v) {
    out_.append(reinterpret_cast<const char*>(&v), sizeof(T));
  }
  void PutString(const std::string& s) {
    Put<uint64_t>(s.size());
    out_ += s;
  }

  // Checks that `v`'s payload matches its declared type and range, then writes it.
  Status PutValue(const GgufValue& v, const std::string& key) {
    auto bad = [&](std::string_view why) {
      return Errorf("key '{}': {} (type id {})", key, why, static_cast<uint32_t>(v.type));
    };
    auto uint_in = [&](uint64_t max, auto tag) -> Status {
      const auto* u = std::get_if<uint64_t>(&v.v);
      if (!u) return bad("value does not hold an unsigned integer");
      if (*u > max) return bad(fmt::format("value {} out of range", *u));
      Put(static_cast<decltype(tag)>(*u));
      return Status::Ok();
    };
    auto int_in = [&](int64_t lo, int64_t hi, auto tag) -> Status {
      const auto* i = std::get_if<int64_t>(&v.v);
      if (!i) return bad("value does not hold a signed integer");
      if (*i < lo || *i > hi) return bad(fmt::format("value {} out of range", *i));
      Put(static_cast<decltype(tag)>(*i));
      return Status::Ok();
    };
    switch (v.type) {
      case GgufType::kU8:
        return uint_in(0xff, uint8_t{});
      case GgufType::kU16:
        return uint_in(0xffff, uint16_t{});
      case GgufType::kU32:
        return uint_in(0xffffffffu, uint32_t{});
      case GgufType::kU64:
        return uint_in(std::numeric_limits<uint64_t>::max(), uint64_t{});
      case GgufType::kI8:
        return int_in(-128, 127, int8_t{});
      case GgufType::kI16:
        return int_in(-32768, 32767, int16_t{});
      case GgufType::kI32:
        return int_in(std::numeric_limits<int32_t>::min(), std::numeric_limits<int32_t>::max(),
                      int32_t{});
      case GgufType::kI64:
        return int_in(std::numeric_limits<int64_t>::min(), std::numeric_limits<int64_t>::max(),
                      int64_t{});
      case GgufType::kF32:
      case GgufType::kF64: {
        const auto* d = std::get_if<double>(&v.v);
        if (!d) return bad("value does not hold a float");
        if (v.type == GgufType::kF32) {
          Put(static_cast<float>(*d));
        } else {
          Put(*d);
        }
        return Status::Ok();
      }
      case GgufType::kBool: {
        const auto* b = std::get_if<bool>(&v.v);
        if (!b) return bad("value does not hold a bool");
        Put<uint8_t>(*b ? 1 : 0);
        return Status::Ok();
      }
      case GgufType::kString: {
        const auto* s = std::get_if<std::string>(&v.v);
        if (!s) return bad("value does not hold a string");
        PutString(*s);
        return Status::Ok();
      }
      case GgufType::kArray: {
        const auto* a = std::get_if<std::vector<GgufValue>>(&v.v);
        if (!a) return bad("value does not hold an array");
        Put(static_cast<uint32_t>(v.array_type));
        Put<uint64_t>(a->size());
        for (const auto& item : *a) {
          if (item.type != v.array_type) return bad("array element of a different type");
          LUMEN_RETURN_IF_ERROR(PutValue(item, key));
        }
        return Status::Ok();
      }
    }
    return bad("unknown value type");
  }

  const std::string& bytes() const { return out_; }

 private:
  std::string out_;
};

template <typename T>
GgufValue Scalar(GgufType type, T v) {
  GgufValue g;
  g.type = type;
  g.v = v;
  return g;
}

}  // namespace

void GgufWriter::SetValue(const std::string& key, GgufValue value) {
  for (auto& kv : kv_) {
    if (kv.first == key) {
      kv.second = std::move(value);
      return;
    }
  }
  kv_.emplace_back(key, std::move(value));
}

void GgufWriter::SetU32(const std::string& key, uint32_t v) {
  SetValue(key, Scalar(GgufType::kU32, uint64_t{v}));
}
void GgufWriter::SetI32(const std::string& key, int32_t v) {
  SetValue(key, Scalar(GgufType::kI32, int64_t{v}));
}
void GgufWriter::SetF32(const std::string& key, float v) {
  SetValue(key, Scalar(GgufType::kF32, double{v}));
}
void GgufWriter::SetBool(const std::string& key, bool v) {
  SetValue(key, Scalar(GgufType::kBool, v));
}
void GgufWriter::SetString(const std::string& key, std::string v) {
  SetValue(key, Scalar(GgufType::kString, std::move(v)));
}

namespace {
template <typename T, typename S>
GgufValue ArrayOf(GgufType et, const std::vector<T>& v) {
  GgufValue g;
  g.type = GgufType::kArray;
  g.array_type = et;
  std::vector<GgufValue> items;
  items.reserve(v.size());
  for (const auto& x : v) items.push_back(Scalar(et, static_cast<S>(x)));
  g.v = std::move(items);
  return g;
}
}  // namespace

void GgufWriter::SetStringArray(const std::string& key, const std::vector<std::string>& v) {
  SetValue(key, ArrayOf<std::string, std::string>(GgufType::kString, v));
}
void GgufWriter::SetF32Array(const std::string& key, const std::vector<float>& v) {
  SetValue(key, ArrayOf<float, double>(GgufType::kF32, v));
}
void GgufWriter::SetI32Array(const std::string& key, const std::vector<int32_t>& v) {
  SetValue(key, ArrayOf<int32_t, int64_t>(GgufType::kI32, v));
}

Status GgufWriter::AddTensor(const std::string& name, DType dtype,
                             const std::vector<int64_t>& shape, std::string data) {
  if (!ValidUtf8(name)) return Errorf("tensor '{}': name is not valid UTF-8", name);
  for (const auto& t : tensors_) {
    if (t.name == name) return Errorf("tensor '{}': duplicate tensor name", name);
  }
  if (!GgmlFromDType(dtype)) {
    return Errorf("tensor '{}': dtype {} has no GGUF type", name, Name(dtype));
  }
  if (shape.empty() || shape.size() > static_cast<size_t>(kMaxDims)) {
    return Errorf("tensor '{}': rank {} is not in 1..{}", name, shape.size(), kMaxDims);
  }
  uint64_t rows = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] <= 0) return Errorf("tensor '{}': dimension {} is {}", name, i, shape[i]);
    if (i + 1 < shape.size()) {
      if (rows > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(shape[i]))
        return Errorf("tensor '{}': size overflows", name);
      rows *= static_cast<uint64_t>(shape[i]);
    }
  }
  const auto row_bytes = RowBytes(dtype, shape.back());
  if (!row_bytes) {
    return Errorf("tensor '{}': innermost dimension {} is not a multiple of the {} block size {}",
                  name, shape.back(), Name(dtype), Info(dtype).block_elems);
  }
  if (*row_bytes != 0 && rows > std::numeric_limits<uint64_t>::max() / *row_bytes)
    return Errorf("tensor '{}': size overflows", name);
  const uint64_t want = rows * *row_bytes;
  if (data.size() != want) {
    return Errorf("tensor '{}': got {} bytes of data, shape {} of {} needs {}", name, data.size(),
                  fmt::format("[{}]", fmt::join(shape, ", ")), Name(dtype), want);
  }
  tensors_.push_back(Pending{name, dtype, shape, std::move(data)});
  return Status::Ok();
}

Status GgufWriter::Write(const std::string& path, uint32_t alignment) const {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0) {
    return Errorf("{}: alignment {} is not a nonzero power of two", path, alignment);
  }
  // A non-default alignment must be recorded in the file, or readers would
  // look for the data at 32-byte boundaries.
  std::vector<std::pair<std::string, GgufValue>> kv = kv_;
  bool have_alignment = false;
  for (const auto& [key, value] : kv) {
    if (key != "general.alignment") continue;
    have_alignment = true;
    if (value.AsInt() != static_cast<int64_t>(alignment)) {
      return Errorf("{}: key 'general.alignment' disagrees with the write alignment {}", path,
                    alignment);
    }
  }
  if (!have_alignment && alignment != 32) {
    kv.emplace_back("general.alignment", Scalar(GgufType::kU32, uint64_t{alignment}));
  }

  Encoder e;
  e.Put(kMagic);
  e.Put<uint32_t>(3);
  e.Put<uint64_t>(tensors_.size());
  e.Put<uint64_t>(kv.size());
  for (const auto& [key, value] : kv) {
    if (!ValidUtf8(key)) return Errorf("{}: key '{}' is not valid UTF-8", path, key);
    e.PutString(key);
    e.Put(static_cast<uint32_t>(value.type));
    LUMEN_RETURN_IF_ERROR(e.PutValue(value, key).WithContext(path));
  }
  uint64_t cursor = 0;
  for (const auto& t : tensors_) {
    cursor = (cursor + alignment - 1) / alignment * alignment;
    e.PutString(t.name);
    e.Put(static_cast<uint32_t>(t.shape.size()));
    for (auto it = t.shape.rbegin(); it != t.shape.rend(); ++it) e.Put<uint64_t>(*it);
    e.Put(*GgmlFromDType(t.dtype));
    e.Put<uint64_t>(cursor);
    cursor += t.data.size();
  }

  AtomicFileWriter f(path);
  LUMEN_RETURN_IF_ERROR(f.Open());
  LUMEN_RETURN_IF_ERROR(f.Append(e.bytes().data(), e.bytes().size()));
  auto pad = [&](uint64_t to) { return f.AppendZeros((to - f.written() % to) % to); };
  LUMEN_RETURN_IF_ERROR(pad(alignment));
  for (const auto& t : tensors_) {
    LUMEN_RETURN_IF_ERROR(f.Append(t.data.data(), t.data.size()));
    LUMEN_RETURN_IF_ERROR(pad(alignment));
  }
  return f.Commit();
}

}  // namespace lumen::formats
