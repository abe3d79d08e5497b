# Sampler cost per token on a 150k vocabulary (printed, never asserted). Owner: E4.
add_executable(bench_sampler ${CMAKE_CURRENT_LIST_DIR}/bench_sampler.c)
target_link_libraries(bench_sampler PRIVATE gpe_sampler m)
