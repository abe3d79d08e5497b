# Engine part: checking a finished JSON value against a JSON Schema
# (jvalidate.h), with the schema's own meaning. The agent's openai backend
# links it (with gpe_jschema, for the patterns) to check what an upstream
# returned for a response_format or a strict tool.
add_library(gpe_jvalidate OBJECT ${CMAKE_CURRENT_LIST_DIR}/jvalidate.c)
target_link_libraries(gpe_jvalidate PUBLIC PkgConfig::JANSSON m)   # floor()
list(APPEND GPE_PARTS gpe_jvalidate)
