# Installation of weft: libraries, header, CMake package and pkg-config file.
# Included from the top-level CMakeLists.txt after the targets are defined.
#
#   <prefix>/include/weft.h, <prefix>/include/weft/*.h
#   <libdir>/libweft.so.X.Y.Z, libweft.so.X, libweft.so, libweft.a,
#   libweft_sim.a (the simulation build, for tests)
#   <libdir>/cmake/weft/weft{Config,ConfigVersion,Targets*}.cmake
#   <libdir>/pkgconfig/weft.pc
#
# find_package(weft) provides weft::weft (shared), weft::weft_static and
# weft::weft_sim.
include(CMakePackageConfigHelpers)

# The package version comes from project(); the header repeats it. Keep them
# from drifting apart.
file(STRINGS "${PROJECT_SOURCE_DIR}/include/weft.h" _weft_ver_lines
  REGEX "^#define WEFT_VERSION_(MAJOR|MINOR|PATCH) +[0-9]+")
foreach(_l IN LISTS _weft_ver_lines)
  if(_l MATCHES "^#define WEFT_VERSION_([A-Z]+) +([0-9]+)")
    set(_weft_h_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
  endif()
endforeach()
set(_weft_h_version "${_weft_h_MAJOR}.${_weft_h_MINOR}.${_weft_h_PATCH}")
if(NOT _weft_h_version STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "include/weft.h says version ${_weft_h_version}, "
                      "project() says ${PROJECT_VERSION}")
endif()

set(WEFT_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/weft"
  CACHE STRING "where the weft CMake package files are installed")
mark_as_advanced(WEFT_INSTALL_CMAKEDIR)

set(_weft_libs weft weft_static)
if(TARGET weft_sim)
  list(APPEND _weft_libs weft_sim)
endif()
install(TARGETS ${_weft_libs}
  EXPORT weftTargets
  RUNTIME DESTINATION "${CMAKE_INSTALL_BINDIR}"
  LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
  INCLUDES DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")

install(FILES "${PROJECT_SOURCE_DIR}/include/weft.h"
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}")
install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/weft"
  DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
  FILES_MATCHING PATTERN "*.h")

install(EXPORT weftTargets
  NAMESPACE weft::
  FILE weftTargets.cmake
  DESTINATION "${WEFT_INSTALL_CMAKEDIR}")

configure_package_config_file(
  "${PROJECT_SOURCE_DIR}/cmake/weftConfig.cmake.in"
  "${PROJECT_BINARY_DIR}/weftConfig.cmake"
  INSTALL_DESTINATION "${WEFT_INSTALL_CMAKEDIR}")
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/weftConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}"
  COMPATIBILITY SameMinorVersion) # 0.x: minors may break
install(FILES
  "${PROJECT_BINARY_DIR}/weftConfig.cmake"
  "${PROJECT_BINARY_DIR}/weftConfigVersion.cmake"
  DESTINATION "${WEFT_INSTALL_CMAKEDIR}")

# pkg-config. The prefix is only known at install time (`cmake --install
# --prefix P` overrides CMAKE_INSTALL_PREFIX), so weft.pc is made in two
# steps: everything but the prefix now (build/weft.pc.in), the prefix when
# installing, written straight to its destination (not into the build tree,
# which a `sudo make install` would leave root-owned). Relative
# GNUInstallDirs paths are written relative to ${prefix}.
foreach(_d LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${CMAKE_INSTALL_${_d}}")
    set(WEFT_PC_${_d} "${CMAKE_INSTALL_${_d}}")
  elseif(_d STREQUAL "LIBDIR")
    set(WEFT_PC_${_d} "\${exec_prefix}/${CMAKE_INSTALL_${_d}}")
  else()
    set(WEFT_PC_${_d} "\${prefix}/${CMAKE_INSTALL_${_d}}")
  endif()
endforeach()
# Threads::Threads, for static linking: -pthread is right for gcc and clang
# (on glibc >= 2.34 libpthread is part of libc anyway). No Requires: the
# threads library has no .pc file.
set(WEFT_PC_LIBS_PRIVATE "-pthread")
set(WEFT_PC_PREFIX "@WEFT_PC_PREFIX@") # left for the install step
configure_file("${PROJECT_SOURCE_DIR}/cmake/weft.pc.in"
  "${PROJECT_BINARY_DIR}/weft.pc.in" @ONLY)
if(IS_ABSOLUTE "${CMAKE_INSTALL_LIBDIR}")
  set(_weft_pc_dir "${CMAKE_INSTALL_LIBDIR}/pkgconfig")
else()
  set(_weft_pc_dir "\${CMAKE_INSTALL_PREFIX}/${CMAKE_INSTALL_LIBDIR}/pkgconfig")
endif()
install(CODE "
  set(WEFT_PC_PREFIX \"\${CMAKE_INSTALL_PREFIX}\")
  set(_weft_pc \"${_weft_pc_dir}/weft.pc\")
  message(STATUS \"Installing: \$ENV{DESTDIR}\${_weft_pc}\")
  configure_file(\"${PROJECT_BINARY_DIR}/weft.pc.in\"
    \"\$ENV{DESTDIR}\${_weft_pc}\" @ONLY)
  list(APPEND CMAKE_INSTALL_MANIFEST_FILES \"\${_weft_pc}\")
")
