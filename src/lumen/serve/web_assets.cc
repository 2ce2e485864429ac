// The web app's bundle (web/, built by cmake/web.cmake with esbuild) embedded
// with .incbin. Without node or web/node_modules at configure time
// LUMEN_WEB_UI_BUILT is 0, nothing is embedded and / says how to build it.
#include <array>

#include "lumen/serve/web_ui.h"

#if LUMEN_WEB_UI_BUILT
#include LUMEN_WEB_BUNDLE_HASH_H  // the bundle's hash, so ccache sees new bytes

#define LUMEN_WEB_INCBIN(sym, file)        \
  ".global lumen_web_" sym                 \
  "_begin\n"                               \
  "lumen_web_" sym                         \
  "_begin:\n"                              \
  ".incbin \"" LUMEN_WEB_DIST_DIR "/" file \
  "\"\n"                                   \
  ".global lumen_web_" sym                 \
  "_end\n"                                 \
  "lumen_web_" sym "_end:\n"

asm(".section .rodata\n"
    ".balign 16\n" LUMEN_WEB_INCBIN("index", "index.html") LUMEN_WEB_INCBIN("js", "app.js")
        LUMEN_WEB_INCBIN("css", "app.css") LUMEN_WEB_INCBIN("icon", "favicon.svg") ".previous\n");

extern "C" const char lumen_web_index_begin[], lumen_web_index_end[];
extern "C" const char lumen_web_js_begin[], lumen_web_js_end[];
extern "C" const char lumen_web_css_begin[], lumen_web_css_end[];
extern "C" const char lumen_web_icon_begin[], lumen_web_icon_end[];
#endif

namespace lumen::serve {

std::string_view WebBundleHash() {
#if LUMEN_WEB_UI_BUILT
  return LUMEN_WEB_BUNDLE_HASH;
#else
  return {};
#endif
}

std::span<const WebAsset> WebAssets() {
#if LUMEN_WEB_UI_BUILT
  auto view = [](const char* b, const char* e) {
    return std::string_view(b, static_cast<size_t>(e - b));
  };
  static const std::array<WebAsset, 4> kAssets = {{
      {"/", "text/html; charset=utf-8", view(lumen_web_index_begin, lumen_web_index_end)},
      {"/ui/app.js", "text/javascript; charset=utf-8", view(lumen_web_js_begin, lumen_web_js_end)},
      {"/ui/app.css", "text/css; charset=utf-8", view(lumen_web_css_begin, lumen_web_css_end)},
      {"/ui/favicon.svg", "image/svg+xml", view(lumen_web_icon_begin, lumen_web_icon_end)},
  }};
  return kAssets;
#else
  return {};
#endif
}

}  // namespace lumen::serve
