# Loop-thread cost of per-key limits per request (printed, never asserted). Owner: S1.
add_executable(bench_limits ${CMAKE_CURRENT_LIST_DIR}/bench_limits.c)
target_link_libraries(bench_limits PRIVATE gps_auth)
