# Engine model tests (owner: E3): end-to-end against llama.cpp references in
# tests/data, thread and batch invariance, error cases. jansson reads the
# reference JSON files (tests may use it; the engine library does not).
gp_add_unit_test(test_engine_model
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_model.c
  LIBS gpupool-engine PkgConfig::JANSSON m
  LABELS engine)

# The model's activation rows in a process that loaded no file (the CUDA
# self-test's in-memory models reach them that way).
gp_add_unit_test(test_engine_model_act
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_model_act.c
  LIBS gpupool-engine m
  LABELS engine)
