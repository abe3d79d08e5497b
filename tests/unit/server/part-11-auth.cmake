# API keys: format, hashing at rest, checks, enabled rule, binding. Owner: S1.
if(TARGET gps_auth)
  gp_add_unit_test(test_auth SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_auth.c
                   LIBS gps_auth LABELS server)
endif()
