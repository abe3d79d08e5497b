# Engine part: the CUDA backend (src/engine/cuda/). Owner: E5.
#
# The backend is a run-time plugin, libgpupool-cuda.so (declared in
# CMakeLists.txt once the engine library exists): the engine dlopen()s it
# on first GPU use (backend_load.c) and links no CUDA library itself, so a
# CUDA build's binaries start on machines without the CUDA runtime.
#
# GPUPOOL_CUDA = AUTO builds it when nvcc is found (and the build is not
# sanitized: ASan and nvcc-compiled host code do not mix); ON requires it;
# OFF never builds it. Kernels are compiled for the architectures that
# nvcc 13 still supports (Turing and newer), with PTX of the newest listed
# one so that later GPUs JIT-compile it. Override with
# -DCMAKE_CUDA_ARCHITECTURES=... (e.g. "native" on a GPU machine: faster
# builds).
include(CheckLanguage)

set(_gpe_cuda_want OFF)
string(TOUPPER "${GPUPOOL_CUDA}" _gpe_cuda_opt)
if(_gpe_cuda_opt STREQUAL "ON")
  set(_gpe_cuda_want ON)
  if(GPUPOOL_SANITIZE)
    message(WARNING "GPUPOOL_CUDA=ON with GPUPOOL_SANITIZE: only the C files of the CUDA "
                    "backend are sanitized; run with ASAN_OPTIONS=protect_shadow_gap=0")
  endif()
elseif(_gpe_cuda_opt STREQUAL "AUTO")
  if(NOT GPUPOOL_SANITIZE)
    if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
      set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
    endif()
    check_language(CUDA)
    if(CMAKE_CUDA_COMPILER)
      set(_gpe_cuda_want ON)
    endif()
  endif()
elseif(NOT _gpe_cuda_opt STREQUAL "OFF")
  message(FATAL_ERROR "GPUPOOL_CUDA must be AUTO, ON or OFF (got '${GPUPOOL_CUDA}')")
endif()

if(_gpe_cuda_want)
  if(NOT CMAKE_CUDA_COMPILER AND EXISTS /usr/local/cuda/bin/nvcc)
    set(CMAKE_CUDA_COMPILER /usr/local/cuda/bin/nvcc)
  endif()
  # A cache entry, not a directory variable: test_cuda (tests/unit/engine)
  # compiles the backend's objects too and must see the same list.
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES "75-real;80-real;86-real;89-real;90" CACHE STRING
        "CUDA architectures of the kernels")
  endif()
  enable_language(CUDA)
  find_package(CUDAToolkit REQUIRED)
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  message(STATUS "gpupool: CUDA backend ON (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, "
                 "architectures ${CMAKE_CUDA_ARCHITECTURES})")

  set(_gpe_cuda_dir ${CMAKE_CURRENT_LIST_DIR}/cuda)
  # The backend's objects: linked into the plugin (CMakeLists.txt, after
  # the engine library exists) and into test_cuda, never into the engine.
  add_library(gpe_cuda OBJECT
    ${_gpe_cuda_dir}/norm.cu
    ${_gpe_cuda_dir}/rope.cu
    ${_gpe_cuda_dir}/matmul.cu
    ${_gpe_cuda_dir}/mmvq.cu
    ${_gpe_cuda_dir}/fused.cu
    ${_gpe_cuda_dir}/mmq.cu
    ${_gpe_cuda_dir}/mmq_i8.cu
    ${_gpe_cuda_dir}/attention.cu
    ${_gpe_cuda_dir}/elementwise.cu
    ${_gpe_cuda_dir}/forward.cu
    ${_gpe_cuda_dir}/optest.cu
    ${_gpe_cuda_dir}/plugin.cu
    ${_gpe_cuda_dir}/selftest.c)
  # The directory's options (-Wall -Werror -pthread, sanitizers, ...) are gcc
  # flags: keep them for the C file only, and give nvcc its own spelling.
  get_target_property(_gpe_cuda_inherited gpe_cuda COMPILE_OPTIONS)
  set(_gpe_cuda_copts "")
  if(_gpe_cuda_inherited)
    foreach(_o ${_gpe_cuda_inherited})
      list(APPEND _gpe_cuda_copts "$<$<COMPILE_LANGUAGE:C>:${_o}>")
    endforeach()
  endif()
  set_property(TARGET gpe_cuda PROPERTY COMPILE_OPTIONS ${_gpe_cuda_copts})
  target_compile_options(gpe_cuda PRIVATE
    $<$<COMPILE_LANGUAGE:CUDA>:--Werror=all-warnings -Xcompiler=-Wall,-Wextra,-Wno-unused-parameter,-fno-strict-aliasing -D_GNU_SOURCE -lineinfo>)
  # Device code is optimized by ptxas (-O3) whatever the build type; the
  # host side follows CMAKE_BUILD_TYPE.
  target_include_directories(gpe_cuda PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
  set_target_properties(gpe_cuda PROPERTIES CUDA_SEPARABLE_COMPILATION OFF
                                            POSITION_INDEPENDENT_CODE ON)
  target_compile_definitions(gpe_cuda PRIVATE GPE_HAVE_CUDA=1 GPUPOOL_HAVE_CUDA=1)
  # The plugin links the engine's parts too (the self-test runs the CPU
  # forward): they must be position-independent. No semantic interposition:
  # the executables keep the same code generation as non-PIC objects.
  foreach(_p ${GPE_PARTS})
    set_target_properties(${_p} PROPERTIES POSITION_INDEPENDENT_CODE ON)
    target_compile_options(${_p} PRIVATE -fno-semantic-interposition)
    target_compile_definitions(${_p} PRIVATE GPE_HAVE_CUDA=1 GPUPOOL_HAVE_CUDA=1)
  endforeach()
  set(GPE_HAVE_CUDA ON)
else()
  message(STATUS "gpupool: CUDA backend OFF (GPUPOOL_CUDA=${GPUPOOL_CUDA})")
  set(GPE_HAVE_CUDA OFF)
endif()
set(GPE_HAVE_CUDA ${GPE_HAVE_CUDA} PARENT_SCOPE)
