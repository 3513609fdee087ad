#!/bin/sh
# san-exec.sh SANITIZER CC CMD [ARG...]
#
# Runs CMD so that programs built with CC -fsanitize=SANITIZER (address or
# thread) work on this kernel. Some kernels randomize mmap too widely for the
# sanitizer runtimes (vm.mmap_rnd_bits > 28; TSan then dies with "unexpected
# memory mapping"). A small threaded probe is built and run first: if it works
# as is (and mmap_rnd_bits <= 28), CMD runs as is; if it needs address-space
# randomization off, CMD runs under `setarch <arch> -R`, which everything CMD
# starts inherits; if it cannot run at all, this fails with the probe output.
set -eu
[ $# -ge 3 ] || { echo "usage: $0 address|thread CC CMD [ARG...]" >&2; exit 2; }
san=$1 cc=$2
shift 2
case $san in
  address) flags="-fsanitize=address,undefined" ;;
  thread) flags="-fsanitize=thread" ;;
  *) echo "$0: unknown sanitizer '$san'" >&2; exit 2 ;;
esac

tmp=$(mktemp -d "${TMPDIR:-/tmp}/weft-san.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
cat >"$tmp/probe.c" <<'PROBE'
#include <pthread.h>
#include <stdlib.h>
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int n;
static void *run(void *arg) {
  for (int i = 0; i < 1000; i++) {
    pthread_mutex_lock(&mu);
    n++;
    pthread_mutex_unlock(&mu);
  }
  free(malloc(64));
  return arg;
}
int main(void) {
  pthread_t t[4];
  for (int i = 0; i < 4; i++)
    pthread_create(&t[i], NULL, run, NULL);
  for (int i = 0; i < 4; i++)
    pthread_join(t[i], NULL);
  return n != 4000;
}
PROBE
# shellcheck disable=SC2086 # $flags is a list of flags
if ! "$cc" $flags -g -pthread "$tmp/probe.c" -o "$tmp/probe" \
    >"$tmp/log" 2>&1; then
  echo "san-exec: cannot build with $cc $flags:" >&2
  cat "$tmp/log" >&2
  exit 1
fi
# Several runs: a bad mapping depends on where the randomization lands. With
# vm.mmap_rnd_bits above 28, ASLR is turned off even if the probe got lucky.
ok=1
for _ in 1 2 3 4 5 6 7 8 9 10; do
  "$tmp/probe" >"$tmp/log" 2>&1 || { ok=0; break; }
done
bits=$(cat /proc/sys/vm/mmap_rnd_bits 2>/dev/null) || bits=0
if [ $ok = 1 ] && [ "$bits" -le 28 ]; then
  rm -rf "$tmp"
  trap - EXIT
  exec "$@"
fi
arch=$(uname -m)
if setarch "$arch" -R "$tmp/probe" >"$tmp/log2" 2>&1; then
  echo "san-exec: $cc -fsanitize=$san may fail with ASLR on this kernel" \
    "(vm.mmap_rnd_bits=$bits);" \
    "running under setarch $arch -R" >&2
  rm -rf "$tmp"
  trap - EXIT
  exec setarch "$arch" -R "$@"
fi
if [ $ok = 1 ]; then # setarch is unusable, but the probe ran
  rm -rf "$tmp"
  trap - EXIT
  exec "$@"
fi
echo "san-exec: programs built with $cc -fsanitize=$san do not run here," \
  "not even under setarch $arch -R:" >&2
head -n 20 "$tmp/log" "$tmp/log2" >&2
exit 1
