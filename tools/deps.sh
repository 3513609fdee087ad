#!/bin/sh
# deps.sh [LEVEL]: makes sure the Debian packages that a part of the weft
# build needs are installed. Levels, each with what it adds:
#   (none) or lib  the library: pkg-config, liburing-dev (plus a C compiler,
#                  make and cmake, which are not checked here)
#   test           the test suite (make test): cmocka; clang and its
#                  sanitizer runtimes for the ASan+UBSan build; python3
#                  (test_trace runs tools/weft-trace)
#   demo           make demo: g++ and Asio for the peer programs it compares
#                  weft with
#   bench          the above, libuv (peer), and what bench/net drives:
#                  wrk, nginx, haproxy
#   report         everything: bench, matplotlib for Debian's python3
#                  (tools/bench-report's plots) and valgrind
#                  (bench/net_instr counts instructions with callgrind)
# Silent when nothing is missing. As root it installs what is missing (the
# apt-get output goes to a log file, shown if the install fails);
# otherwise it prints the command to run and fails.
set -eu

LIB_PKGS="pkg-config liburing-dev"
# libclang-rt-dev holds clang's sanitizer runtimes: clang only recommends
# it, and recommendations are not installed below.
TEST_PKGS="libcmocka-dev clang libclang-rt-dev python3"
DEMO_PKGS="g++ libasio-dev"
# bench/net: the load generator and two peer servers. bench/net runs its own
# nginx and haproxy on free loopback ports with configs in a temporary
# directory; the system services these packages bring are not wanted.
BENCH_PKGS="libuv1-dev wrk nginx haproxy"
REPORT_PKGS="python3 python3-matplotlib valgrind"

case "${1-lib}" in
"" | lib) PKGS=$LIB_PKGS ;;
test) PKGS="$LIB_PKGS $TEST_PKGS" ;;
demo) PKGS="$LIB_PKGS $DEMO_PKGS" ;;
bench) PKGS="$LIB_PKGS $TEST_PKGS $DEMO_PKGS $BENCH_PKGS" ;;
report) PKGS="$LIB_PKGS $TEST_PKGS $DEMO_PKGS $BENCH_PKGS $REPORT_PKGS" ;;
*)
  echo "usage: sh tools/deps.sh [lib|test|demo|bench|report]" >&2
  exit 2
  ;;
esac

missing=""
for p in $PKGS; do
  st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null) || st=""
  [ "$st" = installed ] && continue
  # pkgconf also provides the pkg-config command.
  [ "$p" = pkg-config ] && command -v pkg-config >/dev/null 2>&1 && continue
  # Any package that gives /usr/sbin/nginx will do.
  [ "$p" = nginx ] && [ -x /usr/sbin/nginx ] && continue
  missing="$missing $p"
done
[ -n "$missing" ] || exit 0
missing=${missing# }

if [ "$(id -u)" -ne 0 ]; then
  echo "weft: missing Debian packages: $missing" >&2
  echo "Install them with:" >&2
  echo "  sudo apt-get install -y $missing" >&2
  case " $missing " in
  *" nginx "* | *" haproxy "*)
    echo "then stop and disable the nginx/haproxy system services they" \
      "start (bench/net runs its own): sudo systemctl disable --now nginx" \
      "haproxy" >&2
    ;;
  esac
  exit 1
fi
echo "weft: installing missing Debian packages: $missing" >&2

# Services whose packages are about to be installed: Debian starts them (nginx
# on port 80) and enables them at boot. They must not start: a policy-rc.d
# that refuses every start is put in place for the install when there is
# none, and they are disabled afterwards.
services=""
for p in $missing; do
  case $p in
  nginx) services="$services nginx" ;;
  haproxy) services="$services haproxy" ;;
  esac
done
policy=""
if [ -n "$services" ] && [ ! -e /usr/sbin/policy-rc.d ]; then
  policy=/usr/sbin/policy-rc.d
  trap 'rm -f "$policy"' EXIT
  trap 'exit 1' INT TERM
  printf '#!/bin/sh\n# weft tools/deps.sh: no service starts during install\n%s\n' \
    'exit 101' >"$policy"
  chmod 755 "$policy"
fi

log=$(mktemp "${TMPDIR:-/tmp}/weft-deps.XXXXXX")
# shellcheck disable=SC2086 # one argument per package
if ! { apt-get update &&
  DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
    $missing; } >"$log" 2>&1; then
  cat "$log" >&2
  echo "weft: installing $missing failed (log: $log)" >&2
  exit 1
fi
echo "weft: installed $missing (log: $log)" >&2

if [ -n "$policy" ]; then
  rm -f "$policy"
  trap - EXIT INT TERM
fi
for s in $services; do
  if [ -d /run/systemd/system ]; then
    systemctl disable --now "$s" >/dev/null 2>&1 || true
  else
    if command -v systemctl >/dev/null 2>&1; then
      systemctl disable "$s" >/dev/null 2>&1 || true
    fi
    update-rc.d "$s" disable >/dev/null 2>&1 || true
    # A start that got through (no policy-rc.d refused it).
    if [ -x "/etc/init.d/$s" ]; then
      "/etc/init.d/$s" stop >/dev/null 2>&1 || true
    fi
  fi
  echo "weft: the $s system service is disabled (bench/net runs its own)" >&2
done
