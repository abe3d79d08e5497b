# Tokenizer tests (owner: E2): llama.cpp's vocabulary vectors, stories260K
# reference ids, pre-tokenizer splits, hostile input. jansson reads the
# reference JSON (tests may use it; the engine does not).
gp_add_unit_test(test_tokenizer
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_tokenizer.c
  LIBS gpe_tokenizer gpe_gguf gpe_quant PkgConfig::JANSSON Threads::Threads m
  LABELS engine)
