# libFuzzer target: the JSON Schema validator (src/engine/jvalidate.c), and
# the byte matcher's completed values checked by it (every one is valid).
#   scripts/fuzz.sh jvalidate
gp_add_fuzz(fuzz_jvalidate SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_jvalidate.c
            LIBS gpupool-engine PkgConfig::JANSSON)
