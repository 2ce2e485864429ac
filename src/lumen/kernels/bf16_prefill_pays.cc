// Whether the bf16 prefill route is faster than the exact one on this CPU
// (matmul_bf16.h). Decided from the CPU's identity, not timed at start: a
// probe timed while other processes share the cores gave the other answer in
// a test run (session 39), and a default route must not depend on the load.
#include "lumen/kernels/cpu_vendor.h"
#include "lumen/kernels/matmul_bf16.h"
#include "lumen/kernels/matmul_bf16_amx.h"

namespace lumen::kernels {

bool Bf16PrefillPays() {
  if (AmxBf16Usable()) return true;
  if (!CpuHasBf16()) return false;
  // Measured (`lumen bench`'s prefill line, one core): AMD Zen 5 runs
  // vdpbf16ps at 1.8-1.9x its f32 FMA rate; an Intel Xeon without AMX at
  // 0.5x, where the exact GEMM's prefill is 1.03-1.42x the bf16 one.
  return CpuIsAmd();
}

}  // namespace lumen::kernels
