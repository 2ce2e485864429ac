// libFuzzer target for the GGUF reader: parse arbitrary bytes, and when they
// parse, read every metadata value, the first and last byte of every tensor,
// and dequantize (a bounded prefix of) each tensor's first row. Anything the
// parser accepts must be safe to use this way.
#include <cstddef>
#include <cstdint>
#include <vector>

#include "lumen/core/quant.h"
#include "lumen/formats/gguf.h"

namespace {

void Touch(const lumen::formats::GgufValue& v, uint64_t* sink) {
  if (auto i = v.AsInt()) *sink += static_cast<uint64_t>(*i);
  if (auto f = v.AsFloat()) *sink += static_cast<uint64_t>(*f != 0);
  if (const auto* s = v.AsString()) *sink += s->size();
  if (const auto* a = v.AsArray()) {
    for (const auto& item : *a) Touch(item, sink);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto f = lumen::formats::GgufFile::FromBytes(data, size, "fuzz.gguf");
  if (!f.ok()) return 0;
  uint64_t sink = 0;
  for (const auto& [key, value] : f->metadata()) {
    sink += key.size();
    Touch(value, &sink);
  }
  std::vector<float> row;
  for (const auto& t : f->tensors()) {
    const auto* p = static_cast<const uint8_t*>(t.view.data);
    sink += p[0] + p[t.nbytes - 1];
    // Rows are whole blocks; 4096 is a multiple of every block size.
    const int64_t n = t.view.cols() < 4096 ? t.view.cols() : 4096;
    row.resize(static_cast<size_t>(n));
    lumen::DequantizeRow(t.dtype, t.view.data, row.data(), n);
    sink += static_cast<uint64_t>(row[0] == row[0]);
  }
  volatile uint64_t keep = sink;
  (void)keep;
  return 0;
}
