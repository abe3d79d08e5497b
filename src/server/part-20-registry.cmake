# Server part: agent registry, health state machine, model index (registry.h). Owner: S2.
if(EXISTS ${CMAKE_CURRENT_LIST_DIR}/registry.c)
  add_library(gps_registry STATIC ${CMAKE_CURRENT_LIST_DIR}/registry.c)
  target_link_libraries(gps_registry PUBLIC gps_agent_check gpupool_common PkgConfig::JANSSON)
  list(APPEND GPS_PARTS gps_registry)
endif()
