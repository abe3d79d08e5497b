# The agent's job sink (src/agent/agent_jobs.c) when memory runs out: a
# stop_sequence or upstream_meta that cannot be copied breaks the job's
# queue (AGENT_OUT_OF_MEMORY) rather than end it without the value; a
# job_start out of memory is AGENT_OUT_OF_MEMORY, not INVALID_REQUEST. The
# N-th of jansson's and the agent's libc allocations fails
# (tests/unit/server/fixture_oom.h arm_libc, through the linker's --wrap).
gp_add_unit_test(test_agent_jobs_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_agent_jobs_oom.c
  LIBS gpupool_agent_base)
target_link_options(test_agent_jobs_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup)
