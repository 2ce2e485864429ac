// The CPU's vendor, for the choices measured per vendor rather than per
// feature (the bf16 prefill, the decode rows' prefetch level): a feature
// flag says what runs, not how fast. Read once, on first use.
#pragma once

namespace lumen::kernels {

// True on an AMD x86-64 CPU.
inline bool CpuIsAmd() {
#if defined(__x86_64__)
  static const bool amd = [] {
    __builtin_cpu_init();
    return __builtin_cpu_is("amd");
  }();
  return amd;
#else
  return false;
#endif
}

}  // namespace lumen::kernels
