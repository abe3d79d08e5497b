# Engine model tests (owner: E3): end-to-end against llama.cpp references in
# tests/data, thread and batch invariance, error cases. jansson reads the
# reference JSON files (tests may use it; the engine library does not).
gp_add_unit_test(test_engine_model
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_model.c
  LIBS gpupool-engine PkgConfig::JANSSON m
  LABELS engine)
