// Code written with raw x86 intrinsics sits between LUMEN_INTRINSICS_BEGIN
// and LUMEN_INTRINSICS_END: GCC 12's AVX-512 intrinsics pass
// _mm512_undefined_* as the unused merge source, which -Wmaybe-uninitialized
// and -Wuninitialized report wherever they are inlined (false positives).
// The pair silences exactly those two warnings there and restores them after.
#pragma once

#define LUMEN_INTRINSICS_BEGIN                                                               \
  _Pragma("GCC diagnostic push") _Pragma("GCC diagnostic ignored \"-Wmaybe-uninitialized\"") \
      _Pragma("GCC diagnostic ignored \"-Wuninitialized\"")
#define LUMEN_INTRINSICS_END _Pragma("GCC diagnostic pop")
