# GGUF reader tests (owner: gguf/quant).
gp_add_unit_test(test_gguf
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gguf.c $<TARGET_OBJECTS:gpe_gguf> $<TARGET_OBJECTS:gpe_quant>
  LIBS Threads::Threads m
  LABELS engine)

# The random-model writer (bench/gguf_random.c) writes files this reader loads.
gp_add_unit_test(test_gguf_random
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_gguf_random.c $<TARGET_OBJECTS:gpe_gguf> $<TARGET_OBJECTS:gpe_quant>
  LIBS Threads::Threads m
  LABELS engine)
target_compile_definitions(test_gguf_random PRIVATE GGUF_RANDOM_EXE="$<TARGET_FILE:gguf-random>")
add_dependencies(test_gguf_random gguf-random)
