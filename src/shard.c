/*
 * shard.c - the run loop of a runtime thread: find an item (own run queue,
 * inject queue, steal), run it, park when there is none. Owns the
 * thread-local identity of runtime threads.
 *
 * A thread holds at most one shard (thread->shard) and a shard records its
 * holder (shard->owner). A thread keeps its shard until the monitor hands
 * it to a spare because the thread is stuck in a handler (monitor.c); the
 * thread then finds its shard gone and waits as a spare itself.
 *
 * Fairness: every 61st item comes from the inject queue first, so posts
 * from outside are not starved by a shard whose handlers keep re-posting
 * locally (61 is prime, so it does not beat with batch sizes).
 */
#include "internal.h"

#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

_Thread_local struct weft__thread *weft__tls_self
    __attribute__((tls_model("initial-exec")));
static _Thread_local weft_strand *tls_strand;
#define tls_self weft__tls_self
void weft__set_current_strand(weft_strand *s) { tls_strand = s; }

weft_strand *weft_strand_current(void) { return tls_strand; }

weft_rt *weft_rt_current(void) { return tls_self ? tls_self->rt : NULL; }

/* Local ring full: move half of it and the new item to the inject queue in
 * one chain, so other threads can take them. */
static void overflow(weft_rt *rt, struct weft__shard *sh, weft__item it) {
  weft__item buf[WEFT_RUNQ_CAP / 2 + 1];
  uint32_t n = weft__runq_grab(&sh->rq, buf, WEFT_RUNQ_CAP / 2);
  buf[n++] = it;
  weft__inject_push(&rt->inject, buf, n);
  weft__notify_parked(rt);
}

void weft__schedule(weft_rt *rt, struct weft__shard *local, weft__item it) {
  if (local) {
    if (!weft__runq_push(&local->rq, it))
      overflow(rt, local, it);
    else if (!local->quiet && weft__runq_len(&local->rq) > 1)
      weft__notify_parked(rt); /* there is work for another thread */
    return;
  }
  weft__inject_push(&rt->inject, &it, 1);
  weft__notify_parked(rt);
}

void weft__schedule_prio(weft_rt *rt, struct weft__shard *local,
                         weft__item it) {
  if (!local || !weft__runq_push(&local->prq, it)) {
    weft__schedule(rt, local, it); /* outside, or full: the usual way */
    return;
  }
  if (!local->quiet &&
      weft__runq_len(&local->prq) + weft__runq_len(&local->rq) > 1)
    weft__notify_parked(rt); /* there is work for another thread */
}

/* Takes a batch from the inject queue into the own ring; returns one. */
static weft__item take_inject(weft_rt *rt, struct weft__shard *sh) {
  weft__item buf[WEFT_RUNQ_CAP / 2];
  uint32_t room = WEFT_RUNQ_CAP - weft__runq_len(&sh->rq);
  uint32_t max = room / 2 > 0 ? room / 2 : 1;
  if (max > WEFT_RUNQ_CAP / 2)
    max = WEFT_RUNQ_CAP / 2;
  uint32_t n = weft__inject_take(&rt->inject, buf, max);
  if (!n)
    return 0;
  for (uint32_t i = 1; i < n; i++)
    weft__runq_push(&sh->rq, buf[i]);
  weft__stat_add(&sh->st_injected, n);
  /* More here, or more left there: let a parked thread share it. */
  if (n > 1 || weft__load(&rt->inject.len, WA_RLX) > 0)
    weft__notify_parked(rt);
  return buf[0];
}

static uint32_t xorshift(uint32_t *s) {
  uint32_t x = *s;
  x ^= x << 13;
  x ^= x >> 17;
  x ^= x << 5;
  return *s = x;
}

/* Fires v's timers if its next deadline is at least grace ns past; *now
 * is read on first need (0: not yet). Returns whether they were due. */
static bool serve_if_due(struct weft__shard *v, struct weft__shard *sh,
                         uint64_t *now, uint64_t grace) {
  uint64_t next = weft__load(&v->timer_next, WA_ACQ);
  if (next == UINT64_MAX)
    return false;
  if (!*now)
    *now = weft__now_ns();
  if (next + grace > *now)
    return false;
  weft__timers_fire_due(v, sh, *now);
  return true;
}

/* Serves the expired timers of any shard whose owner has not: a searching
 * thread has time, the owner may be busy or stuck in a handler. */
static void serve_timers(weft_rt *rt, struct weft__shard *sh) {
  uint64_t now = 0;
  for (unsigned i = 0; i < rt->nshards; i++)
    serve_if_due(&rt->shards[i], sh, &now, 0);
}

static weft__item steal(weft_rt *rt, struct weft__shard *sh) {
  serve_timers(rt, sh);
  weft__item own = weft__runq_pop(&sh->prq);
  if (!own)
    own = weft__runq_pop(&sh->rq);
  if (own)
    return own;
  unsigned n = rt->nshards;
  unsigned start = xorshift(&sh->rng) % n;
  for (unsigned i = 0; i < n; i++) {
    struct weft__shard *v = &rt->shards[(start + i) % n];
    if (v == sh)
      continue;
    uint32_t got = 0;
    /* Our own rings are empty here (next_item found nothing). */
    weft__item it = weft__runq_steal(&v->prq, &sh->prq, &got);
    if (!it)
      it = weft__runq_steal(&v->rq, &sh->rq, &got);
    if (it) {
      weft__stat_add(&sh->st_steals, got);
      return it;
    }
  }
  return take_inject(rt, sh);
}

/* A shard's timers overdue by this much are served by any thread that
 * looks: their owner is preempted, or inside a long handler. The grace
 * keeps a running owner's timers its own (it serves them within a few
 * us); after it, a thread that lost its CPU for a scheduler tick (4 ms
 * here, the VM's other tasks) no longer takes its timers with it. */
#define OVERDUE_NS 50000u

/* Looks at one other shard, the next in turn, and serves its timers if
 * they are overdue. Returns that shard if they were and its rings hold
 * work, which its owner, not running, leaves waiting too; else NULL. One
 * shard per call: a cache line that its owner writes, read once. */
static struct weft__shard *
serve_one_overdue(weft_rt *rt, struct weft__shard *sh, uint64_t now) {
  if (++sh->peek >= rt->nshards)
    sh->peek = 0;
  struct weft__shard *v = &rt->shards[sh->peek];
  if (v == sh || !serve_if_due(v, sh, &now, OVERDUE_NS))
    return NULL;
  return weft__runq_len(&v->rq) || weft__runq_len(&v->prq) ? v : NULL;
}

/* How finely serve_late keeps deadline order across wheels, and how many
 * wheels it serves at once (a stack array; more overdue wheels than this
 * are left to their owners and to the looks above). */
#define LATE_STEP_NS 20000u
#define LATE_MAX 16
/* Rounds in a row that a wheel's tlock may be found taken before the
 * catch-up leaves that wheel: a re-arm holds it for 100 ns or so, a thread
 * serving it for longer, a preempted holder for milliseconds. */
#define LATE_TRIES 4

/* Our own timers are overdue by OVERDUE_NS or more: this thread did not
 * run for a while, and the other shards' threads may not have either (on
 * the 2-vCPU guest this was measured on, a vCPU stops for 6-9 ms every
 * second or so, and now and then both stop at once). Whichever thread
 * runs first fires every overdue wheel onto its own queues, in deadline
 * order to within LATE_STEP_NS across wheels: fired wheel after wheel,
 * the other shard's earliest timer waited behind all of ours (500
 * firings, 0.4-0.8 ms there). Each step is its own tlock hold, so another
 * thread that wants a wheel waits one step, not the whole catch-up. */
static void serve_late(weft_rt *rt, struct weft__shard *sh, uint64_t now,
                       uint64_t lo) {
  struct weft__shard *c[LATE_MAX];
  uint8_t busy[LATE_MAX] = {0};
  unsigned n = 0;
  c[n++] = sh;
  for (unsigned i = 0; i < rt->nshards && n < LATE_MAX; i++) {
    struct weft__shard *v = &rt->shards[i];
    uint64_t next = weft__load(&v->timer_next, WA_ACQ);
    if (v == sh || next == UINT64_MAX || next + OVERDUE_NS > now)
      continue;
    c[n++] = v;
    if (next < lo)
      lo = next;
  }
  if (n == 1) {
    weft__timers_fire_due(sh, sh, now);
    return;
  }
  bool quiet = !sh->quiet; /* one notify for the whole catch-up */
  sh->quiet = true;
  /* h rises by at least a step a round, and jumps over empty stretches:
   * the rounds are bounded by the span over the step and by the number
   * of distinct due slots, whichever is fewer. */
  for (uint64_t h = lo, min = lo; n && h < now;) {
    h = (min > h ? min : h) + LATE_STEP_NS;
    if (h > now)
      h = now;
    min = UINT64_MAX;
    for (unsigned j = 0; j < n;) {
      uint64_t next = weft__load(&c[j]->timer_next, WA_ACQ);
      if (next <= h) {
        if (weft__timers_fire_due(c[j], sh, h))
          busy[j] = 0;
        else if (++busy[j] == LATE_TRIES)
          next = UINT64_MAX; /* someone else is serving it: leave it */
        if (next != UINT64_MAX)
          next = weft__load(&c[j]->timer_next, WA_ACQ);
      }
      if (next > now) {
        n--;
        c[j] = c[n];
        busy[j] = busy[n];
        continue;
      }
      if (next < min)
        min = next;
      j++;
    }
  }
  if (quiet) {
    sh->quiet = false;
    if (weft__runq_len(&sh->prq) + weft__runq_len(&sh->rq) > 1)
      weft__notify_parked(rt);
  }
}

/* Fires our own due timers; *now is read on first need (0: not yet). */
static void serve_own(weft_rt *rt, struct weft__shard *sh, uint64_t *now) {
  uint64_t next = weft__load(&sh->timer_next, WA_ACQ);
  if (next == UINT64_MAX)
    return;
  *now = weft__now_ns();
  if (next > *now)
    return;
  if (*now - next >= OVERDUE_NS && rt->nshards > 1)
    serve_late(rt, sh, *now, next);
  else
    weft__timers_fire_due(sh, sh, *now);
}

/* Takes half of a stuck shard's timer firings, or of its other work, into
 * our ring of the same kind if that is empty (a steal needs room for
 * half a ring), to run after what we have. */
static void take_from_stuck(struct weft__shard *sh, struct weft__shard *v) {
  uint32_t got = 0;
  weft__item it = 0;
  if (!weft__runq_len(&sh->prq) &&
      (it = weft__runq_steal(&v->prq, &sh->prq, &got)))
    weft__runq_push(&sh->prq, it); /* fits: at most half a ring */
  else if (!weft__runq_len(&sh->rq) &&
           (it = weft__runq_steal(&v->rq, &sh->rq, &got)))
    weft__runq_push(&sh->rq, it);
  weft__stat_add(&sh->st_steals, got);
}

static weft__item next_item(weft_rt *rt, struct weft__shard *sh) {
  weft__item it;
  uint64_t now = 0;
  serve_own(rt, sh, &now);
  struct weft__shard *stuck;
  if ((++sh->looks & 15) == 0 && (stuck = serve_one_overdue(rt, sh, now)))
    take_from_stuck(sh, stuck);
  struct weft__io *io = weft__load(&sh->io, WA_ACQ);
  if (io)
    weft__io_poll(sh, io,
                  !weft__runq_len(&sh->rq) && !weft__runq_len(&sh->prq));
  if ((it = weft__runq_pop(&sh->prq)))
    return it;
  if (++sh->tick % 61 == 0 && (it = take_inject(rt, sh)))
    return it;
  if ((it = weft__runq_pop(&sh->rq)))
    return it;
  return take_inject(rt, sh);
}

static void run_item(struct weft__shard *sh, weft__item it) {
  if (it & WEFT_ITEM_NODE)
    weft__node_run(sh, (struct weft__node *)(it & ~WEFT_ITEM_NODE));
  else
    weft__strand_run(sh, (weft_strand *)it);
}

/* With nothing to run and the shard's next timer due within spin_ns,
 * waits for it on the clock instead of sleeping: a sleep that short ends
 * later than the deadline (the kernel's wakeup takes longer, 10-50 us on a
 * VM). Stops early when work is queued here or on the inject queue.
 * Returns whether it waited (the caller looks for work again). */
static bool spin_to_timer(weft_rt *rt, struct weft__shard *sh) {
  uint64_t next = weft__load(&sh->timer_next, WA_ACQ);
  if (next == UINT64_MAX || !rt->timer_spin_ns)
    return false;
  uint64_t now = weft__now_ns();
  if (next > now + rt->timer_spin_ns)
    return false;
  while (now < next) {
    for (int i = 0; i < 16; i++)
      weft__cpu_relax();
    struct weft__shard *stuck = serve_one_overdue(rt, sh, now);
    if (stuck) { /* its owner is not running: take some of its work */
      take_from_stuck(sh, stuck);
      return true; /* back to next_item: never park with our rings full */
    }
    if (weft__runq_len(&sh->rq) || weft__runq_len(&sh->prq) ||
        weft__load(&rt->inject.len, WA_RLX))
      break;
    now = weft__now_ns();
  }
  return true;
}

void weft__thread_main_loop(struct weft__thread *t) {
  weft_rt *rt = t->rt;
  for (;;) {
    struct weft__shard *sh = t->shard;
    if (!sh) {
      /* Lost to a handoff, or started as a spare. */
      if (!weft__spare_wait(t))
        return;
      continue;
    }
    weft__item it = next_item(rt, sh);
    if (!it && spin_to_timer(rt, sh))
      continue;
    if (!it) {
      if (weft__to_searching(rt, t))
        it = steal(rt, sh);
      if (!it) {
        weft__stat_add(&sh->st_parks, 1);
        if (!weft__park(rt, t))
          return;
        weft__stat_add(&sh->st_wakeups, 1);
        /* Shards whose thread could not be started have nobody else to
         * fire their timers (park.c, orphans_next). */
        if (weft__load(&rt->start_failed, WA_RLX))
          serve_timers(rt, sh);
        weft__io_flush(sh); /* if it did not sleep in its ring */
        continue;
      }
      weft__io_flush(sh); /* ours go in before the stolen work runs */
    }
    if (t->searching)
      weft__from_searching(rt, t);
    run_item(sh, it);
  }
}

void *weft__thread_entry(void *arg) {
  struct weft__thread *t = arg;
  weft_rt *rt = t->rt;
  tls_self = t;
  t->cpu_clock_ok = pthread_getcpuclockid(pthread_self(), &t->cpu_clock) == 0;
  weft__store(&t->kernel_tid, (int)syscall(SYS_gettid), WA_REL);
  /* Sleeps end at their deadline, not up to 50 us later (weft.h). */
  prctl(PR_SET_TIMERSLACK, (unsigned long)rt->timer_slack_ns, 0, 0, 0);
  if (t->lazy) {
    /* Started by a wakeup while it counted as parked (park.c). */
    if (!weft__park_resume(rt, t)) {
      tls_self = NULL;
      return NULL;
    }
  } else if (t->shard) { /* an eager thread: weft_rt_create waits for all */
    pthread_mutex_lock(&rt->life_lock);
    if (++rt->started == rt->neager)
      pthread_cond_broadcast(&rt->life_cond);
    pthread_mutex_unlock(&rt->life_lock);
  }
  weft__thread_main_loop(t);
  tls_self = NULL;
  return NULL;
}
