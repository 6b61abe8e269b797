# The web UI llama-server serves at / (the pin's tools/ui, a SvelteKit app embedded into the binary).
#
# PYLLM_UI (cache):
#   AUTO  (default) prebuilt assets in the source tree (tools/ui/dist, as `pyllm vendor pack --with-ui`
#         writes them) are used as they are; otherwise the UI is built with npm when npm is found;
#         without npm, or when the npm build fails (no registry reachable), llama-server is built
#         without a UI and this log says so. Never fails the build.
#   ON    the same, but no UI is an error.
#   OFF   npm is never run. (Prebuilt assets inside the source tree are still embedded: llama.cpp's
#         own script takes tools/ui/dist unconditionally; pack without --with-ui for a UI-less tree.)
#
# The npm build runs here, at configure time, through llama.cpp's own scripts/ui-assets.cmake, into
# the binary folder llama.cpp's build-time step reads (so that step finds it up to date). Its output
# goes to ${CMAKE_BINARY_DIR}/pyllm-ui.log. Doing it at configure time is what lets build_info.json
# say truthfully whether the UI is in.
#
# Sets PYLLM_UI_IN (ON/OFF), PYLLM_UI_DETAIL (one line for build-info) and LLAMA_BUILD_UI /
# LLAMA_USE_PREBUILT_UI (never ON: no download from the hub).

set(PYLLM_UI_MIN_NODE "20.19")

function(pyllm_provision_ui)
  string(TOUPPER "${PYLLM_UI}" mode)
  if(NOT mode MATCHES "^(AUTO|ON|OFF)$")
    message(FATAL_ERROR "pyllm-a100: PYLLM_UI=${PYLLM_UI}: give AUTO, ON or OFF")
  endif()
  set(LLAMA_USE_PREBUILT_UI OFF CACHE BOOL "would download UI assets from the hub at build time; offline builds must work" FORCE)
  set(LLAMA_BUILD_UI OFF CACHE BOOL "the UI is provisioned by pyllm's PYLLM_UI (cmake/PyllmUi.cmake)" FORCE)

  set(ui_src "${PYLLM_SRC_TREE}/tools/ui")
  set(ui_bin "${CMAKE_BINARY_DIR}/llama.cpp/tools/ui")  # add_subdirectory(... llama.cpp): tools/ui's binary dir
  set(script "${PYLLM_SRC_TREE}/scripts/ui-assets.cmake")
  set(in OFF)
  set(detail "")

  if(NOT EXISTS "${ui_src}/package.json" OR NOT EXISTS "${script}")
    set(detail "no: this llama.cpp tree has no tools/ui")
  elseif(EXISTS "${ui_src}/dist/index.html")
    set(in ON)
    set(detail "yes: prebuilt assets from the source (tools/ui/dist, e.g. pyllm vendor pack --with-ui)")
  elseif(mode STREQUAL "OFF")
    set(detail "no: PYLLM_UI=OFF")
  else()
    # Searched on PATH only, each configure (never cached): llama.cpp's script, run with cmake -P, looks
    # for npm on PATH alone, and npm installed or removed since the last build must count.
    foreach(tool npm node)
      string(TOUPPER "${tool}" var)
      unset(PYLLM_${var} CACHE)
      find_program(PYLLM_${var} ${tool} NO_CMAKE_PATH NO_CMAKE_ENVIRONMENT_PATH NO_CMAKE_SYSTEM_PATH)
    endforeach()
    set(node_version "")
    set(npm_version "")
    if(PYLLM_NODE AND PYLLM_NPM)
      execute_process(COMMAND "${PYLLM_NODE}" --version OUTPUT_VARIABLE node_version
                      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
      string(REGEX REPLACE "^v" "" node_version "${node_version}")
      execute_process(COMMAND "${PYLLM_NPM}" --version OUTPUT_VARIABLE npm_version
                      OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
    endif()
    if(NOT PYLLM_NPM OR NOT PYLLM_NODE)
      set(detail "no: npm was not found at build time (install nodejs and npm, or build from an archive written by pyllm vendor pack --with-ui)")
    elseif(node_version STREQUAL "" OR npm_version STREQUAL "")
      set(detail "no: ${PYLLM_NPM} or ${PYLLM_NODE} does not run (--version failed)")
    elseif(node_version VERSION_LESS "${PYLLM_UI_MIN_NODE}")
      # The pin's UI builds with vite 7 (package-lock.json: engines "^20.19.0 || >=22.12.0"); Debian 12's nodejs is 18.
      set(detail "no: Node.js ${node_version} is too old for the UI build (vite 7 needs ${PYLLM_UI_MIN_NODE} or newer: npm install -g node@20, or build from pyllm vendor pack --with-ui)")
    else()
      set(log "${CMAKE_BINARY_DIR}/pyllm-ui.log")
      message(STATUS "pyllm-a100: web UI: building ${ui_src} with npm ${npm_version} (npm ci, npm run build; a few minutes the first time, log: ${log})")
      file(MAKE_DIRECTORY "${ui_bin}")
      # The same arguments llama.cpp's llama-ui-assets target passes at build time (tools/ui/CMakeLists.txt),
      # with the hub download off.
      execute_process(
        COMMAND "${CMAKE_COMMAND}"
          "-DUI_SOURCE_DIR=${ui_src}"
          "-DUI_BINARY_DIR=${ui_bin}"
          "-DLLAMA_SOURCE_DIR=${PYLLM_SRC_TREE}"
          "-DLLAMA_BUILD_NUMBER=${LLAMA_BUILD_NUMBER}"
          "-DHF_BUCKET=ggml-org/llama-ui"
          "-DHF_VERSION=b${LLAMA_BUILD_NUMBER}"
          "-DHF_ENABLED=OFF"
          "-DBUILD_UI=ON"
          "-DLLAMA_UI_GZIP=ON"
          -P "${script}"
        RESULT_VARIABLE rc OUTPUT_VARIABLE ui_out ERROR_VARIABLE ui_err)
      file(WRITE "${log}" "${ui_out}\n${ui_err}")
      if(rc EQUAL 0 AND EXISTS "${ui_bin}/dist/index.html"
         AND (ui_out MATCHES "UI: npm build succeeded" OR ui_out MATCHES "UI: npm output up-to-date"))
        set(in ON)
        set(detail "yes: built with npm ${npm_version} (Node.js ${node_version})")
        # llama.cpp's build-time step then finds the npm output up to date and embeds it.
        set(LLAMA_BUILD_UI ON CACHE BOOL "the UI is provisioned by pyllm's PYLLM_UI (cmake/PyllmUi.cmake)" FORCE)
      else()
        # Nothing stale may be embedded by the build-time step after a failed build.
        file(REMOVE_RECURSE "${ui_bin}/dist")
        string(REGEX MATCHALL "UI: npm[^\n]*" ui_lines "${ui_out}\n${ui_err}")
        list(JOIN ui_lines " / " ui_lines)
        set(detail "no: the npm build failed (${ui_lines}; see ${log})")
      endif()
    endif()
  endif()

  if(in)
    message(STATUS "pyllm-a100: web UI: ${detail}")
  elseif(mode STREQUAL "ON")
    message(FATAL_ERROR "pyllm-a100: PYLLM_UI=ON but there will be no web UI: ${detail}")
  else()
    message(STATUS "pyllm-a100: web UI: ${detail}; llama-server answers 404 at /")
  endif()
  set(PYLLM_UI_IN ${in} PARENT_SCOPE)
  set(PYLLM_UI_DETAIL "${detail}" PARENT_SCOPE)
endfunction()
