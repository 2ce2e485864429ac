// LUMEN_CHECK / LUMEN_DCHECK: abort with file:line on a broken invariant.
// Only for programming errors; anything a user can cause returns a Status.
#pragma once

#include <cstdio>
#include <cstdlib>

namespace lumen::detail {
[[noreturn]] inline void CheckFailed(const char* cond, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: LUMEN_CHECK failed: %s\n", file, line, cond);
  std::abort();
}
}  // namespace lumen::detail

#define LUMEN_CHECK(cond) \
  ((cond) ? (void)0 : ::lumen::detail::CheckFailed(#cond, __FILE__, __LINE__))
#ifdef NDEBUG
#define LUMEN_DCHECK(cond) ((void)0)
#else
#define LUMEN_DCHECK(cond) LUMEN_CHECK(cond)
#endif
