# Quant tests (owner: gguf/quant): known blocks, llama.cpp dequant references
# (tests/data/tiny-random.json, read with jansson), SIMD paths vs scalar.
gp_add_unit_test(test_quant
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_quant.c $<TARGET_OBJECTS:gpe_gguf> $<TARGET_OBJECTS:gpe_quant>
  LIBS PkgConfig::JANSSON Threads::Threads m
  LABELS engine)
