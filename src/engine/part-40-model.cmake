# Engine part: llama model (hyper-parameters, weights, forward pass), KV cache
# and the public API glue (engine.c). Owner: E3.
add_library(gpe_model OBJECT
  ${CMAKE_CURRENT_LIST_DIR}/kv.c
  ${CMAKE_CURRENT_LIST_DIR}/model.c
  ${CMAKE_CURRENT_LIST_DIR}/encoder.c
  ${CMAKE_CURRENT_LIST_DIR}/engine.c
  ${CMAKE_CURRENT_LIST_DIR}/backend_cpu.c
  ${CMAKE_CURRENT_LIST_DIR}/backend_load.c)
# The forward pass is the hot path (attention, norms, RoPE): optimise it even
# in RelWithDebInfo builds; no -ffast-math (results must be reproducible).
target_compile_options(gpe_model PRIVATE -O3)
list(APPEND GPE_PARTS gpe_model)
# backend_load.c dlopen()s the CUDA plugin.
list(APPEND GPE_EXTRA_LIBS ${CMAKE_DL_LIBS})
