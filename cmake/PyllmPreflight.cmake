# Toolchain preflight: every trap that used to surface 30 minutes into a llama.cpp build
# (or at run time) stops here, in seconds, with one message that names the fix.
# Runs before any llama.cpp source is obtained or configured, whatever the source.

# Stop with a one-paragraph message: what is wrong, then what to do.
function(pyllm_fail what fix)
  message(FATAL_ERROR "pyllm-a100 preflight: ${what}\n  Fix: ${fix}\n")
endfunction()

function(pyllm_check_cmake_version)
  if(CMAKE_VERSION VERSION_LESS 3.18)
    pyllm_fail("CMake ${CMAKE_VERSION} is too old; llama.cpp's CUDA build needs CMake >= 3.18."
               "pip install 'cmake>=3.18' (or let pip build this package: it fetches a new CMake itself), then build again.")
  endif()
endfunction()

# gcc 8.5 (RHEL/CentOS 8 default) compiles C++17 but cannot link std::filesystem without
# -lstdc++fs; llama.cpp's common library uses it. Compile AND link a small program.
function(pyllm_check_cxx17_filesystem)
  set(dir "${CMAKE_BINARY_DIR}/pyllm-preflight")
  file(WRITE "${dir}/filesystem.cpp" [=[
#include <filesystem>
#include <string>
int main(int argc, char ** argv) {
    std::filesystem::path p(argc > 0 ? argv[0] : ".");
    return std::filesystem::exists(p.parent_path() / std::string("x")) ? 1 : 0;
}
]=])
  try_compile(ok "${dir}/filesystem-build" "${dir}/filesystem.cpp"
    CXX_STANDARD 17 CXX_STANDARD_REQUIRED ON CXX_EXTENSIONS OFF
    OUTPUT_VARIABLE out)
  if(NOT ok)
    # The most telling line: a missing symbol or header, else the first error.
    string(REGEX MATCH "[^\n]*(undefined reference|No such file)[^\n]*" first_error "${out}")
    if(NOT first_error)
      string(REGEX MATCH "[^\n]*(error|Error)[^\n]*" first_error "${out}")
    endif()
    string(STRIP "${first_error}" first_error)
    pyllm_fail("the C++ compiler ${CMAKE_CXX_COMPILER} (${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION}) cannot build a C++17 program that uses <filesystem>: ${first_error}"
               "use gcc >= 9 (or clang >= 9): e.g. `conda install -c conda-forge gcc_linux-64=13 gxx_linux-64=13` then CC=$CONDA_PREFIX/bin/x86_64-conda-linux-gnu-gcc CXX=$CONDA_PREFIX/bin/x86_64-conda-linux-gnu-g++ pip install ..., or `scl enable gcc-toolset-13 bash` on RHEL 8.")
  endif()
  message(STATUS "pyllm-a100 preflight: ${CMAKE_CXX_COMPILER_ID} ${CMAKE_CXX_COMPILER_VERSION} builds C++17 with std::filesystem")
endfunction()

# nvidia-smi's answer, or empty when there is no driver (a build host without GPUs).
function(pyllm_nvidia_smi out_var)
  unset(PYLLM_NVIDIA_SMI CACHE)
  find_program(PYLLM_NVIDIA_SMI nvidia-smi)
  set(result "")
  if(PYLLM_NVIDIA_SMI)
    execute_process(COMMAND "${PYLLM_NVIDIA_SMI}" ${ARGN}
      OUTPUT_VARIABLE stdout ERROR_QUIET RESULT_VARIABLE rc TIMEOUT 30)
    if(rc EQUAL 0)
      set(result "${stdout}")
    endif()
  endif()
  unset(PYLLM_NVIDIA_SMI CACHE)
  set(${out_var} "${result}" PARENT_SCOPE)
endfunction()

# GGML_CUDA = ON | OFF | AUTO (ON when nvidia-smi lists a GPU). Sets PYLLM_CUDA (ON/OFF).
function(pyllm_resolve_cuda_mode)
  string(TOUPPER "${GGML_CUDA}" mode)
  if(mode STREQUAL "AUTO")
    pyllm_nvidia_smi(gpus -L)
    if(gpus MATCHES "GPU [0-9]+:")
      set(resolved ON)
      set(why "GGML_CUDA=AUTO and nvidia-smi lists a GPU")
    else()
      set(resolved OFF)
      set(why "GGML_CUDA=AUTO and no NVIDIA GPU is visible (pass -C cmake.define.GGML_CUDA=ON to build CUDA on a host without GPUs)")
    endif()
  elseif(mode MATCHES "^(ON|TRUE|YES|1)$")
    set(resolved ON)
    set(why "GGML_CUDA=${GGML_CUDA}")
  elseif(mode MATCHES "^(OFF|FALSE|NO|0|)$")
    set(resolved OFF)
    set(why "GGML_CUDA=${GGML_CUDA}")
  else()
    pyllm_fail("GGML_CUDA=${GGML_CUDA} is not one of ON, OFF, AUTO."
               "pass -C cmake.define.GGML_CUDA=ON (CUDA), OFF (CPU only) or AUTO (CUDA when a GPU is visible).")
  endif()
  if(resolved)
    message(STATUS "pyllm-a100: building with CUDA (${why})")
  else()
    message(STATUS "pyllm-a100: building for CPU only (${why})")
  endif()
  set(PYLLM_CUDA ${resolved} PARENT_SCOPE)
endfunction()

# The nvcc CMake will use: CMAKE_CUDA_COMPILER, $CUDACXX, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin.
function(pyllm_find_nvcc out_var)
  if(CMAKE_CUDA_COMPILER)
    set(nvcc "${CMAKE_CUDA_COMPILER}")
  elseif(DEFINED ENV{CUDACXX} AND NOT "$ENV{CUDACXX}" STREQUAL "")
    set(nvcc "$ENV{CUDACXX}")
  else()
    unset(PYLLM_NVCC CACHE)
    find_program(PYLLM_NVCC nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH PATH_SUFFIXES bin
                 PATHS /usr/local/cuda/bin /opt/cuda/bin)
    set(nvcc "${PYLLM_NVCC}")
    unset(PYLLM_NVCC CACHE)
  endif()
  if(NOT nvcc OR NOT EXISTS "${nvcc}")
    pyllm_fail("CUDA build requested but nvcc was not found (looked at CMAKE_CUDA_COMPILER, $CUDACXX, PATH, $CUDA_HOME/bin, /usr/local/cuda/bin)."
               "install the CUDA toolkit (not newer than your driver supports) and put its bin/ on PATH or set CUDACXX=/usr/local/cuda-12.x/bin/nvcc; or build for CPU with -C cmake.define.GGML_CUDA=OFF.")
  endif()
  set(${out_var} "${nvcc}" PARENT_SCOPE)
endfunction()

# "13.0" from `nvcc --version`.
function(pyllm_nvcc_version nvcc out_var)
  execute_process(COMMAND "${nvcc}" --version OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 60)
  if(NOT rc EQUAL 0 OR NOT out MATCHES "release ([0-9]+\\.[0-9]+)")
    pyllm_fail("${nvcc} --version failed or printed no CUDA release (${err})."
               "point CUDACXX at a working nvcc of the CUDA toolkit, e.g. CUDACXX=/usr/local/cuda/bin/nvcc.")
  endif()
  set(${out_var} "${CMAKE_MATCH_1}" PARENT_SCOPE)
endfunction()

# A toolkit newer than the driver builds fine and then fails at run time with
# "the provided PTX was compiled with an unsupported toolchain". Stop now instead.
function(pyllm_check_nvcc_vs_driver nvcc_version)
  pyllm_nvidia_smi(smi)
  if(NOT smi MATCHES "CUDA Version: *([0-9]+\\.[0-9]+)")
    message(STATUS "pyllm-a100 preflight: no NVIDIA driver visible; the machine that runs this build needs a driver supporting CUDA >= ${nvcc_version}")
    set(PYLLM_DRIVER_CUDA_VERSION "" PARENT_SCOPE)
    return()
  endif()
  set(driver "${CMAKE_MATCH_1}")
  set(PYLLM_DRIVER_CUDA_VERSION "${driver}" PARENT_SCOPE)
  if(nvcc_version VERSION_GREATER driver)
    if(PYLLM_ALLOW_NEWER_NVCC)
      message(WARNING "pyllm-a100 preflight: nvcc ${nvcc_version} is newer than the driver's CUDA ${driver}; continuing because PYLLM_ALLOW_NEWER_NVCC=ON")
      return()
    endif()
    pyllm_fail("nvcc is CUDA ${nvcc_version} but the installed driver supports CUDA ${driver} at most; the build would fail at run time with \"PTX was compiled with an unsupported toolchain\"."
               "build with a toolkit <= ${driver} (CUDACXX=/usr/local/cuda-${driver}/bin/nvcc pip install ...), or upgrade the NVIDIA driver; -C cmake.define.PYLLM_ALLOW_NEWER_NVCC=ON skips this check.")
  endif()
  message(STATUS "pyllm-a100 preflight: nvcc ${nvcc_version} <= driver CUDA ${driver}")
endfunction()

# The numeric part of each CMAKE_CUDA_ARCHITECTURES entry ("80;90-real" -> 80;90).
function(pyllm_cuda_arch_numbers out_var)
  set(numbers "")
  foreach(arch IN LISTS CMAKE_CUDA_ARCHITECTURES)
    if(arch MATCHES "^([0-9]+)")
      list(APPEND numbers "${CMAKE_MATCH_1}")
    endif()
  endforeach()
  set(${out_var} "${numbers}" PARENT_SCOPE)
endfunction()

# nvcc only accepts certain host compilers (versions); try a tiny .cu with the one the build uses.
function(pyllm_check_host_compiler nvcc)
  set(dir "${CMAKE_BINARY_DIR}/pyllm-preflight")
  file(WRITE "${dir}/host.cu" "#include <cstdio>\n__global__ void pyllm_k(float *x) { x[threadIdx.x] *= 2.0f; }\nint main() { std::printf(\"ok\\n\"); return 0; }\n")
  pyllm_cuda_arch_numbers(archs)
  list(GET archs 0 first_arch)
  execute_process(
    COMMAND "${nvcc}" -ccbin "${CMAKE_CUDA_HOST_COMPILER}" -std=c++17 -arch=sm_${first_arch} -c "${dir}/host.cu" -o "${dir}/host.o"
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 120)
  if(NOT rc EQUAL 0)
    string(REGEX MATCH "[^\n]*(error|unsupported)[^\n]*" first_error "${err}${out}")
    pyllm_fail("nvcc (${nvcc}) cannot compile CUDA with the host compiler ${CMAKE_CUDA_HOST_COMPILER}: ${first_error}"
               "use a host compiler this CUDA version supports (CUDA 12.x/13.x: gcc 9-14): CC=/usr/bin/gcc-12 CXX=/usr/bin/g++-12 pip install ..., or -C cmake.define.CMAKE_CUDA_HOST_COMPILER=/path/to/g++.")
  endif()
  message(STATUS "pyllm-a100 preflight: nvcc accepts host compiler ${CMAKE_CUDA_HOST_COMPILER}")
endfunction()

# The toolkit folder nvcc belongs to (nvcc may be a wrapper script elsewhere on PATH).
function(pyllm_cuda_toolkit_root nvcc out_var)
  set(dir "${CMAKE_BINARY_DIR}/pyllm-preflight")
  execute_process(COMMAND "${nvcc}" --dryrun -c "${dir}/host.cu" -o "${dir}/dry.o"
    OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
  if("${out}${err}" MATCHES "#\\$ TOP=([^\n]+)")
    get_filename_component(root "${CMAKE_MATCH_1}" REALPATH)
  else()
    get_filename_component(bin "${nvcc}" REALPATH)
    get_filename_component(bin "${bin}" DIRECTORY)
    get_filename_component(root "${bin}" DIRECTORY)
  endif()
  set(${out_var} "${root}" PARENT_SCOPE)
endfunction()

# ggml-cuda links cuBLAS and the driver library (libcuda.so, or the toolkit's stub of it).
function(pyllm_check_cuda_libraries toolkit_root)
  set(CUDAToolkit_ROOT "${toolkit_root}")
  find_package(CUDAToolkit QUIET)
  set(missing "")
  if(NOT TARGET CUDA::cudart)
    list(APPEND missing "the CUDA runtime (libcudart)")
  endif()
  if(NOT TARGET CUDA::cublas)
    list(APPEND missing "cuBLAS (libcublas.so)")
  endif()
  if(NOT TARGET CUDA::cuda_driver)
    list(APPEND missing "the driver library (libcuda.so or lib64/stubs/libcuda.so)")
  endif()
  if(missing)
    list(JOIN missing ", " missing_text)
    pyllm_fail("the CUDA toolkit at ${toolkit_root} lacks ${missing_text}, which llama.cpp's CUDA backend links."
               "install the toolkit's development libraries (e.g. apt install cuda-libraries-dev-X-Y cuda-driver-dev-X-Y, or the full runfile toolkit) or point CUDACXX at a complete toolkit; -DCUDA_cublas_LIBRARY=... / -DCUDA_cuda_driver_LIBRARY=... name the files directly.")
  endif()
  message(STATUS "pyllm-a100 preflight: CUDA toolkit ${toolkit_root} has cudart, cuBLAS and the driver library")
endfunction()

# A GPU whose compute capability the build does not cover runs through PTX JIT (newer GPU)
# or not at all (older GPU). Warn with the value to use.
function(pyllm_warn_uncovered_gpus)
  pyllm_nvidia_smi(gpus --query-gpu=index,name,compute_cap --format=csv,noheader)
  if(NOT gpus)
    return()
  endif()
  pyllm_cuda_arch_numbers(archs)
  string(REPLACE "\n" ";" lines "${gpus}")
  foreach(line IN LISTS lines)
    if(line MATCHES "^ *([0-9]+), *([^,]+), *([0-9]+)\\.([0-9]+)")
      set(index "${CMAKE_MATCH_1}")
      set(name "${CMAKE_MATCH_2}")
      set(cc "${CMAKE_MATCH_3}${CMAKE_MATCH_4}")
      if(NOT cc IN_LIST archs)
        set(suggest "${archs}")
        list(APPEND suggest "${cc}")
        list(REMOVE_DUPLICATES suggest)
        list(JOIN suggest ";" suggest_text)
        list(GET archs 0 lowest)
        if(cc GREATER lowest)
          set(effect "it will run the sm_${lowest} code through PTX JIT (a slow first load)")
        else()
          set(effect "the build has no code it can run")
        endif()
        message(WARNING "pyllm-a100 preflight: GPU ${index} (${name}) has compute capability ${CMAKE_MATCH_3}.${CMAKE_MATCH_4}, not in CMAKE_CUDA_ARCHITECTURES=${CMAKE_CUDA_ARCHITECTURES}: ${effect}. "
                        "For native code build with -C cmake.define.CMAKE_CUDA_ARCHITECTURES=\"${suggest_text}\".")
      endif()
    endif()
  endforeach()
endfunction()

# All CUDA checks; sets PYLLM_CUDA_VERSION, PYLLM_DRIVER_CUDA_VERSION and the compiler
# variables llama.cpp will then use, so what was checked is what builds.
function(pyllm_check_cuda_toolchain)
  if(NOT CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 80)
  endif()
  pyllm_find_nvcc(nvcc)
  pyllm_nvcc_version("${nvcc}" nvcc_version)
  message(STATUS "pyllm-a100 preflight: nvcc ${nvcc} is CUDA ${nvcc_version}")
  pyllm_check_nvcc_vs_driver("${nvcc_version}")
  if(NOT CMAKE_CUDA_HOST_COMPILER)
    set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CXX_COMPILER}")
  endif()
  pyllm_check_host_compiler("${nvcc}")
  pyllm_cuda_toolkit_root("${nvcc}" toolkit_root)
  pyllm_check_cuda_libraries("${toolkit_root}")
  pyllm_warn_uncovered_gpus()
  set(CMAKE_CUDA_COMPILER "${nvcc}" CACHE FILEPATH "CUDA compiler checked by the pyllm-a100 preflight")
  set(CMAKE_CUDA_HOST_COMPILER "${CMAKE_CUDA_HOST_COMPILER}" CACHE FILEPATH "host compiler checked by the pyllm-a100 preflight")
  set(CUDAToolkit_ROOT "${toolkit_root}" CACHE PATH "CUDA toolkit of the checked nvcc")
  set(PYLLM_CUDA_VERSION "${nvcc_version}" PARENT_SCOPE)
  set(PYLLM_DRIVER_CUDA_VERSION "${PYLLM_DRIVER_CUDA_VERSION}" PARENT_SCOPE)
endfunction()
