#include "lumen/serve/response_store.h"

namespace lumen::serve {

void ResponseStore::Put(const std::string& id, nlohmann::ordered_json messages) {
  const size_t bytes =
      messages.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size() + id.size();
  std::lock_guard<std::mutex> lock(mu_);
  if (bytes > limits_.max_bytes || limits_.max_entries == 0) return;
  if (auto it = index_.find(id); it != index_.end()) {
    bytes_ -= it->second->bytes;
    order_.erase(it->second);
    index_.erase(it);
  }
  order_.push_back({id, std::move(messages), bytes, Clock::now()});
  index_[id] = std::prev(order_.end());
  bytes_ += bytes;
  EvictLocked();
}

std::optional<nlohmann::ordered_json> ResponseStore::Get(const std::string& id) {
  std::lock_guard<std::mutex> lock(mu_);
  EvictLocked();
  auto it = index_.find(id);
  if (it == index_.end()) return std::nullopt;
  return it->second->messages;
}

void ResponseStore::EvictLocked() {
  const auto now = Clock::now();
  while (!order_.empty() && (order_.size() > limits_.max_entries || bytes_ > limits_.max_bytes ||
                             now - order_.front().at > limits_.ttl)) {
    bytes_ -= order_.front().bytes;
    index_.erase(order_.front().id);
    order_.pop_front();
  }
}

size_t ResponseStore::entries() const {
  std::lock_guard<std::mutex> lock(mu_);
  return order_.size();
}

size_t ResponseStore::bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return bytes_;
}

}  // namespace lumen::serve
