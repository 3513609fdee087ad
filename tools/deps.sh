#!/bin/sh
# deps.sh: makes sure the Debian packages the weft build needs are installed.
# Silent when nothing is missing. As root it installs what is missing;
# otherwise it prints the command to run and fails.
set -eu

# pkg-config, liburing, cmocka (tests), Asio and g++ (Asio peer benchmarks),
# clang (sanitizer build), libuv (peer benchmark). libclang-rt-dev holds
# clang's sanitizer runtimes: clang only recommends it, and recommendations
# are not installed below.
PKGS="pkg-config liburing-dev libcmocka-dev libasio-dev g++ clang
  libclang-rt-dev libuv1-dev"

missing=""
for p in $PKGS; do
  st=$(dpkg-query -W -f='${db:Status-Status}' "$p" 2>/dev/null) || st=""
  [ "$st" = installed ] && continue
  # pkgconf also provides the pkg-config command.
  [ "$p" = pkg-config ] && command -v pkg-config >/dev/null 2>&1 && continue
  missing="$missing $p"
done
[ -n "$missing" ] || exit 0
missing=${missing# }

if [ "$(id -u)" -ne 0 ]; then
  echo "weft: missing Debian packages: $missing" >&2
  echo "Install them with:" >&2
  echo "  sudo apt-get install -y $missing" >&2
  exit 1
fi
echo "weft: installing missing Debian packages: $missing" >&2
apt-get update
# shellcheck disable=SC2086 # one argument per package
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $missing
