# openai_schema (src/agent/openai_schema.c): what an openai-backend reply is
# held to (response_format text, strict tools' arguments).
gp_add_unit_test(test_openai_schema
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_openai_schema.c
  LIBS gpupool_agent_base)
# The same when memory runs out while the checks are made: out of memory
# (OAI_SCHEMA_NOMEM, the agent's own failure) and never a refused schema.
# The N-th of jansson's and the agent's libc allocations fails
# (tests/unit/server/fixture_oom.h arm_libc, through the linker's --wrap).
gp_add_unit_test(test_openai_schema_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_openai_schema_oom.c
  LIBS gpupool_agent_base)
target_link_options(test_openai_schema_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup)
# The openai backend's job start and reply check when memory runs out: the
# job starts as asked (request body, stop strings, X-Pool-Options) or is
# AGENT_JOB_START_NOMEM; a check that ran out of memory ends the job
# AGENT_OUT_OF_MEMORY, not UPSTREAM_INVALID_OUTPUT.
gp_add_unit_test(test_openai_job_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_openai_job_oom.c
  LIBS gpupool_agent_base)
target_link_options(test_openai_job_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup)
