# libFuzzer target: gps_anthropic_parse + gps_anthropic_assemble, POST /v1/messages bodies (tests/fuzz/fuzz_request.c, FUZZ_PARSER=3).
#   scripts/fuzz.sh anthropic
gp_add_fuzz(fuzz_anthropic SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_request.c
            LIBS gps_api DEFS FUZZ_PARSER=3)
