# Durable native tasks: the job_events store ops (migration 0002). Owner: T6.
if(TARGET gps_store)
  gp_add_unit_test(test_store_events SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store_events.c
                   LIBS gps_store LABELS server)
endif()
