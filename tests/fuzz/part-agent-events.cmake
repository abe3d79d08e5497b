# libFuzzer target for the agent event upload validator (src/server/fleet/agent_check.c).
#   ./tests/fuzz/fuzz_agent_events -max_total_time=60 tests/fuzz/corpus/agent_events
add_executable(fuzz_agent_events ${CMAKE_CURRENT_LIST_DIR}/fuzz_agent_events.c
               ${CMAKE_SOURCE_DIR}/src/server/fleet/agent_check.c)
target_include_directories(fuzz_agent_events PRIVATE ${CMAKE_SOURCE_DIR}/src)
target_compile_options(fuzz_agent_events PRIVATE -fsanitize=fuzzer,address,undefined)
target_link_options(fuzz_agent_events PRIVATE -fsanitize=fuzzer,address,undefined)
target_link_libraries(fuzz_agent_events PRIVATE gpupool_common PkgConfig::JANSSON m)
