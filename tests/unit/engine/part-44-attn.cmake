# Attention tests: the batched kernels against a plain double-precision
# reference (windows, soft-cap, F16/F32 cache, several sequences), and the
# same bits whatever the batch split, thread count or ISA.
gp_add_unit_test(test_attn
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_attn.c
  LIBS gpupool-engine m
  LABELS engine)
