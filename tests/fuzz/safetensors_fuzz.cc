// libFuzzer target for the safetensors reader: parse arbitrary bytes and, when
// they parse, read every byte of every tensor view (so ASan catches any view
// that points outside the input). Seeds and crashers: corpus/safetensors/,
// replayed by SafetensorsFuzzCorpus in src/lumen/formats/safetensors_test.cc.
#include <cstddef>
#include <cstdint>

#include "lumen/formats/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = lumen::formats::SafetensorsFile::FromBytes(data, size, "fuzz.safetensors");
  if (!f.ok()) return 0;
  uint8_t acc = 0;
  for (const auto& t : f->tensors()) {
    const auto* p = static_cast<const uint8_t*>(t.view.data);
    const size_t n = t.view.byte_size();
    if (n != t.data_end - t.data_begin) __builtin_trap();
    for (size_t i = 0; i < n; ++i) acc ^= p[i];
    if (f->Find(t.name) != &t) __builtin_trap();
  }
  for (const auto& [k, v] : f->metadata().items()) acc ^= static_cast<uint8_t>(k.size() + v.size());
  volatile uint8_t sink = acc;
  (void)sink;
  return 0;
}
