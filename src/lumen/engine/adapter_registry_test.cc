// Adapters at serve time: per-row adapter sets in the batched forward (L1
// against each row alone, and against the model-wide --adapter path),
// stacking, the registry's validation and replace semantics, and the
// scheduler's mixed-adapter batches and adapter-keyed prompt cache. The base
// is the embedded stories260K; adapters are random (adapter_test_util.h).
#include "lumen/engine/adapter_registry.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <future>

#include <gtest/gtest.h>

#include "lumen/engine/adapter_test_util.h"
#include "lumen/engine/default_model.h"
#include "lumen/engine/generate.h"
#include "lumen/engine/scheduler.h"

namespace lumen::engine {
namespace {

namespace fs = std::filesystem;
using testing_util::RandomAdapterSpec;
using testing_util::WriteRandomAdapter;

constexpr int kAllTargets[] = {model::kLoraQ,    model::kLoraK,  model::kLoraV,   model::kLoraO,
                               model::kLoraGate, model::kLoraUp, model::kLoraDown};

class AdapterServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto m = LoadDefaultModel();
    ASSERT_TRUE(m.ok()) << m.status().message();
    model_ = std::move(*m).release();
    dir_ = new fs::path(fs::temp_directory_path() /
                        ("lumen_adapter_registry_test_" + std::to_string(::getpid())));
    fs::create_directories(*dir_);
    const model::ModelConfig& c = model_->config();
    // a: attention, rank 4; b: FFN, rank 2; both: every target.
    ASSERT_TRUE(WriteRandomAdapter(
        Dir("a"), c,
        {{model::kLoraQ, model::kLoraK, model::kLoraV, model::kLoraO}, 4, 8.0f, 0.2f, 1}));
    ASSERT_TRUE(WriteRandomAdapter(
        Dir("b"), c, {{model::kLoraGate, model::kLoraUp, model::kLoraDown}, 2, 4.0f, 0.2f, 2}));
  }
  static void TearDownTestSuite() {
    delete model_;
    std::error_code ec;
    fs::remove_all(*dir_, ec);
    delete dir_;
  }
  static std::string Dir(const std::string& name) { return (*dir_ / name).string(); }
  std::vector<int32_t> Prompt(const std::string& text) const {
    return model_->tokenizer().Encode(text, /*add_special=*/true);
  }
  static std::shared_ptr<const AdapterSet> Set(const AdapterRegistry& r, const std::string& spec) {
    auto s = r.Resolve(spec);
    EXPECT_TRUE(s.ok()) << spec << ": " << s.status().message();
    return s.ok() ? *s : nullptr;
  }
  static const model::LoraSet* Lora(const std::shared_ptr<const AdapterSet>& s) {
    return s ? &s->lora : nullptr;
  }
  static Model* model_;
  static fs::path* dir_;
};
Model* AdapterServeTest::model_ = nullptr;
fs::path* AdapterServeTest::dir_ = nullptr;

model::KvCache Kv(const model::ModelConfig& c, DType t) {
  auto k = model::KvCache::Create(c, 64, t);
  EXPECT_TRUE(k.ok()) << k.status().message();
  return std::move(*k);
}

int32_t Argmax(const float* x, int64_t n) {
  return static_cast<int32_t>(std::max_element(x, x + n) - x);
}

// Rows with adapter sets a, b, a+b and none decode together in RunBatch
// (then a*0.5, b*-1+a, a and b*2: one adapter gathered over rows with
// different weights); every row's logits equal running its sequence alone
// with its set, bit for bit, at every step. Four rows: the base products are
// batch-independent up to 4 rows (kernels/matmul.h: M > 4 takes the panel
// kernel, whose sums differ in order), with or without adapters.
TEST_F(AdapterServeTest, BatchedRowsWithDifferentSetsMatchAlone) {
  AdapterRegistry reg(*model_);
  ASSERT_TRUE(reg.Mount("a", Dir("a"), false).ok());
  ASSERT_TRUE(reg.Mount("b", Dir("b"), false).ok());
  const model::ModelConfig& c = model_->config();
  const int64_t V = c.vocab_size;
  const auto prompt = Prompt("Once upon a time");
  for (const std::vector<std::string>& specs :
       {std::vector<std::string>{"a", "b", "a+b", ""},
        std::vector<std::string>{"a*0.5", "b*-1+a", "a", "b*2"}}) {
    const int64_t R = int64_t(specs.size());
    std::vector<std::shared_ptr<const AdapterSet>> sets;
    for (const auto& s : specs) sets.push_back(Set(reg, s));
    model::Forward batched(c, model_->weights(), model_->pool());
    model::Forward alone(c, model_->weights(), model_->pool());
    std::vector<model::KvCache> cb, ca;
    std::vector<int32_t> next(R);
    std::vector<float> first(R * V), logits(R * V), one(V);
    for (int64_t i = 0; i < R; ++i) {
      cb.push_back(Kv(c, DType::kF32));
      ca.push_back(Kv(c, DType::kF32));
      ASSERT_TRUE(
          batched
              .Run(prompt, 0, cb[i], model::LogitsFor::kLast, first.data() + i * V, Lora(sets[i]))
              .ok());
      ASSERT_TRUE(
          alone.Run(prompt, 0, ca[i], model::LogitsFor::kLast, one.data(), Lora(sets[i])).ok());
      next[i] = Argmax(one.data(), V);
    }
    // The sets really change the output: every pair of rows differs.
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = i + 1; j < R; ++j)
        EXPECT_NE(std::memcmp(first.data() + i * V, first.data() + j * V, V * sizeof(float)), 0)
            << specs[i] << " vs " << specs[j];
    int64_t pos = static_cast<int64_t>(prompt.size());
    for (int step = 0; step < 6; ++step, ++pos) {
      std::vector<model::BatchRow> rows;
      for (int64_t i = 0; i < R; ++i) rows.push_back({&cb[i], next[i], pos, Lora(sets[i])});
      ASSERT_TRUE(batched.RunBatch(rows, logits.data()).ok());
      for (int64_t i = 0; i < R; ++i) {
        ASSERT_TRUE(
            alone.Run({&next[i], 1}, pos, ca[i], model::LogitsFor::kLast, one.data(), Lora(sets[i]))
                .ok());
        ASSERT_EQ(std::memcmp(one.data(), logits.data() + i * V, V * sizeof(float)), 0)
            << "row " << specs[i] << " at step " << step;
        next[i] = Argmax(one.data(), V);
      }
    }
  }
}

// A mounted adapter with weight 1 computes exactly what `--adapter DIR`
// (the model-wide attach) does, so serving it matches `lumen generate`.
TEST_F(AdapterServeTest, MountedAdapterEqualsModelWideAttach) {
  LoadOptions o;
  o.adapter_dir = Dir("a");
  auto attached = LoadDefaultModel(o);
  ASSERT_TRUE(attached.ok()) << attached.status().message();
  AdapterRegistry reg(*model_);
  ASSERT_TRUE(reg.Mount("a", Dir("a"), false).ok());
  auto set = Set(reg, "a");
  const model::ModelConfig& c = model_->config();
  const int64_t V = c.vocab_size;
  const auto prompt = Prompt("Lily and Tom");
  model::Forward fa(c, (*attached)->weights(), model_->pool());
  model::Forward fm(c, model_->weights(), model_->pool());
  auto ka = Kv(c, DType::kF16);
  auto km = Kv(c, DType::kF16);
  std::vector<float> la(prompt.size() * V), lm(prompt.size() * V), base(V);
  ASSERT_TRUE(fa.Run(prompt, 0, ka, model::LogitsFor::kAll, la.data()).ok());
  ASSERT_TRUE(fm.Run(prompt, 0, km, model::LogitsFor::kAll, lm.data(), &set->lora).ok());
  EXPECT_EQ(std::memcmp(la.data(), lm.data(), la.size() * sizeof(float)), 0);
  auto kb = Kv(c, DType::kF16);
  ASSERT_TRUE(fm.Run(prompt, 0, kb, model::LogitsFor::kLast, base.data()).ok());
  EXPECT_NE(std::memcmp(base.data(), lm.data() + (prompt.size() - 1) * V, V * sizeof(float)), 0);
}

// "a+b" adds both updates: it equals one adapter of rank ra + rb holding
// [A_a; A_b] and [s_a B_a, s_b B_b] (scale 1) up to f32 rounding, and
// "a*0.5" equals adapter a with half its alpha exactly (same f32 scale).
TEST_F(AdapterServeTest, StackingIsTheSum) {
  const model::ModelConfig& c = model_->config();
  RandomAdapterSpec sa{{}, 3, 6.0f, 0.2f, 11}, sb{{}, 2, 8.0f, 0.2f, 12};
  sa.targets = sb.targets = std::vector<int>(std::begin(kAllTargets), std::end(kAllTargets));
  const Adapter a = testing_util::RandomAdapter(c, sa), b = testing_util::RandomAdapter(c, sb);
  Adapter cat;
  cat.rank = a.rank + b.rank;
  cat.alpha = float(cat.rank);
  cat.base_model = a.base_model;
  for (size_t i = 0; i < a.pairs.size(); ++i) {
    const AdapterPair &pa = a.pairs[i], &pb = b.pairs[i];
    AdapterPair p = pa;
    p.a = pa.a;
    p.a.insert(p.a.end(), pb.a.begin(), pb.a.end());
    p.b.clear();
    for (int64_t n = 0; n < pa.n; ++n) {
      for (int j = 0; j < a.rank; ++j) p.b.push_back(a.Scale() * pa.b[n * a.rank + j]);
      for (int j = 0; j < b.rank; ++j) p.b.push_back(b.Scale() * pb.b[n * b.rank + j]);
    }
    cat.pairs.push_back(std::move(p));
  }
  Adapter half = a;
  half.alpha = a.alpha * 0.5f;
  ASSERT_TRUE(SaveAdapter(Dir("sa"), a, c).ok());
  ASSERT_TRUE(SaveAdapter(Dir("sb"), b, c).ok());
  ASSERT_TRUE(SaveAdapter(Dir("cat"), cat, c).ok());
  ASSERT_TRUE(SaveAdapter(Dir("half"), half, c).ok());
  AdapterRegistry reg(*model_);
  for (const char* id : {"sa", "sb", "cat", "half"})
    ASSERT_TRUE(reg.Mount(id, Dir(id), false).ok());

  const int64_t V = c.vocab_size;
  const auto prompt = Prompt("The big red ball");
  model::Forward f(c, model_->weights(), model_->pool());
  auto logits = [&](const std::string& spec) {
    auto set = Set(reg, spec);
    auto kv = Kv(c, DType::kF32);
    std::vector<float> out(V);
    EXPECT_TRUE(f.Run(prompt, 0, kv, model::LogitsFor::kLast, out.data(), Lora(set)).ok());
    return out;
  };
  const auto stacked = logits("sa+sb"), merged = logits("cat"), only_a = logits("sa");
  double err = 0, diff = 0, norm = 0;
  for (int64_t v = 0; v < V; ++v) {
    err = std::max(err, double(std::abs(stacked[v] - merged[v])));
    diff = std::max(diff, double(std::abs(stacked[v] - only_a[v])));
    norm = std::max(norm, double(std::abs(merged[v])));
  }
  EXPECT_LT(err, 1e-4 * norm) << "stacked vs rank-concatenated adapter";
  EXPECT_GT(diff, 1e-2 * norm) << "b's update is visible";
  EXPECT_EQ(logits("sa*0.5"), logits("half"));
  EXPECT_NE(logits("sa*0.5"), only_a);
}

std::string Slurp(const std::string& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

// A bad adapter is an error naming the reason, and the registry (ids,
// generations, what a spec resolves to) is exactly as before.
TEST_F(AdapterServeTest, ValidationFailureLeavesRegistryUnchanged) {
  const model::ModelConfig& c = model_->config();
  AdapterRegistry reg(*model_);
  ASSERT_TRUE(reg.Mount("a", Dir("a"), false).ok());
  const std::string key = Set(reg, "a")->key;

  // Wrong shapes: an adapter for a wider model.
  model::ModelConfig wide = c;
  wide.dim *= 2;
  ASSERT_TRUE(WriteRandomAdapter(Dir("wide"), wide, {{model::kLoraQ}, 2, 2.0f, 0.1f, 5}));
  // Another base model named in adapter_config.json.
  ASSERT_TRUE(
      WriteRandomAdapter(Dir("qwen"), c, {{model::kLoraQ}, 2, 2.0f, 0.1f, 6, "Qwen/Qwen3-0.6B"}));
  // A NaN in lora_B.
  Adapter nan = testing_util::RandomAdapter(c, {{model::kLoraV}, 2, 2.0f, 0.1f, 7});
  nan.pairs[3].b[1] = NAN;
  ASSERT_TRUE(SaveAdapter(Dir("nan"), nan, c).ok());
  // A truncated safetensors file.
  ASSERT_TRUE(WriteRandomAdapter(Dir("cut"), c, {{model::kLoraQ}, 2, 2.0f, 0.1f, 8}));
  {
    const std::string st = Dir("cut") + "/adapter_model.safetensors";
    const std::string bytes = Slurp(st);
    std::ofstream(st, std::ios::binary | std::ios::trunc) << bytes.substr(0, bytes.size() / 2);
  }
  const std::pair<const char*, const char*> bad[] = {
      {"wide", "this base model needs"},
      {"qwen", "made for base model 'Qwen/Qwen3-0.6B'"},
      {"nan", "non-finite"},
      {"cut", "adapter_model.safetensors"},
      {"missing", "not a directory"},
  };
  for (const auto& [name, why] : bad) {
    for (bool replace : {false, true}) {
      bool conflict = true;
      auto r = reg.Mount(replace ? "a" : name, Dir(name), replace, &conflict);
      ASSERT_FALSE(r.ok()) << name;
      EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
      EXPECT_FALSE(conflict);
      auto list = reg.List();
      ASSERT_EQ(list.size(), 1u);
      EXPECT_EQ(list[0]->id, "a");
      EXPECT_EQ(list[0]->path, fs::absolute(Dir("a")).lexically_normal().string());
      EXPECT_EQ(Set(reg, "a")->key, key);
    }
  }
  bool conflict = false;
  auto dup = reg.Mount("a", Dir("b"), false, &conflict);
  EXPECT_FALSE(dup.ok());
  EXPECT_TRUE(conflict);
  EXPECT_EQ(Set(reg, "a")->key, key);
  EXPECT_FALSE(reg.Mount("a+b", Dir("b"), false).ok());  // not an id
  EXPECT_FALSE(reg.Unmount("zzz"));
}

TEST_F(AdapterServeTest, ResolveSpecs) {
  AdapterRegistry reg(*model_);
  ASSERT_TRUE(reg.Mount("a", Dir("a"), false).ok());
  ASSERT_TRUE(reg.Mount("b", Dir("b"), false).ok());
  auto none = reg.Resolve("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, nullptr);
  auto s = Set(reg, " a*0.5 + b ");
  ASSERT_TRUE(s);
  EXPECT_EQ(s->spec, "a*0.5+b");
  ASSERT_EQ(s->lora.terms.size(), 2u);
  EXPECT_EQ(s->lora.terms[0].weight, 0.5f);
  EXPECT_EQ(s->lora.terms[0].weights, &s->adapters[0]->weights);
  EXPECT_EQ(s->adapters[1]->id, "b");
  EXPECT_NE(Set(reg, "a+b")->key, Set(reg, "b+a")->key);
  EXPECT_NE(Set(reg, "a")->key, Set(reg, "a*2")->key);
  const std::pair<const char*, const char*> bad[] = {
      {"c", "no adapter 'c' is mounted (mounted: a, b"},
      {"a+zz", "no adapter 'zz'"},
      {"a+a", "names 'a' twice"},
      {"a*x", "weight after '*'"},
      {"a*inf", "weight after '*'"},
      {"a+", "empty adapter id"},
  };
  for (const auto& [spec, why] : bad) {
    auto r = reg.Resolve(spec);
    ASSERT_FALSE(r.ok()) << spec;
    EXPECT_EQ(r.status().message().rfind("adapter: ", 0), 0u) << r.status().message();
    EXPECT_NE(r.status().message().find(why), std::string::npos) << r.status().message();
  }
}

// A set resolved before a replace or an unmount keeps the adapter it named;
// a replace gives the id a new generation (a new prompt-cache namespace).
TEST_F(AdapterServeTest, ResolvedSetsOutliveReplaceAndUnmount) {
  AdapterRegistry reg(*model_);
  ASSERT_TRUE(reg.Mount("x", Dir("a"), false).ok());
  auto before = Set(reg, "x");
  auto replaced = reg.Mount("x", Dir("b"), true);
  ASSERT_TRUE(replaced.ok());
  auto after = Set(reg, "x");
  EXPECT_NE(before->key, after->key);
  EXPECT_EQ(before->adapters[0]->path, fs::absolute(Dir("a")).lexically_normal().string());
  EXPECT_EQ(after->adapters[0]->path, fs::absolute(Dir("b")).lexically_normal().string());
  EXPECT_EQ(before->adapters[0]->adapter.rank, 4);
  EXPECT_EQ(after->adapters[0]->adapter.rank, 2);
  EXPECT_TRUE(reg.Unmount("x"));
  EXPECT_FALSE(reg.Resolve("x").ok());
  EXPECT_EQ(after->adapters[0]->targets,
            (std::vector<std::string>{"gate_proj", "up_proj", "down_proj"}));
}

struct Collected {
  std::vector<int32_t> ids;
  JobEvent done;
};

struct Runner {
  std::promise<Collected> promise;
  Collected c;
  JobRequest Make(std::vector<int32_t> prompt, std::shared_ptr<const AdapterSet> set) {
    JobRequest r;
    r.prompt = std::move(prompt);
    r.sampler.temperature = 0.8;
    r.sampler.seed = 5;
    r.max_tokens = 24;
    r.ignore_eos = true;
    r.adapters = std::move(set);
    r.on_event = [this](const JobEvent& e) {
      if (e.kind == JobEvent::kToken) c.ids.push_back(e.token.id);
      if (e.kind == JobEvent::kDone || e.kind == JobEvent::kError) {
        c.done = e;
        promise.set_value(c);
      }
      return true;
    };
    return r;
  }
};

// Generate alone on a fresh Session with the set: the reference.
std::vector<int32_t> Alone(const Model& m, const std::vector<int32_t>& prompt,
                           const model::LoraSet* lora) {
  auto session = Session::Create(m, {});
  EXPECT_TRUE(session.ok());
  (*session)->SetLora(lora);
  sample::SamplerConfig sc;
  sc.temperature = 0.8;
  sc.seed = 5;
  sample::Sampler sampler(sc);
  GenerateOptions g;
  g.max_tokens = 24;
  g.ignore_eos = true;
  auto r = Generate(**session, sampler, prompt, g, nullptr);
  EXPECT_TRUE(r.ok());
  std::vector<int32_t> ids;
  for (const auto& t : r->tokens) ids.push_back(t.id);
  return ids;
}

// Four jobs with sets a, b, a+b and none share decode steps; each produces
// exactly the tokens it produces alone.
TEST_F(AdapterServeTest, SchedulerBatchesDifferentSets) {
  AdapterRegistry reg(*model_);
  ASSERT_TRUE(reg.Mount("a", Dir("a"), false).ok());
  ASSERT_TRUE(reg.Mount("b", Dir("b"), false).ok());
  SchedulerOptions o;
  o.parallel = 4;
  auto s = Scheduler::Create(*model_, o);
  ASSERT_TRUE(s.ok());
  const auto prompt = Prompt("Once upon a time");
  const std::vector<std::string> specs = {"a", "b", "a+b", ""};
  Runner r[4];
  Scheduler::SubmitError err;
  for (int i = 0; i < 4; ++i)
    ASSERT_TRUE((*s)->Submit(r[i].Make(prompt, Set(reg, specs[i])), &err));
  std::vector<std::vector<int32_t>> got;
  for (auto& x : r) got.push_back(x.promise.get_future().get().ids);
  EXPECT_GT((*s)->stats().batched_rows, (*s)->stats().steps);  // rows really shared steps
  for (int i = 0; i < 4; ++i) {
    auto set = Set(reg, specs[i]);
    EXPECT_EQ(got[i], Alone(*model_, prompt, Lora(set))) << "set '" << specs[i] << "'";
    ASSERT_EQ(got[i].size(), 24u);
  }
  EXPECT_NE(got[0], got[3]);
  EXPECT_NE(got[1], got[3]);
  EXPECT_NE(got[2], got[0]);
}

// A job keeps the adapter it started with when its id is replaced and then
// unmounted mid-generation (its first token waits until both happened).
TEST_F(AdapterServeTest, RunningJobKeepsItsAdapter) {
  AdapterRegistry reg(*model_);
  ASSERT_TRUE(reg.Mount("x", Dir("a"), false).ok());
  auto set = Set(reg, "x");
  const auto prompt = Prompt("One day a bird");
  const auto want = Alone(*model_, prompt, &set->lora);
  SchedulerOptions o;
  auto s = Scheduler::Create(*model_, o);
  ASSERT_TRUE(s.ok());
  std::promise<void> first_token, changed;
  auto changed_f = changed.get_future();
  Runner r;
  JobRequest q = r.Make(prompt, std::move(set));
  auto inner = q.on_event;
  bool waited = false;
  q.on_event = [&](const JobEvent& e) {
    if (e.kind == JobEvent::kToken && !waited) {
      waited = true;
      first_token.set_value();
      changed_f.wait();
    }
    return inner(e);
  };
  Scheduler::SubmitError err;
  ASSERT_TRUE((*s)->Submit(std::move(q), &err));
  first_token.get_future().wait();
  ASSERT_TRUE(reg.Mount("x", Dir("b"), /*replace=*/true).ok());
  ASSERT_TRUE(reg.Unmount("x"));
  changed.set_value();
  EXPECT_EQ(r.promise.get_future().get().ids, want);
}

// The prompt cache never hands KV made under one set to a job of another,
// nor to a re-mounted id; the same set reuses it.
TEST_F(AdapterServeTest, PromptCacheIsNamespacedByAdapterSet) {
  AdapterRegistry reg(*model_);
  ASSERT_TRUE(reg.Mount("a", Dir("a"), false).ok());
  SchedulerOptions o;
  o.prompt_cache_bytes = size_t(64) << 20;
  auto s = Scheduler::Create(*model_, o);
  ASSERT_TRUE(s.ok());
  const auto prompt = Prompt("Once upon a time there was a little girl named Lily");
  auto run = [&](const std::string& spec) {
    Runner r;
    Scheduler::SubmitError err;
    EXPECT_TRUE((*s)->Submit(r.Make(prompt, Set(reg, spec)), &err));
    return r.promise.get_future().get();
  };
  const Collected first = run("a");
  EXPECT_EQ(first.done.cached_tokens, 0);
  const Collected plain = run("");
  EXPECT_EQ(plain.done.cached_tokens, 0);  // a's KV is not the base's
  EXPECT_EQ(plain.ids, Alone(*model_, prompt, nullptr));
  const Collected again = run("a");
  EXPECT_EQ(again.done.cached_tokens, int64_t(prompt.size()) - 1);
  EXPECT_EQ(again.ids, first.ids);
  EXPECT_EQ(run("a*0.5").done.cached_tokens, 0);
  ASSERT_TRUE(reg.Mount("a", Dir("b"), /*replace=*/true).ok());
  const Collected swapped = run("a");
  EXPECT_EQ(swapped.done.cached_tokens, 0);  // same id, new weights
  EXPECT_EQ(swapped.ids, Alone(*model_, prompt, &Set(reg, "a")->lora));
  EXPECT_NE(swapped.ids, first.ids);
}

}  // namespace
}  // namespace lumen::engine
