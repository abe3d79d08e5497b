# The JSON Schema validator (src/engine/jvalidate.c): each keyword with the
# schema's own meaning, violations named by place, refusals, cost bound.
gp_add_unit_test(test_jvalidate
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_jvalidate.c
  LIBS gpupool-engine PkgConfig::JANSSON m
  LABELS engine)
