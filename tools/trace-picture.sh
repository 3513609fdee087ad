#!/bin/sh
# trace-picture.sh [BUILD_DIR]: regenerates docs/img/trace-stall.png, the
# flight recorder's picture of a stall, from a real run: examples/seed_strand
# of BUILD_DIR (default build, configured with -DWEFT_BUILD_EXAMPLES=ON)
# with one strand whose handler sleeps, and the dump the monitor writes
# after reporting that stall, drawn by tools/weft-trace --plot. Run it from
# the repository's root. Needs matplotlib (Debian: python3-matplotlib) and
# addr2line (binutils). Each run draws a new picture: the times differ.
set -eu

build=${1:-build}
exe=$build/examples/seed_strand
if [ ! -x "$exe" ]; then
  echo "trace-picture.sh: no $exe: build the examples first" >&2
  exit 2
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# Three threads: one sleeps in the blocked strand's handler while the others
# run the chains of strands. The monitor hands the stuck thread's shard to a
# spare and, two stall thresholds later, writes a dump to WEFT_TRACE_DIR:
# the run's first dump (seed_strand then measures without the sleeper).
# A thread this busy writes its ring faster than the dump can copy it, so it
# may keep only its last few hundred events, and a full ring holds about a
# millisecond of its work: up to 5 runs, keeping the first dump that holds
# 2000 events or more of the thread that took the shard, after the handoff,
# and of a third thread.
n=0
while :; do
  n=$((n + 1))
  rm -f "$tmp"/weft-trace-*
  if ! WEFT_TRACE_DIR=$tmp "$exe" --threads 3 --seconds 0.2 --blocking 1 \
    --no-peer >"$tmp/out" 2>"$tmp/err"; then
    cat "$tmp/err" >&2
    exit 1
  fi
  dump=$(ls "$tmp"/weft-trace-*-1.txt 2>/dev/null) || {
    echo "trace-picture.sh: seed_strand wrote no dump" >&2
    exit 1
  }
  # ring ID ROLE SLOT TID; ev T RING TID SHARD TYPE A B. The stuck ring:
  # the last to run the stalled strand.
  awk '$1 == "ring" && $3 == "worker" { ring[$4] = $2 }
       $1 == "ev" { events[$3]++; last[$3] = $2 }
       $1 == "ev" && $6 == "run" { ran[$8] = $3 }
       $1 == "ev" && $6 == "stall" { strand = $8 }
       $1 == "ev" && $6 == "handoff" { handoff = $2; to = ring[$8] }
       END { for (s in ring) {
               r = ring[s]
               if (r != ran[strand] && r != to && events[r] >= 2000)
                 third = 1
             }
             exit !(handoff != "" && last[to] > handoff &&
                    events[to] >= 2000 && third) }' \
    "$dump" && break
  [ $n -lt 5 ] || break
done
echo "trace-picture.sh: run $n's dump"

# The example's handlers are static functions, which the dump can only name
# by object and offset (sym 0xADDR seed_strand+0x51e0): name them with
# addr2line, in a copy, as "blocking_work (seed_strand+0x51e0)".
grep '^sym 0x[0-9a-f]* seed_strand+0x[0-9a-f]*$' "$dump" |
  while read -r _ addr obj; do
    fn=$(addr2line -f -e "$exe" "${obj#seed_strand+}" | head -n 1)
    [ "$fn" = "??" ] || echo "s/^sym $addr $obj\$/sym $addr $fn ($obj)/"
  done >"$tmp/names.sed"
sed -f "$tmp/names.sed" "$dump" >"$tmp/dump.txt"

# python3, or Debian's own where python3 is another one without matplotlib
# (pyenv); weft-trace says what is missing if neither has it.
py=python3
$py -c 'import matplotlib' 2>/dev/null || [ ! -x /usr/bin/python3 ] ||
  py=/usr/bin/python3
$py tools/weft-trace "$tmp/dump.txt" --summary
$py tools/weft-trace "$tmp/dump.txt" --plot docs/img/trace-stall.png
echo "trace-picture.sh: wrote docs/img/trace-stall.png"
