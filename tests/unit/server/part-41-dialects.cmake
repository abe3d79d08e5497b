# Unit tests of the Anthropic dialect and the native task API (owner: S4).
set(_d ${CMAKE_CURRENT_LIST_DIR})
if(TARGET gps_api)
  gp_add_unit_test(test_api_anthropic SOURCES ${_d}/test_api_anthropic.c LIBS gps_api)
endif()
if(TARGET gps_api)
  gp_add_unit_test(test_api_tasks SOURCES ${_d}/test_api_tasks.c LIBS gps_api)
endif()
