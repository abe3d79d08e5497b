# libFuzzer target: see tests/fuzz/fuzz_agent_json.c (agent_json against json_loadb).
#   scripts/fuzz.sh agent_json
gp_add_fuzz(fuzz_agent_json SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_agent_json.c
            ${CMAKE_SOURCE_DIR}/src/agent/agent_json.c
            LIBS gpupool_common PkgConfig::JANSSON)
