# Engine part: JSON-Schema-constrained sampling (engine.h gpe_grammar_*,
# gpe_schema_check): the schema compiler (jschema.c), the byte matcher
# (jsongram.c) and the vocabulary mask (grammar.c). jschema links alone into
# the server (gpe_jschema) to refuse a schema before any token. jcheck.c
# (the engine's checked jansson loads and dumps, gpe_set_json_alloc_failures)
# goes with it: every part that reads or writes JSON is linked with it.
add_library(gpe_jschema OBJECT ${CMAKE_CURRENT_LIST_DIR}/jschema.c
                               ${CMAKE_CURRENT_LIST_DIR}/jregex.c
                               ${CMAKE_CURRENT_LIST_DIR}/jsongram.c
                               ${CMAKE_CURRENT_LIST_DIR}/jcheck.c)
target_link_libraries(gpe_jschema PUBLIC PkgConfig::JANSSON)
add_library(gpe_grammar OBJECT ${CMAKE_CURRENT_LIST_DIR}/grammar.c)
target_link_libraries(gpe_grammar PUBLIC PkgConfig::JANSSON)
# -O3 even in RelWithDebInfo: the mask's whole-vocabulary loops must
# vectorise (as the sampler's; no -ffast-math).
target_compile_options(gpe_grammar PRIVATE -O3 -fno-trapping-math)
list(APPEND GPE_PARTS gpe_jschema gpe_grammar)
list(APPEND GPE_EXTRA_LIBS PkgConfig::JANSSON)
