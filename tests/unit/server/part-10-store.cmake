# SQLite store: migrations, group commit, overload, loads, async reads. Owner: S1.
if(TARGET gps_store)
  gp_add_unit_test(test_store SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_store.c
                   LIBS gps_store LABELS server)
endif()
