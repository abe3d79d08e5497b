# libFuzzer target for the GGUF reader (clang: cmake -DGPUPOOL_FUZZ=ON -DCMAKE_C_COMPILER=clang).
#   ./tests/fuzz/fuzz_gguf -max_total_time=120 CORPUS_DIR
add_executable(fuzz_gguf ${CMAKE_CURRENT_LIST_DIR}/fuzz_gguf.c
               ${CMAKE_SOURCE_DIR}/src/engine/gguf.c ${CMAKE_SOURCE_DIR}/src/engine/quant.c
               ${CMAKE_SOURCE_DIR}/src/engine/quant_x86.c
               ${CMAKE_SOURCE_DIR}/src/engine/quant_x86_f16.c)
target_compile_options(fuzz_gguf PRIVATE -fsanitize=fuzzer,address,undefined)
target_link_options(fuzz_gguf PRIVATE -fsanitize=fuzzer,address,undefined)
target_link_libraries(fuzz_gguf PRIVATE Threads::Threads m)
add_dependencies(fuzz_all fuzz_gguf)
