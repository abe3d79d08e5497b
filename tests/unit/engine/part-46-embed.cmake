# Embeddings (issue 26 item 2): pooled, normalised vectors on stories260K and
# the random-weight architecture files; batch equals one-by-one.
gp_add_unit_test(test_engine_embed
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_embed.c
  LIBS gpupool-engine m
  LABELS engine)
# Pooling kinds on gguf-random files written with --pooling.
target_compile_definitions(test_engine_embed PRIVATE GGUF_RANDOM_EXE="$<TARGET_FILE:gguf-random>")
add_dependencies(test_engine_embed gguf-random)
# BERT-style encoders (bert, nomic-bert) on the tiny random files against
# llama.cpp's llama-embedding vectors and token ids (tests/data/arch/*.embd.json).
gp_add_unit_test(test_engine_encoder
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_encoder.c
  LIBS gpupool-engine PkgConfig::JANSSON m
  LABELS engine)
