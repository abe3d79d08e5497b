# Unit tests of x_pool_options failover / fallback_models (owner: T2).
set(_d ${CMAKE_CURRENT_LIST_DIR})
if(TARGET gps_api)
  gp_add_unit_test(test_pool_options SOURCES ${_d}/test_pool_options.c LIBS gps_api)
endif()
