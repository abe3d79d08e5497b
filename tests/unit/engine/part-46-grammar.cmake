# JSON-Schema-constrained sampling (src/engine/jschema.c, jsongram.c,
# grammar.c): refusals, the byte matcher on a corpus, and stories260K
# sampled under each schema of the corpus.
gp_add_unit_test(test_grammar
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_grammar.c
  LIBS gpupool-engine PkgConfig::JANSSON m
  LABELS engine)
