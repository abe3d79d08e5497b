# openai_schema (src/agent/openai_schema.c): what an openai-backend reply is
# held to (response_format text, strict tools' arguments).
gp_add_unit_test(test_openai_schema
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_openai_schema.c
  LIBS gpupool_agent_base)
