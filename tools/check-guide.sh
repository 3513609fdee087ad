#!/bin/sh
# check-guide.sh GUIDE CC INCLUDE_DIR: compiles every ```c block of GUIDE
# on its own (each block is a complete translation unit, as a reader would
# copy it), with the project's warnings as errors. Errors point at the
# guide's own lines (#line). Exit 0 when every block compiles; 1 and the
# compiler's messages otherwise.
set -eu
guide=$1
cc=$2
inc=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
awk -v dir="$tmp" -v src="$guide" '
  /^```c[ \t]*$/ {
    n++
    f = sprintf("%s/block%02d.c", dir, n)
    printf "#line %d \"%s\"\n", NR + 1, src > f
    inblk = 1
    next
  }
  /^```[ \t]*$/ && inblk { inblk = 0; close(f); next }
  inblk { print > f }
  END { if (inblk) { print src ": a ```c block is not closed" > "/dev/stderr"; exit 1 } }
' "$guide"
n=0
fail=0
for f in "$tmp"/block*.c; do
  [ -e "$f" ] || { echo "$guide: no \`\`\`c block"; exit 1; }
  n=$((n + 1))
  if ! "$cc" -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror \
      -Wno-unused-function -I"$inc" -c "$f" -o "$f.o" 2>"$f.err"; then
    cat "$f.err"
    fail=$((fail + 1))
  fi
done
if [ "$fail" -ne 0 ]; then
  echo "$guide: $fail of $n code blocks do not compile"
  exit 1
fi
echo "$guide: all $n code blocks compile"
