# libFuzzer target: gps_pool_options_parse, the x_pool_options object of every dialect (tests/fuzz/fuzz_request.c, FUZZ_PARSER=6).
#   scripts/fuzz.sh pool_options
gp_add_fuzz(fuzz_pool_options SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_request.c
            LIBS gps_api DEFS FUZZ_PARSER=6)
