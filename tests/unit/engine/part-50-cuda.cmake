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
  target_compile_definitions(test_cuda PRIVATE GPE_HAVE_CUDA=1)
endif()
