# libFuzzer target: the config file, flag and environment parser with the
# server's and the agent's option tables (tests/fuzz/fuzz_config.c).
#   scripts/fuzz.sh config
gp_add_fuzz(fuzz_config SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_config.c
            LIBS gps_core gpupool_agent_base)
