# Server API layer (owner: S3): job lifecycle, OpenAI dialect, agent
# protocol. Needs the registry and scheduler (S2) and the store (S1).
if(TARGET gps_sched AND TARGET gps_store)
  add_library(gps_api STATIC
    ${CMAKE_CURRENT_LIST_DIR}/jobs.c
    ${CMAKE_CURRENT_LIST_DIR}/reqcheck.c
    ${CMAKE_CURRENT_LIST_DIR}/toolcalls.c
    ${CMAKE_CURRENT_LIST_DIR}/poolmeta.c
    ${CMAKE_CURRENT_LIST_DIR}/relay.c
    ${CMAKE_CURRENT_LIST_DIR}/api_openai.c
    ${CMAKE_CURRENT_LIST_DIR}/agents_api.c)
  target_link_libraries(gps_api PUBLIC gps_core gps_sched gps_registry gps_store)
  if(TARGET gps_auth)
    target_link_libraries(gps_api PUBLIC gps_auth)
  endif()
  list(APPEND GPS_PARTS gps_api)
endif()
