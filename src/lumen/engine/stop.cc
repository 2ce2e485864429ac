#include "lumen/engine/stop.h"

#include <algorithm>

namespace lumen::engine {

StopMatcher::StopMatcher(std::vector<std::string> stops) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

std::string StopMatcher::Push(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  // Earliest full match wins.
  size_t best = std::string::npos;
  for (const auto& s : stops_) {
    const size_t at = pending_.find(s);
    if (at < best) {
      best = at;
      matched_ = s;
    }
  }
  if (best != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, best);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const auto& s : stops_) {
    const size_t max = std::min(s.size() - 1, pending_.size());
    for (size_t len = max; len > hold; --len) {
      if (std::string_view(pending_).substr(pending_.size() - len) ==
          std::string_view(s).substr(0, len)) {
        hold = len;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopMatcher::Flush() {
  std::string out;
  if (!stopped_) out.swap(pending_);
  return out;
}

}  // namespace lumen::engine
