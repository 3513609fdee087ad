/*
 * park.c - how idle threads search, sleep and are woken, starting a
 * shard's thread the first time it is needed, and how the runtime notices
 * that a shutdown has finished (park.h). Owns rt->idle.
 *
 * idle.state packs (unparked << 32) | searching. A thread that finds no
 * work becomes a searcher only while fewer than half the threads search
 * (no thundering herd); a searcher that finds work stops searching and, if
 * it was the last one and found more work than it takes, wakes a sleeper
 * to take its place, so a burst of work fans out one thread at a time.
 * Sleepers wait on their own futex word; the sleeper list is under a
 * mutex, taken only when a thread parks or is woken, never per handler.
 *
 * No lost wakeup. A producer publishes work (run-queue tail store, or
 * inject push + len increment), then calls weft__notify_parked, whose first
 * step is an RMW on idle.state. A parking thread does its RMW on idle.state,
 * then looks at every run queue and the inject queue. RMWs on one word are
 * totally ordered: if the producer's comes first, the parker's RMW reads
 * from its release sequence, so the parker sees the work; if the parker's
 * comes first, the producer reads the decremented state, sees no searcher
 * and wakes a sleeper. Only the last searcher needs that recheck: while a
 * searcher exists producers rely on it, and it rechecks when it parks.
 * Running threads need no wakeup: they look at their queues before parking.
 * So with one shard, a push onto its ring by the thread holding it, the
 * one thread that may run that ring, calls no notify_parked (shard.c).
 *
 * Shutdown completes when closing is set, every thread is parked, nothing
 * outside the run loop is busy (a post from outside in progress, a handler
 * bypassed by a handoff, a blocking job, an open socket: rt.c) and the
 * inject queue is empty. All parked implies all run queues empty: a thread
 * parks only with its own ring empty, and only its owner pushes to a ring.
 * The last thread to park checks this under idle.lock, which freezes the
 * unparked count (shutdown_complete_locked); whatever was busy pokes a
 * sleeper when it stops, which parks again and checks.
 *
 * Dormant threads. A shard whose thread weft_rt_create did not start
 * (weft_config.eager_workers) has a DORMANT slot that counts as parked and
 * sits in the sleepers below every started thread that sleeps: parkers
 * push on top, removals keep the order and pops take the top, so a
 * dormant thread is popped only when no started thread sleeps. (A kicked
 * one, started, stays in its place until it leaves the list by itself: it
 * is about to run, not asleep.) Waking a dormant thread starts it
 * (wake_dormant), for a pop (work, no sleeper to take it), a kick (a timer
 * homed on its shard, the first socket), never for a poke or at done.
 */
#include "park.h"

#include "clock.h"
#include "futex.h"
#include "io.h"
#include "monitor.h"
#include "rt.h"
#include "shard.h"
#include "thread.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#define SEARCHING_MASK ((uint64_t)0xffffffffu)
#define UNPARKED_ONE ((uint64_t)1 << 32)

static inline uint32_t searching_of(uint64_t st) {
  return (uint32_t)(st & SEARCHING_MASK);
}
static inline uint32_t unparked_of(uint64_t st) { return (uint32_t)(st >> 32); }

static void wake_dormant(weft_rt *rt, struct weft__thread *t, uint32_t why,
                         uint64_t deadline, bool force);

/* why: 1, popped from the sleepers (it counts as unparked and searching),
 * or 2, kicked; the two wakeups of a started thread. */
static void wake_started(struct weft__thread *t, uint32_t why) {
  uint32_t zero = 0;
  /* seq_cst: against io_sleep in weft__io_wait (io.c's argument) */
  if (why == 1)
    weft__store(&t->wake, 1, WA_SC);
  else if (!weft__cas(&t->wake, &zero, 2, WA_SC, WA_RLX))
    return; /* woken already */
  if (!weft__io_wake_thread(t))
    weft__futex_wake(&t->wake, 1);
}

void weft__kick(struct weft__shard *sh, uint64_t deadline) {
  struct weft__thread *t = weft__load(&sh->owner, WA_ACQ);
  /* A thread that is not asleep reads tm.next before it sleeps, and one
   * asleep until no later than deadline wakes in time: no futex call. A
   * dormant one's sleep_until is UINT64_MAX: any kick starts it. */
  if (!t || deadline >= weft__load(&t->sleep_until, WA_SC))
    return;
  if (weft__load(&t->dormant, WA_ACQ))
    wake_dormant(sh->rt, t, 2, deadline, false);
  else
    wake_started(t, 2);
}

void weft__idle_init(struct weft__idle *idle, unsigned nthreads) {
  weft__store(&idle->state, (uint64_t)nthreads << 32, WA_RLX);
  idle->nsleepers = 0;
  idle->done_n = 0;
  weft__store(&idle->done_next, 0, WA_RLX);
}

int weft__idle_alloc(struct weft__idle *idle, unsigned nthreads) {
  idle->sleepers = calloc(nthreads, sizeof(*idle->sleepers));
  if (!idle->sleepers)
    return -ENOMEM;
  int r = pthread_mutex_init(&idle->lock, NULL);
  if (r) {
    free(idle->sleepers);
    return -r;
  }
  return 0;
}

void weft__idle_destroy(struct weft__idle *idle) {
  pthread_mutex_destroy(&idle->lock);
  free(idle->sleepers);
}

/* Wakes a thread popped from the sleepers. */
static void wake_thread(weft_rt *rt, struct weft__thread *t) {
  if (weft__tracing()) {
    struct weft__thread *me = weft__self();
    weft__trace(WEFT_EV_WAKE,
                me && me->shard ? weft__shard_idx(me->shard)
                                : WEFT_TRACE_NO_SHARD,
                t->idx, 0);
  }
  if (weft__load(&t->dormant, WA_ACQ))
    wake_dormant(rt, t, 1, 0, false);
  else
    wake_started(t, 1);
}

/* Pops a sleeper and counts it unparked and searching; lock held. A poke
 * takes no dormant one: a dormant thread on top means that every started
 * thread is unparked or, kicked, about to leave the list and be, and each
 * of those checks the shutdown when it parks (under idle.lock, after the
 * poker's counter dropped). */
static struct weft__thread *unpark_one_locked(weft_rt *rt, bool for_work) {
  struct weft__idle *idle = &rt->idle;
  if (!idle->nsleepers)
    return NULL;
  struct weft__thread *t = idle->sleepers[idle->nsleepers - 1];
  if (!for_work && weft__load(&t->dormant, WA_ACQ))
    return NULL;
  weft__fetch_add(&idle->state, UNPARKED_ONE | 1, WA_SC);
  idle->nsleepers--;
  return t;
}

void weft__notify_parked(weft_rt *rt) {
  struct weft__idle *idle = &rt->idle;
  /* An RMW, not a load: see the no-lost-wakeup argument above. */
  uint64_t st = weft__fetch_add(&idle->state, 0, WA_SC);
  if (searching_of(st) != 0 || unparked_of(st) >= rt->nshards)
    return;
  pthread_mutex_lock(&idle->lock);
  st = weft__load(&idle->state, WA_SC);
  struct weft__thread *t = NULL;
  if (searching_of(st) == 0 && unparked_of(st) < rt->nshards)
    t = unpark_one_locked(rt, true);
  pthread_mutex_unlock(&idle->lock);
  if (t)
    wake_thread(rt, t);
}

void weft__poke(weft_rt *rt) {
  pthread_mutex_lock(&rt->idle.lock);
  struct weft__thread *t = unpark_one_locked(rt, false);
  pthread_mutex_unlock(&rt->idle.lock);
  if (t)
    wake_thread(rt, t);
}

bool weft__to_searching(weft_rt *rt, struct weft__thread *t) {
  if (t->searching)
    return true;
  uint64_t st = weft__load(&rt->idle.state, WA_SC);
  if (2 * searching_of(st) >= rt->nshards)
    return false;
  weft__fetch_add(&rt->idle.state, 1, WA_SC);
  t->searching = true;
  return true;
}

/* The last searcher to find work hands the search on only when it holds
 * more than the item it is about to run, or the inject queue has some.
 * Otherwise a thread woken by its own timer, finding one firing, would
 * wake a sleeper that finds nothing, many thousand times a second.
 * Nothing is lost by not waking: a post from outside that saw us
 * searching and skipped its wakeup pushed (inject len) before its RMW on
 * idle.state, which our fetch_sub reads from or follows, so the load of
 * len below sees it; work in another ring has a running owner, which runs
 * it or, pushing more, wakes a sleeper itself. */
void weft__from_searching(weft_rt *rt, struct weft__thread *t) {
  t->searching = false;
  uint64_t prev = weft__fetch_sub(&rt->idle.state, 1, WA_SC);
  if (searching_of(prev) != 1)
    return;
  struct weft__shard *sh = t->shard;
  if ((sh && (weft__runq_len(&sh->rq) || weft__runq_len(&sh->prq))) ||
      weft__load(&rt->inject.len, WA_SC) > 0)
    weft__notify_parked(rt);
}

static bool work_visible(weft_rt *rt) {
  if (weft__load(&rt->inject.len, WA_SC) > 0)
    return true;
  for (unsigned i = 0; i < rt->nshards; i++)
    if (weft__runq_len(&rt->shards[i].rq) || weft__runq_len(&rt->shards[i].prq))
      return true;
  return false;
}

/* Wakes sleepers[0..done_n) by claiming indices, together with every
 * thread it woke: one waker alone, making every futex wake, was the
 * critical path of a many-thread shutdown. done_n is written under
 * idle.lock before the first wake; a woken thread reads it after its
 * acquire load of wake saw the waker's seq_cst store, and the entries
 * below done_n no longer change once done is set (park returns at done
 * before adding itself, and nsleepers is 0, so leave_sleepers reads
 * none). A thread woken before, which sees done, reads done_n after its
 * acquire load of done, stored after done_n. Every index is claimed: the
 * declarer claims until none is left. */
static void wake_done_share(weft_rt *rt) {
  struct weft__idle *idle = &rt->idle;
  for (;;) {
    unsigned k = weft__fetch_add(&idle->done_next, 1, WA_RLX);
    if (k >= idle->done_n)
      return;
    wake_thread(rt, idle->sleepers[k]); /* a dormant one stays so */
  }
}

/* Whether the shutdown has finished; idle.lock held, state_after is the
 * caller's own park decrement. The facts checked must hold at one moment,
 * and they are read one after another; this is why that is enough.
 *  - The unparked count changes only under idle.lock (a park, a wake, a
 *    sleeper leaving by itself), so while we hold it, 0 stays 0: no thread
 *    runs a handler, takes from the inject queue or pushes to a ring, and
 *    the rings are empty (a thread parks only with its own ring empty).
 *  - What is left are producers outside the run loop, all counted in one
 *    word, life.busy (rt.c). Each pushes its work before it drops its
 *    count, so the inject queue is read after it: busy read as 0 was
 *    dropped after every such push, which the later seq_cst load of len
 *    then sees, and nobody can have taken them. A producer counts itself
 *    before it can drop, so busy never reads 0 while one is counted.
 *  - closing is read first: a post from outside that counts itself after
 *    our read of busy then reads closing as 1 and backs out.
 * Reading len before the counts was a bug test_shutdown once hit under
 * TSan: len read 0, a bypassed handler pushed its strand, woke a sleeper
 * and stopped counting, the count read 0, and that sleeper ran the strand
 * after done. */
static bool shutdown_complete_locked(weft_rt *rt, uint64_t state_after) {
  return weft__load(&rt->life.closing, WA_SC) &&
         unparked_of(state_after) == 0 &&
         weft__load(&rt->life.busy, WA_SC) == 0 &&
         weft__load(&rt->inject.len, WA_SC) <= 0;
}

/* Declares the runtime done; idle.lock held, shutdown_complete_locked
 * true. Once done is set under the lock, a later waker finds no sleeper
 * and a later parker returns at once: done is declared once. */
static void declare_done_locked(weft_rt *rt) {
  struct weft__idle *idle = &rt->idle;
  idle->done_n = idle->nsleepers;
  idle->nsleepers = 0;
  weft__store(&rt->life.done, 1, WA_SC);
}

/* After declare_done_locked, with the lock released: wakes whoever waits
 * for the end, the spares, and the sleepers. */
static void wake_all_done(weft_rt *rt) {
  pthread_mutex_lock(&rt->life.lock);
  pthread_cond_broadcast(&rt->life.cond);
  pthread_mutex_unlock(&rt->life.lock);
  weft__spares_wake_all(rt);
  wake_done_share(rt);
}

/* Removes t from the sleepers if it is still there, keeping the order of
 * the others (dormant threads below started ones); lock held. */
static bool leave_sleepers(struct weft__idle *idle, struct weft__thread *t) {
  for (unsigned i = 0; i < idle->nsleepers; i++) {
    if (idle->sleepers[i] == t) {
      memmove(&idle->sleepers[i], &idle->sleepers[i + 1],
              (--idle->nsleepers - i) * sizeof(*idle->sleepers));
      return true;
    }
  }
  return false;
}

/* The earliest of deadline and the next deadlines of the shards whose
 * thread could not be started: after a failed start, parked threads
 * wake for those timers too, and serve them (shard.c). */
static uint64_t orphans_next(weft_rt *rt, uint64_t deadline) {
  for (unsigned i = rt->th.neager; i < rt->nshards; i++) {
    if (!weft__load(&rt->shards[i].thread_dormant, WA_ACQ))
      continue;
    uint64_t next = weft__load(&rt->shards[i].tm.next, WA_SC);
    if (next < deadline)
      deadline = next;
  }
  return deadline;
}

/* Sleeps until a notifier pops t (returns true), or until t's shard has a
 * timer due, I/O events, or t was kicked, and t left the sleepers by itself
 * (returns false: t is counted unparked, not searching). A shard with a
 * backend sleeps in it (io.c), others on the futex. */
static bool sleep_until_woken_(weft_rt *rt, struct weft__thread *t) {
  struct weft__idle *idle = &rt->idle;
  bool io_ready = false;
  for (;;) {
    uint32_t w = weft__load(&t->wake, WA_ACQ);
    if (w == 1)
      return true;
    /* sleep_until and tm.next are seq_cst on both sides: either we
     * read the deadline a timer start just moved earlier, or its starter
     * reads a sleep_until later than it (or UINT64_MAX: we are reading)
     * and kicks us (weft__kick). */
    weft__store(&t->sleep_until, UINT64_MAX, WA_SC);
    uint64_t deadline = weft__load(&t->shard->tm.next, WA_SC);
    if (weft__load(&rt->th.start_failed, WA_RLX))
      deadline = orphans_next(rt, deadline);
    weft__store(&t->sleep_until, deadline, WA_SC);
    if (w == 2 || io_ready ||
        (deadline != UINT64_MAX && weft__now_ns() >= deadline)) {
      pthread_mutex_lock(&idle->lock);
      bool left = leave_sleepers(idle, t);
      if (left)
        weft__fetch_add(&idle->state, UNPARKED_ONE, WA_SC);
      pthread_mutex_unlock(&idle->lock);
      if (left) {
        weft__store(&t->wake, 0, WA_RLX);
        weft__monitor_nudge(rt);
        return false;
      }
      /* Popped meanwhile: its notifier is about to store 1. */
      while ((w = weft__load(&t->wake, WA_ACQ)) != 1)
        weft__futex_wait(&t->wake, w);
      return true;
    }
    /* seq_cst: against weft__io_ensure, which publishes io then reads
     * sleep_until to kick us off the futex. */
    struct weft__io *io = weft__load(&t->shard->io, WA_SC);
    if (io)
      io_ready = weft__io_wait(t, io, deadline);
    else if (deadline == UINT64_MAX)
      weft__futex_wait(&t->wake, 0);
    else
      weft__futex_wait_until(&t->wake, 0, deadline);
  }
}

static bool sleep_until_woken(weft_rt *rt, struct weft__thread *t) {
  bool r = sleep_until_woken_(rt, t);
  weft__store(&t->sleep_until, 0, WA_RLX);
  return r;
}

bool weft__park(weft_rt *rt, struct weft__thread *t) {
  struct weft__idle *idle = &rt->idle;
  pthread_mutex_lock(&idle->lock);
  if (weft__load(&rt->life.done, WA_ACQ)) {
    pthread_mutex_unlock(&idle->lock);
    return false;
  }
  bool was_searching = t->searching;
  t->searching = false;
  uint64_t dec = UNPARKED_ONE | (was_searching ? 1 : 0);
  uint64_t prev = weft__fetch_sub(&idle->state, dec, WA_SC);
  idle->sleepers[idle->nsleepers++] = t;
  bool complete = shutdown_complete_locked(rt, prev - dec);
  if (complete)
    declare_done_locked(rt);
  pthread_mutex_unlock(&idle->lock);
  if (complete) {
    wake_all_done(rt);
    return false;
  }

  /* The last searcher looks again (the no-lost-wakeup argument above). So
   * does a thread that did not search because others did, if none is
   * left: one of them may have been a popped dormant thread whose start
   * failed, which counted as a searcher without ever looking
   * (unpop_dormant), so the producers it made skip their wakeup relied on
   * nobody. Only after a failure: start_failed is stored before the
   * undo's idle.lock section, and this thread's decrement came after it
   * (it read the undo's), so the relaxed load sees it. */
  bool last = was_searching ? searching_of(prev) == 1
                            : searching_of(prev) == 0 &&
                                  weft__load(&rt->th.start_failed, WA_RLX);
  if (last && work_visible(rt))
    weft__notify_parked(rt);
  return weft__park_resume(rt, t);
}

bool weft__park_resume(weft_rt *rt, struct weft__thread *t) {
  if (!sleep_until_woken(rt, t))
    return true; /* left the sleepers itself: a timer is due */
  weft__store(&t->wake, 0, WA_RLX);
  if (weft__load(&rt->life.done, WA_ACQ)) {
    wake_done_share(rt);
    return false;
  }
  t->searching = true; /* the waker counted us as a searcher */
  /* A thread runs: the monitor, if it sleeps for an idle runtime, watches
   * again. The woken thread wakes it, before it runs anything, not its
   * waker: the waker's unpark (an RMW on idle.state, seq_cst) happens
   * before this load of m->sleeping (through t->wake), so either the
   * monitor's load of idle.state after its store of sleeping saw the
   * unpark, or this load sees sleeping (monitor.c, the idle sleep).
   * When the waker made the second wakeup right after this thread's, the
   * woken thread was often queued behind its spinning waker for a whole
   * scheduler slice while another CPU idled, and ran milliseconds late
   * (bench/post's wake test). */
  weft__monitor_nudge(rt);
  return true;
}

void weft__idle_add_dormant(weft_rt *rt) {
  struct weft__idle *idle = &rt->idle;
  /* The highest index at the bottom: pops start the lowest first. */
  for (unsigned i = rt->nshards; i-- > rt->th.neager;) {
    struct weft__thread *t = &rt->threads[i];
    t->slot_state = WEFT_TH_DORMANT;
    t->lazy = true;
    weft__store(&t->dormant, 1, WA_RLX);
    weft__store(&t->shard->thread_dormant, 1, WA_RLX);
    weft__store(&t->sleep_until, UINT64_MAX, WA_RLX);
    idle->sleepers[idle->nsleepers++] = t;
  }
}

/* After a failed start: no try for the same thread within this, but for
 * a socket call's (weft__start_dormant_all: the caller gets -EAGAIN, and
 * a call again is a try again). Each wakeup that needs the thread would
 * otherwise try (a periodic timer on its shard, at every firing), and
 * each try that fails costs a create. */
#define START_RETRY_NS (10ull * 1000000u)

/* A kick whose thread could not be started: every started sleeper that
 * would sleep past deadline is kicked to sleep again with the orphaned
 * shard's deadline in its own (orphans_next). All of them: a single one,
 * woken, could take other work and leave the deadline unwatched. A
 * kicked thread leaves the sleepers by itself and counts as no searcher,
 * so no post skips its wakeup for it. */
static void kick_sleepers(weft_rt *rt, uint64_t deadline) {
  struct weft__idle *idle = &rt->idle;
  pthread_mutex_lock(&idle->lock);
  for (unsigned i = idle->nsleepers; i-- > 0;) {
    struct weft__thread *t = idle->sleepers[i];
    if (weft__load(&t->dormant, WA_ACQ))
      continue; /* not started */
    if (deadline < weft__load(&t->sleep_until, WA_SC))
      wake_started(t, 2);
  }
  pthread_mutex_unlock(&idle->lock);
}

/* Undoes the pop of a dormant thread that could not be started: counted
 * parked again, back at the bottom of the sleepers. It counted as a
 * searcher without looking, so producers skipped their wakeups: if it was
 * the last and work is queued, a started sleeper takes over (returned, to
 * be woken); if none sleeps, every started thread is unparked and looks
 * before it parks (weft__park's recheck covers one that did not search
 * because of us). The shutdown cannot complete here: whoever popped is
 * counted, as a running thread or a post in flight. */
static struct weft__thread *unpop_dormant(weft_rt *rt, struct weft__thread *t) {
  struct weft__idle *idle = &rt->idle;
  pthread_mutex_lock(&idle->lock);
  uint64_t prev = weft__fetch_sub(&idle->state, UNPARKED_ONE | 1, WA_SC);
  memmove(&idle->sleepers[1], &idle->sleepers[0],
          idle->nsleepers * sizeof(*idle->sleepers));
  idle->sleepers[0] = t;
  idle->nsleepers++;
  struct weft__thread *next = NULL;
  if (searching_of(prev) == 1 && work_visible(rt))
    next = unpark_one_locked(rt, false);
  pthread_mutex_unlock(&idle->lock);
  return next;
}

/* Creates the thread of a dormant slot; spare_lock held. Any thread may
 * start one (the one that needs it): the CPU affinity and scheduling
 * policy are weft_rt_create's caller's, as the eager threads inherit them
 * (lazy_attr). Where those cannot be given (EPERM: a real-time policy and
 * a waker without the privilege; EINVAL: the process's cpuset no longer
 * has those CPUs) the thread inherits the waker's instead. */
static int create_dormant(weft_rt *rt, struct weft__thread *t) {
  int err = weft__spawn(&t->tid, &rt->th.lazy_attr, weft__thread_entry, t);
  if (err == EPERM || err == EINVAL)
    err = weft__spawn(&t->tid, &rt->th.attr, weft__thread_entry, t);
  if (err)
    return -err;
  t->slot_state = WEFT_TH_LIVE;
  weft__store(&t->dormant, 0, WA_REL);
  weft__store(&t->shard->thread_dormant, 0, WA_REL);
  return 0;
}

/* Starts dormant t for a pop (why 1) or a kick (why 2). The decision is
 * taken under spare_lock, where the slot's state changes: two wakers
 * never both start it, and a failed start is undone before another waker
 * looks. Every store to a dormant thread's wake is made here, before
 * pthread_create, which orders it before the new thread's first read:
 * that thread goes on as if its sleep had ended, popped (1: counted
 * unparked and searching) or kicked (2: it leaves the sleepers itself).
 * At done nobody needs it: it stays dormant, and destroy skips its slot.
 * Lock order: spare_lock, then idle.lock (unpop_dormant); nothing takes
 * spare_lock under idle.lock. The create runs under spare_lock, so lazy
 * starts are serial and weft_rt_stats or a handoff waits for one (tens of
 * us, once per shard): join_all reads tid and state under that lock, and
 * a state published before the tid could be joined unwritten. */
static void wake_dormant(weft_rt *rt, struct weft__thread *t, uint32_t why,
                         uint64_t deadline, bool force) {
  pthread_mutex_lock(&rt->th.spare_lock);
  if (t->slot_state != WEFT_TH_DORMANT) {
    pthread_mutex_unlock(&rt->th.spare_lock);
    wake_started(t, why); /* started meanwhile */
    return;
  }
  /* A pop's 1 outranks a kick's 2: the popped thread is counted. */
  if (why == 1 || weft__load(&t->wake, WA_RLX) == 0)
    weft__store(&t->wake, why, WA_SC);
  int err = 0;
  uint64_t now = weft__now_ns();
  if (weft__load(&rt->life.done, WA_ACQ)) {
    /* nobody needs it: err stays 0 and it stays dormant */
  } else if (!force && now < t->retry_ns) {
    err = -EAGAIN; /* failed a moment ago: not again yet */
  } else if ((err = create_dormant(rt, t)) != 0) {
    weft__fetch_add(&rt->th.start_errors, 1, WA_RLX);
    t->retry_ns = now + START_RETRY_NS;
  }
  struct weft__thread *next = NULL;
  if (err) {
    weft__store(&rt->th.start_failed, 1, WA_RLX);
    /* why is 1 exactly when wake is: a pop stores 1 only here. */
    if (why == 1)
      next = unpop_dormant(rt, t);
    weft__store(&t->wake, 0, WA_RLX);
  }
  pthread_mutex_unlock(&rt->th.spare_lock);
  if (err && why == 2)
    kick_sleepers(rt, deadline);
  if (next)
    wake_thread(rt, next);
}

int weft__start_dormant_all(weft_rt *rt) {
  if (rt->th.neager == rt->nshards || weft__load(&rt->th.all_started, WA_ACQ))
    return 0;
  int r = 0;
  for (unsigned i = rt->th.neager; i < rt->nshards; i++) {
    /* While the flag is 1, threads[i] is the shard's dormant slot. */
    _Atomic uint32_t *d = &rt->shards[i].thread_dormant;
    if (weft__load(d, WA_ACQ))
      wake_dormant(rt, &rt->threads[i], 2, 0, true);
    if (weft__load(d, WA_ACQ) && !weft__load(&rt->life.done, WA_ACQ))
      r = -EAGAIN;
  }
  if (!r)
    weft__store(&rt->th.all_started, 1, WA_REL);
  return r;
}
