# Scheduler decision cost with prefix routing at 1,000 and 10,000 agents
# (printed, never asserted; docs/scheduling.md "Prefix routing").
add_executable(bench_sched ${CMAKE_CURRENT_LIST_DIR}/bench_sched.c)
target_link_libraries(bench_sched PRIVATE gps_sched)
