# Relay overhead (owner: A1): TTFT and total time through server + agent vs
# the upstream directly at 1 and 64 streams, requests/s with a zero-delay
# upstream, server RSS with 1,000 idle streams. Printed, never asserted:
#   cmake --build BUILD --target bench-relay
# (or python3 bench/relay_bench.py --build BUILD [--quick])
find_package(Python3 COMPONENTS Interpreter)
if(Python3_Interpreter_FOUND AND TARGET gpupool-agent)
  add_custom_target(bench-relay
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/relay_bench.py --build ${CMAKE_BINARY_DIR}
    USES_TERMINAL
    COMMENT "relay benchmark (server + agent vs upstream direct)")
  # Server CPU per token event per dialect, RSS per non-reading client
  # (bench/relay_cpu.py): cmake --build BUILD --target bench-relay-cpu
  add_custom_target(bench-relay-cpu
    COMMAND ${Python3_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/relay_cpu.py --build ${CMAKE_BINARY_DIR}
    USES_TERMINAL
    COMMENT "relay CPU per token event, RSS per non-reading client")
endif()
