# libFuzzer target: see tests/fuzz/fuzz_agent_work.c (the openai backend, included).
#   scripts/fuzz.sh agent_work
gp_add_fuzz(fuzz_agent_work SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_agent_work.c
            LIBS gpupool_agent_base)
