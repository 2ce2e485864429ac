#include "lumen/serve/response_store.h"

#include <cstdlib>

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

std::optional<nlohmann::ordered_json> ResponseStore::GetItem(const std::string& item_id) {
  std::string resp;
  long call = -1;
  if (item_id.starts_with("msg_") && item_id.size() > 4) {
    resp = "resp_" + item_id.substr(4);
  } else if (item_id.starts_with("fc_")) {
    const size_t us = item_id.rfind('_');
    if (us <= 3 || us + 1 >= item_id.size()) return std::nullopt;
    char* end = nullptr;
    call = std::strtol(item_id.c_str() + us + 1, &end, 10);
    if (*end != '\0' || call < 0) return std::nullopt;
    resp = "resp_" + item_id.substr(3, us - 3);
  } else {
    return std::nullopt;
  }
  auto conv = Get(resp);
  if (!conv || !conv->is_array() || conv->empty()) return std::nullopt;
  const nlohmann::ordered_json& reply = conv->back();  // the stored reply
  if (call < 0) return nlohmann::ordered_json{{"role", "assistant"}, {"content", reply["content"]}};
  if (!reply.contains("tool_calls") || size_t(call) >= reply["tool_calls"].size())
    return std::nullopt;
  return nlohmann::ordered_json{{"tool_call", reply["tool_calls"][size_t(call)]}};
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
