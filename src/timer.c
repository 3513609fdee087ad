/*
 * timer.c - timers: the per-shard hierarchical timing wheel, arming,
 * cancelling, firing, and the timers' part of shutdown. Owns every
 * weft_timer and each shard's wheel (struct weft__wheel in internal.h).
 *
 * Home shard: a timer lives in the wheel of the shard its address hashes
 * to, fixed for its life, so all its state is guarded by that shard's tlock
 * (lock order: a tlock is never held while taking another lock except the
 * pool depot's, and never across a handler).
 *
 * Exactly one outcome per arming: an ARMED timer leaves the wheel either by
 * firing (state FIRED, inflight++, its handler queued) or by cancel (state
 * IDLE, cancel returns 0), both under tlock. A firing that is queued is work
 * the runtime accepted: it runs, or at a CANCEL shutdown it reports
 * -ECANCELED, exactly once, like any handler.
 *
 * Wheel: a deadline becomes tick `when` = ceil(ns / 1024), so a timer never
 * fires early. It sits at the level of the highest 6-bit digit in which
 * `when` differs from `elapsed`, in the slot named by that digit of `when`.
 * The next expiration is the first occupied slot of the lowest non-empty
 * level; when its time comes, its timers either fire (their tick has come)
 * or are re-inserted lower down (cascade). Start and cancel are O(1).
 */
#include "internal.h"

#include <errno.h>
#include <stdio.h>
#include <time.h>

#define LEVEL_BITS 6
#define SLOT_MASK ((uint64_t)WEFT_WHEEL_SLOTS - 1)
#define MAX_TICKS ((uint64_t)1 << (LEVEL_BITS * WEFT_WHEEL_LEVELS))
#define FIRE_BATCH 64

uint64_t weft__now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

uint64_t weft_now_ns(void) { return weft__now_ns(); }

static inline uint64_t tick_ceil(uint64_t ns) {
  return (ns >> WEFT_TICK_SHIFT) + ((ns & ((1u << WEFT_TICK_SHIFT) - 1)) != 0);
}

void weft__wheel_init(struct weft__wheel *w, uint64_t now_ns) {
  w->elapsed = now_ns >> WEFT_TICK_SHIFT;
  w->count = 0;
  for (int l = 0; l < WEFT_WHEEL_LEVELS; l++) {
    w->occupied[l] = 0;
    for (int s = 0; s < WEFT_WHEEL_SLOTS; s++)
      w->slot[l][s].next = w->slot[l][s].prev = &w->slot[l][s];
  }
}

static inline struct weft__shard *home_of(weft_timer *t) {
  uintptr_t h = (uintptr_t)t >> 6;
  h ^= h >> 17;
  return &t->rt->shards[h % t->rt->nshards];
}

static unsigned level_for(uint64_t elapsed, uint64_t when) {
  uint64_t masked = (elapsed ^ when) | SLOT_MASK;
  if (masked >= MAX_TICKS)
    masked = MAX_TICKS - 1;
  unsigned significant = 63 - (unsigned)__builtin_clzll(masked);
  return significant / LEVEL_BITS;
}

/* Inserts an ARMED timer whose tick is after w->elapsed. */
static void wheel_insert(struct weft__wheel *w, weft_timer *t) {
  uint64_t when = tick_ceil(t->deadline);
  unsigned level = level_for(w->elapsed, when);
  unsigned slot = (unsigned)((when >> (level * LEVEL_BITS)) & SLOT_MASK);
  struct weft__tlist *head = &w->slot[level][slot];
  t->link.next = head;
  t->link.prev = head->prev;
  head->prev->next = &t->link;
  head->prev = &t->link;
  w->occupied[level] |= (uint64_t)1 << slot;
  t->where = level * WEFT_WHEEL_SLOTS + slot;
  w->count++;
}

static void wheel_remove(struct weft__wheel *w, weft_timer *t) {
  unsigned level = t->where / WEFT_WHEEL_SLOTS;
  unsigned slot = t->where % WEFT_WHEEL_SLOTS;
  t->link.prev->next = t->link.next;
  t->link.next->prev = t->link.prev;
  if (w->slot[level][slot].next == &w->slot[level][slot])
    w->occupied[level] &= ~((uint64_t)1 << slot);
  w->count--;
}

/* The tick at which the next slot is due, and which slot; false if empty. */
static bool next_slot(struct weft__wheel *w, uint64_t *tick, unsigned *level,
                      unsigned *slot) {
  for (unsigned l = 0; l < WEFT_WHEEL_LEVELS; l++) {
    uint64_t occ = w->occupied[l];
    if (!occ)
      continue;
    unsigned shift = l * LEVEL_BITS;
    unsigned now_slot = (unsigned)((w->elapsed >> shift) & SLOT_MASK);
    uint64_t rot = (occ >> now_slot) | (now_slot ? occ << (64 - now_slot) : 0);
    unsigned s = (unsigned)(__builtin_ctzll(rot) + now_slot) & SLOT_MASK;
    uint64_t slot_range = (uint64_t)1 << shift;
    uint64_t level_range = slot_range << LEVEL_BITS;
    uint64_t start = w->elapsed & ~(level_range - 1);
    uint64_t t = start + s * slot_range;
    if (t < (w->elapsed & ~(slot_range - 1)))
      t += level_range; /* the slot is in the next turn of this level */
    if (t < w->elapsed)
      t = w->elapsed; /* the current slot of a higher level */
    *tick = t;
    *level = l;
    *slot = s;
    return true;
  }
  return false;
}

static void publish_next(struct weft__shard *sh) {
  uint64_t tick;
  unsigned l, s;
  uint64_t next = UINT64_MAX;
  if (next_slot(&sh->wheel, &tick, &l, &s))
    next = tick << WEFT_TICK_SHIFT;
  weft__store(&sh->timer_next, next, WA_REL);
}

static void tramp(void *arg);
static void tramp_cancel(void *arg);

/* Queues one firing of t (already FIRED, inflight counted) from `local`. */
static void queue_firing(weft_timer *t, struct weft__shard *local,
                         bool cancel) {
  weft_rt *rt = t->rt;
  struct weft__node *n =
      weft__pool_alloc(&rt->node_pool, local ? &local->node_cache : NULL);
  if (!n) {
    /* Out of memory: the firing is not lost, it is retried in 1 ms. */
    struct weft__shard *home = home_of(t);
    pthread_mutex_lock(&home->tlock);
    t->inflight--;
    if (t->state == WEFT_T_FIRED) {
      t->state = WEFT_T_ARMED;
      t->deadline = weft__now_ns() + 1000000;
      wheel_insert(&home->wheel, t);
      publish_next(home);
    }
    pthread_mutex_unlock(&home->tlock);
    return;
  }
  n->fn = cancel ? tramp_cancel : tramp;
  n->cancel = tramp_cancel;
  n->arg = t;
  weft__store(&n->link.next, 0, WA_RLX);
  if (t->strand)
    weft__strand_push(t->strand, local, n);
  else
    weft__schedule(rt, local, (weft__item)n | WEFT_ITEM_NODE);
}

/* Takes the due timers of home's wheel into out[] as FIRED; lock held. */
static unsigned take_due(struct weft__shard *home, uint64_t now_tick,
                         weft_timer **out, unsigned max) {
  struct weft__wheel *w = &home->wheel;
  unsigned n = 0;
  uint64_t tick;
  unsigned l, s;
  while (n < max && next_slot(w, &tick, &l, &s) && tick <= now_tick) {
    w->elapsed = tick;
    struct weft__tlist *head = &w->slot[l][s];
    while (n < max && head->next != head) {
      weft_timer *t = (weft_timer *)head->next;
      wheel_remove(w, t);
      if (tick_ceil(t->deadline) <= w->elapsed) {
        t->state = WEFT_T_FIRED;
        t->inflight++;
        out[n++] = t;
      } else {
        wheel_insert(w, t); /* cascade to a lower level */
      }
    }
  }
  if (n < max && !w->count && now_tick > w->elapsed)
    w->elapsed = now_tick;
  return n;
}

void weft__timers_fire_due(struct weft__shard *home, struct weft__shard *local,
                           uint64_t now_ns) {
  weft_timer *due[FIRE_BATCH];
  unsigned n;
  do {
    if (pthread_mutex_trylock(&home->tlock) != 0)
      return; /* another thread is serving this wheel */
    n = take_due(home, now_ns >> WEFT_TICK_SHIFT, due, FIRE_BATCH);
    publish_next(home);
    pthread_mutex_unlock(&home->tlock);
    for (unsigned i = 0; i < n; i++)
      queue_firing(due[i], local, false);
    if (local)
      weft__stat_add(&local->st_timers_fired, n);
  } while (n == FIRE_BATCH);
}

/* Wakes the home shard's thread if its deadline moved earlier. */
static void maybe_kick(struct weft__shard *home, uint64_t before) {
  uint64_t now = weft__load(&home->timer_next, WA_RLX);
  struct weft__thread *self = weft__self();
  if (now < before && !(self && self->shard == home))
    weft__kick(home);
}

int weft_timer_create(weft_rt *rt, weft_timer **out) {
  if (!rt || !out)
    return -EINVAL;
  if (weft__load(&rt->closing, WA_ACQ))
    return -ESHUTDOWN;
  struct weft__shard *sh = weft__local_begin(rt);
  weft_timer *t =
      weft__pool_alloc(&rt->timer_pool, sh ? &sh->timer_cache : NULL);
  weft__local_end(sh);
  if (!t)
    return -ENOMEM;
  t->link.next = t->link.prev = NULL;
  t->deadline = t->period = 0;
  t->fn = NULL;
  t->arg = NULL;
  t->strand = NULL;
  t->rt = rt;
  t->state = WEFT_T_IDLE;
  t->destroyed = 0;
  t->where = 0;
  t->inflight = 0;
  t->missed = 0;
  *out = t;
  return 0;
}

static void timer_free(weft_timer *t) {
  weft_rt *rt = t->rt;
  struct weft__shard *sh = weft__local_begin(rt);
  weft__pool_free(&rt->timer_pool, sh ? &sh->timer_cache : NULL, t);
  weft__local_end(sh);
}

int weft_timer_start_at(weft_timer *t, weft_strand *s, uint64_t deadline_ns,
                        uint64_t period_ns, weft_timer_fn fn, void *arg) {
  if (!t || !fn)
    return -EINVAL;
  if (s && s->rt != t->rt)
    return -EXDEV;
  if (s && (weft__load(&s->released, WA_RLX) || s->magic != WEFT_STRAND_MAGIC))
    return -EBADF;
  struct weft__shard *home = home_of(t);
  bool fire_now = false;
  pthread_mutex_lock(&home->tlock);
  if (t->destroyed) {
    pthread_mutex_unlock(&home->tlock);
    return -EBADF;
  }
  if (weft__load(&t->rt->closing, WA_ACQ)) {
    pthread_mutex_unlock(&home->tlock);
    return -ESHUTDOWN;
  }
  if (t->inflight == 0xffff) {
    pthread_mutex_unlock(&home->tlock);
    return -EBUSY;
  }
  uint64_t before = weft__load(&home->timer_next, WA_RLX);
  if (t->state == WEFT_T_ARMED)
    wheel_remove(&home->wheel, t);
  if (!home->wheel.count) /* nothing to keep in place: catch up with now */
    home->wheel.elapsed = weft__now_ns() >> WEFT_TICK_SHIFT;
  t->deadline = deadline_ns;
  t->period = period_ns;
  t->fn = fn;
  t->arg = arg;
  t->strand = s;
  t->missed = 0;
  if (tick_ceil(deadline_ns) <= home->wheel.elapsed) {
    t->state = WEFT_T_FIRED;
    t->inflight++;
    fire_now = true;
  } else {
    t->state = WEFT_T_ARMED;
    wheel_insert(&home->wheel, t);
  }
  publish_next(home);
  pthread_mutex_unlock(&home->tlock);
  if (fire_now) {
    struct weft__shard *local = weft__local_begin(t->rt);
    queue_firing(t, local, false);
    weft__local_end(local);
  } else
    maybe_kick(home, before);
  return 0;
}

int weft_timer_start(weft_timer *t, weft_strand *s, uint64_t after_ns,
                     uint64_t period_ns, weft_timer_fn fn, void *arg) {
  uint64_t now = weft__now_ns();
  if (after_ns > UINT64_MAX - now)
    return -EINVAL;
  return weft_timer_start_at(t, s, now + after_ns, period_ns, fn, arg);
}

int weft_timer_cancel(weft_timer *t) {
  if (!t)
    return -EINVAL;
  struct weft__shard *home = home_of(t);
  int r = -EALREADY;
  pthread_mutex_lock(&home->tlock);
  if (t->state == WEFT_T_ARMED) {
    wheel_remove(&home->wheel, t);
    publish_next(home);
    r = 0;
  }
  t->state = WEFT_T_IDLE; /* a FIRED periodic timer will not re-arm */
  pthread_mutex_unlock(&home->tlock);
  return r;
}

void weft_timer_destroy(weft_timer *t) {
  if (!t)
    return;
  struct weft__shard *home = home_of(t);
  pthread_mutex_lock(&home->tlock);
  if (t->state == WEFT_T_ARMED) {
    wheel_remove(&home->wheel, t);
    publish_next(home);
  }
  t->state = WEFT_T_IDLE;
  t->destroyed = 1;
  bool now = t->inflight == 0;
  pthread_mutex_unlock(&home->tlock);
  if (now)
    timer_free(t);
}

/* After a firing's handler: re-arm a periodic timer, or settle. Returns
 * whether the handler must now be told of a shutdown (-ECANCELED). */
static bool settle(weft_timer *t, bool ran, bool *free_it) {
  struct weft__shard *home = home_of(t);
  bool cancelled = false;
  pthread_mutex_lock(&home->tlock);
  t->inflight--;
  if (t->state == WEFT_T_FIRED && ran && t->period) {
    if (weft__load(&t->rt->closing, WA_ACQ)) {
      t->state = WEFT_T_IDLE;
      cancelled = true;
    } else {
      uint64_t now = weft__now_ns(), next = t->deadline + t->period;
      uint64_t missed = next <= now ? (now - next) / t->period + 1 : 0;
      t->deadline = next + missed * t->period;
      t->missed = missed > UINT32_MAX ? UINT32_MAX : (uint32_t)missed;
      t->state = WEFT_T_ARMED;
      uint64_t before = weft__load(&home->timer_next, WA_RLX);
      wheel_insert(&home->wheel, t);
      publish_next(home);
      pthread_mutex_unlock(&home->tlock);
      maybe_kick(home, before);
      *free_it = false;
      return false;
    }
  } else if (t->state == WEFT_T_FIRED && t->inflight == 0) {
    t->state = WEFT_T_IDLE;
  }
  *free_it = t->destroyed && t->inflight == 0;
  pthread_mutex_unlock(&home->tlock);
  return cancelled;
}

static void tramp(void *arg) {
  weft_timer *t = arg;
  struct weft__shard *home = home_of(t);
  pthread_mutex_lock(&home->tlock);
  weft_timer_fn fn = t->fn;
  void *a = t->arg;
  uint64_t missed = t->missed;
  bool skip = t->destroyed;
  pthread_mutex_unlock(&home->tlock);
  if (!skip)
    fn(a, 0, missed);
  bool free_it;
  if (settle(t, !skip, &free_it))
    fn(a, -ECANCELED, 0);
  if (free_it)
    timer_free(t);
}

static void tramp_cancel(void *arg) {
  weft_timer *t = arg;
  struct weft__shard *home = home_of(t);
  pthread_mutex_lock(&home->tlock);
  weft_timer_fn fn = t->fn;
  void *a = t->arg;
  bool skip = t->destroyed;
  pthread_mutex_unlock(&home->tlock);
  if (!skip)
    fn(a, -ECANCELED, 0);
  bool free_it;
  settle(t, false, &free_it);
  if (free_it)
    timer_free(t);
}

void weft__timers_flush(weft_rt *rt) {
  struct weft__shard *local = weft__local_begin(rt);
  for (unsigned i = 0; i < rt->nshards; i++) {
    struct weft__shard *sh = &rt->shards[i];
    for (;;) {
      weft_timer *due[FIRE_BATCH];
      unsigned n = 0;
      pthread_mutex_lock(&sh->tlock);
      struct weft__wheel *w = &sh->wheel;
      for (unsigned l = 0; l < WEFT_WHEEL_LEVELS && n < FIRE_BATCH; l++) {
        while (w->occupied[l] && n < FIRE_BATCH) {
          unsigned s = (unsigned)__builtin_ctzll(w->occupied[l]);
          weft_timer *t = (weft_timer *)w->slot[l][s].next;
          wheel_remove(w, t);
          t->state = WEFT_T_FIRED;
          t->inflight++;
          due[n++] = t;
        }
      }
      publish_next(sh);
      pthread_mutex_unlock(&sh->tlock);
      for (unsigned k = 0; k < n; k++)
        queue_firing(due[k], local, true);
      if (n < FIRE_BATCH)
        break;
    }
  }
  weft__local_end(local);
}
