# cmake -DNODE= -DNPM= -DSOURCE=web -DWORK=<build>/web -DOUT=<file.cpp> -P build_web_ui.cmake
# Builds the UI in a copy of web/ inside the build folder (each build folder
# has its own node_modules, so two builds never race on one), then embeds
# dist/. Any failure leaves a placeholder (the server says why at "/") and
# a warning, not a broken build.
include(${CMAKE_CURRENT_LIST_DIR}/web_placeholder.cmake)

function(give_up what log)
  message(WARNING "web UI not built: ${what}\n${log}")
  string(LENGTH "${log}" length)
  if(length GREATER 600)
    math(EXPR start "${length} - 600")
    string(SUBSTRING "${log}" ${start} 600 log)
  endif()
  if(log STREQUAL "")
    megactx_write_web_placeholder(${OUT} "${what}.")
  else()
    megactx_write_web_placeholder(${OUT} "${what} (the build printed: ${log})")
  endif()
  # Newer than its inputs, so the build does not retry on every run; touch a
  # file under web/ (or delete this one) to try again.
  file(TOUCH ${OUT})
endfunction()

file(MAKE_DIRECTORY ${WORK})
foreach(name index.html vite.config.js package.json package-lock.json)
  file(COPY_FILE ${SOURCE}/${name} ${WORK}/${name} ONLY_IF_DIFFERENT)
endforeach()
file(REMOVE_RECURSE ${WORK}/src ${WORK}/public)
file(COPY ${SOURCE}/src ${SOURCE}/public DESTINATION ${WORK})

# npm ci wipes node_modules: run it only when the lock file changed.
file(SHA256 ${SOURCE}/package-lock.json lock_hash)
set(stamp ${WORK}/node_modules/.megactx-lock-sha256)
set(installed "")
if(EXISTS ${stamp})
  file(READ ${stamp} installed)
endif()
if(NOT installed STREQUAL lock_hash)
  # Offline first (a warm npm cache, as in CI), then the registry.
  execute_process(COMMAND ${NPM} ci --offline --no-audit --no-fund
                  WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
  if(NOT rc EQUAL 0)
    execute_process(COMMAND ${NPM} ci --no-audit --no-fund
                    WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE log
                    ERROR_VARIABLE log)
  endif()
  if(NOT rc EQUAL 0)
    give_up("npm ci failed in ${WORK}" "${log}")
    return()
  endif()
  file(WRITE ${stamp} "${lock_hash}")
endif()

execute_process(COMMAND ${NODE} node_modules/vite/bin/vite.js build --emptyOutDir --logLevel warn
                WORKING_DIRECTORY ${WORK} RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
if(NOT rc EQUAL 0)
  give_up("vite build failed in ${WORK}" "${log}")
  return()
endif()
execute_process(COMMAND ${NODE} ${SOURCE}/embed_assets.mjs ${WORK}/dist ${OUT}.tmp
                RESULT_VARIABLE rc OUTPUT_VARIABLE log ERROR_VARIABLE log)
if(NOT rc EQUAL 0)
  give_up("embedding ${WORK}/dist failed" "${log}")
  return()
endif()
file(RENAME ${OUT}.tmp ${OUT})
