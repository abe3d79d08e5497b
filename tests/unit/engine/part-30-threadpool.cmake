# Engine thread pool tests. Owner: E4.
gp_add_unit_test(test_threadpool SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_threadpool.c
                 LIBS gpe_threadpool Threads::Threads LABELS engine)
