// Issue 14, proof 1 (second half) and proof 3 (second half): the C++ trainer
// against the float64 torch goldens of tests/goldens/train (written from the
// formulas by tools/reference/train_reference.py), and PEFT adapter interop.
//
// GoldenTrain: per case, the per-token log-probs (adapter on and off), the
// seven losses and every LoRA gradient tensor, at Real = float (the training
// route) and Real = double (the oracle).
//
// Error analysis for the float route. f32 has unit roundoff u = 6e-8. The
// longest reductions are dot products of length <= 128 (q, the FFN's 96, a
// 13-token attention) and the head's log-sum-exp over V = 512; with the
// products through 2 layers and the head, the worst-case bound n u is ~3e-5
// relative, the typical (random-walk) error sqrt(n) u a few 1e-7 per op, a
// few 1e-6 for the whole chain. An independent f32 implementation (torch,
// case.json "checks") deviated from the float64 golden by up to 1.5e-6
// relative on the losses and 4.8e-6 relative (to each tensor's max |g|) on
// the gradients. Bounds, each ~20x above that measurement and still at the
// worst-case level:
//   per-token log-prob: |d| <= 1e-5 * max(1, |logp|) (gemma2's log-probs are
//     ~-30: the soft-capped logits are ~30, and 1e-5 relative is ~50 ulp);
//   loss: |d| <= 1e-4 * max(1, |loss|);
//   gradient: relative L2 per tensor, |g - g*| / |g*| <= 1e-4.
// Failures these bounds catch by orders of magnitude: a wrong sign makes the
// relative L2 error 2; a transposed B or a wrong q/k row order is an O(1)
// error; a missing term (DPO's label smoothing, ORPO's odds-ratio term, a
// soft-cap derivative) moves a loss by 0.5-2% and its gradients by >= 1e-2.
// The double route decodes the same f32 weights and does float64 arithmetic
// like the golden, so only rounding-order differences remain (~1e-14); its
// bound is 1e-9 relative on everything, plus 10x the f32 rounding of the
// attention scale where 1/sqrt(Dh) is not f32-exact (see CompareToGolden).
//
// AdapterPeft: torch's PEFT-layout adapter loads (values equal to the golden's
// f32 A/B), applied unmerged at inference gives the golden's logits, and the
// merged model (ConvertModel folds the attached adapter) gives the same logits
// as the unmerged one. Bound for logits: max |d| <= 1e-4 * max(1, max |logit|)
// (the same f32 analysis, for one forward of 13 tokens).
//
// AdapterRoundTrip: SaveAdapter then LoadAdapter is bit-identical, on an HF
// model and on a GGUF llama, whose q/k rows are interleaved for RoPE (so B's
// q/k rows are permuted on the way out and back), and an adapter saved from
// the GGUF model gives the same logits on the HF conversion of that model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "lumen/engine/adapter.h"
#include "lumen/engine/convert.h"
#include "lumen/formats/safetensors.h"
#include "lumen/model/forward.h"
#include "lumen/model/kv_cache.h"
#include "lumen/train/graph.h"
#include "lumen/train/head.h"
#include "lumen/train/objective.h"
#include "lumen/train/test_util.h"

namespace lumen::train {
namespace {

namespace fs = std::filesystem;

const char* const kCases[] = {"tiny-llama", "tiny-qwen3", "tiny-gemma2"};
const char* const kMethods[] = {"sft", "dpo", "dpo_ls", "orpo", "simpo", "ipo", "hinge"};
constexpr const char* kRegenerate =
    ": `lumen synth` no longer reproduces the model the goldens were made from; regenerate them "
    "with tools/reference/train_reference.py (see tests/goldens/train/README.md)";

std::string CaseDir(const std::string& name) {
  return std::string(LUMEN_SOURCE_DIR) + "/tests/goldens/train/" + name;
}

std::string TestName(const ::testing::TestParamInfo<const char*>& info) {
  std::string s = info.param;
  for (char& ch : s)
    if (ch == '-') ch = '_';
  return s;
}

// The case's golden.safetensors (F64) and case.json.
struct Golden {
  std::unique_ptr<formats::SafetensorsFile> st;
  nlohmann::json info;

  std::vector<double> Get(const std::string& name) const {
    const formats::SafetensorsTensor* t = st->Find(name);
    EXPECT_TRUE(t) << "golden has no tensor " << name;
    if (!t) return {};
    EXPECT_EQ(t->dtype, DType::kF64) << name;
    std::vector<double> v(t->view.numel());
    std::memcpy(v.data(), t->view.data, v.size() * sizeof(double));
    return v;
  }
};

Golden LoadGolden(const std::string& name) {
  Golden g;
  auto st = formats::SafetensorsFile::Open(CaseDir(name) + "/golden.safetensors");
  EXPECT_TRUE(st.ok()) << st.status().message();
  if (st.ok()) g.st = std::make_unique<formats::SafetensorsFile>(std::move(st).value());
  std::ifstream f(CaseDir(name) + "/case.json");
  g.info = nlohmann::json::parse(f, nullptr, false);
  EXPECT_FALSE(g.info.is_discarded());
  return g;
}

// `lumen synth <name> --format hf --seed 1 -o <dir>/<name>-hf` (case.json's
// synth_command); returns the model directory.
std::string SynthHf(const testing::TempDir& dir, const std::string& name) {
  engine::SynthOptions o;
  o.name = name;
  o.format = engine::OutputFormat::kHf;
  o.seed = 1;
  o.out = (dir.path() / (name + "-hf")).string();
  const Status s = engine::Synthesize(o);
  EXPECT_TRUE(s.ok()) << s.message();
  return o.out;
}

std::unique_ptr<engine::Model> Load(const std::string& path, const std::string& adapter = "") {
  engine::LoadOptions lo;
  lo.threads = 2;
  lo.adapter_dir = adapter;
  auto m = engine::Model::Load(path, lo);
  EXPECT_TRUE(m.ok()) << path << ": " << m.status().message();
  return m.ok() ? std::move(m).value() : nullptr;
}

// All-position logits [T, V] of one sequence through the inference forward,
// with an f32 KV cache so only the forward's arithmetic is compared.
std::vector<float> Logits(const engine::Model& m, const std::vector<int32_t>& toks) {
  const int64_t T = int64_t(toks.size());
  auto cache = model::KvCache::Create(m.config(), T, DType::kF32);
  EXPECT_TRUE(cache.ok()) << cache.status().message();
  if (!cache.ok()) return {};
  model::Forward fw(m.config(), m.weights(), m.pool());
  std::vector<float> logits(T * m.config().vocab_size);
  const Status s = fw.Run(toks, 0, *cache, model::LogitsFor::kAll, logits.data());
  EXPECT_TRUE(s.ok()) << s.message();
  return logits;
}

// max |a - b| / max(1, max |b|).
template <class A, class B>
double LogitError(const std::vector<A>& a, const std::vector<B>& b) {
  EXPECT_EQ(a.size(), b.size());
  double d = 0, scale = 1;
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i) {
    d = std::max(d, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(b[i])));
  }
  return d / scale;
}

std::vector<int32_t> Ids(const nlohmann::json& j) { return j.get<std::vector<int32_t>>(); }

// pairs[0].prompt + pairs[0].chosen: the sequence of base_logits / peft_logits.
std::vector<int32_t> FirstSequence(const Golden& g) {
  std::vector<int32_t> s = Ids(g.info["pairs"][0]["prompt"]);
  for (int32_t t : Ids(g.info["pairs"][0]["chosen"])) s.push_back(t);
  return s;
}

// The regenerated model must be the one the goldens were made from: its base
// logits equal the golden's to f32 accuracy (any change to synth's weights
// moves them by O(1)).
bool SameModel(const engine::Model& m, const Golden& g, const std::string& name) {
  const double err = LogitError(Logits(m, FirstSequence(g)), g.Get("base_logits"));
  EXPECT_LT(err, 1e-3) << name << kRegenerate << " (base logits differ by " << err << ")";
  return err < 1e-3;
}

LoraLayout GoldenLayout(const model::ModelConfig& c) {
  LoraConfig lc;
  lc.rank = 4;
  lc.alpha = 8;
  auto layout = LoraLayout::Make(c, lc);
  EXPECT_TRUE(layout.ok()) << layout.status().message();
  return layout.ok() ? std::move(layout).value() : LoraLayout{};
}

std::string SlotName(const LoraSlot& s) {
  return std::to_string(s.layer) + "." + std::string(kTargetNames[int(s.target)]);
}

// lora.{l}.{t}.A / B (or prefix grad.{m}.) in the layout's flat order.
std::vector<double> Flatten(const Golden& g, const LoraLayout& layout, const std::string& prefix) {
  std::vector<double> w(layout.size);
  for (const LoraSlot& s : layout.slots) {
    const std::vector<double> a = g.Get(prefix + SlotName(s) + ".A");
    const std::vector<double> b = g.Get(prefix + SlotName(s) + ".B");
    EXPECT_EQ(int64_t(a.size()), layout.cfg.rank * s.k) << SlotName(s);
    EXPECT_EQ(int64_t(b.size()), s.n * layout.cfg.rank) << SlotName(s);
    if (int64_t(a.size()) == layout.cfg.rank * s.k) std::copy(a.begin(), a.end(), &w[s.a_off]);
    if (int64_t(b.size()) == s.n * layout.cfg.rank) std::copy(b.begin(), b.end(), &w[s.b_off]);
  }
  return w;
}

struct Pack {
  PackedBatch batch;
  std::vector<Pair> pairs;
};

// Each pair as two packed sequences: prompt + chosen, then prompt + rejected.
Pack PackPairs(const Golden& g) {
  Pack p;
  for (const auto& pj : g.info["pairs"]) {
    const std::vector<int32_t> prompt = Ids(pj["prompt"]);
    std::vector<int32_t> w = prompt, l = prompt;
    for (int32_t t : Ids(pj["chosen"])) w.push_back(t);
    for (int32_t t : Ids(pj["rejected"])) l.push_back(t);
    Pair pr;
    pr.chosen = p.batch.AddSequence(w, int64_t(prompt.size()));
    pr.rejected = p.batch.AddSequence(l, int64_t(prompt.size()));
    p.pairs.push_back(pr);
  }
  return p;
}

// The scored tokens' log-probs of one sequence, in order.
template <class Real>
std::vector<double> SeqLogp(const PackedBatch& b, const std::vector<Real>& logp, int s) {
  std::vector<double> out;
  for (int64_t i = 0; i < b.size(); ++i)
    if (b.seq[i] == s && b.targets[i] >= 0) out.push_back(double(logp[i]));
  return out;
}

std::pair<Method, ObjectiveParams> MethodOf(const std::string& name, const nlohmann::json& hp) {
  ObjectiveParams op;
  op.beta = hp.value("beta", 0.1);
  op.gamma = hp.value("gamma", 0.5);
  op.lambda = hp.value("lambda", 0.1);
  op.label_smoothing = hp.value("label_smoothing", 0.0);
  auto m = ParseMethod(name == "dpo_ls" ? "dpo" : name);
  EXPECT_TRUE(m.ok()) << name;
  return {m.ok() ? *m : Method::kSft, op};
}

struct Bounds {
  double logp, loss, grad;
};

struct Worst {
  double logp = 0, loss = 0, grad = 0;
};

template <class Real>
Worst CompareToGolden(const std::string& name, const Bounds& bound_in) {
  Worst worst;
  testing::TempDir dir("golden_" + name + (sizeof(Real) == 4 ? "_f32" : "_f64"));
  const Golden g = LoadGolden(name);
  if (!g.st) return worst;
  auto model = Load(SynthHf(dir, name));
  if (!model || !SameModel(*model, g, name)) return worst;
  const model::ModelConfig& c = model->config();
  // The one constant that is not f32-exact: ModelConfig::attn_scale is a
  // float, 1/sqrt(Dh) rounded (relative 1.7e-8 at Dh = 32, tiny-qwen3; exact
  // at Dh = 16), while torch uses the float64 value. The errors it causes
  // scale with it (measured ~2.3x on the gradients), so the double route's
  // bound gains 10x that rounding. Every other constant (eps, softcaps, embed
  // scale, rope theta) is f32-exact in case.json.
  const double want_scale = g.info["derived"]["attn_scale"].get<double>();
  const double scale_rounding = std::abs(double(c.attn_scale) - want_scale) / want_scale;
  EXPECT_LT(scale_rounding, 1e-7) << name << " attention scale " << c.attn_scale << " vs "
                                  << want_scale;
  Bounds bound = bound_in;
  if constexpr (sizeof(Real) == 8) {
    bound.logp += 10 * scale_rounding;
    bound.loss += 10 * scale_rounding;
    bound.grad += 10 * scale_rounding;
  }
  const LoraLayout layout = GoldenLayout(c);
  const std::vector<double> w = Flatten(g, layout, "lora.");
  LoraParams<Real> params;
  params.w.assign(w.begin(), w.end());  // f32-exact values

  ThreadPool* pool = sizeof(Real) == 4 ? model->pool() : nullptr;
  Graph<Real> graph(c, model->weights(), &layout, pool);
  PlainHead<Real> head(c, model->weights(), pool);
  Pack pk = PackPairs(g);
  const PackedBatch& b = pk.batch;

  auto check_logp = [&](const std::vector<Real>& logp, const std::string& prefix) {
    for (size_t i = 0; i < pk.pairs.size(); ++i)
      for (const char* side : {"chosen", "rejected"}) {
        const std::string key = prefix + std::to_string(i) + "." + side;
        const std::vector<double> want = g.Get(key);
        const int s = std::string(side) == "chosen" ? pk.pairs[i].chosen : pk.pairs[i].rejected;
        const std::vector<double> got = SeqLogp(b, logp, s);
        ASSERT_EQ(got.size(), want.size()) << key;
        for (size_t t = 0; t < got.size(); ++t) {
          const double err = std::abs(got[t] - want[t]) / std::max(1.0, std::abs(want[t]));
          worst.logp = std::max(worst.logp, err);
          EXPECT_LT(err, bound.logp)
              << name << " " << key << "[" << t << "]: " << got[t] << " vs golden " << want[t];
        }
      }
  };

  // The reference model (adapter off): per-token log-probs and the pairs' sums.
  {
    const auto& h = graph.Forward(b, nullptr, {}, false);
    std::vector<Real> logp;
    head.Forward(h.data(), b, logp, false);
    check_logp(logp, "ref_logp.");
    for (Pair& p : pk.pairs) {
      for (double x : SeqLogp(b, logp, p.chosen)) p.ref_chosen += x;
      for (double x : SeqLogp(b, logp, p.rejected)) p.ref_rejected += x;
    }
  }

  for (const char* mname : kMethods) {
    const auto [method, op] = MethodOf(mname, g.info["hyperparameters"][mname]);
    const auto& h = graph.Forward(b, &params, {}, true);
    std::vector<Real> logp, dlogp, dh;
    head.Forward(h.data(), b, logp, true);
    if (std::string(mname) == "sft") check_logp(logp, "logp.");
    const ObjectiveResult r = Objective(method, op, b, logp, pk.pairs, dlogp);
    const double want_loss = g.Get(std::string("loss.") + mname).at(0);
    const double lerr = std::abs(r.loss - want_loss) / std::max(1.0, std::abs(want_loss));
    worst.loss = std::max(worst.loss, lerr);
    EXPECT_LT(lerr, bound.loss) << name << " loss." << mname << ": " << r.loss << " vs golden "
                                << want_loss;

    head.Backward(dlogp.data(), dh);
    LoraParams<Real> grad;
    grad.w.assign(params.w.size(), Real(0));
    graph.Backward(b, params, dh.data(), grad);
    const std::vector<double> want = Flatten(g, layout, std::string("grad.") + mname + ".");
    for (const LoraSlot& s : layout.slots)
      for (const char ab : {'A', 'B'}) {
        const int64_t off = ab == 'A' ? s.a_off : s.b_off;
        const int64_t n = (ab == 'A' ? s.k : s.n) * layout.cfg.rank;
        double num = 0, den = 0;
        for (int64_t i = off; i < off + n; ++i) {
          num += (double(grad.w[i]) - want[i]) * (double(grad.w[i]) - want[i]);
          den += want[i] * want[i];
        }
        const double rel = std::sqrt(num / std::max(den, 1e-300));
        worst.grad = std::max(worst.grad, rel);
        EXPECT_LT(rel, bound.grad) << name << " grad." << mname << "." << SlotName(s) << "." << ab
                                   << ": relative L2 error (|golden| = " << std::sqrt(den) << ")";
      }
  }
  return worst;
}

class GoldenTrain : public ::testing::TestWithParam<const char*> {};

TEST_P(GoldenTrain, FloatRouteMatchesTorchFloat64) {
  const Worst w = CompareToGolden<float>(GetParam(), {1e-5, 1e-4, 1e-4});
  std::printf("  %s f32: worst logp %.2e, loss %.2e, grad (rel L2) %.2e\n", GetParam(), w.logp,
              w.loss, w.grad);
}

TEST_P(GoldenTrain, DoubleRouteMatchesTorchFloat64) {
  const Worst w = CompareToGolden<double>(GetParam(), {1e-9, 1e-9, 1e-9});
  std::printf("  %s f64: worst logp %.2e, loss %.2e, grad (rel L2) %.2e\n", GetParam(), w.logp,
              w.loss, w.grad);
}

INSTANTIATE_TEST_SUITE_P(Golden, GoldenTrain, ::testing::ValuesIn(kCases), TestName);

class AdapterPeft : public ::testing::TestWithParam<const char*> {};

// torch's PEFT files load with the golden's values, and applied unmerged give
// peft_logits (base_logits without them).
TEST_P(AdapterPeft, TorchAdapterGivesGoldenLogits) {
  const std::string name = GetParam();
  testing::TempDir dir("peft_" + name);
  const Golden g = LoadGolden(name);
  ASSERT_TRUE(g.st);
  const std::string hf = SynthHf(dir, name);
  auto base = Load(hf);
  ASSERT_TRUE(base);
  ASSERT_TRUE(SameModel(*base, g, name));
  const double base_err = LogitError(Logits(*base, FirstSequence(g)), g.Get("base_logits"));
  EXPECT_LT(base_err, 1e-4) << name << " base logits";

  const std::string peft = CaseDir(name) + "/peft";
  auto a = engine::LoadAdapter(peft, base->config());
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->rank, 4);
  EXPECT_EQ(a->Scale(), 2.0f);
  EXPECT_EQ(a->pairs.size(), size_t(2 * kNumTargets));
  for (const engine::AdapterPair& p : a->pairs) {
    const std::string key =
        "lora." + std::to_string(p.layer) + "." + std::string(kTargetNames[p.target]);
    const std::vector<double> ga = g.Get(key + ".A"), gb = g.Get(key + ".B");
    ASSERT_EQ(p.a.size(), ga.size()) << key;
    ASSERT_EQ(p.b.size(), gb.size()) << key;
    for (size_t i = 0; i < ga.size(); ++i) ASSERT_EQ(double(p.a[i]), ga[i]) << key << ".A " << i;
    for (size_t i = 0; i < gb.size(); ++i) ASSERT_EQ(double(p.b[i]), gb[i]) << key << ".B " << i;
  }

  auto adapted = Load(hf, peft);
  ASSERT_TRUE(adapted);
  const std::vector<float> unmerged = Logits(*adapted, FirstSequence(g));
  const double peft_err = LogitError(unmerged, g.Get("peft_logits"));
  EXPECT_LT(peft_err, 1e-4) << name << " peft logits";
  // The adapter really moves the logits (so the bound above tests it).
  EXPECT_GT(LogitError(g.Get("peft_logits"), g.Get("base_logits")), 1e-2);

  // Merged: ConvertModel folds the attached adapter into the weights.
  const std::string merged = (dir.path() / "merged").string();
  const Status s = engine::ConvertModel(*adapted, engine::OutputFormat::kHf, merged, DType::kF32);
  ASSERT_TRUE(s.ok()) << s.message();
  auto mm = Load(merged);
  ASSERT_TRUE(mm);
  EXPECT_EQ(mm->adapter(), nullptr);
  const double merged_err = LogitError(Logits(*mm, FirstSequence(g)), unmerged);
  EXPECT_LT(merged_err, 1e-4) << name << " merged vs unmerged";
  std::printf("  %s: base %.2e, peft %.2e, merged vs unmerged %.2e (max |d| / max|logit|)\n",
              name.c_str(), base_err, peft_err, merged_err);
}

INSTANTIATE_TEST_SUITE_P(Adapter, AdapterPeft, ::testing::ValuesIn(kCases), TestName);

LoraParams<float> RandomParams(const LoraLayout& layout, uint64_t seed) {
  LoraParams<float> p;
  p.w.resize(layout.size);
  for (int64_t i = 0; i < layout.size; ++i)
    p.w[i] = float(0.2 * (Uniform01(HashKey({seed, uint64_t(i)})) - 0.5));
  return p;
}

// Save, load back: every A and B bit-identical, in the base's row order.
void ExpectRoundTrip(const engine::Adapter& a, const model::ModelConfig& c, const std::string& d) {
  ASSERT_TRUE(engine::SaveAdapter(d, a, c).ok());
  auto back = engine::LoadAdapter(d, c);
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(back->rank, a.rank);
  EXPECT_EQ(back->alpha, a.alpha);
  ASSERT_EQ(back->pairs.size(), a.pairs.size());
  for (size_t i = 0; i < a.pairs.size(); ++i) {
    const engine::AdapterPair &x = a.pairs[i], &y = back->pairs[i];
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.target, y.target);
    ASSERT_EQ(x.a.size(), y.a.size());
    ASSERT_EQ(x.b.size(), y.b.size());
    EXPECT_EQ(std::memcmp(x.a.data(), y.a.data(), x.a.size() * 4), 0) << "pair " << i << " A";
    EXPECT_EQ(std::memcmp(x.b.data(), y.b.data(), x.b.size() * 4), 0) << "pair " << i << " B";
  }
}

TEST(AdapterRoundTrip, HfModelBitIdentical) {
  testing::TempDir dir("rt_hf");
  auto model = Load(SynthHf(dir, "tiny-qwen3"));
  ASSERT_TRUE(model);
  const LoraLayout layout = GoldenLayout(model->config());
  ExpectRoundTrip(ToAdapter(layout, RandomParams(layout, 3), "test"), model->config(),
                  (dir.path() / "adapter").string());
}

// GGUF llama stores q/k rows interleaved for RoPE: B's q/k rows are permuted
// to HF's order in the file and back on load.
TEST(AdapterRoundTrip, GgufLlamaPermutesQkRowsBothWays) {
  testing::TempDir dir("rt_gguf");
  auto gguf = testing::SynthModel(dir, "tiny-llama", 2);
  ASSERT_TRUE(gguf);
  const model::ModelConfig& c = gguf->config();
  ASSERT_EQ(c.rope_style, kernels::RopeStyle::kInterleaved);
  const LoraLayout layout = GoldenLayout(c);
  const engine::Adapter a = ToAdapter(layout, RandomParams(layout, 5), "test");
  const std::string ad = (dir.path() / "adapter").string();
  ExpectRoundTrip(a, c, ad);

  // The file holds q's B in HF order: a row permutation of the in-memory B,
  // not the identity.
  auto st = formats::SafetensorsFile::Open(ad + "/adapter_model.safetensors");
  ASSERT_TRUE(st.ok());
  const formats::SafetensorsTensor* qb = st->Find(engine::AdapterTensorName(0, 0, 'B'));
  ASSERT_TRUE(qb);
  const engine::AdapterPair& q0 = a.pairs[0];
  ASSERT_EQ(q0.target, int(Target::kQ));
  EXPECT_NE(std::memcmp(qb->view.data, q0.b.data(), q0.b.size() * 4), 0);
  const std::vector<int64_t> perm =
      model::RopeRowPermutation(c.n_heads, c.head_dim, /*to_interleaved=*/false);
  const float* file_b = static_cast<const float*>(qb->view.data);
  for (int64_t row = 0; row < q0.n; ++row)
    for (int j = 0; j < a.rank; ++j)
      ASSERT_EQ(file_b[row * a.rank + j], q0.b[perm[row] * a.rank + j]) << "q B row " << row;

  // Applied to the GGUF model and to its HF conversion: the same logits.
  const std::string hf = (dir.path() / "hf").string();
  ASSERT_TRUE(engine::ConvertModel(*gguf, engine::OutputFormat::kHf, hf, DType::kF32).ok());
  auto on_gguf = Load((dir.path() / "tiny-llama.gguf").string(), ad);
  auto on_hf = Load(hf, ad);
  ASSERT_TRUE(on_gguf && on_hf);
  ASSERT_EQ(on_hf->config().rope_style, kernels::RopeStyle::kHalf);
  const std::vector<int32_t> toks = {1, 17, 300, 42, 9, 250, 77, 3, 128, 64, 5};
  const std::vector<float> lg = Logits(*on_gguf, toks), lh = Logits(*on_hf, toks);
  const double err = LogitError(lh, lg);
  EXPECT_LT(err, 1e-4);
  EXPECT_GT(LogitError(Logits(*gguf, toks), lg), 1e-3);  // the adapter does something
  std::printf("  gguf adapter on gguf vs hf: %.2e\n", err);
}

}  // namespace
}  // namespace lumen::train
