#include "lumen/serve/train_jobs.h"

#include <fcntl.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>
#include <set>

#include <fmt/format.h>

#include "lumen/serve/web_ui.h"

namespace lumen::serve {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace {

constexpr size_t kLogTail = 2048;

int64_t UnixNow() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool Fail(ApiError* err, int status, std::string param, std::string message) {
  err->status = status;
  err->param = std::move(param);
  err->message = std::move(message);
  return false;
}

// True when `p` is `root` or inside it (both canonical).
bool IsUnder(const fs::path& p, const fs::path& root) {
  auto [r, q] = std::mismatch(root.begin(), root.end(), p.begin(), p.end());
  return r == root.end();
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return std::string(s);
}

// The host name of a Host header value ("[::1]:8080" -> "[::1]", "a:1" -> "a").
std::string HostName(std::string_view host) {
  if (!host.empty() && host.front() == '[') {
    const size_t close = host.find(']');
    return Lower(host.substr(0, close == std::string_view::npos ? host.size() : close + 1));
  }
  return Lower(host.substr(0, host.find(':')));
}

bool IsLoopbackName(const std::string& h) {
  return h == "localhost" || h == "[::1]" || h.rfind("127.", 0) == 0;
}

std::string ReadTail(const fs::path& file, size_t n) {
  std::ifstream f(file, std::ios::binary);
  if (!f) return {};
  f.seekg(0, std::ios::end);
  const std::streamoff end = f.tellg();
  const std::streamoff start = end > std::streamoff(n) ? end - std::streamoff(n) : 0;
  f.seekg(start);
  std::string s(static_cast<size_t>(end - start), '\0');
  f.read(s.data(), static_cast<std::streamsize>(s.size()));
  s.resize(static_cast<size_t>(f.gcount()));
  if (start > 0) {  // from the first whole line
    const size_t nl = s.find('\n');
    s.erase(0, nl == std::string::npos ? 0 : nl + 1);
  }
  return s;
}

// Fields of POST /lumen/runs beyond name, data and method: the flag, and the
// range of an integer or a number.
struct IntField {
  const char* key;
  const char* flag;
  int64_t lo, hi;
};
struct NumField {
  const char* key;
  const char* flag;
  double lo, hi;
  bool lo_open;
};
constexpr IntField kIntFields[] = {
    {"iters", "--iters", 1, 10'000'000},
    {"epochs", "--epochs", 1, 10'000},
    {"batch_size", "--batch-size", 1, 4096},
    {"grad_accum", "--grad-accum", 1, 4096},
    {"rank", "--rank", 1, 4096},
    {"steps_per_report", "--steps-per-report", 1, 1'000'000},
    {"steps_per_eval", "--steps-per-eval", 0, 10'000'000},
    {"save_every", "--save-every", 0, 10'000'000},
    {"max_seq_len", "--max-seq-len", 1, 1 << 20},
    {"seed", "--seed", 0, int64_t(1) << 53},
    {"threads", "--threads", 1, 1024},
};
constexpr NumField kNumFields[] = {
    {"lr", "--lr", 0, 1, true},
    {"lambda", "--lambda", 0, 1e4, false},
    {"beta", "--beta", 0, 1e4, true},
    {"alpha", "--alpha", 0, 1e6, true},
};
constexpr const char* kMethods[] = {"sft", "dpo", "orpo", "simpo", "ipo", "hinge"};

}  // namespace

bool ParseTrainJobRequest(const nlohmann::ordered_json& body, const TrainJobsOptions& o,
                          TrainJobSpec* out, ApiError* err) {
  if (o.runs_dir.empty())
    return Fail(err, 403, "",
                "starting a run needs lumen serve --runs DIR (where runs are written)");
  if (o.train_data_dir.empty())
    return Fail(err, 403, "data",
                "data: starting a run needs lumen serve --train-data DIR (the directory whose "
                "subdirectories runs may read)");
  if (!body.is_object())
    return Fail(err, 400, "", "body: must be a JSON object {name, data, method, ...}");

  std::set<std::string> allowed = {"name", "data", "method", "lambda_schedule"};
  for (const auto& f : kIntFields) allowed.insert(f.key);
  for (const auto& f : kNumFields) allowed.insert(f.key);
  for (const auto& [k, v] : body.items()) {
    if (!allowed.count(k)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
      return Fail(err, 400, k, fmt::format("{}: unknown field (allowed: {})", k, list));
    }
  }

  // name: a new directory directly under --runs.
  if (!body.contains("name") || !body["name"].is_string())
    return Fail(err, 400, "name", "name: required, a string");
  const std::string name = body["name"].get<std::string>();
  if (!IsValidRunName(name))
    return Fail(err, 400, "name",
                fmt::format("name: must be one path component of [A-Za-z0-9._-] (at most 200), "
                            "not . or .., got {}",
                            nlohmann::json(name).dump()));
  std::error_code ec;
  const fs::path runs = fs::canonical(o.runs_dir, ec);
  if (ec) return Fail(err, 500, "", fmt::format("--runs {}: {}", o.runs_dir, ec.message()));
  const fs::path run_dir = runs / name;
  if (fs::symlink_status(run_dir, ec).type() != fs::file_type::not_found)
    return Fail(err, 409, "name",
                fmt::format("name: a run '{}' already exists under --runs", name));

  // data: a directory under --train-data holding train.jsonl.
  if (!body.contains("data") || !body["data"].is_string() ||
      body["data"].get<std::string>().empty())
    return Fail(err, 400, "data", "data: required, a directory under --train-data");
  const std::string data = body["data"].get<std::string>();
  const fs::path data_root = fs::canonical(o.train_data_dir, ec);
  if (ec)
    return Fail(err, 500, "", fmt::format("--train-data {}: {}", o.train_data_dir, ec.message()));
  const fs::path given(data);
  const fs::path data_dir = fs::canonical(given.is_absolute() ? given : data_root / given, ec);
  if (ec || !IsUnder(data_dir, data_root) || !fs::is_directory(data_dir, ec))
    return Fail(err, 400, "data",
                fmt::format("data: {} is not a directory under --train-data {}",
                            nlohmann::json(data).dump(), data_root.string()));
  if (!fs::is_regular_file(data_dir / "train.jsonl", ec))
    return Fail(err, 400, "data",
                fmt::format("data: {} holds no train.jsonl", nlohmann::json(data).dump()));

  std::string method = "sft";
  if (body.contains("method")) {
    const auto& m = body["method"];
    if (!m.is_string() || std::find(std::begin(kMethods), std::end(kMethods),
                                    m.get<std::string>()) == std::end(kMethods))
      return Fail(
          err, 400, "method",
          fmt::format("method: one of sft, dpo, orpo, simpo, ipo, hinge, got {}", m.dump()));
    method = m.get<std::string>();
  }

  TrainJobSpec spec;
  spec.name = name;
  spec.out_dir = run_dir.string();
  spec.data_dir = data_dir.string();
  spec.params =
      ojson{{"data", data_dir.lexically_relative(data_root).string()}, {"method", method}};
  spec.args = {"train"};
  for (const auto& a : o.model_args) spec.args.push_back(a);
  for (const std::string& a : {std::string("--data"), data_dir.string(), std::string("--method"),
                               method, std::string("--out"), run_dir.string()})
    spec.args.push_back(a);

  for (const auto& f : kIntFields) {
    if (!body.contains(f.key)) continue;
    const auto& v = body[f.key];
    const bool integral =
        v.is_number_integer() || (v.is_number_float() && std::isfinite(v.get<double>()) &&
                                  v.get<double>() == std::floor(v.get<double>()));
    const double d = v.is_number() ? v.get<double>() : std::nan("");
    if (!integral || d < double(f.lo) || d > double(f.hi))
      return Fail(err, 400, f.key,
                  fmt::format("{}: an integer in [{}, {}], got {}", f.key, f.lo, f.hi, v.dump()));
    const int64_t n = static_cast<int64_t>(d);
    spec.params[f.key] = n;
    spec.args.push_back(f.flag);
    spec.args.push_back(std::to_string(n));
  }
  if (body.contains("iters") && body.contains("epochs"))
    return Fail(err, 400, "epochs", "epochs: give iters or epochs, not both");
  for (const auto& f : kNumFields) {
    if (!body.contains(f.key)) continue;
    const auto& v = body[f.key];
    const double d = v.is_number() ? v.get<double>() : std::nan("");
    if (!std::isfinite(d) || (f.lo_open ? d <= f.lo : d < f.lo) || d > f.hi)
      return Fail(err, 400, f.key,
                  fmt::format("{}: a number in {}{}, {}], got {}", f.key, f.lo_open ? "(" : "[",
                              f.lo, f.hi, v.dump()));
    spec.params[f.key] = d;
    spec.args.push_back(f.flag);
    spec.args.push_back(fmt::format("{}", d));
  }
  if (body.contains("lambda_schedule")) {
    const auto& v = body["lambda_schedule"];
    if (!v.is_string() || (v != "static" && v != "adaptive"))
      return Fail(err, 400, "lambda_schedule",
                  fmt::format("lambda_schedule: static or adaptive, got {}", v.dump()));
    spec.params["lambda_schedule"] = v;
    spec.args.push_back("--lambda-schedule");
    spec.args.push_back(v.get<std::string>());
  }
  *out = std::move(spec);
  return true;
}

bool CheckSameOrigin(std::string_view method, std::string_view origin, std::string_view host,
                     std::string_view sec_fetch_site, std::string_view content_type,
                     std::string_view bind_host, ApiError* err) {
  const std::string site = Lower(Trim(sec_fetch_site));
  if (!site.empty() && site != "same-origin" && site != "none")
    return Fail(err, 403, "",
                fmt::format("cross-origin request refused (Sec-Fetch-Site: {}): {} here only "
                            "from this server's own page",
                            site, method));
  const std::string host_name = HostName(Trim(host));
  const std::string bind = Lower(bind_host);
  const bool any_host = bind.empty() || bind == "0.0.0.0" || bind == "::" || bind == "[::]";
  if (!host_name.empty() && !any_host && !IsLoopbackName(host_name) && host_name != bind &&
      host_name != "[" + bind + "]")
    return Fail(err, 403, "",
                fmt::format("Host '{}' is not this server's address (a DNS-rebinding page?)",
                            std::string(host)));
  const std::string o = Lower(Trim(origin));
  if (!o.empty()) {
    const std::string h = Lower(Trim(host));
    if (o != "http://" + h && o != "https://" + h)
      return Fail(err, 403, "",
                  fmt::format("cross-origin request refused (Origin: {}): {} here only from "
                              "this server's own page",
                              std::string(origin), method));
  }
  if (method == "POST") {
    const std::string ct = Lower(Trim(content_type.substr(0, content_type.find(';'))));
    if (ct != "application/json")
      return Fail(err, 415, "",
                  fmt::format("Content-Type: must be application/json, got '{}'",
                              std::string(content_type)));
  }
  return true;
}

TrainJobs::TrainJobs(TrainJobsOptions opts) : opts_(std::move(opts)) {}

TrainJobs::~TrainJobs() { Shutdown(); }

ojson TrainJobs::JobJson(const Job& j) const {
  std::string state = "running";
  if (!j.running) {
    if (j.cancel_requested && (j.exit_code == 0 || j.signal == SIGINT))
      state = "cancelled";
    else if (j.exit_code == 0)
      state = "finished";
    else
      state = "failed";
  }
  const auto end = j.running ? std::chrono::steady_clock::now() : j.ended;
  ojson out = {
      {"name", j.spec.name},
      {"state", state},
      {"pid", j.pid},
      {"exit_code", !j.running && j.signal == 0 ? ojson(j.exit_code) : ojson(nullptr)},
      {"signal", j.signal ? ojson(j.signal) : ojson(nullptr)},
      {"cancel_requested", j.cancel_requested},
      {"started_unix", j.started_unix},
      {"ended_unix", j.running ? ojson(nullptr) : ojson(j.ended_unix)},
      {"seconds", std::chrono::duration<double>(end - j.started).count()},
      {"params", j.spec.params},
  };
  std::string cmd = "lumen";
  for (const auto& a : j.spec.args) cmd += " " + a;
  out["command"] = cmd;
  std::ifstream latest(fs::path(j.spec.out_dir) / "checkpoints" / "latest");
  std::string ck;
  if (latest && std::getline(latest, ck) && !ck.empty())
    out["checkpoint"] = ck;
  else
    out["checkpoint"] = nullptr;
  out["log_tail"] = ReadTail(fs::path(j.spec.out_dir) / "train.log", kLogTail);
  return out;
}

bool TrainJobs::Start(const nlohmann::ordered_json& body, ojson* job, ApiError* err) {
  TrainJobSpec spec;
  if (!ParseTrainJobRequest(body, opts_, &spec, err)) return false;
  std::unique_lock lk(mu_);
  if (stopping_) return Fail(err, 503, "", "the server is shutting down");
  int running = 0;
  for (const auto& [n, j] : jobs_) running += j->running;
  if (running >= opts_.max_running) {
    err->retry_after = 10;
    return Fail(
        err, 429, "",
        fmt::format("at most {} training runs at once; cancel one or wait", opts_.max_running));
  }
  if (jobs_.count(spec.name))
    return Fail(err, 409, "name", fmt::format("name: a run '{}' was already started", spec.name));
  // mkdir is the exclusive claim on the name.
  if (::mkdir(spec.out_dir.c_str(), 0755) != 0) {
    if (errno == EEXIST)
      return Fail(err, 409, "name",
                  fmt::format("name: a run '{}' already exists under --runs", spec.name));
    return Fail(err, 500, "", fmt::format("{}: {}", spec.out_dir, std::strerror(errno)));
  }
  const std::string log_path = (fs::path(spec.out_dir) / "train.log").string();
  const int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  int err_pipe[2] = {-1, -1};
  if (log_fd < 0 || null_fd < 0 || ::pipe2(err_pipe, O_CLOEXEC) != 0) {
    const int e = errno;
    for (int fd : {log_fd, null_fd, err_pipe[0], err_pipe[1]})
      if (fd >= 0) ::close(fd);
    return Fail(err, 500, "", fmt::format("{}: {}", log_path, std::strerror(e)));
  }

  auto j = std::make_shared<Job>();
  j->spec = std::move(spec);
  j->started = std::chrono::steady_clock::now();
  j->started_unix = UnixNow();

  // Everything the child touches is prepared here: after fork() in a
  // threaded process it may only make async-signal-safe calls.
  auto argv_store = std::make_shared<std::vector<std::string>>();
  argv_store->push_back(opts_.exe);
  for (const auto& a : j->spec.args) argv_store->push_back(a);
  auto argv = std::make_shared<std::vector<char*>>();
  for (auto& a : *argv_store) argv->push_back(a.data());
  argv->push_back(nullptr);
  const long open_max = std::min<long>(::sysconf(_SC_OPEN_MAX), 65536);
  const pid_t parent = ::getpid();

  // The waiter thread forks the child (PR_SET_PDEATHSIG fires when the thread
  // that forked goes away: this one lives exactly as long as the child) and
  // reaps it.
  std::promise<pid_t> forked;
  auto forked_f = forked.get_future();
  waiters_.emplace_back([this, j, argv_store, argv, log_fd, null_fd, err_pipe, open_max, parent,
                         forked = std::move(forked)]() mutable {
    const pid_t pid = ::fork();
    const int fork_errno = errno;
    if (pid == 0) {
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      struct sigaction dfl = {};
      dfl.sa_handler = SIG_DFL;
      sigemptyset(&dfl.sa_mask);
      for (int s : {SIGINT, SIGTERM, SIGPIPE, SIGCHLD}) sigaction(s, &dfl, nullptr);
      setpgid(0, 0);  // a terminal's Ctrl-C reaches the server, which forwards it once
      prctl(PR_SET_PDEATHSIG, SIGINT);
      if (getppid() != parent) _exit(1);
      dup2(null_fd, 0);
      dup2(log_fd, 1);
      dup2(log_fd, 2);
      // Every other descriptor (sockets, model files) closes at exec.
#ifdef SYS_close_range
      if (syscall(SYS_close_range, 3u, ~0u, 4u /* CLOSE_RANGE_CLOEXEC */) != 0)
#endif
        for (int fd = 3; fd < open_max; ++fd)
          if (fd != err_pipe[1]) close(fd);
      execv((*argv)[0], argv->data());
      const int e = errno;
      [[maybe_unused]] ssize_t w = write(err_pipe[1], &e, sizeof e);
      _exit(127);
    }
    if (pid > 0) setpgid(pid, pid);
    for (int fd : {log_fd, null_fd, err_pipe[1]}) ::close(fd);
    forked.set_value(pid < 0 ? -fork_errno : pid);  // < 0: -errno
    if (pid < 0) return;
    // Wait without reaping, mark the job ended, then reap: the pid cannot be
    // reused while Cancel() may still signal it.
    siginfo_t info = {};
    while (::waitid(P_PID, static_cast<id_t>(pid), &info, WEXITED | WNOWAIT) != 0 &&
           errno == EINTR) {
    }
    {
      std::lock_guard g(mu_);
      j->running = false;
      j->ended = std::chrono::steady_clock::now();
      j->ended_unix = UnixNow();
      if (info.si_code == CLD_EXITED)
        j->exit_code = info.si_status;
      else
        j->signal = info.si_status;
    }
    int st = 0;
    while (::waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
  });
  const pid_t pid = forked_f.get();
  if (pid < 0) {
    ::close(err_pipe[0]);
    return Fail(err, 500, "", fmt::format("fork: {}", std::strerror(-pid)));
  }
  j->pid = pid;
  // The exec's outcome: EOF when it succeeded (the pipe closed at exec).
  int exec_errno = 0;
  ssize_t got;
  while ((got = ::read(err_pipe[0], &exec_errno, sizeof exec_errno)) < 0 && errno == EINTR) {
  }
  ::close(err_pipe[0]);
  jobs_[j->spec.name] = j;
  order_.push_back(j->spec.name);
  if (got == sizeof exec_errno)
    return Fail(err, 500, "", fmt::format("exec {}: {}", opts_.exe, std::strerror(exec_errno)));
  *job = JobJson(*j);
  return true;
}

bool TrainJobs::Cancel(const std::string& name, ojson* job, ApiError* err) {
  std::lock_guard lk(mu_);
  auto it = jobs_.find(name);
  if (it == jobs_.end())
    return Fail(err, 404, "name",
                fmt::format("name: no run '{}' was started by this server", name));
  Job& j = *it->second;
  if (!j.running) {
    *job = JobJson(j);
    return Fail(err, 409, "name",
                fmt::format("name: run '{}' has already ended ({})", name,
                            (*job)["state"].get<std::string>()));
  }
  ::kill(j.pid, SIGINT);
  j.cancel_requested = true;
  *job = JobJson(j);
  return true;
}

ojson TrainJobs::List() const {
  std::lock_guard lk(mu_);
  ojson list = ojson::array();
  for (const auto& n : order_) list.push_back(JobJson(*jobs_.at(n)));
  return list;
}

ojson TrainJobs::Find(const std::string& name) const {
  std::lock_guard lk(mu_);
  auto it = jobs_.find(name);
  return it == jobs_.end() ? ojson(nullptr) : JobJson(*it->second);
}

void TrainJobs::Shutdown(std::chrono::seconds grace) {
  auto any_running = [this] {
    for (const auto& [n, j] : jobs_)
      if (j->running) return true;
    return false;
  };
  {
    std::lock_guard lk(mu_);
    stopping_ = true;
    for (auto& [n, j] : jobs_)
      if (j->running && !j->cancel_requested) {
        ::kill(j->pid, SIGINT);
        j->cancel_requested = true;
      }
  }
  const auto deadline = std::chrono::steady_clock::now() + grace;
  for (;;) {
    {
      std::lock_guard lk(mu_);
      if (!any_running()) break;
      if (std::chrono::steady_clock::now() > deadline) {
        for (auto& [n, j] : jobs_)
          if (j->running) ::kill(j->pid, SIGKILL);
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::vector<std::thread> ws;
  {
    std::lock_guard lk(mu_);
    ws.swap(waiters_);
  }
  for (auto& w : ws)
    if (w.joinable()) w.join();
}

}  // namespace lumen::serve
