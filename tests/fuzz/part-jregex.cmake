# libFuzzer target: JSON Schema patterns as automata (src/engine/jregex.c).
#   scripts/fuzz.sh jregex
gp_add_fuzz(fuzz_jregex SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_jregex.c
            LIBS gpupool-engine)
