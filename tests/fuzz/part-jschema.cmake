# libFuzzer target: schemas compiled for constrained sampling and the byte
# matcher (src/engine/jschema.c, jregex.c, jsongram.c).
#   scripts/fuzz.sh jschema
gp_add_fuzz(fuzz_jschema SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_jschema.c
            LIBS gpupool-engine PkgConfig::JANSSON)
