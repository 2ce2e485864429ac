// StopMatcher: finds stop strings in streamed text and holds back any tail that
// could still become a stop string, so a stop string is never partly emitted.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace lumen::engine {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);

  // Adds text; returns what is safe to emit now. After a match, stopped() is
  // true and the returned text ends right before the stop string.
  std::string Push(std::string_view text);
  // End of generation: the held-back tail (empty after a stop).
  std::string Flush();
  bool stopped() const { return stopped_; }
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  std::string matched_;
  bool stopped_ = false;
};

}  // namespace lumen::engine
