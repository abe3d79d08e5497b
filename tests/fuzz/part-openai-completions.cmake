# libFuzzer target: gps_openai_parse, POST /v1/completions bodies (tests/fuzz/fuzz_request.c, FUZZ_PARSER=2).
#   scripts/fuzz.sh openai_completions
gp_add_fuzz(fuzz_openai_completions SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_request.c
            LIBS gps_api DEFS FUZZ_PARSER=2)
