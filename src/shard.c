/*
 * shard.c - the run loop of a runtime thread: find an item (own run queue,
 * inject queue, steal), run it, park when there is none; and scheduling an
 * item on a shard. Owns nothing but what the owner-only fields of struct
 * weft__shard hold (shard.h).
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
#include "shard.h"

#include "backtrace.h"
#include "io.h"
#include "monitor.h"
#include "park.h"
#include "strand.h"
#include "timer_serve.h"
#include "trace.h"

#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Local ring full: move half of it and the new item to the inject queue in
 * one chain, so other threads can take them. */
static void overflow(weft_rt *rt, struct weft__shard *sh, weft__item it) {
  weft__item buf[WEFT_RUNQ_CAP / 2 + 1];
  uint32_t n = weft__runq_grab(&sh->rq, buf, WEFT_RUNQ_CAP / 2);
  buf[n++] = it;
  weft__inject_push(&rt->inject, buf, n);
  weft__notify_parked(rt);
}

/* With one shard no other thread may run what the caller, who holds it,
 * queues in its ring (a spare runs a shard only when handed it), so a
 * local push wakes no one and skips notify_parked's RMW. */
void weft__schedule(weft_rt *rt, struct weft__shard *local, weft__item it) {
  if (local) {
    if (!weft__runq_push(&local->rq, it))
      overflow(rt, local, it);
    else if (local->quiet || rt->nshards == 1)
      ;
    else if (weft__runq_len(&local->rq) > 1)
      weft__notify_parked(rt); /* there is work for another thread */
    else
      local->owe_wake = true;
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
  if (local->quiet || rt->nshards == 1)
    return;
  if (weft__runq_len(&local->prq) + weft__runq_len(&local->rq) > 1)
    weft__notify_parked(rt); /* there is work for another thread */
  else
    local->owe_wake = true;
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
  weft__stat_add(&sh->st.injected, n);
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

/* The holder's pop: with one shard nobody steals from its rings. */
static inline weft__item pop_own(weft_rt *rt, struct weft__runq *q) {
  return rt->nshards == 1 ? weft__runq_pop_owned(q) : weft__runq_pop(q);
}

static weft__item steal(weft_rt *rt, struct weft__shard *sh) {
  weft__serve_all(rt, sh);
  weft__item own = pop_own(rt, &sh->prq);
  if (!own)
    own = pop_own(rt, &sh->rq);
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
      weft__stat_add(&sh->st.steals, got);
      weft__trace(WEFT_EV_STEAL, sh->idx, v->idx, got);
      return it;
    }
  }
  return take_inject(rt, sh);
}

/* Takes half of a stuck shard's timer firings, or of its other work, into
 * our ring of the same kind if that is empty (a steal needs room for
 * half a ring), to run after what we have. */
void weft__take_from_stuck(struct weft__shard *sh, struct weft__shard *v) {
  uint32_t got = 0;
  weft__item it = 0;
  if (!weft__runq_len(&sh->prq) &&
      (it = weft__runq_steal(&v->prq, &sh->prq, &got)))
    weft__runq_push(&sh->prq, it); /* fits: at most half a ring */
  else if (!weft__runq_len(&sh->rq) &&
           (it = weft__runq_steal(&v->rq, &sh->rq, &got)))
    weft__runq_push(&sh->rq, it);
  weft__stat_add(&sh->st.steals, got);
  if (got)
    weft__trace(WEFT_EV_STEAL, sh->idx, v->idx, got);
}

static weft__item next_item(weft_rt *rt, struct weft__shard *sh) {
  weft__item it;
  uint64_t now = 0;
  weft__serve_own(rt, sh, &now);
  struct weft__shard *stuck;
  if ((++sh->looks & 15) == 0 && (stuck = weft__serve_one_overdue(rt, sh, now)))
    weft__take_from_stuck(sh, stuck);
  struct weft__io *io = weft__load(&sh->io, WA_ACQ);
  if (io)
    weft__io_poll(sh, io, sh->spun);
  sh->spun = false;
  if ((it = pop_own(rt, &sh->prq)))
    return it;
  if (++sh->tick % 61 == 0 && (it = take_inject(rt, sh)))
    return it;
  if ((it = pop_own(rt, &sh->rq)))
    return it;
  /* Our rings are empty: what this thread prepared goes to the kernel
   * before it runs work from elsewhere, as before stolen work (main_loop).
   * Else a thread fed posts from outside one at a time, which never
   * parks, would keep it back for as long as the posts came
   * (test_io_busy_poll). */
  if ((it = take_inject(rt, sh)))
    weft__io_flush(sh);
  return it;
}

unsigned weft__shard_idx(const struct weft__shard *sh) { return sh->idx; }

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
  uint64_t next = weft__load(&sh->tm.next, WA_ACQ);
  if (next == UINT64_MAX || !rt->tm.spin_ns)
    return false;
  uint64_t now = weft__now_ns();
  if (next > now + rt->tm.spin_ns)
    return false;
  while (now < next) {
    for (int i = 0; i < 16; i++)
      weft__cpu_relax();
    struct weft__shard *stuck = weft__serve_one_overdue(rt, sh, now);
    if (stuck) { /* its owner is not running: take some of its work */
      weft__take_from_stuck(sh, stuck);
      return true; /* back to next_item: never park with our rings full */
    }
    if (weft__runq_len(&sh->rq) || weft__runq_len(&sh->prq) ||
        weft__load(&rt->inject.len, WA_RLX))
      break;
    now = weft__now_ns();
  }
  return true;
}

static void main_loop(struct weft__thread *t) {
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
    if (!it) {
      /* The last item's end, held for the next item's start (strand.c,
       * item_end), is written before the search, the spin or the park. */
      weft__trace_flush();
      if (spin_to_timer(rt, sh)) {
        sh->spun = true; /* no wait in the backend: next_item polls it */
        continue;
      }
      if (weft__to_searching(rt, t))
        it = steal(rt, sh);
      if (!it) {
        weft__stat_add(&sh->st.parks, 1);
        weft__trace(WEFT_EV_PARK, sh->idx, 0, 0);
        if (!weft__park(rt, t))
          return;
        weft__stat_add(&sh->st.wakeups, 1);
        weft__trace(WEFT_EV_UNPARK,
                    t->shard ? t->shard->idx : WEFT_TRACE_NO_SHARD, 0, 0);
        /* Shards whose thread could not be started have nobody else to
         * fire their timers (park.c, orphans_next). */
        if (weft__load(&rt->th.start_failed, WA_RLX))
          weft__serve_all(rt, sh);
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

#ifdef WEFT_SIM
void weft__shard_step(struct weft__thread *t) {
  weft_rt *rt = t->rt;
  struct weft__shard *sh = t->shard;
  weft__item it = next_item(rt, sh);
  if (!it && weft__to_searching(rt, t))
    it = steal(rt, sh);
  if (t->searching)
    weft__from_searching(rt, t);
  if (it)
    run_item(sh, it);
}
#endif

void *weft__thread_entry(void *arg) {
  struct weft__thread *t = arg;
  weft_rt *rt = t->rt;
  weft__set_self(t);
  weft__backtrace_thread_init(rt); /* the stall signal: after set_self */
  weft__trace_attach(rt, WEFT_RING_WORKER, t->idx);
  t->cpu_clock_ok = pthread_getcpuclockid(pthread_self(), &t->cpu_clock) == 0;
  weft__store(&t->kernel_tid, (int)syscall(SYS_gettid), WA_REL);
  /* Sleeps end at their deadline, not up to 50 us later (weft.h). */
  prctl(PR_SET_TIMERSLACK, (unsigned long)rt->tm.slack_ns, 0, 0, 0);
  bool run = true;
  if (t->lazy) {
    /* Started by a wakeup while it counted as parked (park.c). */
    run = weft__park_resume(rt, t);
  } else if (t->shard) { /* an eager thread: weft_rt_create waits for all */
    pthread_mutex_lock(&rt->life.lock);
    if (++rt->life.started == rt->th.neager)
      pthread_cond_broadcast(&rt->life.cond);
    pthread_mutex_unlock(&rt->life.lock);
  }
  if (run)
    main_loop(t);
  weft__trace_detach();
  weft__set_self(NULL);
  return NULL;
}
