# The web UI (web/: Preact + uPlot, built by Vite) compiled into megactx_server.
# At build time web/build_web_ui.cmake copies web/ into <build>/web, runs
# `npm ci` there (offline first, only when package-lock.json changed), `vite
# build`, and web/embed_assets.mjs turns <build>/web/dist into
# <build>/generated/web_assets_data.cpp (web_assets.h). Without node/npm, with
# -DMEGACTX_WEB_UI=OFF, or when the npm step fails, that file holds no files
# and a note saying why: the server still builds and "/" says the UI was not
# built.
option(MEGACTX_WEB_UI "Build the web playground and dashboard (needs node and npm when building)" ON)
include(${CMAKE_CURRENT_LIST_DIR}/web_placeholder.cmake)

function(megactx_embed_web_ui target)
  set(web ${PROJECT_SOURCE_DIR}/web)
  set(out ${PROJECT_BINARY_DIR}/generated/web_assets_data.cpp)
  find_program(MEGACTX_NODE node)
  find_program(MEGACTX_NPM npm)
  if(MEGACTX_WEB_UI AND MEGACTX_NODE AND MEGACTX_NPM AND NOT MEGACTX_FUZZ)
    file(GLOB_RECURSE inputs CONFIGURE_DEPENDS ${web}/src/* ${web}/public/*)
    list(APPEND inputs ${web}/index.html ${web}/vite.config.js ${web}/package.json
         ${web}/package-lock.json ${web}/embed_assets.mjs ${web}/build_web_ui.cmake
         ${web}/web_placeholder.cmake)
    add_custom_command(
      OUTPUT ${out}
      COMMAND ${CMAKE_COMMAND} -DNODE=${MEGACTX_NODE} -DNPM=${MEGACTX_NPM} -DSOURCE=${web}
              -DWORK=${PROJECT_BINARY_DIR}/web -DOUT=${out} -P ${web}/build_web_ui.cmake
      DEPENDS ${inputs}
      COMMENT "web UI: npm ci, vite build, embedding web/dist"
      VERBATIM)
    message(STATUS "megactx: web UI ON (node ${MEGACTX_NODE})")
  else()
    if(MEGACTX_FUZZ)
      set(reason "this is the fuzzing build.")
    elseif(NOT MEGACTX_WEB_UI)
      set(reason "it was turned off (-DMEGACTX_WEB_UI=OFF).")
    else()
      set(reason "node and npm were not found when CMake configured the build.")
    endif()
    megactx_write_web_placeholder(${out} "${reason}")
    message(STATUS "megactx: web UI OFF: ${reason}")
  endif()
  target_sources(${target} PRIVATE ${out})
endfunction()
