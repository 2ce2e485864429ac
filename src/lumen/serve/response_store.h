// ResponseStore: conversations of stored Responses-API responses, so a later
// request can continue with previous_response_id. Bounded by entry count,
// total bytes and age (TTL); the oldest entries go first. Thread-safe.
#pragma once

#include <chrono>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>

#include <nlohmann/json.hpp>

namespace lumen::serve {

struct ResponseStoreLimits {
  size_t max_entries = 1000;
  size_t max_bytes = size_t(64) << 20;
  std::chrono::seconds ttl{3600};
};

class ResponseStore {
 public:
  explicit ResponseStore(ResponseStoreLimits limits) : limits_(limits) {}
  // `messages`: the whole conversation (OpenAI chat form) including the reply.
  void Put(const std::string& id, nlohmann::ordered_json messages);
  std::optional<nlohmann::ordered_json> Get(const std::string& id);
  // An output item of a stored response, by the id the Responses writer gave
  // it: "msg_X" is the message of response "resp_X" (-> {"role":"assistant",
  // "content":...}), "fc_X_i" its i-th function call (-> {"tool_call":
  // {id, type, function}}). nullopt when unknown, expired or evicted.
  std::optional<nlohmann::ordered_json> GetItem(const std::string& item_id);
  size_t entries() const;
  size_t bytes() const;
  const ResponseStoreLimits& limits() const { return limits_; }

 private:
  using Clock = std::chrono::steady_clock;
  struct Entry {
    std::string id;
    nlohmann::ordered_json messages;
    size_t bytes;
    Clock::time_point at;
  };
  void EvictLocked();
  ResponseStoreLimits limits_;
  mutable std::mutex mu_;
  std::list<Entry> order_;  // oldest first
  std::unordered_map<std::string, std::list<Entry>::iterator> index_;
  size_t bytes_ = 0;
};

}  // namespace lumen::serve
