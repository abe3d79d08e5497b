# The agent's JSON texts when memory runs out (jansson 2.14's json_dumps can
# leave a key out and succeed, its json_loadb drop a byte): the gguf
# backend's tool_choice schemas and grammars (src/agent/gguf_tools.c) and
# chat prompt (backend_gguf_job.c), the model digest cache (agent_facts.c)
# and main.c's refusal message: the unhurt result or out of memory. The N-th
# of the agent's, the engine's and jansson's allocations fails
# (tests/unit/server/fixture_oom.h arm_beneath, through the linker's --wrap),
# on stories260K.
gp_add_unit_test(test_agent_json_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_agent_json_oom.c
  LIBS gpupool_agent_core gpupool-engine PkgConfig::JANSSON
  LABELS engine agent)
target_link_options(test_agent_json_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup)
