#include "lumen/eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <set>

namespace lumen::eval {

namespace {
using Gram = std::vector<int32_t>;

std::map<Gram, int> Counts(const Seq& s, int n) {
  std::map<Gram, int> c;
  for (size_t i = 0; i + n <= s.size(); ++i) ++c[Gram(s.begin() + i, s.begin() + i + n)];
  return c;
}
}  // namespace

double DistinctN(std::span<const Seq> seqs, int n) {
  std::set<Gram> distinct;
  size_t total = 0;
  for (const Seq& s : seqs) {
    for (size_t i = 0; i + n <= s.size(); ++i) {
      distinct.insert(Gram(s.begin() + i, s.begin() + i + n));
      ++total;
    }
  }
  return total == 0 ? 0.0 : static_cast<double>(distinct.size()) / static_cast<double>(total);
}

double Bleu4(const Seq& cand, std::span<const Seq> refs) {
  if (cand.empty() || refs.empty()) return 0.0;
  double log_p = 0;
  for (int n = 1; n <= 4; ++n) {
    const auto cc = Counts(cand, n);
    std::map<Gram, int> max_ref;
    for (const Seq& r : refs) {
      for (const auto& [g, k] : Counts(r, n)) max_ref[g] = std::max(max_ref[g], k);
    }
    double match = 0, total = 0;
    for (const auto& [g, k] : cc) {
      total += k;
      const auto it = max_ref.find(g);
      if (it != max_ref.end()) match += std::min(k, it->second);
    }
    if (n == 1) {
      if (match == 0) return 0.0;
      log_p += std::log(match / total);
    } else {
      log_p += std::log((match + 1) / (total + 1));
    }
  }
  const double c = static_cast<double>(cand.size());
  double r = static_cast<double>(refs[0].size());
  for (const Seq& ref : refs) {
    const double len = static_cast<double>(ref.size());
    if (std::fabs(len - c) < std::fabs(r - c) ||
        (std::fabs(len - c) == std::fabs(r - c) && len < r))
      r = len;
  }
  const double bp = c < r ? std::exp(1.0 - r / c) : 1.0;
  return bp * std::exp(log_p / 4.0);
}

double SelfBleu(std::span<const Seq> seqs) {
  if (seqs.size() < 2) return 0.0;
  double sum = 0;
  std::vector<Seq> others;
  for (size_t i = 0; i < seqs.size(); ++i) {
    others.clear();
    for (size_t j = 0; j < seqs.size(); ++j) {
      if (j != i) others.push_back(seqs[j]);
    }
    sum += Bleu4(seqs[i], others);
  }
  return sum / static_cast<double>(seqs.size());
}

double Entropy(std::span<const float> p) {
  double h = 0;
  for (float v : p) {
    if (v > 0) h -= static_cast<double>(v) * std::log(static_cast<double>(v));
  }
  return h;
}

double Kl(std::span<const float> p, std::span<const float> q) {
  double kl = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (!(p[i] > 0)) continue;
    if (!(q[i] > 0)) return std::numeric_limits<double>::infinity();
    kl += static_cast<double>(p[i]) *
          (std::log(static_cast<double>(p[i])) - std::log(static_cast<double>(q[i])));
  }
  return kl;
}

}  // namespace lumen::eval
