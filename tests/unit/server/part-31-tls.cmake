# Unit tests of the server's TLS context and listener options (owner: T4).
if(TARGET gps_core)
  gp_add_unit_test(test_server_tls SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_server_tls.c
                   LIBS gps_core)
endif()
