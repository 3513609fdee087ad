/*
 * lock.c - weft__lock's contended path: a bounded spin, then a sleep on
 * the lock word's futex (lock.h has the protocol's argument). Owns nothing.
 */
#include "lock.h"

#include "clock.h"
#include "futex.h"

/* How long a contended take spins before it sleeps: about what a sleep
 * costs the sleeper (a futex wakeup takes 15-50 us on a VM, weft.h's
 * timer_spin_ns), so that a wait costs at most about twice the better of
 * spinning and sleeping. Nearly all contended takes of a busy wheel end
 * within 2 us; a spin of a few hundred nanoseconds instead sent many of
 * them to sleep, and those sleeps then ended late. */
#define LOCK_SPIN_NS 20000u

/* The clock is read once per 32 pauses: a pause takes 3-140 cycles by CPU
 * model. The model build (atomics.h) reads its virtual clock at every
 * pause, so that its cases choose how many pauses a spin lasts. */
#ifdef WEFT_MODEL
#define LOCK_CLOCK_MASK 0u
#else
#define LOCK_CLOCK_MASK 31u
#endif

void weft__lock_slow(weft__lock_t *l) {
  uint64_t until = weft__now_ns() + LOCK_SPIN_NS;
  for (unsigned i = 1;; i++) {
    weft__cpu_relax();
    if (weft__load(&l->word, WA_RLX) == 0 && weft__trylock(l))
      return;
    if (!(i & LOCK_CLOCK_MASK) && weft__now_ns() >= until)
      break;
  }
  while (weft__xchg(&l->word, 2, WA_ACQ) != 0)
    weft__futex_wait(&l->word, 2);
}

void weft__lock_wake(weft__lock_t *l) { weft__futex_wake(&l->word, 1); }
