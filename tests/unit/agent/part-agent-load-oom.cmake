# The gguf backend's model load when memory runs out (src/agent/
# backend_gguf.c place_model, gguf_plan.c): agent_backend_gguf_create_status
# says out of memory (*nomem: gpupool-agent exits 1 and is restarted, a
# deployment retries), never the damaged file's failure (exit 2, replica
# failed), which a cut file still gets. The N-th of the agent's, the
# engine's and jansson's allocations fails (tests/unit/server/fixture_oom.h
# arm_libc, through the linker's --wrap), on stories260K.
gp_add_unit_test(test_agent_load_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_agent_load_oom.c
  LIBS gpupool_agent_core gpupool-engine PkgConfig::JANSSON
  LABELS engine agent)
target_link_options(test_agent_load_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup)
