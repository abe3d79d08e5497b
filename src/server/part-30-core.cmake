# Server core (owner: S3): config table, HTTP layer + routing, SSE framing,
# Prometheus metrics. No dependency on store/registry/sched.
add_library(gps_core STATIC
  ${CMAKE_CURRENT_LIST_DIR}/server_config.c
  ${CMAKE_CURRENT_LIST_DIR}/http.c
  ${CMAKE_CURRENT_LIST_DIR}/tls.c
  ${CMAKE_CURRENT_LIST_DIR}/sse.c
  ${CMAKE_CURRENT_LIST_DIR}/textcheck.c
  ${CMAKE_CURRENT_LIST_DIR}/metrics.c
  ${CMAKE_CURRENT_LIST_DIR}/memstat.c)
target_link_libraries(gps_core PUBLIC gpupool_common PkgConfig::LIBEVENT PkgConfig::JANSSON
                      OpenSSL::SSL OpenSSL::Crypto m)
list(APPEND GPS_PARTS gps_core)
