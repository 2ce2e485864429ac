#include "lumen/serve/train_jobs.h"

#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <gtest/gtest.h>

namespace lumen::serve {
namespace {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "lumen-jobs-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() { fs::remove_all(path); }
};

// runs/, data/good/train.jsonl, data/empty/, outside/train.jsonl and a
// symlink data/escape -> outside.
struct Layout {
  TempDir tmp;
  TrainJobsOptions opts;
  Layout() {
    fs::create_directories(tmp.path / "runs");
    fs::create_directories(tmp.path / "data/good");
    fs::create_directories(tmp.path / "data/empty");
    fs::create_directories(tmp.path / "outside");
    std::ofstream(tmp.path / "data/good/train.jsonl") << "{\"text\": \"x\"}\n";
    std::ofstream(tmp.path / "outside/train.jsonl") << "{\"text\": \"x\"}\n";
    fs::create_directory_symlink(tmp.path / "outside", tmp.path / "data/escape");
    opts.runs_dir = (tmp.path / "runs").string();
    opts.train_data_dir = (tmp.path / "data").string();
    opts.model_args = {"model.gguf"};
  }
  ApiError Refuse(const char* body_text) {
    TrainJobSpec spec;
    ApiError err;
    EXPECT_FALSE(ParseTrainJobRequest(ojson::parse(body_text), opts, &spec, &err)) << body_text;
    return err;
  }
};

TEST(TrainJobs, RequestBuildsTheTrainCommandLine) {
  Layout l;
  TrainJobSpec spec;
  ApiError err;
  ASSERT_TRUE(ParseTrainJobRequest(
      ojson::parse(R"({"name": "r1", "data": "good", "method": "orpo", "iters": 15,
                       "lr": 0.003, "batch_size": 4, "rank": 4, "lambda": 0.2,
                       "lambda_schedule": "adaptive", "steps_per_report": 1, "threads": 1})"),
      l.opts, &spec, &err))
      << err.message;
  const std::string runs = fs::canonical(l.tmp.path / "runs").string();
  const std::string data = fs::canonical(l.tmp.path / "data/good").string();
  const std::vector<std::string> want = {"train",
                                         "model.gguf",
                                         "--data",
                                         data,
                                         "--method",
                                         "orpo",
                                         "--out",
                                         runs + "/r1",
                                         "--iters",
                                         "15",
                                         "--batch-size",
                                         "4",
                                         "--rank",
                                         "4",
                                         "--steps-per-report",
                                         "1",
                                         "--threads",
                                         "1",
                                         "--lr",
                                         "0.003",
                                         "--lambda",
                                         "0.2",
                                         "--lambda-schedule",
                                         "adaptive"};
  EXPECT_EQ(spec.args, want);
  EXPECT_EQ(spec.params["data"], "good");
  // An absolute path under the root is accepted too.
  ASSERT_TRUE(ParseTrainJobRequest(ojson{{"name", "r2"}, {"data", data}}, l.opts, &spec, &err));
}

TEST(TrainJobs, RequestsAreConfinedAndValidated) {
  Layout l;
  struct Case {
    const char* body;
    int status;
    const char* param;
  } cases[] = {
      {R"({"name": "../x", "data": "good"})", 400, "name"},
      {R"({"name": "a/b", "data": "good"})", 400, "name"},
      {R"({"name": "..", "data": "good"})", 400, "name"},
      {R"({"data": "good"})", 400, "name"},
      {R"({"name": "r", "data": "../outside"})", 400, "data"},
      {R"({"name": "r", "data": "escape"})", 400, "data"},  // a symlink out of the root
      {R"({"name": "r", "data": "/etc"})", 400, "data"},
      {R"({"name": "r", "data": "empty"})", 400, "data"},  // no train.jsonl
      {R"({"name": "r", "data": "nope"})", 400, "data"},
      {R"({"name": "r", "data": "good", "method": "rlhf"})", 400, "method"},
      {R"({"name": "r", "data": "good", "iters": 0})", 400, "iters"},
      {R"({"name": "r", "data": "good", "iters": 1.5})", 400, "iters"},
      {R"({"name": "r", "data": "good", "iters": "10"})", 400, "iters"},
      {R"({"name": "r", "data": "good", "lr": 0})", 400, "lr"},
      {R"({"name": "r", "data": "good", "lr": 2})", 400, "lr"},
      {R"({"name": "r", "data": "good", "lambda": -1})", 400, "lambda"},
      {R"({"name": "r", "data": "good", "lambda_schedule": "wild"})", 400, "lambda_schedule"},
      {R"({"name": "r", "data": "good", "out": "/tmp/x"})", 400, "out"},
      {R"({"name": "r", "data": "good", "iters": 5, "epochs": 1})", 400, "epochs"},
  };
  for (const auto& c : cases) {
    const ApiError e = l.Refuse(c.body);
    EXPECT_EQ(e.status, c.status) << c.body << ": " << e.message;
    EXPECT_EQ(e.param, c.param) << c.body << ": " << e.message;
    EXPECT_EQ(e.message.rfind(std::string(c.param) + ":", 0), 0u) << e.message;
  }
  fs::create_directory(l.tmp.path / "runs/taken");
  EXPECT_EQ(l.Refuse(R"({"name": "taken", "data": "good"})").status, 409);
  l.opts.train_data_dir.clear();
  EXPECT_EQ(l.Refuse(R"({"name": "r", "data": "good"})").status, 403);
}

TEST(TrainJobs, SameOriginOnly) {
  ApiError e;
  const auto ok = [&](const char* method, const char* origin, const char* host, const char* site,
                      const char* ct, const char* bind = "127.0.0.1") {
    e = {};
    return CheckSameOrigin(method, origin, host, site, ct, bind, &e);
  };
  // curl / scripts: no Origin, no Sec-Fetch-Site.
  EXPECT_TRUE(ok("POST", "", "127.0.0.1:8080", "", "application/json"));
  EXPECT_TRUE(ok("POST", "", "", "", "application/json; charset=utf-8"));
  // The page itself.
  EXPECT_TRUE(
      ok("POST", "http://127.0.0.1:8080", "127.0.0.1:8080", "same-origin", "application/json"));
  EXPECT_TRUE(ok("DELETE", "http://localhost:8080", "localhost:8080", "same-origin", ""));
  EXPECT_TRUE(ok("DELETE", "http://[::1]:8080", "[::1]:8080", "", ""));
  // Another site's page, a form, a sandboxed frame, DNS rebinding.
  EXPECT_FALSE(
      ok("POST", "http://evil.example", "127.0.0.1:8080", "cross-site", "application/json"));
  EXPECT_EQ(e.status, 403);
  EXPECT_FALSE(ok("POST", "http://evil.example", "127.0.0.1:8080", "", "application/json"));
  EXPECT_FALSE(ok("POST", "null", "127.0.0.1:8080", "", "application/json"));
  EXPECT_FALSE(ok("DELETE", "http://localhost:3000", "127.0.0.1:8080", "same-site", ""));
  EXPECT_FALSE(ok("POST", "http://evil.example:8080", "evil.example:8080", "same-origin",
                  "application/json"));
  EXPECT_EQ(e.status, 403);
  EXPECT_FALSE(ok("POST", "", "127.0.0.1:8080", "", "application/x-www-form-urlencoded"));
  EXPECT_EQ(e.status, 415);
  EXPECT_FALSE(ok("POST", "", "127.0.0.1:8080", "", "text/plain"));
  EXPECT_EQ(e.status, 415);
  // Bound to every interface: any Host, still same origin.
  EXPECT_TRUE(ok("POST", "http://box.lan:8080", "box.lan:8080", "same-origin", "application/json",
                 "0.0.0.0"));
  EXPECT_FALSE(ok("POST", "http://evil.example", "box.lan:8080", "cross-site", "application/json",
                  "0.0.0.0"));
}

// A stand-in for `lumen train`: prints its arguments, runs until SIGINT, then
// "checkpoints" and exits 0; with data "fail", exits 3 at once.
fs::path FakeTrainer(const fs::path& dir) {
  const fs::path p = dir / "fake-train.sh";
  std::ofstream(p) << "#!/bin/sh\n"
                      "echo \"args: $*\"\n"
                      "case \"$*\" in *fail*) echo boom >&2; exit 3;; esac\n"
                      "out=''; prev=''\n"
                      "for a in \"$@\"; do [ \"$prev\" = --out ] && out=$a; prev=$a; done\n"
                      "trap 'mkdir -p $out/checkpoints; echo step-1 > $out/checkpoints/latest; "
                      "echo interrupted; exit 0' INT\n"
                      "while :; do sleep 0.05; done\n";
  fs::permissions(p, fs::perms::owner_all);
  return p;
}

ojson WaitEnded(TrainJobs& jobs, const std::string& name) {
  for (int i = 0; i < 400; ++i) {
    ojson j = jobs.Find(name);
    if (j["state"] != "running") return j;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return jobs.Find(name);
}

TEST(TrainJobs, StartCancelAndReap) {
  Layout l;
  fs::create_directories(l.tmp.path / "data/fail");
  std::ofstream(l.tmp.path / "data/fail/train.jsonl") << "{}\n";
  l.opts.exe = FakeTrainer(l.tmp.path).string();
  TrainJobs jobs(l.opts);
  ojson job;
  ApiError err;
  ASSERT_TRUE(jobs.Start(ojson{{"name", "long"}, {"data", "good"}, {"iters", 1000}}, &job, &err))
      << err.message;
  EXPECT_EQ(job["state"], "running");
  const pid_t pid = job["pid"].get<pid_t>();
  EXPECT_EQ(::getpgid(pid), pid);  // its own process group
  // The same name again: refused.
  EXPECT_FALSE(jobs.Start(ojson{{"name", "long"}, {"data", "good"}}, &job, &err));
  EXPECT_EQ(err.status, 409);
  // Let the child install its trap, then cancel.
  const fs::path log = l.tmp.path / "runs/long/train.log";
  for (int i = 0; i < 200; ++i) {
    std::ifstream f(log);
    std::string s((std::istreambuf_iterator<char>(f)), {});
    if (s.find("args:") != std::string::npos) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  ASSERT_TRUE(jobs.Cancel("long", &job, &err)) << err.message;
  EXPECT_TRUE(job["cancel_requested"].get<bool>());
  job = WaitEnded(jobs, "long");
  EXPECT_EQ(job["state"], "cancelled") << job.dump();
  EXPECT_EQ(job["exit_code"], 0);
  EXPECT_EQ(job["checkpoint"], "step-1");
  EXPECT_NE(job["log_tail"].get<std::string>().find("args: train model.gguf --data "),
            std::string::npos)
      << job["log_tail"];
  EXPECT_NE(job["log_tail"].get<std::string>().find("interrupted"), std::string::npos);
  // Cancelling an ended run, or an unknown one.
  EXPECT_FALSE(jobs.Cancel("long", &job, &err));
  EXPECT_EQ(err.status, 409);
  EXPECT_FALSE(jobs.Cancel("nope", &job, &err));
  EXPECT_EQ(err.status, 404);

  // A run that fails: its exit code and log.
  ASSERT_TRUE(jobs.Start(ojson{{"name", "bad"}, {"data", "fail"}}, &job, &err)) << err.message;
  job = WaitEnded(jobs, "bad");
  EXPECT_EQ(job["state"], "failed");
  EXPECT_EQ(job["exit_code"], 3);
  EXPECT_NE(job["log_tail"].get<std::string>().find("boom"), std::string::npos);

  // Shutdown interrupts what still runs, and every child is reaped.
  ASSERT_TRUE(jobs.Start(ojson{{"name", "left"}, {"data", "good"}}, &job, &err)) << err.message;
  const pid_t left = job["pid"].get<pid_t>();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  jobs.Shutdown(std::chrono::seconds(10));
  EXPECT_EQ(jobs.Find("left")["state"], "cancelled");
  for (pid_t p : {pid, left}) {
    errno = 0;
    EXPECT_EQ(::waitpid(p, nullptr, WNOHANG), -1);
    EXPECT_EQ(errno, ECHILD) << "pid " << p << " not reaped";
  }
  EXPECT_EQ(jobs.List().size(), 3u);
  EXPECT_FALSE(jobs.Start(ojson{{"name", "late"}, {"data", "good"}}, &job, &err));
  EXPECT_EQ(err.status, 503);
}

TEST(TrainJobs, ExecFailureIsReported) {
  Layout l;
  l.opts.exe = (l.tmp.path / "no-such-binary").string();
  TrainJobs jobs(l.opts);
  ojson job;
  ApiError err;
  EXPECT_FALSE(jobs.Start(ojson{{"name", "x"}, {"data", "good"}}, &job, &err));
  EXPECT_EQ(err.status, 500);
  EXPECT_NE(err.message.find("No such file"), std::string::npos) << err.message;
  EXPECT_EQ(WaitEnded(jobs, "x")["state"], "failed");
}

}  // namespace
}  // namespace lumen::serve
