# gpupool-server executable (owner: S3): links every server part library.
if(TARGET gps_api AND TARGET gps_auth AND TARGET gps_store)
  add_executable(gpupool-server ${CMAKE_CURRENT_LIST_DIR}/main.c)
  target_link_libraries(gpupool-server PRIVATE gps_api gps_auth gps_store gps_sched
                        gps_registry gps_core gpupool_common PkgConfig::LIBEVENT
                        PkgConfig::JANSSON PkgConfig::SQLITE Threads::Threads)
  if(TARGET gps_admin)
    target_link_libraries(gpupool-server PRIVATE gps_admin)
  endif()
  install(TARGETS gpupool-server RUNTIME DESTINATION bin)
endif()
