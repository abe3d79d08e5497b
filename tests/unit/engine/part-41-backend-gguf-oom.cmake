# The gguf backend's job_start when memory runs out (src/agent/
# backend_gguf_job.c): the job starts or is AGENT_JOB_START_NOMEM, never
# the client's INVALID_REQUEST. The N-th of jansson's, the agent's and the
# engine's libc allocations fails (tests/unit/server/fixture_oom.h
# arm_libc, through the linker's --wrap). Its models with a tools template
# or a long token come from fixture_gguf.{h,c}.
gp_add_unit_test(test_backend_gguf_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backend_gguf_oom.c
          ${CMAKE_CURRENT_LIST_DIR}/fixture_gguf.c
  LIBS gpupool_agent_core gpupool-engine PkgConfig::JANSSON
  LABELS engine agent)
target_link_options(test_backend_gguf_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup)
