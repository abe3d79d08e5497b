# Store DB-thread write throughput and group-commit batch sizes (printed,
# never asserted). Owner: S1.
add_executable(bench_store ${CMAKE_CURRENT_LIST_DIR}/bench_store.c)
target_link_libraries(bench_store PRIVATE gps_store)
