# Runs gguf-synth on a recipe with a wrong sha256: it must exit 1, say why,
# and not write the output.
file(REMOVE ${OUT})
execute_process(COMMAND ${SYNTH} --data ${DATA} --out ${OUT} ${RECIPE}
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 1)
  message(FATAL_ERROR "gguf-synth exited ${rc}, expected 1: ${err}")
endif()
if(NOT err MATCHES "bad_sha.json: generated [0-9]+ bytes with sha256 [0-9a-f]+, but the recipe records 416 bytes, 0000")
  message(FATAL_ERROR "unexpected message: ${err}")
endif()
if(EXISTS ${OUT})
  message(FATAL_ERROR "${OUT} was written despite the mismatch")
endif()
message(STATUS "ok: ${err}")
