# Install layout and the Debian package (CPack). Included from the top-level
# CMakeLists.txt after the targets exist.
#
#   cmake --install BUILD [--prefix P]      # P defaults to /usr/local
#   cd BUILD && cpack -G DEB                # gpupool_<version>_<arch>.deb
#
# Layout (P = the install prefix; docs/operations.md lists it too):
#   P/bin/gpupool-server, gpupool-agent, gpupool-run     (their own install() lines)
#   P/lib/systemd/system/gpupool-server.service, gpupool-agent.service
#   P/lib/sysusers.d/gpupool.conf
#   ETC/gpupool/server.conf, agent.conf                  (examples; conffiles in the .deb)
#   P/share/doc/gpupool/    docs/*.md, README.md, LICENSE
#   P/share/gpupool/migrations/NNNN_name.sql             (reference copy: the binary embeds them)
#   P/share/gpupool/prometheus/gpupool-alerts.yml, P/share/gpupool/grafana/gpupool.json
#   P/share/gpupool/haproxy/haproxy.cfg                  (docs/operations.md "Several servers")
# ETC is /etc when P is /usr (as in the .deb) and P/etc otherwise, the same
# rule as GNUInstallDirs' CMAKE_INSTALL_FULL_SYSCONFDIR. It is decided at
# install time, not configure time, so that `cmake --install --prefix` and
# CPack (which installs with prefix /usr into a staging DESTDIR) both get it
# right. The units' ExecStart= and --config paths are rewritten the same way,
# so an installed unit always names the installed binary and config.

# Where the units and sysusers.d file go, relative to the prefix. /usr/lib/...
# is searched by systemd on every current distribution (Debian 12 included),
# /usr/local/lib/systemd/system too.
set(GPUPOOL_SYSTEMD_UNITDIR "lib/systemd/system" CACHE STRING
    "systemd unit directory, relative to the install prefix")
set(GPUPOOL_SYSUSERSDIR "lib/sysusers.d" CACHE STRING
    "sysusers.d directory, relative to the install prefix")

set(_gp_conf ${CMAKE_CURRENT_LIST_DIR}/../conf)
get_filename_component(_gp_conf ${_gp_conf} ABSOLUTE)

# Docs: everything in docs/ is installed by the top-level install(DIRECTORY);
# the README and licence go next to it.
install(FILES ${CMAKE_SOURCE_DIR}/README.md ${CMAKE_SOURCE_DIR}/LICENSE
        DESTINATION share/doc/gpupool)

# Operator files for Prometheus and Grafana (docs/operations.md "Metrics and
# alerts"): read by those tools, not by gpupool, so under share/ rather than /etc.
install(FILES ${_gp_conf}/prometheus/gpupool-alerts.yml DESTINATION share/gpupool/prometheus)
install(FILES ${_gp_conf}/grafana/gpupool.json DESTINATION share/gpupool/grafana)
# HAProxy in front of several servers: a template for /etc/haproxy/haproxy.cfg.
install(FILES ${_gp_conf}/haproxy.cfg DESTINATION share/gpupool/haproxy)

install(FILES ${_gp_conf}/gpupool.sysusers DESTINATION ${GPUPOOL_SYSUSERSDIR}
        RENAME gpupool.conf)

# Example configs and units: computed at install time (see the header). The
# code runs inside cmake_install.cmake, where CMAKE_INSTALL_PREFIX is the
# final prefix; file(INSTALL) adds $DESTDIR and records the install manifest.
install(CODE "
  if(CMAKE_INSTALL_PREFIX STREQUAL \"/usr\")
    set(_gp_etc \"/etc/gpupool\")
  else()
    set(_gp_etc \"\${CMAKE_INSTALL_PREFIX}/etc/gpupool\")
  endif()
  file(INSTALL DESTINATION \"\${_gp_etc}\" TYPE FILE PERMISSIONS OWNER_READ OWNER_WRITE
       GROUP_READ WORLD_READ FILES \"${_gp_conf}/server.conf\" \"${_gp_conf}/agent.conf\")
  set(_gp_unitdir \"\${CMAKE_INSTALL_PREFIX}/${GPUPOOL_SYSTEMD_UNITDIR}\")
  # One scratch dir per destination: concurrent installs (tests) don't mix.
  string(MD5 _gp_h \"\$ENV{DESTDIR}|\${CMAKE_INSTALL_PREFIX}\")
  set(_gp_tmp \"${CMAKE_BINARY_DIR}/gpupool-units/\${_gp_h}\")
  file(MAKE_DIRECTORY \"\${_gp_tmp}\")
  foreach(_u gpupool-server gpupool-agent)
    file(READ \"${_gp_conf}/\${_u}.service\" _t)
    string(REPLACE \"=/usr/bin/gpupool-\" \"=\${CMAKE_INSTALL_PREFIX}/bin/gpupool-\" _t \"\${_t}\")
    string(REPLACE \"/etc/gpupool/\" \"\${_gp_etc}/\" _t \"\${_t}\")
    string(REPLACE \"file:/usr/share/doc/gpupool/\"
           \"file:\${CMAKE_INSTALL_PREFIX}/share/doc/gpupool/\" _t \"\${_t}\")
    file(WRITE \"\${_gp_tmp}/\${_u}.service\" \"\${_t}\")
    file(INSTALL DESTINATION \"\${_gp_unitdir}\" TYPE FILE PERMISSIONS OWNER_READ OWNER_WRITE
         GROUP_READ WORLD_READ FILES \"\${_gp_tmp}/\${_u}.service\")
  endforeach()
")

# ---------------------------------------------------------------- CPack --
# cpack (like `make install`) would first build the whole tree, tests and
# benchmarks included; the package needs only the three binaries, which
# `cmake --build` has made. Skipping that keeps cpack to packing.
set(CMAKE_SKIP_INSTALL_ALL_DEPENDENCY ON)
set(CPACK_PACKAGE_NAME gpupool)
set(CPACK_PACKAGE_VENDOR "gpupool")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "pool GPU boxes into one LLM endpoint (server, agent, engine CLI)")
set(CPACK_PACKAGE_DESCRIPTION
    "gpupool-server schedules OpenAI-style requests onto gpupool-agent processes running on GPU machines and relays their tokens back; gpupool-run runs the embedded GGUF engine on the command line. Ships systemd units (hardened), example configs in /etc/gpupool and the documentation.")
set(CPACK_PACKAGE_CONTACT "gpupool maintainers <gpupool@localhost>")
set(CPACK_RESOURCE_FILE_LICENSE ${CMAKE_SOURCE_DIR}/LICENSE)
set(CPACK_GENERATOR DEB)
# Install with prefix /usr into a staging DESTDIR: absolute paths (/etc)
# then land in the package, not on the build machine.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION net)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "file:///usr/share/doc/gpupool/README.md")
# Run-time libraries: computed by dpkg-shlibdeps (dpkg-dev) from the
# binaries when it is there (CPack also needs `file` to find them), else the
# list below (Debian 12's names).
find_program(GPUPOOL_DPKG_SHLIBDEPS dpkg-shlibdeps)
find_program(GPUPOOL_FILE_CMD file)
if(GPUPOOL_DPKG_SHLIBDEPS AND GPUPOOL_FILE_CMD AND TARGET gpupool-cuda)
  # A CUDA build packs the CUDA plugin (P/lib/gpupool/libgpupool-cuda.so),
  # which links libcudart/libcublas. The package must not depend on them:
  # the engine loads the plugin at run time and runs on the CPU when it
  # cannot (docs/cuda.md). So the Depends are computed at cpack time from
  # the binaries alone (cmake/ShlibdepsNoCuda.cmake), not by CPack from
  # every ELF file in the package.
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS OFF)
  set(GPUPOOL_SHLIBDEPS_BINARIES
      "$<TARGET_FILE:gpupool-server>;$<TARGET_FILE:gpupool-agent>;$<TARGET_FILE:gpupool-run>;$<TARGET_FILE:gpupoolctl>")
  file(GENERATE OUTPUT ${CMAKE_BINARY_DIR}/gpupool-cpack-project.cmake CONTENT "
set(GPUPOOL_SHLIBDEPS \"${GPUPOOL_DPKG_SHLIBDEPS}\")
set(GPUPOOL_SHLIBDEPS_BINARIES \"${GPUPOOL_SHLIBDEPS_BINARIES}\")
set(GPUPOOL_SHLIBDEPS_WORKDIR \"${CMAKE_BINARY_DIR}/gpupool-shlibdeps\")
include(\"${CMAKE_CURRENT_LIST_DIR}/ShlibdepsNoCuda.cmake\")
")
  set(CPACK_PROJECT_CONFIG_FILE ${CMAKE_BINARY_DIR}/gpupool-cpack-project.cmake)
elseif(GPUPOOL_DPKG_SHLIBDEPS AND GPUPOOL_FILE_CMD)
  set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
else()
  set(CPACK_DEBIAN_PACKAGE_DEPENDS
      "libc6, libevent-2.1-7, libevent-pthreads-2.1-7, libevent-openssl-2.1-7, libsqlite3-0, libjansson4, libssl3, libcurl4")
endif()
# systemd-sysusers creates the users; adduser is the fallback in postinst.
set(CPACK_DEBIAN_PACKAGE_RECOMMENDS "systemd, sqlite3")
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "adduser")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    ${CMAKE_SOURCE_DIR}/packaging/conffiles
    ${CMAKE_SOURCE_DIR}/packaging/postinst
    ${CMAKE_SOURCE_DIR}/packaging/prerm
    ${CMAKE_SOURCE_DIR}/packaging/postrm)
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)
include(CPack)
