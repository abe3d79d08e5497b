# gpupool-run (src/run) with a token longer than its old fixed buffers
# (generate's 256 bytes, tokenize's 512): the real binary run on
# stories260K with tokens rewritten long (fixture_gguf.{h,c}), its whole
# text out of generate (plain and --json) and tokenize; and the binary swept (the N-th
# allocation fails, run_failalloc.c preloaded; not under the sanitizers,
# whose allocator must come first).
gp_add_unit_test(test_run_long_token
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_run_long_token.c
          ${CMAKE_CURRENT_LIST_DIR}/fixture_gguf.c
  LIBS PkgConfig::JANSSON
  LABELS engine run)
add_dependencies(test_run_long_token gpupool-run)
target_compile_definitions(test_run_long_token PRIVATE GP_RUN_BIN="$<TARGET_FILE:gpupool-run>")
if(NOT GPUPOOL_SANITIZE)
  add_library(gp_run_failalloc MODULE ${CMAKE_CURRENT_LIST_DIR}/run_failalloc.c)
  add_dependencies(test_run_long_token gp_run_failalloc)
  target_compile_definitions(test_run_long_token PRIVATE
                             GP_FAILALLOC="$<TARGET_FILE:gp_run_failalloc>")
endif()
