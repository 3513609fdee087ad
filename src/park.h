/*
 * park.h, park.c - how idle threads search, sleep and are woken; starting
 * a shard's thread the first time it is needed; and the moment a shutdown
 * has finished. park.c has the no-lost-wakeup argument.
 */
#ifndef WEFT_PARK_H
#define WEFT_PARK_H

#include "core.h"

#include <pthread.h>

/* idle.state packs (unparked << 32) | searching; see park.c. */
struct weft__idle {
  _Atomic uint64_t state WEFT_ALIGNED;
  pthread_mutex_t lock; /* guards sleepers[] */
  unsigned nsleepers;
  struct weft__thread **sleepers;
  /* Once done: sleepers[0..done_n) are the threads to wake, claimed by
   * index (park.c, wake_done_share). */
  unsigned done_n;
  _Atomic unsigned done_next;
};

void weft__idle_init(struct weft__idle *idle, unsigned nthreads);
int weft__idle_alloc(struct weft__idle *idle, unsigned nthreads);
void weft__idle_destroy(struct weft__idle *idle);

/* After work was published (a run-queue push, an inject push): wakes a
 * sleeper if no thread searches and not every thread runs. */
void weft__notify_parked(weft_rt *rt);
/* Wakes one started sleeper to recheck whether the shutdown has finished
 * (weft__busy_drop, rt.c). */
void weft__poke(weft_rt *rt);
/* A timer made shard sh's earliest deadline earlier: wake its thread. */
void weft__kick(struct weft__shard *sh, uint64_t deadline);

/* A thread without work becomes a searcher if fewer than half search. */
bool weft__to_searching(weft_rt *rt, struct weft__thread *t);
/* A searcher found work; the last one hands the search on if needed. */
void weft__from_searching(weft_rt *rt, struct weft__thread *t);
/* Parks t until woken; returns false when the runtime is done. */
bool weft__park(weft_rt *rt, struct weft__thread *t);
/* The first step of a lazily started thread: what its park would have
 * done after its sleep. False: the runtime is done. */
bool weft__park_resume(weft_rt *rt, struct weft__thread *t);

/* Puts the dormant threads (shards neager..nshards) in the sleepers, as
 * if parked; before any thread starts. */
void weft__idle_add_dormant(weft_rt *rt);
/* Starts every dormant thread: the first socket needs them all, since
 * every shard serves sockets. -EAGAIN if one could not be started (the
 * next call tries again). */
int weft__start_dormant_all(weft_rt *rt);

/* Whether shutdown has finished may be decided only while every thread is
 * parked: a thread that stops counting itself (weft__busy_drop) asks
 * again. The shutdown's own first check is the caller's poke. */

#endif
