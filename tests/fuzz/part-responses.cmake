# libFuzzer target: gps_resp_parse, POST /v1/responses bodies (tests/fuzz/fuzz_request.c, FUZZ_PARSER=7).
#   scripts/fuzz.sh responses
gp_add_fuzz(fuzz_responses SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_request.c
            LIBS gps_api DEFS FUZZ_PARSER=7)
