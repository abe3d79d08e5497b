# libFuzzer target: the engine's tokenizers on arbitrary bytes with real
# vocabularies (tests/fuzz/fuzz_tokenizer.c).
#   scripts/fuzz.sh tokenizer
gp_add_fuzz(fuzz_tokenizer SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_tokenizer.c
            LIBS gpupool-engine)
