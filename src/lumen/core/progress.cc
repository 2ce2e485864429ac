#include "lumen/core/progress.h"

#include <unistd.h>

#include <cstdio>

#include "lumen/core/log.h"

namespace lumen {

Progress::Progress(std::string label, int64_t total)
    : label_(std::move(label)),
      total_(total > 0 ? total : 1),
      tty_(::isatty(STDERR_FILENO) && GetLogLevel() <= LogLevel::kWarn),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { Draw(true); }

void Progress::Advance(int64_t delta) { Set(done_ + delta); }

void Progress::Set(int64_t done) {
  done_ = done < total_ ? done : total_;
  Draw(false);
}

void Progress::Draw(bool final) {
  if (GetLogLevel() > LogLevel::kInfo && !tty_) return;
  const auto now = std::chrono::steady_clock::now();
  const double frac = static_cast<double>(done_) / total_;
  const double secs = std::chrono::duration<double>(now - start_).count();
  if (tty_) {
    if (!final && now - last_draw_ < std::chrono::milliseconds(100)) return;
    last_draw_ = now;
    constexpr int kWidth = 30;
    const int filled = static_cast<int>(frac * kWidth);
    std::fprintf(stderr, "\r%s [%.*s%*s] %3d%% %.1fs%s", label_.c_str(), filled,
                 "##############################", kWidth - filled, "",
                 static_cast<int>(frac * 100), secs, final ? "\n" : "");
  } else {
    const int decile = static_cast<int>(frac * 10);
    if (decile == last_decile_ && !final) return;
    if (final && last_decile_ == 10) return;
    last_decile_ = final ? 10 : decile;
    std::fprintf(stderr, "%s: %d%% (%.1fs)\n", label_.c_str(), final ? 100 : decile * 10, secs);
  }
  std::fflush(stderr);
}

}  // namespace lumen
