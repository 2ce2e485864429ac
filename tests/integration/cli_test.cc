// End-to-end tests of the lumen binary: the README's main job, inspect,
// convert round trips, tokenize/detokenize/template, and bad input.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "lumen/core/buffer.h"
#include "lumen/formats/gguf.h"
#include "lumen/kernels/matmul_bf16.h"

namespace lumen {
namespace {

namespace fs = std::filesystem;

struct CliRun {
  int code;
  std::string out;  // stdout
  std::string err;  // stderr
};

std::string TempDir() {
  static std::string dir = [] {
    std::string d = fs::temp_directory_path() / ("lumen_cli_test_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

CliRun Lumen(const std::string& args) {
  const std::string err_path = TempDir() + "/stderr.txt";
  const std::string cmd = std::string(LUMEN_BINARY) + " " + args + " 2>" + err_path;
  FILE* p = ::popen(cmd.c_str(), "r");
  CliRun r{-1, "", ""};
  if (!p) return r;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, p)) > 0) r.out.append(buf, n);
  const int status = ::pclose(p);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream e(err_path);
  std::stringstream ss;
  ss << e.rdbuf();
  r.err = ss.str();
  return r;
}

std::string Fixtures() {
  if (const char* e = std::getenv("LUMEN_FIXTURES")) return e;
  return std::string(LUMEN_SOURCE_DIR) + "/../shared/fixtures";
}

std::string Slurp(const std::string& path) {
  auto r = ReadFile(path);
  return r.ok() ? *r : std::string();
}

TEST(Cli, GenerateOnEmbeddedModelMatchesRunC) {
  const std::string dir = Fixtures() + "/stories260K";
  if (!fs::exists(dir)) GTEST_SKIP() << "fixtures absent: " << dir;
  CliRun r = Lumen("generate \"Once upon a time\" -n 252 --temp 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, Slurp(dir + "/expected-greedy-once-upon-a-time.txt"));
  r = Lumen("generate -n 128 --temp 0");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, Slurp(dir + "/expected-greedy-no-prompt-n128.txt"));
  EXPECT_NE(r.err.find("tok/s"), std::string::npos);  // stats on stderr, not stdout
}

TEST(Cli, NoEchoAndStopString) {
  CliRun full = Lumen("generate \"Once upon a time\" -n 40 --temp 0 --no-echo");
  ASSERT_EQ(full.code, 0) << full.err;
  EXPECT_EQ(full.out.rfind(", there was a little girl named Lily.", 0), 0u) << full.out;
  CliRun stop = Lumen("generate \"Once upon a time\" -n 40 --temp 0 --no-echo --stop Lily");
  ASSERT_EQ(stop.code, 0) << stop.err;
  EXPECT_EQ(stop.out, ", there was a little girl named \n");
}

TEST(Cli, SeededSamplingIsReproducible) {
  CliRun a = Lumen("generate \"Once upon a time\" -n 30 --temp 1 --seed 7 --top-p 0.9");
  CliRun b = Lumen("generate \"Once upon a time\" -n 30 --temp 1 --seed 7 --top-p 0.9");
  CliRun c = Lumen("generate \"Once upon a time\" -n 30 --temp 1 --seed 8 --top-p 0.9");
  ASSERT_EQ(a.code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_NE(a.out, c.out);
}

// --logit-bias is repeatable and takes a comma-separated list; every entry
// counts (the third ban changes the greedy text the first one leaves).
TEST(Cli, LogitBiasRepeatableAndCommaForm) {
  const std::string gen = "generate \"Once upon a time\" -n 5 --temp 0 --no-echo ";
  CliRun one = Lumen(gen + "--logit-bias 432=-inf");
  CliRun repeated = Lumen(gen + "--logit-bias 432=-inf --logit-bias 410=-inf --logit-bias 261-inf");
  CliRun comma = Lumen(gen + "--logit-bias 432=-inf,410=-inf,261=-inf");
  CliRun mixed = Lumen(gen + "--logit-bias 432=-inf,410=-inf --logit-bias=261=-inf");
  ASSERT_EQ(one.code, 0) << one.err;
  ASSERT_EQ(repeated.code, 0) << repeated.err;
  ASSERT_EQ(comma.code, 0) << comma.err;
  ASSERT_EQ(mixed.code, 0) << mixed.err;
  EXPECT_EQ(one.out, " there was a little g\n");
  EXPECT_EQ(repeated.out, " there was somet\n");
  EXPECT_EQ(comma.out, repeated.out);
  EXPECT_EQ(mixed.out, repeated.out);
  // A bad entry in a list is named.
  CliRun bad = Lumen(gen + "--logit-bias 432=-inf,x7");
  EXPECT_NE(bad.code, 0);
  EXPECT_NE(bad.err.find("--logit-bias: expected TOKEN+BIAS"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("'x7'"), std::string::npos) << bad.err;
  CliRun inf = Lumen(gen + "--logit-bias 432=+inf");
  EXPECT_NE(inf.code, 0);
  EXPECT_NE(inf.err.find("bias must be finite or -inf"), std::string::npos) << inf.err;
}

// The L3 routes from the command line: `eval route` measures the one named
// by --act-route where it applies (bf16: one prefill per sequence).
TEST(Cli, ActRoutesRunAndReportTheirKl) {
  const std::string prompts = TempDir() + "/route_prompts.txt";
  std::ofstream(prompts) << "Once upon a time\nLily saw a big dog\n";
  for (const char* route : {"bf16", "int8+bf16"}) {
    CliRun r = Lumen(std::string("eval route --prompts ") + prompts + " -n 1 --max-tokens 16 " +
                     "--act-route " + route);
    ASSERT_EQ(r.code, 0) << r.err;
    const std::string head =
        std::string(route) + " route vs exact (one prefill per sequence): mean KL ";
    const size_t at = r.out.find(head);
    ASSERT_NE(at, std::string::npos) << r.out;
    const double kl = std::strtod(r.out.c_str() + at + head.size(), nullptr);
    // The route ran (exact vs exact is 0), where the CPU has the instructions.
    if (kernels::CpuHasBf16()) {
      EXPECT_GT(kl, 0.0) << r.out;
    }
    EXPECT_LT(kl, 0.01) << r.out;
  }
  CliRun g = Lumen("generate \"Once upon a time\" -n 24 --temp 0 --act-route int8+bf16");
  ASSERT_EQ(g.code, 0) << g.err;
  EXPECT_EQ(g.out.rfind("Once upon a time", 0), 0u) << g.out;
}

// On two threads `lumen bench` says where the calling thread's time went at
// the pool's hand-offs: a decode step of the embedded model (5 layers) hands
// off 5 times per layer (q/k/v, attention by kv head, o, gate/up, down) and
// once for the LM head. One thread has no hand-offs and no such line.
TEST(Cli, BenchCountsTheHandOffsPerToken) {
  CliRun two = Lumen("bench --prompt 8 --gen 4 --repeat 1 --no-membw -t 2");
  ASSERT_EQ(two.code, 0) << two.err;
  EXPECT_NE(two.out.find("decode hand-offs: 26.0 per token; the calling thread "),
            std::string::npos)
      << two.out;
  EXPECT_NE(two.out.find("prefill hand-offs: "), std::string::npos) << two.out;
  CliRun one = Lumen("bench --prompt 8 --gen 4 --repeat 1 --no-membw -t 1");
  ASSERT_EQ(one.code, 0) << one.err;
  EXPECT_EQ(one.out.find("hand-offs"), std::string::npos) << one.out;
}

// A short prompt and one generated token: the warm-up run (up to 16 prompt
// tokens and 2 more) once asked for more context than the run's own and failed.
TEST(Cli, BenchShortPromptOneToken) {
  CliRun r = Lumen("bench --prompt 8 --gen 1 --repeat 1 --no-membw -t 1");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("prefill: "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decode: "), std::string::npos) << r.out;
}

TEST(Cli, InspectEmbedded) {
  CliRun r = Lumen("inspect");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("architecture: llama"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("parameters:   260032"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("layers 5  width 64  heads 8  kv heads 4  head dim 8  ffn 172  vocab 512"),
            std::string::npos);
  EXPECT_NE(r.out.find("blk.4.ffn_down.weight"), std::string::npos);
}

// The embedded model is what `lumen convert` makes of the llama2.c files.
TEST(Cli, ConvertLlama2cReproducesEmbeddedModel) {
  const std::string dir = Fixtures() + "/stories260K";
  if (!fs::exists(dir)) GTEST_SKIP() << "fixtures absent: " << dir;
  const std::string out = TempDir() + "/s.gguf";
  CliRun r =
      Lumen("convert " + dir + "/stories260K.bin " + out + " --tokenizer " + dir + "/tok512.bin");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(Slurp(out) == Slurp(std::string(LUMEN_SOURCE_DIR) + "/models/stories260K.gguf"))
      << "models/stories260K.gguf is not what lumen convert makes; regenerate it";
}

void ExpectSameTensors(const std::string& a, const std::string& b) {
  auto ga = formats::GgufFile::Open(a);
  auto gb = formats::GgufFile::Open(b);
  ASSERT_TRUE(ga.ok()) << ga.status().message();
  ASSERT_TRUE(gb.ok()) << gb.status().message();
  ASSERT_EQ(ga->tensors().size(), gb->tensors().size());
  for (const auto& t : ga->tensors()) {
    const auto* u = gb->FindTensor(t.name);
    ASSERT_NE(u, nullptr) << t.name;
    EXPECT_EQ(t.dtype, u->dtype) << t.name;
    EXPECT_EQ(t.view.ShapeString(), u->view.ShapeString()) << t.name;
    ASSERT_EQ(t.view.byte_size(), u->view.byte_size());
    EXPECT_EQ(0, std::memcmp(t.view.data, u->view.data, t.view.byte_size())) << t.name;
  }
}

// GGUF -> HF -> GGUF is exact (q/k rows permuted there and back), and the HF
// copy generates the same text.
TEST(Cli, ConvertRoundTripGgufHfGguf) {
  const std::string src = std::string(LUMEN_SOURCE_DIR) + "/models/stories260K.gguf";
  const std::string hf = TempDir() + "/hf";
  const std::string back = TempDir() + "/back.gguf";
  CliRun r = Lumen("convert " + src + " " + hf + " --to hf --type f32");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_TRUE(fs::exists(hf + "/config.json"));
  EXPECT_TRUE(fs::exists(hf + "/model.safetensors"));
  CliRun i = Lumen("inspect " + hf + " --no-tensors");
  ASSERT_EQ(i.code, 0) << i.err;
  EXPECT_NE(i.out.find("format:       hf"), std::string::npos);
  EXPECT_NE(i.out.find("parameters:   260032"), std::string::npos) << i.out;
  CliRun g1 = Lumen("generate " + src + " \"Once upon a time\" -n 60 --temp 0");
  CliRun g2 = Lumen("generate " + hf + " \"Once upon a time\" -n 60 --temp 0");
  ASSERT_EQ(g2.code, 0) << g2.err;
  EXPECT_EQ(g1.out, g2.out);
  r = Lumen("convert " + hf + " " + back);
  ASSERT_EQ(r.code, 0) << r.err;
  ExpectSameTensors(src, back);
}

// A Hugging Face write that fails leaves nothing behind and an existing
// directory as it was; one that succeeds replaces the model in it (a stale
// shard index would load beside the new weights) and keeps the user's files.
TEST(Cli, ConvertToHfFailsCleanlyAndReplacesAModel) {
  const std::string src = std::string(LUMEN_SOURCE_DIR) + "/models/stories260K.gguf";
  const std::string l2c = Fixtures() + "/stories260K";
  if (!fs::exists(l2c)) GTEST_SKIP() << "fixtures absent: " << l2c;
  const std::string base = TempDir(), fresh = base + "/fresh", hf = base + "/hf";
  const std::string bad =
      "convert " + l2c + "/stories260K.bin {} --to hf --tokenizer " + l2c + "/tok512.bin";
  auto with = [](std::string cmd, const std::string& out) {
    return cmd.replace(cmd.find("{}"), 2, out);
  };
  auto leftovers = [&] {
    int n = 0;
    for (const auto& e : fs::directory_iterator(base))
      n += e.path().filename().string().find(".partial-") != std::string::npos;
    return n;
  };
  CliRun r = Lumen(with(bad, fresh));
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("write GGUF instead"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(fresh));
  EXPECT_EQ(leftovers(), 0);

  ASSERT_EQ(Lumen("convert " + src + " " + hf + " --to hf --type f32").code, 0);
  std::ofstream(hf + "/README.md") << "mine";
  std::ofstream(hf + "/model.safetensors.index.json") << "{}";
  std::ofstream(hf + "/model-00001-of-00002.safetensors") << "old";
  const std::string config = Slurp(hf + "/config.json");
  for (const std::string& cmd :
       {with(bad, hf), "convert " + src + " " + hf + " --to hf --type q8_0"}) {
    CliRun f = Lumen(cmd);
    EXPECT_EQ(f.code, 1) << cmd;
    EXPECT_EQ(Slurp(hf + "/config.json"), config) << cmd;
    EXPECT_TRUE(fs::exists(hf + "/model.safetensors.index.json")) << cmd;
    EXPECT_EQ(leftovers(), 0) << cmd;
  }

  ASSERT_EQ(Lumen("convert " + src + " " + hf + " --to hf --type f32").code, 0);
  EXPECT_FALSE(fs::exists(hf + "/model.safetensors.index.json"));
  EXPECT_FALSE(fs::exists(hf + "/model-00001-of-00002.safetensors"));
  EXPECT_EQ(Slurp(hf + "/README.md"), "mine");
  EXPECT_EQ(leftovers(), 0);
  CliRun g1 = Lumen("generate " + src + " \"Once upon a time\" -n 30 --temp 0");
  CliRun g2 = Lumen("generate " + hf + " \"Once upon a time\" -n 30 --temp 0");
  ASSERT_EQ(g2.code, 0) << g2.err;
  EXPECT_EQ(g1.out, g2.out);
}

// A Hugging Face directory whose tokenizer is larger than the model's
// vocabulary (another model's tokenizer.json) is refused at load, naming
// both counts, instead of failing mid-generation on the first such id.
TEST(Cli, HfTokenizerBeyondTheVocabularyIsRefused) {
  const std::string tok = Fixtures() + "/tokenizers/qwen3/tokenizer.json";
  if (!fs::exists(tok)) GTEST_SKIP() << "fixtures absent: " << tok;
  const std::string src = std::string(LUMEN_SOURCE_DIR) + "/models/stories260K.gguf";
  const std::string hf = TempDir() + "/hf";
  ASSERT_EQ(Lumen("convert " + src + " " + hf + " --to hf --type f32").code, 0);
  fs::copy_file(tok, hf + "/tokenizer.json", fs::copy_options::overwrite_existing);
  fs::remove(hf + "/tokenizer_config.json");
  CliRun r = Lumen("generate " + hf + " hi -n 2");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("but config.json's vocab_size is 512"), std::string::npos) << r.err;
}

// Flags that once ran silently with another meaning: NaN numbers, logit
// biases for ids the vocabulary lacks, a model or prompt given twice, text
// beside --file, a directory as a text file. Each is refused, naming it; a
// --ctx beyond the model's runs with a warning (as llama.cpp).
TEST(Cli, AmbiguousOrImpossibleFlagsAreRefused) {
  const std::string src = std::string(LUMEN_SOURCE_DIR) + "/models/stories260K.gguf";
  auto refused = [](const std::string& args, const std::string& needle) {
    CliRun r = Lumen(args);
    EXPECT_NE(r.code, 0) << args;
    EXPECT_NE(r.err.find(needle), std::string::npos) << args << "\n" << r.err;
  };
  refused("fit " + src + " --no-speed --memory-budget nan", "not a finite number");
  refused("fit " + src + " --membw nan", "not a finite number");
  refused("generate " + src + " hi -n 2 --logit-bias 99999+5",
          "logit_bias.99999: token id out of range (vocabulary size 512)");
  refused("generate -m " + src + " " + src + " hi -n 2", "--model is already given");
  refused("generate -p hi " + src + " there -n 2", "--prompt is already given");
  const std::string dir = TempDir();
  std::ofstream(dir + "/t.txt") << "Once upon a time";
  refused("tokenize " + src + " extra --file " + dir + "/t.txt", "'extra'");
  refused("perplexity " + src + " --file " + dir, "is a directory");
  refused("perplexity " + src + " --file " + dir + "/t.txt --batch 257", "--batch: Value 257");
  CliRun wide = Lumen("generate " + src + " \"Once\" -n 2 --temp 0 --ctx 4096");
  EXPECT_EQ(wide.code, 0) << wide.err;
  EXPECT_NE(wide.err.find("--ctx 4096 exceeds the model's context of 512 tokens"),
            std::string::npos)
      << wide.err;
}

// With -p the one positional is the model (llama.cpp users' habit), whether
// it names a file or not; with -m and -p a positional is refused.
TEST(Cli, GeneratePositionalIsTheModelWithPrompt) {
  const std::string src = std::string(LUMEN_SOURCE_DIR) + "/models/stories260K.gguf";
  CliRun want = Lumen("generate " + src + " \"Once upon a time\" -n 20 --temp 0");
  ASSERT_EQ(want.code, 0) << want.err;
  CliRun got = Lumen("generate " + src + " -p \"Once upon a time\" -n 20 --temp 0");
  ASSERT_EQ(got.code, 0) << got.err;
  EXPECT_EQ(got.out, want.out);
  EXPECT_EQ(got.out.rfind("Once upon a time", 0), 0u) << got.out;
  CliRun missing = Lumen("generate /nonexistent/m.gguf -p hi -n 2");
  EXPECT_NE(missing.code, 0);
  EXPECT_NE(missing.err.find("/nonexistent/m.gguf"), std::string::npos) << missing.err;
  CliRun both = Lumen("generate -m " + src + " -p hi extra -n 2");
  EXPECT_NE(both.code, 0);
  EXPECT_NE(both.err.find("'extra'"), std::string::npos) << both.err;
}

TEST(Cli, ConvertToF16AndQ8) {
  const std::string src = std::string(LUMEN_SOURCE_DIR) + "/models/stories260K.gguf";
  for (const char* type : {"f16", "q8_0"}) {
    const std::string out = TempDir() + "/s_" + type + ".gguf";
    CliRun r = Lumen("convert " + src + " " + out + " --type " + type);
    ASSERT_EQ(r.code, 0) << r.err;
    CliRun i = Lumen("inspect " + out);
    EXPECT_NE(i.out.find("blk.0.attn_q.weight"), std::string::npos);
    EXPECT_NE(i.out.find(type), std::string::npos) << i.out;
    CliRun g = Lumen("generate " + out + " \"Once upon a time\" -n 20 --temp 0");
    ASSERT_EQ(g.code, 0) << g.err;
    EXPECT_EQ(g.out.rfind("Once upon a time, there was", 0), 0u) << type << ": " << g.out;
  }
}

TEST(Cli, TokenizeDetokenizeRoundTrip) {
  CliRun t = Lumen("tokenize \"Once upon a time\" --ids");
  ASSERT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(t.out, "1 403 407 261 378\n");
  CliRun n = Lumen("tokenize \"Once upon a time\" --ids --no-special");
  EXPECT_EQ(n.out, "403 407 261 378\n");
  CliRun d = Lumen("detokenize 403 407 261 378");
  ASSERT_EQ(d.code, 0) << d.err;
  EXPECT_EQ(d.out, "Once upon a time\n");
  CliRun bad = Lumen("detokenize 99999");
  EXPECT_EQ(bad.code, 1);
  EXPECT_NE(bad.err.find("outside the vocabulary"), std::string::npos) << bad.err;
}

TEST(Cli, TemplateWithFixtureTokenizer) {
  const std::string tok = Fixtures() + "/tokenizers/qwen3";
  if (!fs::exists(tok)) GTEST_SKIP() << "fixtures absent: " << tok;
  const std::string msgs = TempDir() + "/m.json";
  std::ofstream(msgs) << R"([{"role":"user","content":"Hello!"}])";
  CliRun r = Lumen("template " + tok + " --messages " + msgs +
                   " --add-generation-prompt --kwargs '{\"enable_thinking\": false}'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n");
  CliRun ids = Lumen("tokenize " + tok + " \"<|im_start|>user\" --ids --no-special");
  EXPECT_EQ(ids.out, "151644 872\n");
}

TEST(Cli, BadInputGivesClearErrors) {
  CliRun r = Lumen("inspect /nonexistent/model.gguf");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;

  const std::string trunc = TempDir() + "/trunc.gguf";
  const std::string full = Slurp(std::string(LUMEN_SOURCE_DIR) + "/models/stories260K.gguf");
  std::ofstream(trunc, std::ios::binary) << full.substr(0, full.size() / 2);
  r = Lumen("generate " + trunc + " hi");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("trunc.gguf"), std::string::npos) << r.err;

  const std::string junk = TempDir() + "/junk.gguf";
  std::ofstream(junk, std::ios::binary) << "NOTAGGUF-------------------------";
  r = Lumen("inspect " + junk);
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("junk.gguf"), std::string::npos) << r.err;

  r = Lumen("generate \"x\" --top-p 7");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--top-p"), std::string::npos) << r.err;

  r = Lumen("generate \"Once upon a time there was\" --ctx 3 -n 10");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("context"), std::string::npos) << r.err;

  r = Lumen("convert " + std::string(LUMEN_SOURCE_DIR) + "/models/stories260K.gguf " + TempDir() +
            "/x.gguf --type q9_9");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("q9_9"), std::string::npos);
  EXPECT_FALSE(fs::exists(TempDir() + "/x.gguf"));

  r = Lumen("generate \"x\" --act-route fast");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.err.find("--act-route"), std::string::npos) << r.err;

  // stories260K has head dim 8: not whole Q8_0 blocks.
  r = Lumen("generate \"x\" -n 2 --kv-type q8_0");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("head dimension"), std::string::npos) << r.err;

  r = Lumen("eval route --prompts /nonexistent/prompts.txt");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("/nonexistent/prompts.txt"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace lumen
