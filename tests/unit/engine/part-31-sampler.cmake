# Engine sampler and stop-string tests (the test #includes sampler.c). Owner: E4.
gp_add_unit_test(test_sampler SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_sampler.c
                 LIBS m LABELS engine)
