# Per-key limits and usage (limits.h). Owner: S1.
if(TARGET gps_auth)
  gp_add_unit_test(test_limits SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_limits.c
                   LIBS gps_auth LABELS server)
endif()
