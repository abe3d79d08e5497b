# gp_embed_files(OUT_C SYMBOL_PREFIX FILE...): writes OUT_C, a C file that
# holds each FILE's bytes as `const unsigned char <prefix>_<name>[]` with
# `const size_t <prefix>_<name>_len` (name: the file name with every
# non-alphanumeric character as '_'), regenerated when a file changes. No
# tool beyond CMake itself (the build needs no network and no xxd).
function(gp_embed_files out prefix)
  add_custom_command(
    OUTPUT ${out}
    COMMAND ${CMAKE_COMMAND} -DOUT=${out} -DPREFIX=${prefix} "-DFILES=${ARGN}"
            -P ${CMAKE_SOURCE_DIR}/cmake/EmbedRun.cmake
    DEPENDS ${ARGN} ${CMAKE_SOURCE_DIR}/cmake/EmbedRun.cmake
    COMMENT "Embedding ${prefix} files"
    VERBATIM)
endfunction()
