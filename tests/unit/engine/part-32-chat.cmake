# Engine chat-template tests. Owner: E4.
gp_add_unit_test(test_chat SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_chat.c
                 LIBS gpe_chat LABELS engine)
# Tool calls read back out of generated text (src/engine/toolcall.c).
gp_add_unit_test(test_toolcall SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_toolcall.c
                 LIBS gpupool-engine PkgConfig::JANSSON LABELS engine)
