#!/bin/sh
# deps.sh: makes sure the Debian packages the weft build needs are installed.
# `sh tools/deps.sh bench` also covers the network benchmark's (bench/net):
# wrk, nginx and haproxy.
# Silent when nothing is missing. As root it installs what is missing;
# otherwise it prints the command to run and fails.
set -eu

# pkg-config, liburing, cmocka (tests), Asio and g++ (Asio peer benchmarks),
# clang (sanitizer build), libuv (peer benchmark). libclang-rt-dev holds
# clang's sanitizer runtimes: clang only recommends it, and recommendations
# are not installed below.
PKGS="pkg-config liburing-dev libcmocka-dev libasio-dev g++ clang
  libclang-rt-dev libuv1-dev"
# bench/net: the load generator and two peer servers. bench/net runs its own
# nginx and haproxy on free loopback ports with configs in a temporary
# directory; the system services these packages bring are not wanted.
BENCH_PKGS="wrk nginx haproxy"

case "${1-}" in
"") ;;
bench) PKGS="$PKGS $BENCH_PKGS" ;;
*)
  echo "usage: sh tools/deps.sh [bench]" >&2
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

apt-get update
# shellcheck disable=SC2086 # one argument per package
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing

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
