// libFuzzer target for the tokenizer.json loader: parse arbitrary bytes as a
// tokenizer.json; when they load, encode and decode a fixed set of strings
// (including special-token text and invalid UTF-8). Nothing may crash or hang.
#include <cstddef>
#include <cstdint>
#include <string>

#include "lumen/tokenize/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto tok = lumen::tokenize::Tokenizer::FromHfJson(bytes, "", "fuzz/tokenizer.json");
  if (!tok.ok()) return 0;
  static const char* kTexts[] = {"Hello world! 123 <s> <|im_start|>x", "  \t\n\n ",
                                 "e\xcc\x81 \xe6\x97\xa5\xe6\x9c\xac \xf0\x9f\x98\x80",
                                 "bad \xff\xfe \xc3", ""};
  for (const char* t : kTexts) {
    for (bool special : {false, true}) {
      auto ids = tok->Encode(t, special, special);
      std::string s = tok->Decode(ids, special);
      lumen::tokenize::StreamingDetokenizer sd(*tok);
      for (int32_t id : ids) s += sd.Push(id);
      s += sd.Flush();
    }
  }
  return 0;
}
