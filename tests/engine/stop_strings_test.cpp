// Stop strings split across tokens, checked on byte strings.
#include <gtest/gtest.h>

#include "engine/stop_strings.h"

namespace megactx {
namespace {

TEST(StopStrings, HoldsBackAPossibleStartAndTrimsTheMatch) {
  StopStringMatcher matcher({"END", "<|x|>"}, false);
  auto r = matcher.push("abcE");
  EXPECT_EQ(r.text, "abc");  // "E" may start "END"
  EXPECT_FALSE(r.stopped);
  r = matcher.push("N");
  EXPECT_EQ(r.text, "");
  r = matcher.push("Dtail");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "");
  EXPECT_EQ(r.matched, "END");
}

TEST(StopStrings, ReleasesHeldTextWhenItCannotMatch) {
  StopStringMatcher matcher({"<|x|>"}, false);
  EXPECT_EQ(matcher.push("a<|").text, "a");
  EXPECT_EQ(matcher.push("y").text, "<|y");
  EXPECT_EQ(matcher.push("<").text, "");
  EXPECT_EQ(matcher.flush(), "<");
}

TEST(StopStrings, IncludeStopStringAndEarliestMatch) {
  StopStringMatcher include({"cd", "bcx"}, true);
  auto r = include.push("abcde");
  EXPECT_TRUE(r.stopped);
  EXPECT_EQ(r.text, "abcd");
  StopStringMatcher earliest({"cd", "bc"}, false);
  r = earliest.push("abcd");
  EXPECT_EQ(r.matched, "bc");
  EXPECT_EQ(r.text, "a");
}

}  // namespace
}  // namespace megactx
