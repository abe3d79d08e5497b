# Quantized types, dequantization and dot products (engine part).
# -ffp-contract=off: the dequantizers must evaluate d*sc*q - dmin*m exactly
# as ggml does (bit-exact results), without the compiler fusing into FMAs.
add_library(gpe_quant OBJECT ${CMAKE_CURRENT_LIST_DIR}/quant.c
                             ${CMAKE_CURRENT_LIST_DIR}/quant_x86.c
                             ${CMAKE_CURRENT_LIST_DIR}/quant_x86_f16.c)
set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/quant.c
                            PROPERTIES COMPILE_OPTIONS "-ffp-contract=off")
list(APPEND GPE_PARTS gpe_quant)
