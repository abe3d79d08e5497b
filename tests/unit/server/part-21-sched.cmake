# Scheduler tests (queues, ready sets, policies, decision cost). Owner: S2.
if(TARGET gps_sched)
  gp_add_unit_test(test_sched SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sched.c
                   LIBS gps_sched LABELS server)
endif()
