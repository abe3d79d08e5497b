# Prompt-prefix reuse in the engine (issue 13, "Prompt-prefix cache"):
# gpe_seq_truncate then decoding the rest gives the logits and greedy ids
# of a fresh prefill, on stories260K and architecture files.
gp_add_unit_test(test_engine_prefix
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_prefix.c
  LIBS gpupool-engine m
  LABELS engine)
