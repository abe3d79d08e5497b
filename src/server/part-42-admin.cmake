# Server part: the admin API under /admin/* (admin_api.h): keys, agents,
# jobs, status. Linked into gpupool-server by part-90-main.cmake.
if(TARGET gps_api AND TARGET gps_auth)
  add_library(gps_admin STATIC ${CMAKE_CURRENT_LIST_DIR}/admin_api.c)
  target_link_libraries(gps_admin PUBLIC gps_api gps_auth gps_store gps_sched gps_registry
                        gps_core gpupool_common)
  list(APPEND GPS_PARTS gps_admin)
endif()
