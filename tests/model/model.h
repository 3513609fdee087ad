/*
 * model.h, model.c - the schedule explorer of weft's model tests: a case
 * runs a few simulated threads over real weft code compiled with
 * WEFT_MODEL (src/atomics.h), on one OS thread, switching threads only
 * right after an atomic operation, a futex wake or a mutex call, and at
 * spins and futex sleeps. Each run is one interleaving, chosen by a
 * strategy:
 *   random  at every point, any runnable thread (a seeded PRNG);
 *   pct     probabilistic concurrency testing: random thread priorities
 *           and a few random points where the running thread drops to the
 *           lowest, which finds a bug needing d ordered events with
 *           probability at least 1/(n k^(d-1)) per run (k steps, n threads);
 *   dfs     every interleaving with at most B preemptions (a switch away
 *           from a thread that could go on), depth first, as CHESS does.
 * The same strategy and seed (or dfs path) give the same run, step for
 * step: a failure prints the flags that replay it, and --trace prints its
 * steps. Operations are sequentially consistent here: the explorer finds
 * wrong orders of steps (a missing CAS, a publish after a wake, a lost
 * wakeup), not wrong memory orders, which are ThreadSanitizer's part.
 *
 * Mutexes of the code under test (pthread_mutex_lock, _unlock, _trylock,
 * linked to the explorer's by -Wl,--wrap) are choice points too, and a
 * thread that finds one held sleeps until it is unlocked. A thread that
 * made 200 steps in a row while others could run hands the turn on, as a
 * real scheduler would: a loop that retries without a pause (a trylock
 * that failed, a self-wake) waits for another thread.
 *
 * A run fails when a check fails (MODEL_CHECK), when every thread left is
 * asleep on a futex or mutex (a lost wakeup), or when it takes more steps
 * than the case allows (a livelock).
 */
#ifndef WEFT_MODEL_H
#define WEFT_MODEL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define MODEL_MAX_THREADS 6

struct model_case {
  const char *name;
  unsigned nthreads;
  /* Before each run, on the explorer's own stack: reset the shared state. */
  void (*setup)(void);
  /* Simulated thread i runs thread[i](i). */
  void (*thread[MODEL_MAX_THREADS])(int id);
  /* After every thread returned: the end state's checks. */
  void (*check)(void);
  /* Steps per run above which the run is a livelock (0: 20000). */
  uint64_t max_steps;
  /* Virtual nanoseconds a spin (weft__cpu_relax) takes (0: 1000); each
   * other step takes 1. */
  uint64_t spin_ns;
};

/* Fails the run (a thread's or check's), with a printf-style message. */
#define MODEL_CHECK(cond, ...)                                                 \
  do {                                                                         \
    if (!(cond))                                                               \
      model_fail(__FILE__, __LINE__, __VA_ARGS__);                             \
  } while (0)

__attribute__((format(printf, 3, 4))) void
model_fail(const char *file, int line, const char *fmt, ...);

/* Runs the cases under each strategy and returns the exit status.
 * Flags (model.c, usage): --case=NAME, --runs=N, --dfs=B, --seed=S,
 * --replay=STRATEGY:ARG, --trace, --expect-bug. */
int model_main(int argc, char **argv, const struct model_case *cases,
               unsigned ncases);

#endif
