#!/bin/sh
# run.sh BUILD_DIR SOURCE_DIR
#
# Configures, builds and runs the project in this directory, which takes
# weft's source tree SOURCE_DIR with add_subdirectory(), in a temporary
# directory, with the C compiler and sanitizer of the weft build BUILD_DIR.
# It passes when weft::weft links and runs and weft's build asked for
# nothing but the library's needs: no cmocka, Asio or libuv probe in the
# cache. Environment: CMAKE (default cmake), WEFT_KEEP_TMP=1 keeps the
# temporary directory. POSIX sh.
set -eu

fail() {
  echo "subdir_consumer: FAIL: $*" >&2
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
[ -f "$src/tests/subdir_consumer/CMakeLists.txt" ] ||
  fail "$src is not the weft source root"
[ -f "$build/CMakeCache.txt" ] || fail "$build is not a configured build"
CMAKE=${CMAKE:-cmake}

cache() { sed -n "s/^$1:[A-Z]*=//p" "$build/CMakeCache.txt" | head -n 1; }
cc=$(cache CMAKE_C_COMPILER)
[ -n "$cc" ] || cc=cc
case $(cache WEFT_SANITIZE) in
  address) san="-fsanitize=address,undefined -fno-sanitize-recover=all" ;;
  thread) san="-fsanitize=thread" ;;
  *) san="" ;;
esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft-subdir.XXXXXX")
if [ "${WEFT_KEEP_TMP:-0}" = 1 ]; then
  echo "subdir_consumer: keeping $tmp"
else
  trap 'rm -rf "$tmp"' EXIT
fi

echo "subdir_consumer: add_subdirectory($src) ($cc${san:+ $san})"
run "$tmp/configure.log" "$CMAKE" -S "$src/tests/subdir_consumer" \
  -B "$tmp/b" -DWEFT_SOURCE_DIR="$src" -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_C_COMPILER="$cc" -DCMAKE_C_FLAGS="$san" \
  -DCMAKE_EXE_LINKER_FLAGS="$san" -DCMAKE_SHARED_LINKER_FLAGS="$san"
for probe in CMOCKA ASIO_INCLUDE_DIR LIBUV; do
  if grep -q "^$probe" "$tmp/b/CMakeCache.txt"; then
    fail "weft's build looked for $probe in a project that includes it"
  fi
done
[ ! -d "$tmp/b/weft/tests" ] || fail "weft's tests were configured"
run "$tmp/build.log" "$CMAKE" --build "$tmp/b"
out=$("$tmp/b/consumer") || fail "consumer exited with status $?"
echo "subdir_consumer: consumer: $out"
echo "subdir_consumer: OK"
