# Engine part: batched causal attention over the KV cache (attn.h), with
# AVX2 / AVX-512 kernels picked at run time. -ffp-contract=off: every path
# must evaluate the same float operations (attn_impl.h), so the compiler may
# not fuse a multiply and an add on its own; -O3 as the rest of the forward.
add_library(gpe_attn OBJECT ${CMAKE_CURRENT_LIST_DIR}/attn.c
                            ${CMAKE_CURRENT_LIST_DIR}/attn_x86.c)
target_compile_options(gpe_attn PRIVATE -O3 -ffp-contract=off)
list(APPEND GPE_PARTS gpe_attn)
