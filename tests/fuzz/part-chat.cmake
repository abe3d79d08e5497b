# libFuzzer target: the chat-template renderer on arbitrary messages, every
# family, with tools (tests/fuzz/fuzz_chat.c).
#   scripts/fuzz.sh chat
gp_add_fuzz(fuzz_chat SOURCES ${CMAKE_CURRENT_LIST_DIR}/fuzz_chat.c LIBS gpupool-engine)
