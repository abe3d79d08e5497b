# The chat renderers (src/engine/chat.c, chat_model.c) when memory runs
# out: the unhurt prompt, or GPE_ERR_NOMEM from the _status forms, never
# GPE_ERR_ARG nor another prompt. The N-th of their libc allocations fails
# (tests/unit/server/fixture_oom.h: arm_libc, through the linker's --wrap).
gp_add_unit_test(test_chat_oom
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_chat_oom.c
  LIBS gpupool-engine PkgConfig::JANSSON
  LABELS engine)
target_link_options(test_chat_oom PRIVATE -Wl,--wrap=malloc,--wrap=calloc,--wrap=realloc)
