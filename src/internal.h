/*
 * internal.h - the runtime's internal types and the functions the parts of
 * src/ call in each other. Nothing here is visible outside the library.
 *
 * Ownership in one paragraph: a runtime owns its shards, its threads and
 * every pooled object (strands, handler nodes). A shard is owned by at most
 * one thread at a time (shard->owner); only that thread pushes to or pops
 * from the shard's run queue by the owner's path and only it touches the
 * shard's pool caches. Other threads only steal from the run queue (CAS on
 * its head) and read its counters.
 */
#ifndef WEFT_INTERNAL_H
#define WEFT_INTERNAL_H

#include "atomics.h"
#include "weft.h"

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define WEFT_CACHELINE 64
#define WEFT_ALIGNED __attribute__((aligned(WEFT_CACHELINE)))

/* ---- run-queue items ----------------------------------------------------
 * An item is a tagged pointer: a strand (tag 0) or a handler node posted with
 * weft_post_rt (tag 1). Both start with a link word, so the inject queue can
 * chain either. A link word holds the next item, tagged. */
typedef uintptr_t weft__item;
#define WEFT_ITEM_NODE ((uintptr_t)1)

struct weft__link {
  _Atomic uintptr_t next;
};

/* A handler node: 32 bytes. In a strand's queue `link.next` holds the next
 * node (untagged); in the inject queue it holds the next item (tagged). */
struct weft__node {
  struct weft__link link;
  weft_fn fn;
  weft_fn cancel;
  void *arg;
};

#define WEFT_STRAND_MAGIC 0x57465354u /* "WFST" */
#define WEFT_STRAND_DEAD 0x44454144u  /* "DEAD" */

/* A strand. Its queue is an intrusive MPSC list whose tail word is also its
 * state (strand.c has the argument):
 *   tail == 0          idle: no pending handler, not scheduled
 *   tail == node       busy: scheduled or running; node is the newest
 *   tail == node | 1   busy and released: reclaim when drained */
struct weft_strand {
  struct weft__link qlink; /* inject-queue link; must stay first */
  _Atomic uintptr_t tail;  /* see above; pushers exchange it */
  struct weft__node *head; /* drainer only: next node to run */
  struct weft__node *ran;  /* drainer only: ran, successor unlinked */
  weft_rt *rt;
  _Atomic uint32_t released; /* set by weft_strand_release */
  uint32_t magic;
  bool self_released; /* drainer only: released from its own handler */
};

/* ---- object pools (pool.c) ----------------------------------------------
 * Fixed-size objects carved from slabs that live as long as the runtime.
 * A shard keeps a private cache (owner only, no atomics); caches trade
 * batches with the runtime-wide depot under a mutex, so steady-state
 * alloc/free touches nothing shared. Threads outside the runtime use the
 * depot directly. */
struct weft__freeobj {
  struct weft__freeobj *next;
  struct weft__freeobj *batch_next; /* depot: next batch (first obj only) */
};

struct weft__pool_cache {
  struct weft__freeobj *head;
  uint32_t count;
};

struct weft__pool {
  pthread_mutex_t lock;
  size_t objsize;
  struct weft__freeobj *batches; /* full batches of WEFT_POOL_BATCH */
  struct weft__pool_cache loose; /* for threads outside the runtime */
  struct weft__slab *slabs;
  char *bump, *bump_end; /* uncarved rest of the newest slab */
};

#define WEFT_POOL_BATCH 64

int weft__pool_init(struct weft__pool *p, size_t objsize);
void weft__pool_destroy(struct weft__pool *p);
/* cache may be NULL (caller outside the runtime). NULL on ENOMEM. */
void *weft__pool_alloc(struct weft__pool *p, struct weft__pool_cache *cache);
void weft__pool_free(struct weft__pool *p, struct weft__pool_cache *cache,
                     void *obj);

/* ---- run queues (runq.c) ------------------------------------------------- */
#define WEFT_RUNQ_CAP 256 /* power of two */

/* A bounded ring: the owner pushes at the tail and pops at the head,
 * thieves take half from the head; head moves only by CAS. */
struct weft__runq {
  _Atomic uint64_t head WEFT_ALIGNED;
  _Atomic uint64_t tail WEFT_ALIGNED;
  _Atomic uintptr_t slot[WEFT_RUNQ_CAP] WEFT_ALIGNED;
};

/* The runtime-wide queue for items posted from outside and for overflow:
 * producers never wait (one exchange), one consumer at a time by trylock,
 * and others skip it rather than wait. len counts pushed items, maybe late:
 * it is only a hint, see the park protocol in park.c. */
struct weft__inject {
  _Atomic uintptr_t tail WEFT_ALIGNED;
  _Atomic int64_t len;
  uintptr_t head WEFT_ALIGNED; /* consumer only */
  struct weft__link stub;
  pthread_mutex_t lock;
};

void weft__runq_init(struct weft__runq *q);
uint32_t weft__runq_len(struct weft__runq *q);
/* Owner: push; false when full. */
bool weft__runq_push(struct weft__runq *q, weft__item it);
/* Owner: pop; 0 when empty. */
weft__item weft__runq_pop(struct weft__runq *q);
/* Owner: claim up to n items from the head into out[]; returns how many. */
uint32_t weft__runq_grab(struct weft__runq *q, weft__item *out, uint32_t n);
/* Thief: move half of victim's items into dst (which the thief owns and
 * which must be empty); returns one of them to run, or 0. */
weft__item weft__runq_steal(struct weft__runq *victim, struct weft__runq *dst,
                            uint32_t *stolen);

void weft__inject_init(struct weft__inject *q);
void weft__inject_destroy(struct weft__inject *q);
/* Push items[0..n) as one chain. Any thread. */
void weft__inject_push(struct weft__inject *q, const weft__item *items,
                       uint32_t n);
/* Take up to max items; 0 taken if empty or another consumer is busy. */
uint32_t weft__inject_take(struct weft__inject *q, weft__item *out,
                           uint32_t max);

struct weft__shard;

/* ---- timers (timer.c) ----------------------------------------------------
 * A hierarchical timing wheel per shard: 6 levels of 64 slots; a level-0
 * slot is one tick of 2^10 ns, each level 64 times the one below, about 19.5
 * hours in all (further deadlines are parked in the last level and cascade
 * again). Slots are circular doubly-linked lists through the timers. All of
 * a shard's wheel and the state of the timers homed there are guarded by the
 * shard's tlock, held only for a few pointer operations, never across a
 * handler; any thread may take it, so a thread other than the shard's may
 * serve its expired timers. */
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

enum { WEFT_T_IDLE = 0, WEFT_T_ARMED = 1, WEFT_T_FIRED = 2 };

/* 64 bytes. Fields below `arg` are guarded by the home shard's tlock. */
struct weft_timer {
  struct weft__tlist link; /* wheel slot list while ARMED */
  uint64_t deadline;       /* ns */
  uint64_t period;         /* ns, 0: one-shot */
  weft_timer_fn fn;
  void *arg;
  /* its strand, or its runtime | 1 for a timer without strand */
  uintptr_t owner;
  /* state: WEFT_T_*; where: level * 64 + slot while ARMED; inflight: firings
   * queued or running; missed: reported to the next firing. */
  uint64_t state : 2, destroyed : 1, where : 9, inflight : 16, missed : 32;
};

static inline weft_strand *weft__timer_strand(const struct weft_timer *t) {
  return (t->owner & 1) ? NULL : (weft_strand *)t->owner;
}
static inline weft_rt *weft__timer_rt(const struct weft_timer *t) {
  return (t->owner & 1) ? (weft_rt *)(t->owner & ~(uintptr_t)1)
                        : ((weft_strand *)t->owner)->rt;
}

void weft__wheel_init(struct weft__wheel *w, uint64_t now_ns);
/* Fires the due timers of shard `home` (trylock: returns if busy), posting
 * their handlers from the calling thread's shard `local`. */
void weft__timers_fire_due(struct weft__shard *home, struct weft__shard *local,
                           uint64_t now_ns);
/* At shutdown: every armed timer's handler is queued with -ECANCELED. */
void weft__timers_flush(weft_rt *rt);
uint64_t weft__now_ns(void);

/* ---- shards, threads, runtime ------------------------------------------- */
struct weft__thread;

struct weft__shard {
  struct weft__runq rq;
  weft_rt *rt;
  unsigned idx;
  _Atomic(struct weft__thread *) owner;
  uint32_t tick;
  uint32_t rng;
  struct weft__pool_cache node_cache;
  struct weft__pool_cache strand_cache;
  struct weft__pool_cache timer_cache;
  /* timers: next deadline (ns, UINT64_MAX: none) readable without tlock */
  _Atomic uint64_t timer_next;
  pthread_mutex_t tlock;
  struct weft__wheel wheel;
  /* counters: written by the owning thread, read by anyone */
  _Atomic uint64_t st_timers_fired;
  _Atomic uint64_t st_handlers_run, st_handlers_cancelled, st_strands_run,
      st_steals, st_parks, st_wakeups, st_injected;
  _Atomic uint64_t st_strands_created, st_strands_freed;
} WEFT_ALIGNED;

struct weft__thread {
  weft_rt *rt;
  struct weft__shard *shard; /* held shard, NULL for a spare */
  pthread_t tid;
  unsigned idx;
  bool searching;
  /* futex word: 0 asleep or running, 1 woken by a notifier (popped from the
   * sleepers), 2 kicked (a timer moved its shard's deadline earlier) */
  _Atomic uint32_t wake;
} WEFT_ALIGNED;

/* idle.state packs (unparked << 32) | searching; see park.c. */
struct weft__idle {
  _Atomic uint64_t state WEFT_ALIGNED;
  pthread_mutex_t lock; /* guards sleepers[] */
  unsigned nsleepers;
  struct weft__thread **sleepers;
};

struct weft_rt {
  unsigned nshards;
  unsigned batch;
  struct weft__shard *shards;
  struct weft__thread *threads;
  struct weft__inject inject;
  struct weft__idle idle;
  struct weft__pool node_pool;
  struct weft__pool strand_pool;
  struct weft__pool timer_pool;
  unsigned timer_slack_ns;

  /* lifecycle; closing and cancelling only go 0 -> 1 */
  _Atomic uint32_t closing WEFT_ALIGNED;
  _Atomic uint32_t cancelling;
  _Atomic uint32_t done;            /* all accepted work finished */
  _Atomic int64_t foreign_inflight; /* posts from outside in progress */
  _Atomic uint64_t foreign_strands_created, foreign_strands_freed;
  _Atomic uint64_t foreign_timers_fired;
  pthread_mutex_t life_lock; /* guards the fields below */
  pthread_cond_t life_cond;
  unsigned started; /* threads that reached their loop */
  bool shutdown_called;
  bool joined;
};

/* The thread-local identity of runtime threads (shard.c). */
struct weft__thread *weft__self(void);
void weft__set_current_strand(weft_strand *s);

/* The calling thread's shard if it is a thread of rt holding one. */
static inline struct weft__shard *weft__local_shard(weft_rt *rt) {
  struct weft__thread *t = weft__self();
  return (t && t->rt == rt) ? t->shard : NULL;
}

/* Scheduling (shard.c). */
void weft__schedule(weft_rt *rt, struct weft__shard *local, weft__item it);
void weft__thread_main_loop(struct weft__thread *t);
void *weft__thread_entry(void *arg);

/* Strands (strand.c). Push without the shutdown check: for work that was
 * already accepted (timer firings). */
void weft__strand_push(weft_strand *s, struct weft__shard *local,
                       struct weft__node *n);
void weft__strand_run(struct weft__shard *sh, weft_strand *s);
void weft__node_run(struct weft__shard *sh, struct weft__node *n);

/* Park protocol (park.c). */
void weft__idle_init(struct weft__idle *idle, unsigned nthreads);
int weft__idle_alloc(struct weft__idle *idle, unsigned nthreads);
void weft__idle_destroy(struct weft__idle *idle);
void weft__notify_parked(weft_rt *rt);
void weft__poke(weft_rt *rt);
bool weft__to_searching(weft_rt *rt, struct weft__thread *t);
void weft__from_searching(weft_rt *rt, struct weft__thread *t);
/* Parks t until woken; returns false when the runtime is done. */
bool weft__park(weft_rt *rt, struct weft__thread *t);
void weft__wake_all_done(weft_rt *rt);
void weft__futex_wait(_Atomic uint32_t *addr, uint32_t expected);
/* Waits until *addr != expected or CLOCK_MONOTONIC reaches deadline_ns. */
void weft__futex_wait_until(_Atomic uint32_t *addr, uint32_t expected,
                            uint64_t deadline_ns);
/* A timer made shard sh's earliest deadline earlier: wake its thread. */
void weft__kick(struct weft__shard *sh);
void weft__futex_wake(_Atomic uint32_t *addr, int n);

/* Posting from outside (rt.c). */
int weft__foreign_enter(weft_rt *rt);
void weft__foreign_exit(weft_rt *rt);

#endif
