# Embeddings (issue 26 item 2): pooled, normalised vectors on stories260K and
# the random-weight architecture files; batch equals one-by-one.
gp_add_unit_test(test_engine_embed
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_embed.c
  LIBS gpupool-engine m
  LABELS engine)
