# Agent unit tests (cmocka). They link the agent's base library (no engine),
# the same code the gpupool-agent binary runs.
gp_add_unit_test(test_agent_util
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_agent_util.c
  LIBS gpupool_agent_base)
gp_add_unit_test(test_agent_openai_stream
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_agent_openai_stream.c
  LIBS gpupool_agent_base)
# An upstream chunk read with libc's N-th allocation failing beneath
# gp_json's counting allocator (tests/unit/server/fixture_oom.h).
target_link_options(test_agent_openai_stream PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc)
gp_add_unit_test(test_oai_chunk
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_oai_chunk.c
  LIBS gpupool_agent_base)
gp_add_unit_test(test_agent_config
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_agent_config.c
  LIBS gpupool_agent_base)
gp_add_unit_test(test_agent_digest
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_agent_digest.c
  LIBS gpupool_agent_base)
gp_add_unit_test(test_model_fetch
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_model_fetch.c
  LIBS gpupool_agent_base)
gp_add_unit_test(test_openai_count
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_openai_count.c
  LIBS gpupool_agent_base)
gp_add_unit_test(test_openai_embed
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_openai_embed.c
  LIBS gpupool_agent_base)
gp_add_unit_test(test_relay_set
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_relay_set.c
  LIBS gpupool_agent_base)
