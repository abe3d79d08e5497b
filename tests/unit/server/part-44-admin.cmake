# Unit tests of the admin API's request validation and throughput ring
# (admin_api.h).
if(TARGET gps_admin)
  gp_add_unit_test(test_admin_api SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_admin_api.c
                   LIBS gps_admin LABELS server)
endif()
