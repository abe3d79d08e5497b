# The agent's gguf backend (src/agent/backend_gguf.c, owner: E3) end to end
# on stories260K.
gp_add_unit_test(test_backend_gguf
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backend_gguf.c
  LIBS gpupool_agent_core gpupool-engine PkgConfig::JANSSON
  LABELS engine agent)
# tool_choice schemas of the gguf backend (src/agent/gguf_tools.c).
gp_add_unit_test(test_gguf_tools
  SOURCES ${CMAKE_SOURCE_DIR}/tests/unit/agent/test_gguf_tools.c
  LIBS gpupool_agent_core gpupool-engine PkgConfig::JANSSON)
