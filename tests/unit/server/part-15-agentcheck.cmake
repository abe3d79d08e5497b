# Bounds on what agents send (agent_check.h): issue 9 findings 1, 4, 10.
if(TARGET gps_agent_check)
  gp_add_unit_test(test_agent_check SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_agent_check.c
                   LIBS gps_agent_check LABELS server)
endif()
