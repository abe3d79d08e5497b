# libFuzzer target: gps_openai_parse, POST /v1/chat/completions bodies (tests/fuzz/fuzz_request.c, FUZZ_PARSER=1).
#   scripts/fuzz.sh openai_chat
gp_add_fuzz(fuzz_openai_chat SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_request.c
            LIBS gps_api DEFS FUZZ_PARSER=1)
