# The web app (web/): bundled with esbuild by web/build.mjs into
# ${PROJECT_BINARY_DIR}/web-dist and embedded into lumen_serve by
# src/lumen/serve/web_assets.cc (.incbin). Needs node and web/node_modules
# (`npm ci --prefix web`, done by scripts/setup.sh) at configure time; without
# them the build still succeeds and / says the UI was not built.
set(web_src ${PROJECT_SOURCE_DIR}/web)
set(web_dist ${PROJECT_BINARY_DIR}/web-dist)
set(web_assets_cc ${PROJECT_SOURCE_DIR}/src/lumen/serve/web_assets.cc)
find_program(LUMEN_NODE_FOR_WEB node)
if(LUMEN_NODE_FOR_WEB AND EXISTS ${web_src}/node_modules/esbuild/package.json)
  file(GLOB_RECURSE web_inputs CONFIGURE_DEPENDS ${web_src}/src/*)
  set(web_outputs ${web_dist}/index.html ${web_dist}/app.js ${web_dist}/app.css
                  ${web_dist}/favicon.svg ${web_dist}/bundle_hash.h)
  add_custom_command(
    OUTPUT ${web_outputs}
    COMMAND ${LUMEN_NODE_FOR_WEB} ${web_src}/build.mjs --out ${web_dist}
    DEPENDS ${web_inputs} ${web_src}/build.mjs ${web_src}/package-lock.json
    WORKING_DIRECTORY ${web_src}
    COMMENT "Bundling the web app (web/ -> web-dist)"
    VERBATIM)
  add_custom_target(lumen_web DEPENDS ${web_outputs})
  add_dependencies(lumen_serve lumen_web)
  set_source_files_properties(${web_assets_cc} PROPERTIES
    COMPILE_DEFINITIONS
      "LUMEN_WEB_UI_BUILT=1;LUMEN_WEB_DIST_DIR=\"${web_dist}\";LUMEN_WEB_BUNDLE_HASH_H=\"${web_dist}/bundle_hash.h\""
    OBJECT_DEPENDS "${web_outputs}")
  message(STATUS "lumen: web app enabled (node ${LUMEN_NODE_FOR_WEB})")
else()
  set_source_files_properties(${web_assets_cc} PROPERTIES COMPILE_DEFINITIONS "LUMEN_WEB_UI_BUILT=0")
  message(STATUS "lumen: web app NOT built (needs node and web/node_modules: npm ci --prefix web)")
endif()
