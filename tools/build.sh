#!/bin/sh
# build.sh DIR CC CXX [CMAKE ARG...]: configures the build tree DIR with
# the C compiler CC (and the C++ compiler CXX for the peer programs, when it
# is installed) and the CMake arguments, then builds it.
#
# Quiet: one line per phase. The full output of each phase goes to
# DIR/configure.log and DIR/build.log and is printed only if the phase
# fails. VERBOSE=1 prints everything as it comes instead.
# Environment: CMAKE (default cmake), JOBS (default: the number of CPUs).
set -eu

[ $# -ge 3 ] || {
  echo "usage: $0 DIR CC CXX [CMAKE ARG...]" >&2
  exit 2
}
dir=$1 cc=$2 cxx=$3
shift 3
CMAKE=${CMAKE:-cmake}
JOBS=${JOBS:-$(nproc 2>/dev/null || echo 2)}
VERBOSE=${VERBOSE:-0}

# What the tree holds, from the WEFT_BUILD_* arguments, for the messages.
parts=library
type=
for a in "$@"; do
  case $a in
  -DWEFT_BUILD_TESTS=ON) parts="$parts, tests" ;;
  -DWEFT_BUILD_EXAMPLES=ON) parts="$parts, examples" ;;
  -DWEFT_BUILD_BENCH=ON) parts="$parts, benchmarks" ;;
  -DCMAKE_BUILD_TYPE=*) type=" ${a#-DCMAKE_BUILD_TYPE=}" ;;
  esac
done

set -- -S . -B "$dir" --no-warn-unused-cli -DCMAKE_C_COMPILER="$cc" "$@"
# Only a compiler that exists: CMake would fail on a missing one even where
# nothing needs C++ (the peers are skipped without one).
if command -v "$cxx" >/dev/null 2>&1; then
  set -- "$@" -DCMAKE_CXX_COMPILER="$cxx"
fi

if [ "$VERBOSE" = 1 ]; then
  "$CMAKE" "$@"
  exec "$CMAKE" --build "$dir" --parallel "$JOBS"
fi

mkdir -p "$dir"
# phase WHAT LOG CMD...: runs CMD with its output in LOG; one line, and the
# log if CMD fails.
phase() {
  what=$1 log=$2
  shift 2
  printf 'weft: %s ... ' "$what"
  t0=$(date +%s)
  if "$@" >"$log" 2>&1; then
    echo "done ($(($(date +%s) - t0)) s)"
  else
    echo "FAILED; its output ($log):"
    cat "$log"
    exit 1
  fi
}
phase "configuring $dir/ ($cc$type: $parts)" "$dir/configure.log" \
  "$CMAKE" "$@"
phase "building $dir/" "$dir/build.log" \
  "$CMAKE" --build "$dir" --parallel "$JOBS"
