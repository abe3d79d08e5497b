# The host's counter of jansson's failed allocations in the engine
# (src/engine/jcheck.c, engine.h gpe_set_json_alloc_failures), gp_json's
# (src/common/gp_json.c) registered: a load that jansson got wrong the same
# way twice is refused, which the engine alone cannot see. The test's own
# malloc fails the chosen calls (ld --wrap=malloc), beneath gp_json's
# counting allocator. And the host's loader (engine.h gpe_set_json_loader,
# gp_json_load_checked registered): every load exact or out of memory,
# where jansson's loader crashes (shown in a child process).
gp_add_unit_test(test_jcheck
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_jcheck.c
  LIBS gpupool-engine gpupool_common PkgConfig::JANSSON m
  LABELS engine)
target_link_options(test_jcheck PRIVATE -Wl,--wrap=malloc)
