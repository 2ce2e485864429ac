#include "lumen/eval/sampling_eval.h"

#include <cmath>
#include <fstream>
#include <limits>

#include "lumen/engine/session.h"
#include "lumen/kernels/vecmath.h"
#include "lumen/sample/sampler.h"

namespace lumen::eval {

namespace {

uint64_t SampleSeed(uint64_t seed, size_t prompt, size_t sample) {
  return seed * 0x9E3779B97F4A7C15ull + prompt * 1000003ull + sample * 7919ull + 1;
}

// Free-running generation of opts.samples continuations of one prompt with
// `config` (its seed replaced per sample). on_token(probs-or-null, logp_base,
// token) is called for every generated token.
template <class F>
Status Generate(const engine::Model& model, const Seq& prompt, size_t prompt_index,
                const sample::SamplerConfig& config, const EvalOptions& opts, bool want_probs,
                std::vector<Seq>& out, F on_token) {
  LUMEN_ASSIGN_OR_RETURN(auto session, engine::Session::Create(model, {}));
  if (static_cast<int64_t>(prompt.size()) + opts.max_tokens > session->ctx()) {
    return Errorf("prompt {}: {} tokens + --max-tokens {} exceed the context {}", prompt_index,
                  prompt.size(), opts.max_tokens, session->ctx());
  }
  LUMEN_RETURN_IF_ERROR(session->Append(prompt));
  const std::vector<float> prompt_logits(session->logits().begin(), session->logits().end());
  const auto& tok = model.tokenizer();
  std::vector<float> work, lsm(prompt_logits.size()), probs;
  out.assign(opts.samples, {});
  for (int s = 0; s < opts.samples; ++s) {
    sample::SamplerConfig c = config;
    c.seed = SampleSeed(opts.seed, prompt_index, s);
    LUMEN_ASSIGN_OR_RETURN(sample::Sampler sampler, sample::Sampler::Create(c));
    const int64_t kept = session->Truncate(static_cast<int64_t>(prompt.size()));
    if (kept < static_cast<int64_t>(prompt.size())) {
      LUMEN_RETURN_IF_ERROR(session->Append(std::span(prompt).subspan(kept)));
      work.assign(session->logits().begin(), session->logits().end());
    } else {
      work = prompt_logits;
    }
    Seq history = prompt;
    for (int t = 0; t < opts.max_tokens; ++t) {
      kernels::LogSoftmax(work.data(), work.size(), lsm.data());
      if (want_probs) sampler.Distribution(work, history, probs);
      const int32_t id = sampler.Sample(work, history);
      on_token(want_probs ? &probs : nullptr, static_cast<double>(lsm[id]), id);
      out[s].push_back(id);
      history.push_back(id);
      if (tok.IsEog(id)) break;
      LUMEN_RETURN_IF_ERROR(session->Append(std::span(&id, 1)));
      work.assign(session->logits().begin(), session->logits().end());
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<std::string>> ReadPrompts(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Errorf("{}: cannot open the prompt file", path);
  std::vector<std::string> out;
  std::string line;
  while (std::getline(in, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty() || line[0] == '#') continue;
    std::string p;
    for (size_t i = 0; i < line.size(); ++i) {
      if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == 'n') {
        p += '\n';
        ++i;
      } else {
        p += line[i];
      }
    }
    out.push_back(std::move(p));
  }
  if (out.empty()) return Errorf("{}: no prompts (one per non-empty line)", path);
  return out;
}

Result<std::vector<Seq>> EncodePrompts(const engine::Model& model,
                                       std::span<const std::string> prompts) {
  std::vector<Seq> out;
  for (size_t i = 0; i < prompts.size(); ++i) {
    Seq ids = model.tokenizer().Encode(prompts[i], /*add_special=*/true);
    if (ids.empty()) return Errorf("prompt {}: encodes to no tokens", i + 1);
    out.push_back(std::move(ids));
  }
  return out;
}

Result<DiversityResult> Diversity(const engine::Model& model, std::span<const Seq> prompts,
                                  const sample::SamplerConfig& config, const EvalOptions& opts) {
  if (config.temperature <= 0) return Error("diversity: temperature 0 (greedy) has one sample");
  DiversityResult r;
  double nll = 0, ent = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    std::vector<Seq> seqs;
    LUMEN_RETURN_IF_ERROR(Generate(model, prompts[p], p, config, opts, /*want_probs=*/true, seqs,
                                   [&](const std::vector<float>* probs, double logp, int32_t) {
                                     nll -= logp;
                                     ent += Entropy(*probs);
                                     ++r.tokens;
                                   }));
    r.distinct1 += DistinctN(seqs, 1);
    r.distinct2 += DistinctN(seqs, 2);
    r.self_bleu += SelfBleu(seqs);
    r.samples.push_back(std::move(seqs));
  }
  const double np = static_cast<double>(prompts.size());
  r.distinct1 /= np;
  r.distinct2 /= np;
  r.self_bleu /= np;
  r.nll = r.tokens ? nll / r.tokens : 0;
  r.entropy = r.tokens ? ent / r.tokens : 0;
  return r;
}

Result<std::vector<std::vector<Seq>>> BaseContinuations(const engine::Model& model,
                                                        std::span<const Seq> prompts,
                                                        const EvalOptions& opts) {
  std::vector<std::vector<Seq>> out(prompts.size());
  sample::SamplerConfig base;  // T = 1, nothing else
  for (size_t p = 0; p < prompts.size(); ++p)
    LUMEN_RETURN_IF_ERROR(Generate(model, prompts[p], p, base, opts, /*want_probs=*/false, out[p],
                                   [](const std::vector<float>*, double, int32_t) {}));
  return out;
}

Result<ForcedRows> BaseForcedRows(const engine::Model& model, std::span<const Seq> prompts,
                                  const EvalOptions& opts) {
  ForcedRows rows;
  rows.vocab = model.config().vocab_size;
  LUMEN_ASSIGN_OR_RETURN(auto all_conts, BaseContinuations(model, prompts, opts));
  for (size_t p = 0; p < prompts.size(); ++p) {
    for (const Seq& cont : all_conts[p]) {
      // One forward over prompt + continuation; row j predicts token j + 1.
      LUMEN_ASSIGN_OR_RETURN(auto session, engine::Session::Create(model, {}));
      Seq all = prompts[p];
      all.insert(all.end(), cont.begin(), cont.end());
      std::vector<float> logits;
      LUMEN_RETURN_IF_ERROR(session->Append(all, &logits));
      for (size_t j = 0; j < cont.size(); ++j) {
        const size_t row = prompts[p].size() - 1 + j;
        rows.logits.insert(rows.logits.end(), logits.begin() + row * rows.vocab,
                           logits.begin() + (row + 1) * rows.vocab);
        rows.next.push_back(cont[j]);
        rows.histories.emplace_back(all.begin(), all.begin() + row + 1);
      }
    }
  }
  return rows;
}

Result<ForcedResult> Forced(const ForcedRows& rows, const sample::SamplerConfig& config) {
  LUMEN_ASSIGN_OR_RETURN(sample::Sampler sampler, sample::Sampler::Create(config));
  ForcedResult r;
  const size_t v = static_cast<size_t>(rows.vocab);
  std::vector<float> base(v), q;
  double kl = 0, klf = 0, ent = 0, bent = 0;
  for (size_t i = 0; i < rows.next.size(); ++i) {
    std::span<const float> x(rows.logits.data() + i * v, v);
    kernels::LogSoftmax(x.data(), v, base.data());
    for (float& b : base) b = std::exp(b);
    sampler.Distribution(x, rows.histories[i], q);
    const double k = Kl(base, q);
    if (std::isinf(k)) {
      ++r.inf_positions;
    } else {
      klf += k;
    }
    kl += k;
    ent += Entropy(q);
    bent += Entropy(base);
    ++r.tokens;
  }
  if (r.tokens == 0) return Error("no teacher-forced positions (empty continuations)");
  const double n = static_cast<double>(r.tokens);
  r.kl = kl / n;
  r.kl_finite = r.tokens > r.inf_positions ? klf / (n - r.inf_positions) : 0;
  r.entropy = ent / n;
  r.base_entropy = bent / n;
  return r;
}

Result<MatchResult> MatchTemperature(const ForcedRows& rows, const sample::SamplerConfig& setting,
                                     double t_lo, double t_hi, double tol) {
  MatchResult m;
  LUMEN_ASSIGN_OR_RETURN(ForcedResult target, Forced(rows, setting));
  m.target_entropy = target.entropy;
  auto entropy_at = [&](double t) -> Result<double> {
    sample::SamplerConfig c;
    c.temperature = t;
    LUMEN_ASSIGN_OR_RETURN(ForcedResult f, Forced(rows, c));
    return f.entropy;
  };
  // Entropy grows with T: bisection on log T.
  double lo = std::log(t_lo), hi = std::log(t_hi);
  LUMEN_ASSIGN_OR_RETURN(double h_lo, entropy_at(t_lo));
  LUMEN_ASSIGN_OR_RETURN(double h_hi, entropy_at(t_hi));
  if (!(h_lo <= m.target_entropy && m.target_entropy <= h_hi)) {
    return Errorf("match: target entropy {:.4f} is outside [{:.4f}, {:.4f}] (T in [{}, {}])",
                  m.target_entropy, h_lo, h_hi, t_lo, t_hi);
  }
  double t = 1, h = 0;
  for (m.iterations = 1; m.iterations <= 60; ++m.iterations) {
    t = std::exp(0.5 * (lo + hi));
    LUMEN_ASSIGN_OR_RETURN(h, entropy_at(t));
    if (std::fabs(h - m.target_entropy) <= tol) break;
    (h < m.target_entropy ? lo : hi) = std::log(t);
  }
  m.temperature = t;
  m.entropy = h;
  return m;
}

}  // namespace lumen::eval
