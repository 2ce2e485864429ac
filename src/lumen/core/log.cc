#include "lumen/core/log.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace lumen {
namespace {

LogLevel LevelFromEnv() {
  const char* e = std::getenv("LUMEN_LOG");
  if (!e) return LogLevel::kWarn;
  if (!std::strcmp(e, "debug")) return LogLevel::kDebug;
  if (!std::strcmp(e, "info")) return LogLevel::kInfo;
  if (!std::strcmp(e, "error")) return LogLevel::kError;
  if (!std::strcmp(e, "off")) return LogLevel::kOff;
  return LogLevel::kWarn;
}

std::atomic<LogLevel>& Level() {
  static std::atomic<LogLevel> level{LevelFromEnv()};
  return level;
}

}  // namespace

void SetLogLevel(LogLevel level) { Level().store(level); }
LogLevel GetLogLevel() { return Level().load(std::memory_order_relaxed); }

void LogLine(LogLevel level, std::string_view msg) {
  static const char* kTag[] = {"debug", "info", "warning", "error", ""};
  std::fprintf(stderr, "lumen: %s: %.*s\n", kTag[static_cast<int>(level)],
               static_cast<int>(msg.size()), msg.data());
}

}  // namespace lumen
