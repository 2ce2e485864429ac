#include "lumen/engine/stop.h"

#include <gtest/gtest.h>

namespace lumen::engine {
namespace {

// Feeds text one byte at a time and checks the emitted stream.
std::string Stream(StopMatcher& m, const std::string& text) {
  std::string out;
  for (char c : text) {
    out += m.Push(std::string(1, c));
    if (m.stopped()) return out;
  }
  return out + m.Flush();
}

TEST(StopMatcher, NeverEmitsPartOfAStopString) {
  StopMatcher m({"</end>", "STOP"});
  std::string seen;
  for (char c : std::string("abc </en")) {
    seen += m.Push(std::string(1, c));
    EXPECT_EQ(seen.find("</"), std::string::npos) << seen;  // held back
  }
  seen += m.Push("d> tail");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.matched(), "</end>");
  EXPECT_EQ(seen, "abc ");
}

TEST(StopMatcher, FalseAlarmIsReleased) {
  StopMatcher m({"STOP"});
  EXPECT_EQ(Stream(m, "ST is not STAR"), "ST is not STAR");
  EXPECT_FALSE(m.stopped());
}

TEST(StopMatcher, EarliestMatchWinsAcrossStrings) {
  StopMatcher m({"world", "lo w"});
  EXPECT_EQ(m.Push("hello world"), "hel");
  EXPECT_EQ(m.matched(), "lo w");
}

TEST(StopMatcher, NoStopsPassesThrough) {
  StopMatcher m({});
  EXPECT_EQ(m.Push("abc"), "abc");
  EXPECT_EQ(m.Flush(), "");
  StopMatcher e({""});  // empty stop strings are ignored
  EXPECT_EQ(e.Push("abc"), "abc");
}

}  // namespace
}  // namespace lumen::engine
