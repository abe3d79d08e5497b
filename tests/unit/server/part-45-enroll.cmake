# Unit tests of agent enrollment (POST /agents/enroll body rules).
set(_d ${CMAKE_CURRENT_LIST_DIR})
if(TARGET gps_api)
  gp_add_unit_test(test_agents_enroll SOURCES ${_d}/test_agents_enroll.c LIBS gps_api)
endif()
