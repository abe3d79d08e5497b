# Server part: per-model queues and job-to-agent matching (sched.h). Owner: S2.
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/sched.c AND TARGET gps_registry)
  add_library(gps_sched STATIC ${CMAKE_CURRENT_LIST_DIR}/sched.c)
  target_link_libraries(gps_sched PUBLIC gps_registry)
  list(APPEND GPS_PARTS gps_sched)
endif()
