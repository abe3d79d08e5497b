# Anthropic Messages dialect and the native /v2/tasks API (owner: S4).
# Compiled into gps_api (declared in part-40) so the server binary and the
# API unit tests pick them up without another library.
if(TARGET gps_api)
  target_sources(gps_api PRIVATE ${CMAKE_CURRENT_LIST_DIR}/api_anthropic.c
                                 ${CMAKE_CURRENT_LIST_DIR}/api_tasks.c)
endif()
