# The JSON Schema validator's compile (src/engine/jvalidate.c gpe_jv_new)
# under allocation failure: every run makes a validator that checks as the
# unhurt one does, or fails with GPE_ERR_NOMEM. The N-th of jansson's and
# the validator's libc allocations fails (tests/unit/server/fixture_oom.h:
# arm_libc, through the linker's --wrap; strdup and strndup wrapped in the
# test itself, as test_jschema_oom does). The check of text also with
# gp_json's counter registered (gpupool_common; arm_beneath).
gp_add_unit_test(test_jvalidate_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_jvalidate_oom.c
  LIBS gpupool-engine gpupool_common PkgConfig::JANSSON m
  LABELS engine)
target_link_options(test_jvalidate_oom PRIVATE
  -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc,--wrap=strdup,--wrap=strndup)
