# The schema and regex compilers (src/engine/jschema.c, jregex.c) under
# allocation failure: every run compiles the unhurt program or fails with
# GPE_ERR_NOMEM. The N-th of jansson's and the compilers' libc allocations
# fails (tests/unit/server/fixture_oom.h: arm_libc, through the linker's
# --wrap; strdup and strndup wrapped in the test itself). Each sweep twice:
# the engine alone, and with gp_json's counter registered
# (gpe_set_json_alloc_failures, from gpupool_common; then arm_beneath fails
# libc beneath gp_json's counting allocator).
gp_add_unit_test(test_jschema_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_jschema_oom.c
  LIBS gpupool-engine gpupool_common PkgConfig::JANSSON m
  LABELS engine)
target_link_options(test_jschema_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=strndup)
