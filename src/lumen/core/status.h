// Status and Result<T>: how anything a user can cause reports failure.
//
// A Status is OK or carries one message that names the input and the reason,
// e.g. "model.gguf: tensor 'blk.0.attn_q.weight': offset 1234: data runs past the
// end of the file (size 1000)". Context is prepended as the error travels up
// (WithContext), so the outermost caller prints one line that says where and why.
// Programming errors use LUMEN_CHECK (check.h) instead.
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <variant>

#include <fmt/format.h>

namespace lumen {

class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  static Status Ok() { return Status(); }

  bool ok() const { return !message_.has_value(); }
  const std::string& message() const {
    static const std::string kOk = "OK";
    return message_ ? *message_ : kOk;
  }

  // Returns this error with "context: " in front; OK stays OK.
  Status WithContext(std::string_view context) const& {
    if (ok()) return *this;
    return Status(fmt::format("{}: {}", context, *message_));
  }

 private:
  friend Status Error(std::string message);
  explicit Status(std::string message) : message_(std::move(message)) {}
  std::optional<std::string> message_;
};

// An error with a plain message.
inline Status Error(std::string message) { return Status(std::move(message)); }

// An error with a fmt-formatted message: Errorf("tensor '{}': bad rank {}", name, r).
template <typename... Args>
Status Errorf(fmt::format_string<Args...> f, Args&&... args) {
  return Error(fmt::format(f, std::forward<Args>(args)...));
}

// A value or the Status that explains why there is none.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT: implicit by design
    if (std::get<Status>(v_).ok()) v_ = Error("internal: Result built from an OK Status");
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

  Result WithContext(std::string_view context) && {
    if (ok()) return std::move(*this);
    return std::get<Status>(v_).WithContext(context);
  }

 private:
  std::variant<T, Status> v_;
};

}  // namespace lumen

#define LUMEN_CONCAT_INNER_(a, b) a##b
#define LUMEN_CONCAT_(a, b) LUMEN_CONCAT_INNER_(a, b)

// Returns the Status from the enclosing function if `expr` is an error.
#define LUMEN_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::lumen::Status lumen_status_ = (expr);        \
    if (!lumen_status_.ok()) return lumen_status_; \
  } while (0)

// `LUMEN_ASSIGN_OR_RETURN(auto x, MakeX());` declares x or returns the error.
// Variadic so that braced initializers with commas may appear in the expression.
#define LUMEN_ASSIGN_OR_RETURN(lhs, ...) \
  LUMEN_ASSIGN_OR_RETURN_IMPL_(LUMEN_CONCAT_(lumen_result_, __COUNTER__), lhs, __VA_ARGS__)
#define LUMEN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, ...) \
  auto tmp = (__VA_ARGS__);                         \
  if (!tmp.ok()) return tmp.status();               \
  lhs = std::move(tmp).value()
