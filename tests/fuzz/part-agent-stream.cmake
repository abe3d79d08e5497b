# libFuzzer target: see tests/fuzz/fuzz_agent_stream.c (the openai backend, included).
#   scripts/fuzz.sh agent_stream
gp_add_fuzz(fuzz_agent_stream SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_agent_stream.c
            LIBS gpupool_agent_base)
