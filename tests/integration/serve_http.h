// HTTP helpers for end-to-end tests of `lumen serve` (LUMEN_BINARY): a
// server process on an ephemeral port, one request per connection
// (de-chunked), and an SSE parser.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

namespace lumen::testing::http {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

// A running `lumen serve`; Stop() sends SIGTERM and returns the exit status.
class ServerProcess {
 public:
  explicit ServerProcess(std::vector<std::string> args) {
    int fds[2];
    if (pipe(fds) != 0) return;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(fds[1], 2);
      close(fds[0]);
      close(fds[1]);
      std::vector<std::string> all = {LUMEN_BINARY, "serve", "--port", "0"};
      all.insert(all.end(), args.begin(), args.end());
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      setenv("LUMEN_THREADS", "1", 1);
      unsetenv("LUMEN_API_KEY");
      execv(argv[0], argv.data());
      _exit(127);
    }
    close(fds[1]);
    err_fd_ = fds[0];
    // Read stderr until the listening line (or exit / timeout).
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline && port_ == 0) {
      pollfd p{err_fd_, POLLIN, 0};
      if (poll(&p, 1, 200) <= 0) continue;
      char buf[512];
      const ssize_t n = read(err_fd_, buf, sizeof buf);
      if (n <= 0) break;
      log_.append(buf, size_t(n));
      const auto at = log_.find("listening on http://127.0.0.1:");
      if (at != std::string::npos) {
        const auto end = log_.find('\n', at);
        if (end != std::string::npos) port_ = std::atoi(log_.c_str() + at + 30);
      }
    }
  }
  ~ServerProcess() {
    if (pid_ > 0 && !stopped_) Stop();
    if (err_fd_ >= 0) close(err_fd_);
  }
  int port() const { return port_; }
  const std::string& log() const { return log_; }
  // SIGTERM; returns the exit code (or -1 if killed by a signal / timeout).
  int Stop() {
    stopped_ = true;
    kill(pid_, SIGTERM);
    const auto deadline = Clock::now() + std::chrono::seconds(30);
    int status = 0;
    while (Clock::now() < deadline) {
      if (waitpid(pid_, &status, WNOHANG) == pid_)
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    return -1;
  }

 private:
  pid_t pid_ = -1;
  int err_fd_ = -1;
  int port_ = 0;
  bool stopped_ = false;
  std::string log_;
};

struct HttpResponse {
  int status = 0;
  std::string headers;  // raw, lower-cased names not normalized
  std::string body;     // de-chunked
  std::string Header(const std::string& name) const {
    std::string lower_h = headers, lower_n = name;
    for (auto& c : lower_h) c = char(std::tolower(static_cast<unsigned char>(c)));
    for (auto& c : lower_n) c = char(std::tolower(static_cast<unsigned char>(c)));
    const auto at = lower_h.find("\r\n" + lower_n + ":");
    if (at == std::string::npos) return "";
    auto v = headers.substr(at + 3 + name.size());
    v = v.substr(0, v.find("\r\n"));
    while (!v.empty() && v[0] == ' ') v.erase(0, 1);
    return v;
  }
  json Json() const { return json::parse(body, nullptr, false); }
};

inline int Connect(int port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

inline std::string Dechunk(const std::string& raw) {
  std::string out;
  size_t pos = 0;
  while (pos < raw.size()) {
    const size_t eol = raw.find("\r\n", pos);
    if (eol == std::string::npos) break;
    const size_t n = std::strtoul(raw.substr(pos, eol - pos).c_str(), nullptr, 16);
    if (n == 0) break;
    out += raw.substr(eol + 2, n);
    pos = eol + 2 + n + 2;
  }
  return out;
}

// One request on a fresh connection (Connection: close); reads to EOF.
inline HttpResponse Request(int port, const std::string& method, const std::string& path,
                            const std::string& body = "",
                            const std::vector<std::string>& headers = {}) {
  HttpResponse r;
  int fd = Connect(port);
  if (fd < 0) return r;
  std::string req = method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n";
  for (const auto& h : headers) req += h + "\r\n";
  if (method == "POST")
    req +=
        "Content-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  size_t sent = 0;
  while (sent < req.size()) {
    const ssize_t n = send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) break;
    sent += size_t(n);
  }
  std::string raw;
  char buf[16384];
  for (;;) {
    const ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n <= 0) break;
    raw.append(buf, size_t(n));
  }
  close(fd);
  const size_t hend = raw.find("\r\n\r\n");
  if (hend == std::string::npos) return r;
  r.headers = raw.substr(0, hend + 2);
  r.status = std::atoi(raw.c_str() + 9);
  r.body = raw.substr(hend + 4);
  if (r.Header("Transfer-Encoding") == "chunked") r.body = Dechunk(r.body);
  return r;
}

inline HttpResponse Post(int port, const std::string& path, const json& body,
                         const std::vector<std::string>& headers = {}) {
  return Request(port, "POST", path, body.dump(), headers);
}

struct SseEvent {
  std::string event;
  std::string data;
};

inline std::vector<SseEvent> ParseSse(const std::string& body) {
  std::vector<SseEvent> out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string block = body.substr(pos, end - pos);
    pos = end + 2;
    if (block.empty()) continue;
    SseEvent e;
    size_t lp = 0;
    while (lp < block.size()) {
      size_t le = block.find('\n', lp);
      if (le == std::string::npos) le = block.size();
      const std::string line = block.substr(lp, le - lp);
      if (line.rfind("event: ", 0) == 0) e.event = line.substr(7);
      if (line.rfind("data: ", 0) == 0) e.data = line.substr(6);
      lp = le + 1;
    }
    out.push_back(e);
  }
  return out;
}

// A chat completion request body: one user message, max_tokens, and the
// fields of extra.
inline json Chat(const std::string& text, int max_tokens, json extra = json::object()) {
  json b = {{"messages", {{{"role", "user"}, {"content", text}}}}, {"max_tokens", max_tokens}};
  b.update(extra);
  return b;
}

}  // namespace lumen::testing::http
