# The admin API's request-log read (gps_store_jobs_list_async).
if(TARGET gps_store)
  gp_add_unit_test(test_store_jobs_list SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store_jobs_list.c
                   LIBS gps_store LABELS server)
endif()
