# GGUF reader (engine part, owner: gguf/quant).
add_library(gpe_gguf OBJECT ${CMAKE_CURRENT_LIST_DIR}/gguf.c)
list(APPEND GPE_PARTS gpe_gguf)
