# The mask's fast path inside pattern strings (src/engine/grammar.c
# mask_pattern) against the byte-by-byte check it replaces, on real
# vocabularies. Includes grammar.c (its statics).
gp_add_unit_test(test_grammar_pattern
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_grammar_pattern.c
  LIBS gpupool-engine PkgConfig::JANSSON m
  LABELS engine)
