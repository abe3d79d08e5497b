# Engine part: chat-template families (gpe_chat_detect, gpe_chat_apply_format;
# chat.h for gpe_chat_apply). Owner: E4.
add_library(gpe_chat OBJECT ${CMAKE_CURRENT_LIST_DIR}/chat.c)
list(APPEND GPE_PARTS gpe_chat)
