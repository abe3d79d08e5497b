# gguf-random: random-weight llama GGUF writer; quant-bench: dot-product
# throughput per type and SIMD path (owner: gguf/quant).
add_executable(gguf-random ${CMAKE_CURRENT_LIST_DIR}/gguf_random.c $<TARGET_OBJECTS:gpe_quant>)
target_link_libraries(gguf-random PRIVATE Threads::Threads m)
add_executable(quant-bench ${CMAKE_CURRENT_LIST_DIR}/quant_bench.c $<TARGET_OBJECTS:gpe_quant>)
target_link_libraries(quant-bench PRIVATE Threads::Threads m)
