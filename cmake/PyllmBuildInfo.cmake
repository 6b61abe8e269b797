# build_info.json: what was built, from which source, for which GPUs. Read by
# pyllm_a100.native.build_info() and `pyllm build-info`.

function(pyllm_json_string value out_var)
  string(REPLACE "\\" "\\\\" value "${value}")
  string(REPLACE "\"" "\\\"" value "${value}")
  set(${out_var} "\"${value}\"" PARENT_SCOPE)
endfunction()

function(pyllm_json_list out_var)
  set(items "")
  foreach(item IN LISTS ARGN)
    pyllm_json_string("${item}" quoted)
    list(APPEND items "${quoted}")
  endforeach()
  list(JOIN items ", " joined)
  set(${out_var} "[${joined}]" PARENT_SCOPE)
endfunction()

function(pyllm_json_bool value out_var)
  if(value)
    set(${out_var} "true" PARENT_SCOPE)
  else()
    set(${out_var} "false" PARENT_SCOPE)
  endif()
endfunction()

function(pyllm_json_optional value out_var)
  if("${value}" STREQUAL "")
    set(${out_var} "null" PARENT_SCOPE)
  else()
    pyllm_json_string("${value}" quoted)
    set(${out_var} "${quoted}" PARENT_SCOPE)
  endif()
endfunction()

function(pyllm_write_build_info path)
  if(DEFINED SKBUILD_PROJECT_VERSION)
    set(version "${SKBUILD_PROJECT_VERSION}")
  else()
    set(version "unknown")
  endif()
  if(PYLLM_CUDA)
    set(archs ${CMAKE_CUDA_ARCHITECTURES})
    set(host_compiler "${CMAKE_CUDA_HOST_COMPILER}")
  else()
    set(archs "")
    set(host_compiler "")
  endif()
  file(READ "${CMAKE_CURRENT_SOURCE_DIR}/vendor/pin.json" pin_json)
  string(STRIP "${pin_json}" pin_json)
  string(REPLACE "\n" "\n  " pin_json "${pin_json}")

  pyllm_json_string("${version}" j_version)
  pyllm_json_string("${PYLLM_SRC_COMMIT}" j_commit)
  pyllm_json_string("${PYLLM_SRC_LABEL}" j_source)
  pyllm_json_string("${PYLLM_SRC_KIND}" j_source_kind)
  pyllm_json_string("${PYLLM_SRC_TREE}" j_source_tree)
  pyllm_json_list(j_patches ${PYLLM_SRC_PATCHES})
  pyllm_json_bool("${PYLLM_CUDA}" j_cuda)
  pyllm_json_list(j_archs ${archs})
  pyllm_json_optional("${PYLLM_CUDA_VERSION}" j_cuda_version)
  pyllm_json_optional("${PYLLM_DRIVER_CUDA_VERSION}" j_driver)
  pyllm_json_string("${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}" j_compiler)
  pyllm_json_optional("${host_compiler}" j_host_compiler)
  pyllm_json_bool("${GGML_RPC}" j_rpc)
  pyllm_json_string("${CMAKE_BUILD_TYPE}" j_build_type)
  pyllm_json_string("${CMAKE_VERSION}" j_cmake)
  pyllm_json_list(j_shipped ${PYLLM_SHIPPED})
  # The bindings' ABI is llama.h: a custom source whose header differs from the pin's is refused at bind time.
  file(SHA256 "${PYLLM_SRC_TREE}/include/llama.h" llama_h_sha256)
  pyllm_json_string("${llama_h_sha256}" j_llama_h)
  # Model architectures this llama.cpp knows (the names GGUF files carry in general.architecture).
  file(STRINGS "${PYLLM_SRC_TREE}/src/llama-arch.cpp" arch_lines REGEX "^[ \t]*{ *LLM_ARCH_[A-Z0-9_]+, *\"[^\"]+\" *},")
  set(arch_names "")
  foreach(line IN LISTS arch_lines)
    string(REGEX REPLACE ".*\"([^\"]+)\".*" "\\1" arch_name "${line}")
    if(NOT arch_name MATCHES "^\\(")
      list(APPEND arch_names "${arch_name}")
    endif()
  endforeach()
  pyllm_json_list(j_archs_known ${arch_names})
  # Architectures llama.cpp refuses under --split-mode tensor: the cases of llm_arch_supports_sm_tensor
  # that return false (null: this tree has no tensor split mode at all). pyllm serve reads the list.
  file(READ "${PYLLM_SRC_TREE}/src/llama-arch.cpp" arch_cpp)
  string(FIND "${arch_cpp}" "bool llm_arch_supports_sm_tensor" sm_start)
  set(j_sm_tensor_refused "null")
  if(sm_start GREATER -1)
    string(SUBSTRING "${arch_cpp}" ${sm_start} 6000 sm_body)
    string(FIND "${sm_body}" "default:" sm_stop)
    string(SUBSTRING "${sm_body}" 0 ${sm_stop} sm_body)
    string(REGEX MATCHALL "case LLM_ARCH_[A-Z0-9_]+" sm_cases "${sm_body}")
    set(sm_refused "")
    foreach(sm_case IN LISTS sm_cases)
      string(REPLACE "case " "" sm_enum "${sm_case}")
      foreach(line IN LISTS arch_lines)
        if(line MATCHES "{ *${sm_enum}, *\"([^\"]+)\"")
          list(APPEND sm_refused "${CMAKE_MATCH_1}")
        endif()
      endforeach()
    endforeach()
    pyllm_json_list(j_sm_tensor_refused ${sm_refused})
  endif()
  # The RPC protocol rpc-server speaks (ggml-rpc.h): workers must match it exactly, since a new op (patch 0013) changes
  # what a graph may hold without changing the major version. null: no such header.
  set(j_rpc_protocol "null")
  if(EXISTS "${PYLLM_SRC_TREE}/ggml/include/ggml-rpc.h")
    file(READ "${PYLLM_SRC_TREE}/ggml/include/ggml-rpc.h" rpc_h)
    set(rpc_parts "")
    foreach(part MAJOR MINOR PATCH)
      if(rpc_h MATCHES "#define RPC_PROTO_${part}_VERSION +([0-9]+)")
        list(APPEND rpc_parts "${CMAKE_MATCH_1}")
      endif()
    endforeach()
    list(LENGTH rpc_parts n_rpc_parts)
    if(n_rpc_parts EQUAL 3)
      list(JOIN rpc_parts "." rpc_version)
      set(j_rpc_protocol "\"${rpc_version}\"")
    endif()
  endif()
  # NCCL: --split-mode tensor's all-reduce between GPUs (without it ggml falls back to a slower copy).
  set(nccl OFF)
  if(TARGET ggml-cuda)
    get_target_property(cuda_libs ggml-cuda LINK_LIBRARIES)
    if(cuda_libs MATCHES "NCCL")
      set(nccl ON)
    endif()
  endif()
  pyllm_json_bool("${nccl}" j_nccl)
  # The web UI llama-server serves at / (cmake/PyllmUi.cmake): in or not, and how / why not.
  pyllm_json_bool("${PYLLM_UI_IN}" j_ui)
  pyllm_json_optional("${PYLLM_UI_DETAIL}" j_ui_detail)

  file(WRITE "${path}.incomplete" "{
  \"version\": ${j_version},
  \"llama_cpp_commit\": ${j_commit},
  \"source\": ${j_source},
  \"source_kind\": ${j_source_kind},
  \"source_tree\": ${j_source_tree},
  \"patches\": ${j_patches},
  \"cuda\": ${j_cuda},
  \"cuda_architectures\": ${j_archs},
  \"cuda_version\": ${j_cuda_version},
  \"driver_cuda_version_at_build\": ${j_driver},
  \"compiler\": ${j_compiler},
  \"cuda_host_compiler\": ${j_host_compiler},
  \"rpc\": ${j_rpc},
  \"rpc_protocol\": ${j_rpc_protocol},
  \"nccl\": ${j_nccl},
  \"ui\": ${j_ui},
  \"ui_detail\": ${j_ui_detail},
  \"build_type\": ${j_build_type},
  \"cmake_version\": ${j_cmake},
  \"targets\": ${j_shipped},
  \"llama_h_sha256\": ${j_llama_h},
  \"architectures\": ${j_archs_known},
  \"sm_tensor_unsupported\": ${j_sm_tensor_refused},
  \"pin\": ${pin_json}
}
")
  file(RENAME "${path}.incomplete" "${path}")
endfunction()
