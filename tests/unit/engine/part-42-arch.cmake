# Architecture tests (issue 13): one tiny random-weight GGUF per architecture
# in tests/data/arch, checked against llama.cpp's prompt ids, logits and
# greedy ids; crafted GGUFs refused at load (and by the agent's gguf backend
# when the agent builds it).
gp_add_unit_test(test_engine_arch
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_arch.c
  LIBS gpupool-engine PkgConfig::JANSSON m
  LABELS engine)
target_link_libraries(test_engine_arch PRIVATE gpupool_agent_core)
target_compile_definitions(test_engine_arch PRIVATE HAVE_AGENT_GGUF)
