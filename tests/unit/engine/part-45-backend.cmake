# The backend interface seen from the public API (issue 22): the
# GPUPOOL_ENGINE_FAULT hook on the CPU backend, backend names and device
# reports of CPU contexts, and the CUDA plugin loader's failures (no file,
# a plugin whose dependency is missing as libcudart is on a CPU-only box,
# a shared object that is no plugin): 0 GPUs with the reason, CPU still runs.
add_library(gpe_test_phantom SHARED ${CMAKE_CURRENT_LIST_DIR}/plugin/phantom.c)
add_library(gpe_test_needs_missing MODULE ${CMAKE_CURRENT_LIST_DIR}/plugin/needs_missing.c)
target_link_libraries(gpe_test_needs_missing PRIVATE gpe_test_phantom)
# No run path to the phantom library: its loader cannot find it.
set_target_properties(gpe_test_needs_missing PROPERTIES SKIP_BUILD_RPATH TRUE)
gp_add_unit_test(test_engine_backend
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backend.c
  LIBS gpupool-engine m
  LABELS engine)
add_dependencies(test_engine_backend gpe_test_needs_missing)
target_compile_definitions(test_engine_backend PRIVATE
  GPE_TEST_NEEDS_MISSING="$<TARGET_FILE:gpe_test_needs_missing>"
  GPE_TEST_PHANTOM="$<TARGET_FILE:gpe_test_phantom>")
if(GPE_HAVE_CUDA)
  target_compile_definitions(test_engine_backend PRIVATE GPE_HAVE_CUDA=1)
endif()
