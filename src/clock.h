/*
 * clock.h - the runtime's one clock: CLOCK_MONOTONIC in nanoseconds, read
 * through the vDSO. Timers, the monitor, parking and the backends'
 * timeouts all count in it, and so does weft_now_ns. The model build
 * (atomics.h) reads the explorer's virtual clock instead.
 */
#ifndef WEFT_CLOCK_H
#define WEFT_CLOCK_H

#include <stdint.h>
#include <time.h>

#ifdef WEFT_MODEL
/* tests/model/model.c: virtual time, which moves with the explored steps */
uint64_t weft__model_now_ns(void);
#endif

static inline uint64_t weft__now_ns(void) {
#ifdef WEFT_MODEL
  return weft__model_now_ns();
#endif
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
