# CUDA backend tests (owner: E5). Registered in every build: with the
# backend built, the host-side checks (budget, error paths, the self-test's
# random models and thresholds on the CPU) always run and the GPU self-test
# runs when a device is visible; otherwise the test reports itself skipped
# (exit code 77 -> CTest "Skipped"), as on CPU-only machines and builds.
gp_add_unit_test(test_cuda
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_cuda.c
  LIBS gpupool-engine m
  LABELS engine cuda)
set_tests_properties(test_cuda PROPERTIES SKIP_RETURN_CODE 77)
if(GPE_HAVE_CUDA)
  # The host-side checks call the backend's internals: link its objects
  # here too. The public-API checks go through the plugin, which the engine
  # loads from the build tree (backend_load.c).
  target_compile_definitions(test_cuda PRIVATE GPE_HAVE_CUDA=1)
  find_package(CUDAToolkit REQUIRED)
  target_sources(test_cuda PRIVATE $<TARGET_OBJECTS:gpe_cuda>)
  target_link_libraries(test_cuda PRIVATE CUDA::cudart CUDA::cublas stdc++)
  add_dependencies(test_cuda gpupool-cuda)
  # Linked by the C driver (nvcc's link of a CUDA-language executable with
  # no device link step writes nothing); cudart and libstdc++ are explicit.
  set_target_properties(test_cuda PROPERTIES LINKER_LANGUAGE C)
endif()
