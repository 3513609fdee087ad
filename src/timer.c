/*
 * timer.c - timers (timer.h): the per-shard hierarchical timing wheel,
 * arming, cancelling, firing, and the timers' part of shutdown. Owns every
 * weft_timer and each shard's wheel.
 *
 * Home shard: a timer lives in the wheel of its strand's home shard (its
 * own home for a timer without strand: shard.h, "Homes"), fixed for its
 * life, so all its state is guarded by that shard's timer lock, and all
 * timers of one strand share a wheel. Firings are queued on the strand
 * while the lock is held, so handlers are queued in the order the wheel
 * yields deadlines. Per firing, the lock is taken twice: to fire (with the
 * other due timers) and to settle after the handler; a thread preempted
 * while it holds the lock keeps every other thread off that wheel, so
 * holds are short. Lock order: a timer lock is never held while taking
 * another lock except a pool depot's, and never across a handler.
 *
 * A firing carries a copy of what it fired with (fn, arg, missed), so a
 * re-arm with other values does not change a firing already queued.
 *
 * No stale firing. While FIRED, the timer points at its latest firing. A
 * start, cancel or destroy that finds it FIRED (the arming it replaces has
 * fired) tries to move that firing from QUEUED to STALE; the firing, when
 * it runs, tries to move itself from QUEUED to STARTED. One CAS wins: a
 * stale firing calls nothing (neither its handler nor, at a CANCEL
 * shutdown, -ECANCELED) and only settles. Firings older than the latest
 * were made stale when they stopped being the latest (only a start makes
 * a new firing while one is in flight: a periodic re-arm waits for none),
 * so marking the latest suffices. Relaxed is enough on both sides: the
 * CAS alone decides who owns the call, and nothing is read through the
 * state; on the timer's strand a cancel happens before the firing's run
 * (the strand orders its handlers), so the firing's CAS sees STALE.
 *
 * Exactly one outcome per arming: an ARMED timer leaves the wheel either by
 * firing (state FIRED, inflight++, its handler queued) or by cancel (state
 * IDLE, cancel returns 0), both under the lock. A firing that is queued is work
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
#include "timer.h"

#include "clock.h"
#include "park.h"
#include "rt.h"
#include "shard.h"
#include "strand.h"

#include <errno.h>
#include <stdio.h>

#define LEVEL_BITS 6
#define SLOT_MASK ((uint64_t)WEFT_WHEEL_SLOTS - 1)
#define MAX_TICKS ((uint64_t)1 << (LEVEL_BITS * WEFT_WHEEL_LEVELS))

uint64_t weft_now_ns(void) { return weft__now_ns(); }

static inline weft_strand *timer_strand(const struct weft_timer *t) {
  uintptr_t o = weft__load(&t->owner, WA_RLX);
  return (o & WEFT_T_NOSTRAND) ? NULL : (weft_strand *)(o & ~WEFT_T_OWNER_BITS);
}

static inline struct weft__shard *home_of(const struct weft_timer *t) {
  uintptr_t o = weft__load(&t->owner, WA_RLX);
  if (o & WEFT_T_NOSTRAND)
    return (struct weft__shard *)(o & ~WEFT_T_OWNER_BITS);
  weft_strand *s = (weft_strand *)(o & ~WEFT_T_OWNER_BITS);
  return &s->rt->shards[s->home];
}

struct weft__shard *weft__timer_home(const struct weft_timer *t) {
  return home_of(t);
}

/* Its runtime, without the detour through the strand's home shard. */
static inline weft_rt *rt_of(const struct weft_timer *t) {
  uintptr_t o = weft__load(&t->owner, WA_RLX);
  if (o & WEFT_T_NOSTRAND)
    return ((struct weft__shard *)(o & ~WEFT_T_OWNER_BITS))->rt;
  return ((weft_strand *)(o & ~WEFT_T_OWNER_BITS))->rt;
}

static inline uint64_t tick_ceil(uint64_t ns) {
  return (ns >> WEFT_TICK_SHIFT) + ((ns & ((1u << WEFT_TICK_SHIFT) - 1)) != 0);
}

static void wheel_init(struct weft__wheel *w, uint64_t now_ns) {
  w->elapsed = now_ns >> WEFT_TICK_SHIFT;
  w->count = 0;
  for (int l = 0; l < WEFT_WHEEL_LEVELS; l++) {
    w->occupied[l] = 0;
    for (int s = 0; s < WEFT_WHEEL_SLOTS; s++)
      w->slot[l][s].next = w->slot[l][s].prev = &w->slot[l][s];
  }
}

void weft__timers_init(struct weft__timers *tm, uint64_t now_ns) {
  weft__store(&tm->next, UINT64_MAX, WA_RLX);
  weft__lock_init(&tm->lock);
  wheel_init(&tm->wheel, now_ns);
}

static unsigned level_for(uint64_t elapsed, uint64_t when) {
  uint64_t masked = (elapsed ^ when) | SLOT_MASK;
  if (masked >= MAX_TICKS)
    masked = MAX_TICKS - 1;
  unsigned significant = 63 - (unsigned)__builtin_clzll(masked);
  return significant / LEVEL_BITS;
}

/* Inserts an ARMED timer. Its tick must not be behind w->elapsed: such a
 * slot would be read as one a whole turn of its level ahead (up to hours),
 * and the timers cascading through it would wait with it. A deadline the
 * wheel has passed goes to the current tick's slot, which is due. */
static void wheel_insert(struct weft__wheel *w, weft_timer *t) {
  uint64_t when = tick_ceil(t->deadline);
  if (when < w->elapsed)
    when = w->elapsed;
  unsigned level = level_for(w->elapsed, when);
  unsigned slot = (unsigned)((when >> (level * LEVEL_BITS)) & SLOT_MASK);
  if (level == WEFT_WHEEL_LEVELS - 1 &&
      slot == (unsigned)((w->elapsed >> (level * LEVEL_BITS)) & SLOT_MASK))
    /* Beyond the wheel's range with the top digit of now: the current top
     * slot would be due at once and re-insert it there forever. The slot
     * before it is the last one of this turn: it cascades again then. */
    slot = (slot - 1) & SLOT_MASK;
  struct weft__tlist *head = &w->slot[level][slot];
  /* Level 0 is kept in deadline order (a tick spans 1.024 us of them),
   * equal deadlines in insertion order; it is where timers fire from. */
  struct weft__tlist *after = head->prev;
  if (level == 0)
    while (after != head && ((weft_timer *)after)->deadline > t->deadline)
      after = after->prev;
  t->link.next = after->next;
  t->link.prev = after;
  after->next->prev = &t->link;
  after->next = &t->link;
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

/* tm.next is never later than the wheel's next due slot, but may be
 * earlier: a cancel leaves it (the owner then wakes at the old deadline,
 * finds nothing due and publishes the exact value here), so that starting
 * and cancelling a timer that is not the earliest stores nothing shared.
 * The stores are seq_cst: see weft__kick. lock held. */
static void publish_next(struct weft__shard *sh) {
  uint64_t tick;
  unsigned l, s;
  uint64_t next = UINT64_MAX;
  if (next_slot(&sh->tm.wheel, &tick, &l, &s)) {
    next = tick << WEFT_TICK_SHIFT;
    /* The next timer to fire or cascade: fetched now, it is not a cache
     * miss inside the next hold, where it was a large share of the hold. */
    __builtin_prefetch(sh->tm.wheel.slot[l][s].next, 1);
  }
  if (weft__load(&sh->tm.next, WA_RLX) != next)
    weft__store(&sh->tm.next, next, WA_SC);
}

/* Moves tm.next earlier if t, just inserted, is due before it. */
static void lower_next(struct weft__shard *sh, const weft_timer *t) {
  uint64_t next = tick_ceil(t->deadline) << WEFT_TICK_SHIFT;
  if (next < weft__load(&sh->tm.next, WA_RLX))
    weft__store(&sh->tm.next, next, WA_SC);
}

static void tramp(void *arg);
static void tramp_cancel(void *arg);

/* What a firing fired with, so a re-arm cannot change it. It travels as the
 * arg of an ordinary handler node (freed by whoever runs the node) and is
 * freed by the trampoline. From the timer pool (64-byte objects). */
enum { F_QUEUED = 0, F_STARTED, F_STALE };

struct firing {
  weft_timer *t;
  weft_timer_fn fn;
  void *arg;
  uint64_t missed;
  uint64_t period; /* for settle: whether to read the clock before the lock */
  _Atomic uint32_t state; /* F_*: see "No stale firing" above */
};

/* A firing lives as long as its node, and comes from the node pool: it is
 * freed by whichever thread runs it, into that thread's cache. */
_Static_assert(sizeof(struct firing) <= WEFT_CACHELINE &&
                   sizeof(struct weft__node) <= WEFT_CACHELINE,
               "a firing fits a node's slot");
_Static_assert(sizeof(struct weft_timer) == 64, "a timer is 64 bytes");
_Static_assert(_Alignof(weft_strand) > WEFT_T_OWNER_BITS &&
                   _Alignof(struct weft__shard) > WEFT_T_OWNER_BITS,
               "owner's low bits are free");

/* A firing's lateness: now_ns (0: unknown, it is read) past its deadline,
 * into the firing thread's shard's histogram (or the runtime's). */
static void late(weft_timer *t, struct weft__shard *local, uint64_t now_ns) {
  if (!now_ns)
    now_ns = weft__now_ns();
  uint64_t ns = now_ns > t->deadline ? now_ns - t->deadline : 0;
  if (local)
    weft__hist_add(&local->hist[WEFT_HIST_TIMER_LATE], ns);
  else
    weft__hist_add_shared(&rt_of(t)->outside.hist[WEFT_HIST_TIMER_LATE], ns);
  weft__trace(WEFT_EV_TIMER, local ? local->idx : WEFT_TRACE_NO_SHARD,
              (uintptr_t)t->fn, ns);
}

/* Fires t (out of the wheel) from `local`, at now_ns (0: unknown); lock
 * held. On allocation failure the firing is not lost: t is re-armed 1 ms
 * later. */
static void fire_locked(weft_timer *t, struct weft__shard *home,
                        struct weft__shard *local, bool cancel,
                        uint64_t now_ns) {
  weft_rt *rt = home->rt;
  struct weft__pool_cache *nc = local ? &local->cache.node : NULL;
  struct firing *f = weft__pool_alloc(&rt->node_pool, nc);
  struct weft__node *n =
      f ? weft__node_new(rt, local, cancel ? tramp_cancel : tramp, tramp_cancel,
                         f)
        : NULL;
  if (!n) {
    if (f)
      weft__pool_free(&rt->node_pool, nc, f);
    t->state = WEFT_T_ARMED;
    t->deadline = weft__now_ns() + 1000000;
    wheel_insert(&home->tm.wheel, t);
    return;
  }
  t->state = WEFT_T_FIRED;
  t->inflight++;
  t->firing = f;
  f->t = t;
  f->fn = t->fn;
  f->arg = t->arg;
  f->missed = t->missed;
  f->period = t->period;
  weft__store(&f->state, F_QUEUED, WA_RLX);
  weft__node_post(rt, local, timer_strand(t), n, true);
  if (cancel)
    return;
  late(t, local, now_ns);
  if (local)
    weft__stat_add(&local->st.timers_fired, 1);
  else
    weft__fetch_add(&rt->outside.timers_fired, 1, WA_RLX);
}

/* Fires every due timer of home's wheel, in deadline order; lock held.
 * Timers fire only from level 0, which is sorted; a due slot of a higher
 * level is cascaded whole, even its timers due now, which then land in a
 * level-0 slot in order. */
static void fire_due_locked(struct weft__shard *home, struct weft__shard *local,
                            uint64_t now_ns) {
  uint64_t now_tick = now_ns >> WEFT_TICK_SHIFT;
  struct weft__wheel *w = &home->tm.wheel;
  uint64_t tick;
  unsigned l, s;
  while (next_slot(w, &tick, &l, &s) && tick <= now_tick) {
    w->elapsed = tick;
    struct weft__tlist *head = &w->slot[l][s];
    while (head->next != head) {
      weft_timer *t = (weft_timer *)head->next;
      wheel_remove(w, t);
      if (l == 0)
        fire_locked(t, home, local, false, now_ns);
      else
        wheel_insert(w, t);
    }
  }
  if (!w->count && now_tick > w->elapsed)
    w->elapsed = now_tick;
}

bool weft__timers_fire_due(struct weft__shard *home, struct weft__shard *local,
                           uint64_t now_ns) {
  if (!weft__trylock(&home->tm.lock))
    return false; /* another thread is serving this wheel */
  /* Quiet: the firings' notify_parked (an RMW on the shared idle word each)
   * waits until the lock is released, and is made once. A thread that is
   * preempted while it holds the lock keeps every other thread off this wheel
   * for a whole scheduler tick, so the hold is kept short. */
  bool quiet = local && !local->quiet;
  if (quiet)
    local->quiet = true;
  fire_due_locked(home, local, now_ns);
  publish_next(home);
  weft__unlock(&home->tm.lock);
  if (quiet) {
    local->quiet = false;
    if (weft__runq_len(&local->prq) + weft__runq_len(&local->rq) > 1)
      weft__notify_parked(home->rt);
  }
  return true;
}

/* Wakes the home shard's thread if its deadline moved earlier. */
static void maybe_kick(struct weft__shard *home, uint64_t before) {
  uint64_t next = weft__load(&home->tm.next, WA_RLX);
  /* The owner, not self->shard: inside a handler this thread may already
   * have lost home to a handoff without knowing; the new owner must wake.
   * If the handoff comes after this load, the new owner reads tm.next
   * when it starts serving home. */
  if (next < before && weft__load(&home->owner, WA_ACQ) != weft__self())
    weft__kick(home, next);
}

int weft_timer_create(weft_rt *rt, weft_strand *s, weft_timer **out) {
  if (!rt || !out)
    return -EINVAL;
  if (weft__forked(rt))
    return -ECHILD;
  if (s && s->rt != rt)
    return -EXDEV;
  if (s && (weft__load(&s->released, WA_RLX) || s->magic != WEFT_STRAND_MAGIC))
    return -EBADF;
  if (weft__load(&rt->life.closing, WA_ACQ))
    return -ESHUTDOWN;
  struct weft__shard *sh = weft__local_begin(rt);
  struct weft__shard *home = &rt->shards[s ? s->home : weft__home_pick(rt, sh)];
  weft_timer *t = weft__sim_fault(rt, WEFT_SIM_FAULT_ENOMEM)
                      ? NULL
                      : weft__pool_alloc(&home->timer_pool,
                                         sh == home ? &sh->cache.timer : NULL);
  weft__local_end(sh);
  if (!t)
    return -ENOMEM;
  t->link.next = t->link.prev = NULL;
  t->deadline = t->period = 0;
  t->fn = NULL;
  t->arg = NULL;
  weft__store(&t->owner, s ? (uintptr_t)s : (uintptr_t)home | WEFT_T_NOSTRAND,
              WA_RLX);
  t->state = WEFT_T_IDLE;
  t->where = 0;
  t->inflight = 0;
  t->missed = 0;
  *out = t;
  return 0;
}

/* Into its home's pool; its strand, if any, is still alive. */
static void timer_free(weft_timer *t) {
  struct weft__shard *home = home_of(t);
  struct weft__shard *sh = weft__local_begin(home->rt);
  weft__pool_free(&home->timer_pool, sh == home ? &sh->cache.timer : NULL, t);
  weft__local_end(sh);
}

static void firing_free(weft_rt *rt, struct firing *f) {
  struct weft__shard *sh = weft__local_begin(rt);
  weft__pool_free(&rt->node_pool, sh ? &sh->cache.node : NULL, f);
  weft__local_end(sh);
}

/* t's arming is being replaced (start, cancel, destroy): if it fired and
 * its handler has not started, it never will. true if that stopped it;
 * lock held. */
static bool supersede_locked(weft_timer *t) {
  if (t->state != WEFT_T_FIRED || !t->firing)
    return false;
  struct firing *f = t->firing;
  t->firing = NULL;
  uint32_t queued = F_QUEUED;
  return weft__cas(&f->state, &queued, F_STALE, WA_RLX, WA_RLX);
}

/* Arms t; lock held. */
static int start_locked(weft_timer *t, struct weft__shard *home,
                        struct weft__shard *local, uint64_t deadline_ns,
                        uint64_t period_ns, weft_timer_fn fn, void *arg,
                        uint64_t now) {
  if (weft__load(&t->owner, WA_RLX) & WEFT_T_DESTROYED)
    return -EBADF;
  if (weft__load(&rt_of(t)->life.closing, WA_ACQ))
    return -ESHUTDOWN;
  if (t->inflight == 0xffff)
    return -EBUSY;
  if (t->state == WEFT_T_ARMED)
    wheel_remove(&home->tm.wheel, t);
  supersede_locked(t);
  if (!home->tm.wheel.count) /* nothing to keep in place: catch up with now */
    home->tm.wheel.elapsed = (now ? now : weft__now_ns()) >> WEFT_TICK_SHIFT;
  t->deadline = deadline_ns;
  t->period = period_ns;
  t->fn = fn;
  t->arg = arg;
  t->missed = 0;
  if (tick_ceil(deadline_ns) <= home->tm.wheel.elapsed) {
    fire_locked(t, home, local, false, now);
    if (t->state == WEFT_T_ARMED) /* out of memory: re-armed, 1 ms on */
      lower_next(home, t);
  } else {
    t->state = WEFT_T_ARMED;
    wheel_insert(&home->tm.wheel, t);
    lower_next(home, t);
  }
  return 0;
}

/* now: the clock if the caller read it, else 0. */
static int start_at(weft_timer *t, uint64_t deadline_ns, uint64_t period_ns,
                    weft_timer_fn fn, void *arg, uint64_t now) {
  if (!t || !fn || (period_ns && deadline_ns > UINT64_MAX - period_ns))
    return -EINVAL;
  /* Misuse caught where it can be, as weft_post catches it: a timer must
   * be destroyed before its strand is released, and its firings would
   * go to the strand's memory. */
  weft_strand *s = timer_strand(t);
  if (s && !weft__strand_live(s))
    return -EBADF;
  weft_rt *rt = rt_of(t);
  if (weft__forked(rt))
    return -ECHILD;
  struct weft__shard *home = home_of(t);
  struct weft__shard *local = weft__local_begin(rt);
  /* From outside the runtime, a firing queued at once must count as a
   * post in flight, or a racing shutdown could finish without it. */
  if (!local) {
    int r = weft__busy_enter(rt);
    if (r)
      return r;
  }
  weft__lock(&home->tm.lock);
  uint64_t before = weft__load(&home->tm.next, WA_RLX);
  int r = start_locked(t, home, local, deadline_ns, period_ns, fn, arg, now);
  weft__unlock(&home->tm.lock);
  weft__local_end(local);
  if (!r)
    maybe_kick(home, before);
  if (!local)
    weft__busy_drop(rt, 1);
  return r;
}

int weft_timer_start(weft_timer *t, uint64_t after_ns, uint64_t period_ns,
                     weft_timer_fn fn, void *arg) {
  uint64_t now = weft__now_ns();
  if (after_ns > UINT64_MAX - now)
    return -EINVAL;
  return start_at(t, now + after_ns, period_ns, fn, arg, now);
}

int weft_timer_start_at(weft_timer *t, uint64_t deadline_ns, uint64_t period_ns,
                        weft_timer_fn fn, void *arg) {
  return start_at(t, deadline_ns, period_ns, fn, arg, 0);
}

int weft_timer_cancel(weft_timer *t) {
  if (!t)
    return -EINVAL;
  if (weft__forked(rt_of(t)))
    return -ECHILD;
  struct weft__shard *home = home_of(t);
  int r = -EALREADY;
  weft__lock(&home->tm.lock);
  if (t->state == WEFT_T_ARMED) {
    wheel_remove(&home->tm.wheel, t);
    r = 0;
  } else if (supersede_locked(t)) {
    r = 0;
  }
  t->state = WEFT_T_IDLE; /* a FIRED periodic timer will not re-arm */
  weft__unlock(&home->tm.lock);
  return r;
}

void weft_timer_destroy(weft_timer *t) {
  if (!t || weft__forked(rt_of(t)))
    return;
  struct weft__shard *home = home_of(t);
  weft__lock(&home->tm.lock);
  if (t->state == WEFT_T_ARMED)
    wheel_remove(&home->tm.wheel, t);
  supersede_locked(t);
  t->state = WEFT_T_IDLE;
  weft__fetch_or(&t->owner, WEFT_T_DESTROYED, WA_RLX);
  bool now = t->inflight == 0;
  weft__unlock(&home->tm.lock);
  if (now)
    timer_free(t);
}

/* The first deadline of t's grid after now, and how many passed unfired
 * (*missed). start_at checked deadline + period; later sums saturate. */
static uint64_t next_period(const weft_timer *t, uint64_t now,
                            uint64_t *missed) {
  uint64_t next = t->deadline + t->period;
  uint64_t m = next <= now ? (now - next) / t->period + 1 : 0;
  *missed = m;
  if (m && m > (UINT64_MAX - next) / t->period)
    return UINT64_MAX;
  return next + m * t->period;
}

/* After a firing, its handler called or not (stale): re-arm a periodic
 * timer, or settle. cancel: the run of a CANCEL shutdown, which never
 * re-arms. Returns whether the timer's handler must now be told of a
 * shutdown (-ECANCELED), and the fn and arg of its arming to call. A
 * periodic firing's re-arm needs the clock, read before the lock to keep
 * the hold short: a deadline that passes between the read and the lock is
 * then not counted as missed; it fires as soon as its wheel is served,
 * which is still after the handler returned. */
static bool settle(struct firing *f, bool cancel, bool *free_it,
                   weft_timer_fn *fn, void **arg) {
  weft_timer *t = f->t;
  struct weft__shard *home = home_of(t);
  bool cancelled = false;
  uint64_t now = f->period && !cancel ? weft__now_ns() : 0;
  weft__lock(&home->tm.lock);
  t->inflight--;
  bool latest = t->state == WEFT_T_FIRED && t->firing == f;
  if (latest)
    t->firing = NULL;
  /* A shutdown's cancel run of the arming's latest firing told its
   * handler of the shutdown: the arming is over, even
   * with older, stale firings still queued, which a timer without a
   * strand may run after this one. Left FIRED, the last of them would
   * settle a periodic timer below and tell it a second time. */
  if (cancel && latest)
    t->state = WEFT_T_IDLE;
  /* Only the last firing under way re-arms, and only while the arming
   * that fired is still the timer's (FIRED): one that settles while a
   * newer firing (of a restart) is still queued would re-arm the newer
   * arming before its handler ran, and the next period could then queue
   * behind it instead of counting as missed. The last to settle may be a
   * stale one (a timer without a strand runs firings in any order), after
   * the arming's own firing ran: it re-arms that arming. */
  if (t->state == WEFT_T_FIRED && !cancel && t->period && t->inflight == 0) {
    if (weft__load(&rt_of(t)->life.closing, WA_ACQ)) {
      t->state = WEFT_T_IDLE;
      *fn = t->fn;
      *arg = t->arg;
      cancelled = true;
    } else {
      /* The clock is unread if this firing was of a one-shot arming and
       * a restart made t periodic since. */
      uint64_t missed,
          next = next_period(t, now ? now : weft__now_ns(), &missed);
      /* A thread serving the wheel may have moved it past the clock read
       * before the lock (this one preempted in between): count the
       * periods missed since, rather than fire a passed one at once. The
       * wheel never passes a clock read made under the lock. */
      if (tick_ceil(next) <= home->tm.wheel.elapsed)
        next = next_period(t, weft__now_ns(), &missed);
      t->deadline = next;
      t->missed = missed > UINT32_MAX ? UINT32_MAX : (uint32_t)missed;
      t->state = WEFT_T_ARMED;
      uint64_t before = weft__load(&home->tm.next, WA_RLX);
      wheel_insert(&home->tm.wheel, t);
      lower_next(home, t);
      weft__unlock(&home->tm.lock);
      maybe_kick(home, before);
      *free_it = false;
      return false;
    }
  } else if (t->state == WEFT_T_FIRED && t->inflight == 0) {
    t->state = WEFT_T_IDLE;
  }
  *free_it =
      (weft__load(&t->owner, WA_RLX) & WEFT_T_DESTROYED) && t->inflight == 0;
  weft__unlock(&home->tm.lock);
  return cancelled;
}

/* Runs one firing: its handler with status 0 (or -ECANCELED if cancel),
 * unless a start, cancel or destroy made it stale first; then settles the
 * timer. */
static void run_firing(struct firing *f, bool cancel) {
  weft_timer *t = f->t;
  weft_rt *rt = rt_of(t); /* t may be freed once settled */
  uint32_t queued = F_QUEUED;
  if (weft__cas(&f->state, &queued, F_STARTED, WA_RLX, WA_RLX)) {
    weft__calling((void *)f->fn);
    f->fn(f->arg, cancel ? -ECANCELED : 0, cancel ? 0 : f->missed);
  }
  bool free_it;
  weft_timer_fn fn;
  void *arg;
  if (settle(f, cancel, &free_it, &fn, &arg)) {
    weft__calling((void *)fn);
    fn(arg, -ECANCELED, 0); /* a periodic timer's last call */
  }
  firing_free(rt, f);
  if (free_it)
    timer_free(t);
}

static void tramp(void *arg) { run_firing(arg, false); }
static void tramp_cancel(void *arg) { run_firing(arg, true); }

void weft__timers_flush(weft_rt *rt) {
  struct weft__shard *local = weft__local_begin(rt);
  for (unsigned i = 0; i < rt->nshards; i++) {
    struct weft__shard *sh = &rt->shards[i];
    struct weft__wheel *w = &sh->tm.wheel;
    weft__lock(&sh->tm.lock);
    for (unsigned l = 0; l < WEFT_WHEEL_LEVELS; l++) {
      while (w->occupied[l]) {
        unsigned s = (unsigned)__builtin_ctzll(w->occupied[l]);
        weft_timer *t = (weft_timer *)w->slot[l][s].next;
        wheel_remove(w, t);
        fire_locked(t, sh, local, true, 0);
        if (t->state == WEFT_T_ARMED) { /* out of memory: drop it */
          wheel_remove(w, t);
          t->state = WEFT_T_IDLE;
          weft__log(rt, WEFT_LOG_ERROR,
                    "out of memory cancelling a timer: its handler is not "
                    "told of the shutdown");
        }
      }
    }
    publish_next(sh);
    weft__unlock(&sh->tm.lock);
  }
  weft__local_end(local);
}
