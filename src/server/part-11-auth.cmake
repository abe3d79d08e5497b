# Server part: API keys, hashed at rest, constant-time checks (auth.h), and
# the per-key limits and usage counters (limits.h). Owner: S1.
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/auth.c AND TARGET gps_store)
  add_library(gps_auth STATIC ${CMAKE_CURRENT_LIST_DIR}/auth.c ${CMAKE_CURRENT_LIST_DIR}/limits.c)
  target_link_libraries(gps_auth PUBLIC gps_store gpupool_common)
  list(APPEND GPS_PARTS gps_auth)
endif()
