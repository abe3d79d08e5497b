# scalesim: the project's load generator and simulated-agent driver (one
# libevent loop); bench/scale.py runs it beside a server (target bench-scale).
add_executable(scalesim ${CMAKE_CURRENT_LIST_DIR}/scalesim.c)
target_link_libraries(scalesim PRIVATE PkgConfig::LIBEVENT PkgConfig::JANSSON)
