# Cost of JSON-Schema-constrained sampling (issue 26): stories260K tokens/s
# with and without a schema, and the mask alone on real vocabularies.
# Printed, never asserted.
add_executable(bench_grammar ${CMAKE_CURRENT_LIST_DIR}/bench_grammar.c)
target_link_libraries(bench_grammar PRIVATE gpupool-engine m)
target_compile_definitions(bench_grammar PRIVATE GP_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
