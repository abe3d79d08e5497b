# Token-exact continuation in the jobs module (issue 10 item 4): digests in
# the registry, ids recorded from token events, the continuation wire.
set(_d ${CMAKE_CURRENT_LIST_DIR})
if(TARGET gps_api)
  gp_add_unit_test(test_jobs_tokens SOURCES ${_d}/test_jobs_tokens.c ${_d}/fixture_fleet.c
                   LIBS gps_api)
endif()
