// Whether the bf16 prefill route is faster than the exact one on this CPU
// (matmul_bf16.h): measured, not read off a feature list, because CPUs with
// the same AVX512-BF16 flag run `vdpbf16ps` at very different rates.
#include <algorithm>

#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"
#include "lumen/kernels/roofline.h"

namespace lumen::kernels {

bool Bf16PrefillPays() {
  static const bool pays = [] {  // a property of the CPU, fixed for the process
    if (AmxBf16Usable()) return true;
    if (!CpuHasBf16()) return false;
    // Alternating short probes (about 3 ms each), the best of two each, so a
    // frequency step or a neighbour's burst in one probe does not decide.
    MeasureFmaFlops(0.001);  // warm-up: the core at its vector clock
    double bf16 = 0, fma = 0;
    for (int round = 0; round < 2; ++round) {
      bf16 = std::max(bf16, MeasureBf16DotFlops(0.003));
      fma = std::max(fma, MeasureFmaFlops(0.003));
    }
    return bf16 >= kBf16PrefillMinGain * fma;
  }();
  return pays;
}

}  // namespace lumen::kernels
