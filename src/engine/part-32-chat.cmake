# Engine part: chat-template families (gpe_chat_detect, gpe_chat_apply_format,
# tools: gpe_chat_apply_format_tools; chat.h for gpe_chat_apply). Owner: E4.
add_library(gpe_chat OBJECT ${CMAKE_CURRENT_LIST_DIR}/chat.c)
list(APPEND GPE_PARTS gpe_chat)
# Model-level tool entry points (need the model API; not in gpe_chat so that
# test_chat links chat.c alone).
add_library(gpe_chat_model OBJECT ${CMAKE_CURRENT_LIST_DIR}/chat_model.c)
list(APPEND GPE_PARTS gpe_chat_model)
# Tool calls read back out of generated text (engine.h gpe_toolparse_*).
add_library(gpe_toolcall OBJECT ${CMAKE_CURRENT_LIST_DIR}/toolcall.c)
target_link_libraries(gpe_toolcall PUBLIC PkgConfig::JANSSON)
list(APPEND GPE_PARTS gpe_toolcall)
