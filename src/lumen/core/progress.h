// Progress: reports long work (load, convert, quantize). On a terminal it
// redraws one bar line on stderr; otherwise it prints a plain line at each 10%.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace lumen {

class Progress {
 public:
  Progress(std::string label, int64_t total);
  ~Progress();  // finishes the line
  void Advance(int64_t delta = 1);
  void Set(int64_t done);

 private:
  void Draw(bool final);
  std::string label_;
  int64_t total_, done_ = 0;
  int last_decile_ = -1;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace lumen
