/*
 * hist.h, hist.c - latency histograms: log-linear buckets of nanoseconds
 * (eight to each power of two above 16 ns, so a bucket is at most an
 * eighth of its values wide), the tick counter's scale to nanoseconds,
 * and reading them (weft_rt_histogram). Each shard keeps its own,
 * written by the thread holding it; what no shard holds (the blocking
 * pool's queue wait, a handler bypassed by a handoff) goes to the
 * runtime's, written with atomic adds.
 */
#ifndef WEFT_HIST_H
#define WEFT_HIST_H

#include "core.h"

struct weft__hist {
  _Atomic uint64_t count, sum, max;
  _Atomic uint64_t b[WEFT_HISTOGRAM_BUCKETS];
};

/* The bucket of v ns: v itself below 16, then 8 per power of two. */
static inline unsigned weft__hist_bucket(uint64_t v) {
  if (v < 16)
    return (unsigned)v;
  unsigned e = 63u - (unsigned)__builtin_clzll(v);
  unsigned i = 16 + (e - 4) * 8 + (unsigned)((v >> (e - 3)) & 7);
  return i < WEFT_HISTOGRAM_BUCKETS ? i : WEFT_HISTOGRAM_BUCKETS - 1;
}

/* One in this many is measured where measuring every one would cost a
 * hot path a tick read or a histogram's cache lines each (strand.c): a
 * strand's scheduling delay, and a turn's run time. */
#define WEFT_HIST_SAMPLE 16u

/* By the one thread that writes h (the holder of its shard): plain
 * read-modify-writes of atomics, so readers on other threads see each
 * word whole. A shard changes holder only through the handoff protocol
 * (monitor.c), which orders the old holder's writes before the new one's. */
static inline void weft__hist_add(struct weft__hist *h, uint64_t v) {
  unsigned i = weft__hist_bucket(v);
  weft__store(&h->b[i], weft__load(&h->b[i], WA_RLX) + 1, WA_RLX);
  weft__store(&h->count, weft__load(&h->count, WA_RLX) + 1, WA_RLX);
  weft__store(&h->sum, weft__load(&h->sum, WA_RLX) + v, WA_RLX);
  if (v > weft__load(&h->max, WA_RLX))
    weft__store(&h->max, v, WA_RLX);
}

/* By any thread. */
void weft__hist_add_shared(struct weft__hist *h, uint64_t v);

/* Ticks (trace.h, weft__ticks) to ns: ns = ticks * mult >> 32, mult
 * measured once per process (weft__hist_calibrate). */
extern uint64_t weft__tick_mult;
static inline uint64_t weft__ticks_ns(uint64_t ticks) {
  return (uint64_t)(((unsigned __int128)ticks * weft__tick_mult) >> 32);
}
/* The span from a to b in ns, 0 if b is before a (counters of two CPUs
 * a few ticks apart). */
static inline uint64_t weft__span_ns(uint64_t a, uint64_t b) {
  return b > a ? weft__ticks_ns(b - a) : 0;
}
/* Times the tick counter against the clock, once per process (200 us on
 * the first call; weft_rt_create makes it). */
void weft__hist_calibrate(void);

#endif
