# Engine chat-template tests. Owner: E4.
gp_add_unit_test(test_chat SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_chat.c
                 LIBS gpe_chat LABELS engine)
