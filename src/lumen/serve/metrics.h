// Metrics: request counters by endpoint and status, token counters, and
// latency histograms (time to first token, time between tokens), rendered in
// the Prometheus text exposition format for GET /metrics. Thread-safe.
#pragma once

#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace lumen::serve {

class Histogram {
 public:
  explicit Histogram(std::vector<double> bounds)
      : bounds_(std::move(bounds)), counts_(bounds_.size() + 1) {}
  void Observe(double v);
  // Appends the _bucket/_sum/_count lines for `name`.
  void Render(const std::string& name, std::string& out) const;
  double Quantile(double q) const;  // from the buckets (upper bound of the bucket)
  int64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<int64_t> counts_;  // per bucket, not cumulative; last is +Inf
  double sum_ = 0;
  int64_t count_ = 0;
};

class Metrics {
 public:
  Metrics();
  void CountRequest(const std::string& endpoint, int status);
  void AddTokens(int64_t prompt, int64_t completion);
  void ObserveTtft(double seconds);
  void ObserveInterToken(double seconds);

  struct Gauges {
    int queue_depth = 0, active_slots = 0, parallel = 0;
    double kv_bytes = 0, prompt_cache_bytes = 0, response_store_bytes = 0;
    double cache_hits = 0, cache_misses = 0, cached_tokens = 0;
    double uptime_seconds = 0;
  };
  std::string RenderPrometheus(const Gauges& g) const;

  int64_t requests_total() const;
  std::map<std::string, int64_t> requests_by_endpoint() const;

 private:
  mutable std::mutex mu_;
  std::map<std::pair<std::string, int>, int64_t> requests_;
  int64_t prompt_tokens_ = 0, completion_tokens_ = 0;
  Histogram ttft_, inter_token_;
};

}  // namespace lumen::serve
