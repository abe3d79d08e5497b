# Thread pool dispatch latency (printed, never asserted). Owner: E4.
add_executable(bench_threadpool ${CMAKE_CURRENT_LIST_DIR}/bench_threadpool.c)
target_link_libraries(bench_threadpool PRIVATE gpe_threadpool Threads::Threads)
