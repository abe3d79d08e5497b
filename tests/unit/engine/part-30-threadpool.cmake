# Engine thread pool tests. Owner: E4. pthread_create fails on demand and
# pthread_join is counted (ld --wrap): a pool or an engine context whose
# thread cannot start says why and leaves no thread behind.
gp_add_unit_test(test_threadpool SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_threadpool.c
                 LIBS gpe_threadpool gpupool-engine Threads::Threads LABELS engine)
target_link_options(test_threadpool PRIVATE -Wl,--wrap=pthread_create,--wrap=pthread_join)
