#include "lumen/core/buffer.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

namespace lumen {

AlignedBuffer::AlignedBuffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  data_ = std::aligned_alloc(kAlign, rounded);
  if (!data_) throw std::bad_alloc();
  std::memset(data_, 0, rounded);
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

Result<MappedFile> MappedFile::Open(const std::string& path) {
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
  if (m.size_ > 0) {
    void* p = ::mmap(nullptr, m.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int e = errno;
      ::close(fd);
      return Errorf("{}: cannot mmap {} bytes: {}", path, m.size_, std::strerror(e));
    }
    m.data_ = p;
  }
  ::close(fd);
  return m;
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(data_, size_);
}

MappedFile::MappedFile(MappedFile&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)),
      size_(std::exchange(o.size_, 0)),
      path_(std::move(o.path_)) {}

MappedFile& MappedFile::operator=(MappedFile&& o) noexcept {
  if (this != &o) {
    if (data_) ::munmap(data_, size_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
    path_ = std::move(o.path_);
  }
  return *this;
}

Result<std::string> ReadFile(const std::string& path) {
  LUMEN_ASSIGN_OR_RETURN(MappedFile m, MappedFile::Open(path));
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
