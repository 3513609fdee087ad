#!/bin/sh
# run.sh BUILD_DIR SOURCE_DIR
#
# Installs the (already built) weft build tree BUILD_DIR into a fresh
# temporary prefix, then builds and runs the consumer in this directory
#   1. with CMake: find_package(weft) + weft::weft (and weft::weft_static,
#      and weft::weft_sim, run simulated with WEFT_SIM_SEED),
#   2. with pkg-config and the C compiler directly.
# SOURCE_DIR is the weft source root (or this directory). The consumer is
# built with the compiler and sanitizer of BUILD_DIR, so it also works in the
# ASan and TSan builds. Environment: CMAKE (default cmake), PKG_CONFIG
# (default pkg-config), WEFT_KEEP_TMP=1 keeps the temporary directory.
# POSIX sh: ctest may run it as `sh run.sh ...`.
set -eu

fail() {
  echo "install_consumer: FAIL: $*" >&2
  exit 1
}
# run LOG CMD...: runs CMD with its output in LOG, shown only if it fails.
run() {
  log=$1
  shift
  if ! "$@" >"$log" 2>&1; then
    cat "$log" >&2
    fail "command failed: $*"
  fi
}

[ $# -eq 2 ] || fail "usage: $0 BUILD_DIR SOURCE_DIR"
build=$(cd "$1" && pwd) || fail "no build directory $1"
src=$(cd "$2" && pwd) || fail "no source directory $2"
if [ -f "$src/tests/install_consumer/consumer.c" ]; then
  consumer_src=$src/tests/install_consumer
elif [ -f "$src/consumer.c" ]; then
  consumer_src=$src
else
  fail "$src is neither the weft source root nor the consumer directory"
fi
[ -f "$build/CMakeCache.txt" ] || fail "$build is not a configured build"
CMAKE=${CMAKE:-cmake}
PKG_CONFIG=${PKG_CONFIG:-pkg-config}
command -v "$PKG_CONFIG" >/dev/null || fail "$PKG_CONFIG not found"

cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -n 1; }
cc=$(cache CMAKE_C_COMPILER)
[ -n "$cc" ] || cc=cc
case $(cache WEFT_SANITIZE) in
  address) san="-fsanitize=address,undefined -fno-sanitize-recover=all" ;;
  thread) san="-fsanitize=thread" ;;
  *) san="" ;;
esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft-install.XXXXXX")
if [ "${WEFT_KEEP_TMP:-0}" = 1 ]; then
  echo "install_consumer: keeping $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi
prefix=$tmp/prefix

echo "install_consumer: installing $build into $prefix"
run "$tmp/install.log" "$CMAKE" --install "$build" --prefix "$prefix"
[ -f "$prefix/include/weft.h" ] || fail "weft.h not installed in $prefix/include"
for h in net.h sys.h sim.h; do
  [ -f "$prefix/include/weft/$h" ] || fail "weft/$h not installed in $prefix/include"
done
pc=$(find "$prefix" -name weft.pc -path '*/pkgconfig/*' | head -n 1)
[ -n "$pc" ] || fail "weft.pc not installed"
for f in libweft.a libweft.so libweft_sim.a; do
  [ -e "$(dirname "$(dirname "$pc")")/$f" ] || fail "$f not installed"
done

# 1. CMake, find_package(weft).
echo "install_consumer: building with find_package(weft) ($cc${san:+ $san})"
run "$tmp/cmake-configure.log" "$CMAKE" -S "$consumer_src" -B "$tmp/cmake" \
  -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_COMPILER="$cc" \
  -DCMAKE_C_FLAGS="$san" -DCMAKE_EXE_LINKER_FLAGS="$san" \
  -DCMAKE_PREFIX_PATH="$prefix" -DWEFT_EXPECT_PREFIX="$prefix" \
  -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF
run "$tmp/cmake-build.log" "$CMAKE" --build "$tmp/cmake"

# 2. pkg-config and the compiler.
echo "install_consumer: building with pkg-config"
PKG_CONFIG_PATH="$(dirname "$pc")${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export PKG_CONFIG_PATH
flags=$("$PKG_CONFIG" --cflags --libs weft) || fail "pkg-config --cflags --libs weft"
libdir=$("$PKG_CONFIG" --variable=libdir weft)
case $flags in *"$prefix/"*) ;; *) fail "pkg-config gave '$flags', not $prefix" ;; esac
# shellcheck disable=SC2086 # word splitting of the flags is intended
run "$tmp/pkgconfig-build.log" "$cc" -std=c11 -Wall -Wextra -Werror -pedantic \
  $san "$consumer_src/consumer.c" -o "$tmp/consumer_pc" $flags

for exe in "$tmp/cmake/consumer" "$tmp/cmake/consumer_static" "$tmp/consumer_pc"; do
  name=${exe#"$tmp"/}
  [ -x "$exe" ] || fail "$name was not built"
  if [ "$exe" != "$tmp/cmake/consumer_static" ]; then
    deps=$(LD_LIBRARY_PATH="$libdir" ldd "$exe") || fail "ldd $name"
    case $deps in
      *"libweft.so"*" => $libdir/"*) ;;
      *) fail "$name does not load libweft.so from $libdir: $deps" ;;
    esac
  fi
  out=$(LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$exe") ||
    fail "$name exited with status $?"
  echo "install_consumer: $name: $out"
done
# The simulation build: the same program, simulated (the same source does
# not change; the environment seeds it).
exe=$tmp/cmake/consumer_sim
[ -x "$exe" ] || fail "cmake/consumer_sim was not built"
out=$(WEFT_SIM_SEED=3 "$exe") || fail "cmake/consumer_sim exited with status $?"
case $out in
  "simulated, seed 3, 1 handler calls; weft "*) ;;
  *) fail "cmake/consumer_sim with WEFT_SIM_SEED=3 printed '$out'" ;;
esac
echo "install_consumer: cmake/consumer_sim (WEFT_SIM_SEED=3): $out"
echo "install_consumer: OK"
