# Registry tests (health state machine, model index). Owner: S2.
if(TARGET gps_registry)
  gp_add_unit_test(test_registry SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_registry.c
                   LIBS gps_registry LABELS server)
endif()
