// TrainJobs: `lumen train` runs started from the web app's training watch
// (POST /lumen/runs, DELETE /lumen/runs/{name}; docs/reference/server-api.md,
// "Web app endpoints"). Each job is a child process: fork/exec of the running
// binary (/proc/self/exe) as `lumen train [MODEL] --data D --method M --out
// RUNS/NAME ...`, in its own process group, stdout and stderr to
// RUNS/NAME/train.log. A thread per job forks it and waits for it (no zombies);
// the child gets SIGINT if that thread (so the server) dies first.
//
// Confinement: NAME is one path component ([A-Za-z0-9._-]) naming a directory
// that does not exist yet under --runs; the data directory must resolve
// (symlinks followed) to a directory under --train-data holding train.jsonl.
// Without --train-data (or --runs) starting a run is refused.
//
// Cancel sends SIGINT: the trainer finishes its step, writes a checkpoint and
// exits 0. Shutdown() sends SIGINT to every running job and waits for them
// (SIGKILL after a deadline).
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/serve/api_error.h"

namespace lumen::serve {

struct TrainJobsOptions {
  std::string runs_dir;                 // --runs; empty: no jobs
  std::string train_data_dir;           // --train-data; empty: no jobs
  std::string exe = "/proc/self/exe";   // the binary the child runs
  std::vector<std::string> model_args;  // for the child: [MODEL] [--tokenizer T]
  int max_running = 4;                  // more at once: 429
};

// A validated POST /lumen/runs body: the run's name, directory and the child's
// argv (without argv[0]).
struct TrainJobSpec {
  std::string name;
  std::string out_dir;            // RUNS/NAME (RUNS canonical)
  std::string data_dir;           // canonical, under --train-data
  std::vector<std::string> args;  // "train", [MODEL...], "--data", ...
  nlohmann::ordered_json params;  // the request's fields, resolved
};

// Validates a request body against the options; on failure fills *err (400
// naming the field, 403 when starting runs is off, 409 when the run exists).
bool ParseTrainJobRequest(const nlohmann::ordered_json& body, const TrainJobsOptions& opts,
                          TrainJobSpec* out, ApiError* err);

class TrainJobs {
 public:
  explicit TrainJobs(TrainJobsOptions opts);
  ~TrainJobs();  // Shutdown()
  TrainJobs(const TrainJobs&) = delete;
  TrainJobs& operator=(const TrainJobs&) = delete;

  const TrainJobsOptions& options() const { return opts_; }
  // Starts a job: the run directory and its train.log are created, the child
  // forked; false (and *err) when the body is invalid, too many jobs run, the
  // server is stopping or the exec failed.
  bool Start(const nlohmann::ordered_json& body, nlohmann::ordered_json* job, ApiError* err);
  // SIGINT to a running job; 404 for an unknown name, 409 when it has ended.
  bool Cancel(const std::string& name, nlohmann::ordered_json* job, ApiError* err);
  // Every job started by this server, oldest first.
  nlohmann::ordered_json List() const;
  // The job named `name` as JSON, or null.
  nlohmann::ordered_json Find(const std::string& name) const;
  // SIGINT to every running job, wait up to `grace` for them, SIGKILL the rest
  // and reap them. Further Start() calls are refused. Safe to call repeatedly.
  void Shutdown(std::chrono::seconds grace = std::chrono::seconds(60));

 private:
  struct Job {
    TrainJobSpec spec;
    pid_t pid = -1;
    bool running = true;
    bool cancel_requested = false;
    int exit_code = -1;  // when it exited normally
    int signal = 0;      // when a signal ended it
    int64_t started_unix = 0;
    int64_t ended_unix = 0;
    std::chrono::steady_clock::time_point started;
    std::chrono::steady_clock::time_point ended;
  };
  nlohmann::ordered_json JobJson(const Job& j) const;  // mu_ held

  TrainJobsOptions opts_;
  mutable std::mutex mu_;
  std::map<std::string, std::shared_ptr<Job>> jobs_;
  std::vector<std::string> order_;
  std::vector<std::thread> waiters_;
  bool stopping_ = false;
};

// Whether a state-changing request (POST / DELETE under /lumen/) may come from
// where it came from: refused (403) when the browser says it is cross-site
// (Sec-Fetch-Site other than same-origin / none; an Origin that is not
// http(s)://<Host>), when Host is not a loopback name or `bind_host` (a DNS
// rebinding page; any Host is accepted when bound to 0.0.0.0 / ::), and a POST
// without a JSON Content-Type is a 415 (a plain cross-site form cannot send
// one). Requests without Origin / Sec-Fetch-Site (curl, scripts) pass.
bool CheckSameOrigin(std::string_view method, std::string_view origin, std::string_view host,
                     std::string_view sec_fetch_site, std::string_view content_type,
                     std::string_view bind_host, ApiError* err);

}  // namespace lumen::serve
