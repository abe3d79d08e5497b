# The agent's /agents/poll and /agents/work bodies when memory runs out
# (src/agent/agent_server.c ag_poll_body, agent_jobs.c ag_work_body): whole
# or not sent (tried again a second later), never a running job, the gpus,
# a static fact, the backend or the instance left out. The N-th of
# jansson's and the agent's libc allocations fails
# (tests/unit/server/fixture_oom.h arm_libc, through the linker's --wrap).
gp_add_unit_test(test_agent_poll_body_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_agent_poll_body_oom.c
  LIBS gpupool_agent_base)
target_link_options(test_agent_poll_body_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup)
