# What one agent's poll pays for the cancel records at 10,000 agents
# (printed, never asserted; docs/scheduling.md "Cancel records").
add_executable(bench_cancels ${CMAKE_CURRENT_LIST_DIR}/bench_cancels.c)
target_link_libraries(bench_cancels PRIVATE gps_api)
