# Tokenizer throughput on 1 MB inputs (printed, never asserted). Owner: E2.
add_executable(bench_tokenizer ${CMAKE_CURRENT_LIST_DIR}/bench_tokenizer.c)
target_link_libraries(bench_tokenizer PRIVATE gpe_tokenizer gpe_gguf gpe_quant Threads::Threads m)
target_compile_definitions(bench_tokenizer PRIVATE GP_SOURCE_DIR="${CMAKE_SOURCE_DIR}")
