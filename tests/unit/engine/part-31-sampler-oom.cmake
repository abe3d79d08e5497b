# The sampler and the stop-string matcher (src/engine/sampler.c) when memory
# runs out: the same result, or out of memory said (gpe_stop_feed_status,
# gpe_sampler_sample's -1), never text with a piece left out nor a token
# sampled over a history with one lost. The N-th libc allocation fails
# (tests/unit/server/fixture_oom.h arm_libc, through the linker's --wrap).
gp_add_unit_test(test_sampler_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sampler_oom.c
  LIBS gpupool-engine PkgConfig::JANSSON
  LABELS engine)
target_link_options(test_sampler_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc)
