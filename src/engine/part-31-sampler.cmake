# Engine part: sampler and stop-string matcher (engine.h gpe_sampler_*, gpe_stop_*). Owner: E4.
add_library(gpe_sampler OBJECT ${CMAKE_CURRENT_LIST_DIR}/sampler.c)
list(APPEND GPE_PARTS gpe_sampler)
# -O3 even in RelWithDebInfo: the whole-vocabulary loops (150k entries per
# token) must vectorise. No -ffast-math: sampling must be reproducible.
# -fno-trapping-math only lets comparisons be if-converted (no fast-math).
target_compile_options(gpe_sampler PRIVATE -O3 -fno-trapping-math)
