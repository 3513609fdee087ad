/*
 * shard.h, shard.c - a shard (one scheduling context: run queues, timer
 * wheel, pool caches, I/O backend, counters) and the run loop of the
 * thread that holds it: find an item (its rings, the inject queue, a
 * steal), run it, park when there is none.
 */
#ifndef WEFT_SHARD_H
#define WEFT_SHARD_H

#include "clock.h"
#include "hist.h"
#include "pool.h"
#include "rt.h"
#include "runq.h"
#include "sim.h"
#include "thread.h"
#include "timer.h"

#include <pthread.h>

/* Counters written by the thread holding the shard (the monitor writes
 * stalls and handoffs), read by anyone. */
struct weft__shard_counters {
  _Atomic uint64_t timers_fired WEFT_ALIGNED;
  _Atomic uint64_t stalls, handoffs; /* written by the monitor */
  _Atomic uint64_t handlers_run, handlers_cancelled, strands_run, steals, parks,
      wakeups, injected;
  _Atomic uint64_t strands_created, strands_freed;
  _Atomic uint64_t io_events, io_enters;
};

struct weft__shard {
  struct weft__runq rq;
  /* Timer firings: served before rq, so a timer's handler does not wait
   * behind busy strands' batches. Stolen like rq. */
  struct weft__runq prq;
  /* Lines: what other threads read or take (rt, owner; tm.next; tm.lock
   * and the wheel) never shares one with what the owner writes all the
   * time (the fields below up to quiet), nor the one with the other: a
   * look at a shard's next deadline or a settle under its lock would
   * otherwise take the line of the owner's pool caches with it, and the
   * owner's next allocation would wait for it back. */
  weft_rt *rt;
  unsigned idx;
  _Atomic(struct weft__thread *) owner;
  /* owner only */
  uint32_t tick WEFT_ALIGNED;
  uint32_t peek;      /* the shard timer_serve looks at last */
  uint32_t looks;     /* next_item calls, for its look every 16 */
  uint32_t rng;       /* steal victims */
  uint32_t home_next; /* weft__home_pick: the home of the next object */
  struct {
    struct weft__pool_cache node, strand, timer, conn, send, wstate;
  } cache;
  /* firing a batch of timers, whose pushes notify parked threads once
   * after the timer lock is released instead of once each (timer.c), or
   * polling its backend (io.c, POLL_SHARE_MIN) */
  bool quiet;
  /* a handler asks the strand it runs on to end its turn after it
   * (weft__yield_turn): more of its work is queued behind it */
  bool yield_turn;
  /* a push found the ring empty and woke no one, its poster being next to
   * run it; if that poster is inside a strand's turn that goes on, it
   * wakes one then (shard.c, weft__schedule; strand.c) */
  bool owe_wake;
  /* the thread waited on the clock for a timer (shard.c, spin_to_timer),
   * not in the backend: its next poll asks the backend, busy or not */
  bool spun;
  struct weft__timers tm;
  struct weft__shard_counters st;
  /* NULL: backend NONE, or not set up yet (io.c: weft__io_ensure) */
  _Atomic(struct weft__io *) io;
  /* 1 while the shard's own thread (threads[idx]) is dormant (park.c);
   * here, not in the slot, since spares reuse slots (monitor.c) */
  _Atomic uint32_t thread_dormant;
  /* The memory of the strands and timers homed here. The owner's caches
   * above trade with them under their locks; so do other threads creating
   * or freeing such objects, without a cache (weft__home_pick). */
  struct weft__pool strand_pool WEFT_ALIGNED;
  struct weft__pool timer_pool;
  /* Latency histograms, written by the owner (hist.h). Last: 14 KiB
   * between the owner's hot fields would spread them over more pages. */
  struct weft__hist hist[WEFT_HIST_KINDS] WEFT_ALIGNED;
} WEFT_ALIGNED;

#define WEFT__LINE_OF(f) (offsetof(struct weft__shard, f) / WEFT_CACHELINE)
_Static_assert(WEFT__LINE_OF(owner) < WEFT__LINE_OF(tick) &&
                   WEFT__LINE_OF(quiet) < WEFT__LINE_OF(tm.next) &&
                   WEFT__LINE_OF(tm.next) < WEFT__LINE_OF(tm.lock),
               "a shard's shared fields and its owner's do not share lines");
#undef WEFT__LINE_OF

/* Around every handler a runtime thread runs (shard.c, strand.c). */
static inline void weft__handler_enter(struct weft__thread *t, void *fn,
                                       weft_strand *s) {
  t->epoch++;
  weft__store(&t->cur_fn, fn, WA_RLX);
  weft__store(&t->cur_strand, (void *)s, WA_RLX);
  /* release, before the epoch's hstate: the monitor's acquire loads
   * (monitor.c, known_start). A clock read only while the monitor asks. */
  uint64_t start = weft__load(&t->rt->mon.stamp, WA_RLX) ? weft__now_ns() : 0;
  weft__store(&t->hstart, start, WA_REL);
  t->in_handler = true;
  weft__store(&t->hstate, (t->epoch << 2) | WEFT_HS_IN, WEFT_HS_STORE_MO);
#ifdef WEFT_SIM
  if (t->rt->sim) /* inside the epoch: a drawn stall may be handed off */
    weft__sim_handler(t, fn, s);
#endif
  /* Stamping may have turned on since the flag was read: say so, and the
   * monitor, maybe asleep for 1.4 thresholds already, counts the handler
   * from the switch (monitor.c, stamp_mode, has the argument). */
  atomic_signal_fence(memory_order_seq_cst);
  if (!start && weft__load(&t->rt->mon.stamp, WEFT_STAMP_REREAD_MO))
    weft__store(&t->hstart, WEFT_HSTART_LATE, WA_REL);
}

/* Returns the thread's shard, or NULL if the monitor took it meanwhile. */
static inline struct weft__shard *weft__handler_leave(struct weft__thread *t) {
  t->in_handler = false;
  weft__store(&t->hstate, (t->epoch << 2) | WEFT_HS_OUT, WEFT_HS_STORE_MO);
  atomic_signal_fence(memory_order_seq_cst);
  if (weft__load(&t->taken, WEFT_HS_LOAD_MO))
    weft__lost(t);
  return t->shard;
}

/* Homes. A strand, and a timer without strand, gets a home shard when it
 * is created and keeps it: the shard whose wheel its timers are on, and
 * whose pool its timers' memory comes from, so the timers one shard's
 * thread fires lie together in memory, apart from the others'. Homes are
 * the shards in turn, each creating thread (a worker's own count, or one
 * count for every thread outside) starting from its own shard. Not the
 * creator's shard always: strands made by one handler would then have all
 * their timers on one wheel, served by one thread. A timer of another home
 * than the creator's comes from that home's depot, under its lock. A
 * strand's memory does not follow its home: it is written by whichever
 * thread runs it, so it comes from the creating worker's own cache, no
 * lock taken (weft_strand.pool; from the home's depot when made outside),
 * and goes back to that pool. */
static inline unsigned weft__home_pick(weft_rt *rt, struct weft__shard *local) {
  if (!local)
    return weft__fetch_add(&rt->outside.home_rr, 1, WA_RLX) % rt->nshards;
  unsigned h = local->home_next;
  local->home_next = h + 1 == rt->nshards ? 0 : h + 1;
  return h;
}

/* Queues an item to run: on local's run queue (the caller holds local),
 * or, local NULL, on the inject queue. Wakes a parked thread if the work
 * can go to another. */
void weft__schedule(weft_rt *rt, struct weft__shard *local, weft__item it);
/* The same for a timer firing: to the shard's priority ring. */
void weft__schedule_prio(weft_rt *rt, struct weft__shard *local, weft__item it);
/* The threads' start routine (weft__spawn). */
void *weft__thread_entry(void *arg);
#ifdef WEFT_SIM
/* One turn of t's run loop in a simulation (sim.c), t being the calling
 * thread's self: its next item, or a search, and the item run. */
void weft__shard_step(struct weft__thread *t);
#endif
/* Takes half of a shard's queued work whose owner is not running, into
 * sh's empty rings (timer_serve.c finds such shards). */
void weft__take_from_stuck(struct weft__shard *sh, struct weft__shard *v);

#endif
