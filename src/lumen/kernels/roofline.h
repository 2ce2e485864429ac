// Machine limits for the roofline in `lumen bench`: read bandwidth of a
// streamed buffer and the f32 FMA peak of the SIMD target the kernels run on.
// Measurement loops live here because only kernels/ may use Highway.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lumen::kernels {

// Reads bytes [0, size) of p with full-width vector loads (4 independent
// streams); returns a value that depends on every byte so the loads stay.
uint64_t StreamRead(const void* p, size_t size);

// Runs independent FMA chains for about `seconds` on the calling thread and
// returns the achieved f32 FLOP/s (2 per lane per FMA): one core's measured
// peak for the best target.
double MeasureFmaFlops(double seconds);

// Peaks of the dot-product instructions that prefill could use, measured the
// same way (independent chains, one thread): AVX512-BF16 `vdpbf16ps` in f32
// FLOP/s (2 products and 2 adds per f32 lane) and AVX512-VNNI `vpdpbusd` in
// int8 OP/s (4 products and 4 adds per int32 lane). 0 when the CPU lacks it.
double MeasureBf16DotFlops(double seconds);
double MeasureInt8DotOps(double seconds);

// The AMX-BF16 tiles' peak, measured the same way: four independent C tiles
// each accumulating `tdpbf16ps` of two fixed A and two fixed B tiles (16 x 16
// x 32 products, 16384 FLOP per instruction), one thread. 0 when
// AmxBf16Usable() is false (matmul_bf16_amx.h: no tiles, or LUMEN_NO_AMX).
double MeasureAmxBf16Flops(double seconds);

// Name of the Highway target the kernels dispatch to on this CPU ("AVX3", "AVX2"...)
// and its f32 lanes per vector.
const char* KernelTargetName();
int KernelF32Lanes();

}  // namespace lumen::kernels
