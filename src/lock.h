/*
 * lock.h, lock.c - weft__lock, the mutex of short critical sections that
 * several threads take at a high rate: a shard's timer wheel (timer.c). It
 * costs one locked instruction to take and one to release, inline, where a
 * pthread mutex costs two calls; contended, it spins (the holder is on
 * another CPU for a few hundred nanoseconds) for at most about what a
 * futex sleep would cost the waiter, and then sleeps on a futex, so a
 * holder preempted on an oversubscribed machine is not waited for by
 * spinning longer than that (lock.c, LOCK_SPIN_NS).
 *
 * The word: 0 free, 1 held, 2 held and a thread may be asleep on it.
 * Correctness: taking is a CAS 0->1 or an exchange to 2 that reads 0, both
 * acquire; releasing is an exchange to 0, release, so each critical
 * section happens before the next one that takes the word. A sleeper
 * stores 2 (exchange) before it waits; FUTEX_WAIT sleeps only while the
 * word is still 2, so a release that comes between the exchange and the
 * wait reads 2 and wakes one sleeper, or makes the wait return at once.
 * A woken thread takes with 2, not 1: other sleepers may remain, and the
 * cost of a spare wake is one syscall, never a lost one.
 */
#ifndef WEFT_LOCK_H
#define WEFT_LOCK_H

#include "atomics.h"

#include <stdbool.h>

typedef struct {
  _Atomic uint32_t word;
} weft__lock_t;

void weft__lock_slow(weft__lock_t *l);
void weft__lock_wake(weft__lock_t *l);

static inline void weft__lock_init(weft__lock_t *l) {
  weft__store(&l->word, 0, WA_RLX);
}

static inline bool weft__trylock(weft__lock_t *l) {
  uint32_t free_ = 0;
  return weft__cas(&l->word, &free_, 1, WA_ACQ, WA_RLX);
}

static inline void weft__lock(weft__lock_t *l) {
  if (!weft__trylock(l))
    weft__lock_slow(l);
}

static inline void weft__unlock(weft__lock_t *l) {
  if (weft__xchg(&l->word, 0, WA_REL) == 2)
    weft__lock_wake(l);
}

#endif
