/*
 * timer.h, timer.c - timers: a hierarchical timing wheel per shard,
 * arming, cancelling, firing, settling after a handler, and the timers'
 * part of shutdown. timer_serve.c decides which thread serves which wheel
 * when.
 *
 * A wheel has 6 levels of 64 slots; a level-0 slot is one tick of 2^10 ns,
 * each level 64 times the one below, about 19.5 hours in all (further
 * deadlines are parked in the last level and cascade again). Slots are
 * circular doubly-linked lists through the timers. All of a shard's wheel
 * and the state of the timers homed there are guarded by the shard's
 * timer lock, held only for a
 * few pointer operations, never across a handler; any thread may take it,
 * so a thread other than the shard's may serve its expired timers.
 */
#ifndef WEFT_TIMER_H
#define WEFT_TIMER_H

#include "core.h"
#include "lock.h"

#define WEFT_WHEEL_LEVELS 6
#define WEFT_WHEEL_SLOTS 64
#define WEFT_TICK_SHIFT 10

struct weft__tlist {
  struct weft__tlist *next, *prev;
};

struct weft__wheel {
  uint64_t elapsed; /* ticks: every deadline before it has been handled */
  uint64_t occupied[WEFT_WHEEL_LEVELS];
  struct weft__tlist slot[WEFT_WHEEL_LEVELS][WEFT_WHEEL_SLOTS];
  uint64_t count;
};

/* A shard's timers. next: the wheel's next deadline (ns, UINT64_MAX:
 * none), readable without the lock; never later than the wheel's next due
 * slot (timer.c, publish_next). Each on a line of its own: other threads
 * read next and take the lock, and neither should take the other's line
 * with it (shard.h). */
struct weft__timers {
  _Atomic uint64_t next WEFT_ALIGNED;
  weft__lock_t lock WEFT_ALIGNED;
  struct weft__wheel wheel;
};

enum { WEFT_T_IDLE = 0, WEFT_T_ARMED = 1, WEFT_T_FIRED = 2 };

/* 64 bytes. All fields but `owner` are guarded by the home shard's lock. */
struct weft_timer {
  union {
    struct weft__tlist link; /* ARMED: its wheel slot's list */
    void *firing; /* FIRED: its latest firing until that settles, or NULL */
  };
  uint64_t deadline; /* ns */
  uint64_t period;   /* ns, 0: one-shot */
  weft_timer_fn fn;
  void *arg;
  /* its strand, or its home shard | WEFT_T_NOSTRAND; | WEFT_T_DESTROYED
   * once weft_timer_destroy ran. Set at create, the destroyed bit under
   * the lock; atomic since the pointer is read without the lock. */
  _Atomic uintptr_t owner;
  /* state: WEFT_T_*; where: level * 64 + slot while ARMED; inflight: firings
   * queued or running; missed: reported to the next firing. */
  uint64_t state : 2, where : 9, inflight : 16, missed : 32;
};

/* owner's low bits: strands and shards are aligned to at least 8 bytes */
#define WEFT_T_NOSTRAND ((uintptr_t)1)
#define WEFT_T_DESTROYED ((uintptr_t)2)
#define WEFT_T_OWNER_BITS ((uintptr_t)3)

void weft__timers_init(struct weft__timers *tm, uint64_t now_ns);
/* Fires the timers of shard `home` due at now_ns, posting their handlers
 * from the calling thread's shard `local`. Returns false if another thread
 * was serving home (trylock), true once served. */
bool weft__timers_fire_due(struct weft__shard *home, struct weft__shard *local,
                           uint64_t now_ns);
/* At shutdown: every armed timer's handler is queued with -ECANCELED. */
void weft__timers_flush(weft_rt *rt);
/* The shard whose wheel t is on, for life (shard.h, "Homes"). */
struct weft__shard *weft__timer_home(const struct weft_timer *t);

#endif
