# libFuzzer target: the strict batched-upload reader (src/server/upload_read.c),
# differentially against jansson and agent_check.h (tests/fuzz/fuzz_upload.c).
#   scripts/fuzz.sh upload
gp_add_fuzz(fuzz_upload SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_upload.c
            ${CMAKE_SOURCE_DIR}/src/server/upload_read.c
            ${CMAKE_SOURCE_DIR}/src/server/fleet/agent_check.c
            ${CMAKE_SOURCE_DIR}/src/server/http/textcheck.c
            LIBS gpupool_common PkgConfig::JANSSON)
target_include_directories(fuzz_upload PRIVATE ${CMAKE_SOURCE_DIR}/src)
