#include "lumen/core/buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <system_error>
#include <thread>
#include <utility>
#include <vector>

namespace lumen {

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  data_ = std::aligned_alloc(kAlign, rounded);
  if (!data_) throw std::bad_alloc();
  std::memset(data_, 0, rounded);
}

AlignedBuffer AlignedBuffer::ZeroedOnTouch(size_t bytes) {
  AlignedBuffer b;
  if (bytes == 0) return b;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  b.data_ = p;  // page-aligned
  b.size_ = bytes;
  b.mapped_ = true;
  return b;
}

void AlignedBuffer::Free() {
  if (mapped_)
    munmap(data_, size_);
  else
    std::free(data_);
}

AlignedBuffer::~AlignedBuffer() { Free(); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      mapped_(std::exchange(o.mapped_, false)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    Free();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    mapped_ = std::exchange(o.mapped_, false);
  }
  return *this;
}

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
// Threads that read a copied file (ReadParallel).
constexpr size_t kReadThreads = 4;

// MemAvailable from /proc/meminfo in bytes; 0 when unreadable.
size_t MemAvailable() {
  const int fd = ::open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  char buf[4096];
  const ssize_t n = ::read(fd, buf, sizeof(buf) - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  const char* p = std::strstr(buf, "MemAvailable:");
  return p ? size_t(std::strtoull(p + 13, nullptr, 10)) * 1024 : 0;
}

bool ForcedMap() {
  const char* v = std::getenv("LUMEN_MMAP");
  return v && *v && std::strcmp(v, "0") != 0;
}

// The first failure of a read: errno (0: none) and the byte it stopped at.
struct ReadError {
  int err = 0;
  size_t at = 0;
  bool shrank = false;  // pread returned 0 before the end
};

// Bytes [b, e) of fd into dst + b.
ReadError ReadRange(int fd, uint8_t* dst, size_t b, size_t e) {
  for (size_t done = b; done < e;) {
    const ssize_t n = ::pread(fd, dst + done, e - done, static_cast<off_t>(done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return {n < 0 ? errno : EIO, done, n == 0};
    done += static_cast<size_t>(n);
  }
  return {};
}

// The whole file into dst in pieces of whole huge pages, one thread each
// (up to kReadThreads): the copy's cost is mostly the kernel zeroing and
// faulting in fresh huge pages, which a KVM guest pays again to its host
// when the memory was never touched or was given back (0.3 GB/s on one
// thread there, 0.55 on two: docs/reference/performance.md, "Loading").
// The earliest failure by offset.
ReadError ReadParallel(int fd, uint8_t* dst, size_t size) {
  const size_t hw = std::max(1u, std::thread::hardware_concurrency());
  const size_t pieces = std::min({kReadThreads, hw, (size + kHugePage - 1) / kHugePage});
  if (pieces <= 1) return ReadRange(fd, dst, 0, size);
  const size_t per = (size / pieces + kHugePage - 1) / kHugePage * kHugePage;
  std::vector<ReadError> errs(pieces);
  {
    std::vector<std::jthread> threads;
    threads.reserve(pieces - 1);
    const auto piece = [&](size_t i) {
      errs[i] = ReadRange(fd, dst, std::min(size, i * per), std::min(size, (i + 1) * per));
    };
    for (size_t i = 1; i < pieces; ++i) {
      try {
        threads.emplace_back(piece, i);
      } catch (const std::system_error&) {  // no thread to be had: read it here
        piece(i);
      }
    }
    piece(0);
  }
  for (const ReadError& e : errs)
    if (e.err != 0) return e;
  return {};
}

}  // namespace

Result<MappedFile> MappedFile::Open(const std::string& path, Residency r) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Errorf("{}: cannot open: {}", path, std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int e = errno;
    ::close(fd);
    return Errorf("{}: cannot stat: {}", path, std::strerror(e));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Errorf("{}: not a regular file", path);
  }
  MappedFile m;
  m.path_ = path;
  m.size_ = static_cast<size_t>(st.st_size);
  if (r == Residency::kAuto) {
    const bool copy = m.size_ >= kCopyMinBytes && !ForcedMap() && m.size_ <= MemAvailable() / 2;
    r = copy ? Residency::kCopy : Residency::kMap;
  }
  if (m.size_ > 0 && r == Residency::kCopy) {
    // Room to align the start to a huge page; the kernel backs aligned 2 MiB
    // ranges of a MADV_HUGEPAGE region with huge pages as they are touched.
    const size_t len = (m.size_ + kHugePage - 1) / kHugePage * kHugePage + kHugePage;
    void* base = ::mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base != MAP_FAILED) {
      m.map_base_ = base;
      m.map_len_ = len;
      auto* p = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(base) + kHugePage - 1) /
                                           kHugePage * kHugePage);
      ::madvise(p, len - kHugePage, MADV_HUGEPAGE);  // a hint: 4 KiB pages if refused
      if (const ReadError e = ReadParallel(fd, p, m.size_); e.err != 0) {
        ::close(fd);
        return Errorf("{}: read failed at byte {} of {}: {}", path, e.at, m.size_,
                      e.shrank ? "file shrank while reading" : std::strerror(e.err));
      }
      ::mprotect(base, len, PROT_READ);
      m.data_ = p;
      m.copied_ = true;
      ::close(fd);
      return m;
    }
    // No anonymous memory for a copy: the mapping below still works.
  }
  if (m.size_ > 0) {
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return Errorf("{}: cannot mmap {} bytes: {}", path, m.size_, std::strerror(e));
    }
    m.data_ = p;
    m.map_base_ = p;
    m.map_len_ = m.size_;
  }
  ::close(fd);
  return m;
}

bool MappedFile::MapPrefixFromFile(size_t bytes) {
  const auto page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  const size_t len = std::min(bytes, size_) / page * page;
  if (!copied_ || len <= prefix_mapped_) return true;
  const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  struct stat st {};
  void* p = MAP_FAILED;
  if (::fstat(fd, &st) == 0 && static_cast<size_t>(st.st_size) == size_)
    p = ::mmap(nullptr, len, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return false;
  // The file changed since it was read (or the mapping cannot take the
  // copy's place): keep the copy.
  if (std::memcmp(p, data_, len) != 0 ||
      ::mremap(p, len, len, MREMAP_MAYMOVE | MREMAP_FIXED, data_) == MAP_FAILED) {
    ::munmap(p, len);
    return false;
  }
  // The comparison faulted the pages in; a private file mapping nobody wrote
  // to refills them from the file, so dropping them loses nothing.
  ::madvise(data_, len, MADV_DONTNEED);
  prefix_mapped_ = len;
  return true;
}

bool MappedFile::RewriteInPlace(size_t offset, size_t len,
                                const std::function<void(uint8_t*)>& fn) {
  if (!copied_ || len == 0 || offset < prefix_mapped_ || offset > size_ || len > size_ - offset)
    return false;
  // Whole 2 MiB pages where the copy has them: changing the protection of
  // part of a huge page splits it into 4 KiB pages, and the decode then
  // streams those (Zen 5, 1B Q4_0, one thread: 25 against 33 tok/s until
  // khugepaged merges them again, session 23). Clamped to the copy.
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  auto* p = static_cast<uint8_t*>(data_) + offset;
  const auto first = reinterpret_cast<uintptr_t>(data_) + prefix_mapped_;
  const auto last = reinterpret_cast<uintptr_t>(data_) + size_;
  const uintptr_t lo =
      std::max(reinterpret_cast<uintptr_t>(p) / kHuge * kHuge, first / page * page);
  const uintptr_t hi = std::min((reinterpret_cast<uintptr_t>(p) + len + kHuge - 1) / kHuge * kHuge,
                                (last + page - 1) / page * page);
  if (::mprotect(reinterpret_cast<void*>(lo), hi - lo, PROT_READ | PROT_WRITE) != 0) return false;
  fn(p);
  ::mprotect(reinterpret_cast<void*>(lo), hi - lo, PROT_READ);
  return true;
}

void MappedFile::Release() {
  if (map_base_) ::munmap(map_base_, map_len_);  // the remapped prefix lies inside
  data_ = map_base_ = nullptr;
  size_ = map_len_ = prefix_mapped_ = 0;
  copied_ = false;
}

MappedFile::~MappedFile() { Release(); }

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      map_base_(std::exchange(o.map_base_, nullptr)),
      map_len_(std::exchange(o.map_len_, 0)),
      copied_(std::exchange(o.copied_, false)),
      prefix_mapped_(std::exchange(o.prefix_mapped_, 0)),
      path_(std::move(o.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    map_base_ = std::exchange(o.map_base_, nullptr);
    map_len_ = std::exchange(o.map_len_, 0);
    copied_ = std::exchange(o.copied_, false);
    prefix_mapped_ = std::exchange(o.prefix_mapped_, 0);
    path_ = std::move(o.path_);
  }
  return *this;
}

Result<std::string> ReadFile(const std::string& path) {
  LUMEN_ASSIGN_OR_RETURN(MappedFile m, MappedFile::Open(path, Residency::kMap));
  return std::string(reinterpret_cast<const char*>(m.data()), m.size());
}

Status WriteFileAtomic(const std::string& path, std::string_view bytes) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Errorf("{}: cannot create: {}", tmp, std::strerror(errno));
  size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      const int e = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      return Errorf("{}: write failed: {}", path, std::strerror(e));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return Errorf("{}: fsync/close failed: {}", path, std::strerror(e));
  }
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int e = errno;
    ::unlink(tmp.c_str());
    return Errorf("{}: rename failed: {}", path, std::strerror(e));
  }
  return Status::Ok();
}

}  // namespace lumen
