# libFuzzer target: tool calls read out of generated text (src/engine/toolcall.c).
#   scripts/fuzz.sh toolparse
gp_add_fuzz(fuzz_toolparse SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_toolparse.c
            LIBS gpupool-engine)
