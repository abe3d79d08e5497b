# gps_jobs_submit: assignment, queueing, refusals, fallback at submit, the
# request-log row written once (issue 11).
set(_d ${CMAKE_CURRENT_LIST_DIR})
if(TARGET gps_api)
  gp_add_unit_test(test_jobs_submit SOURCES ${_d}/test_jobs_submit.c ${_d}/fixture_fleet.c
                   LIBS gps_api gps_store LABELS server)
endif()
