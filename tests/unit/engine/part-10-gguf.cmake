# GGUF reader tests (owner: gguf/quant).
gp_add_unit_test(test_gguf
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gguf.c $<TARGET_OBJECTS:gpe_gguf> $<TARGET_OBJECTS:gpe_quant>
  LIBS Threads::Threads m
  LABELS engine)
