#include "lumen/serve/peer_socket.h"

#include <dirent.h>
#include <netdb.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>

namespace lumen::serve {
namespace {

// host and port of a socket address, numeric, as httplib writes them.
bool Numeric(const sockaddr_storage& a, socklen_t len, std::string* host, int* port) {
  char h[NI_MAXHOST], s[NI_MAXSERV];
  if (getnameinfo(reinterpret_cast<const sockaddr*>(&a), len, h, sizeof h, s, sizeof s,
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return false;
  *host = h;
  *port = std::atoi(s);
  return true;
}

}  // namespace

PeerSocket::PeerSocket(const std::string& remote_addr, int remote_port, int local_port) {
  DIR* d = opendir("/proc/self/fd");
  if (d == nullptr) return;
  while (const dirent* e = readdir(d)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    struct stat st {};
    if (fstat(int(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage peer{}, local{};
    socklen_t pl = sizeof peer, ll = sizeof local;
    if (getpeername(int(fd), reinterpret_cast<sockaddr*>(&peer), &pl) != 0 ||
        getsockname(int(fd), reinterpret_cast<sockaddr*>(&local), &ll) != 0)
      continue;
    std::string ph, lh;
    int pp = 0, lp = 0;
    if (Numeric(peer, pl, &ph, &pp) && Numeric(local, ll, &lh, &lp) && ph == remote_addr &&
        pp == remote_port && lp == local_port) {
      fd_ = int(fd);
      break;
    }
  }
  closedir(d);
}

bool PeerSocket::Closed() const {
  if (fd_ < 0) return false;
  char c;
  const ssize_t n = recv(fd_, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  if (n == 0) return true;  // the client's FIN: it sends no more, and reads no answer
  return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;  // a reset
}

}  // namespace lumen::serve
