#include "lumen/serve/web_ui.h"

#include <cmath>

#include <gtest/gtest.h>

namespace lumen::serve {
namespace {

TEST(WebUi, RunNamesAreSingleComponents) {
  EXPECT_TRUE(IsValidRunName("orpo-run_1.2"));
  for (const char* bad : {"", ".", "..", "a/b", "../x", "a\\b", "a b", "%2e%2e"})
    EXPECT_FALSE(IsValidRunName(bad)) << bad;
}

TEST(WebUi, PublicPathsAreOnlyTheBundle) {
  EXPECT_TRUE(IsWebUiPublicPath("/"));
  EXPECT_TRUE(IsWebUiPublicPath("/ui/app.js"));
  EXPECT_FALSE(IsWebUiPublicPath("/lumen/info"));
  EXPECT_FALSE(IsWebUiPublicPath("/v1/chat/completions"));
  EXPECT_FALSE(IsWebUiPublicPath("/uix"));
}

TEST(WebUi, CurveEvalIdentityAndKnots) {
  auto r = EvalCurveRequest(
      nlohmann::json::parse(R"({"curve": {"points": [[1, 1], [10, 10], [100, 100]]},
                                "x": [0.001, 0.5, 1, 42, 100]})"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const auto& y = (*r)["y"];
  const double xs[] = {0.001, 0.5, 1, 42, 100};
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR(y[i].get<double>(), xs[i], 1e-12 * xs[i]);
  EXPECT_EQ((*r)["knots"].size(), 3u);
  EXPECT_NEAR((*r)["knots"][2][1].get<double>(), 0.0, 1e-15);  // ln(100 / 100)
}

TEST(WebUi, CurveEvalPassesThroughThePoints) {
  auto r = EvalCurveRequest(nlohmann::json::parse(
      R"({"curve": {"points": [[0.01, 0.005], [1, 1.5], [10, 12], [50, 48], [100, 100]]},
          "x": [0.01, 1, 10, 50, 100]})"));
  ASSERT_TRUE(r.ok()) << r.status().message();
  const double ys[] = {0.005, 1.5, 12, 48, 100};
  for (size_t i = 0; i < 5; ++i) EXPECT_NEAR((*r)["y"][i].get<double>(), ys[i], 1e-9 * ys[i]);
}

TEST(WebUi, CurveEvalErrorsNameTheField) {
  auto bad = EvalCurveRequest(
      nlohmann::json::parse(R"({"curve": {"points": [[1, 5], [10, 2]]}, "x": [1]})"));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().rfind("curve.points[1]: y must not decrease", 0), 0u)
      << bad.status().message();
  auto no_x = EvalCurveRequest(nlohmann::json::parse(R"({"curve": [[1, 1], [100, 100]]})"));
  ASSERT_FALSE(no_x.ok());
  EXPECT_EQ(no_x.status().message().rfind("x:", 0), 0u);
  auto bad_x =
      EvalCurveRequest(nlohmann::json::parse(R"({"curve": [[1, 1], [100, 100]], "x": [1, 101]})"));
  ASSERT_FALSE(bad_x.ok());
  EXPECT_EQ(bad_x.status().message().rfind("x[1]: must be a number in (0, 100]", 0), 0u);
  auto no_curve = EvalCurveRequest(nlohmann::json::parse(R"({"x": [1]})"));
  ASSERT_FALSE(no_curve.ok());
  EXPECT_EQ(no_curve.status().message(), "curve: missing");
}

}  // namespace
}  // namespace lumen::serve
