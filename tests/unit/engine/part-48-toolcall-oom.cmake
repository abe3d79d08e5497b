# Tool calls read out of generated text (src/engine/toolcall.c) when memory
# runs out: the unhurt calls or GPE_ERR_NOMEM, never a call with other
# arguments. The N-th of jansson's and the parser's libc allocations fails
# (tests/unit/server/fixture_oom.h: arm_libc, and arm_beneath with gp_json's
# counter registered, hence gpupool_common; through the linker's --wrap).
gp_add_unit_test(test_toolcall_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_toolcall_oom.c
  LIBS gpupool-engine gpupool_common PkgConfig::JANSSON
  LABELS engine)
target_link_options(test_toolcall_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup)
