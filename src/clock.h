/*
 * clock.h - the runtime's one clock: CLOCK_MONOTONIC in nanoseconds, read
 * through the vDSO. Timers, the monitor, parking and the backends'
 * timeouts all count in it, and so does weft_now_ns.
 */
#ifndef WEFT_CLOCK_H
#define WEFT_CLOCK_H

#include <stdint.h>
#include <time.h>

static inline uint64_t weft__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static inline struct timespec weft__timespec(uint64_t ns) {
  struct timespec ts = {.tv_sec = (time_t)(ns / 1000000000u),
                        .tv_nsec = (long)(ns % 1000000000u)};
  return ts;
}

#endif
