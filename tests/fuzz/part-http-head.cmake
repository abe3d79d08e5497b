# libFuzzer target: gps_http_head_parse, the server's request-head parser (tests/fuzz/fuzz_http_head.c).
#   scripts/fuzz.sh http_head
gp_add_fuzz(fuzz_http_head SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_http_head.c LIBS gps_http)
