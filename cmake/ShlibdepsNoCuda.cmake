# Included by cpack (CPACK_PROJECT_CONFIG_FILE, see Packaging.cmake) in CUDA
# builds: sets CPACK_DEBIAN_PACKAGE_DEPENDS from dpkg-shlibdeps run on the
# gpupool binaries only, so that the CUDA plugin's libraries (libcudart,
# libcublas) never become dependencies of the package. Inputs:
# GPUPOOL_SHLIBDEPS (the tool), GPUPOOL_SHLIBDEPS_BINARIES (paths),
# GPUPOOL_SHLIBDEPS_WORKDIR (scratch; dpkg-shlibdeps wants debian/control).
if(NOT CPACK_GENERATOR STREQUAL "DEB" OR DEFINED GPUPOOL_SHLIBDEPS_DONE)
  return()
endif()
set(GPUPOOL_SHLIBDEPS_DONE ON)
file(MAKE_DIRECTORY "${GPUPOOL_SHLIBDEPS_WORKDIR}/debian")
file(WRITE "${GPUPOOL_SHLIBDEPS_WORKDIR}/debian/control" "")
execute_process(
  COMMAND ${CMAKE_COMMAND} -E env LC_ALL=C "${GPUPOOL_SHLIBDEPS}" --ignore-missing-info -O
          ${GPUPOOL_SHLIBDEPS_BINARIES}
  WORKING_DIRECTORY "${GPUPOOL_SHLIBDEPS_WORKDIR}"
  OUTPUT_VARIABLE _gp_out ERROR_VARIABLE _gp_err RESULT_VARIABLE _gp_rc
  OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _gp_rc EQUAL 0)
  message(FATAL_ERROR "dpkg-shlibdeps failed on the gpupool binaries: ${_gp_err}")
endif()
string(REGEX REPLACE "^.*Depends=" "" _gp_deps "${_gp_out}")
if(_gp_deps MATCHES "cuda|cublas")
  message(FATAL_ERROR "the gpupool binaries depend on CUDA libraries (${_gp_deps}): "
                      "only the plugin may link them")
endif()
set(CPACK_DEBIAN_PACKAGE_DEPENDS "${_gp_deps}")
