# Shared set-up of the libFuzzer targets (sorted first among the part files).
#
# The libraries a target exercises are compiled with coverage instrumentation
# (fuzzer-no-link) and ASan+UBSan in this tree only, so that libFuzzer sees
# their edges and an out-of-bounds access inside them is reported; anything
# linking them gets the sanitizer runtimes. scripts/fuzz.sh builds the
# targets listed in GP_FUZZ_TARGETS (fuzz_all) and runs them.
set(GP_FUZZ_FLAGS -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
    -fno-omit-frame-pointer)
foreach(_lib gpupool_common gps_core gps_http gps_stream gps_dialects gps_jobs gps_agents_api gps_auth
             gps_store gps_sched gps_registry gps_agent_check gpupool_agent_base ${GPE_PARTS})
  target_compile_options(${_lib} PRIVATE ${GP_FUZZ_FLAGS})
  get_target_property(_type ${_lib} TYPE)
  if(NOT _type STREQUAL "OBJECT_LIBRARY")
    target_link_options(${_lib} INTERFACE -fsanitize=address,undefined)
  endif()
endforeach()
target_link_options(gpupool-engine INTERFACE -fsanitize=address,undefined)

add_custom_target(fuzz_all)

# gp_add_fuzz(NAME SOURCES src... [LIBS lib...] [DEFS def...]): one libFuzzer
# binary; its checked-in seeds live in tests/fuzz/corpus/NAME without the
# fuzz_ prefix (scripts/fuzz.sh copies them to a scratch dir).
function(gp_add_fuzz name)
  cmake_parse_arguments(F "" "" "SOURCES;LIBS;DEFS" ${ARGN})
  add_executable(${name} ${F_SOURCES})
  target_compile_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined
                         -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  target_link_options(${name} PRIVATE -fsanitize=fuzzer,address,undefined)
  target_link_libraries(${name} PRIVATE ${F_LIBS} Threads::Threads m)
  target_compile_definitions(${name} PRIVATE GP_TEST_DATA="${GP_TEST_DATA}"
                             GP_MODEL_DATA="${GP_MODEL_DATA}" GP_SOURCE_DIR="${CMAKE_SOURCE_DIR}" ${F_DEFS})
  add_dependencies(fuzz_all ${name})
endfunction()
