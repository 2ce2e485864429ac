// Helpers for tests that run the lumen binary (LUMEN_BINARY): a run with its
// exit code, stdout and stderr; the fixtures folder; a per-process temp dir;
// and one HTTP request to `lumen serve MODEL`.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace lumen::testing {

struct CliRun {
  int code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};

inline std::string TempDir(const std::string& name) {
  namespace fs = std::filesystem;
  const std::string d =
      fs::temp_directory_path() / ("lumen_" + name + "_" + std::to_string(::getpid()));
  fs::create_directories(d);
  return d;
}

inline std::string Fixtures() {
  if (const char* e = std::getenv("LUMEN_FIXTURES")) return e;
  return std::string(LUMEN_SOURCE_DIR) + "/../shared/fixtures";
}

inline std::string SlurpFile(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `lumen ARGS` (a shell command line, so quote paths with spaces) with
// stdin from `input` (empty: /dev/null).
inline CliRun RunLumen(const std::string& args, const std::string& input = "") {
  const std::string dir = TempDir("cli");
  static int n = 0;
  const std::string tag = std::to_string(n++);
  const std::string err_path = dir + "/stderr" + tag + ".txt";
  std::string in_path = "/dev/null";
  if (!input.empty()) {
    in_path = dir + "/stdin" + tag + ".txt";
    std::ofstream(in_path, std::ios::binary) << input;
  }
  const std::string cmd =
      std::string(LUMEN_BINARY) + " " + args + " <" + in_path + " 2>" + err_path;
  CliRun r;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return r;
  char buf[4096];
  size_t got;
  while ((got = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, got);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.err = SlurpFile(err_path);
  return r;
}

// Counts the non-overlapping occurrences of `needle` in `hay`.
inline int Count(const std::string& hay, const std::string& needle) {
  int c = 0;
  for (size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1)) ++c;
  return c;
}

struct ServeResult {
  bool started = false;
  std::string log;       // the server's stderr
  std::string response;  // raw HTTP response (status line, headers, body)
  int exit_code = -1;
};

// Starts `lumen serve MODEL --port 0 EXTRA...` (MODEL "": the embedded one),
// POSTs `body` to `path` once, stops it with SIGTERM.
inline ServeResult ServeOnce(const std::string& model, const std::string& path,
                             const std::string& body, const std::vector<std::string>& extra = {}) {
  using Clock = std::chrono::steady_clock;
  ServeResult r;
  int fds[2];
  if (pipe(fds) != 0) return r;
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    setenv("LUMEN_THREADS", "1", 1);
    unsetenv("LUMEN_API_KEY");
    std::vector<std::string> args = {LUMEN_BINARY, "serve", "--port", "0"};
    if (!model.empty()) args.push_back(model);
    args.insert(args.end(), extra.begin(), extra.end());
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(LUMEN_BINARY, argv.data());
    _exit(127);
  }
  close(fds[1]);
  int port = 0;
  const auto deadline = Clock::now() + std::chrono::seconds(30);
  while (Clock::now() < deadline && port == 0) {
    pollfd pf{fds[0], POLLIN, 0};
    if (poll(&pf, 1, 200) <= 0) continue;
    char buf[512];
    const ssize_t n = read(fds[0], buf, sizeof buf);
    if (n <= 0) break;
    r.log.append(buf, size_t(n));
    const std::string key = "listening on http://127.0.0.1:";
    const auto at = r.log.find(key);
    if (at != std::string::npos && r.log.find('\n', at) != std::string::npos)
      port = std::atoi(r.log.c_str() + at + key.size());
  }
  if (port > 0) {
    r.started = true;
    const int s = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(uint16_t(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (connect(s, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      const std::string req = "POST " + path +
                              " HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                              "Connection: close\r\nContent-Length: " +
                              std::to_string(body.size()) + "\r\n\r\n" + body;
      (void)!write(s, req.data(), req.size());
      char buf[4096];
      ssize_t n;
      while ((n = read(s, buf, sizeof buf)) > 0) r.response.append(buf, size_t(n));
    }
    close(s);
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  char buf[512];
  ssize_t n;
  while ((n = read(fds[0], buf, sizeof buf)) > 0) r.log.append(buf, size_t(n));
  close(fds[0]);
  return r;
}

}  // namespace lumen::testing
