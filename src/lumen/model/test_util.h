// Test helpers shared by model/ and engine/ tests: fixture paths.
#pragma once

#include <cstdlib>
#include <string>

namespace lumen::testing_util {

// LUMEN_FIXTURES, else <source>/../shared/fixtures.
inline std::string FixturesDir() {
  if (const char* e = std::getenv("LUMEN_FIXTURES")) return e;
  return std::string(LUMEN_SOURCE_DIR) + "/../shared/fixtures";
}

inline std::string SourceDir() { return LUMEN_SOURCE_DIR; }

}  // namespace lumen::testing_util
