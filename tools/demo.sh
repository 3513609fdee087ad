#!/bin/sh
# demo.sh [BUILD_DIR]: the failures weft exists to avoid, each run now on
# this machine beside the runtime that fails it, in about a minute; one line
# per case. `make demo` builds BUILD_DIR (default build) with the examples,
# the benchmarks and their Asio peers, then runs this.
#
#  1. A sleeping handler on Asio's legacy strands: io_context::strand shares
#     193 implementations, so one sleeper stalls unrelated strands
#     (examples/seed_strand, the Asio test case ported).
#  2. Every worker asleep in a handler while a timer and an echo connection
#     must keep their pace (examples/blocked_workers; its Asio peer has no
#     monitor to hand work to a spare thread).
#  3. The first timer of a fresh process: Glommio's lazily registered
#     membarrier made its first sleep 30-60 ms late (bench/first_timer).
#  4. 64 threads started on a small machine: HAProxy's threads spun while
#     they started (bench/startup).
#  5. A storm of short connections: HAProxy's fd locks livelocked its
#     multi-threaded accept (examples/accept_storm).
#
# Every figure comes from this run. Where a peer was not built the line says
# so and how to get it. The programs' error output goes to
# BUILD_DIR/demo.log, shown for a case that fails. Exit status: 0, or 1 if
# any case failed.
set -eu

build=${1:-build}
if [ ! -x "$build/examples/seed_strand" ] || [ ! -x "$build/bench/startup" ]
then
  echo "demo.sh: $build/ has no examples or benchmarks: run make demo" >&2
  exit 2
fi
cpus=$(nproc)
log=$build/demo.log
: >"$log"
failed=0
no_asio="not built: sh tools/deps.sh demo"

# run NAME CMD...: CMD's stdout (a JSON line last) into $out, its stderr
# appended to the log. On failure: a line for the case with CMD's errors,
# and $out empty.
err=$build/demo.err
run() {
  name=$1
  shift
  echo "== $name: $*" >>"$log"
  status=0
  out=$("$@" 2>"$err") || status=$?
  cat "$err" >>"$log"
  if [ "$status" = 0 ]; then
    out=$(printf '%s\n' "$out" | tail -n 1)
    return 0
  fi
  echo "$name: FAILED: $* exited with status $status; its errors:"
  sed 's/^/  /' "$err"
  failed=1
  out=""
  return 1
}

# val JSON KEY: the value of "KEY" in the one-line JSON object (a number or
# a string without quotes), or nothing.
val() {
  printf '%s\n' "$1" | sed -n "s/.*\"$2\":\"\{0,1\}\([^,\"}]*\).*/\1/p"
}

# peer_run NAME PEER ARGS...: runs the peer program PEER like run, with
# its JSON line in $a, or $a empty and $a_note saying why.
peer_run() {
  a="" a_note=$no_asio
  [ -x "$2" ] || return 0
  a_note="Asio: failed (above)"
  if run "$@"; then
    a=$out
  fi
}

# The columns of every line; awk prints the rows with the same format.
fmt='%-27s %-40s %-44s %s\n'
echo "weft demo: the failures weft exists to avoid, measured now on this" \
  "machine ($cpus CPUs, Linux $(uname -r))."
echo "Each case runs the same work on weft and on Asio, one line each:"
# shellcheck disable=SC2059 # the format is ours
printf "$fmt" "case" "weft" "Asio, the same work" "=> what it shows"

# ---- 1. a sleeping handler, Asio's legacy strands ----------------------
# 8 threads run 8 chains of handlers, every handler on a new strand; one
# more strand has a handler that sleeps through the run. weft's figures are
# medians of 3 runs each way (single runs swing on a small machine).
if run "1. one handler asleep" "$build/examples/seed_strand" --threads 8 \
  --seconds 1 --rounds 3 --blocking 1; then
  awk -v fmt="$fmt" -v w="$(val "$out" handlers_per_sec)" \
    -v wr="$(val "$out" blocked_ratio)" \
    -v lr="$(val "$out" asio_legacy_blocked_ratio)" \
    -v sr="$(val "$out" asio_strand_blocked_ratio)" \
    -v no_asio="$no_asio" 'BEGIN {
    weft = sprintf("%.2fM handlers/s, %.2fx unblocked", w / 1e6, wr)
    if (lr == "")
      asio = no_asio
    else
      asio = sprintf("io_context::strand %.4fx (strand<> %.2fx)", lr, sr)
    if (wr < 0.5)
      shows = "weft lost over half its rate to the sleeper this run"
    else if (lr != "" && lr < 0.1)
      shows = "it stalls the strands that share its implementation " \
        "(193 for all); weft'\''s share nothing"
    else if (lr != "")
      shows = "the legacy strands were not stalled this run"
    else
      shows = "unrelated strands keep their pace"
    printf fmt, "1. one handler asleep", weft, asio, shows
  }'
fi

# ---- 2. every worker asleep: timer and echo ----------------------------
# As many sleeping handlers as workers (threads); meanwhile a 10 ms timer
# ticks and a client thread does echo round trips.
bw="--threads $cpus --seconds 2 --period-ms 10"
# shellcheck disable=SC2086 # the options are words
if run "2. all workers asleep" "$build/examples/blocked_workers" $bw; then
  w=$out
  # shellcheck disable=SC2086
  peer_run "2. all workers asleep" \
    "$build/examples/peers/asio_blocked_workers" $bw
  awk -v fmt="$fmt" -v n="$(val "$w" threads)" -v s="$(val "$w" seconds)" \
    -v p="$(val "$w" period_ms)" -v due="$(val "$w" ticks_due)" \
    -v wt="$(val "$w" ticks)" -v wg="$(val "$w" longest_gap_ms)" \
    -v we="$(val "$w" echoes)" -v wh="$(val "$w" handoffs)" \
    -v at="$(val "$a" ticks)" -v ag="$(val "$a" longest_gap_ms)" \
    -v ae="$(val "$a" echoes)" -v no_asio="$a_note" 'BEGIN {
    weft = sprintf("ticks %d/%d (gap %.0f ms), %d echoes", wt, due, wg, we)
    if (at == "")
      asio = no_asio
    else
      asio = sprintf("ticks %d/%d (gap %.0f ms), %d echoes", at, due, ag, ae)
    if (wt < 0.9 * due || we == 0 || wg >= 10 * p)
      shows = "weft'\''s timer or echo fell behind this run"
    else if (at != "" && at < 0.5 * due)
      shows = sprintf("weft moved the %d stuck shards to spare threads; " \
        "Asio'\''s %d ms timer and echo stopped", wh, p)
    else if (at != "")
      shows = "Asio kept pace too this run"
    else
      shows = sprintf("weft moved the %d stuck shards to spare threads", wh)
    printf fmt, sprintf("2. all %d workers asleep %gs", n, s), weft, asio, \
      shows
  }'
fi

# ---- 3. the first timer of a fresh process ------------------------------
if run "3. first timer" "$build/bench/first_timer" --runs 10 --ms 5; then
  awk -v fmt="$fmt" -v wm="$(val "$out" late_median_us)" \
    -v wx="$(val "$out" late_max_us)" -v fm="$(val "$out" floor_median_us)" \
    -v am="$(val "$out" asio_late_median_us)" \
    -v ax="$(val "$out" asio_late_max_us)" -v no_asio="$no_asio" 'BEGIN {
    weft = sprintf("%.3f ms late (max %.3f ms)", wm / 1e3, wx / 1e3)
    if (am == "")
      asio = no_asio
    else
      asio = sprintf("%.3f ms late (max %.3f ms)", am / 1e3, ax / 1e3)
    # A one-time cost would show as lateness beyond what the kernel adds.
    if (wm - fm < 100 && wx < 5000)
      shows = "no one-time cost waits for it (Glommio'\''s was 30-60 ms " \
        "late)"
    else
      shows = sprintf("weft'\''s first timer was later than the kernel " \
        "alone (%.3f ms) this run", fm / 1e3)
    printf fmt, "3. first 5 ms timer (x10)", weft, asio, shows
  }'
fi

# ---- 4. 64 threads on a small machine -----------------------------------
# A runtime's whole life: its threads started, one handler, shutdown. weft
# with every thread started at create (as Asio's are); the CPU it takes
# against bare threads' shows whether anybody spins.
if run "4. 64 threads" "$build/bench/startup" --threads 64 --repeat 10 \
  --rounds 3; then
  awk -v fmt="$fmt" -v cpus="$cpus" -v wm="$(val "$out" eager_ms_per_cycle)" \
    -v wc="$(val "$out" eager_cpu_ms_per_cycle)" \
    -v fc="$(val "$out" floor_cpu_ms_per_cycle)" \
    -v am="$(val "$out" asio_ms_per_cycle)" \
    -v ac="$(val "$out" asio_cpu_ms_per_cycle)" -v no_asio="$no_asio" 'BEGIN {
    weft = sprintf("%.2f ms, %.1fx bare threads'\'' CPU", wm, wc / fc)
    if (am == "")
      asio = no_asio
    else
      asio = sprintf("%.2f ms, %.1fx bare threads'\'' CPU", am, ac / fc)
    if (wc < 2 * fc)
      shows = "waiting threads sleep, none spins (HAProxy'\''s spun)"
    else
      shows = "weft took over 2x the CPU of bare threads this run"
    where = cpus < 64 ? sprintf(" on %d CPUs", cpus) : ""
    printf fmt, "4. 64 threads" where, weft, asio, shows
  }'
fi

# ---- 5. a storm of short connections -------------------------------------
# Client threads connect, read the reply to EOF and close, over and over.
st="--threads $cpus --clients 4 --seconds 2"
# shellcheck disable=SC2086
if run "5. storm" "$build/examples/accept_storm" $st; then
  w=$out
  # shellcheck disable=SC2086
  peer_run "5. storm" "$build/examples/peers/asio_accept_storm" $st
  awk -v fmt="$fmt" -v k="$(val "$w" clients)" \
    -v wr="$(val "$w" conns_per_sec)" -v wok="$(val "$w" answered)" \
    -v wf="$(val "$w" failed)" -v wa="$(val "$w" server_accepted)" \
    -v ws="$(val "$w" server_answered)" \
    -v ar="$(val "$a" conns_per_sec)" -v aok="$(val "$a" answered)" \
    -v af="$(val "$a" failed)" -v no_asio="$a_note" 'BEGIN {
    weft = sprintf("%d conn/s, %d/%d answered", wr, wok, wok + wf)
    if (ar == "")
      asio = no_asio
    else
      asio = sprintf("%d conn/s, %d/%d answered", ar, aok, aok + af)
    if (wf == 0 && wok == wa && wa == ws)
      shows = "every one accepted and answered (HAProxy'\''s accept " \
        "livelocked)"
    else
      shows = "weft lost or failed connections this run"
    printf fmt, sprintf("5. storm of %d clients", k), weft, asio, shows
  }'
fi

rm -f "$err"
exit $failed
