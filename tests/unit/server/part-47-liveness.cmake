# Agent liveness: instance ids, running_jobs judgement, disconnect grace (owner: live).
if(TARGET gps_api)
  gp_add_unit_test(test_liveness SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_liveness.c
                   ${CMAKE_CURRENT_LIST_DIR}/fixture_fleet.c
                   LIBS gps_api LABELS server)
endif()
