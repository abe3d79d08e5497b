# Engine part: persistent thread pool (threadpool.h). Owner: E4.
add_library(gpe_threadpool OBJECT ${CMAKE_CURRENT_LIST_DIR}/threadpool.c)
list(APPEND GPE_PARTS gpe_threadpool)
