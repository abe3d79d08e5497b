# The failover decision, backoff and fallback to another model after an
# agent loss (issue 10 item 9).
set(_d ${CMAKE_CURRENT_LIST_DIR})
if(TARGET gps_api)
  gp_add_unit_test(test_failover_plan SOURCES ${_d}/test_failover_plan.c ${_d}/fixture_fleet.c
                   LIBS gps_api)
endif()
