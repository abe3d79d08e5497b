# embed-bench: embeddings throughput (inputs/s) at batch 1 and 32 on one
# model file (issue 26 item 2). Printed only.
add_executable(embed-bench ${CMAKE_CURRENT_LIST_DIR}/embed_bench.c)
target_link_libraries(embed-bench PRIVATE gpupool-engine m)
