# Server part: bounds on what agents send (agent_check.h). Pure functions,
# no libevent/store: the registry, jobs/agents API and the fuzz target use it.
add_library(gps_agent_check STATIC ${CMAKE_CURRENT_LIST_DIR}/agent_check.c)
target_link_libraries(gps_agent_check PUBLIC gpupool_common PkgConfig::JANSSON m)
list(APPEND GPS_PARTS gps_agent_check)
