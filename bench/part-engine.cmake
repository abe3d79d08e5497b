# Engine benchmark (owner: E3): membw measures this machine's memory read
# bandwidth; engine-bench.sh runs gpupool-run bench on stories260K and on
# random TinyLlama-shaped models next to llama.cpp's anchors. Printed only.
add_executable(membw ${CMAKE_CURRENT_LIST_DIR}/membw.c)
target_compile_options(membw PRIVATE -O3)
target_link_libraries(membw PRIVATE Threads::Threads)
