/*
 * timer_serve.c - which thread fires which shard's due timers, and when.
 * Owns no state but the policy: every shard's owner serves its own wheel;
 * searching threads serve every due wheel; running and spinning threads
 * look at one other shard at a time and serve it once it is overdue; and a
 * thread that finds its own timers overdue catches up with every overdue
 * wheel in deadline order. Firing itself is timer.c's (under each wheel's
 * lock, so any thread may serve any wheel).
 */
#include "timer_serve.h"

#include "clock.h"
#include "park.h"
#include "shard.h"
#include "timer.h"

/* Fires v's timers if its next deadline is at least grace ns past; *now
 * is read on first need (0: not yet). Returns whether they were due. */
static bool serve_if_due(struct weft__shard *v, struct weft__shard *sh,
                         uint64_t *now, uint64_t grace) {
  uint64_t next = weft__load(&v->tm.next, WA_ACQ);
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
void weft__serve_all(weft_rt *rt, struct weft__shard *sh) {
  uint64_t now = 0;
  for (unsigned i = 0; i < rt->nshards; i++)
    serve_if_due(&rt->shards[i], sh, &now, 0);
}

/* A shard's timers overdue by this much are served by any thread that
 * looks: their owner is preempted, or inside a long handler. The grace
 * keeps a running owner's timers its own (it serves them within a few
 * us); after it, a thread that lost its CPU for a scheduler tick (a VM's
 * other tasks take it for milliseconds) no longer takes its timers with
 * it. */
#define OVERDUE_NS 50000u

/* Looks at one other shard, the next in turn, and serves its timers if
 * they are overdue. Returns that shard if they were and its rings hold
 * work, which its owner, not running, leaves waiting too; else NULL. One
 * shard per call: a cache line that its owner writes, read once. */
struct weft__shard *weft__serve_one_overdue(weft_rt *rt, struct weft__shard *sh,
                                            uint64_t now) {
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
/* Rounds in a row that a wheel's lock may be found taken before the
 * catch-up leaves that wheel: a re-arm holds it for 100 ns or so, a thread
 * serving it for longer, a preempted holder for milliseconds. */
#define LATE_TRIES 4

/* Our own timers are overdue by OVERDUE_NS or more: this thread did not
 * run for a while, and the other shards' threads may not have either (a
 * virtual machine's vCPUs stop for milliseconds now and then, sometimes
 * all at once). Whichever thread runs first fires every overdue wheel onto
 * its own queues, in deadline order to within LATE_STEP_NS across wheels:
 * fired wheel after wheel, the other shard's earliest timer would wait
 * behind all of ours. Each step is its own hold of a wheel's lock, so
 * another thread that wants a wheel waits one step, not the whole
 * catch-up. */
static void serve_late(weft_rt *rt, struct weft__shard *sh, uint64_t now,
                       uint64_t lo) {
  struct weft__shard *c[LATE_MAX];
  uint8_t busy[LATE_MAX] = {0};
  unsigned n = 0;
  c[n++] = sh;
  for (unsigned i = 0; i < rt->nshards && n < LATE_MAX; i++) {
    struct weft__shard *v = &rt->shards[i];
    uint64_t next = weft__load(&v->tm.next, WA_ACQ);
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
      uint64_t next = weft__load(&c[j]->tm.next, WA_ACQ);
      if (next <= h) {
        if (weft__timers_fire_due(c[j], sh, h))
          busy[j] = 0;
        else if (++busy[j] == LATE_TRIES)
          next = UINT64_MAX; /* someone else is serving it: leave it */
        if (next != UINT64_MAX)
          next = weft__load(&c[j]->tm.next, WA_ACQ);
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
void weft__serve_own(weft_rt *rt, struct weft__shard *sh, uint64_t *now) {
  uint64_t next = weft__load(&sh->tm.next, WA_ACQ);
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
