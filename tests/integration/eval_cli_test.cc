// `lumen perplexity` and `lumen fit` end to end: the printed perplexity equals
// the numpy golden (tests/goldens/perplexity), --base reports KL 0 against
// itself and a small KL against a Q8_0 convert, fit prints the hand-checkable
// byte counts, exits 2 when the configuration does not fit, and caches the
// measured bandwidth; bad input gives clear errors.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <string>

#include <nlohmann/json.hpp>

#include "lumen_cli.h"

namespace lumen {
namespace {

namespace fs = std::filesystem;
using testing::RunLumen;

const std::string kGolden = std::string(LUMEN_SOURCE_DIR) + "/tests/goldens/perplexity";

// The number after `label` on its line ("PPL: 2.631212 +/- ...").
double Number(const std::string& out, const std::string& label) {
  std::smatch m;
  const std::regex re(label + R"(\s*([-+0-9.eE]+))");
  if (!std::regex_search(out, m, re)) {
    ADD_FAILURE() << "no '" << label << "' in:\n" << out;
    return -1;
  }
  return std::stod(m[1]);
}

TEST(EvalCli, PerplexityMatchesTheGolden) {
  std::ifstream f(kGolden + "/golden.json");
  const auto g = nlohmann::json::parse(f);
  const auto& c = g["cases"][0];  // ctx 128, stride 64
  auto r = RunLumen("perplexity --file " + kGolden + "/text.txt --ctx 128 --kv-type f32");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("windows: 4 of ctx 128, stride 64; 272 tokens scored"), std::string::npos)
      << r.out;
  EXPECT_NEAR(Number(r.out, "PPL:"), c["ppl"].get<double>(), 1e-5);
  EXPECT_NEAR(Number(r.out, R"(PPL: [0-9.]+ \+/-)"), c["ppl_se"].get<double>(), 1e-5);
  // Progress on stderr, one line per window.
  EXPECT_EQ(testing::Count(r.err, " tokens scored, PPL "), 4) << r.err;
  EXPECT_NE(r.err.find("[4/4] 272 tokens scored"), std::string::npos) << r.err;
}

TEST(EvalCli, PerplexityAgainstABaseJudgesAQuantization) {
  const std::string dir = testing::TempDir("eval_cli");
  const std::string q8 = dir + "/q8.gguf";
  const std::string model = std::string(LUMEN_SOURCE_DIR) + "/models/stories260K.gguf";
  ASSERT_EQ(RunLumen("convert " + model + " " + q8 + " --type q8_0").code, 0);
  const std::string text = " --file " + kGolden + "/text.txt --ctx 128";
  auto self = RunLumen("perplexity " + model + text + " --base " + model);
  ASSERT_EQ(self.code, 0) << self.err;
  EXPECT_EQ(Number(self.out, R"(KL\(base \|\| model\): mean)"), 0.0) << self.out;
  EXPECT_EQ(Number(self.out, "top-1 agreement:"), 100.0);
  auto q = RunLumen("perplexity " + q8 + text + " --base " + model);
  ASSERT_EQ(q.code, 0) << q.err;
  const double kl = Number(q.out, R"(KL\(base \|\| model\): mean)");
  EXPECT_GT(kl, 0.0);
  EXPECT_LT(kl, 2e-3) << q.out;
  EXPECT_GE(Number(q.out, "top-1 agreement:"), 95.0);
  EXPECT_EQ(Number(q.out, "base PPL:"), Number(self.out, "PPL:"));
  fs::remove_all(dir);
}

TEST(EvalCli, PerplexityErrors) {
  auto r = RunLumen("perplexity --file /nonexistent/text.txt");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("lumen: error: --file /nonexistent/text.txt: cannot be read"),
            std::string::npos)
      << r.err;
  r = RunLumen("perplexity --file " + kGolden + "/text.txt --ctx 16 --stride 17");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--stride 17 exceeds --ctx 16"), std::string::npos) << r.err;
  const std::string empty = testing::TempDir("eval_cli") + "/empty.txt";
  std::ofstream(empty).close();
  r = RunLumen("perplexity --file " + empty);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("at least 2 are needed"), std::string::npos) << r.err;
  r = RunLumen("perplexity");
  EXPECT_EQ(r.code, 106);  // --file is required: CLI11's RequiredError
  EXPECT_NE(r.err.find("--file is required"), std::string::npos) << r.err;
}

TEST(EvalCli, FitPrintsTheBytesAndTheVerdict) {
  // stories260K: 5 layers, 4 KV heads x 8 = 32 elements per row, no window:
  // f16 KV per token = 5 * 2 * 64 = 640 bytes; 512 tokens = 327680.
  auto r = RunLumen("fit --membw 10 --memory-budget 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("KV per token: 640 bytes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("KV per sequence: 327680 bytes"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("fits: yes"), std::string::npos);
  EXPECT_EQ(Number(r.out, "largest context that fits:"), 512);
  EXPECT_NE(r.out.find("bandwidth: 10.00 GB/s (given by --membw)"), std::string::npos);
  EXPECT_GT(Number(r.out, R"(decode \(predicted\):)"), 0);
  // q8_0 needs Dh % 32 == 0: stories260K's Dh is 8.
  r = RunLumen("fit --kv-type q8_0 --no-speed --memory-budget 1");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("multiple of 32"), std::string::npos) << r.err;
  // 1 MB holds the ~1 MB of weights but not the caches: exit 2, no context fits.
  r = RunLumen("fit --no-speed --memory-budget 0.001 --ctx 256 -P 4");
  EXPECT_EQ(r.code, 2) << r.out << r.err;
  EXPECT_NE(r.out.find("fits: no"), std::string::npos) << r.out;
  EXPECT_EQ(Number(r.out, "largest context that fits:"), 0);
  r = RunLumen("fit --no-speed --ctx 100000");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("--ctx 100000 exceeds the model's context of 512"), std::string::npos)
      << r.err;
}

TEST(EvalCli, FitMeasuresTheBandwidthOnceAndCachesIt) {
  const std::string xdg = testing::TempDir("eval_cli_xdg");
  fs::remove_all(xdg + "/lumen");
  // The child inherits this process's environment.
  auto run = [&](const std::string& args) {
    return RunLumen("fit --memory-budget 1 -t 2 " + args);
  };
  ::setenv("XDG_CACHE_HOME", xdg.c_str(), 1);
  auto first = run("");
  auto second = run("");
  auto again = run("--remeasure");
  ::unsetenv("XDG_CACHE_HOME");
  ASSERT_EQ(first.code, 0) << first.err;
  EXPECT_NE(first.out.find("(measured, cached in " + xdg + "/lumen/membw.json)"), std::string::npos)
      << first.out;
  EXPECT_TRUE(fs::exists(xdg + "/lumen/membw.json"));
  EXPECT_NE(second.out.find("(cached in " + xdg + "/lumen/membw.json)"), std::string::npos)
      << second.out;
  EXPECT_EQ(Number(first.out, "bandwidth:"), Number(second.out, "bandwidth:"));
  EXPECT_NE(again.out.find("(measured, cached in"), std::string::npos) << again.out;
  fs::remove_all(xdg);
}

}  // namespace
}  // namespace lumen
