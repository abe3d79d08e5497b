# The agent's gguf backend (src/agent/backend_gguf.c, owner: E3) end to end
# on stories260K.
gp_add_unit_test(test_backend_gguf
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_backend_gguf.c
  LIBS gpupool_agent_core gpupool-engine PkgConfig::JANSSON
  LABELS engine agent)
