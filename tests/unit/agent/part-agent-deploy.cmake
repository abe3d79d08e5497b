# The agent's deploy backend (src/agent/backend_deploy.c) with the real gguf
# backend on stories260K: loading -> ready and serving; a load out of memory
# or threads retried on the backoff (agent_backend_deploy_advance moves its
# clock), never failed for good; a damaged file failed for good; the start
# out of memory or threads is *nomem (exit 1). The N-th of jansson's and the
# agent's allocations fails (tests/unit/server/fixture_oom.h arm_libc), and
# pthread_create fails with EAGAIN on demand, through the linker's --wrap.
gp_add_unit_test(test_agent_deploy
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_agent_deploy.c
  LIBS gpupool_agent_core gpupool-engine PkgConfig::JANSSON
  LABELS engine agent)
target_link_options(test_agent_deploy PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=pthread_create)
