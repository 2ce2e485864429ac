#include "lumen/serve/metrics.h"

#include <fmt/format.h>

namespace lumen::serve {

void Histogram::Observe(double v) {
  size_t i = 0;
  while (i < bounds_.size() && v > bounds_[i]) ++i;
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Render(const std::string& name, std::string& out) const {
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", name, bounds_[i], cum);
  }
  cum += counts_.back();
  out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n{}_sum {}\n{}_count {}\n", name, cum, name, sum_,
                     name, count_);
}

double Histogram::Quantile(double q) const {
  if (count_ == 0) return 0;
  const double want = q * static_cast<double>(count_);
  int64_t cum = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cum += counts_[i];
    if (static_cast<double>(cum) >= want) return bounds_[i];
  }
  return bounds_.empty() ? 0 : bounds_.back();
}

Metrics::Metrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30}),
      inter_token_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1}) {}

void Metrics::CountRequest(const std::string& endpoint, int status) {
  std::lock_guard<std::mutex> lock(mu_);
  ++requests_[{endpoint, status}];
}

void Metrics::AddTokens(int64_t prompt, int64_t completion) {
  std::lock_guard<std::mutex> lock(mu_);
  prompt_tokens_ += prompt;
  completion_tokens_ += completion;
}

void Metrics::ObserveTtft(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  ttft_.Observe(s);
}

void Metrics::ObserveInterToken(double s) {
  std::lock_guard<std::mutex> lock(mu_);
  inter_token_.Observe(s);
}

int64_t Metrics::requests_total() const {
  std::lock_guard<std::mutex> lock(mu_);
  int64_t n = 0;
  for (const auto& [k, v] : requests_) n += v;
  return n;
}

std::map<std::string, int64_t> Metrics::requests_by_endpoint() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::map<std::string, int64_t> m;
  for (const auto& [k, v] : requests_) m[k.first] += v;
  return m;
}

std::string Metrics::RenderPrometheus(const Gauges& g) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string o;
  o += "# HELP lumen_requests_total HTTP requests by endpoint and status.\n";
  o += "# TYPE lumen_requests_total counter\n";
  for (const auto& [k, v] : requests_)
    o += fmt::format("lumen_requests_total{{endpoint=\"{}\",status=\"{}\"}} {}\n", k.first,
                     k.second, v);
  o += "# HELP lumen_prompt_tokens_total Prompt tokens of completed requests.\n";
  o += "# TYPE lumen_prompt_tokens_total counter\n";
  o += fmt::format("lumen_prompt_tokens_total {}\n", prompt_tokens_);
  o += "# HELP lumen_completion_tokens_total Generated tokens.\n";
  o += "# TYPE lumen_completion_tokens_total counter\n";
  o += fmt::format("lumen_completion_tokens_total {}\n", completion_tokens_);
  o += "# HELP lumen_time_to_first_token_seconds Time from request to first token.\n";
  o += "# TYPE lumen_time_to_first_token_seconds histogram\n";
  ttft_.Render("lumen_time_to_first_token_seconds", o);
  o += "# HELP lumen_time_per_output_token_seconds Time between consecutive tokens.\n";
  o += "# TYPE lumen_time_per_output_token_seconds histogram\n";
  inter_token_.Render("lumen_time_per_output_token_seconds", o);
  auto gauge = [&](const char* name, const char* help, double v) {
    o += fmt::format("# HELP {} {}\n# TYPE {} gauge\n{} {}\n", name, help, name, name, v);
  };
  gauge("lumen_queue_depth", "Requests waiting for a slot.", g.queue_depth);
  gauge("lumen_active_slots", "Slots generating.", g.active_slots);
  gauge("lumen_parallel_slots", "Configured slots (--parallel).", g.parallel);
  gauge("lumen_kv_bytes", "KV cache bytes of active slots.", g.kv_bytes);
  gauge("lumen_prompt_cache_bytes", "KV bytes held by the prompt cache.", g.prompt_cache_bytes);
  gauge("lumen_response_store_bytes", "Bytes held by the Responses store.", g.response_store_bytes);
  gauge("lumen_prompt_cache_hits", "Requests that reused a cached prefix.", g.cache_hits);
  gauge("lumen_prompt_cache_misses", "Requests without a cached prefix.", g.cache_misses);
  gauge("lumen_prompt_cache_tokens", "Prompt tokens served from the cache.", g.cached_tokens);
  gauge("lumen_uptime_seconds", "Seconds since start.", g.uptime_seconds);
  return o;
}

}  // namespace lumen::serve
