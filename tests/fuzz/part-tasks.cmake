# libFuzzer target: gps_tasks_parse, POST /v2/tasks bodies (tests/fuzz/fuzz_request.c, FUZZ_PARSER=5).
#   scripts/fuzz.sh tasks
gp_add_fuzz(fuzz_tasks SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_request.c
            LIBS gps_api DEFS FUZZ_PARSER=5)
