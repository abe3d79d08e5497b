# libFuzzer target: see tests/fuzz/fuzz_gp_json.c (gp_json against json_loadb).
#   scripts/fuzz.sh gp_json
gp_add_fuzz(fuzz_gp_json SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_gp_json.c
            LIBS gpupool_common PkgConfig::JANSSON)
