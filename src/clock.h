/*
 * clock.h - the runtime's one clock: CLOCK_MONOTONIC in nanoseconds, read
 * through the vDSO. Timers, the monitor, parking and the backends'
 * timeouts all count in it, and so does weft_now_ns. The model build
 * (atomics.h) reads the explorer's virtual clock instead, and the
 * simulation build (WEFT_SIM, sim.h) the simulation's while a simulated
 * runtime exists.
 */
#ifndef WEFT_CLOCK_H
#define WEFT_CLOCK_H

#include <stdint.h>
#include <time.h>

#ifdef WEFT_MODEL
/* tests/model/model.c: virtual time, which moves with the explored steps */
uint64_t weft__model_now_ns(void);
#endif
#ifdef WEFT_SIM
#include <stdatomic.h>
/* sim.c: the virtual clock, and whether it is in use (a simulated runtime
 * exists; at most one does at a time). Written by the thread that drives
 * the simulation, read by any. */
extern _Atomic uint64_t weft__sim_clock;
extern _Atomic uint32_t weft__sim_live;
#endif

static inline uint64_t weft__now_ns(void) {
#ifdef WEFT_MODEL
  return weft__model_now_ns();
#endif
#ifdef WEFT_SIM
  if (atomic_load_explicit(&weft__sim_live, memory_order_acquire))
    return atomic_load_explicit(&weft__sim_clock, memory_order_relaxed);
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
