# prefix-bench: the agent's prompt-prefix cache on a replayed 20-turn
# conversation, cache on and off side by side (issue 13). Needs the agent's
# gguf backend. Printed only.
add_executable(prefix-bench ${CMAKE_CURRENT_LIST_DIR}/prefix_bench.c)
target_link_libraries(prefix-bench PRIVATE gpupool_agent_core gpupool-engine PkgConfig::JANSSON
                      Threads::Threads)
