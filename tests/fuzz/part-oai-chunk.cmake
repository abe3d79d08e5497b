# libFuzzer target: see tests/fuzz/fuzz_oai_chunk.c (the chunk memo against the plain scan).
#   scripts/fuzz.sh oai_chunk
gp_add_fuzz(fuzz_oai_chunk SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_oai_chunk.c
            ${CMAKE_SOURCE_DIR}/src/agent/oai_chunk.c
            LIBS gpupool_common)
