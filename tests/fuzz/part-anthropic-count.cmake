# libFuzzer target: gps_anthropic_parse count_only, POST /v1/messages/count_tokens bodies (tests/fuzz/fuzz_request.c, FUZZ_PARSER=4).
#   scripts/fuzz.sh anthropic_count
gp_add_fuzz(fuzz_anthropic_count SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_request.c
            LIBS gps_api DEFS FUZZ_PARSER=4)
