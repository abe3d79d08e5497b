# Engine benchmark (owner: E3): membw measures this machine's memory read
# bandwidth; engine-bench.sh runs gpupool-run bench on random TinyLlama-shaped
# models of each type, optionally beside llama-bench (LLAMA_BENCH). Printed only.
add_executable(membw ${CMAKE_CURRENT_LIST_DIR}/membw.c)
target_compile_options(membw PRIVATE -O3)
target_link_libraries(membw PRIVATE Threads::Threads)
