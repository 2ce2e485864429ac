// Levelled logging to stderr. The level is the one piece of global mutable state
// lumen allows (set once from --verbose / LUMEN_LOG=debug|info|warn|error).
#pragma once

#include <fmt/format.h>

#include <string_view>

namespace lumen {

enum class LogLevel { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3, kOff = 4 };

void SetLogLevel(LogLevel level);
LogLevel GetLogLevel();
void LogLine(LogLevel level, std::string_view msg);

template <typename... Args>
void Log(LogLevel level, fmt::format_string<Args...> f, Args&&... args) {
  if (level < GetLogLevel()) return;
  LogLine(level, fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace lumen

#define LUMEN_LOG_DEBUG(...) ::lumen::Log(::lumen::LogLevel::kDebug, __VA_ARGS__)
#define LUMEN_LOG_INFO(...) ::lumen::Log(::lumen::LogLevel::kInfo, __VA_ARGS__)
#define LUMEN_LOG_WARN(...) ::lumen::Log(::lumen::LogLevel::kWarn, __VA_ARGS__)
#define LUMEN_LOG_ERROR(...) ::lumen::Log(::lumen::LogLevel::kError, __VA_ARGS__)
