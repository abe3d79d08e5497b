# Model loading when memory runs out (gpe_model_load: the GGUF reader, the
# weights, the tokenizer): a load that ran out of memory says
# GPE_ERR_NOMEM, never FORMAT (the damaged file it is not). The N-th of the
# engine's malloc, calloc, realloc and strdup fails (ld --wrap,
# tests/unit/server/fixture_oom.h arm_libc).
gp_add_unit_test(test_load_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_load_oom.c
  LIBS gpupool-engine PkgConfig::JANSSON
  LABELS engine)
target_link_options(test_load_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup)
